"""eval:upstream, eval:V: serve each model's weights locally (the vLLM stand-in) and run the
fixed-budget evaluation on them (``relearn.ops.evaluate``, as `relearn eval run` does).

Identity: the [eval] table less ``pull``, its later fields left out at their default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, dataset_source, eval_dir, train_dir, upstream_dir
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import identity

NOT_IDENTITY = {"pull"}  # whether the engine pulls a missing image, not what runs in it
# Fields [eval] gained after pipelines were written without them: at their default they stay
# out of the stage's settings, so such a file keeps its stamps.
ADDED_EVAL_FIELDS = {"apply_patch", "cpus", "memory"}


def applies(config: PipelineConfig) -> bool:
    return config.eval is not None and config.train is not None


def eval_names(config: PipelineConfig) -> list[str]:
    """The evaluated models in the report's order: the start model, then every variant."""
    return ["upstream", *config.variants] if applies(config) else []


def stages(ctx: Context) -> list[Stage]:
    assert ctx.config.eval is not None
    settings = identity(ctx.config.eval, NOT_IDENTITY, ADDED_EVAL_FIELDS)
    upstream = Stage(
        "eval:upstream",
        "evaluate the starting weights",
        settings,
        [eval_dir(ctx, "upstream") / "report.json"],
        lambda: run(ctx, "upstream", upstream_dir(ctx)),
        ("upstream",),
        [eval_dir(ctx, "upstream")],
    )
    return [upstream] + [
        Stage(
            f"eval:{v}",
            f"evaluate the {v} model",
            settings,
            [eval_dir(ctx, v) / "report.json"],
            lambda v=v: run(ctx, v, train_dir(ctx, v) / "model"),
            (f"train:{v}",),
            [eval_dir(ctx, v)],
        )
        for v in ctx.config.variants
    ]


def run(ctx: Context, name: str, model_dir: Path) -> dict[str, Any]:
    from relearn.ops.evaluate import run_evaluation
    from relearn.serve.server import serve

    e = ctx.config.eval
    assert e is not None
    with serve(model_dir, model_name=name, max_new_tokens=e.max_new_tokens, max_context=e.max_context, seed=e.seed) as server:
        # The table's options run the episodes here, where the model is served on this machine's
        # loopback ([cluster]'s registry still applies, its address not).
        options = e.options(eval_dir(ctx, name), name, dataset_source(ctx, e.dataset), server.url, ctx.containers(e))
        summary = run_evaluation(options, ctx.reporter())
    return {
        "instances": summary.selected,
        "resolved": summary.report["resolved"],
        "rate": round(summary.report["resolved_rate"], 4),
        "infra_errors": len(summary.collect.infra_errors),
    }
