"""What every verb shares: the consoles, the exit codes, the list of problems."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import typer
from rich.console import Console

from relearn.ops.reporting import OpError, Reporter, RichReporter

Options = TypeVar("Options")
Summary = TypeVar("Summary")

# Exit codes, the same for every verb.
EXIT_OK, EXIT_PARTIAL, EXIT_USAGE = 0, 1, 2
SHOWN_PROBLEMS = 20

out = Console()
err = Console(stderr=True)


def show_problems(title: str, problems: list[str]) -> None:
    if not problems:
        return
    err.print(f"[bold]{title}[/bold] ({len(problems)}):")
    for problem in problems[:SHOWN_PROBLEMS]:
        err.print(f"  {problem}", markup=False, highlight=False)
    if len(problems) > SHOWN_PROBLEMS:
        err.print(f"  ... and {len(problems) - SHOWN_PROBLEMS} more")


def run_op(op: Callable[[Options, Reporter], Summary], options: Options) -> Summary:
    """An operation of ``relearn.ops`` with its progress on stderr; unusable input (its
    ``OpError``) exits 2 with the one line."""
    try:
        return op(options, RichReporter(err))
    except OpError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
