"""upstream: the starting weights every variant trains from and the upstream evaluation serves:
a tiny random model made here, or ``[train].init`` checked and used as is.

Identity: ``[train]``'s ``init``, ``tiny`` and ``seed``.
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, upstream_dir
from relearn.pipeline.runner import Stage

IDENTITY = ("init", "tiny", "seed")  # the rest of [train] is how to train, not where from


def applies(config: PipelineConfig) -> bool:
    return config.train is not None


def stages(ctx: Context) -> list[Stage]:
    train = ctx.config.train
    assert train is not None
    dumped = train.model_dump(mode="json")
    # A folder given as init is not the work folder's: nothing of it to check for or move aside.
    made = [upstream_dir(ctx)] if train.tiny else []
    return [
        Stage(
            "upstream",
            "make the starting weights",
            {k: dumped[k] for k in IDENTITY},
            [upstream_dir(ctx) / "config.json"] if train.tiny else [],
            lambda: run(ctx),
            (),
            made,
        )
    ]


def run(ctx: Context) -> dict[str, Any]:
    train = ctx.config.train
    assert train is not None
    if not train.tiny:
        if not (upstream_dir(ctx) / "config.json").exists():
            raise FileNotFoundError(f"[train].init {upstream_dir(ctx)}: no config.json (not a Hugging Face model folder)")
        return {"model": str(upstream_dir(ctx))}
    from relearn.train.model import build_model, parameter_count

    model = build_model(tiny=train.tiny, seed=train.seed)
    model.config.use_cache = True
    target = upstream_dir(ctx)
    tmp = target.with_name(".upstream.tmp")
    model.save_pretrained(tmp)
    ctx.tokenizer().save_pretrained(tmp)
    tmp.replace(target)
    return {"model": f"tiny {train.tiny}", "parameters": parameter_count(model)}
