"""How an operation tells its caller what it is doing, and what it could not use.

An operation never prints: it calls its ``Reporter``, and the front-end decides how that looks
(a rich progress bar under `relearn VERB` and `relearn run`, nothing in tests)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class OpError(Exception):
    """Unusable input or usage: nothing was done. The message is one line that names the path
    (and line, field) and, where it helps, what to do; the front-ends exit 2 with it."""


class OpInterrupted(KeyboardInterrupt):
    """Ctrl-C, caught by an operation that can say what it kept (``kept``: e.g. the records
    written and the file they are in); the front-end adds the command that resumes (``resumes``)
    or starts over, and exits 130. A KeyboardInterrupt still, so whatever stops on Ctrl-C
    stops on it too."""

    def __init__(self, kept: str, *, resumes: bool = True) -> None:
        super().__init__(kept)
        self.kept = kept
        self.resumes = resumes


# What to do about an OSError, by its errno: the second half of the line after the path.
_OS_ADVICE = {
    errno.ENOENT: "no such file or folder; check the path",
    errno.EISDIR: "is a folder, where a file was expected; give a file",
    errno.ENOTDIR: "a part of this path is a file, not a folder; check the path",
    errno.EEXIST: "exists already, where a folder was to be made; give another path",
    errno.EACCES: "permission denied; choose a place you may use, or change its permissions",
    errno.EPERM: "operation not permitted; choose a place you may use, or change its permissions",
    errno.EROFS: "on a read-only file system; choose a writable place",
    errno.ENOSPC: "no space left on the device; free some space and run again",
    errno.EDQUOT: "over the disk quota; free some space and run again",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter one",
}


def check_writable(path: Path, flag: str, *, appended: bool = False) -> None:
    """Refuse an output (a file, or a folder to write into) whose place cannot be written,
    before any work is done: a file standing where a folder must be, a read-only file system,
    a folder or file without write permission. A file is written beside itself and renamed,
    so its folder must be writable, unless it is ``appended`` to. The folders still missing are
    made later, by the writer, in the nearest one that exists."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise OpError(f"{flag} {path}: {existing} is a file, not a folder; check the path")
    places = [existing] if existing.is_dir() or appended else [existing, existing.parent]
    for place in places:
        if not os.access(place, os.W_OK):
            folder = place if place.is_dir() else place.parent
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
            why = "is on a read-only file system" if read_only else "is not writable (permission denied)"
            raise OpError(f"{flag} {path}: {place} {why}; choose a writable place")


def os_problem(exc: OSError) -> str:
    """The one line of a file-system error: the path it concerns, then what is wrong and what
    to do (``PATH: permission denied; choose a place ...``)."""
    what = _OS_ADVICE.get(exc.errno or -1) or (exc.strerror.lower() if exc.strerror else str(exc))
    path = exc.filename2 if exc.filename2 is not None and exc.errno in (errno.EEXIST, errno.EISDIR) else exc.filename
    return f"{os.fsdecode(path)}: {what}" if path is not None else what


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
        if not self.console.is_terminal:
            return  # no bar to draw; rich would leave an empty line on the pipe or file instead
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
