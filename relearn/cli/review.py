"""``relearn review``: a typer group whose default command reviews a pool. Each verb's flags are
its options' fields (``relearn.verbs.review``).

relearn review POOL ...                     (the same as `relearn review pool POOL ...`)
relearn review agree REFERENCE OTHER --pool POOL
relearn review bench [BENCH] -o DIR ...
relearn review label POOL REVIEWS -o CASES.jsonl
"""

from __future__ import annotations

import json

import click
import typer
from typer.core import TyperGroup

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, pairs, run_op, show_nodes, show_problems, show_warnings
from relearn.ops.review import run_agree, run_review
from relearn.ops.review_bench import SHOWN, fmt, run_label, run_review_bench
from relearn.verbs.review import AgreeOptions, BenchOptions, LabelOptions, ReviewOptions


class PoolByDefault(TyperGroup):
    """`relearn review POOL ...` is `relearn review pool POOL ...`: a first argument that names
    no subcommand (and is not --help) is the pool's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["pool", *args]
        return super().parse_args(ctx, args)


review_app = typer.Typer(
    name="review",
    cls=PoolByDefault,
    help="Review verified trajectories with two LLM judges (or the offline heuristic reviewer); `relearn review POOL` is `relearn review pool POOL`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def review(options: ReviewOptions) -> None:
    summary = run_op(run_review, options)
    if options.estimate:
        assert summary.estimate is not None
        out.print(summary.estimate.render())
        figures = {"trajectories": summary.estimate.trajectories, "judges": [e.row() for e in summary.estimate.estimates]}
        out.print(json.dumps(figures), soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(EXIT_OK)
    run, ledger = summary.run, summary.ledger
    assert run is not None and ledger is not None
    batch = run.batch
    show_problems("unreadable records", [str(e) for e in run.unreadable])
    show_nodes(run.per_node, "reviews")
    show_problems("not reviewed", run.errors)
    batches = [
        ("batches (submitted / resumed)", f"{sum(batch.submitted.values())} / {sum(batch.resumed.values())}"),
        ("batch answers (used / retried one by one)", f"{ledger.batched} / {sum(batch.failed.values())}"),
    ] if batch is not None else []  # fmt: skip
    out.print(pairs(f"relearn review -> {options.output}", [
        ("reviewed now", run.reviewed),
        ("already reviewed (skipped)", run.skipped),
        ("not reviewed (cap or judge failure)", run.not_reviewed),
        *sorted(run.decisions.items()),
        *((f"errors: {category}", count) for category, count in run.categories.most_common()),
        ("spans grounded / rejected", f"{run.grounded} / {run.rejected_spans}"),
        ("judge calls (paid / from cache)", f"{ledger.calls} / {ledger.cached}"),
        *batches,
        ("input tokens (of which prompt-cache reads)", f"{ledger.input_tokens:,} ({ledger.cached_input_tokens:,})"),
        ("output tokens", f"{ledger.output_tokens:,}"),
        ("cost", f"${ledger.spent_usd:.4f}"),
    ]))  # fmt: skip
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_PARTIAL if summary.partial or warned else EXIT_OK)


def bench(options: BenchOptions) -> None:
    summary = run_op(run_review_bench, options)
    show_problems("unreadable cases", summary.case_problems)
    show_problems("unreadable reviews", summary.unreadable)
    show_problems("not reviewed", summary.not_reviewed)
    title = f"relearn review bench: {summary.cases} cases, {summary.reviewer} -> {options.output}"
    out.print(pairs(title, [(label, fmt(summary.result["overall"][key])) for key, label in SHOWN]))
    out.print(f"figures per kind and per case: {options.output / 'bench.md'}, {options.output / 'bench.json'}")
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def label(options: LabelOptions) -> None:
    summary = run_op(run_label, options)
    show_problems("not labelled", summary.problems)
    out.print(
        f"{summary.cases} labelled cases -> {options.output} (score a reviewer on them: relearn review bench {options.output} -o DIR)"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.problems else EXIT_OK)


def agree(options: AgreeOptions) -> None:
    summary = run_op(run_agree, options)
    out.print(pairs("relearn review agree", [(key, f"{v:.3f}" if isinstance(v, float) else v) for key, v in summary.result.items()]))
    out.print(json.dumps(summary.result))
    raise typer.Exit(EXIT_PARTIAL if summary.unreadable else EXIT_OK)


review_app.command("pool")(command(ReviewOptions, review))
review_app.command("bench")(command(BenchOptions, bench))
review_app.command("label")(command(LabelOptions, label))
review_app.command("agree")(command(AgreeOptions, agree))


def register(app: typer.Typer) -> None:
    app.add_typer(review_app, name="review")
