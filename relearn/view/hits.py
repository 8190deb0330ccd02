"""Search hits in a step on screen: every occurrence of the query highlighted in the text
shown (case-insensitive; the rule titles aside), the current one in a style of its own,
and the line it lands on, to scroll to."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text

HIT = Style(color="black", bgcolor="yellow")
CURRENT_HIT = Style(color="black", bgcolor="bright_cyan", bold=True, underline=True)


def _spans(text: str, query: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(re.escape(query), text, flags=re.IGNORECASE)]


def _position(code: str, offset: int) -> tuple[int, int]:
    """An offset in ``code`` as rich's Syntax counts it: (1-based line, 0-based column)."""
    line = code.count("\n", 0, offset)
    return line + 1, offset - (code.rfind("\n", 0, offset) + 1)


def highlight(parts: Sequence[RenderableType], query: str, current: int | None) -> int:
    """Mark every occurrence of ``query`` in the Text and Syntax ``parts`` (in place: parts of
    a freshly rendered step) with HIT, the ``current``-th in reading order with CURRENT_HIT;
    the number of occurrences."""
    count = 0
    if not query:
        return 0
    for part in parts:
        if isinstance(part, Text):
            for start, end in _spans(part.plain, query):
                part.stylize(CURRENT_HIT if count == current else HIT, start, end)
                count += 1
        elif isinstance(part, Syntax):
            code = part.code
            for start, end in _spans(code, query):
                part.stylize_range(CURRENT_HIT if count == current else HIT, _position(code, start), _position(code, end))
                count += 1
    return count


def current_line(console: Console, renderable: RenderableType, width: int) -> int | None:
    """The line (from 0) on which the current hit starts when ``renderable`` is laid out in
    ``width`` columns; None without one."""
    options = console.options.update(width=max(1, width))
    for number, line in enumerate(console.render_lines(renderable, options, pad=False)):
        if any(segment.style is not None and segment.style.bgcolor == CURRENT_HIT.bgcolor for segment in line):
            return number
    return None
