"""train:V: `relearn train` on variant V's dataset (``relearn.ops.train``), from the upstream weights.

Identity: the whole [train] table.
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, dataset_dir, train_dir, upstream_dir
from relearn.pipeline.runner import Stage


def applies(config: PipelineConfig) -> bool:
    return config.train is not None


def stages(ctx: Context) -> list[Stage]:
    assert ctx.config.train is not None
    settings = ctx.config.train.model_dump(mode="json")
    return [
        Stage(
            f"train:{v}",
            f"train on the {v} dataset",
            settings,
            [train_dir(ctx, v) / "model" / "config.json"],
            lambda v=v: run(ctx, v),
            (f"masks:{v}", "upstream"),
            [train_dir(ctx, v)],
        )
        for v in ctx.config.variants
    ]


def run(ctx: Context, variant: str) -> dict[str, Any]:
    from relearn.ops.train import run_train

    t = ctx.config.train
    assert t is not None
    opts = t.options(
        dataset_dir(ctx, variant), train_dir(ctx, variant), str(upstream_dir(ctx)), ctx.config.masks.tokenizer, ctx.config.chat_template()
    )  # the model is saved with the template its dataset was rendered with
    summary = run_train(opts, console=ctx.console)
    if summary.stopped_by:
        raise KeyboardInterrupt
    return {
        "steps": summary.steps,
        "first_loss": round(summary.first_loss, 4) if summary.first_loss is not None else None,
        "last_loss": round(summary.last_loss, 4) if summary.last_loss is not None else None,
        "supervised_tokens": summary.supervised,
        "refused_samples": len(summary.report.problems),
    }
