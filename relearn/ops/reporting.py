"""How an operation tells its caller what it is doing, and what it could not use.

An operation never prints: it calls its ``Reporter``, and the front-end decides how that looks
(a rich progress bar under `relearn VERB` and `relearn run`, nothing in tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class OpError(Exception):
    """Unusable input or usage: nothing was done. The message is one line that names the path
    (and line, field) and, where it helps, what to do; the front-ends exit 2 with it."""


class Reporter(Protocol):
    def begin(self, label: str, total: float | None = None) -> None:
        """A long piece of work starts; ``total`` in whatever unit ``advance`` counts."""

    def advance(self, amount: float = 1, **fields: Any) -> None:
        """Some of it is done (``fields``: live counts to show beside the bar, e.g. per node)."""

    def end(self) -> None:
        """That piece of work is over (also when it failed)."""

    def note(self, message: str) -> None:
        """A line the user should read: what was chosen, skipped or built on the way."""


class Silent:
    """The reporter of tests and library callers: says nothing."""

    def begin(self, label: str, total: float | None = None) -> None:
        pass

    def advance(self, amount: float = 1, **fields: Any) -> None:
        pass

    def end(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass


SILENT = Silent()


class RichReporter:
    """A transient bar per piece of work on ``console`` (stderr for the verbs, the run's console
    for the pipeline), notes as dim lines above it."""

    def __init__(self, console: Console, indent: str = "") -> None:
        self.console = console
        self.indent = indent
        self._progress: Progress | None = None
        self._task: Any = None

    def begin(self, label: str, total: float | None = None) -> None:
        self.end()
        self._progress = Progress(
            TextColumn(f"{self.indent}[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("[dim]{task.fields[extra]}"), console=self.console, transient=True,
        )  # fmt: skip
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, extra="")

    def advance(self, amount: float = 1, **fields: Any) -> None:
        if self._progress is None:
            return
        extra = ", ".join(f"{k} {v}" for k, v in fields.items())
        self._progress.update(self._task, advance=amount, **({"extra": extra} if fields else {}))

    def end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, message: str) -> None:
        self.console.print(f"{self.indent}[dim]{message}[/dim]", highlight=False)


@contextmanager
def stage(reporter: Reporter, label: str, total: float | None = None) -> Iterator[Reporter]:
    """``begin`` ... ``end``, also when the work raises."""
    reporter.begin(label, total)
    try:
        yield reporter
    finally:
        reporter.end()
