"""Pool verbs: ``relearn import``, ``relearn validate``."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from harness.import_run import ImportSummary, discover, import_files
from harness.importers import chat
from records.pools import RecordError, read_trajectories_lenient
from records.trajectory import Trajectory, tool_call_pairs
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems


class ImportFormat(StrEnum):
    codex = "codex"
    mini_swe_agent = "mini-swe-agent"
    swe_agent = "swe-agent"
    atif = "atif"
    openhands = "openhands"
    chat = "chat"
    nemo_gym = "nemo-gym"
    verl = "verl"


ChatPreset = StrEnum("ChatPreset", {name.replace("-", "_"): name for name in chat.PRESETS})  # type: ignore[misc]
ROW_FORMATS = {"openhands", "chat", "nemo-gym", "verl"}


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
        typer.Argument(metavar="FORMAT", help="codex | mini-swe-agent | swe-agent | atif | openhands | chat | nemo-gym | verl"),
    ],
    paths: Annotated[list[Path], typer.Argument(help="Files, or directories walked recursively (e.g. ~/.codex/sessions).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Pool to append to (.jsonl or .jsonl.zst).")],
    salvage: Annotated[
        bool, typer.Option(help="Keep what parses from a damaged file (each skipped line is a warning) instead of rejecting it.")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Rebuild the pool instead of appending to it (atomic swap at the end).")] = False,
    preset: Annotated[
        ChatPreset | None,
        typer.Option(help="chat: the columns of a published set (swe-gym, swe-smith, nebius-swe-agent, swe-rebench-openhands)."),
    ] = None,
    messages: Annotated[
        str | None,
        typer.Option(
            "--messages", help="chat: the column of messages (default: the preset's, else `messages`; dotted paths reach nested columns)."
        ),
    ] = None,
    tools: Annotated[
        str | None, typer.Option("--tools", help="chat: the column of tool schemas (default: the preset's, else `tools`).")
    ] = None,
    id_column: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="chat: the column(s) of the trajectory's own id, comma-separated (default: the preset's, else `id`, else a content hash).",
        ),
    ] = None,
    task_id: Annotated[str | None, typer.Option("--task-id", help="chat: the column of the task id (default `instance_id`).")] = None,
    resolved: Annotated[
        str | None, typer.Option("--resolved", help="chat: the column of the resolved flag (default: the preset's, else `resolved`).")
    ] = None,
    patch: Annotated[
        str | None, typer.Option("--patch", help="chat: the column of the final patch (default: the preset's, else `patch`).")
    ] = None,
) -> None:
    """Import other tools' trajectories into a pool of relearn trajectories.

    Appends to the pool and skips trajectories whose stable id it already holds, so a
    rerun over the same inputs adds nothing. A damaged file (or, in row formats, a damaged
    row) is rejected with its file, line and field and the batch goes on; unknown record
    types and fields are kept under each trajectory's `source` and counted. A grade the
    source carries (reward, resolved) becomes the outcome, marked imported, until
    `relearn verify` grades the patch.
    """
    columns = {"messages": messages, "tools": tools, "id": id_column, "task_id": task_id, "resolved": resolved, "patch": patch}
    if fmt is not ImportFormat.chat and (preset is not None or any(v is not None for v in columns.values())):
        named = ["--preset" if preset is not None else "", *(f"--{k.replace('_', '-')}" for k, v in columns.items() if v is not None)]
        err.print(f"[red]error:[/red] {', '.join(n for n in named if n)} only apply to the chat format")
        raise typer.Exit(EXIT_USAGE)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        err.print(f"[red]error:[/red] no such file or directory: {', '.join(missing)}")
        raise typer.Exit(EXIT_USAGE)
    importer = chat.ChatImporter(chat.options_for(preset.value if preset else None, **columns)) if fmt is ImportFormat.chat else None
    files = discover(fmt.value, paths)
    if not files:
        err.print(f"[red]error:[/red] no {fmt.value} files under {', '.join(map(str, paths))}")
        raise typer.Exit(EXIT_USAGE)
    # The bar counts input bytes, file by file, and the records read so far (a single large
    # Parquet or JSONL file is one step of the bar but many records).
    sizes = {path: path.stat().st_size for path in files}
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[records]:,} records"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    with progress:
        task = progress.add_task(f"importing {fmt.value}", total=sum(sizes.values()), records=0)
        read = 0

        def record() -> None:
            nonlocal read
            read += 1
            if read % 100 == 0:
                progress.update(task, records=read)

        summary = import_files(
            fmt.value, files, output, salvage=salvage, overwrite=overwrite, importer=importer,
            on_file=lambda path: progress.update(task, advance=sizes[path], records=read), on_record=record,
        )  # fmt: skip
    show_problems("warnings", summary.warnings)
    show_problems("rejected", [str(e) for e in summary.rejected])
    out.print(_import_table(fmt.value, output, summary))
    raise typer.Exit(EXIT_PARTIAL if summary.rejected else EXIT_OK)


def check_trajectory(trajectory: Trajectory) -> list[str]:
    """Structural problems a pool record can have even when every field parses."""
    problems = []
    calls, results = tool_call_pairs(trajectory.messages)
    for call_id, index in results.items():
        if call_id not in calls:
            problems.append(f"messages[{index}].tool_call_id: {call_id!r} answers no call")
        elif calls[call_id] > index:
            problems.append(f"messages[{index}].tool_call_id: {call_id!r} answers a later call")
    if not any(m.generated for m in trajectory.messages):
        problems.append("no generated message: nothing could ever be supervised")
    return problems


def validate_command(
    pools: Annotated[list[Path], typer.Argument(help="Pool files (.jsonl or .jsonl.zst).")],
) -> None:
    """Check pools: records parse, ids are unique, tool results answer earlier calls.

    Lists each problem with its file, line and field; exits 1 when there is any.
    """
    errors: list[RecordError] = []
    ids: Counter[str] = Counter()
    problems: list[str] = []
    clean = 0
    formats: Counter[str] = Counter()
    exits: Counter[str] = Counter()
    for pool in pools:
        for trajectory in read_trajectories_lenient(pool, errors):
            ids[trajectory.id] += 1
            found = check_trajectory(trajectory)
            problems.extend(f"{pool}: {trajectory.id}: {p}" for p in found)
            formats[trajectory.source.format if trajectory.source else "relearn"] += 1
            exits[trajectory.exit_status.value] += 1
            clean += not found
    problems.extend(f"id {i!r} appears {n} times" for i, n in ids.items() if n > 1)
    show_problems("unreadable records", [str(e) for e in errors])
    show_problems("problems", problems)
    table = Table(title="relearn validate", show_header=False)
    table.add_row("trajectories", str(sum(ids.values())))
    table.add_row("unreadable records", str(len(errors)))
    table.add_row("trajectories with problems", str(sum(ids.values()) - clean))
    for name, count in formats.most_common():
        table.add_row(f"from {name}", str(count))
    for name, count in exits.most_common():
        table.add_row(f"exit {name}", str(count))
    out.print(table)
    raise typer.Exit(EXIT_PARTIAL if errors or problems else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("import")(import_command)
    app.command("validate")(validate_command)
