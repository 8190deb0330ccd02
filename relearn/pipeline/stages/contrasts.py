"""contrasts: the variants' trajectory sets side by side (``relearn.pipeline.contrasts``); refuses,
so training does not start, when ROSS and ROSS w/o mask differ. The ids are written first, also
when it refuses.

Identity: the variants, sorted.
"""

from __future__ import annotations

import json
from typing import Any

from records.pools import write_text_atomic
from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, contrasts_path, dataset_dir
from relearn.pipeline.runner import Stage


def applies(config: PipelineConfig) -> bool:
    return len(config.variants) > 1


def stages(ctx: Context) -> list[Stage]:
    # Before any training, so a run stops here (the runner stops at a failed stage) when the
    # contrasts are broken; training does not need it, or retraining one variant would follow
    # every other variant's masks.
    variants = ctx.config.variants
    return [
        Stage(
            "contrasts",
            "compare the variants' trajectory sets",
            {"variants": sorted(variants)},
            [contrasts_path(ctx)],
            lambda: run(ctx),
            tuple(f"masks:{v}" for v in variants),
            [contrasts_path(ctx)],
        )
    ]


def run(ctx: Context) -> dict[str, Any]:
    from relearn.pipeline.contrasts import ContrastError, contrast_problem, read_contrasts

    datasets = {v: dataset_dir(ctx, v) for v in ctx.config.variants}
    contrasts = read_contrasts(datasets)
    write_text_atomic(contrasts_path(ctx), json.dumps(contrasts.to_json(), indent=1, sort_keys=True))
    problem = contrast_problem(contrasts, datasets)
    if problem is not None:
        raise ContrastError(f"{problem} All ids: {contrasts_path(ctx)}")
    return {**{v: len(ids) for v, ids in contrasts.sets.items()}, "relation": contrasts.relation()}
