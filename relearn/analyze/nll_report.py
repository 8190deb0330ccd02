"""The figures of ``relearn analyze nll``: each pool's token-weighted NLL with bootstrap
intervals, its difference from the first pool, the kept/excluded split, and the same across
models (``compare_models``, for the pipeline's analyze stage); and the Markdown of each.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from relearn.analyze.nll import PoolScores, Settings
from relearn.analyze.split import BOOTSTRAP_SAMPLES, SEED, bootstrap_ratios, paired_delta, split_markdown, summarize_split


def bootstrap_ratio(sums: np.ndarray, counts: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> np.ndarray:
    """``samples`` resamples (trajectories with replacement) of Σ sums / Σ counts."""
    return bootstrap_ratios(np.asarray(sums, dtype=np.float64)[:, None], np.asarray(counts, dtype=np.float64)[:, None], samples, seed)[:, 0]


def _interval(values: np.ndarray) -> list[float]:
    return [float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))]


def summarize(pool: PoolScores, baseline: PoolScores | None = None, samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """The pool's row: token-weighted NLL with a 95% bootstrap CI, the distribution of
    per-trajectory means, and the difference from ``baseline`` (resampled independently)."""
    row: dict[str, Any] = {
        "name": pool.name,
        "path": pool.path,
        "records": pool.records,
        "scored": len(pool.scores),
        "reused": pool.reused,
        "skipped": dict(pool.skipped),
        "rejected": len(pool.rejected),
    }
    if pool.split_asked:
        row["split"] = summarize_split(pool.scores, pool.not_split, samples)
        row["review_errors"] = len(pool.review_errors)
    if not pool.scores:
        return row
    sums = np.array([s["nll_sum"] for s in pool.scores])
    counts = np.array([s["eligible"] for s in pool.scores], dtype=np.float64)
    means = sums / counts
    token_nll = float(sums.sum() / counts.sum())
    boot = bootstrap_ratio(sums, counts, samples)
    row.update(
        eligible_tokens=int(counts.sum()),
        tokens=int(sum(s["tokens"] for s in pool.scores)),
        nll_per_token=token_nll,
        nll_per_token_ci95=_interval(boot),
        perplexity=math.exp(token_nll),
        trajectory_mean=float(means.mean()),
        trajectory_mean_ci95=_interval(bootstrap_ratio(means, np.ones_like(means), samples, SEED + 1)),
        median=float(np.median(means)),
        p10=float(np.quantile(means, 0.1)),
        p90=float(np.quantile(means, 0.9)),
        std=float(means.std()),
    )
    if baseline is not None and baseline is not pool and baseline.scores:
        base_sums = np.array([s["nll_sum"] for s in baseline.scores])
        base_counts = np.array([s["eligible"] for s in baseline.scores], dtype=np.float64)
        base_boot = bootstrap_ratio(base_sums, base_counts, samples, SEED + 2)
        row["diff_vs_first"] = token_nll - float(base_sums.sum() / base_counts.sum())
        row["diff_vs_first_ci95"] = _interval(boot - base_boot)
    return row


def analyze(pools: list[PoolScores], settings: Settings, ctx: int, samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Everything ``relearn analyze nll`` writes to nll.json."""
    baseline = pools[0] if pools else None
    return {
        "settings": {**asdict(settings), "digest": settings.digest(), "ctx": ctx},
        "pools": [summarize(p, baseline, samples) for p in pools],
        "trajectories": {p.name: p.scores for p in pools},
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = result["pools"]
    first = rows[0]["name"] if rows else "-"
    lines = [
        f"# NLL of eligible tokens under {s['model']}",
        "",
        f"Tokenizer {s['tokenizer']}, {s['dtype']}, ctx {s['ctx']}. NLL per token is token-weighted over the pool (nats); "
        f"the distribution is of per-trajectory means; intervals are 95% bootstrap over trajectories; Δ is against {first}.",
        "",
        "| pool | scored | skipped | rejected | eligible tokens | NLL/token (95% CI) | ppl | per-trajectory mean (95% CI) | median | p10–p90 | Δ vs first (95% CI) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        skipped = sum(r["skipped"].values())
        if not r["scored"]:
            lines.append(f"| {r['name']} | 0 | {skipped} | {r['rejected']} | 0 | – | – | – | – | – | – |")
            continue
        lo, hi = r["nll_per_token_ci95"]
        tlo, thi = r["trajectory_mean_ci95"]
        diff = "–"
        if "diff_vs_first" in r:
            dlo, dhi = r["diff_vs_first_ci95"]
            diff = f"{r['diff_vs_first']:+.3f} ({dlo:+.3f}–{dhi:+.3f})"
        lines.append(
            f"| {r['name']} | {r['scored']} | {skipped} | {r['rejected']} | {r['eligible_tokens']:,} | {r['nll_per_token']:.3f} ({lo:.3f}–{hi:.3f}) "
            f"| {r['perplexity']:.2f} | {r['trajectory_mean']:.3f} ({tlo:.3f}–{thi:.3f}) | {r['median']:.3f} | {r['p10']:.3f}–{r['p90']:.3f} | {diff} |"
        )
    reasons = sorted({reason for r in rows for reason in r["skipped"]})
    if reasons:
        lines += [
            "",
            "Skipped: "
            + "; ".join(f"{reason}: " + ", ".join(f"{r['name']} {r['skipped'].get(reason, 0)}" for r in rows) for reason in reasons)
            + ".",
        ]
    split = [(r["name"], r["split"]) for r in rows if "split" in r]
    if split:
        lines += [
            "",
            "## Kept (A \\ E) vs excluded (E) eligible tokens",
            "",
            "Split as `relearn masks --mode ross` compiles each trajectory with its latest review: kept tokens are trained on, "
            "excluded ones (tokens touching a grounded defect) are not. Token-weighted NLL (nats), 95% bootstrap over the split "
            "trajectories, the gap paired within them. Not split: the review rejects the trajectory, or the mask compiler refuses it "
            "(by reason); those count in the table above only. A token under defects of two categories counts under the first.",
            "",
            *split_markdown(split),
        ]
    return "\n".join(lines) + "\n"


def compare_models(
    models: dict[str, list[PoolScores]], samples: int = BOOTSTRAP_SAMPLES, pairs: list[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """Several models' scores of the same pools (with reviews): one row per model and pool with
    its kept/excluded split and, from the second model on, the paired change from the first;
    then, for each ``(a, b)`` of ``pairs``, the paired change from model ``a`` to model ``b``."""
    if not models:
        return {"first": None, "rows": [], "pairs": []}
    first = next(iter(models))
    by_pool = {model: {p.name: p for p in pools} for model, pools in models.items()}
    rows = []
    for model, pools in models.items():
        for pool in pools:
            row: dict[str, Any] = {
                "model": model,
                "pool": pool.name,
                "scored": len(pool.scores),
                **summarize_split(pool.scores, pool.not_split, samples),
            }
            if model != first and pool.name in by_pool[first]:
                row["vs_first"] = paired_delta(by_pool[first][pool.name].scores, pool.scores, samples)
            rows.append(row)
    compared = []
    for a, b in pairs or []:
        if a in models and b in models:
            for pool in models[b]:
                if pool.name in by_pool[a]:
                    compared.append(
                        {"from": a, "to": b, "pool": pool.name, **paired_delta(by_pool[a][pool.name].scores, pool.scores, samples)}
                    )
    return {"first": first, "rows": rows, "pairs": compared}
