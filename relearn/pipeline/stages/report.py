"""report: every stage's counts, the paper's comparison of the evaluated models, the training
curves, the contrasts and the NLL analysis (``relearn.pipeline.report``), under report/.

Identity: the evaluated models' names. It needs every stage before it, so it is the one stage
that always follows the rest; its ``run`` reads those stages' stamps, so ``plan`` is given it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relearn.pipeline.context import Context, analyze_dir, contrasts_path, eval_dir, report_dir, train_dir
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import evaluate


def stages(ctx: Context, before: list[Stage], run: Callable[[], dict[str, Any]]) -> list[Stage]:
    return [
        Stage(
            "report",
            "write the report",
            {"names": evaluate.eval_names(ctx.config)},
            [report_dir(ctx) / "report.md", report_dir(ctx) / "report.json"],
            run,
            tuple(s.name for s in before),
            [report_dir(ctx)],
        )
    ]


def run(ctx: Context, stages: list[Stage]) -> dict[str, Any]:
    """The report of ``stages`` (the whole plan, this stage included)."""
    from relearn.pipeline.report import write_pipeline_report

    config = ctx.config
    variants = config.variants if config.train is not None else []
    names = evaluate.eval_names(config)
    write_pipeline_report(
        ctx.workdir, stages, names, {v: train_dir(ctx, v) for v in variants}, {n: eval_dir(ctx, n) for n in names}, report_dir(ctx),
        contrasts=contrasts_path(ctx) if len(config.variants) > 1 else None,
        analysis=analyze_dir(ctx) / "nll.json" if config.analyze is not None and config.train is not None else None,
    )  # fmt: skip
    return {"report": str(report_dir(ctx) / "report.md")}
