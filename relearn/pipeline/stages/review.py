"""review: `relearn review` over the verified pool (``relearn.ops.review``); with judges, their
cost estimate is printed first; the counts come from one pass over reviews.jsonl.

Identity: the [review] table less transport (URLs, key, workers, polling) and ``estimate``.
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, reviews_path, verified_path
from relearn.pipeline.runner import Stage

# Where the judges are reached and how fast, not what they say; ``estimate`` stops the run
# before any review is written.
# ``reviewer`` only names what judge1/judge2 already decide (none: the heuristic reviewer), so a
# file that now asks for the heuristic by name keeps its stamps.
NOT_IDENTITY = {"base_url", "judge2_base_url", "api_key_env", "workers", "poll_interval", "estimate", "reviewer"}


def applies(config: PipelineConfig) -> bool:
    return not config.single_turn


def settings(ctx: Context) -> dict[str, Any]:
    """The [review] table's identity, whichever review reads it."""
    return ctx.config.review.model_dump(mode="json", exclude=NOT_IDENTITY)


def stages(ctx: Context) -> list[Stage]:
    from relearn.ops.reporting import OpError

    r, where = ctx.config.review, ctx.config.source or "the pipeline file"
    # Before the first stage runs (a pool is never collected for a review that cannot start);
    # the verb's check (relearn.ops.review.check_reviewer) in the file's words.
    if r.reviewer == "judges" and not (r.judge1 or r.judge2):
        raise OpError(
            f'{where}: [review] names no reviewer: name judge1 (and judge2 when it differs), or write reviewer = "heuristic" to '
            "ask for the offline heuristic reviewer (for demos and tests)"
        )
    if r.reviewer == "heuristic" and (r.judge1 or r.judge2):
        raise OpError(f'{where}: [review] reviewer = "heuristic" calls no judge: drop judge1 and judge2, or drop reviewer')
    describe = "review with " + ("the judges" if r.judge1 or r.judge2 else "the heuristic reviewer")
    return [Stage("review", describe, settings(ctx), [reviews_path(ctx)], lambda: run(ctx), ("verify",))]


def run(ctx: Context) -> dict[str, Any]:
    from relearn.ops.reporting import OpError
    from relearn.ops.review import count_reviews, run_review

    r = ctx.config.review
    options = r.options(verified_path(ctx), reviews_path(ctx), ctx.config.resolve(r.prices) if r.prices else None, ray=ctx.ray_address)
    summary = run_review(options, ctx.reporter(), on_estimate=lambda e: ctx.console.print(e.render()))
    if r.estimate:
        raise OpError("[review] estimate = true: the estimate is above and nothing was sent; set estimate = false to review")
    run, ledger = summary.run, summary.ledger
    assert run is not None and ledger is not None
    if run.errors:
        raise RuntimeError(f"{run.not_reviewed} trajectories not reviewed (rerun to continue); first: {run.errors[0]}")
    counts = count_reviews(reviews_path(ctx))
    return {
        "reviewer": summary.reviewer,
        "reviewed": counts.reviewed,
        "decisions": dict(counts.decisions),
        "defects": counts.defects,
        "cost_usd": round(ledger.spent_usd, 4),
    }
