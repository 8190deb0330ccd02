"""``relearn view``: look at trajectories, what the judges excluded and why, in the
terminal (Textual) or printed (text, ANSI, HTML) for pipes, reports and CI. The flags are
``ViewOptions``' fields (``relearn.view.catalog``); printing is ``relearn.view.printing``'s."""

from __future__ import annotations

import sys

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, print_error, show_problems, show_warnings
from relearn.view.catalog import Catalog, Filter, UsageError, ViewOptions, open_catalog
from relearn.view.printing import print_views, reader_went_away, reviewed_none, selected_positions

DOC = """Browse a pool: each step's reasoning, text, tool calls and observation, with supervised text, excluded defects and context-only text told apart.

Keys: h/l step, H/L trajectory, 0/$ first/last step, j/k scroll, / search, n/N next/previous
hit, f filter, o expand long observations, ? help (with a legend of the colours), q quit. What the dataset excludes is struck through and labelled {#n category}: under the action scope a defect in a tool call strikes the whole call, and the message's header says it is partly or wholly excluded; each message lists its defects with the judge's description. The pool is indexed in the background (saved beside it as .POOL.view-index.jsonl),
so a pool of 100k trajectories opens at its first one at once.

--print writes the same rendering to stdout: text (excluded spans between [- and -]), ansi or
html (rich's export). Exit 1 when a printed record is unreadable (listed with file and line), the pool is empty, nothing matches or the reviews are another pool's; exit 2 for an --id, -n or --step that is not there; a reader that stops early (| head) ends it with exit 0.
"""


def run(options: ViewOptions) -> None:
    if not options.print and not sys.stdout.isatty():
        print_error("the viewer needs a terminal; use --print for pipes and files")
        raise typer.Exit(EXIT_USAGE)
    try:
        flt = options.chosen()
        catalog = open_catalog(options)
    except (ValueError, UsageError) as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    try:
        code = print_pool(catalog, flt, options) if options.print else browse(catalog, flt, options.search)
    finally:
        catalog.stop()  # before the interpreter exits: see RecordIndex.stop
    raise typer.Exit(code)


def print_pool(catalog: Catalog, flt: Filter, options: ViewOptions) -> int:
    """``--print``: the exit code. A filter or search that keeps nothing, an empty pool and
    reviews of another pool warn and exit 1; an id, record or step that is not there exits 2."""
    pool, trajectory_id, number, search = catalog.pool.path, options.trajectory_id, options.number, options.search
    positions = selected_positions(catalog, flt, options)
    if not positions:
        if trajectory_id or number:
            what = f"id {trajectory_id!r}" if trajectory_id else f"record {number} (the pool has {len(catalog.pool):,})"
            print_error(f"{pool}: no trajectory matches {what}")
            return EXIT_USAGE
        if not len(catalog.pool):
            show_warnings([f"{pool}: the pool is empty; nothing to show"])
        else:
            kept = [f"the filter {flt.text!r}" if not flt.empty else "", f"--search {search!r}" if search else ""]
            show_warnings([f"{pool}: no trajectory matches {' and '.join(x for x in kept if x)}"])
        return EXIT_PARTIAL
    try:
        printed = print_views(catalog, positions, options)
    except BrokenPipeError:
        reader_went_away()
        return EXIT_OK
    if printed.no_step and not printed.printed:
        print_error(f"{printed.no_step[0]}")
        return EXIT_USAGE
    review_errors = [str(e) for e in catalog.reviews.errors] if catalog.reviews is not None and catalog.reviews.ready.is_set() else []
    show_problems("unreadable", printed.unreadable + review_errors)
    show_problems(f"without step {options.step}", printed.no_step)
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
    app.command("view")(command(ViewOptions, run, doc=DOC))
