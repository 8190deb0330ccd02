"""pool, ``[pool.collect]``: `relearn collect` into the work folder's pool (``relearn.ops.collect``).

Identity: ``tasks`` and the pool table, less transport (URL, key, pulling), with the protocol
(``policy``) written out as files written before ``agent`` existed said it.
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, dataset_source, pool_path
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import identity

NOT_IDENTITY = {"base_url", "api_key_env", "pull"}
# Fields [pool.collect] gained after pipelines were written without them: at their default they
# stay out of the stage's settings, so such a file keeps its stamps (None values are left out
# anyway, by the runner).
ADDED_COLLECT_FIELDS = {"agent", "apply_patch", "reasoning_effort", "token_ids", "price_in", "price_out", "cpus", "memory"}


def applies(config: PipelineConfig) -> bool:
    return config.pool.collect is not None


def stages(ctx: Context) -> list[Stage]:
    c = ctx.config
    collect = c.pool.collect
    assert collect is not None
    settings = c.pool.model_dump(mode="json", by_alias=True)
    settings["collect"] = identity(collect, NOT_IDENTITY, ADDED_COLLECT_FIELDS)
    settings["collect"]["policy"] = collect.policy or ("chat" if collect.agent == "builtin" else "responses")
    return [Stage("pool", "collect", {"tasks": c.tasks, **settings}, [pool_path(ctx)], lambda: run(ctx), workspace=[pool_path(ctx).parent])]


def run(ctx: Context) -> dict[str, Any]:
    from relearn.ops.collect import run_collect

    c = ctx.config.pool.collect
    assert c is not None
    options = c.options(pool_path(ctx).parent, dataset_source(ctx, ctx.config.tasks), ctx.containers(c), base_url=ctx.pool_url)
    summary = run_collect(options, ctx.reporter())
    for problem in summary.task_problems + summary.image_problems:
        ctx.notes.append(problem)
    episodes = summary.collect
    if episodes.errors and not episodes.finished and not episodes.skipped:
        raise RuntimeError(f"no episode finished: {episodes.errors[0]}")
    return {
        "trajectories": summary.trajectories,
        "resolved": summary.resolved,
        "episode_errors": len(episodes.errors) + len(episodes.infra_errors),
        "exit_status": summary.exit_status,
    }
