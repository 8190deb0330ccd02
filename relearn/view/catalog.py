"""A pool joined with its reviews and its compiled dataset, and the filters over it.

TER comes from the dataset (``relearn masks``' ``stats.json``: exact token counts) when
one is given. Without a dataset it is estimated from characters: defect characters over
the characters of generated assistant fields; it is always labelled as such.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from records.pool_index import PoolIndex, ReviewIndex, ReviewSummary, TrajectorySummary
from records.pools import open_bytes_read
from records.review import CATEGORIES
from relearn.masks.compile import CompileOptions
from relearn.masks.scopes import DefectScope
from relearn.options import option

PER_TURN_SUFFIX = re.compile(r"#m\d+$")


class UsageError(Exception):
    """Unusable input: nothing can be shown (exit 2)."""


@dataclass(slots=True)
class Tokens:
    eligible: int = 0
    excluded: int = 0
    tokens: int = 0
    samples: int = 0
    excluded_by_scope: dict[str, int] = field(default_factory=dict)  # under each defect scope (datasets since masks BUILD 4)
    context: str = ""  # the rule that decided its context, "... as sent" when compiled so (BUILD 5)
    targets: str = ""  # where its generated tokens came from (relearn.masks.tokens.TARGETS; BUILD 5)

    @property
    def ter(self) -> float:
        return self.excluded / self.eligible if self.eligible else 0.0


@dataclass
class DatasetInfo:
    """What ``relearn masks`` wrote to ``stats.json``: totals, reasons and per-sample TER."""

    path: Path
    stats: dict[str, Any]
    by_trajectory: dict[str, Tokens] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: str | Path) -> DatasetInfo:
        folder = Path(folder)
        path = folder / "stats.json" if folder.is_dir() else folder
        if not path.is_file():
            raise UsageError(f"{path}: no dataset statistics here (a folder written by `relearn masks`)")
        try:
            stats = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UsageError(f"{path}: not JSON: {exc}") from None
        samples = stats.get("per_sample") if isinstance(stats, dict) else None
        if not isinstance(samples, list):
            raise UsageError(f"{path}: per_sample: missing (not written by `relearn masks`?)")
        info = cls(path, stats)
        per_turn = bool(stats.get("per_turn"))
        for number, sample in enumerate(samples):
            try:
                sample_id = str(sample["sample_id"])
                # Its trajectory: named since the per-sample records carry it (a context reset
                # gives ``#r`` samples too); before, only a per-turn suffix could be taken off.
                trajectory_id = str(sample.get("trajectory_id") or (PER_TURN_SUFFIX.sub("", sample_id) if per_turn else sample_id))
                tokens = info.by_trajectory.setdefault(trajectory_id, Tokens())
                tokens.eligible += int(sample["eligible"])
                tokens.excluded += int(sample["excluded"])
                tokens.tokens += int(sample.get("tokens", 0))
                tokens.samples += 1
                tokens.context = str(sample.get("context") or tokens.context)
                tokens.targets = str(sample.get("targets") or tokens.targets)
                for scope, count in (sample.get("excluded_by_scope") or {}).items():
                    tokens.excluded_by_scope[scope] = tokens.excluded_by_scope.get(scope, 0) + int(count)
            except (KeyError, TypeError, ValueError) as exc:
                raise UsageError(f"{path}: per_sample[{number}]: {type(exc).__name__}: {exc}") from None
        return info


# -- filters -------------------------------------------------------------------------

TERM = re.compile(r"^(?P<key>[a-z_]+)\s*(?P<op>=|>=|<=|>|<)\s*(?P<value>.+)$")
FILTER_HELP = (
    "resolved | unresolved | decision=accept|reject|none | category=C[,C] (has a defect of C; none = no defects) | "
    "primary=C | ter=LO..HI or ter>X, ter<X (0-1 or %) | exit=STATUS[,..] | task=TEXT | step=LO..HI | error"
)


@dataclass
class Filter:
    """Conditions that must all hold; written as space-separated terms (FILTER_HELP)."""

    resolved: bool | None = None
    decisions: set[str] | None = None
    categories: set[str] | None = None
    primary: set[str] | None = None
    ter: tuple[float | None, float | None] | None = None
    exit: set[str] | None = None
    task: str | None = None
    step: tuple[float | None, float | None] | None = None
    errors_only: bool = False
    text: str = ""

    @property
    def empty(self) -> bool:
        return not self.text.strip()

    @property
    def needs_reviews(self) -> bool:
        return bool(self.decisions or self.categories or self.primary)

    @classmethod
    def parse(cls, text: str) -> Filter:
        out = cls(text=text.strip())
        for term in text.split():
            lower = term.lower()
            if lower in ("resolved", "unresolved"):
                out.resolved = lower == "resolved"
                continue
            if lower == "error":
                out.errors_only = True
                continue
            match = TERM.match(lower)
            if match is None:
                raise ValueError(f"filter term {term!r}: not understood (terms: {FILTER_HELP})")
            key, op, value = match["key"], match["op"], match["value"]
            if key in ("ter", "step"):
                setattr(out, key, _range(term, op, value, percent=key == "ter"))
                continue
            if op != "=":
                raise ValueError(f"filter term {term!r}: {key} takes =")
            values = {v for v in value.split(",") if v}
            if key == "resolved":
                if value not in ("yes", "no", "true", "false"):
                    raise ValueError(f"filter term {term!r}: resolved=yes|no")
                out.resolved = value in ("yes", "true")
            elif key == "decision":
                if not values <= {"accept", "reject", "none"}:
                    raise ValueError(f"filter term {term!r}: decision is accept, reject or none")
                out.decisions = values
            elif key in ("category", "primary"):
                unknown = values - set(CATEGORIES) - {"none"}
                if unknown:
                    raise ValueError(
                        f"filter term {term!r}: unknown category {', '.join(sorted(unknown))} (known: {', '.join(CATEGORIES)}, none)"
                    )
                setattr(out, "categories" if key == "category" else "primary", values)
            elif key == "exit":
                out.exit = values
            elif key == "task":
                out.task = value
            else:
                raise ValueError(f"filter term {term!r}: unknown key {key!r} (terms: {FILTER_HELP})")
        return out


@dataclass
class ViewOptions:
    """``relearn view``'s options (the verb has no pipeline stage): which trajectories, and, with
    ``--print``, how they are printed."""

    pool: Path = option(help="Pool of trajectories (.jsonl or .jsonl.zst).", argument=True, metavar="POOL")
    reviews: Path | None = option(None, "Reviews JSONL: decisions and the defect spans to show.", flags=("--reviews", "-r"))
    dataset: Path | None = option(
        None, "Dataset folder written by `relearn masks`: exact TER in tokens, and what it excludes is struck.",
        flags=("--dataset", "-d"), metavar="DIR",
    )  # fmt: skip
    defect_scope: DefectScope | None = option(
        None, "Strike what `relearn masks --defect-scope` excludes: action (a defect in a tool call or a text agent's action excludes "
        f"the whole call) or minimal (the quote). Default: the dataset's with -d, else {CompileOptions.defect_scope}.",
    )  # fmt: skip
    filter: str = option("", f"Only trajectories where all terms hold: {FILTER_HELP}.", flags=("--filter", "-f"), metavar="TERMS")
    resolved: bool | None = option(None, "Only verified-positive (or only not) trajectories.", flags=("--resolved/--unresolved",))
    decision: str | None = option(None, "Only this review decision: accept, reject or none.", metavar="DECISION")
    category: str | None = option(None, "Only trajectories with a defect of this category (comma list).", metavar="CATEGORY,...")
    ter: str | None = option(None, "Only this TER range, e.g. 0.05..0.2 or 5%..20%.", metavar="RANGE")
    search: str | None = option(
        None, "Open at the first step containing this text (with --print: only trajectories containing it).", flags=("--search", "-s")
    )
    print: bool = option(False, "Print instead of opening the viewer.", flags=("--print", "-p"))
    format: Literal["text", "ansi", "html"] = option(
        "text", "With --print: text (excluded spans between [- and -]), ansi, or html.", flags=("--format",)
    )
    trajectory_id: str | None = option(None, "With --print: the trajectory with this id.", flags=("--id",), metavar="ID")
    number: int | None = option(None, "With --print: the N-th record of the pool (1-based).", flags=("--number", "-n"), ge=1)
    step: int | None = option(None, "With --print: only this step (0 = task; the last is the final patch).", ge=0)
    limit: int = option(1, "With --print: at most this many trajectories.", ge=1)
    full: bool = option(False, "With --print: long observations whole, not collapsed.")
    width: int | None = option(None, "With --print: columns (default: the terminal's, or 80).", ge=40)
    no_cache: bool = option(False, "Do not read or write the saved index (.POOL.view-index.jsonl).", flag_only=True)

    def chosen(self) -> Filter:
        """The filter of ``--filter`` and the options that add a term to it; ValueError for a
        term that is not understood."""
        terms = [self.filter] if self.filter else []
        terms += ["resolved" if self.resolved else "unresolved"] if self.resolved is not None else []
        terms += [f"{key}={value}" for key, value in (("decision", self.decision), ("category", self.category), ("ter", self.ter)) if value]
        return Filter.parse(" ".join(terms))


def _number(term: str, text: str, percent: bool) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        if percent and text.endswith("%"):
            return float(text[:-1]) / 100
        return float(text)
    except ValueError:
        raise ValueError(f"filter term {term!r}: {text!r} is not a number") from None


def _range(term: str, op: str, value: str, *, percent: bool) -> tuple[float | None, float | None]:
    if op == "=":
        if ".." in value:
            lo, hi = value.split("..", 1)
            return _number(term, lo, percent), _number(term, hi, percent)
        exact = _number(term, value, percent)
        return exact, exact
    number = _number(term, value, percent)
    # Bounds are inclusive: "ter>0.1" and "ter>=0.1" differ only at the boundary, which
    # floating TERs hit only at 0 and 1; the inclusive reading is the one people expect.
    return (number, None) if op in (">", ">=") else (None, number)


def _within(value: float | None, bounds: tuple[float | None, float | None]) -> bool:
    if value is None:
        return False
    lo, hi = bounds
    return (lo is None or value >= lo - 1e-12) and (hi is None or value <= hi + 1e-12)


# -- the catalog -----------------------------------------------------------------------


@dataclass
class Catalog:
    pool: PoolIndex
    reviews: ReviewIndex | None = None
    dataset: DatasetInfo | None = None
    scope: str = CompileOptions.defect_scope  # --defect-scope, when no dataset says its own

    def defect_scope(self) -> str | None:
        """The scope defects are struck under: the dataset's own (None when its mode masks
        nothing), else ``scope``, as ``relearn masks`` would compile."""
        if self.dataset is None:
            return self.scope
        if self.dataset.stats.get("mode", "ross") != "ross":
            return None
        # A dataset that does not record its scope (compiled before 1e7be56) is struck under
        # --defect-scope: action unless told (it was the default from d407bd9, quote-only before).
        return str(self.dataset.stats.get("defect_scope") or self.scope)

    def summary(self, position: int) -> TrajectorySummary:
        return self.pool.entries[position].summary

    def review_summary(self, position: int) -> ReviewSummary | None:
        trajectory_id = self.summary(position).id
        if self.reviews is None or trajectory_id is None:
            return None
        return self.reviews.summary(trajectory_id)

    def tokens(self, position: int) -> Tokens | None:
        trajectory_id = self.summary(position).id
        if self.dataset is None or trajectory_id is None:
            return None
        return self.dataset.by_trajectory.get(trajectory_id)

    def ter(self, position: int) -> tuple[float | None, str]:
        """TER and where it comes from: ``tokens`` (dataset) or ``chars`` (estimate)."""
        if self.dataset is not None:
            tokens = self.tokens(position)
            return (tokens.ter if tokens else None), "tokens"
        review = self.review_summary(position)
        summary = self.summary(position)
        if review is None or not summary.eligible_chars:
            return None, "chars"
        return review.defect_chars / summary.eligible_chars, "chars"

    def stop(self) -> None:
        """Stop the background indexes (see ``RecordIndex.stop``)."""
        self.pool.stop()
        if self.reviews is not None:
            self.reviews.stop()

    def may_contain(self, position: int, text: str) -> bool:
        """False when the record's JSON text lacks ``text`` (case-insensitive): the cheap test that
        spares a search most parses."""
        return json.dumps(text, ensure_ascii=False)[1:-1].lower().encode() in self.pool.read(position).lower()

    def reviews_of_another_pool(self) -> bool:
        """Whether reviews were given and, both files indexed, review none of the pool's
        trajectories (reviews of another pool would otherwise only read "not reviewed")."""
        reviews, pool = self.reviews, self.pool
        if reviews is None or not reviews.ready.is_set() or not pool.ready.is_set() or not len(pool):
            return False
        return not any(entry.summary.id in reviews.by_id for entry in pool.entries)

    def ready_for(self, flt: Filter) -> bool:
        """Whether every source the filter reads is fully indexed."""
        if flt.needs_reviews or flt.ter is not None:
            if self.reviews is not None and not self.reviews.ready.is_set():
                return False
        return True

    def matches(self, position: int, flt: Filter) -> bool:
        s = self.summary(position)
        if flt.errors_only:
            return s.error is not None
        if s.error is not None:
            return flt.empty  # an unreadable record only shows when nothing is filtered
        if flt.resolved is not None and s.positive != flt.resolved:
            return False
        if flt.exit is not None and (s.exit_status or "") not in flt.exit:
            return False
        if flt.task is not None and flt.task not in (s.task_id or "").lower():
            return False
        if flt.step is not None and not _within(s.step, flt.step):
            return False
        if flt.needs_reviews:
            review = self.review_summary(position)
            if flt.decisions is not None and (review.decision if review else "none") not in flt.decisions:
                return False
            if flt.categories is not None:
                present = set(review.chars_by_category) if review else set()
                if not (present & flt.categories or ("none" in flt.categories and not present)):
                    return False
            if flt.primary is not None and (review.primary if review else "none") not in flt.primary:
                return False
        if flt.ter is not None and not _within(self.ter(position)[0], flt.ter):
            return False
        return True


def open_catalog(options: ViewOptions) -> Catalog:
    """The pool, reviews and dataset, indexes started in the background; UsageError when an
    input cannot be used at all. --defect-scope given with a dataset must be the one the
    dataset was compiled under."""
    pool, reviews, scope, cache = options.pool, options.reviews, options.defect_scope, not options.no_cache
    if not pool.is_file():
        raise UsageError(f"no such pool: {pool}")
    if reviews is not None and not reviews.is_file():
        raise UsageError(f"no such reviews file: {reviews}")
    for path in (pool, reviews):
        if path is not None:  # a gzip file, or zstd under another name, is refused by its bytes
            with open_bytes_read(path):
                pass
    info = DatasetInfo.load(options.dataset) if options.dataset is not None else None
    if info is not None and scope is not None and info.stats.get("defect_scope", scope) != scope:
        raise UsageError(f"{info.path}: compiled under --defect-scope {info.stats['defect_scope']}, not {scope} (leave the option out)")
    review_index = ReviewIndex(reviews, cache=cache).start() if reviews is not None else None
    return Catalog(PoolIndex(pool, cache=cache).start(), review_index, info, scope=scope or CompileOptions.defect_scope)
