"""``relearn review bench`` (rendering; the work is ``relearn.ops.review_bench``) and
``relearn review label``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from records.pools import RecordError
from records.review import Review, iter_reviews
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, show_problems
from relearn.ops.reporting import OpError, RichReporter
from relearn.ops.review_bench import SHOWN, BenchOptions, BenchSummary, fmt, run_review_bench
from review.bench.cases import BenchCase


def bench(options: BenchOptions) -> int:
    """``relearn review bench [BENCH] -o DIR``: run the bench, print its figures; the exit code."""
    try:
        summary = run_review_bench(options, RichReporter(err))
    except OpError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    out.print(bench_table(summary, options.output))
    out.print(f"figures per kind and per case: {options.output / 'bench.md'}, {options.output / 'bench.json'}")
    return EXIT_PARTIAL if summary.partial else EXIT_OK


def bench_table(summary: BenchSummary, directory: Path) -> Table:
    show_problems("unreadable cases", summary.case_problems)
    show_problems("unreadable reviews", summary.unreadable)
    show_problems("not reviewed", summary.not_reviewed)
    table = Table(title=f"relearn review bench: {summary.cases} cases, {summary.reviewer} -> {directory}", show_header=False)
    for key, label in SHOWN:
        table.add_row(label, fmt(summary.result["overall"][key]))
    return table


def label_from_options(pool: Path, reviews_path: Path, *, output: Path) -> None:
    """``relearn review label POOL REVIEWS -o CASES.jsonl``: every trajectory of POOL that REVIEWS
    reviews becomes a labelled case whose gold is that review (its latest line). Exits 0 when
    every one converted, 1 when some were refused (listed), 2 when none was."""
    from records.pools import read_trajectories_lenient
    from review.bench.cases import case_from_review, write_cases

    for path in (pool, reviews_path):
        if not path.is_file():
            print_error(f"no such file: {path}")
            raise typer.Exit(EXIT_USAGE)
    problems: list[str] = []
    latest: dict[str, Review] = {}
    for item in iter_reviews(reviews_path):
        if isinstance(item, Review):
            latest[item.trajectory_id] = item
        else:
            problems.append(str(item))
    unreadable: list[RecordError] = []
    cases: list[BenchCase] = []
    for trajectory in read_trajectories_lenient(pool, unreadable):
        review = latest.get(trajectory.id)
        if review is None:
            continue
        try:
            cases.append(case_from_review(trajectory, review))
        except ValueError as exc:
            problems.append(f"{reviews_path}: trajectory {trajectory.id}: {exc}")
    problems += [str(e) for e in unreadable]
    show_problems("not labelled", problems)
    if not cases:
        print_error("no reviewed trajectory could be labelled")
        raise typer.Exit(EXIT_USAGE)
    write_cases(output, cases)
    out.print(f"{len(cases)} labelled cases -> {output} (score a reviewer on them: relearn review bench {output} -o DIR)")
    raise typer.Exit(EXIT_PARTIAL if problems else EXIT_OK)


__all__ = ["BenchCase", "bench", "label_from_options"]
