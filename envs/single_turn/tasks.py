"""Single-turn task records: one prompt and what verifies a response to it.

One JSON object per line: ``id``, ``kind`` (``math`` | ``code`` | ``if``), ``prompt``, and per
kind ``answer`` (the reference answer, LaTeX or plain), ``tests`` (unit tests: ``stdio`` with
``input``/``output``, or ``call`` with ``function``/``args``/``expected``; ``hidden`` tests are
not shown in the prompt), or ``constraints`` (IFEval instruction ids with their ``kwargs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from records.pools import RecordError, iter_models

SUITE = Path(__file__).parent / "suite"
MINI_TASKS = SUITE / "tasks.jsonl"
MINI_ROLLOUTS = SUITE / "rollouts.jsonl"
Kind = Literal["math", "code", "if"]


class CodeTest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["stdio", "call"]
    input: str | None = None
    output: str | None = None
    function: str | None = None
    args: list[Any] = []
    expected: Any = None
    hidden: bool = False

    @model_validator(mode="after")
    def _check(self) -> CodeTest:
        if self.type == "stdio" and (self.input is None or self.output is None):
            raise ValueError("a stdio test needs input and output")
        if self.type == "call" and not self.function:
            raise ValueError("a call test needs function")
        return self


class Constraint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kwargs: dict[str, Any] = {}


class SingleTurnTask(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    kind: Kind
    prompt: str
    answer: str | None = None
    tests: list[CodeTest] = []
    constraints: list[Constraint] = []

    @model_validator(mode="after")
    def _check(self) -> SingleTurnTask:
        if self.kind == "math" and not self.answer:
            raise ValueError("a math task needs answer")
        if self.kind == "code" and not self.tests:
            raise ValueError("a code task needs tests")
        if self.kind == "if" and not self.constraints:
            raise ValueError("an instruction-following task needs constraints")
        return self


def load_tasks(path: Path) -> tuple[dict[str, SingleTurnTask], list[RecordError]]:
    """Tasks by id, and the located errors of the lines that are not tasks (the rest are read)."""
    tasks: dict[str, SingleTurnTask] = {}
    errors: list[RecordError] = []
    for number, task in iter_models(path, SingleTurnTask):
        if isinstance(task, RecordError):
            errors.append(task)
            continue
        if task.id in tasks:
            errors.append(RecordError(str(path), number, "id", f"task {task.id!r} is defined twice"))
            continue
        tasks[task.id] = task
    return tasks, errors
