"""verify, ``[pool.single_turn]``: every response graded by its task's kind, as `relearn
single-turn verify` does (``relearn.ops.single_turn``): Math by math-verify, Code by unit tests in
containers, IF by IFEval's checkers; resumable (graded trajectories are appended to a partial file).

Identity: ``tasks`` only, as the agentic verify's (the file may write no [verify] field); the
tasks that grade are [pool.single_turn]'s, in the pool's identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relearn.ops.single_turn import run_single_turn_verify
from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, pool_path, verified_path
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import verify
from relearn.pipeline.stages.pool_single_turn import single_turn_table
from relearn.verbs.single_turn import SingleTurnVerifyOptions


def applies(config: PipelineConfig) -> bool:
    return config.single_turn


def stages(ctx: Context) -> list[Stage]:
    settings = {"tasks": ctx.config.tasks}
    return [
        Stage(
            "verify",
            "grade what the pool has not graded",
            settings,
            [verified_path(ctx)],
            lambda: run(ctx),
            ("pool",),
            verify.workspace(ctx),
        )
    ]


def verify_options(ctx: Context, pool: Path, out: Path) -> SingleTurnVerifyOptions:
    tasks = single_turn_table(ctx).tasks
    return SingleTurnVerifyOptions(pool, out, tasks if tasks == "mini" else str(ctx.config.resolve(tasks)))


def run(ctx: Context) -> dict[str, Any]:
    summary = run_single_turn_verify(verify_options(ctx, pool_path(ctx), verified_path(ctx)), ctx.reporter())
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
