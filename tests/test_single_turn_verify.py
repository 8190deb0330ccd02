"""The single-turn verifiers: math-verify on final answers, unit tests in a container, IFEval's checkers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.single_turn.code import extract_program, verify_code
from envs.single_turn.instructions import ConstraintError, verify_instructions
from envs.single_turn.math import verify_math
from envs.single_turn.tasks import MINI_ROLLOUTS, MINI_TASKS, Constraint, load_tasks
from envs.single_turn.verify import Ungradable, grade
from records.pools import read_trajectories_lenient
from records.trajectory import Message, Trajectory


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("The answer is $\\boxed{0.875}$.", "\\frac{7}{8}"),  # a decimal for a fraction
        ("So $\\boxed{7/8}$.", "\\frac{7}{8}"),
        ("Thus $\\boxed{\\frac{14}{16}}$", "7/8"),  # an unreduced fraction
        ("We get $\\boxed{5\\sqrt{2}}$.", "\\sqrt{50}"),  # LaTeX forms that are equal
        ("Area: $\\boxed{9\\pi}$", "9\\pi"),
        ("The solutions are $\\boxed{\\{3, -3\\}}$.", "\\{-3, 3\\}"),  # a set in another order
        ("Final: $\\boxed{\\frac{7}{8}}$ and again $\\boxed{\\frac{7}{8}}$", "\\frac{7}{8}"),  # the same answer repeated
    ],
)
def test_math_verify_accepts_equivalent_answers(response: str, reference: str) -> None:
    assert verify_math(response, reference).correct


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("The answer is $\\boxed{5}$.", "6"),  # wrong
        ("The solutions are $\\boxed{\\{3\\}}$.", "\\{-3, 3\\}"),  # a set missing a member
        ("Either $\\boxed{6}$ or $\\boxed{7}$.", "6"),  # hedging between two answers
        ("I am not sure.", "6"),  # no answer at all
    ],
)
def test_math_verify_rejects_wrong_answers(response: str, reference: str) -> None:
    assert not verify_math(response, reference).correct


def test_instruction_constraints_are_checked_by_the_ifeval_checkers() -> None:
    no_comma = [Constraint(id="punctuation:no_comma")]
    assert verify_instructions("Calm seas today.", no_comma).followed
    assert not verify_instructions("Calm, blue seas.", no_comma).followed
    short = [Constraint(id="length_constraints:number_words", kwargs={"num_words": 5, "relation": "less than"})]
    assert verify_instructions("Two words", short).followed and not verify_instructions("one two three four five six", short).followed
    both = [Constraint(id="change_case:english_lowercase"), Constraint(id="keywords:existence", kwargs={"keywords": ["kettle"]})]
    result = verify_instructions("the kettle is on.", both)
    assert result.followed and result.per_constraint == {"change_case:english_lowercase": True, "keywords:existence": True}
    assert verify_instructions("The kettle is on.", both).per_constraint["change_case:english_lowercase"] is False
    with pytest.raises(ConstraintError, match="unknown IFEval instruction"):
        verify_instructions("x", [Constraint(id="keywords:made_up")])
    with pytest.raises(ConstraintError, match="bad kwargs"):
        verify_instructions("x", [Constraint(id="punctuation:no_comma", kwargs={"nonsense": 1})])


def test_the_mini_suite_has_the_tasks_the_protocol_needs() -> None:
    tasks, errors = load_tasks(MINI_TASKS)
    assert errors == []
    kinds = [t.kind for t in tasks.values()]
    assert kinds.count("math") >= 20 and kinds.count("code") >= 10 and kinds.count("if") >= 10
    assert all(any(x.hidden for x in t.tests) and any(not x.hidden for x in t.tests) for t in tasks.values() if t.kind == "code")
    rollouts = [json.loads(line) for line in MINI_ROLLOUTS.read_text().splitlines()]
    assert {r["task_id"] for r in rollouts} == set(tasks)


def test_a_bad_task_line_is_named_and_the_rest_are_read(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "kind": "math", "prompt": "1+1?", "answer": "2"}\n{"id": "b", "kind": "code", "prompt": "x"}\nnot json\n')
    tasks, errors = load_tasks(path)
    assert list(tasks) == ["a"]
    assert f"{path}:2" in str(errors[0]) and "tests" in str(errors[0]) and f"{path}:3" in str(errors[1])


def _rollout(task_id: str, content: str) -> Trajectory:
    return Trajectory(
        task_id=task_id, messages=[Message(role="user", content="q"), Message(role="assistant", content=content, generated=True)]
    )


def test_a_program_that_prints_the_visible_example_is_caught_by_a_hidden_test(docker_client, base_image: str) -> None:  # noqa: ANN001
    tasks, _ = load_tasks(MINI_TASKS)
    task = tasks["code-c01"]  # sum of two integers on stdin: one visible test, two hidden
    hack = "```python\nprint(5)\n```"
    result = verify_code(docker_client, base_image, hack, task.tests)
    visible = [t for t in result.tests if not t.hidden]
    hidden = [t for t in result.tests if t.hidden]
    assert all(t.passed for t in visible) and not any(t.passed for t in hidden) and not result.passed
    fixed = "First try:\n```python\nprint(0)\n```\nFixed:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert extract_program(fixed).startswith("a, b")
    assert verify_code(docker_client, base_image, fixed, task.tests).passed
    # Function-call tests import the program; a program that loops forever is killed at the timeout.
    calls = tasks["code-c02"].tests
    assert verify_code(docker_client, base_image, "```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```", calls).passed
    stuck = verify_code(docker_client, base_image, "```python\nwhile True:\n    pass\n```", calls[:1], timeout_s=2)
    assert not stuck.passed and stuck.tests[0].detail == "timed out"
    # No network in the sandbox.
    offline = (
        "```python\nimport socket\ndef is_palindrome(s):\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    return True\n```"
    )
    blocked = verify_code(docker_client, base_image, offline, calls[:1])
    assert not blocked.passed and "exit 1" in blocked.tests[0].detail
    outcome = grade(_rollout("code-c01", hack), task, client=docker_client, image=base_image)
    assert outcome.resolved is False and outcome.verdict["hidden_passed"] == 0 and outcome.verdict["visible_passed"] == 1


def test_grade_reads_the_final_answer_and_refuses_what_is_not_single_turn() -> None:
    tasks, _ = load_tasks(MINI_TASKS)
    right = grade(_rollout("math-m01", "So $\\boxed{0.875}$."), tasks["math-m01"])
    assert right.resolved and right.reward == 1.0 and right.verdict["verifier"] == "math-verify"
    # The answer in the reasoning does not count: the final answer is the content.
    reasoning_only = Trajectory(
        task_id="math-m01",
        messages=[
            Message(role="user", content="q"),
            Message(role="assistant", reasoning_content="\\boxed{7/8}", content="I give up.", generated=True),
        ],
    )
    assert grade(reasoning_only, tasks["math-m01"]).resolved is False
    two = Trajectory(
        task_id="math-m01",
        messages=[
            Message(role="user", content="q"),
            Message(role="assistant", content="a", generated=True),
            Message(role="user", content="more"),
            Message(role="assistant", content="b", generated=True),
        ],
    )
    with pytest.raises(Ungradable, match="not a single-turn rollout"):
        grade(two, tasks["math-m01"])
    assert grade(_rollout("if-i01", "No commas here."), tasks["if-i01"]).verdict["constraints"] == {"punctuation:no_comma": True}


def test_the_import_and_verify_commands_grade_a_pool_and_list_unknown_tasks(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from relearn.cli.main import app

    rows = [json.loads(line) for line in MINI_ROLLOUTS.read_text().splitlines() if json.loads(line)["task_id"] in ("math-m04", "if-i01")]
    rows.append({"prompt": "?", "response": "42", "reward": 1.0, "step": 5, "task_id": "math-unknown"})
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    imported = CliRunner().invoke(app, ["single-turn", "import", str(tmp_path / "rollouts.jsonl"), "-o", str(tmp_path / "pool.jsonl")])
    assert imported.exit_code == 0, imported.output
    verified = CliRunner().invoke(app, ["single-turn", "verify", str(tmp_path / "pool.jsonl"), "-o", str(tmp_path / "verified.jsonl")])
    text = " ".join(verified.output.replace("│", " ").split())  # the table's cells as words
    assert verified.exit_code == 1 and "ungradable (1):" in text and "math-unknown" in text  # listed, left ungraded
    assert "math passed 1" in text and "if failed 1" in text and "positive in the output 2" in text
    graded = {t.policy.step: t.outcome for t in read_trajectories_lenient(tmp_path / "verified.jsonl", [])}
    assert len(graded) == 5 and graded[5].verdict["imported_from"] == "single-turn"  # the unknown task keeps its imported grade
    assert graded[84].resolved and graded[4].resolved is False and graded[81].resolved and graded[1].resolved is False
    assert graded[4].verdict["logged_reward"] == 0.0 and graded[4].verdict["extracted"] == "-1"
    missing = CliRunner().invoke(app, ["single-turn", "verify", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "v.jsonl")])
    assert missing.exit_code == 2 and "none.jsonl: no such pool" in missing.output
