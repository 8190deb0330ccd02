"""TER under both defect scopes from one tokenisation.

A dataset is compiled under one scope (``action``: a defect in a tool call excludes the whole
call; ``minimal``: the quoted characters only, the paper's "smallest source substring"), but
its TER is compared under both: the other scope's exclusion is worked out over the same
token offsets, from the defects' character spans under that scope, without tokenising again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from records.review import FIELD, Defect
from records.trajectory import Trajectory

DefectScope = Literal["action", "minimal"]  # the values of --defect-scope (relearn.masks.compile.DEFECT_SCOPES)
SCOPES: tuple[DefectScope, ...] = get_args(DefectScope)
ACTION_SCOPE: DefectScope = "action"  # the default: the error is the decision to call

# (rendered, trajectory, defect, scope) -> the defect's rendered characters [start, end), or None.
SpanOf = Callable[[Any, Trajectory, Defect, str], tuple[int, int] | None]


def excluded_tokens(spans: list[tuple[int, int]], length: int, starts: np.ndarray, ends: np.ndarray, eligible: np.ndarray) -> int:
    """Eligible tokens touching any character of ``spans`` (a token half inside is excluded, as
    ``relearn.masks.compile.compile_one`` decides)."""
    chars = np.zeros(length, dtype=bool)
    for lo, hi in spans:
        chars[lo:hi] = True
    inside = np.concatenate([[0], np.cumsum(chars)])
    return int(np.sum(eligible & (inside[ends] - inside[starts] > 0)))


def excluded_by_scope(
    rendered: Any,
    trajectory: Trajectory,
    defects: list[Defect],
    offsets: tuple[np.ndarray, np.ndarray],
    eligible: np.ndarray,
    trained: tuple[str, int],
    span_of: SpanOf,
) -> dict[str, int]:
    """Excluded eligible tokens under each scope: ``trained`` (scope, count) as compiled, the
    other scope's from ``span_of`` over the same ``offsets`` (token starts and ends)."""
    scope, count = trained
    counts = {scope: count}
    starts, ends = offsets
    for other in SCOPES:
        if other == scope:
            continue
        spans = [span for defect in defects if (span := span_of(rendered, trajectory, defect, other)) is not None]
        counts[other] = excluded_tokens(spans, len(rendered.text), starts, ends, eligible) if spans else 0
    return {name: counts[name] for name in SCOPES}


# The action of a text-protocol agent (mini-swe-agent, SWE-agent): the fenced shell block it runs.
ACTION_BLOCK = re.compile(r"```(?:bash|sh)[^\n]*\n.*?```", re.DOTALL)


def text_protocol(trajectory: Trajectory) -> bool:
    """Whether the agent acted through text (a fenced block in its content) rather than tool calls."""
    return not any(m.tool_calls for m in trajectory.messages)


def action_block(content: str, lo: int, hi: int) -> tuple[int, int] | None:
    """The fenced shell block of ``content`` holding the characters [lo, hi), fences included."""
    for block in ACTION_BLOCK.finditer(content):
        if block.start() <= lo and hi <= block.end():
            return block.start(), block.end()
    return None


@dataclass(frozen=True)
class Extent:
    """What a defect excludes under a scope, in its message's own fields (no template):
    ``call`` = the whole tool call of that index, else the characters [start, end) of
    ``field`` (the quote, or under ``action`` a text-protocol agent's fenced action block)."""

    field: str
    start: int
    end: int
    call: int | None = None


def defect_extent(trajectory: Trajectory, defect: Defect, scope: str) -> Extent:
    """The part of its message a defect excludes under ``scope``, as
    ``relearn.masks.compile._defect_render_span`` maps it onto the render (the viewer draws this)."""
    if scope not in SCOPES:
        raise ValueError(f"defect scope {scope!r} is not one of {', '.join(SCOPES)}")
    match = FIELD.match(defect.field)
    if scope == ACTION_SCOPE and defect.end > defect.start:
        if match is not None and match.group(2) is not None:
            return Extent(defect.field, defect.start, defect.end, call=int(match.group(2)))
        if defect.field == "content" and text_protocol(trajectory):
            content = trajectory.messages[defect.message_index].content or ""
            block = action_block(content, defect.start, defect.end)
            if block is not None:
                # The action ends the turn: compile extends the exclusion through the end of turn.
                end = len(content) if not content[block[1] :].strip() else block[1]
                return Extent("content", block[0], end)
    return Extent(defect.field, defect.start, defect.end)
