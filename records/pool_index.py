"""The indexes of a pool and of its reviews (``records.record_index.RecordIndex``), with
the few fields of each record that filters, headers and statistics read without loading it.
"""

from __future__ import annotations

import json
import mmap
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from records.byte_offsets import Ref
from records.pools import RecordError, json_record_error
from records.record_index import Entry, RecordIndex
from records.review import Review, primary_category
from records.trajectory import Trajectory, is_verified_positive


@dataclass(slots=True)
class TrajectorySummary:
    """What filters, headers and statistics read of a trajectory without loading it."""

    id: str | None = None
    task_id: str | None = None
    attempt: int | None = None
    policy: str | None = None
    checkpoint: str | None = None
    step: int | None = None
    exit_status: str | None = None
    resolved: bool | None = None
    reward: float | None = None
    positive: bool = False  # is_verified_positive: what review and masks select on
    f2p: list[int] | None = None  # [passed, total] of FAIL_TO_PASS
    p2p: list[int] | None = None
    messages: int = 0
    turns: int = 0  # assistant messages
    tool_calls: int = 0
    eligible_chars: int = 0  # characters of generated assistant fields (what A is made of)
    chars: int = 0
    patch_lines: int = 0
    error: str | None = None  # a located RecordError when the record is unreadable
    suspicious: bool = False  # a success the verifier found suspicious (not positive by default)


@dataclass(slots=True)
class ReviewSummary:
    trajectory_id: str = ""
    decision: str = ""
    reason: str | None = None
    primary: str = "none"  # records.review.primary_category
    defects: int = 0
    defect_chars: int = 0  # union of defect spans per field
    chars_by_category: dict[str, int] = field(default_factory=dict)
    errors_by_category: dict[str, int] = field(default_factory=dict)


def _tests(verdict: dict[str, Any] | None, key: str) -> list[int] | None:
    tests = (verdict or {}).get("tests") or {}
    group = tests.get(key) if isinstance(tests, dict) else None
    if not isinstance(group, dict):
        return None
    passed, failed = group.get("success") or [], group.get("failure") or []
    return [len(passed), len(passed) + len(failed)]


def summarize_trajectory(t: Trajectory) -> TrajectorySummary:
    eligible = chars = calls = turns = 0
    for message in t.messages:
        size = len(message.content or "") + len(message.reasoning_content or "")
        for call in message.tool_calls or []:
            calls += 1
            size += len(json.dumps(call.function.arguments, ensure_ascii=False))
        chars += size
        if message.role == "assistant":
            turns += 1
            if message.generated:
                eligible += size
    outcome = t.outcome
    return TrajectorySummary(
        id=t.id,
        task_id=t.task_id,
        attempt=t.attempt,
        policy=t.policy.name,
        checkpoint=t.policy.checkpoint,
        step=t.policy.step,
        exit_status=str(t.exit_status),
        resolved=outcome.resolved if outcome else None,
        reward=outcome.reward if outcome else None,
        positive=is_verified_positive(t),
        f2p=_tests(outcome.verdict if outcome else None, "FAIL_TO_PASS"),
        p2p=_tests(outcome.verdict if outcome else None, "PASS_TO_PASS"),
        messages=len(t.messages),
        turns=turns,
        tool_calls=calls,
        eligible_chars=eligible,
        chars=chars,
        patch_lines=len((t.final_patch or "").splitlines()),
        suspicious=bool(outcome and outcome.suspicious) and is_verified_positive(t, allow_suspicious=True),
    )


