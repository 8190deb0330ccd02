"""A pipeline file's plan: its stages in order (``relearn.pipeline.stages``), and running them.

Each slot is a stage of the order, given as the modules that can fill it; a file's plan takes
from each slot the module(s) whose ``applies`` says yes (a slot's alternatives exclude each
other: the pool is collected, imported or single-turn), then the report, which needs them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context
from relearn.pipeline.runner import Stage, StageResult, run_stages
from relearn.pipeline.stages import (
    analyze,
    audit,
    contrasts,
    evaluate,
    holdout,
    masks,
    pool_collect,
    pool_import,
    pool_single_turn,
    report,
    review,
    review_single_turn,
    train,
    upstream,
    verify,
    verify_single_turn,
)

SLOTS = (
    (pool_collect, pool_import, pool_single_turn),
    (verify, verify_single_turn),
    (review, review_single_turn),
    (holdout,),
    (audit,),
    (masks,),
    (contrasts,),
    (upstream,),
    (train,),
    (analyze,),
    (evaluate,),
)


def plan(ctx: Context, run_report: Callable[[], dict[str, Any]]) -> list[Stage]:
    """Every stage of the file, in order, with what decides its outputs; ``run_report`` writes the report."""
    stages: list[Stage] = []
    for slot in SLOTS:
        for module in slot:
            if module.applies(ctx.config):
                stages.extend(module.stages(ctx))
    return stages + report.stages(ctx, stages, run_report)


def run_pipeline(
    config: PipelineConfig, console: Console, *, pool_url: str | None = None, dry_run: bool = False
) -> tuple[list[StageResult], Context]:
    """Run every stage of ``config`` that is not current; returns each stage's result."""
    ctx = Context(config, console, pool_url=pool_url)
    stages: list[Stage] = []
    stages.extend(plan(ctx, lambda: report.run(ctx, stages)))
    return run_stages(stages, config.workdir, console, dry_run=dry_run), ctx
