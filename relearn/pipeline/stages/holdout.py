"""holdout: the trajectories of ``[masks].heldout_tasks`` set apart from what every variant trains
on (``relearn.pipeline.holdout``), so the analyze stage has verified, reviewed trajectories no
model saw.

Identity: the held-out task ids, sorted (a set: their order decides nothing).
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, heldout_dir, heldout_pool_path, training_pool_path, verified_path
from relearn.pipeline.runner import Stage


def applies(config: PipelineConfig) -> bool:
    return bool(config.masks.heldout_tasks)


def stages(ctx: Context) -> list[Stage]:
    tasks = ctx.config.masks.heldout_tasks or []
    return [
        Stage(
            "holdout",
            f"set {len(tasks)} held-out tasks apart",
            {"heldout_tasks": sorted(tasks)},
            [training_pool_path(ctx), heldout_pool_path(ctx)],
            lambda: run(ctx),
            ("verify",),
            [heldout_dir(ctx)],
        )
    ]


def run(ctx: Context) -> dict[str, Any]:
    from relearn.pipeline.holdout import split_by_task

    return split_by_task(verified_path(ctx), set(ctx.config.masks.heldout_tasks or ()), training_pool_path(ctx), heldout_pool_path(ctx))
