"""``relearn view``: look at trajectories, what the judges excluded and why, in the
terminal (Textual) or printed (text, ANSI, HTML) for pipes, reports and CI."""

from __future__ import annotations

import io
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from records.pool_index import PoolIndex, ReviewIndex
from records.pools import RecordError
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, show_problems
from relearn.view.catalog import FILTER_HELP, Catalog, DatasetInfo, Filter, UsageError
from relearn.view.marks import RenderOptions
from relearn.view.screen import load_view


class Format(StrEnum):
    text = "text"
    ansi = "ansi"
    html = "html"


def build_filter(expression: str, resolved: bool | None, decision: str | None, category: str | None, ter: str | None) -> Filter:
    terms = [expression] if expression else []
    if resolved is not None:
        terms.append("resolved" if resolved else "unresolved")
    if decision:
        terms.append(f"decision={decision}")
    if category:
        terms.append(f"category={category}")
    if ter:
        terms.append(f"ter={ter}")
    return Filter.parse(" ".join(terms))


def open_catalog(pool: Path, reviews: Path | None, dataset: Path | None, *, cache: bool) -> Catalog:
    """The pool, reviews and dataset, indexes started in the background; UsageError when
    an input cannot be used at all."""
    if not pool.is_file():
        raise UsageError(f"no such pool: {pool}")
    if reviews is not None and not reviews.is_file():
        raise UsageError(f"no such reviews file: {reviews}")
    info = DatasetInfo.load(dataset) if dataset is not None else None
    review_index = ReviewIndex(reviews, cache=cache).start() if reviews is not None else None
    return Catalog(PoolIndex(pool, cache=cache).start(), review_index, info)


def contains(catalog: Catalog, position: int, text: str) -> bool:
    """Whether any step of the trajectory shows ``text`` (case-insensitive)."""
    escaped = json.dumps(text, ensure_ascii=False)[1:-1].lower().encode()
    if escaped not in catalog.pool.read(position).lower():
        return False  # the cheap test on the record's JSON text spares most parses
    try:
        view = load_view(catalog, position)
    except RecordError:
        return False
    return any(text.lower() in view.step_text(n).lower() for n in range(len(view.steps)))


def selected_positions(
    catalog: Catalog, flt: Filter, trajectory_id: str | None, number: int | None, limit: int, search: str | None = None
) -> list[int]:
    """Positions to print, scanning only as far as needed."""
    pool = catalog.pool
    if not catalog.ready_for(flt) and catalog.reviews is not None:
        catalog.reviews.join()
    out: list[int] = []
    position = (number - 1) if number is not None else 0
    while len(out) < limit and pool.wait(position + 1):
        summary = catalog.summary(position)
        if trajectory_id is not None and summary.id != trajectory_id:
            position += 1
            continue
        if catalog.matches(position, flt) and (not search or contains(catalog, position, search)):
            out.append(position)
        if number is not None or trajectory_id is not None:
            break
        position += 1
    return out


def print_views(catalog: Catalog, positions: list[int], fmt: Format, width: int | None, step: int | None, full: bool) -> list[str]:
    """Print the trajectories; returns the located errors of unreadable ones."""
    problems: list[str] = []
    options = RenderOptions(markers=fmt is Format.text, expand=full, hint="--full shows all")
    if fmt is Format.html:
        console = Console(
            record=True, file=io.StringIO(), width=width or 100, force_terminal=True, color_system="truecolor", no_color=False
        )
    elif fmt is Format.ansi:
        console = Console(file=sys.stdout, width=width, force_terminal=True, color_system="truecolor", highlight=False)
    else:
        console = Console(file=sys.stdout, width=width, force_terminal=False, no_color=True, highlight=False, emoji=False)
    for position in positions:
        try:
            view = load_view(catalog, position)
        except RecordError as exc:
            problems.append(str(exc))
            continue
        if step is not None:
            if not 0 <= step < len(view.steps):
                problems.append(f"{view.trajectory.id}: no step {step} (steps 0 to {len(view.steps) - 1})")
                continue
            console.print(view.header())
            console.print(view.step(step, options))
        else:
            console.print(view.document(options))
        console.print()
    if fmt is Format.html:
        sys.stdout.write(console.export_html(inline_styles=True))
    return problems


