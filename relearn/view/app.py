"""The interactive viewer (Textual): one step of one trajectory at a time.

Keys follow mini-swe-agent's inspector: ``h``/``l`` (or arrows) step, ``H``/``L``
trajectory, ``0``/``$`` first/last step, ``j``/``k`` scroll, ``q`` quit; plus ``/`` search
(``n``/``N`` next/previous hit), ``f`` filter, ``o`` show long observations whole and
``?`` help. Only the trajectory on screen is read from the pool: the index fills in
the background and the filtered list grows with it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Input, Static

from records.pools import RecordError
from relearn.view.catalog import FILTER_HELP, Catalog, Filter
from relearn.view.marks import STYLES, RenderOptions
from relearn.view.screen import TrajectoryView, load_view

HELP = (
    """\
h / ←    previous step          l / →    next step
H        previous trajectory    L        next trajectory
0        first step (task)      $        last step (final patch)
j / ↓    scroll down            k / ↑    scroll up
/        search (text in steps, then in the following trajectories)
n / N    next / previous hit    f        filter (empty: show all)
o        show long observations whole, or collapse them again
?        this help              q        quit

Filter terms (all must hold): """
    + FILTER_HELP
)


@dataclass
class Hit:
    cursor: int
    step: int


class ViewerApp(App[None]):
    TITLE = "relearn view"
    CSS = """
    Screen { layout: vertical; }
    #header { height: auto; max-height: 7; padding: 0 1; background: $boost; }
    #body { height: 1fr; }
    #step { padding: 0 1; }
    #status { height: 1; padding: 0 1; background: $primary-background; }
    #prompt { display: none; height: 3; }
    """
    BINDINGS = [
        Binding("h,left", "step(-1)", "step", show=False),
        Binding("l,right", "step(1)", "step", show=False),
        Binding("H", "trajectory(-1)", "trajectory", show=False),
        Binding("L", "trajectory(1)", "trajectory", show=False),
        Binding("0", "first_step", show=False),
        Binding("dollar_sign", "last_step", show=False),
        Binding("j,down", "scroll(1)", show=False),
        Binding("k,up", "scroll(-1)", show=False),
        Binding("slash", "prompt('search')", show=False),
        Binding("f", "prompt('filter')", show=False),
        Binding("n", "search(1)", show=False),
        Binding("N", "search(-1)", show=False),
        Binding("o", "toggle_expand", show=False),
        Binding("question_mark", "help", show=False),
        Binding("escape", "close_prompt", show=False),
        Binding("q", "quit", show=False),
    ]

    def __init__(self, catalog: Catalog, *, flt: Filter | None = None, search: str | None = None) -> None:
        super().__init__()
        self.catalog = catalog
        self.filter = flt or Filter()
        self.query_text = search or ""
        self.matches: list[int] = []  # pool positions that pass the filter, in pool order
        self._examined = 0  # pool entries the filter has looked at
        self.cursor = 0
        self.step_number = 0
        self.view: TrajectoryView | None = None
        self.error: RecordError | None = None
        self.expand = False
        self.message = ""
        self.prompt_kind = ""
        self.showing_help = False
        self.first_shown: float | None = None  # perf_counter when the first trajectory was on screen
        self._shown_with: tuple[bool, bool] = (False, False)
        self._pending_search = bool(search)  # run once the first trajectory is on screen

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        with VerticalScroll(id="body"):
            yield Static(id="step")
        yield Input(id="prompt")
        yield Static(id="status")

    def on_mount(self) -> None:
        self._tick()
        self.set_interval(0.2, self._tick)

    # -- the filtered list grows with the index ----------------------------------------
    def _extend_matches(self) -> None:
        pool = self.catalog.pool
        if not self.catalog.ready_for(self.filter):
            return
        total = len(pool)
        for position in range(self._examined, total):
            if self.catalog.matches(position, self.filter):
                self.matches.append(position)
        self._examined = total

    def _tick(self) -> None:
        self._extend_matches()
        if self.view is None and self.error is None and self.matches:
            self._show()
        elif self.view is not None and self._shown_with != self._sources_ready():
            self._show(keep_scroll=True)  # reviews finished indexing: TER and labels may change
        if self._pending_search and self.view is not None:
            self._pending_search = False
            self.action_search(1)
        self._update_status()

    def _sources_ready(self) -> tuple[bool, bool]:
        reviews = self.catalog.reviews
        return (reviews is None or reviews.ready.is_set(), self.catalog.pool.ready.is_set())

    # -- showing ----------------------------------------------------------------------
    def _load(self, cursor: int) -> TrajectoryView:
        """Raises RecordError for an unreadable record."""
        return load_view(self.catalog, self.matches[cursor])

    def _show(self, *, keep_scroll: bool = False) -> None:
        header = self.query_one("#header", Static)
        body = self.query_one("#step", Static)
        self.showing_help = False
        if not self.matches:
            self.view, self.error = None, None
            header.update(Text("no trajectory to show", STYLES["warning"]))
            body.update(Text(f"No trajectory matches the filter {self.filter.text!r}." if not self.filter.empty else "The pool is empty."))
            return
        self.cursor = max(0, min(self.cursor, len(self.matches) - 1))
        try:
            self.view, self.error = self._load(self.cursor), None
        except RecordError as exc:
            self.view, self.error = None, exc
            header.update(Text(f"trajectory {self.matches[self.cursor] + 1:,}: unreadable record", STYLES["bad"]))
            body.update(Text(str(exc), STYLES["bad"]))
            return
        self._shown_with = self._sources_ready()
        self.step_number = max(0, min(self.step_number, len(self.view.steps) - 1))
        header.update(self.view.header())
        body.update(self.view.step(self.step_number, RenderOptions(expand=self.expand)))
        if not keep_scroll:
            self.query_one("#body", VerticalScroll).scroll_home(animate=False)
        if self.first_shown is None:
            self.first_shown = time.perf_counter()

    def _update_status(self) -> None:
        status = Text()
        pool = self.catalog.pool
        if self.matches:
            status.append(f"{self.cursor + 1:,}/{len(self.matches):,}", STYLES["title"])
        else:
            status.append("0/0", STYLES["title"])
        if not self.filter.empty:
            status.append(f" of {len(pool):,}")
        if not pool.ready.is_set():
            status.append(" (indexing…)", STYLES["hidden"])
        elif self.catalog.reviews is not None and not self.catalog.reviews.ready.is_set():
            status.append(" (indexing reviews…)", STYLES["hidden"])
        if self.view is not None:
            status.append(f" · step {self.step_number}/{len(self.view.steps) - 1}")
        if not self.filter.empty:
            status.append(f" · filter: {self.filter.text}", STYLES["name"])
        if self.query_text:
            status.append(f" · /{self.query_text}", STYLES["name"])
        if pool.errors:
            status.append(f" · {len(pool.errors)} unreadable", STYLES["bad"])
        if self.message:
            status.append(f" · {self.message}", STYLES["warning"])
        else:
            status.append(" · ? help", STYLES["context"])
        self.query_one("#status", Static).update(status)

    # -- actions ----------------------------------------------------------------------
    def action_step(self, delta: int) -> None:
        if self.view is None:
            return
        target = max(0, min(self.step_number + delta, len(self.view.steps) - 1))
        if target != self.step_number or self.showing_help:
            self.step_number = target
            self._show()
        self._update_status()

    def action_first_step(self) -> None:
        self.step_number = 0
        self._show()
        self._update_status()

    def action_last_step(self) -> None:
        self.step_number = len(self.view.steps) - 1 if self.view is not None else 0
        self._show()
        self._update_status()

    def action_trajectory(self, delta: int) -> None:
        self._extend_matches()
        target = max(0, min(self.cursor + delta, len(self.matches) - 1))
        if target != self.cursor:
            self.cursor, self.step_number = target, 0
            self._show()
        self.message = ""
        self._update_status()

    def action_scroll(self, lines: int) -> None:
        self.query_one("#body", VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_toggle_expand(self) -> None:
        self.expand = not self.expand
        self._show(keep_scroll=True)

    def action_help(self) -> None:
        if self.showing_help:
            self._show()
            return
        self.showing_help = True
        self.query_one("#step", Static).update(Text(HELP))

    def action_prompt(self, kind: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self.prompt_kind = kind
        prompt.placeholder = "search text (Enter: find, Esc: cancel)" if kind == "search" else f"filter: {FILTER_HELP}"
        prompt.value = self.query_text if kind == "search" else self.filter.text
        prompt.display = True
        prompt.focus()

    def action_close_prompt(self) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.display = False
        self.query_one("#body", VerticalScroll).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_close_prompt()
        if self.prompt_kind == "search":
            self.query_text = event.value.strip()
            if self.query_text:
                self.action_search(1)
        else:
            self.apply_filter(event.value)

    def apply_filter(self, text: str) -> None:
        try:
            flt = Filter.parse(text)
        except ValueError as exc:
            self.message = str(exc)
            self._update_status()
            return
        self.filter, self.matches, self._examined = flt, [], 0
        self.cursor = self.step_number = 0
        self.message = ""
        self._extend_matches()
        if not self.catalog.ready_for(flt):
            self.message = "waiting for the reviews index"
        self._show()
        self._update_status()

    # -- search -----------------------------------------------------------------------
    def action_search(self, direction: int) -> None:
        if not self.query_text or not self.matches:
            return
        self.message = "searching…"
        self._update_status()
        query, cursor, step = self.query_text, self.cursor, self.step_number
        self.run_worker(lambda: self._search(query, cursor, step, direction), thread=True, exclusive=True, group="search")

    def _search(self, query: str, cursor: int, step: int, direction: int) -> None:
        hit = self.find(query, cursor, step, direction)
        self.call_from_thread(self._search_done, hit)

    def find(self, query: str, cursor: int, step: int, direction: int) -> Hit | None:
        """The next step (in ``direction``) whose text contains ``query``, looking in the
        current trajectory first, then in the others, wrapping around."""
        needle = query.lower()
        # Records are searched in their JSON text first, which is cheap, and parsed only on a hit.
        escaped = json.dumps(query, ensure_ascii=False)[1:-1].lower().encode()
        count = len(self.matches)
        for offset in range(count + 1):
            current = (cursor + direction * offset) % count
            try:
                if offset and escaped not in self.catalog.pool.read(self.matches[current]).lower():
                    continue
                view = self.view if offset == 0 and self.view is not None else self._load(current)
            except RecordError:
                continue
            steps = range(len(view.steps))
            if offset == 0:
                steps = range(step + 1, len(view.steps)) if direction > 0 else range(step - 1, -1, -1)
            elif direction < 0:
                steps = range(len(view.steps) - 1, -1, -1)
            for number in steps:
                if needle in view.step_text(number).lower():
                    return Hit(current, number)
        return None

    def _search_done(self, hit: Hit | None) -> None:
        if hit is None:
            self.message = f"{self.query_text!r} not found"
        else:
            self.message = ""
            self.cursor, self.step_number = hit.cursor, hit.step
            self._show()
        self._update_status()
