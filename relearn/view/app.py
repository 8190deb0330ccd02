"""The interactive viewer (Textual): one step of one trajectory at a time.

Keys follow mini-swe-agent's inspector: ``h``/``l`` (or arrows) step, ``H``/``L``
trajectory, ``0``/``$`` first/last step, ``j``/``k`` scroll, ``q`` quit; plus ``/`` search
(``n``/``N`` next/previous hit), ``f`` filter, ``o`` show long observations whole and
``?`` help. Only the trajectory on screen is read from the pool: the index fills in
the background and the filtered list grows with it.

Search hits are highlighted in the step shown (``hits``); ``n``/``N`` go from hit to hit in
the step, then to the next step with one, and past the last hit wrap to the first,
saying so in the status line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Input, Static

from records.pools import RecordError
from relearn.view.catalog import FILTER_HELP, Catalog, Filter
from relearn.view.hits import current_line, highlight
from relearn.view.marks import STYLES, RenderOptions, colour_legend
from relearn.view.screen import TrajectoryView, load_view

HELP = (
    """\
h / ←    previous step          l / →    next step
H        previous trajectory    L        next trajectory
0        first step (task)      $        last step (final patch)
j / ↓    scroll down            k / ↑    scroll up
/        search (text in steps, then in the following trajectories): hits
         highlighted, the current one in cyan; an empty search clears them
n / N    next / previous hit; past the last (first) hit the search wraps
         to the first (last) and the status line says so