def view_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", help="Pool of trajectories (.jsonl or .jsonl.zst).")],
    reviews: Annotated[Path | None, typer.Option("--reviews", "-r", help="Reviews JSONL: decisions and the defect spans to show.")] = None,
    dataset: Annotated[
        Path | None, typer.Option("--dataset", "-d", help="Dataset folder written by `relearn masks` (exact TER in tokens).")
    ] = None,
    filter_: Annotated[str, typer.Option("--filter", "-f", help=f"Only trajectories where all terms hold: {FILTER_HELP}.")] = "",
    resolved: Annotated[
        bool | None, typer.Option("--resolved/--unresolved", help="Only verified-positive (or only not) trajectories.")
    ] = None,
    decision: Annotated[str | None, typer.Option(help="Only this review decision: accept, reject or none.")] = None,
    category: Annotated[str | None, typer.Option(help="Only trajectories with a defect of this category (comma list).")] = None,
    ter: Annotated[str | None, typer.Option(help="Only this TER range, e.g. 0.05..0.2 or 5%..20%.")] = None,
    search: Annotated[
        str | None,
        typer.Option("--search", "-s", help="Open at the first step containing this text (with --print: only trajectories containing it)."),
    ] = None,
    print_: Annotated[bool, typer.Option("--print", "-p", help="Print instead of opening the viewer.")] = False,
    fmt: Annotated[
        Format, typer.Option("--format", help="With --print: text (excluded spans between [- and -]), ansi, or html.")
    ] = Format.text,
    trajectory_id: Annotated[str | None, typer.Option("--id", help="With --print: the trajectory with this id.")] = None,
    number: Annotated[
        int | None, typer.Option("--number", "-n", min=1, help="With --print: the N-th record of the pool (1-based).")
    ] = None,
    step: Annotated[int | None, typer.Option(help="With --print: only this step (0 = task; the last is the final patch).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="With --print: at most this many trajectories.")] = 1,
    full: Annotated[bool, typer.Option(help="With --print: long observations whole, not collapsed.")] = False,
    width: Annotated[int | None, typer.Option(min=40, help="With --print: columns (default: the terminal's, or 80).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the saved index (.POOL.view-index.jsonl).")] = False,
) -> None:
    """Browse a pool: each step's reasoning, text, tool calls and observation, with supervised text, excluded defects and context-only text told apart.

    Keys: h/l step, H/L trajectory, 0/$ first/last step, j/k scroll, / search, n/N next/previous
    hit, f filter, o expand long observations, ? help, q quit. Excluded defect spans are struck
    through and labelled {#n category}; each message lists its defects with the judge's
    description. The pool is indexed in the background (saved beside it as .POOL.view-index.jsonl),
    so a pool of 100k trajectories opens at its first one at once.

    --print writes the same rendering to stdout: text (excluded spans between [- and -]), ansi or
    html (rich's export). Exit 1 when a printed record is unreadable (listed with file and line).
    """
    try:
        flt = build_filter(filter_, resolved, decision, category, ter)
        catalog = open_catalog(pool, reviews, dataset, cache=not no_cache)
    except (ValueError, UsageError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    if print_:
        positions = selected_positions(catalog, flt, trajectory_id, number, limit, search)
        if not positions:
            what = f"id {trajectory_id!r}" if trajectory_id else f"record {number}" if number else "the filter"
            err.print(f"no trajectory in {pool} matches {what}", highlight=False)
            raise typer.Exit(EXIT_USAGE if trajectory_id or number else EXIT_OK)
        problems = print_views(catalog, positions, fmt, width, step, full)
        review_errors = [str(e) for e in catalog.reviews.errors] if catalog.reviews is not None and catalog.reviews.ready.is_set() else []
        show_problems("unreadable", problems + review_errors)
        raise typer.Exit(EXIT_PARTIAL if problems or review_errors else EXIT_OK)
    if not sys.stdout.isatty():
        err.print("[red]error:[/red] the viewer needs a terminal; use --print for pipes and files")
        raise typer.Exit(EXIT_USAGE)
    from relearn.view.app import ViewerApp  # Textual loads only for the interactive viewer

    ViewerApp(catalog, flt=flt, search=search).run()
    problems = [str(e) for e in catalog.pool.errors] + ([str(e) for e in catalog.reviews.errors] if catalog.reviews is not None else [])
    show_problems("unreadable records", problems)
    raise typer.Exit(EXIT_PARTIAL if problems else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("view")(view_command)
