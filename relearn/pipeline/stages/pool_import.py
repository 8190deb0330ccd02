"""pool, ``[pool.import]``: `relearn import` into the work folder's pool (``relearn.ops.importing``);
a rerun resumes, skipping what the pool holds.

Identity: ``tasks`` and the pool table (every import field decides what is read).
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, pool_path
from relearn.pipeline.runner import Stage


def applies(config: PipelineConfig) -> bool:
    return config.pool.import_ is not None


def stages(ctx: Context) -> list[Stage]:
    settings = {"tasks": ctx.config.tasks, **ctx.config.pool.model_dump(mode="json", by_alias=True)}
    return [Stage("pool", "import", settings, [pool_path(ctx)], lambda: run(ctx), workspace=[pool_path(ctx).parent])]


def run(ctx: Context) -> dict[str, Any]:
    """The counts come from the import and one streaming pass over the pool."""
    from relearn.ops.importing import count_pool, run_import
    from relearn.ops.reporting import OpError

    config = ctx.config.pool.import_
    assert config is not None
    out = pool_path(ctx)
    summary = run_import(config.options([ctx.config.resolve(p) for p in config.paths], out), ctx.reporter())
    for problem in summary.rejected[:3]:
        ctx.console.print(f"  [yellow]rejected:[/yellow] {problem}", highlight=False)
    if summary.rejected:
        ctx.notes.append(f"{len(summary.rejected)} input file(s) or row(s) rejected by the import; first: {summary.rejected[0]}")
    counts = count_pool(out)
    if not counts.trajectories:
        raise OpError(f"[pool.import]: no trajectory in {out} ({len(summary.rejected)} rejected; first: {summary.rejected[0]})"
                      if summary.rejected else f"[pool.import]: no trajectory in {out}")  # fmt: skip
    return {
        "files": summary.files,
        "imported": summary.imported,
        "skipped": summary.skipped_existing,
        "rejected": len(summary.rejected),
        "warnings": len(summary.warnings),
        "trajectories": counts.trajectories,
        "graded": counts.graded,
        "imported_grades": counts.imported_grades,
        "positive": counts.positive,
        "exit_status": dict(counts.exit_status),
    }
