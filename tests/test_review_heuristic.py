"""Pre-filter signals and the offline heuristic reviewer, on trajectories in the shape the
harness records (Codex-style tool calls and results) and the mini-swe-agent text protocol,
through to the real mask compiler."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from envs.tasks import Task, load_tasks
from harness.importers import codex, mini_swe_agent
from harness.scripted.solutions import to_apply_patch
from records.review import CATEGORIES, Review, field_text
from records.trajectory import Trajectory
from relearn.masks.compile import CompileOptions, compile_trajectory
from review.heuristic import PROMPTS_VERSION, heuristic_review
from review.prefilters import prefilter

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
PATCH = "*** Begin Patch\n*** Update File: calc.py\n@@\n def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"
INVERSE = "*** Begin Patch\n*** Update File: calc.py\n@@\n def add(a, b):\n-    return a + b\n+    return a - b\n*** End Patch\n"

_ids = itertools.count()


def shell(
    script: str | list[str], exit_code: int = 0, output: str = "", *, reasoning: str | None = None, workdir: str | None = None
) -> list[dict]:
    """One assistant step running a shell command and its recorded result (Codex format)."""
    call_id = f"call_{next(_ids)}"
    command = script if isinstance(script, list) else ["bash", "-lc", script]
    arguments: dict[str, Any] = {"command": command}
    if workdir:
        arguments["workdir"] = workdir
    step = {
        "role": "assistant",
        "generated": True,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "shell", "arguments": arguments}}],
    }
    if reasoning:
        step["reasoning_content"] = reasoning
    body = f"Exit code: {exit_code}\nWall time: 0.{next(_ids) % 10} seconds\nOutput:\n{output}"
    result = {
        "role": "tool",
        "tool_call_id": call_id,
        "name": "shell",
        "content": body,
        "metadata": {"exit_code": exit_code, "duration_seconds": 0.1, "timed_out": False},
    }
    return [step, result]


def patch(text: str, ok: bool = True, *, content: str | None = None) -> list[dict]:
    call_id = f"call_{next(_ids)}"
    step = {
        "role": "assistant",
        "generated": True,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "apply_patch", "arguments": {"input": text}}}],
    }
    if content:
        step["content"] = content
    if ok:
        result = {
            "role": "tool",
            "tool_call_id": call_id,
            "name": "apply_patch",
            "content": "Success. Updated the following files:\nM calc.py\n",
            "metadata": {"exit_code": 0, "files": ["calc.py"]},
        }
    else:
        result = {
            "role": "tool",
            "tool_call_id": call_id,
            "name": "apply_patch",
            "content": "Error: Failed to find expected lines in calc.py:\n    return a * b",
            "metadata": {"exit_code": 1},
        }
    return [step, result]


def trajectory(
    *steps: list[dict],
    final: str | None = "The fix is in place and the tests pass.",
    resolved: bool | None = True,
    reward: float | None = None,
) -> Trajectory:
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent working in /testbed."},
        {"role": "user", "content": "Fix add() in calc.py."},
    ]
    for step in steps:
        messages += step
    if final is not None:
        messages.append({"role": "assistant", "generated": True, "content": final})
    outcome = {k: v for k, v in (("resolved", resolved), ("reward", reward)) if v is not None}
    return Trajectory.model_validate({"messages": messages, "outcome": outcome or None})


def found(t: Trajectory) -> list[tuple[int, str]]:
    return [(s.message_index, s.kind) for s in prefilter(t)]


TEST = "python3 -m pytest -q tests/test_calc.py"


def clean() -> Trajectory:
    return trajectory(
        shell("ls -R . | head -50", output="calc.py\ntests\n", reasoning="Look first."),
        shell("cat calc.py", output="def add(a, b):\n    return a - b\n"),
        shell("grep -rn 'add(' tests", exit_code=1),  # no match: exit 1 is an answer, not a failure
        patch(PATCH),
        shell(TEST, output="3 passed\n"),
        shell("git diff", output="diff --git a/calc.py b/calc.py\n"),
    )


# ---- prefilter ----------------------------------------------------------------------------


def test_clean_trajectory_has_no_signals() -> None:
    assert found(clean()) == []


def test_failed_commands_tool_errors_and_tracebacks() -> None:
    t = trajectory(
        shell("python repro.py", exit_code=2, output="python: can't open file 'repro.py'"),  # 2
        shell(
            "python -c 'import calc; calc.add(1)'",
            exit_code=1,
            output="Traceback (most recent call last):\n  File ...\nTypeError: add() missing 1 required positional argument",
        ),  # 4
        patch(PATCH.replace("a + b", "a * b"), ok=False),  # 6
        patch(PATCH),  # 8
        shell(
            "python -c 'import calc; print(calc.add(1, 2))'",
            exit_code=1,
            output="Traceback (most recent call last):\nNameError: name 'b' is not defined",
        ),  # 10
        shell("pip instal pytest", exit_code=1, output="ERROR: unknown command"),  # 12
        shell(TEST, output="3 passed\n"),  # 14
    )
    signals = prefilter(t)
    assert [(s.message_index, s.kind, s.category) for s in signals] == [
        (2, "failed_command", "corrected_mistake"),
        (4, "expected_failure", "other"),  # before any edit: a reproduction, a hint and no mistake
        (6, "tool_error", "corrected_mistake"),
        (10, "traceback", "corrected_mistake"),  # after our own edit
        (12, "failed_command", "corrected_mistake"),
    ]
    assert all(s.call_index == 0 and s.category in CATEGORIES for s in signals)
    assert "exit code 2" in signals[0].detail and "NameError" in signals[3].evidence


def test_exit_code_parsed_from_the_output_when_metadata_is_missing() -> None:
    step, result = shell("make build", exit_code=2, output="make: *** No rule to make target 'build'.")
    result.pop("metadata")
    assert found(trajectory([step, result])) == [(2, "failed_command")]


def test_repeated_commands_and_test_runs() -> None:
    t = trajectory(
        shell("cat calc.py", output="def add(a, b):\n    return a - b\n"),  # 2
        shell(TEST, output="1 failed\n", exit_code=0),  # 4
        shell("ls tests", output="test_calc.py\n"),  # 6
        shell("cat calc.py", output="def add(a, b):\n    return a - b\n"),  # 8: repeat
        shell(TEST, output="1 failed\n", exit_code=0),  # 10: test run with no edit in between
        patch(PATCH),  # 12
        shell(TEST, output="3 passed\n"),  # 14: after an edit, a new question
        shell("cat calc.py", output="def add(a, b):\n    return a + b\n"),  # 16: after an edit
        shell("cat calc.py", output="def add(a, b):\n    return a + b\n", workdir="/elsewhere"),  # 18: another directory
        shell("pip install -e .", output="ok"),  # 20: changes the environment
        shell(TEST, output="3 passed\n"),  # 22: so this run is a new question too
    )
    assert found(t) == [(8, "repeated_command"), (10, "repeated_test_run")]
    (signal,) = [s for s in prefilter(t) if s.kind == "repeated_test_run"]
    assert signal.category == "redundant_exploration" and "as at message 4" in signal.detail


def test_stuck_loop_and_abab() -> None:
    stuck = trajectory(*[shell("ls", output="calc.py\n") for _ in range(4)])
    assert found(stuck) == [(4, "stuck_loop"), (6, "stuck_loop"), (8, "stuck_loop")]
    two = trajectory(*[shell("ls", output="calc.py\n") for _ in range(2)])
    assert found(two) == [(4, "repeated_command")]  # two in a row is a repeat, not yet a loop
    abab = trajectory(
        shell("cat calc.py", output="A\n"),
        shell("cat tests/test_calc.py", output="B\n"),
        shell("cat calc.py", output="A\n"),
        shell("cat tests/test_calc.py", output="B\n"),
    )
    assert found(abab) == [(6, "abab"), (8, "abab")]
    failing_patch = trajectory(*[patch(PATCH, ok=False) for _ in range(3)])
    assert found(failing_patch) == [(2, "tool_error"), (4, "tool_error"), (4, "stuck_loop"), (6, "tool_error"), (6, "stuck_loop")]


def test_reverted_edits() -> None:
    inverse = trajectory(patch(PATCH), shell(TEST, exit_code=1, output="1 failed"), patch(INVERSE), shell("cat calc.py", output="ok"))
    assert found(inverse) == [(2, "reverted_edit"), (4, "failed_command")]
    (signal,) = [s for s in prefilter(inverse) if s.kind == "reverted_edit"]
    assert signal.category == "abandoned_attempt" and "message 6" in signal.detail
    for command in (
        "git checkout -- calc.py",
        "git restore calc.py",
        "git stash",
        "cd /testbed && git checkout ./calc.py",
        "git reset --hard",
    ):
        t = trajectory(patch(PATCH), shell(command), patch(PATCH))
        assert found(t) == [(2, "reverted_edit")], command
    shell_edit = trajectory(shell("sed -i 's/a - b/a + b/' calc.py"), shell("git checkout -- calc.py"))
    assert found(shell_edit) == [(2, "reverted_edit")]
    # Not reverts: another file, a branch switch, restoring the index only, popping a stash, a further edit.
    for command in ("git checkout -- other.py", "git checkout -b fix", "git restore --staged calc.py", "git stash pop"):
        assert found(trajectory(patch(PATCH), shell(command))) == [], command
    further = PATCH.replace("-    return a - b\n+    return a + b", "-    return a + b\n+    return b + a")
    assert found(trajectory(patch(PATCH), patch(further))) == []


def text_protocol(*steps: tuple[str, int, str], final: str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT") -> Trajectory:
    messages: list[dict] = [
        {"role": "system", "content": "Answer with one bash block."},
        {"role": "user", "content": "Please solve this issue."},
    ]
    for command, code, output in steps:
        messages.append({"role": "assistant", "generated": True, "content": f"THOUGHT: I will run `{command}`.\n\n```bash\n{command}\n```"})
        messages.append({"role": "user", "content": f"<returncode>{code}</returncode>\n<output>\n{output}</output>"})
    messages.append({"role": "assistant", "generated": True, "content": f"THOUGHT: done.\n\n```bash\n{final}\n```"})
    messages.append({"role": "user", "content": ""})
    return Trajectory.model_validate({"messages": messages, "outcome": {"resolved": True}})


def test_text_protocol_trajectories() -> None:
    t = text_protocol(
        ("cat calc.py", 0, "def add"), ("python run.py", 1, "boom\n"), ("cat calc.py", 0, "def add"), ("grep -n sub calc.py", 1, "")
    )
    assert found(t) == [(4, "expected_failure"), (6, "repeated_command")]  # run.py fails before any edit: a reproduction
    t = text_protocol(("cat calc.py", 0, "def add"), ("sed -i 's/a - b/a + b/' calc.py", 0, ""), ("python run.py", 1, "boom\n"))
    assert found(t) == [(6, "failed_command")]  # after the edit


def test_real_samples_have_no_signals(samples: Path) -> None:
    (result,) = list(mini_swe_agent.read(samples / "mini_swe_agent_v1.13.4.traj.json"))
    assert result.trajectory is not None and prefilter(result.trajectory) == []
    (result,) = list(codex.read(samples / "codex_rollout_v0.135.0_exec.jsonl"))
    assert result.trajectory is not None and prefilter(result.trajectory) == []
    review = heuristic_review(result.trajectory)  # no outcome recorded: not verified positive
    assert review.decision == "reject" and review.reason == "not verified positive" and review.defects == []


# ---- heuristic_review --------------------------------------------------------------------


def assert_valid(t: Trajectory, review: Review) -> None:
    assert Review.model_validate(json.loads(review.model_dump_json())) == review
    assert review.trajectory_id == t.id
    assert review.model_extra["judges"] == {"judge1": "heuristic", "judge2": "heuristic"}
    assert review.model_extra["cost_usd"] == 0 and len(review.model_extra["prompts_hash"]) == 64
    for d in review.defects:
        text = field_text(t.messages[d.message_index], d.field)
        assert text is not None and d.quote == text[d.start : d.end] and d.quote.strip()
        assert d.category in CATEGORIES
    for error in review.errors:
        assert error["source"] == "heuristic" and error["category"] in CATEGORIES and error["step"] >= 1
        assert {"step", "category", "description", "evidence"} <= set(error)


def test_review_excludes_exactly_the_flagged_actions() -> None:
    t = trajectory(
        shell("python repro.py", exit_code=2, output="no such file", reasoning="Reproduce first."),  # 2
        patch(PATCH, content="Trying a fix."),  # 4: reverted below
        patch(INVERSE),  # 6
        patch(PATCH),  # 8
        shell(["python3", "-m", "pytest", "-q", "tests/test_calc.py"], output="3 passed"),  # 10
        shell(["python3", "-m", "pytest", "-q", "tests/test_calc.py"], output="3 passed"),  # 12: repeat
        shell("ls", exit_code=1, output="ls: cannot access"),  # 14: failed
    )
    review = heuristic_review(t)
    assert_valid(t, review)
    assert review.decision == "accept" and review.reason is None
    by_message = {d.message_index: d for d in review.defects}
    assert sorted(by_message) == [2, 4, 12, 14]
    assert by_message[2].field == "tool_calls[0].arguments" and by_message[2].quote == "python repro.py"
    assert by_message[4].field == "tool_calls[0].arguments.input" and by_message[4].quote == PATCH
    assert by_message[12].quote == '"python3", "-m", "pytest", "-q", "tests/test_calc.py"'
    assert by_message[4].category == "abandoned_attempt" and by_message[12].category == "redundant_exploration"
    # Reasoning and content next to a flagged action stay: nothing shows they are wrong.
    assert all(d.field.startswith("tool_calls[") for d in review.defects)
    assert [(e["step"], e["kind"]) for e in review.errors] == [
        (1, "failed_command"),
        (2, "reverted_edit"),
        (6, "repeated_test_run"),
        (7, "failed_command"),
    ]


def test_script_text_is_grounded_even_where_it_repeats_in_the_arguments() -> None:
    # The script also appears as the workdir name: only the argv element is excluded.
    t = trajectory(shell("ls", exit_code=2, output="no", workdir="ls"), shell("echo ok"))
    (d,) = heuristic_review(t).defects
    as_json = json.dumps(t.messages[2].tool_calls[0].function.arguments, ensure_ascii=False)
    assert d.start == as_json.index('"-lc", "ls"') + len('"-lc", "') and d.quote == "ls"


def test_shell_command_given_as_a_string_and_json_escapes() -> None:
    script = 'printf "%s\\n" "a \\"b\\"" > out.txt\ncat missing.txt'
    step, result = shell(script, exit_code=1, output="cat: missing.txt: No such file")
    step["tool_calls"][0]["function"]["arguments"]["command"] = script
    t = trajectory([step, result], shell("echo ok"))
    review = heuristic_review(t)
    assert_valid(t, review)
    (d,) = review.defects
    assert d.field == "tool_calls[0].arguments.command" and d.quote == script
    argv = trajectory(shell(script, exit_code=1), shell("echo ok"))
    (d,) = heuristic_review(argv).defects
    assert d.field == "tool_calls[0].arguments" and d.quote == json.dumps(script)[1:-1]
    # Codex's exec_command keeps the command under "cmd".
    step, result = shell("make", exit_code=2)
    step["tool_calls"][0]["function"] = {"name": "exec_command", "arguments": {"cmd": "make", "yield_time_ms": 1000}}
    codex_style = trajectory([step, result], shell("echo ok"))
    assert found(codex_style) == [(2, "failed_command")]
    (d,) = heuristic_review(codex_style).defects
    assert d.field == "tool_calls[0].arguments.cmd" and d.quote == "make"


def test_last_assistant_message_is_never_excluded() -> None:
    t = trajectory(shell("cat calc.py", output="x"), shell("cat calc.py", output="x"), final=None)
    assert found(t) == [(4, "repeated_command")]
    review = heuristic_review(t)
    assert review.decision == "accept" and review.defects == [] and review.errors == []


def test_decision_rules() -> None:
    steps = (shell("python repro.py", exit_code=2), patch(PATCH), shell(TEST, output="ok"))
    for outcome in ({"resolved": False}, {"resolved": None, "reward": 0.0}, {"resolved": None, "reward": None}):
        t = trajectory(*steps, **outcome)
        review = heuristic_review(t)
        assert_valid(t, review)
        assert review.decision == "reject" and review.reason == "not verified positive"
    assert heuristic_review(trajectory(*steps, resolved=None, reward=1.0)).decision == "accept"
    # Every generated step is flagged and the final answer is empty: nothing left to learn.
    empty_final = trajectory(shell("make", exit_code=2), shell("make", exit_code=2), final="")
    review = heuristic_review(empty_final)
    assert_valid(empty_final, review)
    assert review.decision == "reject" and review.reason == "no_valid_target" and len(review.defects) == 2
    assert heuristic_review(trajectory(final=None)).reason == "no_valid_target"
    # A reasoning line beside a flagged action is still a target.
    with_reasoning = trajectory(shell("make", exit_code=2, reasoning="Build it."), shell("make", exit_code=2), final="")
    assert heuristic_review(with_reasoning).decision == "accept"


def test_prompts_hash_is_of_the_version() -> None:
    import hashlib

    assert heuristic_review(clean()).model_extra["prompts_hash"] == hashlib.sha256(PROMPTS_VERSION.encode()).hexdigest()


# ---- expected failures --------------------------------------------------------------------

FAILING = "F..\nFAILED tests/test_calc.py::test_add - assert -1 == 3\n1 failed, 2 passed in 0.02s\n"


def test_reproduction_before_the_fix_is_no_defect() -> None:
    t = trajectory(
        shell("cat calc.py", output="def add(a, b):\n    return a - b\n"),  # 2
        shell(TEST, exit_code=1, output=FAILING),  # 4: the bug, seen before any edit
        patch(PATCH),  # 6
        shell(TEST, output="3 passed\n"),  # 8
    )
    (signal,) = prefilter(t)
    assert (signal.message_index, signal.kind, signal.is_defect) == (4, "expected_failure", False)
    assert "exit code 1" in signal.detail and "reproduction" in signal.detail and "1 failed" in signal.evidence
    review = heuristic_review(t)
    assert_valid(t, review)
    # No error entry either: it would count in the category shares.
    assert review.decision == "accept" and review.defects == [] and review.errors == []


def test_setting_up_a_reproduction_is_not_the_start_of_the_fix() -> None:
    script = "cat > reproduce.py << 'EOF'\nfrom calc import add\nassert add(1, 2) == 3\nEOF"
    traceback = 'Traceback (most recent call last):\n  File "reproduce.py", line 2, in <module>\nAssertionError\n'
    for setup in (
        shell(script),
        shell("pip install -e .", output="ok"),
        shell("mkdir -p /tmp/r && cp calc.py /tmp/r/"),
        patch(PATCH.replace("calc.py", "tests/test_new.py")),
    ):
        t = trajectory(setup, shell("python reproduce.py", exit_code=1, output=traceback), patch(PATCH), shell("python reproduce.py"))
        assert found(t) == [(4, "expected_failure")], setup[0]
    # A write to a file the agent has seen is an edit of the code: what fails after it is a mistake.
    rewrite = trajectory(
        shell("cat calc.py", output="def add"),
        shell("cat > calc.py << 'EOF'\nx\nEOF"),
        shell("python reproduce.py", exit_code=1, output=traceback),
    )
    assert found(rewrite) == [(6, "traceback")]


def test_failure_after_an_edit_is_still_a_mistake() -> None:
    t = trajectory(
        shell(TEST, exit_code=1, output=FAILING, reasoning="Reproduce the failure."),  # 2
        patch(PATCH.replace("a + b", "a * b")),  # 4: the wrong fix
        shell(
            TEST, exit_code=1, output=FAILING, reasoning="Check the reproduction again."
        ),  # 6: "reproduction" after an edit predicts nothing
        patch(PATCH.replace("-    return a - b", "-    return a * b")),  # 8
        shell(TEST, output="3 passed\n"),  # 10
    )
    assert [(s.message_index, s.kind, s.category) for s in prefilter(t)] == [
        (2, "expected_failure", "other"),
        (6, "failed_command", "corrected_mistake"),
    ]
    review = heuristic_review(t)
    assert [(e["message_index"], e["kind"], e["category"]) for e in review.errors] == [(6, "failed_command", "corrected_mistake")]
    assert [d.message_index for d in review.defects] == [6]


def test_a_failure_the_agent_announced_is_expected() -> None:
    stash = "git stash push -- calc.py && python3 -m pytest -q tests/test_regression.py"
    for reasoning in (
        "The new test should fail on the original code.",
        "I expect it to fail without the fix.",
        "This is expected to fail.",
    ):
        t = trajectory(
            patch(PATCH),
            shell(stash, exit_code=1, output="F\n1 failed\n", reasoning=reasoning),
            shell("git stash pop"),
            shell(TEST, output="3 passed\n"),
        )
        assert found(t) == [(4, "expected_failure")], reasoning
        assert heuristic_review(t).defects == []
    # Negated, or predicting a pass as well, or only in the code: no prediction of this failure.
    for reasoning in ("This should not fail any more.", "It should fail before the fix and pass after it.", "Run `should_fail.py`."):
        t = trajectory(patch(PATCH), shell(TEST, exit_code=1, output=FAILING, reasoning=reasoning))
        assert found(t) == [(4, "failed_command")], reasoning
    # Before any edit, saying "reproduce" makes a command that runs no code a reproduction too.
    curl = trajectory(shell("curl -sf localhost:8000/add?a=1", exit_code=22, output="", reasoning="Reproduce the bug against the server."))
    assert found(curl) == [(2, "expected_failure")]
    assert found(trajectory(shell("curl -sf localhost:8000/add?a=1", exit_code=22))) == [(2, "failed_command")]
    text = text_protocol(("python3 -m pytest -q tests/test_calc.py", 1, FAILING))
    assert found(text) == [(2, "expected_failure")]


def test_broken_invocations_are_mistakes_even_as_reproductions() -> None:
    cases = [
        ("pyhton -m pytest -q", 127, "bash: pyhton: command not found", "command not found"),
        ("python3 -m pytest -q tests/test_cal.py", 4, "ERROR: file or directory not found: tests/test_cal.py", "pytest usage error"),
        ("python3 -m pytest -q -k addition", 5, "3 deselected in 0.01s", "no tests collected"),
        ("python3 -m pytest -q", 1, "/usr/bin/python3: No module named pytest", '"No module named"'),
        ("python reproduce.py --verbos", 2, "reproduce.py: error: unrecognized arguments: --verbos", '"unrecognized arguments"'),
        (
            'python -c "print(calc.add(1, 2)"',
            1,
            "  File \"<string>\", line 1\n    print(calc.add(1, 2)\nSyntaxError: '(' was never closed",
            "SyntaxError in the agent's own snippet",
        ),
        (
            'python -c "import calcc"',
            1,
            "Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nModuleNotFoundError: No module named 'calcc'",
            "ModuleNotFoundError in the agent's own snippet",
        ),
    ]
    for script, code, output, why in cases:
        (signal,) = prefilter(trajectory(shell(script, exit_code=code, output=output, reasoning="Reproduce the bug first.")))
        assert signal.is_defect and signal.category == "corrected_mistake" and signal.detail.endswith(why), script
    # The code's own errors, even with such words in them, are the bug showing.
    raised = "Traceback (most recent call last):\n  File \"calc.py\", line 3, in load\nFileNotFoundError: [Errno 2] No such file or directory: 'rates.csv'"
    assert found(trajectory(shell("python -c 'import calc; calc.load()'", exit_code=1, output=raised))) == [(2, "expected_failure")]
    report = "FAILED tests/test_calc.py::test_load - FileNotFoundError: No such file or directory\n1 failed in 0.1s"
    assert found(trajectory(shell(TEST, exit_code=1, output=report))) == [(2, "expected_failure")]


def test_a_command_retyped_at_once_was_a_mistake() -> None:
    typo = (
        "Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nAttributeError: module 'calc' has no attribute 'ad'"
    )
    t = trajectory(
        shell('python -c "import calc; print(calc.ad(1, 2))"', exit_code=1, output=typo),
        shell('python -c "import calc; print(calc.add(1, 2))"', output="-1"),
    )
    (signal,) = prefilter(t)
    assert signal.kind == "traceback" and "retyped at message 4" in signal.detail
    # Not retyped: the same command with more arguments, a narrower test run, another program, a failing retry.
    for later in (
        shell('python -c "import calc; print(calc.ad(1, 2))" -v'),
        shell("cat calc.py"),
        shell('python -c "import calc; print(calc.ad(1, 3))"', exit_code=1, output=typo),
    ):
        assert (
            prefilter(trajectory(shell('python -c "import calc; print(calc.ad(1, 2))"', exit_code=1, output=typo), later))[0].kind
            == "expected_failure"
        )
    narrower = trajectory(
        shell(TEST, exit_code=1, output=FAILING), shell(TEST + "::test_sub", output="1 passed"), shell(TEST + " -k mul", output="1 passed")
    )
    assert found(narrower) == [(2, "expected_failure")]


def test_answers_that_are_not_failures() -> None:
    t = trajectory(
        shell("which ruff", exit_code=1),  # not installed: an answer
        shell("python3 -m pytest --collect-only -q -k power", exit_code=5, output="no tests ran"),  # no such test: an answer
        shell("cat build.log", output="Traceback (most recent call last):\nValueError: old\n"),  # a traceback it shows, not raises
        shell(
            "python reproduce.py 2>&1 | tail -2", output="Traceback (most recent call last):\nAssertionError\n"
        ),  # 8: a pipe hid the failure
        patch(PATCH),
        shell("python reproduce.py 2>&1 | tail -2", output="Traceback (most recent call last):\nAssertionError\n"),  # 12: after the fix
    )
    assert found(t) == [(8, "expected_failure"), (12, "traceback")]


def test_stash_and_pop_is_not_a_reverted_edit() -> None:
    popped_later = trajectory(
        patch(PATCH),
        shell("git stash"),
        shell(TEST, exit_code=1, output=FAILING, reasoning="Should fail on the original code."),
        shell("git stash pop"),
    )
    assert found(popped_later) == [(6, "expected_failure")]
    same_command = trajectory(patch(PATCH), shell("git stash && python3 -m pytest -q; git stash pop"))
    assert found(same_command) == []
    never_popped = trajectory(patch(PATCH), shell("git stash"), patch(PATCH))
    assert found(never_popped) == [(2, "reverted_edit")]


def test_bad_input_does_not_crash_the_reviewer() -> None:
    step, result = shell("x", exit_code=1)
    step["tool_calls"][0]["function"]["arguments"] = {"command": ["bash", "-lc", "python -c 'unbalanced"], "workdir": 3}
    result["content"] = 'Traceback (most recent call last):\n  File "<string\nNameError'
    empty = {
        "role": "assistant",
        "generated": True,
        "tool_calls": [{"id": "e", "type": "function", "function": {"name": "shell", "arguments": {"command": []}}}],
    }
    t = trajectory(
        [step, result],
        [empty, {"role": "tool", "tool_call_id": "e", "content": ""}],
        shell("timeout", exit_code=124),
        shell("FOO=1", exit_code=1),
    )
    review = heuristic_review(t)
    assert_valid(t, review)


# ---- precision on a labelled set ------------------------------------------------------------

LABELLED = Path(__file__).resolve().parent / "data" / "heuristic"
MISTAKES = ("failure", "redundant", "abandoned")
# Measured on tests/data/heuristic (28 cases, 132 steps, 28 of them mistakes) with this rule
# set (heuristic-2): failed_command 10/11 (the miss is in limits.json), every other kind all
# right, expected_failure 19/20, recall 25/28. With heuristic-1, before expected failures
# were told apart: failed_command 13/30, traceback 2/6, reverted_edit 3/4, recall 26/28.
MIN_PRECISION = {
    "failed_command": 0.9,
    "tool_error": 1.0,
    "traceback": 1.0,
    "reverted_edit": 1.0,
    "repeated_command": 1.0,
    "repeated_test_run": 1.0,
    "stuck_loop": 1.0,
    "abab": 1.0,
}
MIN_EXPECTED_FAILURE_PRECISION = 0.95  # hints at steps whose failure is no mistake
MIN_RECALL = 0.89  # mistake steps with at least one defect; a wrong edit nothing undoes goes unseen


@dataclass
class LabelledCase:
    name: str
    trajectory: Trajectory
    labels: dict[int, str]  # message index of each step -> its label


def load_labelled() -> list[LabelledCase]:
    cases = []
    for path in sorted(LABELLED.glob("*.json")):
        data = json.loads(path.read_text())
        patches = {name: "\n".join(lines) + "\n" for name, lines in data["patches"].items()}
        for case in data["cases"]:
            build = text_case if case.get("protocol") == "text" else tool_case
            t, labels = build(case["steps"], patches)
            cases.append(LabelledCase(f"{path.stem}/{case['name']}", t, labels))
    return cases


def tool_case(steps: list[dict[str, Any]], patches: dict[str, str]) -> tuple[Trajectory, dict[int, str]]:
    built, labels, index = [], {}, 2  # after the system and user messages
    for step in steps:
        if "patch" in step:
            pair = patch(patches[step["patch"]], ok=step.get("applies", True), content=step.get("say"))
        else:
            pair = shell(step["run"], exit_code=step["exit"], output=step["out"], reasoning=step.get("think"))
            if step.get("say"):
                pair[0]["content"] = step["say"]
        built.append(pair)
        labels[index] = step["label"]
        index += 2
    return trajectory(*built), labels


def text_case(steps: list[dict[str, Any]], patches: dict[str, str]) -> tuple[Trajectory, dict[int, str]]:
    messages: list[dict] = [
        {"role": "system", "content": "Answer with one bash block."},
        {"role": "user", "content": "Please solve this issue."},
    ]
    labels = {}
    for step in steps:
        labels[len(messages)] = step["label"]
        messages.append(
            {"role": "assistant", "generated": True, "content": f"THOUGHT: {step.get('think') or 'Next.'}\n\n```bash\n{step['run']}\n```"}
        )
        messages.append({"role": "user", "content": f"<returncode>{step['exit']}</returncode>\n<output>\n{step['out']}</output>"})
    messages.append(
        {"role": "assistant", "generated": True, "content": "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"}
    )
    messages.append({"role": "user", "content": ""})
    return Trajectory.model_validate({"messages": messages, "outcome": {"resolved": True}}), labels


@dataclass
class Tally:
    right: int = 0
    wrong: int = 0

    @property
    def precision(self) -> float:
        return self.right / (self.right + self.wrong)


def score(cases: list[LabelledCase]) -> tuple[dict[str, Tally], float]:
    """Per kind, the review's error entries at steps labelled a mistake (right) or ok
    (wrong); for expected_failure hints, right where the step's failure is no mistake.
    Also the share of mistake steps that got at least one defect (recall)."""
    tallies: dict[str, Tally] = {}
    flagged_mistakes = mistakes = 0
    for case in cases:
        review = heuristic_review(case.trajectory)
        assert review.decision == "accept", (case.name, review.reason)
        for error in review.errors:
            tally = tallies.setdefault(error["kind"], Tally())
            if case.labels[error["message_index"]] in MISTAKES:
                tally.right += 1
            else:
                tally.wrong += 1
        for signal in prefilter(case.trajectory):
            if not signal.is_defect:
                tally = tallies.setdefault(signal.kind, Tally())
                if case.labels[signal.message_index] == "failure":
                    tally.wrong += 1
                else:
                    tally.right += 1
        flagged = {d.message_index for d in review.defects}
        mistakes += sum(label in MISTAKES for label in case.labels.values())
        flagged_mistakes += sum(label in MISTAKES and i in flagged for i, label in case.labels.items())
    return tallies, flagged_mistakes / mistakes


def test_labelled_set_is_well_formed() -> None:
    cases = load_labelled()
    assert len(cases) >= 20 and len({c.name for c in cases}) == len(cases)
    for case in cases:
        assert set(case.labels.values()) <= {"ok", *MISTAKES}, case.name
        assert all(case.trajectory.messages[i].role == "assistant" for i in case.labels), case.name


def test_precision_per_signal_kind_on_the_labelled_set() -> None:
    tallies, recall = score(load_labelled())
    # Every kind is exercised, so no figure holds vacuously.
    assert set(tallies) == set(MIN_PRECISION) | {"expected_failure"}
    for kind, minimum in MIN_PRECISION.items():
        assert tallies[kind].precision >= minimum, (kind, tallies[kind])
    assert tallies["expected_failure"].precision >= MIN_EXPECTED_FAILURE_PRECISION, tallies["expected_failure"]
    assert recall >= MIN_RECALL


def test_demo_steps_that_are_reproductions() -> None:
    """The demo's historical policy: the first failing test run is a reproduction; the
    second is still excluded as a repeat; the missing setup.py stays a failed command."""
    (demo,) = [c for c in load_labelled() if c.name == "demo/demo_historical"]
    review = heuristic_review(demo.trajectory)
    assert [(e["step"], e["kind"]) for e in review.errors] == [
        (1, "failed_command"),
        (3, "repeated_command"),
        (5, "repeated_test_run"),
        (6, "reverted_edit"),
    ]
    assert [(s.message_index, s.kind) for s in prefilter(demo.trajectory) if not s.is_defect] == [
        (8, "expected_failure"),
        (10, "expected_failure"),
    ]


# ---- real trajectories through the mask compiler -------------------------------------------


TASKS = load_tasks(MINI_SUITE)[0]


def invert(apply_patch_text: str) -> str:
    lines = [
        ("-" + line[1:]) if line.startswith("+") else ("+" + line[1:]) if line.startswith("-") else line
        for line in apply_patch_text.split("\n")
    ]
    return "\n".join(lines)


def solved(task: Task) -> Trajectory:
    """A verifier-positive episode on a mini task, built from its gold patch the way the
    harness records one: explore, reproduce (failing), try the tempting wrong fix when the
    task has one and undo it, apply the fix, test (passing), test again, answer."""
    tests = " ".join(task.test_files)
    run = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", *task.test_files]
    steps = [
        shell("ls -R . | head -50", output="README.md\ntests\n", reasoning="Look at the code first.", workdir=task.workdir),
        shell(f"python3 -m pytest -q {tests}", exit_code=1, output="F.\n1 failed, 1 passed\n", reasoning="Reproduce the failure."),
    ]
    wrong = Path(task.task_dir or "") / "wrong.patch"
    if wrong.is_file():
        attempt = to_apply_patch(wrong.read_text())
        steps += [
            patch(attempt, content="A quick fix."),
            shell(run, exit_code=1, output="1 failed\n"),
            patch(invert(attempt), content="That broke another test; undo it."),
        ]
    steps += [patch(to_apply_patch(task.patch), content="Fixing it."), shell(run, output="all passed\n"), shell(run, output="all passed\n")]
    t = trajectory(*steps, final="The fix is in place and the tests pass.")
    return t.model_copy(update={"task_id": task.instance_id})


@pytest.mark.parametrize("task", TASKS, ids=[t.instance_id for t in TASKS])
def test_mini_suite_reviews_compile_to_masks(task: Task, tok) -> None:  # noqa: ANN001
    t = solved(task)
    review = heuristic_review(t)
    assert_valid(t, review)
    assert review.decision == "accept", review.reason
    kinds = {e["kind"] for e in review.errors}
    assert "repeated_test_run" in kinds and "expected_failure" not in kinds  # the reproduction is no error
    if (Path(task.task_dir or "") / "wrong.patch").is_file():
        assert {"reverted_edit", "failed_command"} <= kinds  # the run after the wrong fix failed
    (sample,) = compile_trajectory(t, review, tok, CompileOptions())
    assert sample.excluded > 0 and sample.supervised > 0 and sample.supervised + sample.excluded == sample.eligible
    assert set(sample.excluded_by_category) <= set(CATEGORIES)
    # The same episode without the review's defects supervises more.
    (plain,) = compile_trajectory(t, review, tok, CompileOptions(mode="ross-nomask"))
    assert plain.supervised == sample.eligible


def test_text_protocol_reviews_compile(tok, samples: Path) -> None:  # noqa: ANN001
    t = text_protocol(("cat calc.py", 0, "def add"), ("python run.py", 1, "boom\n"), ("cat calc.py", 0, "def add"))
    review = heuristic_review(t)
    assert_valid(t, review)
    assert [(d.message_index, d.field, d.quote) for d in review.defects] == [
        (6, "content", "cat calc.py")
    ]  # run.py reproduces, before any edit
    (sample,) = compile_trajectory(t, review, tok, CompileOptions())
    assert sample.excluded > 0
    (result,) = list(mini_swe_agent.read(samples / "mini_swe_agent_v1.13.4.traj.json"))
    real = Trajectory.model_validate({**result.trajectory.model_dump(), "outcome": {"resolved": True}})
    review = heuristic_review(real)
    assert_valid(real, review)
    assert review.decision == "accept" and review.defects == []
    (sample,) = compile_trajectory(real, review, tok, CompileOptions())
    assert sample.excluded == 0 and sample.supervised > 0
