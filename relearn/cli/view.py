"""``relearn view``: look at trajectories, what the judges excluded and why, in the
terminal (Textual) or printed (text, ANSI, HTML) for pipes, reports and CI."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from records.pool_index import PoolIndex, ReviewIndex
from records.pools import RecordError
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, print_error, show_problems, show_warnings
from relearn.masks.compile import DEFECT_SCOPES, MaskOptions
from relearn.view.catalog import FILTER_HELP, Catalog, DatasetInfo, Filter, UsageError
from relearn.view.marks import RenderOptions, colour_legend
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


def open_catalog(pool: Path, reviews: Path | None, dataset: Path | None, *, cache: bool, scope: str | None = None) -> Catalog:
    """The pool, reviews and dataset, indexes started in the background; UsageError when
    an input cannot be used at all. ``scope`` is --defect-scope: given with a dataset, it
    must be the one the dataset was compiled under."""
    if not pool.is_file():
        raise UsageError(f"no such pool: {pool}")
    if reviews is not None and not reviews.is_file():
        raise UsageError(f"no such reviews file: {reviews}")
    if scope is not None and scope not in DEFECT_SCOPES:
        raise UsageError(f"--defect-scope {scope!r}: one of {', '.join(DEFECT_SCOPES)}")
    info = DatasetInfo.load(dataset) if dataset is not None else None
    if info is not None and scope is not None and info.stats.get("defect_scope", scope) != scope:
        raise UsageError(f"{info.path}: compiled under --defect-scope {info.stats['defect_scope']}, not {scope} (leave the option out)")
    review_index = ReviewIndex(reviews, cache=cache).start() if reviews is not None else None
    return Catalog(PoolIndex(pool, cache=cache).start(), review_index, info, scope=scope or MaskOptions.defect_scope)


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


class PipeConsole(Console):
    """rich's console, but a reader that stops early (``| head``) raises BrokenPipeError
    to the caller: rich's own handling exits 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


@dataclass
class Printed:
    """What ``print_views`` did: how many trajectories it printed (how many of them with a
    review), and what it could not print, located: unreadable records, and trajectories
    without the ``--step`` asked for."""

    printed: int = 0
    reviewed: int = 0  # printed with a review
    unreadable: list[str] = field(default_factory=list)
    no_step: list[str] = field(default_factory=list)


def print_views(catalog: Catalog, positions: list[int], fmt: Format, width: int | None, step: int | None, full: bool) -> Printed:
    """Print the trajectories (a reader that stops early raises BrokenPipeError)."""
    result = Printed()
    options = RenderOptions(markers=fmt is Format.text, expand=full, hint="--full shows all")
    if fmt is Format.html:
        console = Console(
            record=True, file=io.StringIO(), width=width or 100, force_terminal=True, color_system="truecolor", no_color=False
        )
    elif fmt is Format.ansi:
        console = PipeConsole(file=sys.stdout, width=width, force_terminal=True, color_system="truecolor", highlight=False)
    else:
        console = PipeConsole(file=sys.stdout, width=width, force_terminal=False, no_color=True, highlight=False, emoji=False)
    for position in positions:
        try:
            view = load_view(catalog, position)
        except RecordError as exc:
            result.unreadable.append(str(exc))
            continue
        if step is not None:
            if step >= len(view.steps):
                count = len(view.steps)
                result.no_step.append(
                    f"{catalog.pool.path}:{catalog.pool.entries[position].ref.line}: trajectory {view.trajectory.id}: "
                    f"no step {step} (the trajectory has {count} steps, 0 to {count - 1}: 0 is the task, {count - 1} the final patch)"
                )
                continue
            console.print(view.header())
            console.print(view.step(step, options))
        else:
            console.print(view.document(options))
        console.print()
        result.printed += 1
        result.reviewed += view.review is not None
    if result.printed:
        console.print(colour_legend(markers=fmt is Format.text))
    if fmt is Format.html:
        sys.stdout.write(console.export_html(inline_styles=True))
    sys.stdout.flush()  # a reader gone now raises here, not in Python's flush at exit
    return result


def reviewed_none(catalog: Catalog, printed: Printed) -> str:
    """A warning when reviews were given and review none of the pool's trajectories (a file
    of another pool); "" otherwise. Both indexes are finished only when none of the
    printed trajectories has a review, the one case that needs them."""
    reviews = catalog.reviews
    if reviews is None or printed.reviewed:
        return ""
    reviews.join()
    catalog.pool.join()
    if not catalog.reviews_of_another_pool():
        return ""
    return f"{reviews.path}: reviews none of the {len(catalog.pool):,} trajectories of {catalog.pool.path} (reviews of another pool?)"


