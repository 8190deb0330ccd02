"""``relearn stats``: pool, review and dataset statistics as tables, JSON and PNG plots. The
flags are ``StatsOptions``' fields (``relearn.verbs.stats``); the tables are ``relearn.stats.tables``'."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from records.pool_index import PoolIndex, ReviewIndex
from records.pools import write_text_atomic
from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, show_problems, show_warnings
from relearn.ops.outputs import dataset_of_another_pool, empty_pool, reviews_of_another_pool
from relearn.ops.reporting import OpError
from relearn.ops.stats import check_options, context_tokenizer
from relearn.stats.compute import compute, context_section
from relearn.stats.plots import write_plots
from relearn.stats.tables import report_tables
from relearn.verbs.stats import StatsOptions
from relearn.view.catalog import DatasetInfo


def indexed(options: StatsOptions) -> tuple[list[PoolIndex], ReviewIndex | None]:
    """Every file's index, built (or read back) with a spinner each."""
    indexes = [PoolIndex(p, cache=not options.no_cache) for p in options.pools]
    reviews = ReviewIndex(options.reviews, cache=not options.no_cache) if options.reviews is not None else None
    columns = SpinnerColumn(), TextColumn("[bold]indexing {task.description}"), TextColumn("{task.completed:,} records")
    # (rich would leave an empty line on a pipe)
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as progress:
        for index in [*indexes, *([reviews] if reviews is not None else [])]:
            bar = progress.add_task(index.path.name, total=None)
            index.start()
            while not index.ready.wait(0.1):
                progress.update(bar, completed=len(index))
            index.join()
    return indexes, reviews


def context_report(options: StatsOptions, dataset: DatasetInfo | None) -> tuple[dict[str, Any], list[str]]:
    tokenizer, warnings = context_tokenizer(options, dataset)
    return context_section(options.pools, tokenizer, {"preserve_thinking": options.preserve_thinking}, options.per_turn), warnings


def run(options: StatsOptions) -> None:
    try:
        plan = check_options(options)
        indexes, reviews = indexed(options)
        report = compute(
            indexes, reviews, plan.dataset, ks=plan.ks, by=plan.by, windows=options.windows, window_size=options.window_size,
            step_windows_given=plan.step_windows,
        )  # fmt: skip
        template_warnings: list[str] = []
        if options.context:
            report["context"], template_warnings = context_report(options, plan.dataset)
    except OpError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    problems = [str(e) for index in [*indexes, *([reviews] if reviews is not None else [])] for e in index.errors]
    show_problems("unreadable records", problems)
    warnings = nothing_matched(report, options.pools, indexes, plan.dataset) + template_warnings
    if options.json_out == "-":
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        for table in report_tables(report, options.tasks):
            out.print(table)
        if options.json_out:
            write_text_atomic(Path(options.json_out), json.dumps(report, indent=1))
            out.print(f"statistics: {options.json_out}", highlight=False)
    if options.plots is not None:
        written = ", ".join(str(p) for p in write_plots(report, options.plots)) or "none (no TER with a training step, nothing excluded)"
        (err if options.json_out == "-" else out).print(f"plots: {written}", highlight=False)
    raise typer.Exit(EXIT_PARTIAL if show_warnings(warnings) or problems else EXIT_OK)


def nothing_matched(report: dict[str, Any], pools: list[Path], indexes: list[PoolIndex], dataset: DatasetInfo | None) -> list[str]:
    """The statistics of nothing: an empty pool, reviews or a dataset of another pool."""
    warnings = [empty_pool(path) for path, index in zip(pools, indexes, strict=True) if not len(index) and not index.errors]
    if not report["trajectories"]["total"]:
        return warnings
    named = pools[0] if len(pools) == 1 else "the pools"
    reviews = report.get("reviews")
    if reviews and not reviews["reviewed"] and reviews["not_in_pools"]:
        warnings.append(reviews_of_another_pool(Path(reviews["file"]), named, reviews["not_in_pools"]))
    data = report.get("dataset")
    if data and dataset is not None and dataset.by_trajectory and data["not_in_pools"] == len(dataset.by_trajectory):
        warnings.append(dataset_of_another_pool(Path(data["path"]), named, len(dataset.by_trajectory)))
    return warnings


def register(app: typer.Typer) -> None:
    app.command("stats")(command(StatsOptions, run))
