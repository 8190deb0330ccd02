"""``relearn view --print``: the trajectories a filter, a search, ``--id`` or ``-n`` select,
rendered as the viewer shows them (``screen``) to stdout as text, ANSI or HTML."""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass, field

from rich.console import Console

from records.pools import RecordError
from relearn.view.catalog import Catalog, Filter, ViewOptions
from relearn.view.marks import RenderOptions, colour_legend
from relearn.view.screen import load_view


def contains(catalog: Catalog, position: int, text: str) -> bool:
    """Whether any step of the trajectory shows ``text`` (case-insensitive)."""
    if not catalog.may_contain(position, text):
        return False
    try:
        view = load_view(catalog, position)
    except RecordError:
        return False
    return any(text.lower() in view.step_text(n).lower() for n in range(len(view.steps)))


def selected_positions(catalog: Catalog, flt: Filter, options: ViewOptions) -> list[int]:
    """Positions to print, scanning only as far as needed."""
    number, trajectory_id, search = options.number, options.trajectory_id, options.search
    if not catalog.ready_for(flt) and catalog.reviews is not None:
        catalog.reviews.join()
    out: list[int] = []
    position = (number - 1) if number is not None else 0
    while len(out) < options.limit and catalog.pool.wait(position + 1):
        if trajectory_id is not None and catalog.summary(position).id != trajectory_id:
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


def print_views(catalog: Catalog, positions: list[int], options: ViewOptions) -> Printed:
    """Print the trajectories (a reader that stops early raises BrokenPipeError)."""
    result, fmt, width, step = Printed(), options.format, options.width, options.step
    rendering = RenderOptions(markers=fmt == "text", expand=options.full, hint="--full shows all")
    if fmt == "html":
        console = Console(
            record=True, file=io.StringIO(), width=width or 100, force_terminal=True, color_system="truecolor", no_color=False
        )
    elif fmt == "ansi":
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
            console.print(view.step(step, rendering))
        else:
            console.print(view.document(rendering))
        console.print()
        result.printed += 1
        result.reviewed += view.review is not None
    if result.printed:
        console.print(colour_legend(markers=fmt == "text"))
    if fmt == "html":
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
