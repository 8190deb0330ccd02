"""``relearn review`` and ``relearn review agree``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from records.pools import RecordError, iter_lines, read_trajectories_lenient
from records.review import Review, iter_reviews
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems
from review.agreement import agreement
from review.reading import DEFAULT_JUDGE_CONTEXT

if TYPE_CHECKING:
    from review.judges import Ledger


def review_command(
    args: Annotated[list[str], typer.Argument(metavar="POOL | agree REFERENCE OTHER", help="A pool to review, or `agree` and two review files to compare.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Reviews JSONL (appended; reviewed trajectories are skipped).")] = Path("reviews.jsonl"),
    judge1: Annotated[str | None, typer.Option(help="Model of judge 1 (confirms errors). Omit both judges for the offline heuristic reviewer.")] = None,
    judge2: Annotated[str | None, typer.Option(help="Model of judge 2 (localizes them); defaults to judge 1's.")] = None,
    backend: Annotated[str, typer.Option(help="anthropic | chat (any OpenAI-compatible server) | responses.")] = "anthropic",
    base_url: Annotated[str | None, typer.Option(help="Judge endpoint (default: the provider's).")] = None,
    judge2_base_url: Annotated[str | None, typer.Option(help="Judge 2 endpoint, when it differs.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the API key.")] = None,
    workers: Annotated[int, typer.Option(help="Trajectories reviewed at once.")] = 4,
    spend_cap: Annotated[float | None, typer.Option(help="Hard cap in USD: no judge call starts once it is spent.")] = None,
    price_in: Annotated[float, typer.Option(help="USD per million input tokens.")] = 0.0,
    price_out: Annotated[float, typer.Option(help="USD per million output tokens.")] = 0.0,
    agree_pool: Annotated[Path | None, typer.Option("--pool", help="With `agree`: the pool both reviews cover (for span agreement).")] = None,
    include_suspicious: Annotated[bool, typer.Option(help="Also review successes the verifier found suspicious (by default they are rejected unreviewed, at no cost).")] = False,
    judge_context: Annotated[int, typer.Option(help="Tokens of prompt a judge reads at most (counted with tiktoken over the Qwen3.6 ranks). Judge 1 reads the whole trajectory; past this, only the middles of the longest tool outputs are elided, and the prompt says so. A trajectory whose task and agent text alone exceed it is rejected as too_long_for_judge and counted.")] = DEFAULT_JUDGE_CONTEXT,
) -> None:
    """Review verified trajectories with two LLM judges (or, without --judge1, the offline heuristic reviewer).

    `relearn review POOL -o reviews.jsonl --judge1 M --judge2 M` prints accepted, rejected by
    reason, errors by category, grounded/rejected spans and cost; a rerun costs nothing.
    Judge 1 reads the task statement, every step and the verifier's evidence whole (see --judge-context). Judge 2 quotes each confirmed error; every quote of an error must ground in the step's text, or the trajectory is rejected as no_valid_target.

    `relearn review agree A.jsonl B.jsonl --pool POOL` reports Cohen's kappa on decisions and
    categories, span F1 and the share of correct tokens wrongly excluded.
    """
    # The judges' SDKs take seconds to import: loaded only when reviewing.
    from harness.policies.base import PolicySpec
    from review.judges import judge_pair
    from review.run import review_pool

    if args[0] == "agree":
        if len(args) != 3 or agree_pool is None:
            err.print("[red]error:[/red] usage: relearn review agree REFERENCE OTHER --pool POOL")
            raise typer.Exit(EXIT_USAGE)
        agree(Path(args[1]), Path(args[2]), agree_pool)
        return
    if len(args) != 1:
        err.print("[red]error:[/red] review one pool at a time")
        raise typer.Exit(EXIT_USAGE)
    pool = Path(args[0])
    if not pool.is_file():
        err.print(f"[red]error:[/red] no such pool: {pool}")
        raise typer.Exit(EXIT_USAGE)
    def spec(model: str, role: str) -> PolicySpec:
        url = (judge2_base_url or base_url) if role == "judge2" else base_url
        return PolicySpec(kind=backend, model=model, base_url=url, api_key_env=api_key_env, price_in_per_mtok=price_in, price_out_per_mtok=price_out)  # type: ignore[arg-type]

    judges = judge_pair(judge1, judge2, spec, context=judge_context)
    total = sum(1 for _ in iter_lines(pool))
    progress = Progress(TextColumn("[bold]reviewing"), BarColumn(), MofNCompleteColumn(), TextColumn("${task.fields[spent]:.4f} spent"), TimeElapsedColumn(), console=err, transient=True)
    with progress:
        bar = progress.add_task("review", total=total, spent=0.0)

        def done(_review: Review | None, ledger: Ledger) -> None:
            progress.update(bar, advance=1, spent=ledger.spent_usd)

        summary, ledger = review_pool(pool, output, judges=judges, workers=workers, spend_cap_usd=spend_cap, on_done=done, include_suspicious=include_suspicious)
    show_problems("unreadable records", [str(e) for e in summary.unreadable])
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
