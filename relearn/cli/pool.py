"""Pool verbs: ``relearn import``, ``relearn validate`` (the work: ``relearn.ops.importing``, ``relearn.ops.validate``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from harness.import_run import ROW_FORMATS, ChatPreset, ImportFormat, ImportSummary
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, run_op, show_problems, show_warnings
from relearn.ops.importing import ImportOptions, run_import
from relearn.ops.validate import ValidateOptions, run_validate


def _import_table(fmt: str, output: Path, summary: ImportSummary) -> Table:
    table = Table(title=f"relearn import {fmt} -> {output}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("files read", str(summary.files))
    table.add_row("input size", f"{summary.input_bytes / 1e6:.2f} MB")
    table.add_row("trajectories imported", str(summary.imported))
    table.add_row("messages imported", str(summary.messages))
    table.add_row("already in the pool (skipped)", str(summary.skipped_existing))
    # Row formats reject a damaged row and read on; whole-file formats reject the file.
    table.add_row("files or records rejected" if fmt in ROW_FORMATS else "files rejected", str(len(summary.rejected)))
    table.add_row("warnings", str(len(summary.warnings)))
    for kind, count in summary.unknown.most_common():
        table.add_row(f"unknown {kind} (kept)", str(count))
    return table


def import_command(
    fmt: Annotated[
        ImportFormat,
        typer.Argument(metavar="FORMAT", help=" | ".join(ImportFormat)),
    ],
    paths: Annotated[list[Path], typer.Argument(metavar="PATH", help="Files, or directories walked recursively (e.g. ~/.codex/sessions).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Pool to append to (.jsonl or .jsonl.zst).")],
    salvage: Annotated[
        bool, typer.Option(help="Keep what parses from a damaged file (each skipped line is a warning) instead of rejecting it.")
    ] = ImportOptions.salvage,
    overwrite: Annotated[
        bool, typer.Option(help="Rebuild the pool instead of appending to it (atomic swap at the end).")
    ] = ImportOptions.overwrite,
    preset: Annotated[
        ChatPreset | None,
        typer.Option(help="chat: the columns of a published set (swe-gym, swe-smith, nebius-swe-agent, swe-rebench-openhands)."),
    ] = ImportOptions.preset,
    messages: Annotated[
        str | None,
        typer.Option(
            "--messages", help="chat: the column of messages (default: the preset's, else `messages`; dotted paths reach nested columns)."
        ),
    ] = ImportOptions.messages,
    tools: Annotated[
        str | None, typer.Option("--tools", help="chat: the column of tool schemas (default: the preset's, else `tools`).")
    ] = ImportOptions.tools,
    id_column: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="chat: the column(s) of the trajectory's own id, comma-separated (default: the preset's, else `id`, else a content hash).",
        ),
    ] = ImportOptions.id,
    task_id: Annotated[
        str | None, typer.Option("--task-id", help="chat: the column of the task id (default `instance_id`).")
    ] = ImportOptions.task_id,
    resolved: Annotated[
        str | None, typer.Option("--resolved", help="chat: the column of the resolved flag (default: the preset's, else `resolved`).")
    ] = ImportOptions.resolved,
    patch: Annotated[
        str | None, typer.Option("--patch", help="chat: the column of the final patch (default: the preset's, else `patch`).")
    ] = ImportOptions.patch,
) -> None:
    """Import other tools' trajectories into a pool of relearn trajectories.

    Appends to the pool and skips trajectories whose stable id it already holds, so a rerun over the same inputs adds nothing. A damaged file (or, in row formats, a damaged row) is rejected with its file, line and field and the batch goes on; unknown record types and fields are kept under each trajectory's `source` and counted. A grade the source carries (reward, resolved) becomes the outcome, marked imported, until `relearn verify` grades the patch. The pipeline's `[pool.import]` table takes the same fields.
    """
    options = ImportOptions(
        format=fmt.value, paths=paths, output=output, salvage=salvage, overwrite=overwrite, preset=preset.value if preset else None,
        messages=messages, tools=tools, id=id_column, task_id=task_id, resolved=resolved, patch=patch,
    )  # fmt: skip
    summary = run_op(run_import, options)
    show_problems("warnings", summary.warnings)
    show_problems("rejected", [str(e) for e in summary.rejected])
    out.print(_import_table(fmt.value, output, summary))
    raise typer.Exit(EXIT_PARTIAL if summary.rejected else EXIT_OK)


def validate_command(
    pools: Annotated[list[Path], typer.Argument(metavar="POOL", help="Pool files (.jsonl or .jsonl.zst).")],
) -> None:
    """Check pools: records parse, ids are unique, tool results answer earlier calls.

    Reads each pool once, one trajectory at a time. Lists each problem with its file, line and field; exits 1 when there is any, 2 when a pool file is missing.
    """
    summary = run_op(run_validate, ValidateOptions(pools))
    show_problems("unreadable records", [str(e) for e in summary.unreadable])
    show_problems("problems", summary.problems)
    table = Table(title="relearn validate", show_header=False)
    table.add_row("trajectories", str(summary.trajectories))
    table.add_row("unreadable records", str(len(summary.unreadable)))
    table.add_row("trajectories with problems", str(summary.with_problems))
    for name, count in summary.formats.most_common():
        table.add_row(f"from {name}", str(count))
    for name, count in summary.exit_status.most_common():
        table.add_row(f"exit {name}", str(count))
    out.print(table)
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_OK if summary.clean and not warned else EXIT_PARTIAL)


def register(app: typer.Typer) -> None:
    app.command("import")(import_command)
    app.command("validate")(validate_command)
