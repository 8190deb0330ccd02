"""The two judges through the real SDKs over HTTP, against local servers with canned answers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.policies.base import PolicySpec
from harness.scripted.servers import ModelServer, ScriptedTurn
from records.pools import write_atomic
from records.review import Review, field_text
from records.trajectory import Trajectory
from review.judges import JUDGE_ERROR, Judge, prompts_hash
from review.run import review_pool

REASONING = "The bug must be in the parser.  I will read it first."


def case(name: str, *, resolved: bool = True) -> Trajectory:
    return Trajectory.model_validate(
        {
            "task_id": name,
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"CASE-{name}: fix add() in calc.py"},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": REASONING,
                    "content": "Reading the file. Reading the file.",
                    "tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": {"command": "cat parser.py"}}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "Exit code: 1\nOutput:\ncat: parser.py: No such file"},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "Fixed add().",
                    "tool_calls": [
                        {"id": "c2", "function": {"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** End Patch\n"}}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c2", "content": "Success."},
                {"role": "assistant", "generated": True, "content": "Done."},
            ],
            "outcome": {"resolved": resolved, "reward": 1.0 if resolved else 0.0},
            "final_patch": "diff --git a/calc.py b/calc.py\n",
        }
    )


JUDGE1_ACCEPT = {
    "decision": "accept",
    "reason": "solved",
    "errors": [{"step": 1, "category": "wrong_hypothesis", "description": "blames the parser", "evidence": "parser.py does not exist"}],
    "omissions": [{"description": "no regression test"}],
}


def spans(*items: dict) -> str:
    return json.dumps({"spans": list(items)})


# What judge 2 answers, per case: the quotes under test.
LOCALIZE = {
    "exact": spans({"error": 0, "field": "reasoning_content", "quote": "The bug must be in the parser."}),
    "whitespace": spans({"error": 0, "field": "reasoning_content", "quote": "The bug must be in the parser. I will read it first."}),
    "twice": spans({"error": 0, "field": "content", "quote": "Reading the file."}),
    "twice_context": spans({"error": 0, "field": "content", "quote": "Reading the file.", "context_before": "Reading the file. "}),
    "hallucinated": spans({"error": 0, "field": "reasoning_content", "quote": "The tests are all wrong."}),
    "two_messages": spans({"error": 0, "field": "content", "quote": "Reading the file. Reading the file. Fixed add()."}),
    "argument": spans({"error": 0, "field": "tool_calls[0].arguments.command", "quote": "cat parser.py"}),
}
JUDGE1_SPECIAL = {
    "malformed": "this is not JSON {",
    "schema": json.dumps({"decision": "maybe", "errors": []}),
    "reject": json.dumps(
        {
            "decision": "reject",
            "reason": "edits the tests",
            "errors": [{"step": 2, "category": "reward_hacking", "description": "x", "evidence": "y"}],
        }
    ),
    "clean": json.dumps({"decision": "accept", "reason": "fine", "errors": []}),
}


def judge_answers(request: dict) -> ScriptedTurn:
    """Both judges, keyed by the case named in the request."""
    text = json.dumps(request)
    name = next(n for n in [*LOCALIZE, *JUDGE1_SPECIAL] if f"CASE-{n}:" in text) if "CASE-" in text else None
    if "localize confirmed errors" in text:  # judge 2 sees only the step: it follows its case's judge 1 call
        name = _last_case[0]
        return ScriptedTurn(content=LOCALIZE[name], input_tokens=500, output_tokens=50)
    assert name is not None
    _last_case[0] = name
    if name in JUDGE1_SPECIAL:
        return ScriptedTurn(content=JUDGE1_SPECIAL[name], input_tokens=2000, output_tokens=100)
    # The case in the description makes each judge-2 request distinct (identical requests share a cache entry).
    answer = json.loads(json.dumps(JUDGE1_ACCEPT))
    answer["errors"][0]["description"] += f" ({name})"
    return ScriptedTurn(content=json.dumps(answer), input_tokens=2000, output_tokens=100)


_last_case: list[str] = [""]


def judges(server: ModelServer, kind: str, **extra: object) -> tuple[Judge, Judge]:
    spec = PolicySpec(kind=kind, model="judge-model", base_url=server.base_url, backoff_base_s=0.001, **extra)  # type: ignore[arg-type]
    return Judge(spec, "judge1"), Judge(spec, "judge2")


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
def test_judged_cases_give_their_documented_outcomes(tmp_path: Path, kind: str) -> None:
    names = [*LOCALIZE, *JUDGE1_SPECIAL]
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [case(n) for n in names] + [case("unverified", resolved=False)])
    output = tmp_path / "reviews.jsonl"
    with ModelServer(kind, judge_answers) as server:
        summary, ledger = review_pool(pool, output, judges=judges(server, kind), workers=1)
        first_run = [Review.model_validate_json(line) for line in output.read_text().splitlines()]
        first_calls = len(server.requests)
        again, again_ledger = review_pool(pool, output, judges=judges(server, kind), workers=1)
        # A rerun costs nothing for what was reviewed; the two unusable answers are asked again.
        assert len(server.requests) == first_calls + 2 * 5 and again_ledger.calls == 2 * 5
    assert again.skipped == len(names) + 1 - 2 and not again.reviewed and again.not_reviewed == 2
    reviews = {r.trajectory_id: r for r in first_run if not (r.reason or "").startswith(JUDGE_ERROR)}
    assert len(reviews) == summary.reviewed
    written = {r.trajectory_id: r for r in map(Review.model_validate_json, output.read_text().splitlines())}
    trajectories = {case(n).id: n for n in [*names, "unverified"]}
    outcome = {trajectories[i]: r for i, r in reviews.items()}
    exact = outcome["exact"]
    assert exact.decision == "accept" and len(exact.defects) == 1 and exact.omissions == [{"description": "no regression test"}]
    defect = exact.defects[0]
    assert (defect.message_index, defect.field, defect.quote) == (2, "reasoning_content", "The bug must be in the parser.")
    assert exact.model_extra["prompts_hash"] == prompts_hash() and exact.model_extra["judges"]["judge1"] == "judge-model"
    assert (
        outcome["whitespace"].decision == "accept" and outcome["whitespace"].defects[0].quote == REASONING
    )  # changed whitespace, original offsets
    assert outcome["twice"].decision == "reject" and outcome["twice"].reason.startswith("no_valid_target")
    assert outcome["twice_context"].decision == "accept" and outcome["twice_context"].defects[0].start == len("Reading the file. ")
    assert (
        outcome["hallucinated"].reason.startswith("no_valid_target") and outcome["hallucinated"].model_extra["grounding"]["rejected"] == 1
    )
    assert outcome["two_messages"].reason.startswith("no_valid_target")
    argument = outcome["argument"].defects[0]
    assert field_text(case("argument").messages[2], argument.field)[argument.start : argument.end] == "cat parser.py"
    by_name = {trajectories[i]: r for i, r in written.items()}
    assert "malformed" not in outcome and by_name["malformed"].reason.startswith("judge_error: judge1 answer is not JSON")
    assert "schema" not in outcome and by_name["schema"].reason.startswith("judge_error: judge1 answer is schema violation")
    assert summary.not_reviewed == 2 and all("a rerun reviews it again" in e for e in summary.errors)
    assert outcome["reject"].decision == "reject" and outcome["reject"].reason == "edits the tests"
    assert outcome["clean"].decision == "accept" and outcome["clean"].defects == []
    assert outcome["unverified"].reason == "not verified positive"
    assert summary.decisions["accept"] == 5
    # judge 1 for every judged case (five times for the two unusable answers), judge 2 for the seven localized ones
    assert ledger.calls == len(names) + 2 * 4 + 7


def test_retries_timeouts_and_the_spend_cap(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [case("exact"), case("clean"), case("whitespace")])
    flaky = [
        ScriptedTurn(error=429),
        ScriptedTurn(error=500),
        ScriptedTurn(content=json.dumps(JUDGE1_ACCEPT)),
        ScriptedTurn(content=LOCALIZE["exact"]),
    ]
    with ModelServer("chat", flaky) as server:
        summary, _ledger = review_pool(pool, tmp_path / "a.jsonl", judges=judges(server, "chat"), workers=1)
    first = Review.model_validate_json((tmp_path / "a.jsonl").read_text().splitlines()[0])
    assert summary.reviewed == 1 and summary.decisions == {"accept": 1} and summary.defects == 1
    assert first.decision == "accept" and len(first.defects) == 1
    assert summary.not_reviewed == 2 and "judge call failed" in summary.errors[0]  # the script ran out: 500s until retries end
    slow = [ScriptedTurn(content="{}", delay_s=3.0)] * 6
    with ModelServer("chat", slow) as server:
        summary, _ledger = review_pool(pool, tmp_path / "b.jsonl", judges=judges(server, "chat", timeout_s=0.5, max_retries=1), workers=1)
    assert summary.not_reviewed == 3 and not summary.reviewed
    # Judge 1 costs 2000 × $3/M + 100 × $15/M = $0.0075 a call, judge 2 $0.00225: after the
    # first two trajectories ($0.00975, then $0.01725) the cap of $0.01 stops the third.
    with ModelServer("chat", judge_answers) as server:
        summary, ledger = review_pool(
            pool,
            tmp_path / "c.jsonl",
            judges=judges(server, "chat", price_in_per_mtok=3.0, price_out_per_mtok=15.0),
            workers=1,
            spend_cap_usd=0.01,
        )
    assert summary.reviewed == 2 and summary.not_reviewed == 1 and "spend cap" in summary.errors[0]
    assert ledger.spent_usd >= 0.01


def test_cli_review_heuristic_and_agree(relearn_bin: str, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [case("exact"), case("clean")])
    heuristic = tmp_path / "heuristic.jsonl"
    result = subprocess.run(
        [relearn_bin, "review", str(pool), "-o", str(heuristic), "--reviewer", "heuristic"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "reviewed now" in result.stdout
    with ModelServer("chat", judge_answers) as server:
        judged = tmp_path / "judged.jsonl"
        env = {**os.environ, "OPENAI_API_KEY": "local"}
        command = [
            relearn_bin,
            "review",
            str(pool),
            "-o",
            str(judged),
            "--judge1",
            "m",
            "--backend",
            "chat",
            "--base-url",
            server.base_url,
            "--workers",
            "1",
        ]
        first = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert first.returncode == 0, first.stderr
        calls = len(server.requests)
        second = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert second.returncode == 0 and len(server.requests) == calls
    agree = subprocess.run(
        [relearn_bin, "review", "agree", str(judged), str(heuristic), "--pool", str(pool)], capture_output=True, text=True, timeout=300
    )
    assert agree.returncode == 0, agree.stderr
    metrics = json.loads(agree.stdout.strip().splitlines()[-1])
    assert metrics["trajectories"] == 2 and -1.0 <= metrics["decision_kappa"] <= 1.0 and 0.0 <= metrics["span_f1"] <= 1.0


BROKEN_BODIES = {
    "html": ScriptedTurn(raw_body=b"<html><body><h1>502 Bad Gateway</h1></body></html>", raw_content_type="text/html"),
    "truncated": ScriptedTurn(raw_body=b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"mess'),
    "empty": ScriptedTurn(raw_body=b""),
    "wrongshape": ScriptedTurn(raw_body=b'{"result": "ok", "data": [1, 2, 3]}'),
}


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
def test_judge_answers_that_are_no_answer_end_as_judge_error_and_the_run_goes_on(tmp_path: Path, kind: str) -> None:
    """An HTML error page, a body cut short, an empty 200 and JSON of another shape, for
    every call about one trajectory each: retried like a 5xx, then that trajectory is
    judge_error; the good one is reviewed; a rerun pays only for the broken ones."""
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [case(name) for name in BROKEN_BODIES] + [case("exact")])

    def answers(request: dict) -> ScriptedTurn:
        text = json.dumps(request)
        broken = next((turn for name, turn in BROKEN_BODIES.items() if f"CASE-{name}:" in text), None)
        return broken if broken is not None else judge_answers(request)

    output = tmp_path / "reviews.jsonl"
    with ModelServer(kind, answers) as server:
        summary, ledger = review_pool(pool, output, judges=judges(server, kind, max_retries=2), workers=2)
        written = [Review.model_validate_json(line) for line in output.read_text().splitlines()]
        standing = [r for r in written if not (r.reason or "").startswith(JUDGE_ERROR)]
        assert summary.reviewed == 1 and [r.trajectory_id for r in standing] == [case("exact").id] and standing[0].decision == "accept"
        assert summary.not_reviewed == len(BROKEN_BODIES) and len(summary.errors) == len(BROKEN_BODIES)
        errors = {r.trajectory_id: r.reason for r in written if r.reason and r.reason.startswith("judge_error")}
        assert set(errors) == {case(name).id for name in BROKEN_BODIES}
        assert all("malformed response" in reason for reason in errors.values()), errors
        exact_calls = sum("CASE-exact:" in json.dumps(r) for r in server.requests)
        again, again_ledger = review_pool(pool, output, judges=judges(server, kind, max_retries=2), workers=2)
        assert again.skipped == 1 and again.not_reviewed == len(BROKEN_BODIES)
        assert sum("CASE-exact:" in json.dumps(r) for r in server.requests) == exact_calls  # no paid call for the good one
    assert ledger.calls == 2  # judge 1 and judge 2 of the good trajectory: the broken bodies cost nothing
    assert again_ledger.calls == 0
