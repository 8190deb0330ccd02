"""Pool and dataset statistics (``relearn stats``): what a researcher asks before training.

Everything is computed from the indexes ``relearn view`` keeps (one parse of each record,
saved beside the file), so statistics over a 100k pool cost one pass the first time and
a file read after. A success is a verified-positive trajectory (resolved, or reward > 0
where the verifier gives only a reward), the rule review and masks select on; pass@k is
the unbiased estimator of ``records.passk.pass_at_k``.

TER comes from the dataset's token counts when a dataset is given. Without one it is
estimated in characters (defect characters over generated assistant characters) and
labelled ``chars``. ``ter.by_scope`` gives it under both defect scopes, whichever the dataset
was trained under: ``action`` (a defect in a call excludes the whole call) and ``minimal`` (the
quoted characters only, the paper's "smallest source substring"); the character estimate is
the quotes' and has no action scope.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from records.passk import task_table
from records.pool_index import PoolIndex, ReviewIndex, ReviewSummary, TrajectorySummary
from records.pools import RecordError, read_trajectories_lenient
from relearn.masks.context_check import check_context
from relearn.masks.scopes import SCOPES
from relearn.view.catalog import DatasetInfo, Tokens

GroupKey = Literal["step", "checkpoint", "policy", "task", "exit", "none"]  # the values of `relearn stats --by`


@dataclass
class Row:
    """One readable trajectory with what the reviews and the dataset say about it."""

    summary: TrajectorySummary
    review: ReviewSummary | None
    tokens: Tokens | None

    @property
    def outcome(self) -> str:
        if self.summary.positive:
            return "resolved"
        if self.summary.suspicious:
            return "suspicious"  # resolved, but kept out of review and training
        if self.summary.resolved is None and self.summary.reward is None:
            return "not verified"
        return "unresolved"

    @property
    def accepted(self) -> bool:
        return self.summary.positive and self.review is not None and self.review.decision == "accept"


def distribution(values: Iterable[float]) -> dict[str, float | int]:
    data = sorted(values)
    if not data:
        return {"n": 0}

    def quantile(q: float) -> float:
        # Linear interpolation between closest ranks (numpy's default).
        at = (len(data) - 1) * q
        lo, hi = math.floor(at), math.ceil(at)
        return data[lo] + (data[hi] - data[lo]) * (at - lo)

    return {
        "n": len(data),
        "mean": sum(data) / len(data),
        "median": quantile(0.5),
        "p90": quantile(0.9),
        "max": data[-1],
        "min": data[0],
    }


def step_windows(steps: list[int], windows: int, size: int | None) -> Callable[[int | None], tuple[int, int] | None]:
    """Maps a training step to its window ``(first, last)``: fixed-size windows, or
    ``windows`` equal-width windows over the steps seen (2 = the paper's early and late
    halves). None for a trajectory without a step."""
    if size:
        return lambda s: None if s is None else (s // size * size, s // size * size + size - 1)
    if not steps:
        return lambda s: None
    lo, hi = min(steps), max(steps)
    width = max(1, math.ceil((hi - lo + 1) / max(1, windows)))

    def window(step: int | None) -> tuple[int, int] | None:
        if step is None:
            return None
        start = lo + (step - lo) // width * width
        return start, min(start + width - 1, hi)

    return window


def parse_step_windows(text: str) -> list[tuple[int, int]]:
    """``"1-20,81-100"`` -> [(1, 20), (81, 100)]: the windows the paper compares (early vs
    late); raises ValueError naming the piece that is not ``FIRST-LAST``."""
    windows = []
    for piece in (p.strip() for p in text.split(",")):
        first, sep, last = piece.partition("-")
        if not sep or not first.strip().isdigit() or not last.strip().isdigit() or int(first) > int(last):
            raise ValueError(f"step window {piece!r} is not FIRST-LAST (e.g. 1-20)")
        windows.append((int(first), int(last)))
    for (a_lo, a_hi), (b_lo, b_hi) in zip(sorted(windows), sorted(windows)[1:], strict=False):
        if b_lo <= a_hi:
            raise ValueError(f"step windows {a_lo}-{a_hi} and {b_lo}-{b_hi} overlap")
    return windows


def window_label(window: tuple[int, int] | None) -> str:
    if window is None:
        return "no step"
    return f"step {window[0]}" if window[0] == window[1] else f"steps {window[0]}–{window[1]}"


def _group_key(
    by: str, rows: list[Row], windows: int, size: int | None, explicit: list[tuple[int, int]] | None = None
) -> Callable[[Row], Any]:
    """The group of a row: its step window ``(first, last)`` (None without a step, or outside
    every ``explicit`` window), or a name."""
    if by == "step" and explicit:
        return lambda r: next((w for w in explicit if r.summary.step is not None and w[0] <= r.summary.step <= w[1]), None)
    if by == "step":
        window = step_windows([r.summary.step for r in rows if r.summary.step is not None], windows, size)
        return lambda r: window(r.summary.step)
    if by == "checkpoint":
        return lambda r: r.summary.checkpoint or "?"
    if by == "policy":
        return lambda r: r.summary.policy or "?"
    if by == "task":
        return lambda r: r.summary.task_id or "?"
    if by == "exit":
        return lambda r: r.summary.exit_status or "?"
    return lambda r: "all"


def rows_of(pools: list[PoolIndex], reviews: ReviewIndex | None, dataset: DatasetInfo | None) -> list[Row]:
    rows = []
    for pool in pools:
        for entry in pool.entries:
            summary = entry.summary
            if summary.error is not None:
                continue
            review = reviews.summary(summary.id) if reviews is not None and summary.id else None
            tokens = dataset.by_trajectory.get(summary.id) if dataset is not None and summary.id else None
            rows.append(Row(summary, review, tokens))
    return rows


def _ter_of(row: Row, source: str) -> tuple[int, int] | None:
    """(eligible, excluded) of a trajectory that enters training, in tokens or characters."""
    if source == "tokens":
        return (row.tokens.eligible, row.tokens.excluded) if row.tokens is not None else None
    if not row.accepted or not row.summary.eligible_chars:
        return None
    assert row.review is not None
    return row.summary.eligible_chars, min(row.review.defect_chars, row.summary.eligible_chars)


def _scope_ter(row: Row, source: str, scope: str) -> tuple[int, int] | None:
    """(eligible, excluded) of a trajectory that enters training under defect ``scope``; None
    where it is not known (a dataset compiled before both scopes were counted; characters,
    which know only the quotes)."""
    if source == "tokens":
        if row.tokens is None or scope not in row.tokens.excluded_by_scope:
            return None
        return row.tokens.eligible, row.tokens.excluded_by_scope[scope]
    return _ter_of(row, source) if scope == "minimal" else None


def ter_by_scope(rows: list[Row], source: str) -> dict[str, dict[str, Any] | None]:
    """TER under each defect scope over the trajectories that enter training; None for a scope
    that cannot be told (see ``_scope_ter``)."""
    out: dict[str, dict[str, Any] | None] = {}
    for scope in SCOPES:
        counts = [t for r in rows if (t := _scope_ter(r, source, scope)) is not None]
        if not counts:
            out[scope] = None
            continue
        eligible = sum(e for e, _x in counts)
        excluded = sum(x for _e, x in counts)
        ters = [x / e for e, x in counts if e]
        out[scope] = {
            "trajectories": len(counts),
            "eligible": eligible,
            "excluded": excluded,
            "weighted": excluded / eligible if eligible else None,
            "mean": sum(ters) / len(ters) if ters else None,
        }
    return out


def context_section(pools: list[Path], tokenizer: Any, template_kwargs: dict[str, Any], per_turn: bool = False) -> dict[str, Any]:
    """``relearn stats --context``: trajectories counted by the rule that decides their context
    (``relearn.masks.context_check``) and the turns whose render differs from the prompt ids
    they recorded; one streaming pass over each pool (unreadable records are the index's to
    report)."""
    errors: list[RecordError] = []
    trajectories = (t for path in pools for t in read_trajectories_lenient(path, errors))
    report = check_context(trajectories, tokenizer, template_kwargs, per_turn)
    return {"template_kwargs": template_kwargs, "per_turn": per_turn, **report.as_dict()}


def compute(
    pools: list[PoolIndex],
    reviews: ReviewIndex | None = None,
    dataset: DatasetInfo | None = None,
    *,
    ks: tuple[int, ...] = (1, 5, 10),
    by: GroupKey = "step",
    windows: int = 2,
    window_size: int | None = None,
    step_windows_given: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Every statistic, as plain JSON-ready data. The indexes must be built."""
    rows = rows_of(pools, reviews, dataset)
    report: dict[str, Any] = {"pools": [str(p.path) for p in pools]}

    # Trajectories by outcome and exit status.
    by_exit: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        by_exit[row.summary.exit_status or "?"][row.outcome] += 1
    report["trajectories"] = {
        "total": len(rows),
        "unreadable": sum(len(p.errors) for p in pools),
        "by_outcome": dict(Counter(r.outcome for r in rows).most_common()),
        "by_exit_status": {k: sum(v.values()) for k, v in sorted(by_exit.items(), key=lambda kv: -sum(kv[1].values()))},
        "outcome_by_exit_status": {k: dict(v) for k, v in sorted(by_exit.items())},
        "distinct_ids": len({r.summary.id for r in rows}),
    }

    # Per-task pass@k, unbiased.
    attempts: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        if row.outcome != "not verified":
            attempts[row.summary.task_id or "?"].append(row.summary.positive)
    tasks = task_table(attempts, ks)
    mean = {}
    counted = {}
    for k in ks:
        values = [t[f"pass@{k}"] for t in tasks.values() if f"pass@{k}" in t]
        counted[f"pass@{k}"] = len(values)
        if values:
            mean[f"pass@{k}"] = sum(values) / len(values)
    report["pass_at_k"] = {"k": list(ks), "tasks": tasks, "mean": mean, "tasks_counted": counted}

    # Reviews: decisions, reasons, categories.
    if reviews is not None:
        reviewed = [r for r in rows if r.review is not None]
        pool_ids = {r.summary.id for r in rows}
        reasons = Counter(((r.review.reason or "no reason").split(":")[0]) for r in reviewed if r.review and r.review.decision != "accept")
        errors: Counter[str] = Counter()
        defect_chars: Counter[str] = Counter()
        for r in reviewed:
            assert r.review is not None
            errors.update(r.review.errors_by_category)
            defect_chars.update(r.review.chars_by_category)
        report["reviews"] = {
            "file": str(reviews.path),
            "reviewed": len(reviewed),
            "not_reviewed": len(rows) - len(reviewed),
            "decisions": dict(Counter(r.review.decision for r in reviewed if r.review).most_common()),
            "accepted_of_positive": sum(r.accepted for r in rows),
            "positive": sum(r.summary.positive for r in rows),
            "rejection_reasons": dict(reasons.most_common()),
            "errors_by_category": dict(errors.most_common()),
            "defect_chars_by_category": dict(defect_chars.most_common()),
            "primary_category": dict(Counter(r.review.primary for r in reviewed if r.review).most_common()),
            "unreadable": len(reviews.errors),
            "not_in_pools": sum(1 for tid in reviews.by_id if tid not in pool_ids),
        }

    # The dataset as relearn masks wrote it.
    if dataset is not None:
        stats = dataset.stats
        excluded = stats.get("excluded_by_category") or {}
        total_excluded = sum(excluded.values())
        report["dataset"] = {
            "path": str(dataset.path.parent),
            "mode": stats.get("mode"),
            "trajectories_in": stats.get("trajectories_in"),
            "trajectories_out": stats.get("trajectories_out"),
            "samples": stats.get("samples"),
            "rejected": stats.get("rejected", {}),
            "tokens": stats.get("tokens", {}),
            "ter_token_weighted": stats.get("ter_token_weighted"),
            "ter_mean": stats.get("ter_mean"),
            "defect_scope": stats.get("defect_scope"),
            "ter_by_scope": stats.get("ter_by_scope"),
            "audit": stats.get("audit"),
            "excluded_by_category": excluded,
            "excluded_share_by_category": {k: v / total_excluded for k, v in excluded.items()} if total_excluded else {},
            "not_in_pools": sum(1 for tid in dataset.by_trajectory if tid not in {r.summary.id for r in rows}),
        }

    # TER per trajectory and token-weighted by group.
    source = "tokens" if dataset is not None else "chars"
    counted_rows = [(r, t) for r in rows if (t := _ter_of(r, source)) is not None]
    ters = [x / e for _, (e, x) in counted_rows if e]
    eligible = sum(e for _, (e, _x) in counted_rows)
    excluded_total = sum(x for _, (_e, x) in counted_rows)
    key = _group_key(by, rows, windows, window_size, step_windows_given)
    groups: dict[Any, dict[str, Any]] = {}
    for row in rows:
        g = groups.setdefault(
            key(row),
            {"trajectories": 0, "resolved": 0, "accepted": 0, "in_ter": 0, "eligible": 0, "excluded": 0, "ters": [], "primary": Counter()},
        )
        g["trajectories"] += 1
        g["resolved"] += row.summary.positive
        g["accepted"] += row.accepted
        counts = _ter_of(row, source)
        if counts is not None:
            g["in_ter"] += 1
            g["eligible"] += counts[0]
            g["excluded"] += counts[1]
            if counts[0]:
                g["ters"].append(counts[1] / counts[0])
            if row.review is not None and row.review.defects:
                g["primary"][row.review.primary] += 1  # one label per trajectory that enters with defects
    group_rows = []
    # Step windows in step order (no step last); names alphabetically.
    order = (lambda w: (w is None, w or (0, 0))) if by == "step" else (lambda name: name)
    for name in sorted(groups, key=order):
        g = groups[name]
        group_rows.append(
            {
                "group": window_label(name) if by == "step" else name,
                "window": list(name) if by == "step" and name is not None else None,
                "trajectories": g["trajectories"],
                "resolved_rate": g["resolved"] / g["trajectories"] if g["trajectories"] else 0.0,
                "accepted": g["accepted"],
                "with_ter": g["in_ter"],
                "eligible": g["eligible"],
                "excluded": g["excluded"],
                "ter_token_weighted": g["excluded"] / g["eligible"] if g["eligible"] else None,
                "ter_mean": sum(g["ters"]) / len(g["ters"]) if g["ters"] else None,
            }
        )
        if step_windows_given:
            total = sum(g["primary"].values())
            group_rows[-1]["group"] = window_label(name) if name is not None else "outside the windows"
            group_rows[-1]["primary_category"] = dict(g["primary"].most_common())
            group_rows[-1]["primary_share"] = {k: v / total for k, v in g["primary"].most_common()} if total else {}
    report["ter"] = {
        "source": source,
        "unit": "tokens" if source == "tokens" else "characters",
        "per_trajectory": distribution(ters),
        "zero_share": sum(1 for t in ters if t == 0) / len(ters) if ters else None,
        "weighted": excluded_total / eligible if eligible else None,
        "eligible": eligible,
        "excluded": excluded_total,
        "trained_scope": dataset.stats.get("defect_scope") if dataset is not None else None,
        "by_scope": ter_by_scope(rows, source),
        "by": by,
        "groups": group_rows,
        "points": [{"step": r.summary.step, "ter": x / e, "eligible": e} for r, (e, x) in counted_rows if e],
    }

    # Excluded content by category: trajectory-level primary category and weighted shares.
    entering = [r for r in rows if (r.tokens is not None if dataset is not None else r.accepted)]
    primary = Counter(r.review.primary for r in entering if r.review is not None and r.review.defects)
    chars: Counter[str] = Counter()
    for r in entering:
        if r.review is not None:
            chars.update(r.review.chars_by_category)
    char_total = sum(chars.values())
    categories: dict[str, Any] = {
        "trajectories": len(entering),
        "with_defects": sum(1 for r in entering if r.review is not None and r.review.defects),
        "primary_category": dict(primary.most_common()),
        "char_share": {k: v / char_total for k, v in chars.most_common()} if char_total else {},
    }
    if dataset is not None:
        categories["token_share"] = report["dataset"]["excluded_share_by_category"]
        categories["tokens"] = report["dataset"]["excluded_by_category"]
    report["excluded"] = categories

    # Lengths.
    lengths: dict[str, Any] = {}
    for name, get in (
        ("messages", lambda r: r.summary.messages),
        ("turns", lambda r: r.summary.turns),
        ("tool_calls", lambda r: r.summary.tool_calls),
        ("chars", lambda r: r.summary.chars),
        ("patch_lines", lambda r: r.summary.patch_lines),
    ):
        lengths[name] = {"all": distribution(get(r) for r in rows)}
        for outcome in ("resolved", "unresolved"):
            lengths[name][outcome] = distribution(get(r) for r in rows if r.outcome == outcome)
    if dataset is not None:
        lengths["tokens"] = {"all": distribution(t.tokens for t in dataset.by_trajectory.values())}
    report["lengths"] = lengths
    return report
