"""analyze: NLL of the training pool's and the held-out trajectories' kept (A \\ E) and excluded
(E) tokens under the start model and each trained variant (``relearn.pipeline.analysis``).

Identity: the [analyze] table less where it runs, with what the masks compiled by (tokenizer,
context), the held-out tasks and the variants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import (
    Context,
    analyze_dir,
    heldout_pool_path,
    reviews_path,
    train_dir,
    training_pool_path,
    training_pool_stage,
    upstream_dir,
)
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import masks as masks_stage

NOT_IDENTITY = {"device", "workers", "batch"}  # where and how many at once, not what it finds


def applies(config: PipelineConfig) -> bool:
    return config.analyze is not None and config.train is not None


def stages(ctx: Context) -> list[Stage]:
    c = ctx.config
    assert c.analyze is not None
    settings = {
        **c.analyze.model_dump(mode="json", exclude=NOT_IDENTITY), "tokenizer": c.masks.tokenizer, "ctx": c.masks.ctx,
        "heldout_tasks": sorted(c.masks.heldout_tasks or []), "variants": c.variants,
    }  # fmt: skip
    if c.masks.chat_template is not None:  # none adds nothing: the stamps written before the option stand
        settings["chat_template"] = masks_stage.settings(ctx)["chat_template"]  # the template's sha256, as masks stamp it
    # Only the tables move aside when stale: the score caches under analyze/MODEL/ are keyed
    # by model folder, tokenizer and review, so what is still valid in them is reused.
    outputs = [analyze_dir(ctx) / "nll.json", analyze_dir(ctx) / "nll.md"]
    needs = (training_pool_stage(ctx), "review", "upstream", *(f"train:{v}" for v in c.variants))
    return [Stage("analyze", "NLL of kept and excluded tokens under every model", settings, outputs, lambda: run(ctx), needs, outputs)]


def analyzed_models(ctx: Context) -> dict[str, Path]:
    """The start model first (the paired differences are against it), then every trained variant."""
    return {"upstream": upstream_dir(ctx), **{v: train_dir(ctx, v) / "model" for v in ctx.config.variants}}


def run(ctx: Context) -> dict[str, Any]:
    from relearn.analyze.pools import NamedPool
    from relearn.pipeline.analysis import analyze_models

    pools = [NamedPool("train", training_pool_path(ctx))]
    if ctx.config.masks.heldout_tasks:
        pools.append(NamedPool("heldout", heldout_pool_path(ctx)))
    assert ctx.config.analyze is not None
    return analyze_models(
        analyzed_models(ctx),
        pools,
        reviews_path(ctx),
        ctx.config.masks,
        ctx.config.analyze,
        analyze_dir(ctx),
        ctx.reporter(),
        ray=ctx.ray_address,
    )
