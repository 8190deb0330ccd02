"""How the ``relearn`` command ends on a problem that escapes a verb: one line, an exit code.

An input or environment problem (a file that is missing, a folder where a file should be, a
place that cannot be written, a file that is not UTF-8 or not zstd) ends with
``error: <what is wrong with which path>; <what to do>`` on stderr and exit 2, never a
traceback. Ctrl-C ends with what was kept and the command that resumes (exit 130). Anything else
is a bug in relearn and says so in one line. ``--debug`` (or ``RELEARN_DEBUG=1``) lets every one
of them through as its traceback.

The ops raise ``OpError`` with a precise line where they know the path; this is the net under
them, for what they do not foresee.
"""

from __future__ import annotations

import errno
import json
import shlex
import sys
import traceback
from typing import Any

import msgspec
import typer
import zstandard
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.exceptions import TyperException

from records.pools import RecordError
from relearn.cli.help_layout import RelearnGroup
from relearn.cli.output import EXIT_PARTIAL, EXIT_USAGE, print_error
from relearn.ops.reporting import OpError, OpInterrupted, os_problem

DEBUG = "relearn.debug"  # the key of ctx.meta that --debug sets
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT
EXIT_BUG = EXIT_PARTIAL  # what Python itself exits with on an uncaught exception


def input_problem(exc: BaseException) -> str | None:
    """The one line of an input or environment problem, or None when ``exc`` is a bug."""
    if isinstance(exc, OpError | RecordError):
        return str(exc)
    if isinstance(exc, OSError):
        return os_problem(exc)
    # The rest name no file: the ops name it where they can; --debug shows where it was read.
    if isinstance(exc, UnicodeDecodeError):
        return f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start:,}); run again with --debug to see which"
    if isinstance(exc, zstandard.ZstdError):
        return f"an input .zst file is damaged ({exc}); run again with --debug to see which"
    if isinstance(exc, json.JSONDecodeError | msgspec.DecodeError):
        return f"an input file is not valid JSON ({exc}); run again with --debug to see which"
    return None


def resume_command(argv: list[str]) -> str:
    """The command line that was run, as the shell would take it back."""
    return shlex.join(["relearn", *argv])


def report(exc: BaseException, argv: list[str]) -> int:
    """Tell ``exc`` in one line on stderr; the exit code."""
    if isinstance(exc, OpInterrupted):
        again = "to resume, run the same command again" if exc.resumes else "to start over, run the same command again"
        print_error(f"interrupted: {exc.kept}; {again}: {resume_command(argv)}")
        return EXIT_INTERRUPTED
    if isinstance(exc, KeyboardInterrupt):
        print_error(
            "interrupted (Ctrl-C); to go on, run the same command again (a verb that writes as it goes resumes where it stopped): "
            + resume_command(argv)
        )
        return EXIT_INTERRUPTED
    problem = input_problem(exc)
    if problem is not None:
        print_error(problem)
        return EXIT_USAGE
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f", at {frame.filename}:{frame.lineno}" if frame else ""
    print_error(f"this is a bug in relearn ({type(exc).__name__}: {exc}{where}); run again with --debug for the traceback and report it")
    return EXIT_BUG


def _passes_through(exc: BaseException) -> bool:
    """What typer handles itself: usage errors, typer.Exit, a closed pipe."""
    if isinstance(exc, TyperException | typer.Exit | typer.Abort):
        return True
    return isinstance(exc, OSError) and exc.errno == errno.EPIPE


def usage_problem(exc: ClickException) -> str:
    """A usage error (a mistyped flag, a bad value) as the one line every other problem is."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see `{ctx.command_path} --help`)" if ctx is not None else message


class ReportingGroup(RelearnGroup):
    """The ``relearn`` group (its help layout is ``RelearnGroup``'s) that ends every verb's
    escaping exception with ``report``, unless --debug asks for the traceback, and a usage
    error with the same ``error:`` line (click's own is three lines, ``Error:`` last)."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as exc:  # `relearn` or a group alone: its help page
            exc.show()
            sys.exit(exc.exit_code)
        except ClickException as exc:
            print_error(usage_problem(exc))
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: typer.Context) -> Any:
        argv = [*ctx._protected_args, *ctx.args]  # the verb and its arguments, as typed
        try:
            return super().invoke(ctx)
        except (Exception, KeyboardInterrupt) as exc:
            if _passes_through(exc) or ctx.meta.get(DEBUG):
                raise
            raise typer.Exit(report(exc, argv)) from None
