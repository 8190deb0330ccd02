"""verify: grade what the pool has not graded yet, through the same executor, images and limits
as `relearn verify` (``relearn.ops.verify.verify_pool``). Imported trajectories carry a final
patch but no verdict of ours; collected ones were graded right after their episode and are kept.
A grade the source carried (a Harbor trial's reward) is kept and counted as not re-verified,
unless ``[verify] again = true``, which grades it here where the task and a patch exist.
The pool is streamed; an interrupted run resumes by trajectory id.

Identity: ``tasks`` and the [verify] fields written away from their default, less transport.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, dataset_source, pool_path, verdicts_path, verified_path
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import identity

NOT_IDENTITY = {"workers", "pull"}  # how many containers at once, and whether the engine pulls: not the grades


def applies(config: PipelineConfig) -> bool:
    return not config.single_turn


def workspace(ctx: Context) -> list[Path]:
    """What a stale verify stage moves aside, whichever grades the pool."""
    return [verified_path(ctx), verdicts_path(ctx).parent, ctx.workdir / "verify-logs"]


def stages(ctx: Context) -> list[Stage]:
    verify = ctx.config.verify
    # Every [verify] field counts as added: pipelines written before [verify] existed keep their stamps.
    settings = {"tasks": ctx.config.tasks, **identity(verify, NOT_IDENTITY, set(type(verify).model_fields))}
    return [
        Stage("verify", "grade what the pool has not graded", settings, [verified_path(ctx)], lambda: run(ctx), ("pool",), workspace(ctx))
    ]


def run(ctx: Context) -> dict[str, Any]:
    from relearn.ops.verify import verify_pool

    v = ctx.config.verify
    tasks = dataset_source(ctx, ctx.config.tasks)
    options = v.options(pool_path(ctx), verified_path(ctx), verdicts_path(ctx), tasks, ctx.workdir / "verify-logs", ctx.containers(v))
    summary = verify_pool(options, ctx.reporter())
    for problem in summary.image_problems:
        ctx.notes.append(problem)
    if summary.errors:
        raise RuntimeError(f"{len(summary.errors)} patch(es) not graded (rerun to continue); first: {summary.errors[0]}")
    on_nodes = {"graded by node": summary.per_node} if set(summary.per_node) - {"local"} else {}
    network = {"network": "on"} if summary.network else {}
    if summary.network_needed:
        network["unresolved, tests needed the network ([verify] network = true)"] = summary.network_needed
    return {**summary.counts, "resolved": summary.resolved, "unreadable": len(summary.unreadable), **on_nodes, **network}