def _union_length(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, -1
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def summarize_review(review: Review) -> ReviewSummary:
    by_field: dict[tuple[int, str], list[tuple[int, int]]] = {}
    by_category: dict[str, list[tuple[int, int, int, str]]] = {}
    for d in review.defects:
        by_field.setdefault((d.message_index, d.field), []).append((d.start, d.end))
        by_category.setdefault(d.category, []).append((d.message_index, d.start, d.end, d.field))
    chars_by_category = {}
    for category, spans in by_category.items():
        per_field: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for index, start, end, name in spans:
            per_field.setdefault((index, name), []).append((start, end))
        chars_by_category[category] = sum(_union_length(v) for v in per_field.values())
    return ReviewSummary(
        trajectory_id=review.trajectory_id,
        decision=review.decision,
        reason=review.reason,
        primary=primary_category(review),
        defects=len(review.defects),
        defect_chars=sum(_union_length(v) for v in by_field.values()),
        chars_by_category=chars_by_category,
        errors_by_category=dict(Counter(str(e.get("category", "other")) for e in review.errors)),
    )


class PoolIndex(RecordIndex[TrajectorySummary]):
    """A pool of trajectories. Unreadable records stay in place (with their error), so
    positions match the file and the viewer can show what is wrong where it is."""

    kind = "pool"
    summary_type = TrajectorySummary

    def summarize(self, ref: Ref, data: bytes) -> TrajectorySummary:
        try:
            return summarize_trajectory(Trajectory.model_validate_json(data))
        except ValidationError as exc:
            error = json_record_error(self.path, ref.line, data, exc)
        except UnicodeDecodeError as exc:
            error = RecordError(str(self.path), ref.line, None, f"not UTF-8 text ({exc.reason})")
        self.errors.append(error)
        # Saved without the location, which is added back from the entry (the pool may move).
        return TrajectorySummary(error=f"{error.field}: {error.message}" if error.field else error.message)

    def _restore_error(self, entry: Entry[TrajectorySummary]) -> None:
        if entry.summary.error:
            self.errors.append(RecordError(str(self.path), entry.ref.line, None, entry.summary.error))

    def load(self, position: int) -> Trajectory:
        """The whole trajectory at ``position``; a located RecordError if it is bad."""
        entry = self.entries[position]
        data = self.read(position)
        try:
            return Trajectory.model_validate_json(data)
        except ValidationError as exc:
            raise json_record_error(self.path, entry.ref.line, data, exc) from None


class ReviewIndex(RecordIndex[ReviewSummary]):
    """Reviews by trajectory id; a later review of the same trajectory wins, as in
    ``relearn masks``."""

    kind = "reviews"
    summary_type = ReviewSummary

    def __init__(self, path: str | Path, *, cache: bool = True) -> None:
        super().__init__(path, cache=cache)
        self.by_id: dict[str, int] = {}

    def summarize(self, ref: Ref, data: bytes) -> ReviewSummary | None:
        try:
            return summarize_review(Review.model_validate_json(data))
        except ValidationError as exc:
            self.errors.append(json_record_error(self.path, ref.line, data, exc))
        except UnicodeDecodeError as exc:
            self.errors.append(RecordError(str(self.path), ref.line, None, f"not UTF-8 text ({exc.reason})"))
        return None

    def added(self, position: int, entry: Entry[ReviewSummary]) -> None:
        self.by_id[entry.summary.trajectory_id] = position

    def _reset(self) -> None:
        self.by_id.clear()

    def summary(self, trajectory_id: str) -> ReviewSummary | None:
        position = self.by_id.get(trajectory_id)
        return None if position is None else self.entries[position].summary

    def review(self, trajectory_id: str) -> Review | None:
        """The full review of one trajectory. Before the index is finished, a plain file
        is searched backwards for the id (the last review wins), so the first trajectory
        shows its defects without waiting for the whole file."""
        if not self.ready.is_set() and self.mode == "plain":
            return self._search(trajectory_id)
        self.join()
        position = self.by_id.get(trajectory_id)
        if position is None:
            return None
        return Review.model_validate_json(self.read(position))

    def _search(self, trajectory_id: str) -> Review | None:
        needle = json.dumps(trajectory_id, ensure_ascii=False).encode()
        with open(self.path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                return None
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                end = len(data)
                while True:
                    hit = data.rfind(needle, 0, end)
                    if hit < 0:
                        return None
                    start = data.rfind(b"\n", 0, hit) + 1
                    stop = data.find(b"\n", hit)
                    line = data[start : stop if stop >= 0 else len(data)]
                    try:
                        review = Review.model_validate_json(line)
                    except ValidationError:
                        review = None
                    if review is not None and review.trajectory_id == trajectory_id:
                        return review
                    end = start  # the id was quoted elsewhere (a description): look further back
