"""Keep-interval review of single-turn rollouts (scripted keep judge and auditor over HTTP, through
the real SDKs) and the masks it compiles to: m = A ∩ K for Math and Code, all of A for IF."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from envs.single_turn.tasks import MINI_ROLLOUTS, MINI_TASKS, load_tasks
from envs.single_turn.verify import grade
from harness.import_run import import_files
from harness.importers.single_turn import SingleTurnImporter, options_for
from harness.policies.base import PolicySpec
from harness.scripted.servers import ModelServer, ScriptedTurn
from harness.scripted.single_turn_judges import ANSWERS, judges, keep_judge, response_digest
from records.pools import JsonlWriter, read_trajectories_lenient
from records.review import iter_reviews
from records.trajectory import Trajectory
from relearn.masks.compile import CompileOptions, compile_trajectory
from review.judges import CallCache, Judge, Ledger
from review.keep import repeated_answer_emission, review_single_turn, review_single_turn_pool

WRONG_STEP = "7/8 is 0.875... no, I should add numerators over 4"


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Trajectory]:
    """The suite's Math and IF rollouts, imported and graded, by (task, step)."""
    folder = tmp_path_factory.mktemp("pool")
    wanted = [json.loads(line) for line in MINI_ROLLOUTS.read_text().splitlines()]
    subset = folder / "rollouts.jsonl"
    subset.write_text(
        "".join(json.dumps(r) + "\n" for r in wanted if r["task_id"] in {"math-m01", "math-m02", "math-m03", "math-m04", "if-i02"})
    )
    import_files("single-turn", [subset], folder / "pool.jsonl", importer=SingleTurnImporter(options_for()))
    tasks, _ = load_tasks(MINI_TASKS)
    out = {}
    for trajectory in read_trajectories_lenient(folder / "pool.jsonl", []):
        trajectory.outcome = grade(trajectory, tasks[trajectory.task_id or ""])
        out[(trajectory.task_id or "", trajectory.policy.step or 0)] = trajectory
    return out


def _judges(server: ModelServer, kind: str) -> tuple[Judge, Judge]:
    spec = PolicySpec(kind=kind, model="judge-model", base_url=server.base_url, backoff_base_s=0.001)  # type: ignore[arg-type]
    return Judge(spec, "keep"), Judge(spec, "audit")


def _review(trajectory: Trajectory, server: ModelServer, kind: str, tmp_path: Path):  # noqa: ANN202
    judge, audit = _judges(server, kind)
    cache = CallCache(tmp_path / f"calls-{kind}-{trajectory.id}.jsonl")
    try:
        return review_single_turn(trajectory, judge, audit, cache, Ledger())
    finally:
        cache.close()


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
def test_wrong_then_corrected_reasoning_keeps_the_clean_solution_and_masks_a_and_k(rollouts, tok, tmp_path: Path, kind: str) -> None:  # noqa: ANN001
    trajectory = rollouts[("math-m01", 1)]  # a wrong first attempt, "Wait, that is wrong", then the clean solution
    with ModelServer(kind, judges) as server:
        review = _review(trajectory, server, kind, tmp_path)
        assert len(server.requests) == 2  # the keep judge, then the auditor
        audit_request = json.dumps(server.requests[1])
    assert review.decision == "accept" and review.protocol == "keep_intervals" and review.audit["verdict"] == "pass"
    message = trajectory.messages[1]
    kept = {(k["field"], message.model_dump()[k["field"]][k["start"] : k["end"]]) for k in review.keep}
    assert kept == {("reasoning_content", "3/4 = 6/8, so 6/8 + 1/8 = 7/8."), ("content", "The answer is $\\boxed{\\frac{7}{8}}$.")}
    # The auditor reads the kept text alone, with the left-out text marked, never the wrong step.
    assert "[...]" in audit_request and WRONG_STEP not in audit_request
    # E is the complement of K in the response; A ∩ K supervises none of the wrong step.
    assert [d.field for d in review.defects] == ["reasoning_content"] and WRONG_STEP in review.defects[0].quote
    assert review.defects[0].category == "corrected_mistake"
    (ross,) = compile_trajectory(trajectory, review, tok, CompileOptions(mode="ross"))
    (positive,) = compile_trajectory(trajectory, review, tok, CompileOptions(mode="positive"))
    supervised = tok.decode(ross.input_ids[ross.loss_mask == 1])
    assert (
        "0.875" not in supervised
        and "Wait" not in supervised
        and "6/8 + 1/8 = 7/8." in supervised
        and "\\boxed{\\frac{7}{8}}" in supervised
    )
    assert np.array_equal(ross.input_ids, positive.input_ids) and np.all(ross.loss_mask <= positive.loss_mask)
    assert 0 < ross.excluded == positive.supervised - ross.supervised


