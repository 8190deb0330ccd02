"""Kept vs excluded: each reviewed trajectory's eligible tokens A split by the ROSS mask into
the tokens it trains on (kept, A \\ E) and those it leaves out (excluded, E, by the category
of the defect that excludes them).

The split is the mask compiler's own (``relearn.masks.compile.compile_trajectory`` in ``ross``
mode with the trajectory's latest review), so the excluded tokens here are exactly those
``relearn masks`` leaves out of training. A token under defects of two categories counts under
the first defect's (``Sample.excluded_category``), so the categories add up to E; the
compiler's ``excluded_by_category`` counts such a token under both.

Statistics are token-weighted (ratio of sums) with 95% bootstrap intervals over trajectories;
one set of resamples serves every ratio of a table, so the excluded - kept gap and the
difference between two models on the same trajectories are paired.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from records.pools import RecordError
from records.review import CATEGORIES, Review

BOOTSTRAP_SAMPLES = 10_000
SEED = 0
# Bumped when the same review splits differently; it keys the cached splits with the review.
SPLIT_VERSION = 1
PARTS = ("kept", "excluded")


def review_key(review: Review | RecordError | None) -> str:
    """What a cached split was computed from: the review's content (or that there was none,
    or which unreadable line stood in its place). A changed review gives another key."""
    if review is None:
        basis = "none"
    elif isinstance(review, RecordError):
        basis = f"unreadable: {review}"
    else:
        basis = json.dumps(review.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(f"{SPLIT_VERSION}\0{basis}".encode()).hexdigest()[:16]


@dataclass
class Tally:
    """Σ NLL and token count of one part of one trajectory (kept, excluded, or a category)."""

    nll_sum: float = 0.0
    tokens: int = 0

    def add(self, values: np.ndarray) -> None:
        self.nll_sum += float(values.sum())
        self.tokens += len(values)

    def to_json(self) -> list[float | int]:
        return [self.nll_sum, self.tokens]


@dataclass
class TrajectorySplit:
    kept: Tally = field(default_factory=Tally)
    excluded: Tally = field(default_factory=Tally)
    categories: dict[str, Tally] = field(default_factory=dict)

    def add(self, token_nll: np.ndarray, kept: np.ndarray, category: np.ndarray) -> None:
        """One sequence: ``token_nll``, ``kept`` (bool) and ``category`` (int8, -1 where none)
        aligned over its eligible tokens."""
        self.kept.add(token_nll[kept])
        self.excluded.add(token_nll[~kept])
        for code in np.unique(category[~kept]):
            name = CATEGORIES[int(code)] if 0 <= code < len(CATEGORIES) else "other"
            self.categories.setdefault(name, Tally()).add(token_nll[~kept & (category == code)])

    def to_json(self) -> dict[str, Any]:
        return {
            "kept": self.kept.to_json(),
            "excluded": self.excluded.to_json(),
            "categories": {k: v.to_json() for k, v in sorted(self.categories.items())},
        }


def split_sequence(
    token_nll: np.ndarray, eligible: np.ndarray, loss_mask: np.ndarray, excluded_category: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token NLL of one sequence's eligible tokens (in order) with, for each, whether the
    mask keeps it and the category excluding it. Raises ValueError when the arrays disagree."""
    positions = np.flatnonzero(eligible)
    if len(positions) != len(token_nll):
        raise ValueError(f"{len(token_nll)} scored tokens for {len(positions)} eligible")
    kept = loss_mask[positions].astype(bool)
    if np.any(loss_mask.astype(bool) & ~eligible.astype(bool)):
        raise ValueError("a kept token outside A")
    category = excluded_category[positions]
    if np.any(category[~kept] < 0):
        raise ValueError("an excluded token without a category")
    return token_nll, kept, category


# ---------------------------------------------------------------- statistics


