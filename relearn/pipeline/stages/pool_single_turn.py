"""pool, ``[pool.single_turn]``: single-turn RL rollouts (Math, Code, instruction following)
imported as `relearn single-turn import` does (``relearn.ops.single_turn``): the table's format,
columns and thinking form.

Identity: the pool table (``tasks`` is the single-turn table's own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relearn.ops.importing import count_pool
from relearn.ops.reporting import OpError
from relearn.ops.single_turn import run_single_turn_import
from relearn.pipeline.config import PipelineConfig, SingleTurnConfig
from relearn.pipeline.context import Context, pool_path
from relearn.pipeline.runner import Stage
from relearn.verbs.single_turn import SingleTurnImportOptions


def applies(config: PipelineConfig) -> bool:
    return config.pool.single_turn is not None


def stages(ctx: Context) -> list[Stage]:
    # The top-level ``tasks`` stays in, at its default (the file may not write it), as it was
    # when the pool stages shared one identity: existing work folders keep their stamps.
    settings = {"tasks": ctx.config.tasks, **ctx.config.pool.model_dump(mode="json", by_alias=True)}
    sources = import_options(ctx, pool_path(ctx)).paths  # grown or edited: imported again
    return [
        Stage(
            "pool",
            "import single-turn rollouts",
            settings,
            [pool_path(ctx)],
            lambda: run(ctx),
            workspace=[pool_path(ctx).parent],
            reads=sources,
        )
    ]


def single_turn_table(ctx: Context) -> SingleTurnConfig:
    config = ctx.config.pool.single_turn
    assert config is not None
    return config


def import_options(ctx: Context, out: Path) -> SingleTurnImportOptions:
    """No paths with ``tasks = "mini"``: the suite's own rollouts."""
    from envs.single_turn.tasks import MINI_ROLLOUTS

    config = single_turn_table(ctx)
    paths = [ctx.config.resolve(p) for p in config.paths] if config.paths else [MINI_ROLLOUTS]
    return config.import_options(paths, out)


def run(ctx: Context) -> dict[str, Any]:
    out = pool_path(ctx)
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
