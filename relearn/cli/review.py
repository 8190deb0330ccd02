"""``relearn review``: a typer group whose default command reviews a pool. Each verb's flags are
its options' fields (``relearn.ops.review``, ``relearn.ops.review_bench``).

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

from records.pools import RecordError, read_trajectories_lenient
from records.review import Review, iter_reviews, latest_reviews
from relearn.cli.cluster import show_nodes
from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, out, pairs, print_error, run_op, show_problems, show_warnings
from relearn.ops.review import AgreeOptions, ReviewOptions, run_review
from relearn.ops.review_bench import SHOWN, BenchOptions, LabelOptions, fmt, run_review_bench
from review.agreement import agreement


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


POOL_DOC = """Review verified trajectories with two LLM judges (or, without --judge1, the offline heuristic reviewer).

`relearn review POOL -o reviews.jsonl --judge1 M --judge2 M` prints accepted, rejected by reason, errors by category, grounded/rejected spans and cost; a rerun costs nothing. Judge 1 reads the task statement, every step and the verifier's evidence whole (see --judge-context). Judge 2 quotes each confirmed error; every quote of an error must ground in the step's text, or the trajectory is rejected as no_valid_target.

`relearn review POOL --judge1 M --estimate` prints what the review would cost before anything is paid: requests and tokens per judge, and dollars with and without batch mode and prompt caching, from the shipped pricing table (check its prices; override with --prices).

`--batch` sends every judge-1 request as one batch (several past the vendors' size limits), waits, then does the same for judge 2; the answers fill the same call cache, so a later run without --batch costs nothing. Requests are laid out for prompt caching either way: the judge instructions and the trajectory's shared start (agent system prompt, task) come first.
"""
BENCH_DOC = """Score the reviewer (the offline heuristic without judges) on a labelled review benchmark.

Decision accuracy and Cohen's kappa, error detection per step and category, span F1 over excluded words, minimality, collateral damage, no_valid_target and grounding failures, cost, tokens and seconds per trajectory, into DIR/bench.json and DIR/bench.md (the case format is in docs/review.md). Rerunning into the same DIR resumes and pays for nothing twice; DIR is refused for another reviewer or case set.
"""
LABEL_DOC = "Turn reviews written or corrected by hand into labelled cases for `relearn review bench`: each error takes the defects of its step and category as its gold spans."
AGREE_DOC = "Cohen's kappa on decisions and categories, span F1 and the share of correct tokens wrongly excluded."


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
    from review.bench.cases import BenchCase, case_from_review, write_cases

    latest: dict[str, Review] = {}
    problems: list[str] = []
    for item in iter_reviews(options.reviews):
        if isinstance(item, Review):
            latest[item.trajectory_id] = item
        else:
            problems.append(str(item))
    unreadable: list[RecordError] = []
    cases: list[BenchCase] = []
    for trajectory in read_trajectories_lenient(options.pool, unreadable):
        if trajectory.id in latest:
            try:
                cases.append(case_from_review(trajectory, latest[trajectory.id]))
            except ValueError as exc:
                problems.append(f"{options.reviews}: trajectory {trajectory.id}: {exc}")
    problems += [str(e) for e in unreadable]
    show_problems("not labelled", problems)
    if not cases:
        print_error("no reviewed trajectory could be labelled")
        raise typer.Exit(EXIT_USAGE)
    write_cases(options.output, cases)
    out.print(f"{len(cases)} labelled cases -> {options.output} (score a reviewer on them: relearn review bench {options.output} -o DIR)")
    raise typer.Exit(EXIT_PARTIAL if problems else EXIT_OK)


def agree(options: AgreeOptions) -> None:
    errors: list[RecordError] = []
    trajectories = {t.id: t for t in read_trajectories_lenient(options.pool, errors)}
    reference, other = (latest_reviews(path, lambda review: review)[0] for path in (options.reference, options.other))
    result = agreement(reference, other, trajectories)
    out.print(
        pairs("relearn review agree", [(key, f"{value:.3f}" if isinstance(value, float) else value) for key, value in result.items()])
    )
    out.print(json.dumps(result))
    raise typer.Exit(EXIT_PARTIAL if errors else EXIT_OK)


review_app.command("pool")(command(ReviewOptions, review, doc=POOL_DOC))
review_app.command("bench")(command(BenchOptions, bench, doc=BENCH_DOC))
review_app.command("label")(command(LabelOptions, label, doc=LABEL_DOC))
review_app.command("agree")(command(AgreeOptions, agree, doc=AGREE_DOC))


def register(app: typer.Typer) -> None:
    app.add_typer(review_app, name="review")
