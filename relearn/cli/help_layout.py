"""How every ``relearn ... --help`` page is laid out, in one place.

click's plain layout, not typer's rich tables: rich shares the width out between five columns
and cuts option names and choices (``--include-suspici…``) to fit, and keeps the hand-made line
breaks of all but the first paragraph. Here the description is rewrapped to the terminal's
whole width, an option's name and metavar are never cut (a long one puts its help on the next
line), no line breaks at a hyphen (``--no-overwrite``, ``swe-gym``, ``relearn-export.json``
stay whole), and every page ends with the exit codes.
"""

from __future__ import annotations

import inspect
import re
import shutil
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any

import typer
from typer.core import TyperGroup

_CODES = (
    "\b\n"
    "Exit codes:\n"
    "  0  everything asked for was done\n"
    "  1  done, but some inputs were rejected or nothing matched\n"
    "  2  nothing done: bad usage or unusable input"
)
_INTERRUPTED = "\n  130  interrupted (Ctrl-C)"
EXIT_CODES = _CODES + _INTERRUPTED
EXIT_CODES_STAGES = _CODES + "\n  3  a stage failed, the stages after it did not run (rerun to resume)" + _INTERRUPTED
EXIT_CODES_ALL = _CODES + "\n  3  a stage of relearn run or relearn demo failed" + _INTERRUPTED


def wrap(text: str, width: int, indent: str = "") -> str:
    """Paragraphs (split by blank lines) rewrapped to ``width``, never breaking a word or at a
    hyphen (a word longer than the line stands alone); a paragraph whose first line is ``\\b``
    is kept as written (click's convention, used for the exit codes)."""
    wrapper = textwrap.TextWrapper(
        width=width, initial_indent=indent, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(text)):
        first, _, rest = paragraph.partition("\n")
        if first.strip() == "\b":
            paragraphs.append("\n".join(indent + line for line in rest.splitlines()))
        else:
            paragraphs.append(wrapper.fill(paragraph))
    return "\n\n".join(paragraphs)


# Recent typer vendors click (typer._click), older typer uses click itself: its Context names the
# formatter class either way.
_ClickHelpFormatter: Any = typer.Context.formatter_class


# typer writes an argument as its name and its Python type (`POOL <file>`, `PATH <list[Path]>`);
# the name already says what it takes.
_ARGUMENT_TYPE = re.compile(r"^([A-Z][^\s<]*) <[^>]+>$")


class HelpFormatter(_ClickHelpFormatter):
    """click's help formatter with ``wrap`` for the text and the definition lists (click's own
    wrapper breaks at hyphens and inside long words, and then overflows by a character)."""

    def write_text(self, text: str) -> None:
        self.write(wrap(text, self.width, " " * self.current_indent) + "\n")

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        if not rows:
            return
        # A name longer than col_max puts its help on the next line, under the others'.
        first_col = min(max(len(term) for term, _ in rows), col_max) + col_spacing
        indent = " " * self.current_indent
        text_width = max(self.width - self.current_indent - first_col, 20)
        for term, definition in rows:
            term = _ARGUMENT_TYPE.sub(r"\1", term)
            lines = wrap(definition, text_width).splitlines() if definition else []
            if len(term) + col_spacing <= first_col and lines:
                self.write(f"{indent}{term:<{first_col}}{lines.pop(0)}\n")
            else:
                self.write(f"{indent}{term}\n")
            for line in lines:
                self.write(f"{indent}{'':<{first_col}}{line}\n" if line else "\n")


class HelpContext(typer.Context):
    """A context whose help takes the terminal's whole width (click caps it at 80 columns)."""

    formatter_class = HelpFormatter

    def make_formatter(self) -> Any:
        width = self.max_content_width or shutil.get_terminal_size().columns
        return self.formatter_class(width=self.terminal_width, max_width=width)


def commands_below(command: Any) -> Iterator[Any]:
    """A command and, for a group, every command and group under it."""
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from commands_below(sub)


class RelearnGroup(TyperGroup):
    """The ``relearn`` group: once typer has built the whole tree under it, every page gets the
    layout above, the exit codes as its epilog (unless it has its own), and its first paragraph
    as the line in its group's list (click would cut it at the first sentence or at the width)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in commands_below(self):
            command.context_class = HelpContext
            command.epilog = command.epilog or (EXIT_CODES_ALL if command is self else EXIT_CODES)
            if command.help and not command.short_help:
                command.short_help = inspect.cleandoc(command.help).split("\n\n")[0].replace("\n", " ")
