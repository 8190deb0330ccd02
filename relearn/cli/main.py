"""The ``relearn`` app: every verb group registered on one typer app (exit codes: ``relearn.cli``)."""

from __future__ import annotations

import typer

from relearn.cli import analyze, envs, evaluate, export, harness, masks, pool, review, run, serve, single_turn, stats, train, verify, view

app = typer.Typer(
    name="relearn",
    help="ROSS: relearn from self-generated agentic rollouts through selective supervision.\n\n"
    "Pipeline: import/collect -> verify -> review -> masks -> train -> eval.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
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


def main() -> None:
    app()
