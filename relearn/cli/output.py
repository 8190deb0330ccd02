"""What every verb shares: the consoles, the exit codes, the list of problems."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from relearn.ops.reporting import OpError, Reporter, RichReporter

Options = TypeVar("Options")
Summary = TypeVar("Summary")

# Exit codes, the same for every verb.
EXIT_OK, EXIT_PARTIAL, EXIT_USAGE = 0, 1, 2
SHOWN_PROBLEMS = 20

out = Console()
# Messages on stderr are never wrapped: an error or a problem is one line to read, grep and copy.
err = Console(stderr=True, soft_wrap=True)


def show_problems(title: str, problems: list[str]) -> None:
    if not problems:
        return
    err.print(f"[bold]{title}[/bold] ({len(problems)}):")
    for problem in problems[:SHOWN_PROBLEMS]:
        err.print(f"  {problem}", markup=False, highlight=False)
    if len(problems) > SHOWN_PROBLEMS:
        err.print(f"  ... and {len(problems) - SHOWN_PROBLEMS} more")


def show_warnings(warnings: list[str]) -> bool:
    """A run that matched nothing (an empty pool, another pool's reviews): one line each on
    stderr; True when there was any (the verb then exits 1)."""
    for warning in warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    return bool(warnings)


class WarningLines(logging.Handler):
    """relearn's own log warnings (a repaired file, a fallback taken) as ``warning:`` lines on
    stderr, like the verbs' other warnings."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(Text.assemble(("warning:", "yellow"), " ", self.format(record)), soft_wrap=True, highlight=False)


OWN_LOGGERS = ("records", "harness", "envs", "review", "eval", "relearn")


def show_log_warnings() -> None:
    """Send the warnings of relearn's packages to stderr as ``warning:`` lines (once per process)."""
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(handler, WarningLines) for handler in logger.handlers):
            logger.addHandler(WarningLines(logging.WARNING))
            logger.propagate = False


def print_error(message: str) -> None:
    """The one way a problem is told: ``error: <what is wrong with which path>; <what to do>``
    on stderr, as one line however long (never wrapped, never read as markup; an exception's
    own line breaks joined)."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    err.print(Text.assemble(("error:", "red"), " ", line), soft_wrap=True, highlight=False)


def run_op(op: Callable[[Options, Reporter], Summary], options: Options) -> Summary:
    """An operation of ``relearn.ops`` with its progress on stderr; unusable input (its
    ``OpError``) exits 2 with the one line."""
    try:
        return op(options, RichReporter(err))
    except OpError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None


def pairs(title: str, rows: Iterable[tuple[str, object]]) -> Table:
    """A verb's summary: one figure a row, its name bold and its value right-aligned."""
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def grid(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], **column: Any) -> Table:
    """A table of items, one a row; the first column names the item and is never wrapped."""
    table = Table(title=title)
    table.add_column(columns[0], no_wrap=True)
    for name in columns[1:]:
        table.add_column(name, **column)
    for row in rows:
        table.add_row(*row)
    return table


def show_nodes(per_node: dict[str, int], what: str) -> None:
    """Units finished by node, when they ran on a cluster."""
    if per_node and set(per_node) != {"local"}:
        err.print(f"{what} by node: " + ", ".join(f"{node[:12]} {count}" for node, count in sorted(per_node.items())))
