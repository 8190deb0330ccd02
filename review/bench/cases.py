"""The labelled case: one trajectory with what a perfect reviewer would say about it.

A case file is JSON Lines (``.jsonl``, or ``.jsonl.zst``), one ``BenchCase`` per line:

- ``trajectory``: a relearn trajectory (``records.trajectory``), the reviewer's input;
- ``gold.decision``: ``accept`` (train on it, minus the defects) or ``reject`` (never train on it);
- ``gold.errors``: each confirmed error's ``step`` (generated assistant messages numbered from
  1, as ``records.review.numbered_steps`` counts them and as the judges are shown them), its
  ``category`` (``records.review.CATEGORIES``), and its defect ``spans``: ``(message_index, field,
  start, end, quote)`` exactly as a Review's defects are written (``field`` is ``content``,
  ``reasoning_content``, ``tool_calls[i].arguments`` or ``tool_calls[i].arguments.KEY``;
  ``[start, end)`` are character offsets into ``records.review.field_text`` of that field, and
  ``quote`` is the text there);
- ``gold.omissions``: what the agent should have done and did not (no text, never masked).

Every span is checked against its trajectory when a case is read, so a label that points at
the wrong text is refused with its file, line and field.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from records.pools import RecordError, iter_models, write_atomic
from records.review import CATEGORIES, FIELD, Review, field_text, numbered_steps, primary_category
from records.trajectory import Trajectory

SCHEMA_VERSION = "1.0"


class GoldSpan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message_index: int
    field: str
    start: int
    end: int
    quote: str


class GoldError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    category: Literal[*CATEGORIES]  # type: ignore[valid-type]
    description: str
    spans: list[GoldSpan]


class Gold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["accept", "reject"]
    reason: str = ""
    errors: list[GoldError] = []
    omissions: list[str] = []


class BenchCase(BaseModel):
    model_config = ConfigDict(extra="allow")  # a labeller's own notes travel with the case

    schema_version: str = SCHEMA_VERSION
    id: str
    kind: str  # the planted scenario (``clean``, ``failed_command``, ...): what per-kind figures group by
    long: bool = False
    gold: Gold
    trajectory: Trajectory

    @model_validator(mode="after")
    def _spans_point_at_their_text(self) -> BenchCase:
        if self.schema_version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(f"schema_version {self.schema_version!r} is not {SCHEMA_VERSION.split('.')[0]}.x")
        steps = numbered_steps(self.trajectory)
        for e, error in enumerate(self.gold.errors):
            where = f"gold.errors[{e}]"
            if error.step not in steps:
                raise ValueError(f"{where}.step: {error.step} is not a generated assistant step (the trajectory has {len(steps)})")
            if not error.spans:
                raise ValueError(f"{where}.spans: a confirmed error needs at least one span (an omission goes under gold.omissions)")
            for s, span in enumerate(error.spans):
                here = f"{where}.spans[{s}]"
                if span.message_index != steps[error.step]:
                    raise ValueError(f"{here}.message_index: {span.message_index} is not step {error.step} (message {steps[error.step]})")
                if not FIELD.match(span.field):
                    raise ValueError(f"{here}.field: {span.field!r} is not content, reasoning_content or tool_calls[i].arguments[.KEY]")
                text = field_text(self.trajectory.messages[span.message_index], span.field)
                if text is None:
                    raise ValueError(f"{here}.field: message {span.message_index} has no {span.field}")
                if not 0 <= span.start < span.end <= len(text):
                    raise ValueError(f"{here}: [{span.start}, {span.end}) is not a non-empty range of the field's {len(text)} characters")
                if text[span.start : span.end] != span.quote:
                    raise ValueError(
                        f"{here}.quote: the field holds {text[span.start : span.end]!r} at [{span.start}, {span.end}), not {span.quote!r}"
                    )
        if self.gold.decision == "reject" and not self.gold.errors:
            raise ValueError("gold: a rejected case names the errors that reject it")
        return self


def read_cases(path: Path, errors: list[RecordError]) -> list[BenchCase]:
    """Every valid case of ``path`` (a file, or a folder of ``*.jsonl``/``*.jsonl.zst``); each bad
    line, and each id seen twice, is appended to ``errors`` with its location."""
    files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.zst"))) if path.is_dir() else [path]
    cases: list[BenchCase] = []
    seen: dict[str, str] = {}
    for file in files:
        try:
            for number, case in iter_models(file, BenchCase):
                if isinstance(case, RecordError):
                    errors.append(case)
                    continue
                if case.id in seen:
                    errors.append(RecordError(str(file), number, "id", f"case {case.id!r} is already at {seen[case.id]}"))
                    continue
                seen[case.id] = f"{file}:{number}"
                cases.append(case)
        except RecordError as exc:
            errors.append(exc)
    return cases


def write_cases(path: Path, cases: Iterable[BenchCase]) -> int:
    return write_atomic(path, (case.model_dump(mode="json", exclude_none=True, by_alias=True) for case in cases))


def case_from_review(trajectory: Trajectory, review: Review, kind: str | None = None) -> BenchCase:
    """A labelled case from a Review that says what a perfect reviewer would (one written or
    corrected by hand, or in the viewer): its decision, its errors, each with the defects of
    its own step and category as spans, and its omissions. ``kind`` defaults to the review's
    primary category (``clean`` without errors). Raises ValueError naming what does not fit."""
    steps = numbered_steps(trajectory)
    errors: list[GoldError] = []
    used: set[int] = set()
    for number, error in enumerate(review.errors):
        step, category = error.get("step"), error.get("category", "other")
        if not isinstance(step, int) or step not in steps:
            raise ValueError(f"errors[{number}].step: {step!r} is not a generated assistant step")
        if any(e.step == step and e.category == category for e in errors):
            raise ValueError(f"errors[{number}]: a second {category} error at step {step}; merge them into one")
        mine = [i for i, d in enumerate(review.defects) if d.message_index == steps[step] and d.category == category]
        if not mine:
            raise ValueError(
                f"errors[{number}]: the {category} error at step {step} has no defect of that category in message {steps[step]}; add one, or list it under omissions"
            )
        used.update(mine)
        spans = [
            GoldSpan(message_index=d.message_index, field=d.field, start=d.start, end=d.end, quote=d.quote)
            for d in (review.defects[i] for i in mine)
        ]
        errors.append(GoldError(step=step, category=category, description=str(error.get("description", "")), spans=spans))
    stray = sorted(set(range(len(review.defects))) - used)
    if stray:
        defect = review.defects[stray[0]]
        raise ValueError(
            f"defects[{stray[0]}] ({defect.category} in message {defect.message_index}) belongs to no error of its step and category"
        )
    omissions = [str(o.get("description", o)) for o in review.omissions]
    gold = Gold(decision=review.decision, reason=review.reason or "", errors=errors, omissions=omissions)
    return BenchCase(
        id=trajectory.id, kind=kind or (primary_category(review) if review.errors else "clean"), gold=gold, trajectory=trajectory
    )
