"""The Review record: what the judges concluded about one trajectory.

``defects`` are the grounded spans the mask compiler excludes (E): a character range
``[start, end)`` of one field of one message, with the quote that was found there.
``field`` is ``content``, ``reasoning_content``, ``tool_calls[i].arguments`` (offsets
into ``json.dumps(arguments, ensure_ascii=False)``, the text a judge reads) or
``tool_calls[i].arguments.KEY`` (offsets into that argument's value: the string itself, or
the JSON text of any other value, such as an argv list ``["bash", "-lc", "ls"]``, which is
how chat templates render it).
Omissions have no source tokens and are never masked.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from records.pools import RecordError, iter_lines, parse_json_line, validation_error
from records.trajectory import Message, Trajectory

SCHEMA_VERSION = "1.0"
CATEGORIES = (
    "corrected_mistake",
    "wrong_hypothesis",
    "redundant_exploration",
    "abandoned_attempt",
    "hallucination",
    "unsafe_action",
    "reward_hacking",
    "other",
)
TRAJECTORY_ID = re.compile(r'"trajectory_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
FIELD = re.compile(r"^(content|reasoning_content|tool_calls\[(\d+)\]\.arguments(?:\.(.+))?)$")


class Defect(BaseModel):
    model_config = ConfigDict(extra="allow")

    message_index: int
    field: str
    start: int
    end: int
    quote: str
    category: str = "other"
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> Defect:
        if not FIELD.match(self.field):
            raise ValueError(f"field {self.field!r} is not content, reasoning_content, tool_calls[i].arguments[.KEY]")
        if not 0 <= self.start <= self.end:
            raise ValueError(f"span [{self.start}, {self.end}) is not a range")
        return self


class Review(BaseModel):
    model_config = ConfigDict(extra="allow")

    schema_version: str = SCHEMA_VERSION
    trajectory_id: str
    decision: Literal["accept", "reject"]
    reason: str | None = None
    errors: list[dict[str, Any]] = []
    omissions: list[dict[str, Any]] = []
    defects: list[Defect] = []


def field_text(message: Message, field: str) -> str | None:
    """The text a defect's offsets index into, or None if the message has no such field."""
    match = FIELD.match(field)
    if match is None:
        return None
    if field == "content":
        return message.content
    if field == "reasoning_content":
        return message.reasoning_content
    index, key = int(match.group(2)), match.group(3)
    calls = message.tool_calls or []
    if index >= len(calls):
        return None
    arguments = calls[index].function.arguments
    if key is None:
        return json.dumps(arguments, ensure_ascii=False)
    if key not in arguments:
        return None
    value = arguments[key]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def field_is_json(message: Message, field: str) -> bool:
    """Whether ``field_text`` of this field is JSON text (the arguments object, or a
    non-string argument value) rather than a raw string."""
    match = FIELD.match(field)
    if match is None or match.group(2) is None:
        return False
    if match.group(3) is None:
        return True
    calls = message.tool_calls or []
    index = int(match.group(2))
    return index < len(calls) and not isinstance(calls[index].function.arguments.get(match.group(3)), str)


def numbered_steps(trajectory: Trajectory) -> dict[int, int]:
    """Step number -> message index. The steps a review's errors name are the generated
    assistant messages, numbered from 1 in order."""
    generated = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.generated]
    return {number: index for number, index in enumerate(generated, start=1)}


def primary_category(review: Review) -> str:
    """The category most of a review's confirmed errors have ("none" without errors)."""
    categories = Counter(str(e.get("category", "other")) for e in review.errors)
    return categories.most_common(1)[0][0] if categories else "none"


def iter_review_records(path: Path) -> Iterator[tuple[str | None, Review | RecordError]]:
    """The review reader: each line's Review, or its located error, with the trajectory id the
    line names (read from a line that does not validate, even from one that is not JSON),
    or None where it names none."""
    try:
        for number, text in iter_lines(path):
            try:
                data = parse_json_line(path, number, text)
            except RecordError as exc:
                found = TRAJECTORY_ID.search(text)
                yield (json.loads(f'"{found.group(1)}"') if found else None), exc
                continue
            try:
                review = Review.model_validate(data)
            except ValidationError as exc:
                named = data.get("trajectory_id") if isinstance(data, dict) else None
                yield (named if isinstance(named, str) else None), validation_error(path, number, exc)
                continue
            yield review.trajectory_id, review
    except RecordError as exc:
        yield None, exc


T = TypeVar("T")


def latest_reviews(path: Path, summarize: Callable[[Review], T]) -> tuple[dict[str, T], int]:
    """``summarize`` of the latest review of each trajectory (a later line replaces an earlier
    one), read in one pass that holds one summary per trajectory, never the reviews; and the
    number of lines that could not be read."""
    latest: dict[str, T] = {}
    unreadable = 0
    for trajectory_id, item in iter_review_records(path):
        if not isinstance(item, Review):
            unreadable += 1
        elif trajectory_id is not None:
            latest[trajectory_id] = summarize(item)
    return latest, unreadable


def iter_reviews(path: Path) -> Iterator[Review | RecordError]:
    for _trajectory_id, item in iter_review_records(path):
        yield item
