"""The stages of a ``[pool.single_turn]`` pipeline where they differ from the agentic ones,
each the operation `relearn single-turn VERB` runs (``relearn.ops.single_turn``), with its
options from the file:

    pool    the rollout rows imported (``[pool.single_turn]`` format, columns, thinking)
    verify  every response graded by its task's kind: Math by math-verify, Code by unit tests
            in containers, IF by IFEval's checkers (``[pool.single_turn]`` tasks)
    review  keep intervals for Math and Code positives, full supervision for IF positives
            (``[review]``: judge1 the keep judge, judge2 the auditor)
    masks   ``ross`` = A ∩ K (the keep review's complement is its E), in the template's
            thinking or no-thinking form (``relearn.pipeline.stages.masks_stage``)

The folder layout is the agentic one (``relearn.pipeline.stages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from relearn.ops.importing import count_pool
from relearn.ops.reporting import OpError
from relearn.ops.single_turn import (
    SingleTurnImportOptions,
    SingleTurnReviewOptions,
    SingleTurnVerifyOptions,
    run_single_turn_import,
    run_single_turn_review,
    run_single_turn_verify,
)
from relearn.pipeline.config import SingleTurnConfig

if TYPE_CHECKING:
    from relearn.pipeline.stages import Context


def _config(ctx: Context) -> SingleTurnConfig:
    config = ctx.config.pool.single_turn
    assert config is not None
    return config


def import_options(ctx: Context, out: Path) -> SingleTurnImportOptions:
    """No paths with ``tasks = "mini"``: the suite's own rollouts."""
    from envs.single_turn.tasks import MINI_ROLLOUTS

    config = _config(ctx)
    paths = [ctx.config.resolve(p) for p in config.paths] if config.paths else [MINI_ROLLOUTS]
    return SingleTurnImportOptions(paths, out, config.format, dict(config.columns), config.thinking)


def verify_options(ctx: Context, pool: Path, out: Path) -> SingleTurnVerifyOptions:
    tasks = _config(ctx).tasks
    return SingleTurnVerifyOptions(pool, out, tasks if tasks == "mini" else str(ctx.config.resolve(tasks)))


def review_options(ctx: Context, pool: Path, out: Path) -> SingleTurnReviewOptions:
    r = ctx.config.review
    judges = r.options(pool, out, ctx.config.resolve(r.prices) if r.prices else None, ray=None).judges
    return SingleTurnReviewOptions(pool, out, judges, workers=r.workers, spend_cap=r.spend_cap_usd)


def pool_stage(ctx: Context, out: Path) -> dict[str, Any]:
    summary = run_single_turn_import(import_options(ctx, out), ctx.reporter())
    if summary.rejected:
        ctx.notes.append(f"{len(summary.rejected)} rollout row(s) rejected by the import; first: {summary.rejected[0]}")
    counts = count_pool(out)
    if not counts.trajectories:
        first = f" (first rejected: {summary.rejected[0]})" if summary.rejected else ""
        raise OpError(f"[pool.single_turn]: no rollout in {out}{first}")
    return {
        "files": summary.files,
        "imported": summary.imported,
        "skipped": summary.skipped_existing,
        "rejected": len(summary.rejected),
        "trajectories": counts.trajectories,
    }


def verify_stage(ctx: Context, pool: Path, out: Path) -> dict[str, Any]:
    """Grade every response; resumable (graded trajectories are appended to a partial file)."""
    summary = run_single_turn_verify(verify_options(ctx, pool, out), ctx.reporter())
    if summary.task_problems:
        ctx.notes.append(f"{len(summary.task_problems)} unreadable task record(s); first: {summary.task_problems[0]}")
    return {
        **dict(sorted(summary.graded.items())),
        "resumed": summary.resumed,
        "positive": summary.positive,
        "by_kind": dict(sorted(summary.by_kind.items())),
        "ungradable_first": summary.ungradable[:3],
        "unreadable": len(summary.unreadable),
    }


def review_stage(ctx: Context, pool: Path, out: Path) -> dict[str, Any]:
    summary = run_single_turn_review(review_options(ctx, pool, out), ctx.reporter())
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
