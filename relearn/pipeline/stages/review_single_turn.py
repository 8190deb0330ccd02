"""review, ``[pool.single_turn]``: keep intervals for Math and Code positives, full supervision for
IF positives, as `relearn single-turn review` does (``relearn.ops.single_turn``): [review]'s
judge1 the keep judge, judge2 the auditor.

Identity: the [review] table's, as the agentic review's (``review.NOT_IDENTITY`` left out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relearn.ops.single_turn import run_single_turn_review
from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, reviews_path, verified_path
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import review
from relearn.verbs.single_turn import SingleTurnReviewOptions


def applies(config: PipelineConfig) -> bool:
    return config.single_turn


def stages(ctx: Context) -> list[Stage]:
    return [Stage("review", "review with keep intervals", review.settings(ctx), [reviews_path(ctx)], lambda: run(ctx), ("verify",))]


def review_options(ctx: Context, pool: Path, out: Path) -> SingleTurnReviewOptions:
    r = ctx.config.review
    judges = r.options(pool, out, ctx.config.resolve(r.prices) if r.prices else None, ray=None).judges
    return SingleTurnReviewOptions(pool, out, judges, workers=r.workers, spend_cap=r.spend_cap_usd)


def run(ctx: Context) -> dict[str, Any]:
    summary = run_single_turn_review(review_options(ctx, verified_path(ctx), reviews_path(ctx)), ctx.reporter())
    run = summary.run
    if run.errors:
        raise RuntimeError(f"{run.not_reviewed} rollouts not reviewed (rerun to continue); first: {run.errors[0]}")
    counts = summary.counts
    return {
        "reviewer": "keep judge + auditor",
        "reviewed": counts.reviewed,
        "decisions": dict(counts.decisions),
        "protocols": dict(counts.protocols),
        "keep_intervals": counts.keep_intervals,
        "cost_usd": round(summary.ledger.spent_usd, 4),
    }
