"""``relearn review`` and ``relearn review agree``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envs.executor import Needs
from records.pools import RecordError, iter_lines, read_trajectories_lenient
from records.review import Review, iter_reviews
from relearn.cli.cluster import NodesColumn, RayArg, ray_backend, show_nodes
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems
from review.agreement import agreement
from review.reading import DEFAULT_JUDGE_CONTEXT

if TYPE_CHECKING:
    from review.judges import Ledger


def review_command(
    args: Annotated[
        list[str],
        typer.Argument(
            metavar="POOL | agree REFERENCE OTHER | bench [BENCH] | label POOL REVIEWS",
            help="A pool to review, or `agree` and two review files to compare, or `bench` and a labelled case set (default: the shipped one), or `label`, a pool and the reviews that are its gold labels.",
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Reviews JSONL (appended; reviewed trajectories are skipped; default reviews.jsonl). With bench: the results folder; with label: the cases file.",
        ),
    ] = None,
    judge1: Annotated[
        str | None, typer.Option(help="Model of judge 1 (confirms errors). Omit both judges for the offline heuristic reviewer.")
    ] = None,
    judge2: Annotated[str | None, typer.Option(help="Model of judge 2 (localizes them); defaults to judge 1's.")] = None,
    backend: Annotated[str, typer.Option(help="anthropic | chat (any OpenAI-compatible server) | responses.")] = "anthropic",
    base_url: Annotated[str | None, typer.Option(help="Judge endpoint (default: the provider's).")] = None,
    judge2_base_url: Annotated[str | None, typer.Option(help="Judge 2 endpoint, when it differs.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the API key.")] = None,
    workers: Annotated[int, typer.Option(help="Trajectories reviewed at once.")] = 4,
    spend_cap: Annotated[float | None, typer.Option(help="Hard cap in USD: no judge call starts once it is spent.")] = None,
    price_in: Annotated[
        float | None, typer.Option(help="USD per million input tokens (default: the pricing table's price for the judge's model, else 0).")
    ] = None,
    price_out: Annotated[
        float | None, typer.Option(help="USD per million output tokens (default: from the pricing table, else 0).")
    ] = None,
    price_cached_in: Annotated[
        float | None,
        typer.Option(
            help="USD per million prompt tokens read from the provider's prompt cache (default: from the pricing table, else --price-in)."
        ),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option(
            help="A TOML pricing table laid over the shipped one (review/prices.toml: [models.NAME] input, output, cache_read, cache_write, min_cache_tokens, batch_discount, cache_in_batch; [assumptions])."
        ),
    ] = None,
    estimate: Annotated[
        bool,
        typer.Option(
            "--estimate",
            help="Send nothing: count what the review would send (requests, input and output tokens per judge, with tiktoken) and print its cost from the pricing table, plain, with prompt caching, in batch mode, and both.",
        ),
    ] = False,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch",
            help="Send the judges' requests as Anthropic Message Batches or OpenAI Batches (half price, answers within 24 h): judge 1 for the whole pool, then judge 2 for what it accepted. Batch ids are kept in OUTPUT.batches.json, so a run killed while waiting polls them again instead of paying twice; requests a batch could not answer are sent one by one.",
        ),
    ] = False,
    poll_interval: Annotated[float, typer.Option(help="With --batch: seconds between polls of a batch's status.")] = 60.0,
    agree_pool: Annotated[
        Path | None, typer.Option("--pool", help="With `agree`: the pool both reviews cover (for span agreement).")
    ] = None,
    include_suspicious: Annotated[
        bool,
        typer.Option(help="Also review successes the verifier found suspicious (by default they are rejected unreviewed, at no cost)."),
    ] = False,
    ray: RayArg = None,
    judge_context: Annotated[
        int,
        typer.Option(
            help="Tokens of prompt a judge reads at most (counted with tiktoken over the Qwen3.6 ranks). Judge 1 reads the whole trajectory; past this, only the middles of the longest tool outputs are elided, and the prompt says so. A trajectory whose task and agent text alone exceed it is rejected as too_long_for_judge and counted."
        ),
    ] = DEFAULT_JUDGE_CONTEXT,
) -> None:
    """Review verified trajectories with two LLM judges (or, without --judge1, the offline heuristic reviewer).

    `relearn review POOL -o reviews.jsonl --judge1 M --judge2 M` prints accepted, rejected by
    reason, errors by category, grounded/rejected spans and cost; a rerun costs nothing.
    Judge 1 reads the task statement, every step and the verifier's evidence whole (see --judge-context). Judge 2 quotes each confirmed error; every quote of an error must ground in the step's text, or the trajectory is rejected as no_valid_target.

    `relearn review POOL --judge1 M --estimate` prints what the review would cost before
    anything is paid: requests and tokens per judge, and dollars with and without batch mode and
    prompt caching, from the shipped pricing table (check its prices; override with --prices).

    `--batch` sends every judge-1 request as one batch (several past the vendors' size limits),
    waits, then does the same for judge 2; the answers fill the same call cache, so a later run
    without --batch costs nothing. Requests are laid out for prompt caching either way: the judge
    instructions and the trajectory's shared start (agent system prompt, task) come first.

    `relearn review bench [BENCH] -o DIR [--judge1 M --judge2 M --backend ...]` scores the reviewer (the offline heuristic without judges) on a labelled review benchmark (the shipped set in review/bench/cases/ when BENCH is omitted; the case format is in the README): decision accuracy and Cohen's kappa, error detection per step and category, span F1 over excluded words, minimality, collateral damage, no_valid_target and grounding failures, cost, tokens and seconds per trajectory, into DIR/bench.json and DIR/bench.md. Rerunning into the same DIR resumes and pays for nothing twice; DIR is refused for another reviewer or case set.

    `relearn review label POOL REVIEWS -o CASES.jsonl` turns reviews that say what a perfect reviewer would (written or corrected by hand) into labelled cases for `relearn review bench`: each error takes the defects of its step and category as its gold spans.

    `relearn review agree A.jsonl B.jsonl --pool POOL` reports Cohen's kappa on decisions and
    categories, span F1 and the share of correct tokens wrongly excluded.
    """
    # The judges' SDKs take seconds to import: loaded only when reviewing.
    from review.judges import judge_pair
    from review.run import review_pool

    if args[0] == "agree":
        if len(args) != 3 or agree_pool is None:
            err.print("[red]error:[/red] usage: relearn review agree REFERENCE OTHER --pool POOL")
            raise typer.Exit(EXIT_USAGE)
        agree(Path(args[1]), Path(args[2]), agree_pool)
        return
    if args[0] in ("bench", "label") and output is None:
        # A bench's folder and a label's cases file are named on purpose, never defaulted.
        usage = "bench [BENCH] -o DIR" if args[0] == "bench" else "label POOL REVIEWS -o CASES.jsonl"
        err.print(f"[red]error:[/red] usage: relearn review {usage}")
        raise typer.Exit(EXIT_USAGE)
    if args[0] == "label":  # relearn.cli.review_bench
        from relearn.cli.review_bench import label_from_options

        label_from_options(args[1:], output=output)
    from review.batch import BatchOptions
    from review.estimate import PricesError, UnknownModel, estimate_pool, judge_specs, load_prices, render

    try:
        price_table = load_prices(prices)
    except PricesError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    spec = judge_specs(
        price_table, backend=backend, base_url=base_url, judge2_base_url=judge2_base_url, api_key_env=api_key_env,
        price_in=price_in, price_out=price_out, price_cached_in=price_cached_in,
    )  # fmt: skip
    if args[0] == "bench":  # relearn.cli.review_bench
        from relearn.cli.review_bench import bench_from_options

        if batch or estimate:  # refused, never ignored
            err.print("[red]error:[/red] relearn review bench does not take --batch or --estimate")
            raise typer.Exit(EXIT_USAGE)
        judges = judge_pair(judge1, judge2, spec, context=judge_context)
        bench_from_options(
            args[1:], output=output, judges=judges, workers=workers, spend_cap=spend_cap, include_suspicious=include_suspicious
        )
    output = output or Path("reviews.jsonl")
    if len(args) != 1:
        err.print("[red]error:[/red] review one pool at a time")
        raise typer.Exit(EXIT_USAGE)
    pool = Path(args[0])
    if not pool.is_file():
        err.print(f"[red]error:[/red] no such pool: {pool}")
        raise typer.Exit(EXIT_USAGE)
    judges = judge_pair(judge1, judge2, spec, context=judge_context)
    if estimate:
        if judges is None:
            err.print("[red]error:[/red] --estimate prices the judges: name --judge1 (the heuristic reviewer costs nothing)")
            raise typer.Exit(EXIT_USAGE)
        try:
            estimates, counted = estimate_pool(pool, output, judges, price_table, include_suspicious=include_suspicious)
        except UnknownModel as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(EXIT_USAGE) from None
        out.print(render(estimates, counted, price_table))
        out.print(
            json.dumps({"trajectories": counted, "judges": [e.row() for e in estimates]}), soft_wrap=True, markup=False, highlight=False
        )
        raise typer.Exit(EXIT_OK)
    if batch and judges is None:
        err.print("[red]error:[/red] --batch sends the judges' requests: name --judge1")
        raise typer.Exit(EXIT_USAGE)
    total = sum(1 for _ in iter_lines(pool))
    nodes = NodesColumn()
    progress = Progress(
        TextColumn("[bold]reviewing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("${task.fields[spent]:.4f} spent"),
        TimeElapsedColumn(),
        nodes,
        console=err,
        transient=True,
    )
    with progress:
        bar = progress.add_task("review", total=total, spent=0.0)

        def done(_review: Review | None, ledger: Ledger) -> None:
            progress.update(bar, advance=1, spent=ledger.spent_usd)

        batching = (
            BatchOptions(poll_s=poll_interval, on_event=lambda line: progress.console.print(f"  [dim]{line}[/dim]")) if batch else None
        )
        if ray is not None and batch:
            err.print("[red]error:[/red] --batch and --ray do not go together: the batches are one account, submit them from one machine")
            raise typer.Exit(EXIT_USAGE)
        backend = ray_backend(ray, Needs(cpus=0.5), nodes)
        try:
            summary, ledger = review_pool(
                pool,
                output,
                judges=judges,
                workers=workers,
                spend_cap_usd=spend_cap,
                on_done=done,
                include_suspicious=include_suspicious,
                batch=batching,
                backend=backend,
            )
        finally:
            if backend is not None:
                backend.close()
    show_problems("unreadable records", [str(e) for e in summary.unreadable])
    show_nodes(summary.per_node, "reviews")
    show_problems("not reviewed", summary.errors)
    categories: Counter[str] = Counter(str(e.get("category")) for r in summary.reviewed for e in r.errors)
    grounded = sum((r.model_extra or {}).get("grounding", {}).get("grounded", len(r.defects)) for r in summary.reviewed)
    rejected_spans = sum((r.model_extra or {}).get("grounding", {}).get("rejected", 0) for r in summary.reviewed)
    table = Table(title=f"relearn review -> {output}", show_header=False)
    table.add_row("reviewed now", str(len(summary.reviewed)))
    table.add_row("already reviewed (skipped)", str(summary.skipped))
    table.add_row("not reviewed (cap or judge failure)", str(summary.not_reviewed))
    for decision, count in sorted(summary.decisions().items()):
        table.add_row(decision, str(count))
    for category, count in categories.most_common():
        table.add_row(f"errors: {category}", str(count))
    table.add_row("spans grounded / rejected", f"{grounded} / {rejected_spans}")
    table.add_row("judge calls (paid / from cache)", f"{ledger.calls} / {ledger.cached}")
    if summary.batch is not None:
        b = summary.batch
        table.add_row("batches (submitted / resumed)", f"{sum(b.submitted.values())} / {sum(b.resumed.values())}")
        table.add_row("batch answers (used / retried one by one)", f"{ledger.batched} / {sum(b.failed.values())}")
    table.add_row("input tokens (of which prompt-cache reads)", f"{ledger.input_tokens:,} ({ledger.cached_input_tokens:,})")
    table.add_row("output tokens", f"{ledger.output_tokens:,}")
    table.add_row("cost", f"${ledger.spent_usd:.4f}")
    out.print(table)
    raise typer.Exit(EXIT_PARTIAL if summary.errors or summary.unreadable else EXIT_OK)


def _reviews(path: Path) -> dict[str, Review]:
    out_map: dict[str, Review] = {}
    for item in iter_reviews(path):
        if isinstance(item, Review):
            out_map[item.trajectory_id] = item
    return out_map


def agree(reference: Path, other: Path, pool: Path) -> None:
    for path in (reference, other, pool):
        if not path.is_file():
            err.print(f"[red]error:[/red] no such file: {path}")
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
    app.command("review")(review_command)