def test_an_instruction_following_positive_is_fully_supervised_without_a_judge(rollouts, tok, tmp_path: Path) -> None:  # noqa: ANN001
    trajectory = rollouts[("if-i02", 82)]
    with ModelServer("chat", judges) as server:
        review = _review(trajectory, server, "chat", tmp_path)
        assert server.requests == []
    assert review.decision == "accept" and review.protocol == "full_supervision" and review.defects == []
    (ross,) = compile_trajectory(trajectory, review, tok, CompileOptions(mode="ross"))
    (positive,) = compile_trajectory(trajectory, review, tok, CompileOptions(mode="positive"))
    assert np.array_equal(ross.loss_mask, ross.eligible_mask) and np.array_equal(ross.loss_mask, positive.loss_mask) and ross.supervised > 0


def test_a_keep_interval_that_does_not_ground_drops_the_candidate(rollouts, tmp_path: Path) -> None:  # noqa: ANN001
    trajectory = rollouts[("math-m01", 81)]
    message = trajectory.messages[1]
    key = response_digest(message.reasoning_content or "", message.content or "")
    invented = json.loads(json.dumps(ANSWERS[key]["keep"]))
    invented["intervals"][0]["quote"] = "Convert to eighths: 3/4 is 6/8, and adding 1/8 gives 7/8."  # a patched, invented solution
    with ModelServer("chat", lambda request: keep_judge(request, {key: invented})) as server:
        review = _review(trajectory, server, "chat", tmp_path)
        assert len(server.requests) == 1  # no audit of a target that does not exist
    assert review.decision == "reject" and review.reason.startswith("no_valid_target: keep intervals did not ground")


def test_a_right_answer_reached_by_wrong_reasoning_is_dropped_and_a_failed_audit_drops_too(rollouts, tmp_path: Path) -> None:  # noqa: ANN001
    wrong_reasoning = rollouts[("math-m03", 3)]
    assert wrong_reasoning.outcome.resolved  # the verifier passes it: the answer is right
    with ModelServer("chat", judges) as server:
        review = _review(wrong_reasoning, server, "chat", tmp_path)
    assert review.decision == "reject" and review.reason.startswith("no_clean_solution")

    def failing_audit(request: dict) -> ScriptedTurn:
        if "Keep-interval auditor" in json.dumps(request):
            return ScriptedTurn(
                content=json.dumps(
                    {"verdict": "fail", "self_contained": False, "correct": True, "reason": "a step refers to text left out"}
                )
            )
        return keep_judge(request)

    with ModelServer("chat", failing_audit) as server:
        review = _review(rollouts[("math-m01", 1)], server, "chat", tmp_path)
    assert review.decision == "reject" and review.reason == "audit_failed: a step refers to text left out" and review.keep


def test_repeated_answer_emission_is_a_pre_filter_signal_the_judge_sees(rollouts, tmp_path: Path) -> None:  # noqa: ANN001
    repeated = rollouts[("math-m02", 2)]  # the boxed answer written five times
    found = repeated_answer_emission(repeated.messages[1].content or "")
    assert found is not None and found.answer == "4" and found.count == 5
    assert repeated_answer_emission("The answer is $\\boxed{4}$.") is None
    assert repeated_answer_emission("Final answer: 4\nLet me check.\nFinal answer: 4") is not None
    with ModelServer("chat", judges) as server:
        review = _review(repeated, server, "chat", tmp_path)
        assert "repeated answer emission" in json.dumps(server.requests[0])
    assert review.decision == "accept" and review.signals[0]["kind"] == "repeated_answer_emission"
    content = repeated.messages[1].content or ""
    kept_content = [k for k in review.keep if k["field"] == "content"]
    assert len(kept_content) == 1 and content[kept_content[0]["start"] : kept_content[0]["end"]].count("\\boxed") == 1
    assert any(d.field == "content" and d.quote.count("\\boxed{4}") == 4 for d in review.defects)


def test_a_pool_review_resumes_and_a_rerun_makes_no_call(rollouts, tmp_path: Path) -> None:  # noqa: ANN001
    pool = tmp_path / "verified.jsonl"
    with JsonlWriter(pool) as writer:
        for trajectory in rollouts.values():
            writer.write(trajectory)
    with ModelServer("chat", judges) as server:
        judge, audit = _judges(server, "chat")
        summary, ledger = review_single_turn_pool(pool, tmp_path / "reviews.jsonl", judge, audit, workers=2)
        calls = len(server.requests)
        again, _ = review_single_turn_pool(pool, tmp_path / "reviews.jsonl", judge, audit)
        assert len(server.requests) == calls
    assert again.skipped == len(rollouts) and again.reviewed == 0
    reviews = list(iter_reviews(tmp_path / "reviews.jsonl"))
    assert len(reviews) == len(rollouts) and summary.decisions["accept"] >= 4 and calls == ledger.calls
    assert {r.reason.split(":")[0] for r in reviews if r.decision == "reject"} >= {"not verified positive", "no_clean_solution"}