def bootstrap_ratios(sums: np.ndarray, counts: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> np.ndarray:
    """``[samples, k]``: for each resample of the ``n`` trajectories (rows, with replacement,
    the same rows for every column), Σ sums / Σ counts of each of the ``k`` columns; NaN where
    a resample holds no token of a column."""
    n, k = sums.shape
    out = np.empty((samples, k))
    rng = np.random.default_rng(seed)
    batch = max(1, 2_000_000 // max(n * k, 1))  # bounded memory whatever the pool size
    for start in range(0, samples, batch):
        stop = min(samples, start + batch)
        picks = rng.integers(0, n, (stop - start, n))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:stop] = sums[picks].sum(1) / counts[picks].sum(1)
    return out


def interval(values: np.ndarray) -> list[float] | None:
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return None
    return [float(np.quantile(finite, 0.025)), float(np.quantile(finite, 0.975))]


def _tally(split: dict[str, Any], part: str) -> tuple[float, int]:
    if part in PARTS:
        return split[part][0], split[part][1]
    return tuple(split["categories"].get(part, (0.0, 0)))  # type: ignore[return-value]


def _ratio(sums: np.ndarray, counts: np.ndarray) -> float | None:
    total = counts.sum()
    return float(sums.sum() / total) if total else None


def summarize_split(records: list[dict[str, Any]], not_split: Counter[str], samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Kept, excluded, each category and the excluded - kept gap over ``records`` (scores with a
    ``split``), token-weighted with paired 95% bootstrap intervals over trajectories."""
    splits = [r["split"] for r in records if "split" in r]
    summary: dict[str, Any] = {"trajectories": len(splits), "not_split": dict(sorted(not_split.items()))}
    if not splits:
        return summary
    categories = sorted(
        {c for s in splits for c in s["categories"]}, key=lambda c: CATEGORIES.index(c) if c in CATEGORIES else len(CATEGORIES)
    )
    parts = [*PARTS, *categories]
    tallies = np.array([[_tally(s, p) for p in parts] for s in splits], dtype=np.float64)  # [n, parts, 2]
    sums, counts = tallies[:, :, 0], tallies[:, :, 1]
    boot = bootstrap_ratios(sums, counts, samples)
    rows = {}
    for j, part in enumerate(parts):
        rows[part] = {
            "tokens": int(counts[:, j].sum()),
            "trajectories": int((counts[:, j] > 0).sum()),
            "nll": _ratio(sums[:, j], counts[:, j]),
            "ci95": interval(boot[:, j]),
        }
    summary.update(kept=rows["kept"], excluded=rows["excluded"], categories={c: rows[c] for c in categories})
    kept, excluded = rows["kept"]["nll"], rows["excluded"]["nll"]
    summary["gap"] = {
        "nll": excluded - kept if kept is not None and excluded is not None else None,
        "ci95": interval(boot[:, 1] - boot[:, 0]),
    }
    return summary


def paired_delta(before: list[dict[str, Any]], after: list[dict[str, Any]], samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """The change in kept and excluded NLL from ``before`` to ``after`` (two models' scores of
    the same pool), over the trajectories both split, resampled together: the interval is of
    the change itself, not of two independent figures."""
    earlier = {r["trajectory_id"]: r["split"] for r in before if "split" in r}
    pairs = [(earlier[r["trajectory_id"]], r["split"]) for r in after if "split" in r and r["trajectory_id"] in earlier]
    result: dict[str, Any] = {"trajectories": len(pairs)}
    if not pairs:
        return result
    for part in PARTS:
        a = np.array([_tally(x, part) for x, _ in pairs], dtype=np.float64)
        b = np.array([_tally(y, part) for _, y in pairs], dtype=np.float64)
        if not np.array_equal(a[:, 1], b[:, 1]):
            raise ValueError(f"{part}: the two models' scores split the trajectories differently (other reviews or tokenizer?)")
        boot = bootstrap_ratios(np.stack([a[:, 0], b[:, 0]], 1), np.stack([a[:, 1], b[:, 1]], 1), samples)
        first, second = _ratio(a[:, 0], a[:, 1]), _ratio(b[:, 0], b[:, 1])
        result[part] = {
            "delta": second - first if first is not None and second is not None else None,
            "ci95": interval(boot[:, 1] - boot[:, 0]),
        }
    return result


# ---------------------------------------------------------------- tables


def fmt_ci(value: float | None, ci: list[float] | None, sign: bool = False) -> str:
    if value is None:
        return "–"
    f = "+.3f" if sign else ".3f"
    return f"{value:{f}} ({ci[0]:{f}}–{ci[1]:{f}})" if ci else f"{value:{f}}"


def not_split_text(not_split: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in not_split.items()) or "0"


def split_markdown(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Markdown lines: one row per (name, summary), then the excluded tokens by category."""
    lines = [
        "| pool | split | not split | kept tokens | kept NLL (95% CI) | excluded tokens | excluded NLL (95% CI) | excluded − kept (95% CI) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        if not s.get("trajectories"):
            lines.append(f"| {name} | 0 | {not_split_text(s.get('not_split', {}))} | – | – | – | – | – |")
            continue
        k, e, g = s["kept"], s["excluded"], s["gap"]
        lines.append(
            f"| {name} | {s['trajectories']} | {not_split_text(s['not_split'])} | {k['tokens']:,} | {fmt_ci(k['nll'], k['ci95'])} "
            f"| {e['tokens']:,} | {fmt_ci(e['nll'], e['ci95'])} | {fmt_ci(g['nll'], g['ci95'], sign=True)} |"
        )
    categories = [(name, c, row) for name, s in rows for c, row in s.get("categories", {}).items()]
    if categories:
        lines += ["", "| pool | excluded category | tokens | trajectories | NLL (95% CI) |", "|---|---|---|---|---|"]
        lines += [
            f"| {name} | {c} | {row['tokens']:,} | {row['trajectories']} | {fmt_ci(row['nll'], row['ci95'])} |"
            for name, c, row in categories
        ]
    return lines


def models_markdown(comparison: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """Markdown lines of ``relearn.analyze.nll_report.compare_models``: per model and pool, kept and
    excluded NLL, each with its paired change from the first model, and the excluded - kept gap."""
    names = names or {}
    first = names.get(comparison["first"], comparison["first"])
    lines = [
        f"| model | pool | split | kept tokens | kept NLL (95% CI) | Δ kept vs {first} (paired 95% CI) | excluded tokens | excluded NLL (95% CI) "
        f"| Δ excluded vs {first} (paired 95% CI) | excluded − kept (95% CI) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in comparison["rows"]:
        model = names.get(row["model"], row["model"])
        if not row.get("trajectories"):
            lines.append(
                f"| {model} | {row['pool']} | 0 (not split: {not_split_text(row.get('not_split', {}))}) | – | – | – | – | – | – | – |"
            )
            continue
        k, e, g = row["kept"], row["excluded"], row["gap"]
        delta = row.get("vs_first", {})
        dk, de = delta.get("kept", {}), delta.get("excluded", {})
        lines.append(
            f"| {model} | {row['pool']} | {row['trajectories']} | {k['tokens']:,} | {fmt_ci(k['nll'], k['ci95'])} | {fmt_ci(dk.get('delta'), dk.get('ci95'), sign=True)} "
            f"| {e['tokens']:,} | {fmt_ci(e['nll'], e['ci95'])} | {fmt_ci(de.get('delta'), de.get('ci95'), sign=True)} | {fmt_ci(g['nll'], g['ci95'], sign=True)} |"
        )
    if comparison.get("pairs"):
        lines += [
            "",
            "| from → to | pool | trajectories | Δ kept NLL (paired 95% CI) | Δ excluded NLL (paired 95% CI) |",
            "|---|---|---|---|---|",
        ]
        for pair in comparison["pairs"]:
            dk, de = pair.get("kept", {}), pair.get("excluded", {})
            lines.append(
                f"| {names.get(pair['from'], pair['from'])} → {names.get(pair['to'], pair['to'])} | {pair['pool']} | {pair['trajectories']} "
                f"| {fmt_ci(dk.get('delta'), dk.get('ci95'), sign=True)} | {fmt_ci(de.get('delta'), de.get('ci95'), sign=True)} |"
            )
    return lines
