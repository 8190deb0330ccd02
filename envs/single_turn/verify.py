"""Grading single-turn rollouts: each trajectory's one generated response, by its task's kind.

A trajectory names its task by ``task_id``; its response is the last generated assistant
message (reasoning in ``reasoning_content``, the final answer in ``content``). The verdict
replaces any reward the RL run logged (kept as ``verdict.logged_reward``): only a response the
verifier passes is positive and goes on to review. A trajectory without a known task, or with
no generated response, is ungradable and stays without a verdict (never positive).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from envs.single_turn.code import verify_code
from envs.single_turn.instructions import ConstraintError, verify_instructions
from envs.single_turn.math import verify_math
from envs.single_turn.tasks import SingleTurnTask
from records.trajectory import Message, Outcome, Trajectory

VERIFIERS = {"math": "math-verify", "code": "unit-tests", "if": "ifeval"}


class Ungradable(ValueError):
    pass


def response_of(trajectory: Trajectory) -> tuple[int, Message]:
    """The generated response of a single-turn trajectory: (message index, message)."""
    generated = [(i, m) for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.generated]
    if not generated:
        raise Ungradable("no generated assistant message")
    if len(generated) > 1:
        raise Ungradable(f"{len(generated)} generated assistant messages: not a single-turn rollout")
    return generated[0]


def grade(trajectory: Trajectory, task: SingleTurnTask, *, client: Any = None, image: str | None = None) -> Outcome:
    """The verifier's outcome for one response (raises Ungradable)."""
    _index, message = response_of(trajectory)
    answer = message.content or ""
    details: dict[str, Any]
    if task.kind == "math":
        assert task.answer is not None
        result = verify_math(answer, task.answer)
        passed, details = result.correct, {"extracted": result.extracted, "reference": result.reference}
    elif task.kind == "code":
        if client is None or image is None:
            raise Ungradable("code tasks need a container engine and an image")
        code = verify_code(client, image, answer, task.tests)
        passed, details = code.passed, code.summary
    else:
        try:
            followed = verify_instructions(answer, task.constraints)
        except ConstraintError as exc:
            raise Ungradable(str(exc)) from None
        passed, details = followed.followed, {"constraints": followed.per_constraint}
    logged = trajectory.outcome.reward if trajectory.outcome is not None else None
    verdict = {"verifier": VERIFIERS[task.kind], "kind": task.kind, "task_id": task.id, "logged_reward": logged, **details}
    return Outcome(reward=1.0 if passed else 0.0, resolved=passed, verdict=verdict)


@dataclass
class GradeSummary:
    counts: Counter[str] = field(default_factory=Counter)
    ungradable: list[str] = field(default_factory=list)


def grade_all(
    trajectories: Iterable[Trajectory],
    tasks: dict[str, SingleTurnTask],
    summary: GradeSummary,
    *,
    client_image: Callable[[], tuple[Any, str]] | None = None,
) -> Iterator[Trajectory]:
    """Each trajectory with its verdict (ungradable ones unchanged, counted and listed).
    ``client_image`` gives the container engine and image on first need (code tasks only)."""
    engine: tuple[Any, str] | None = None
    for trajectory in trajectories:
        task = tasks.get(trajectory.task_id or "")
        if task is None:
            summary.ungradable.append(f"{trajectory.id}: no task {trajectory.task_id!r}")
            summary.counts["ungradable"] += 1
            yield trajectory
            continue
        if task.kind == "code" and engine is None and client_image is not None:
            engine = client_image()
        try:
            trajectory.outcome = grade(trajectory, task, client=engine[0] if engine else None, image=engine[1] if engine else None)
        except Ungradable as exc:
            summary.ungradable.append(f"{trajectory.id}: {exc}")
            summary.counts["ungradable"] += 1
            yield trajectory
            continue
        summary.counts[f"{task.kind} {'passed' if trajectory.outcome.resolved else 'failed'}"] += 1
        yield trajectory