def test_the_viewer_shows_kept_intervals_and_the_audit_verdict(rollouts, tmp_path: Path) -> None:  # noqa: ANN001
    from rich.console import Console

    from relearn.view.marks import RenderOptions
    from relearn.view.screen import TrajectoryView

    trajectory = rollouts[("math-m01", 1)]
    with ModelServer("chat", judges) as server:
        review = _review(trajectory, server, "chat", tmp_path)
    view = TrajectoryView(trajectory, review)
    buffer = io.StringIO()
    console = Console(width=200, no_color=True, file=buffer)
    console.print(view.header())
    console.print(view.step(1, RenderOptions(markers=True)))
    shown = buffer.getvalue()
    assert "2 keep intervals (A ∩ K) · audit pass" in shown
    assert "[+3/4 = 6/8, so 6/8 + 1/8 = 7/8.+]{K#1}" in shown and "[+The answer is $\\boxed{\\frac{7}{8}}$.+]{K#2}" in shown
    assert "[-" not in shown  # the left-out text is shown plain, not as struck defects
    assert "audit pass (self_contained: yes, correct: yes)" in shown


def test_the_review_command_runs_the_judges_over_http_and_resumes(rollouts, tmp_path: Path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from relearn.cli.main import app

    pool = tmp_path / "verified.jsonl"
    with JsonlWriter(pool) as writer:
        writer.write(rollouts[("math-m01", 1)])
        writer.write(rollouts[("if-i02", 82)])
    command = ["single-turn", "review", str(pool), "-o", str(tmp_path / "reviews.jsonl"), "--judge", "keep-judge", "--backend", "chat"]
    with ModelServer("chat", judges) as server:
        first = CliRunner().invoke(app, [*command, "--base-url", server.base_url], env={"OPENAI_API_KEY": "test"})
        second = CliRunner().invoke(app, [*command, "--base-url", server.base_url], env={"OPENAI_API_KEY": "test"})
        assert len(server.requests) == 2
    assert first.exit_code == 0, first.output
    text = " ".join(first.output.replace("│", " ").split())
    assert "reviewed 2" in text and "accept 2" in text and "judge calls 2" in text
    assert second.exit_code == 0 and "already reviewed (skipped) 2" in " ".join(second.output.replace("│", " ").split())
    assert [r.decision for r in iter_reviews(tmp_path / "reviews.jsonl")] == ["accept", "accept"]
    refused = CliRunner().invoke(app, [*command[:-2], "--backend", "grpc"])
    assert refused.exit_code == 2 and "'grpc' is not one of 'anthropic', 'chat', 'responses'" in refused.output


def test_the_no_thinking_form_supervises_the_visible_response_and_not_the_empty_think_block(tok) -> None:  # noqa: ANN001
    from harness.importers.single_turn import split_response
    from records.review import Review
    from records.trajectory import Message, Outcome
    from relearn.verbs.masks import MasksOptions

    reasoning, content = split_response("<think>\nAdd them: 2 + 2 = 4.\n</think>\n\nThe answer is $\\boxed{4}$.", split_thinking=False)
    assert reasoning is None
    trajectory = Trajectory(
        messages=[Message(role="user", content="2+2?"), Message(role="assistant", content=content, generated=True)],
        outcome=Outcome(resolved=True, reward=1.0, verdict={"kind": "math"}),
    )
    (sample,) = compile_trajectory(
        trajectory,
        Review(trajectory_id=trajectory.id, decision="accept"),
        tok,
        MasksOptions(Path(), Path(), mode="ross", no_thinking=True).compile_options(),
    )
    supervised = tok.decode(sample.input_ids[sample.loss_mask == 1])
    assert supervised == "Add them: 2 + 2 = 4.\n\nThe answer is $\\boxed{4}$.<|im_end|>"
    assert "<think>\n\n</think>" in tok.decode(sample.input_ids)


def test_masks_refuse_a_keep_review_whose_defects_are_not_the_complement_of_k(rollouts, tok, tmp_path: Path) -> None:  # noqa: ANN001
    from relearn.masks.compile import Rejected

    trajectory = rollouts[("math-m02", 2)]  # repeated answer emission: E is the repeats in the final answer
    with ModelServer("chat", judges) as server:
        review = _review(trajectory, server, "chat", tmp_path)
    assert review.decision == "accept" and review.defects
    (sample,) = compile_trajectory(trajectory, review, tok, CompileOptions(mode="ross"))
    assert sample.excluded > 0
    dropped = review.model_copy(update={"defects": review.defects[1:]} if len(review.defects) > 1 else {"defects": []})
    with pytest.raises(Rejected, match="text outside the keep intervals is not excluded"):
        compile_trajectory(trajectory, dropped, tok, CompileOptions(mode="ross-nomask"))
    moved = review.model_copy(deep=True)
    moved.model_extra["keep"][0]["start"] += 1
    with pytest.raises(Rejected, match="keep interval not at its offsets"):
        compile_trajectory(trajectory, moved, tok, CompileOptions(mode="ross"))
