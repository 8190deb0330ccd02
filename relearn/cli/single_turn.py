"""``relearn single-turn import | verify | review``: the single-turn half of the protocol (Math,
Code and instruction-following RL rollouts) one stage at a time; ``relearn masks`` compiles
their reviews (``--mode ross`` = A ∩ K) and ``relearn stats --by-step-window`` reads them.
The flags are ``relearn.verbs.single_turn``'s; the work is ``relearn.ops.single_turn``'s, which
also runs a ``[pool.single_turn]`` pipeline."""

from __future__ import annotations

from typing import Any

import typer

from relearn.cli.declared import command, parameter
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, pairs, run_op, show_problems
from relearn.ops.single_turn import run_single_turn_import, run_single_turn_review, run_single_turn_verify
from relearn.options import build, options_of
from relearn.verbs.single_turn import (
    KeepJudges,
    SingleTurnColumns,
    SingleTurnImportOptions,
    SingleTurnReviewOptions,
    SingleTurnVerifyOptions,
)

app = typer.Typer(
    help="Single-turn RL rollouts (Math, Code, instruction following): import the row dumps, grade each response with its task's verifier, review with keep intervals.",
    no_args_is_help=True,
)


def _show(title: str, rows: list[tuple[str, object]], partial: bool) -> None:
    out.print(pairs(title, rows))
    raise typer.Exit(EXIT_PARTIAL if partial else EXIT_OK)


def import_rollouts(options: SingleTurnImportOptions, **columns: str | None) -> None:
    options.columns = {name: value for name, value in columns.items() if value is not None}
    summary = run_op(run_single_turn_import, options)
    show_problems("rejected", [str(e) for e in summary.rejected])
    rows: list[tuple[str, object]] = [("files read", summary.files), ("rollouts imported", summary.imported)]
    rows += [("already in the pool (skipped)", summary.skipped_existing), ("rows rejected", len(summary.rejected))]
    _show(f"relearn single-turn import -> {options.output}", rows, bool(summary.rejected))


def verify(options: SingleTurnVerifyOptions) -> None:
    summary = run_op(run_single_turn_verify, options)
    show_problems("unreadable tasks", summary.task_problems)
    show_problems("ungradable", summary.ungradable)
    show_problems("unreadable records", summary.unreadable)
    rows: list[tuple[str, object]] = sorted(summary.graded.items())
    rows += [("graded before (resumed)", summary.resumed)] if summary.resumed else []
    _show(f"relearn single-turn verify -> {options.output}", [*rows, ("positive in the output", summary.positive)], summary.partial)


def review(options: SingleTurnReviewOptions, **roles: Any) -> None:
    options.judges = build(KeepJudges, roles).judge_options(options.judges)
    summary = run_op(run_single_turn_review, options)
    run, ledger = summary.run, summary.ledger
    show_problems("not reviewed", run.errors)
    show_problems("unreadable records", [str(e) for e in run.unreadable])
    rows: list[tuple[str, object]] = [("reviewed", run.reviewed), ("already reviewed (skipped)", run.skipped)]
    rows += sorted(run.decisions.items())
    rows += [("judge calls", ledger.calls), ("answered from the cache", ledger.cached), ("cost (USD)", f"{ledger.spent_usd:.4f}")]
    _show(f"relearn single-turn review -> {options.output}", rows, summary.partial)


def register(root: typer.Typer) -> None:
    columns = [parameter(o) for o in options_of(SingleTurnColumns)]
    app.command("import")(command(SingleTurnImportOptions, import_rollouts, extra=columns))
    app.command("verify")(command(SingleTurnVerifyOptions, verify))
    # The roles' own names (--judge, --auditor) stand for judge1 and judge2; a judge reads the whole response.
    roles = [parameter(o) for o in options_of(KeepJudges)]
    skip = ("judge1", "judge2", "judge2_base_url", "context", "reviewer")
    app.command("review")(command(SingleTurnReviewOptions, review, skip=skip, extra=roles))
    root.add_typer(app, name="single-turn")
