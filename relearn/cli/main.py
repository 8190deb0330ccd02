"""The ``relearn`` app: every verb group registered on one typer app (exit codes: ``relearn.cli``; the command starts in ``relearn.__main__``)."""

from __future__ import annotations

from importlib.metadata import version

import typer

from relearn.cli import analyze, envs, evaluate, export, harness, masks, pool, review, run, serve, single_turn, stats, train, verify, view
from relearn.cli.errors import DEBUG, ReportingGroup
from relearn.cli.output import show_log_warnings

app = typer.Typer(
    name="relearn",
    help="ROSS: relearn from self-generated agentic rollouts through selective supervision.\n\n"
    "Pipeline: import/collect -> verify -> review -> masks -> train -> eval.",
    no_args_is_help=True,
    add_completion=False,
    # The help pages' layout is relearn.cli.help_layout's (click's plain one at the terminal's width);
    # an error escaping a verb ends as one line and an exit code (relearn.cli.errors).
    cls=ReportingGroup,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"relearn {version('relearn')}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    _version: bool = typer.Option(
        False, "--version", "-V", callback=_print_version, is_eager=True, help="Print relearn's version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", envvar="RELEARN_DEBUG", help="Show the Python traceback of an error instead of its one line."
    ),
) -> None:
    ctx.meta[DEBUG] = debug
    show_log_warnings()


pool.register(app)
export.register(app)
envs.register(app)
verify.register(app)
masks.register(app)
harness.register(app)
evaluate.register(app)
review.register(app)
train.register(app)
view.register(app)
stats.register(app)
analyze.register(app)
serve.register(app)
run.register(app)
single_turn.register(app)
