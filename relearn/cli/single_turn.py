"""``relearn single-turn import | verify | review``: the single-turn half of the protocol (Math,
Code and instruction-following RL rollouts) one stage at a time; ``relearn masks`` compiles
their reviews (``--mode ross`` = A ∩ K) and ``relearn stats --by-step-window`` reads them.
The work, and the flags, are ``relearn.ops.single_turn``'s, which also runs a
``[pool.single_turn]`` pipeline."""

from __future__ import annotations

from typing import Any

import typer

from relearn.cli.declared import command, parameter
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, pairs, run_op, show_problems
from relearn.ops import single_turn as ops
from relearn.options import build, options_of

app = typer.Typer(
    help="Single-turn RL rollouts (Math, Code, instruction following): import the row dumps, grade each response with its task's verifier, review with keep intervals.",
    no_args_is_help=True,
)

REVIEW_DOC = """Review verifier-positive single-turn rollouts: keep intervals for Math and Code, full supervision for instruction following.

The keep judge quotes the correct, self-contained reasoning and the complete final answer (leaving out wrong steps, abandoned approaches and repeated answer emission) or drops the response when no clean solution can be assembled from its own text; every quote is grounded to exact offsets, and one that does not ground drops the response. The auditor then reads the kept text alone and must find it self-contained and correct. Instruction-following positives are accepted whole without a call. Answers are cached beside the output, so a rerun costs nothing for what was reviewed; `relearn masks --mode ross` compiles A ∩ K from the reviews.
"""


def _show(title: str, rows: list[tuple[str, object]], partial: bool) -> None:
    out.print(pairs(title, rows))
    raise typer.Exit(EXIT_PARTIAL if partial else EXIT_OK)


def import_rollouts(options: ops.SingleTurnImportOptions, **columns: str | None) -> None:
    options.columns = {name: value for name, value in columns.items() if value is not None}
    summary = run_op(ops.run_single_turn_import, options)
    show_problems("rejected", [str(e) for e in summary.rejected])
    rows: list[tuple[str, object]] = [("files read", summary.files), ("rollouts imported", summary.imported)]
    rows += [("already in the pool (skipped)", summary.skipped_existing), ("rows rejected", len(summary.rejected))]
    _show(f"relearn single-turn import -> {options.output}", rows, bool(summary.rejected))


def verify(options: ops.SingleTurnVerifyOptions) -> None:
    summary = run_op(ops.run_single_turn_verify, options)
    show_problems("unreadable tasks", summary.task_problems)
    show_problems("ungradable", summary.ungradable)
    show_problems("unreadable records", summary.unreadable)
    rows: list[tuple[str, object]] = sorted(summary.graded.items())
    rows += [("graded before (resumed)", summary.resumed)] if summary.resumed else []
    _show(f"relearn single-turn verify -> {options.output}", [*rows, ("positive in the output", summary.positive)], summary.partial)


def review(options: ops.SingleTurnReviewOptions, **roles: Any) -> None:
    options.judges = build(ops.KeepJudges, roles).judge_options(options.judges)
    summary = run_op(ops.run_single_turn_review, options)
    run, ledger = summary.run, summary.ledger
    show_problems("not reviewed", run.errors)
    show_problems("unreadable records", [str(e) for e in run.unreadable])
    rows: list[tuple[str, object]] = [("reviewed", run.reviewed), ("already reviewed (skipped)", run.skipped)]
    rows += sorted(run.decisions.items())
    rows += [("judge calls", ledger.calls), ("answered from the cache", ledger.cached), ("cost (USD)", f"{ledger.spent_usd:.4f}")]
    _show(f"relearn single-turn review -> {options.output}", rows, summary.partial)


def register(root: typer.Typer) -> None:
    columns = [parameter(o) for o in options_of(ops.SingleTurnColumns)]
    app.command("import")(command(ops.SingleTurnImportOptions, import_rollouts, extra=columns))
    app.command("verify")(command(ops.SingleTurnVerifyOptions, verify))
    # The roles' own names (--judge, --auditor) stand for judge1 and judge2; a judge reads the whole response.
    roles = [parameter(o) for o in options_of(ops.KeepJudges)]
    skip = ("judge1", "judge2", "judge2_base_url", "context")
    app.command("review")(command(ops.SingleTurnReviewOptions, review, doc=REVIEW_DOC, skip=skip, extra=roles))
    root.add_typer(app, name="single-turn")
