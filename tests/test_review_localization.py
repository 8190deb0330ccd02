"""Judges quoting the way real judges do, over HTTP, through grounding into the masks.

Judge 2 here quotes argv commands as one element, as the whole list and as the command line
it runs, string commands, the whole arguments object as judge 1 read it, and the wrong
field; judge 1 reads a 60,000-character issue whole. The masks then show what each defect
scope excludes of a redundant ``["bash", "-lc", "ls -R"]`` call and the sentence that argued
for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.policies.base import PolicySpec
from harness.scripted.servers import ModelServer, ScriptedTurn
from records.pools import write_atomic
from records.review import Review
from records.trajectory import Trajectory
from relearn.masks.compile import CompileOptions, compile_trajectory
from relearn.masks.template import render
from review.judges import Judge
from review.run import review_pool

MOTIVE = "Let me list every file again to be sure nothing changed."
REASONING = f"The layout was listed already. {MOTIVE} Then I fix add()."
ARGV = ["bash", "-lc", "ls -R"]


def redundant(name: str, command: object = ARGV, issue: str = "fix add() in calc.py", observation: str = "calc.py\ntests/") -> Trajectory:
    """A success whose step 2 repeats a listing; the case name rides in the workdir so that
    both judges' requests name it."""
    return Trajectory.model_validate(
        {
            "task_id": name,
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"CASE-{name}: {issue}"},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "Listing the repository.",
                    "tool_calls": [
                        {
                            "id": "c0",
                            "function": {"name": "shell", "arguments": {"command": ["bash", "-lc", "ls"], "workdir": f"/repo/{name}"}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c0", "content": observation},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": REASONING,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "shell", "arguments": {"command": command, "workdir": f"/repo/{name}"}}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "calc.py\ntests/"},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "Patching.",
                    "tool_calls": [
                        {
                            "id": "c2",
                            "function": {
                                "name": "apply_patch",
                                "arguments": {
                                    "input": "*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b\n*** End Patch\n"
                                },
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c2", "content": "Success."},
                {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
            ],
            "outcome": {"resolved": True, "reward": 1.0},
        }
    )


def span(field: str, quote: str, error: int = 0) -> dict:
    return {"error": error, "field": field, "quote": quote}


MOTIVE_SPAN = span("reasoning_content", MOTIVE)
ARGUMENTS_AS_READ = json.dumps({"command": ARGV, "workdir": "/repo/whole_object"}, ensure_ascii=False, indent=1)
# Per case: the command judge 2 is shown, and its quotes of the call (plus the motivating sentence).
CASES: dict[str, tuple[object, list[dict]]] = {
    "argv_element": (ARGV, [span("tool_calls[0].arguments.command", "ls -R")]),
    "argv_whole": (ARGV, [span("tool_calls[0].arguments.command", '["bash","-lc","ls -R"]')]),
    "argv_command_line": (ARGV, [span("tool_calls[0].arguments.command", "bash -lc 'ls -R'")]),
    "string_command": ("ls -R", [span("tool_calls[0].arguments.command", "ls -R")]),
    "whole_object": (ARGV, [span("tool_calls[0].arguments", ARGUMENTS_AS_READ)]),
    "wrong_field": (ARGV, [span("content", "ls -R")]),
    "misspelt_key": (ARGV, [span("tool_calls[0].arguments.cmd", "ls -R")]),
    # Fail closed: one of the error's quotes does not ground, so none of it counts.
    "one_quote_fails": (ARGV, [span("tool_calls[0].arguments.command", "ls -la /")]),
}
NO_STEP = "no_such_step"


def answers(request: dict) -> ScriptedTurn:
    text = json.dumps(request)
    name = next(n for n in [*CASES, NO_STEP, "long_issue", "long_output"] if f"CASE-{n}:" in text or f"/repo/{n}" in text)
    if "localize confirmed errors" in text:
        return ScriptedTurn(content=json.dumps({"spans": [*CASES[name][1], MOTIVE_SPAN]}), input_tokens=300, output_tokens=40)
    step = 9 if name == NO_STEP else 2
    errors = (
        []
        if name.startswith("long")
        else [
            {
                "step": step,
                "category": "redundant_exploration",
                "description": f"lists the files again ({name})",
                "evidence": "step 1 listed them",
            }
        ]
    )
    return ScriptedTurn(
        content=json.dumps({"decision": "accept", "reason": "solved", "errors": errors, "omissions": []}),
        input_tokens=2000,
        output_tokens=80,
    )


def judges(server: ModelServer, kind: str, context: int | None = None) -> tuple[Judge, Judge]:
    spec = PolicySpec(kind=kind, model="judge-model", base_url=server.base_url, backoff_base_s=0.001)  # type: ignore[arg-type]
    extra = {} if context is None else {"context": context}
    return Judge(spec, "judge1", **extra), Judge(spec, "judge2", **extra)


def reviewed(
    tmp_path: Path, trajectories: list[Trajectory], kind: str = "chat", context: int | None = None
) -> tuple[dict[str, Review], list[dict]]:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, trajectories)
    with ModelServer(kind, answers) as server:
        summary, _ledger = review_pool(pool, tmp_path / "reviews.jsonl", judges=judges(server, kind, context), workers=1)
        requests = list(server.requests)
    by_task = {t.id: t.task_id for t in trajectories}
    written = [Review.model_validate_json(line) for line in (tmp_path / "reviews.jsonl").read_text().splitlines()]
    standing = [r for r in written if not (r.reason or "").startswith("judge_error")]
    assert len(standing) == summary.reviewed
    return {by_task[r.trajectory_id]: r for r in standing}, requests


@pytest.fixture(scope="module")
def reviews(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Review]:
    trajectories = [redundant(name, command) for name, (command, _quotes) in CASES.items()] + [redundant(NO_STEP)]
    found, _requests = reviewed(tmp_path_factory.mktemp("judged"), trajectories)
    return found


@pytest.mark.parametrize("name", [n for n in CASES if n != "one_quote_fails"])
def test_every_way_judges_quote_a_command_grounds(reviews: dict[str, Review], name: str) -> None:
    review = reviews[name]
    assert review.decision == "accept", review.reason
    fields = sorted(d.field for d in review.defects)
    assert len(fields) == 2 and fields[0] == "reasoning_content" and fields[1].startswith("tool_calls[0].arguments")
    call_defect = next(d for d in review.defects if d.field != "reasoning_content")
    assert call_defect.message_index == 4 and "ls -R" in call_defect.quote


def test_an_error_is_ungrounded_unless_every_quote_grounds(reviews: dict[str, Review]) -> None:
    review = reviews["one_quote_fails"]
    assert review.decision == "reject" and review.reason.startswith("no_valid_target: errors at steps [2]")
    assert review.model_extra["grounding"]["grounded"] == 1 and review.model_extra["grounding"]["rejected"] == 1


def test_an_error_at_a_step_that_does_not_exist_rejects(reviews: dict[str, Review]) -> None:
    review = reviews[NO_STEP]
    assert review.decision == "reject" and "steps [9]" in review.reason
    assert review.model_extra["grounding"]["reasons"]["no such step"] == 1


def _excluded_chars(tok, trajectory: Trajectory, review: Review, scope: str) -> tuple[str, str]:  # noqa: ANN001
    """(the rendered text, with every character of an excluded token replaced by NUL)."""
    (sample,) = compile_trajectory(trajectory, review, tok, CompileOptions(defect_scope=scope))
    text = render(trajectory, tok).text
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    marked = list(text)
    for (a, b), eligible, kept in zip(offsets, sample.eligible_mask, sample.loss_mask, strict=True):
        if eligible and not kept:
            marked[a:b] = ["\0"] * (b - a)
    return text, "".join(marked)


@pytest.mark.parametrize("name", ["argv_element", "string_command", "whole_object"])
def test_action_scope_excludes_the_whole_call_and_its_motive_minimal_only_the_quotes(tok, reviews: dict[str, Review], name: str) -> None:  # noqa: ANN001
    trajectory = redundant(name, CASES[name][0])
    review = reviews[name]
    text, action = _excluded_chars(tok, trajectory, review, "action")
    rendered = render(trajectory, tok)
    turn = next(t for t in rendered.turns if t.message_index == 4)
    lo, hi = turn.calls[0].region
    assert text[lo:hi].startswith("<tool_call>\n<function=shell>") and text[lo:hi].endswith("</tool_call><|im_end|>")
    assert set(action[lo:hi]) == {"\0"}  # every token of the call, the end of turn included
    at = text.index(MOTIVE, turn.start)
    assert set(action[at : at + len(MOTIVE)]) == {"\0"}
    # ... and nothing else: the sentences around the motive, the other calls, the final answer.
    assert action.count("\0") < (hi - lo) + len(MOTIVE) + 8
    assert (
        "The layout was listed already." in action and "Then I fix add()." in action and "Fixed: add() returns a + b.<|im_end|>" in action
    )
    assert '["bash", "-lc", "ls"]' in action and "*** Begin Patch" in action
    _, minimal = _excluded_chars(tok, trajectory, review, "minimal")
    assert "<tool_call>\n<function=shell>" in minimal[lo:hi] and "</tool_call><|im_end|>" in minimal[lo:hi]
    excluded_in_call = minimal[lo:hi].count("\0")
    assert 0 < excluded_in_call < hi - lo and "ls -R" not in minimal[lo:hi]
    if name == "argv_element":
        assert '["bash", "-lc", "' in minimal[lo:hi]  # minimal keeps the rest of the argv supervised
    assert MOTIVE not in minimal


def test_a_60000_character_issue_reaches_judge_1_whole(tmp_path: Path) -> None:
    issue = "".join(f"Line {i}: the parser drops the {i}th field when the input ends in a comma.\n" for i in range(900))[:60_000]
    assert len(issue) == 60_000
    found, requests = reviewed(tmp_path, [redundant("long_issue", issue=issue)], kind="anthropic")
    assert found["long_issue"].decision == "accept"
    judge1 = json.dumps(requests[0]["messages"], ensure_ascii=False)
    assert json.dumps(issue, ensure_ascii=False)[1:-1] in judge1 and "elided" not in judge1


def test_long_tool_output_is_elided_in_its_middle_and_said_so_the_task_never(tmp_path: Path) -> None:
    issue = "Steps to reproduce: " + "run the parser on a trailing comma. " * 400
    observation = "".join(f"tests/test_{i}.py::test_case PASSED\n" for i in range(6000))
    found, requests = reviewed(tmp_path / "fit", [redundant("long_output", issue=issue, observation=observation)], context=12_000)
    review = found["long_output"]
    assert review.decision == "accept" and review.model_extra["reading"]["tokens"] <= 12_000
    (elided,) = review.model_extra["reading"]["elided"]
    assert elided.startswith("- the observation after step 1:")
    sent = requests[0]["messages"][-1]["content"]
    sent = sent if isinstance(sent, str) else "".join(part["text"] for part in sent)
    assert issue in sent and "### Elided for length" in sent and "tokens truncated" in sent
    assert "tests/test_0.py::test_case PASSED" in sent and "tests/test_5999.py::test_case PASSED" in sent and "test_3000.py" not in sent
    assert MOTIVE in sent  # the agent's text is never cut
    # An issue that alone exceeds the context is rejected and counted, and no judge is called.
    found, requests = reviewed(tmp_path / "over", [redundant("long_output", issue=issue)], context=1_000)
    assert found["long_output"].reason.startswith("too_long_for_judge") and requests == []
