"""``relearn review``: a typer group whose default command reviews a pool.

relearn review POOL ...                     (the same as `relearn review pool POOL ...`)
relearn review agree REFERENCE OTHER --pool POOL
relearn review bench [BENCH] -o DIR ...
relearn review label POOL REVIEWS -o CASES.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.table import Table
from typer.core import TyperGroup

from records.pools import RecordError, read_trajectories_lenient
from records.review import Review, iter_reviews
from relearn.cli.cluster import RayArg, show_nodes
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, out, print_error, run_op, show_problems, show_warnings
from relearn.ops.review import JudgeOptions, ReviewOptions, ReviewRunSummary, run_review
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

# The judges' options, shared by `pool` and `bench`; defaults from relearn.ops.review.JudgeOptions.
Judge1 = Annotated[
    str | None, typer.Option(help="Model of judge 1 (confirms errors). Omit both judges for the offline heuristic reviewer.")
]
Judge2 = Annotated[str | None, typer.Option(help="Model of judge 2 (localizes them); defaults to judge 1's.")]
Backend = Annotated[str, typer.Option(help="anthropic | chat (any OpenAI-compatible server) | responses.")]
BaseUrl = Annotated[str | None, typer.Option(help="Judge endpoint (default: the provider's).")]
Judge2BaseUrl = Annotated[str | None, typer.Option(help="Judge 2 endpoint, when it differs.")]
ApiKeyEnv = Annotated[str | None, typer.Option(help="Environment variable holding the API key.")]
Workers = Annotated[int, typer.Option(help="Trajectories reviewed at once.")]
SpendCap = Annotated[float | None, typer.Option(help="Hard cap in USD: no judge call starts once it is spent.")]
PriceIn = Annotated[
    float | None, typer.Option(help="USD per million input tokens (default: the pricing table's price for the judge's model, else 0).")
]
PriceOut = Annotated[float | None, typer.Option(help="USD per million output tokens (default: from the pricing table, else 0).")]
PriceCachedIn = Annotated[
    float | None,
    typer.Option(
        help="USD per million prompt tokens read from the provider's prompt cache (default: from the pricing table, else --price-in)."
    ),
]
Prices = Annotated[
    Path | None,
    typer.Option(
        help="A TOML pricing table laid over the shipped one (review/prices.toml: [models.NAME] input, output, cache_read, cache_write, min_cache_tokens, batch_discount, cache_in_batch; [assumptions])."
    ),
]
IncludeSuspicious = Annotated[
    bool, typer.Option(help="Also review successes the verifier found suspicious (by default they are rejected unreviewed, at no cost).")
]
JudgeContext = Annotated[
    int,
    typer.Option(
        help="Tokens of prompt a judge reads at most (counted with tiktoken over the Qwen3.6 ranks). Judge 1 reads the whole trajectory; past this, only the middles of the longest tool outputs are elided, and the prompt says so. A trajectory whose task and agent text alone exceed it is rejected as too_long_for_judge and counted."
    ),
]


@review_app.command("pool")
def review_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", help="The verified pool to review (.jsonl or .jsonl.zst).")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Reviews JSONL (appended; reviewed trajectories are skipped).")
    ] = ReviewOptions.output,
    judge1: Judge1 = JudgeOptions.judge1,
    judge2: Judge2 = JudgeOptions.judge2,
    backend: Backend = JudgeOptions.backend,
    base_url: BaseUrl = JudgeOptions.base_url,
    judge2_base_url: Judge2BaseUrl = JudgeOptions.judge2_base_url,
    api_key_env: ApiKeyEnv = JudgeOptions.api_key_env,
    workers: Workers = ReviewOptions.workers,
    spend_cap: SpendCap = ReviewOptions.spend_cap,
    price_in: PriceIn = JudgeOptions.price_in,
    price_out: PriceOut = JudgeOptions.price_out,
    price_cached_in: PriceCachedIn = JudgeOptions.price_cached_in,
    prices: Prices = JudgeOptions.prices,
    estimate: Annotated[
        bool,
        typer.Option(
            "--estimate",
            help="Send nothing: count what the review would send (requests, input and output tokens per judge, with tiktoken) and print its cost from the pricing table, plain, with prompt caching, in batch mode, and both.",
        ),
    ] = ReviewOptions.estimate,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch",
            help="Send the judges' requests as Anthropic Message Batches or OpenAI Batches (half price, answers within 24 h): judge 1 for the whole pool, then judge 2 for what it accepted. Batch ids are kept in OUTPUT.batches.json, so a run killed while waiting polls them again instead of paying twice; requests a batch could not answer are sent one by one.",
        ),
    ] = ReviewOptions.batch,
    poll_interval: Annotated[
        float, typer.Option(help="With --batch: seconds between polls of a batch's status.")
    ] = ReviewOptions.poll_interval,
    include_suspicious: IncludeSuspicious = ReviewOptions.include_suspicious,
    ray: RayArg = ReviewOptions.ray,
    judge_context: JudgeContext = JudgeOptions.context,
) -> None:
    """Review verified trajectories with two LLM judges (or, without --judge1, the offline heuristic reviewer).

    `relearn review POOL -o reviews.jsonl --judge1 M --judge2 M` prints accepted, rejected by reason, errors by category, grounded/rejected spans and cost; a rerun costs nothing. Judge 1 reads the task statement, every step and the verifier's evidence whole (see --judge-context). Judge 2 quotes each confirmed error; every quote of an error must ground in the step's text, or the trajectory is rejected as no_valid_target.

    `relearn review POOL --judge1 M --estimate` prints what the review would cost before anything is paid: requests and tokens per judge, and dollars with and without batch mode and prompt caching, from the shipped pricing table (check its prices; override with --prices).

    `--batch` sends every judge-1 request as one batch (several past the vendors' size limits), waits, then does the same for judge 2; the answers fill the same call cache, so a later run without --batch costs nothing. Requests are laid out for prompt caching either way: the judge instructions and the trajectory's shared start (agent system prompt, task) come first.
    """
    judges = JudgeOptions(
        judge1=judge1, judge2=judge2, backend=backend, base_url=base_url, judge2_base_url=judge2_base_url, api_key_env=api_key_env,
        price_in=price_in, price_out=price_out, price_cached_in=price_cached_in, prices=prices, context=judge_context,
    )  # fmt: skip
    options = ReviewOptions(
        pool=pool, output=output, judges=judges, workers=workers, spend_cap=spend_cap, estimate=estimate, batch=batch,
        poll_interval=poll_interval, include_suspicious=include_suspicious, ray=ray,
    )  # fmt: skip
    summary = run_op(run_review, options)
    if estimate:
        assert summary.estimate is not None
        out.print(summary.estimate.render())
        figures = {"trajectories": summary.estimate.trajectories, "judges": [e.row() for e in summary.estimate.estimates]}
        out.print(json.dumps(figures), soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(EXIT_OK)
    out.print(_review_table(summary, output))
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_PARTIAL if summary.partial or warned else EXIT_OK)


def _review_table(summary: ReviewRunSummary, output: Path) -> Table:
    run, ledger = summary.run, summary.ledger
    assert run is not None and ledger is not None
    show_problems("unreadable records", [str(e) for e in run.unreadable])
    show_nodes(run.per_node, "reviews")
    show_problems("not reviewed", run.errors)
    table = Table(title=f"relearn review -> {output}", show_header=False)
    table.add_row("reviewed now", str(run.reviewed))
    table.add_row("already reviewed (skipped)", str(run.skipped))
    table.add_row("not reviewed (cap or judge failure)", str(run.not_reviewed))
    for decision, count in sorted(run.decisions.items()):
        table.add_row(decision, str(count))
    for category, count in run.categories.most_common():
        table.add_row(f"errors: {category}", str(count))
    table.add_row("spans grounded / rejected", f"{run.grounded} / {run.rejected_spans}")
    table.add_row("judge calls (paid / from cache)", f"{ledger.calls} / {ledger.cached}")
    if run.batch is not None:
        b = run.batch
        table.add_row("batches (submitted / resumed)", f"{sum(b.submitted.values())} / {sum(b.resumed.values())}")
        table.add_row("batch answers (used / retried one by one)", f"{ledger.batched} / {sum(b.failed.values())}")
    table.add_row("input tokens (of which prompt-cache reads)", f"{ledger.input_tokens:,} ({ledger.cached_input_tokens:,})")
    table.add_row("output tokens", f"{ledger.output_tokens:,}")
    table.add_row("cost", f"${ledger.spent_usd:.4f}")
    return table


@review_app.command("bench")
def bench_command(
    bench: Annotated[
        Path | None, typer.Argument(metavar="BENCH", help="A labelled case set (default: the shipped one in review/bench/cases/).")
    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The results folder (bench.json, bench.md, the reviews).")] = None,
    judge1: Judge1 = JudgeOptions.judge1,
    judge2: Judge2 = JudgeOptions.judge2,
    backend: Backend = JudgeOptions.backend,
    base_url: BaseUrl = JudgeOptions.base_url,
    judge2_base_url: Judge2BaseUrl = JudgeOptions.judge2_base_url,
    api_key_env: ApiKeyEnv = JudgeOptions.api_key_env,
    workers: Workers = ReviewOptions.workers,
    spend_cap: SpendCap = ReviewOptions.spend_cap,
    price_in: PriceIn = JudgeOptions.price_in,
    price_out: PriceOut = JudgeOptions.price_out,
    price_cached_in: PriceCachedIn = JudgeOptions.price_cached_in,
    prices: Prices = JudgeOptions.prices,
    include_suspicious: IncludeSuspicious = ReviewOptions.include_suspicious,
    judge_context: JudgeContext = JudgeOptions.context,
) -> None:
    """Score the reviewer (the offline heuristic without judges) on a labelled review benchmark.

    Decision accuracy and Cohen's kappa, error detection per step and category, span F1 over excluded words, minimality, collateral damage, no_valid_target and grounding failures, cost, tokens and seconds per trajectory, into DIR/bench.json and DIR/bench.md (the case format is in docs/review.md). Rerunning into the same DIR resumes and pays for nothing twice; DIR is refused for another reviewer or case set.
    """
    from relearn.cli.review_bench import bench as run_bench
    from relearn.ops.review_bench import BenchOptions

    if output is None:  # a bench's folder is named on purpose, never defaulted
        print_error("usage: relearn review bench [BENCH] -o DIR [--judge1 M --judge2 M --backend ...]")
        raise typer.Exit(EXIT_USAGE)
    judges = JudgeOptions(
        judge1=judge1, judge2=judge2, backend=backend, base_url=base_url, judge2_base_url=judge2_base_url, api_key_env=api_key_env,
        price_in=price_in, price_out=price_out, price_cached_in=price_cached_in, prices=prices, context=judge_context,
    )  # fmt: skip
    options = BenchOptions(output, bench, judges, workers=workers, spend_cap=spend_cap, include_suspicious=include_suspicious)
    raise typer.Exit(run_bench(options))


@review_app.command("label")
def label_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", help="The pool the reviews cover.")],
    reviews: Annotated[Path, typer.Argument(metavar="REVIEWS", help="Reviews that say what a perfect reviewer would (their gold labels).")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The cases file to write.")] = None,
) -> None:
    """Turn reviews written or corrected by hand into labelled cases for `relearn review bench`: each error takes the defects of its step and category as its gold spans."""
    from relearn.cli.review_bench import label_from_options

    if output is None:  # a label's cases file is named on purpose, never defaulted
        print_error("usage: relearn review label POOL REVIEWS -o CASES.jsonl")
        raise typer.Exit(EXIT_USAGE)
    label_from_options(pool, reviews, output=output)


@review_app.command("agree")
def agree_command(
    reference: Annotated[Path, typer.Argument(metavar="REFERENCE", help="The reference reviews.")],
    other: Annotated[Path, typer.Argument(metavar="OTHER", help="The reviews compared with them.")],
    pool: Annotated[Path | None, typer.Option("--pool", help="The pool both reviews cover (for span agreement).")] = None,
) -> None:
    """Cohen's kappa on decisions and categories, span F1 and the share of correct tokens wrongly excluded."""
    if pool is None:
        print_error("usage: relearn review agree REFERENCE OTHER --pool POOL")
        raise typer.Exit(EXIT_USAGE)
    agree(reference, other, pool)


def _reviews(path: Path) -> dict[str, Review]:
    out_map: dict[str, Review] = {}
    for item in iter_reviews(path):
        if isinstance(item, Review):
            out_map[item.trajectory_id] = item
    return out_map


def agree(reference: Path, other: Path, pool: Path) -> None:
    for path in (reference, other, pool):
        if not path.is_file():
            print_error(f"no such file: {path}")
            raise typer.Exit(EXIT_USAGE)
    errors: list[RecordError] = []
    trajectories = {t.id: t for t in read_trajectories_lenient(pool, errors)}
    result = agreement(_reviews(reference), _reviews(other), trajectories)
    table = Table(title="relearn review agree", show_header=False)
    for key, value in result.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    out.print(table)
    out.print(json.dumps(result))
    raise typer.Exit(EXIT_PARTIAL if errors else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.add_typer(review_app, name="review")
