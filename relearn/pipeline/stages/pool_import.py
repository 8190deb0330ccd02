"""pool, ``[pool.import]``: `relearn import` into the work folder's pool (``relearn.ops.importing``);
a rerun resumes, skipping what the pool holds.

Identity: ``tasks`` and the pool table (every import field decides what is read), and what the
import sources hold (their sizes and times: a source that grew is imported again).
"""

from __future__ import annotations

from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, pool_path
from relearn.pipeline.runner import Stage


def applies(config: PipelineConfig) -> bool:
    return config.pool.import_ is not None


def stages(ctx: Context) -> list[Stage]:
    config = ctx.config.pool.import_
    assert config is not None
    settings = {"tasks": ctx.config.tasks, **ctx.config.pool.model_dump(mode="json", by_alias=True)}
    sources = [ctx.config.resolve(p) for p in config.paths]  # grown or edited: imported again
    missing = [f"{written} ({path})" for written, path in zip(config.paths, sources, strict=True) if not path.exists()]
    if missing:  # before any stage runs, and before a dry run says the import would run
        from relearn.ops.reporting import OpError

        where = ctx.config.source or "the pipeline file"
        raise OpError(
            f"{where}: [pool.import] paths: no such file or folder: {', '.join(missing)}; paths are relative to the pipeline file's folder"
        )
    return [Stage("pool", "import", settings, [pool_path(ctx)], lambda: run(ctx), workspace=[pool_path(ctx).parent], reads=sources)]


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
    for why, count in summary.not_imported.most_common():
        ctx.notes.append(f"{count} input(s) not imported: {why}")
    counts = count_pool(out)
    if not counts.trajectories:
        raise OpError(f"[pool.import]: no trajectory in {out} ({len(summary.rejected)} rejected; first: {summary.rejected[0]})"
                      if summary.rejected else f"[pool.import]: no trajectory in {out}")  # fmt: skip
    return {
        "files": summary.files,
        "imported": summary.imported,
        "skipped": summary.skipped_existing,
        "rejected": len(summary.rejected),
        **({"not imported": dict(summary.not_imported)} if summary.not_imported else {}),
        "warnings": len(summary.warnings),
        "trajectories": counts.trajectories,
        "graded": counts.graded,
        "imported_grades": counts.imported_grades,
        "positive": counts.positive,
        "exit_status": dict(counts.exit_status),
    }
