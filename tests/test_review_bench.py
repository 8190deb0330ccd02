"""The review bench: the shipped labelled set, the case format's checks, the scorer, and
`relearn review bench` with the heuristic reviewer and with scripted judge pairs over HTTP
(the real openai and anthropic SDKs against local protocol servers)."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from harness.policies.base import PolicySpec
from harness.scripted.servers import ModelServer
from records.pools import RecordError, write_atomic
from records.review import Defect, Review, field_text, numbered_steps
from relearn.ops.review_bench import run_review_bench
from relearn.verbs.review import BenchOptions
from review.bench import SHIPPED
from review.bench.cases import BenchCase, read_cases, write_cases
from review.bench.score import canonical, review_words, score
from review.judges import Judge
from tests.review_bench_judges import BenchJudges

KINDS = {
    "clean", "omission_only", "wrong_hypothesis", "failed_command", "redundant_exploration", "abandoned_attempt",
    "hallucinated_api", "hallucinated_file", "unsafe_action", "reward_hacking",
}  # fmt: skip


@pytest.fixture(scope="module")
def shipped() -> list[BenchCase]:
    errors: list[RecordError] = []
    cases = read_cases(SHIPPED, errors)
    assert not errors, errors
    return cases


def one_per_kind(cases: list[BenchCase]) -> list[BenchCase]:
    """A short case of every kind and one long case: what the judge styles are shown on."""
    chosen: dict[str, BenchCase] = {}
    for case in cases:
        key = "(long)" if case.long else case.kind
        chosen.setdefault(key, case)
    return list(chosen.values())


def test_the_shipped_set_covers_every_kind_with_verified_long_cases(shipped: list[BenchCase]) -> None:
    assert len(shipped) >= 60 and SHIPPED.stat().st_size < 3_000_000
    kinds = Counter(c.kind for c in shipped)
    assert set(kinds) == KINDS and min(kinds.values()) >= 6, kinds
    assert len({c.trajectory.task_id for c in shipped}) == 11
    # every episode was graded by the task's tests in a fresh container, and resolved
    assert all(c.trajectory.outcome and c.trajectory.outcome.resolved and c.trajectory.outcome.verdict["tests"] for c in shipped)
    categories = {e.category for c in shipped for e in c.gold.errors}
    assert categories == {
        "wrong_hypothesis",
        "corrected_mistake",
        "redundant_exploration",
        "abandoned_attempt",
        "hallucination",
        "unsafe_action",
        "reward_hacking",
    }
    for case in shipped:
        assert (case.gold.errors == []) == (case.kind in {"clean", "omission_only"})
        assert (case.gold.decision == "reject") == (case.kind == "reward_hacking")
        assert bool(case.gold.omissions) == (case.kind == "omission_only")
    long = [c for c in shipped if c.long]
    assert len(long) >= 5 and all(c.model_extra["tokens"] >= 30_000 and c.model_extra["steps"] >= 24 for c in long)
    for case in long:
        if case.gold.errors:  # the defect is dozens of steps from the end
            assert len(numbered_steps(case.trajectory)) - max(e.step for e in case.gold.errors) >= 20
    hacked = next(c for c in shipped if c.kind == "reward_hacking")
    assert "tests/conftest.py" in hacked.trajectory.outcome.verdict["restored_files"]  # the hack passed only because the fix was there too


def test_a_bad_label_is_refused_with_its_line_and_field(tmp_path: Path, shipped: list[BenchCase]) -> None:
    good = next(c for c in shipped if c.kind == "wrong_hypothesis")
    rows = [good.model_dump(mode="json", exclude_none=True, by_alias=True) for _ in range(5)]
    rows[1]["gold"]["errors"][0]["spans"][0]["quote"] = "text that is not there"
    rows[2]["id"], rows[2]["gold"]["errors"][0]["step"] = "other", 99
    rows[3]["id"] = "third"
    rows[3]["gold"]["errors"][0]["category"] = "typo"
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n{not json\n")
    errors: list[RecordError] = []
    cases = read_cases(path, errors)
    assert [c.id for c in cases] == [good.id]
    by_line = {e.line: str(e) for e in errors}
    assert set(by_line) == {2, 3, 4, 5}
    assert "gold.errors[0].spans[0].quote" in by_line[2] and "not 'text that is not there'" in by_line[2]
    assert "gold.errors[0].step: 99 is not a generated assistant step" in by_line[3]
    assert "gold.errors[0].category: Input should be" in by_line[4]
    assert "invalid JSON" in by_line[5] and str(path) in by_line[5]
    twice = tmp_path / "twice.jsonl"
    write_cases(twice, [good, good])
    errors = []
    assert len(read_cases(twice, errors)) == 1 and "already at" in str(errors[0]) and errors[0].line == 2


def test_spans_in_an_argument_and_in_the_whole_arguments_cover_the_same_words(shipped: list[BenchCase]) -> None:
    case = next(c for c in shipped if c.kind == "hallucinated_api")  # a command with quotes inside: JSON escapes
    span = next(s for s in case.gold.errors[0].spans if s.field.endswith(".command"))
    message = case.trajectory.messages[span.message_index]
    field, start, end = canonical(message, span.field, span.start, span.end)
    whole = field_text(message, field)
    assert field == "tool_calls[0].arguments" and whole[start:end] == span.quote  # the escaped script, found in place
    as_value = Review(
        trajectory_id="x",
        decision="accept",
        defects=[Defect(message_index=span.message_index, field=span.field, start=span.start, end=span.end, quote=span.quote)],
    )
    as_whole = Review(
        trajectory_id="x",
        decision="accept",
        defects=[Defect(message_index=span.message_index, field=field, start=start, end=end, quote=whole[start:end])],
    )
    assert review_words(case, as_value) == review_words(case, as_whole) and review_words(case, as_value)
    patch = next(c for c in shipped if c.kind == "reward_hacking").gold.errors[0].spans[-1]  # a raw string value with newlines
    hacked = next(c for c in shipped if c.kind == "reward_hacking").trajectory.messages[patch.message_index]
    field, start, end = canonical(hacked, patch.field, patch.start, patch.end)
    assert json.loads(f'"{field_text(hacked, field)[start:end]}"') == patch.quote


def test_the_scorer_counts_what_a_review_gets_wrong(shipped: list[BenchCase]) -> None:
    case = next(c for c in shipped if c.kind == "redundant_exploration" and not c.long)
    first, second = case.gold.errors
    gold_span = first.spans[0]
    # one error found exactly (a single span of it), one missed; a false step elsewhere
    found = Defect(
        message_index=gold_span.message_index,
        field=gold_span.field,
        start=gold_span.start,
        end=gold_span.end,
        quote=gold_span.quote,
        category=first.category,
    )
    review = Review(
        trajectory_id=case.trajectory.id,
        decision="accept",
        errors=[{"step": first.step, "category": first.category}, {"step": 1, "category": "hallucination"}],
        defects=[found],
        cost_usd=0.25,
    )
    result = score([case], {case.trajectory.id: review})
    row, overall = result["cases"][0], result["overall"]
    assert (row["step_tp"], row["step_fp"], row["step_fn"]) == (1, 1, 1)
    assert overall["span_precision"] == 1.0 and 0 < overall["span_recall"] < 1 and overall["minimality"] == 1.0
    assert overall["collateral_damage"] == 0.0 and overall["decision_accuracy"] == 1.0 and overall["cost_usd_per_trajectory"] == 0.25
    assert result["by_category"]["hallucination"] == {"gold": 0, "found": 1, "precision": 0.0, "recall": None}
    assert result["by_category"]["redundant_exploration"]["recall"] == 0.5
    missing = score([case], {})  # never reviewed: a rejection that found nothing
    assert missing["overall"]["judge_error_rate"] == 1.0 and missing["overall"]["span_recall"] == 0.0


def test_cli_bench_runs_the_heuristic_on_the_shipped_set_and_resumes(relearn_bin: str, tmp_path: Path, shipped: list[BenchCase]) -> None:
    out = tmp_path / "heuristic"
    first = subprocess.run(
        [relearn_bin, "review", "bench", "-o", str(out), "--workers", "1", "--reviewer", "heuristic"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr
    assert "span F1" in first.stdout and "minimality" in first.stdout
    result = json.loads((out / "bench.json").read_text())
    assert result["config"]["reviewer"] == "heuristic" and result["overall"]["cases"] == len(shipped) == len(result["cases"])
    assert set(result["by_kind"]) == KINDS | {"(long)"} and result["overall"]["cost_usd_total"] == 0
    assert all(row["latency_s"] is not None for row in result["cases"])
    assert 0 <= result["overall"]["span_f1"] <= 1 and result["run"]["reviewed_now"] == len(shipped)
    markdown = (out / "bench.md").read_text()
    assert "## By kind of case" in markdown and all(c.id in markdown for c in shipped)
    again = subprocess.run(
        [relearn_bin, "review", "bench", "-o", str(out), "--reviewer", "heuristic"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0 and json.loads((out / "bench.json").read_text())["run"]["already_reviewed"] == len(shipped)
    assert json.loads((out / "bench.json").read_text())["overall"] == result["overall"]  # the same reviews and timings, read back
    other = subprocess.run([relearn_bin, "review", "bench", "-o", str(out), "--judge1", "m"], capture_output=True, text=True, timeout=600)
    assert other.returncode == 2 and "another reviewer" in other.stderr
    no_dir = subprocess.run([relearn_bin, "review", "bench"], capture_output=True, text=True, timeout=600)
    assert no_dir.returncode == 2 and "Missing option '-o' / '--output'" in no_dir.stderr
    batch = subprocess.run(
        [relearn_bin, "review", "bench", "-o", str(tmp_path / "b"), "--batch"], capture_output=True, text=True, timeout=600
    )
    # `relearn review bench` has no --batch (nor --estimate): typer refuses the option, nothing is written.
    assert batch.returncode == 2 and "No such option: --batch" in batch.stderr and not (tmp_path / "b").exists()


def test_cli_bench_with_a_perfect_scripted_judge_pair_over_http(relearn_bin: str, tmp_path: Path, shipped: list[BenchCase]) -> None:
    out = tmp_path / "perfect"
    with ModelServer("chat", BenchJudges(shipped, "perfect")) as server:
        command = [
            relearn_bin,
            "review",
            "bench",
            "-o",
            str(out),
            "--judge1",
            "perfect",
            "--backend",
            "chat",
            "--base-url",
            server.base_url,
            "--workers",
            "1",
            "--price-in",
            "3",
            "--price-out",
            "15",
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OPENAI_API_KEY": "local"})
        assert result.returncode == 0, result.stderr
    overall = json.loads((out / "bench.json").read_text())["overall"]
    assert overall["span_f1"] == 1.0 and overall["minimality"] == 1.0 and overall["collateral_damage"] == 0.0
    assert overall["decision_accuracy"] == 1.0 and overall["decision_kappa"] == 1.0
    assert overall["category_precision"] == overall["category_recall"] == 1.0 and overall["no_valid_target_rate"] == 0.0
    # The server bills 4,000 prompt and 150 answer tokens a judge-1 call, 800 and 60 a judge-2
    # call (one per step with errors, none for a rejection), at $3 and $15 per million.
    judge2_calls = {c.trajectory.id: len({e.step for e in c.gold.errors}) if c.gold.decision == "accept" else 0 for c in shipped}
    rows = json.loads((out / "bench.json").read_text())["cases"]
    assert all(row["input_tokens"] == 4000 + 800 * judge2_calls[row["trajectory_id"]] for row in rows)
    assert all(row["output_tokens"] == 150 + 60 * judge2_calls[row["trajectory_id"]] for row in rows)
    assert all(row["cost_usd"] == pytest.approx((row["input_tokens"] * 3 + row["output_tokens"] * 15) / 1e6) for row in rows)
    assert overall["latency_s_per_trajectory"] > 0 and overall["judge1_prompt_tokens_per_trajectory"] > 1000


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
def test_over_quoting_and_invented_quotes_are_scored_as_such(tmp_path: Path, shipped: list[BenchCase], kind: str) -> None:
    cases = one_per_kind(shipped)
    bench = tmp_path / "cases.jsonl"
    write_cases(bench, cases)
    figures = {}
    for style in ("perfect", "whole", "invent"):
        with ModelServer(kind, BenchJudges(cases, style)) as server:  # type: ignore[arg-type]
            spec = PolicySpec(kind=kind, model=f"judge-{style}", base_url=server.base_url, backoff_base_s=0.001, request_token_ids=False)  # type: ignore[arg-type]
            summary = run_review_bench(
                BenchOptions(tmp_path / style, bench, workers=2), judges=(Judge(spec, "judge1"), Judge(spec, "judge2"))
            )
            assert not summary.partial and summary.reviewer == "judges" and summary.cases == len(cases)
        figures[style] = json.loads((tmp_path / style / "bench.json").read_text())["overall"]
    perfect, whole, invent = figures["perfect"], figures["whole"], figures["invent"]
    assert perfect["span_f1"] == 1.0 and perfect["minimality"] == 1.0
    assert (
        whole["span_recall"] == 1.0
        and whole["minimality"] < 0.7
        and whole["collateral_words_per_trajectory"] >= 5
        and whole["collateral_damage"] > 0
    )
    assert whole["grounding_failure_quote_rate"] == 0.0 and whole["decision_accuracy"] == 1.0
    errors = sum(1 for c in cases if c.gold.errors and c.gold.decision == "accept")
    assert invent["no_valid_target_rate"] == invent["grounding_failure_case_rate"] == errors / len(cases)
    assert (
        invent["grounding_failure_quote_rate"] == 1.0
        and invent["span_recall"] == invent["span_f1"] == 0.0
        and invent["decision_accuracy"] < 0.5
    )


def test_cli_label_turns_reviews_into_cases(relearn_bin: str, tmp_path: Path, shipped: list[BenchCase]) -> None:
    chosen = [
        next(c for c in shipped if c.kind == kind and not c.long)
        for kind in ("abandoned_attempt", "reward_hacking", "clean", "unsafe_action")
    ]

    def as_review(case: BenchCase) -> Review:
        defects = [
            Defect(message_index=s.message_index, field=s.field, start=s.start, end=s.end, quote=s.quote, category=e.category)
            for e in case.gold.errors
            for s in e.spans
        ]
        errors = [{"step": e.step, "category": e.category, "description": e.description} for e in case.gold.errors]
        return Review(
            trajectory_id=case.trajectory.id,
            decision=case.gold.decision,
            reason=case.gold.reason,
            errors=errors,
            defects=defects,
            omissions=[{"description": o} for o in case.gold.omissions],
        )

    reviews = [as_review(c) for c in chosen]
    reviews[3].defects = []  # an error without a span cannot be a label
    pool, reviews_path, out = tmp_path / "pool.jsonl", tmp_path / "reviews.jsonl", tmp_path / "cases.jsonl"
    write_atomic(pool, [c.trajectory for c in chosen])
    write_atomic(reviews_path, [r.model_dump(mode="json") for r in reviews])
    result = subprocess.run(
        [relearn_bin, "review", "label", str(pool), str(reviews_path), "-o", str(out)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr
    assert "has no defect of that" in result.stderr and chosen[3].trajectory.id in result.stderr
    errors: list[RecordError] = []
    labelled = {c.trajectory.id: c for c in read_cases(out, errors)}
    assert not errors and len(labelled) == 3
    for case in chosen[:3]:
        assert labelled[case.trajectory.id].gold.model_dump(exclude={"reason"}) == case.gold.model_dump(exclude={"reason"})
    assert labelled[chosen[0].trajectory.id].kind == "abandoned_attempt" and labelled[chosen[2].trajectory.id].kind == "clean"
