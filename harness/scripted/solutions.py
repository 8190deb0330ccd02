"""Scripted policies on the mini tasks, for `relearn demo`, the benches and the tests: what the
scripted model servers (``harness.scripted.servers``) answer."""

from __future__ import annotations

from collections.abc import Callable

from envs.tasks import Task, patch_files
from harness.scripted.servers import ScriptedTurn


def to_apply_patch(unified: str) -> str:
    """A git unified diff of updated files as Codex's apply_patch format (same hunk lines)."""
    out = ["*** Begin Patch"]
    for line in unified.splitlines():
        if line.startswith("diff --git "):
            out.append(f"*** Update File: {line.split(' b/', 1)[1]}")
        elif line.startswith(("index ", "--- ", "+++ ")):
            continue
        elif line.startswith("@@"):
            out.append("@@")
        else:
            out.append(line)
    out.append("*** End Patch")
    return "\n".join(out) + "\n"


def solving_script(task: Task) -> list[ScriptedTurn]:
    """Read, patch, test, answer: what a competent policy does on a mini task."""
    test_file = task.test_files[0]
    return [
        ScriptedTurn(
            reasoning="Look at the code first.",
            tool_calls=[("shell", {"command": ["bash", "-lc", "ls -R . | head -50"], "workdir": task.workdir})],
        ),
        ScriptedTurn(content="Fixing it.", tool_calls=[("apply_patch", {"input": to_apply_patch(task.patch)})]),
        ScriptedTurn(
            tool_calls=[("shell", {"command": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file], "timeout_ms": 60000})]
        ),
        ScriptedTurn(content="The fix is in place and the tests pass."),
    ]


def task_of(request: dict, tasks: dict[str, Task]) -> Task:
    """Which task a chat request is about: its first user message quotes the problem statement."""
    user = next(m for m in request["messages"] if m["role"] == "user")
    text = user["content"] if isinstance(user["content"], str) else " ".join(p.get("text", "") for p in user["content"])
    return next(t for t in tasks.values() if t.problem_statement.strip() in text)


def solver(tasks: dict[str, Task], solves: set[str]) -> Callable[[dict], ScriptedTurn]:
    """Applies the gold fix on the tasks in ``solves``; gives up at once on the others."""

    def answer(request: dict) -> ScriptedTurn:
        task = task_of(request, tasks)
        answered = sum(1 for m in request["messages"] if m["role"] == "tool")
        if task.instance_id in solves and answered == 0:
            return ScriptedTurn(content="Applying the fix.", tool_calls=[("apply_patch", {"input": to_apply_patch(task.patch)})])
        return ScriptedTurn(content="Done." if task.instance_id in solves else "I could not find the bug.")

    return answer


def flailer(request: dict) -> ScriptedTurn:
    """Looks around forever: only a budget stops it."""
    return ScriptedTurn(
        content="Let me look around more.", tool_calls=[("shell", {"command": ["bash", "-lc", "ls"]})], input_tokens=1000, output_tokens=100
    )


def historical(tasks: dict[str, Task]) -> Callable[[dict], ScriptedTurn]:
    """A stand-in for an earlier checkpoint: it solves the task, but on the way it reads a
    file that does not exist, repeats a listing, runs the failing tests twice, makes a guessed
    edit and reverts it, and only then applies the fix: the mistakes and redundancy a reviewer should exclude."""

    def answer(request: dict) -> ScriptedTurn:
        task = task_of(request, tasks)
        step = sum(1 for m in request["messages"] if m["role"] == "assistant")
        tests = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", *task.test_files]
        guess = patch_files(task.patch)[0]
        script = [
            ScriptedTurn(
                reasoning="The bug is probably in setup.py.",
                content="Let me read setup.py.",
                tool_calls=[("shell", {"command": ["bash", "-lc", "cat setup.py"]})],
            ),
            ScriptedTurn(content="Listing the repository.", tool_calls=[("shell", {"command": ["bash", "-lc", "ls -R"]})]),
            ScriptedTurn(content="Listing it again.", tool_calls=[("shell", {"command": ["bash", "-lc", "ls -R"]})]),
            ScriptedTurn(reasoning="Run the tests to see what fails.", tool_calls=[("shell", {"command": tests})]),
            ScriptedTurn(content="Running them once more.", tool_calls=[("shell", {"command": tests})]),
            ScriptedTurn(
                reasoning="Maybe a quick guess is enough.",
                content="Trying a guess first.",
                tool_calls=[("shell", {"command": ["bash", "-lc", f"echo '# guess' >> {guess}"]})],
            ),
            ScriptedTurn(
                content="That guess was wrong; putting the file back.",
                tool_calls=[("shell", {"command": ["bash", "-lc", f"git checkout -- {guess}"]})],
            ),
            ScriptedTurn(
                reasoning="The failing test points at the real cause.",
                content="Applying the fix.",
                tool_calls=[("apply_patch", {"input": to_apply_patch(task.patch)})],
            ),
            ScriptedTurn(tool_calls=[("shell", {"command": tests})]),
            ScriptedTurn(content="The fix is in place and the tests pass."),
        ]
        return script[min(step, len(script) - 1)]

    return answer