f        filter (empty: show all)
o        show long observations whole, or collapse them again
?        this help (Esc or ? closes it)     q        quit

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
    #header-box { height: auto; max-height: 50%; background: $boost; }
    #header { padding: 0 1; }
    #body { height: 1fr; }
    #step { padding: 0 1; }
    #status { height: auto; padding: 0 1; background: $primary-background; }
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
        self.hit: int | None = None  # the current search hit among those of the step shown
        self.hit_count = 0  # search hits in the step shown
        self.foreign_reviews = False  # reviews given that review none of the pool's trajectories
        self._reviews_checked = False
        self._said_empty = False  # the empty pool's (or empty filter's) message is on screen
        self.first_shown: float | None = None  # perf_counter when the first trajectory was on screen
        self._shown_with: tuple[bool, bool] = (False, False)
        self._pending_search = bool(search)  # run once the first trajectory is on screen

    def compose(self) -> ComposeResult:
        # The header and the status line grow to hold what they say, wrapped at any width;
        # a header longer than half the screen scrolls in its box rather than being cut.
        with VerticalScroll(id="header-box"):
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
        if not self.is_running:  # shutting down: the widgets this tick updates may be gone
            return
        self._extend_matches()
        if self.view is None and self.error is None and self.matches:
            self._show()
        elif not self.matches and not self._said_empty and self.catalog.pool.ready.is_set() and self.catalog.ready_for(self.filter):
            self._show()  # an empty pool, or a filter that keeps nothing, says so
        if not self._reviews_checked and all(self._sources_ready()):
            self._reviews_checked = True
            self.foreign_reviews = self.catalog.reviews_of_another_pool()
        elif self.view is not None and not self.showing_help and self._shown_with != self._sources_ready():
            # Reviews finished indexing: TER and labels may change. The help stays open until
            # it is closed, which shows the step anew.
            self._show(keep_scroll=True)
        if self._pending_search and self.view is not None:
            self._pending_search = False
            self._start_search(self.cursor, -1, 1)  # from before the task: --search may hit it
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
        self._said_empty = False
        if not self.matches:
            self.view, self.error = None, None
            pool = self.catalog.pool
            self._said_empty = pool.ready.is_set()
            if not pool.ready.is_set():
                header.update(Text(f"reading {pool.path}…", STYLES["hidden"]))
                body.update(Text(""))
            elif not len(pool):
                header.update(Text("the pool is empty", STYLES["warning"]))
                body.update(Text(f"{pool.path} holds no trajectory. q quits."))
            else:
                header.update(Text("no trajectory to show", STYLES["warning"]))
                body.update(
                    Text(f"None of the {len(pool):,} trajectories matches the filter {self.filter.text!r} (f changes it; empty shows all).")
                )
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
        step = self._render_step()
        body.update(step)
        scroll = self.query_one("#body", VerticalScroll)
        if not keep_scroll:
            scroll.scroll_home(animate=False)
        if self.hit is not None and self.hit_count:
            line = current_line(self.console, step, body.content_region.width)
            if line is not None:  # the current hit in view, with a little context above it
                self.call_after_refresh(scroll.scroll_to, y=max(0, line - 3), animate=False)
        if self.first_shown is None:
            self.first_shown = time.perf_counter()

    def _render_step(self) -> Group:
        """The step on screen with the search hits highlighted; a hit of -1 (a search that
        came backwards) becomes the step's last."""
        assert self.view is not None
        options = RenderOptions(expand=self.expand)
        step = self.view.step(self.step_number, options)
        self.hit_count = highlight(step.renderables, self.query_text, self.hit if self.hit is None or self.hit >= 0 else None)
        if self.hit is not None and self.hit < 0:
            self.hit = max(0, self.hit_count - 1)
            step = self.view.step(self.step_number, options)
            highlight(step.renderables, self.query_text, self.hit)
        return step

    def _update_status(self) -> None:
        status = Text()
        pool = self.catalog.pool
        if self.matches:
            status.append(f"{self.cursor + 1:,}/{len(self.matches):,}", STYLES["title"])
        elif not pool.ready.is_set():
            status.append("0", STYLES["title"])
        else:
            status.append("empty pool" if not len(pool) else "no match", STYLES["warning"])
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
            if self.hit is not None and self.hit_count:
                status.append(f" {self.hit + 1}/{self.hit_count} here", STYLES["name"])
        if self.foreign_reviews:
            status.append(" · the reviews match no trajectory of this pool", STYLES["warning"])
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
            self.step_number, self.hit = target, None
            self._show()
        self._update_status()

    def action_first_step(self) -> None:
        self.step_number, self.hit = 0, None
        self._show()
        self._update_status()

    def action_last_step(self) -> None:
        self.step_number = len(self.view.steps) - 1 if self.view is not None else 0
        self.hit = None
        self._show()
        self._update_status()

    def action_trajectory(self, delta: int) -> None:
        self._extend_matches()
        target = max(0, min(self.cursor + delta, len(self.matches) - 1))
        if target != self.cursor:
            self.cursor, self.step_number, self.hit = target, 0, None
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
        self.query_one("#step", Static).update(Text.assemble(HELP, "\n\n", colour_legend()))

    def action_prompt(self, kind: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self.prompt_kind = kind
        prompt.placeholder = "search text (Enter: find, Esc: cancel)" if kind == "search" else f"filter: {FILTER_HELP}"
        prompt.value = self.query_text if kind == "search" else self.filter.text
        prompt.display = True
        prompt.focus()

    def action_close_prompt(self) -> None:
        """Esc: closes the prompt, else the help."""
        prompt = self.query_one("#prompt", Input)
        if not prompt.display and self.showing_help:
            self._show(keep_scroll=True)
            return
        prompt.display = False
        self.query_one("#body", VerticalScroll).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_close_prompt()
        if self.prompt_kind == "search":
            self.query_text, self.hit, self.message = event.value.strip(), None, ""
            if self.query_text:
                self.action_search(1)
            elif self.view is not None:
                self._show(keep_scroll=True)  # an empty search clears the highlights
            self._update_status()
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
        if not self.query_text:
            self.message = "no search yet: / searches"
            self._update_status()
            return
        if not self.matches:
            return
        if self.view is not None and self.hit is not None and not self.showing_help and 0 <= self.hit + direction < self.hit_count:
            self.hit += direction  # the next hit is in this step
            self.message = ""
            self._show(keep_scroll=True)
            self._update_status()
            return
        self._start_search(self.cursor, self.step_number, direction)

    def _start_search(self, cursor: int, step: int, direction: int) -> None:
        self.message = "searching…"
        self._update_status()
        query = self.query_text
        self.run_worker(lambda: self._search(query, cursor, step, direction), thread=True, exclusive=True, group="search")

    def _search(self, query: str, cursor: int, step: int, direction: int) -> None:
        hit = self.find(query, cursor, step, direction)
        self.call_from_thread(self._search_done, hit, (cursor, step), direction)

    def find(self, query: str, cursor: int, step: int, direction: int) -> Hit | None:
        """The next step (in ``direction``) whose text contains ``query``, looking in the
        current trajectory first, then in the others, wrapping around."""
        needle = query.lower()
        count = len(self.matches)
        for offset in range(count + 1):
            current = (cursor + direction * offset) % count
            try:
                # Records are searched in their JSON text first, which is cheap, and parsed only on a hit.
                if offset and not self.catalog.may_contain(self.matches[current], query):
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

    def _search_done(self, hit: Hit | None, start: tuple[int, int], direction: int) -> None:
        query = self.query_text
        if hit is None:
            self.message = f"{query!r} not found"
            self._update_status()
            return
        self.cursor, self.step_number = hit.cursor, hit.step
        self.hit = 0 if direction > 0 else -1  # the step's first hit, or coming back its last
        self._show()
        at = (hit.cursor, hit.step)
        notes = []
        if at == start and self.hit_count <= 1:
            notes.append(f"the only match for {query!r}")
        elif (at <= start) if direction > 0 else (at >= start):
            notes.append(
                f"no more matches for {query!r}: wrapped to the first"
                if direction > 0
                else f"no earlier match for {query!r}: wrapped to the last"
            )
        if not self.hit_count:
            notes.append(f"{query!r} is in collapsed text here (o shows it)")
        self.message = "; ".join(notes)
        self._update_status()