def reader_went_away() -> None:
    """``relearn view --print | head``: the reader took what it wanted. stdout is pointed at
    devnull so that Python's own flush at exit does not fail a second time; exit 0 quietly,
    as a pipe's writer should (the caller exits 0)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (captured in tests)
        pass


def view_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", help="Pool of trajectories (.jsonl or .jsonl.zst).")],
    reviews: Annotated[Path | None, typer.Option("--reviews", "-r", help="Reviews JSONL: decisions and the defect spans to show.")] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            "--dataset", "-d", help="Dataset folder written by `relearn masks`: exact TER in tokens, and what it excludes is struck."
        ),
    ] = None,
    defect_scope: Annotated[
        str | None,
        typer.Option(
            "--defect-scope",
            help=f"Strike what `relearn masks --defect-scope` excludes: action (a defect in a tool call or a text agent's action excludes the whole call) or minimal (the quote). Default: the dataset's with -d, else {MaskOptions.defect_scope}.",
        ),
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
    step: Annotated[int | None, typer.Option(min=0, help="With --print: only this step (0 = task; the last is the final patch).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="With --print: at most this many trajectories.")] = 1,
    full: Annotated[bool, typer.Option(help="With --print: long observations whole, not collapsed.")] = False,
    width: Annotated[int | None, typer.Option(min=40, help="With --print: columns (default: the terminal's, or 80).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the saved index (.POOL.view-index.jsonl).")] = False,
) -> None:
    """Browse a pool: each step's reasoning, text, tool calls and observation, with supervised text, excluded defects and context-only text told apart.

    Keys: h/l step, H/L trajectory, 0/$ first/last step, j/k scroll, / search, n/N next/previous
    hit, f filter, o expand long observations, ? help (with a legend of the colours), q quit. What the dataset excludes is struck through and labelled {#n category}: under the action scope a defect in a tool call strikes the whole call, and the message's header says it is partly or wholly excluded; each message lists its defects with the judge's description. The pool is indexed in the background (saved beside it as .POOL.view-index.jsonl),
    so a pool of 100k trajectories opens at its first one at once.

    --print writes the same rendering to stdout: text (excluded spans between [- and -]), ansi or
    html (rich's export). Exit 1 when a printed record is unreadable (listed with file and line), the pool is empty, nothing matches or the reviews are another pool's; exit 2 for an --id, -n or --step that is not there; a reader that stops early (| head) ends it with exit 0.
    """
    if not print_ and not sys.stdout.isatty():
        print_error("the viewer needs a terminal; use --print for pipes and files")
        raise typer.Exit(EXIT_USAGE)
    try:
        flt = build_filter(filter_, resolved, decision, category, ter)
        catalog = open_catalog(pool, reviews, dataset, cache=not no_cache, scope=defect_scope)
    except (ValueError, UsageError) as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    try:
        if print_:
            code = print_pool(catalog, flt, search, PrintChoice(trajectory_id, number, limit, step, fmt, width, full))
        else:
            code = browse(catalog, flt, search)
    finally:
        catalog.stop()  # before the interpreter exits: see RecordIndex.stop
    raise typer.Exit(code)


@dataclass
class PrintChoice:
    """What ``--print`` prints and how."""

    trajectory_id: str | None
    number: int | None
    limit: int
    step: int | None
    fmt: Format
    width: int | None
    full: bool


def print_pool(catalog: Catalog, flt: Filter, search: str | None, choice: PrintChoice) -> int:
    """``--print``: the exit code. A filter or search that keeps nothing, an empty pool and
    reviews of another pool warn and exit 1; an id, record or step that is not there exits 2."""
    pool = catalog.pool.path
    positions = selected_positions(catalog, flt, choice.trajectory_id, choice.number, choice.limit, search)
    if not positions:
        if choice.trajectory_id or choice.number:
            what = (
                f"id {choice.trajectory_id!r}" if choice.trajectory_id else f"record {choice.number} (the pool has {len(catalog.pool):,})"
            )
            print_error(f"{pool}: no trajectory matches {what}")
            return EXIT_USAGE
        if not len(catalog.pool):
            show_warnings([f"{pool}: the pool is empty; nothing to show"])
        else:
            kept = [f"the filter {flt.text!r}" if not flt.empty else "", f"--search {search!r}" if search else ""]
            show_warnings([f"{pool}: no trajectory matches {' and '.join(x for x in kept if x)}"])
        return EXIT_PARTIAL
    try:
        printed = print_views(catalog, positions, choice.fmt, choice.width, choice.step, choice.full)
    except BrokenPipeError:
        reader_went_away()
        return EXIT_OK
    if printed.no_step and not printed.printed:
        print_error(f"{printed.no_step[0]}")
        return EXIT_USAGE
    review_errors = [str(e) for e in catalog.reviews.errors] if catalog.reviews is not None and catalog.reviews.ready.is_set() else []
    show_problems("unreadable", printed.unreadable + review_errors)
    show_problems(f"without step {choice.step}", printed.no_step)
    foreign = show_warnings([w for w in [reviewed_none(catalog, printed)] if w])
    return EXIT_PARTIAL if printed.unreadable or review_errors or printed.no_step or foreign else EXIT_OK


def browse(catalog: Catalog, flt: Filter, search: str | None) -> int:
    """The interactive viewer; after it, the unreadable records and what matched nothing."""
    from relearn.view.app import ViewerApp  # Textual loads only for the interactive viewer

    ViewerApp(catalog, flt=flt, search=search).run()
    problems = [str(e) for e in catalog.pool.errors] + ([str(e) for e in catalog.reviews.errors] if catalog.reviews is not None else [])
    show_problems("unreadable records", problems)
    warnings = []
    if catalog.pool.ready.is_set() and not len(catalog.pool):
        warnings.append(f"{catalog.pool.path}: the pool is empty")
    elif catalog.reviews_of_another_pool():
        warnings.append(f"{catalog.reviews.path}: reviews none of the trajectories of {catalog.pool.path} (reviews of another pool?)")  # type: ignore[union-attr]
    return EXIT_PARTIAL if show_warnings(warnings) or problems else EXIT_OK


def register(app: typer.Typer) -> None:
    app.command("view")(view_command)
