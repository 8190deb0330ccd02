"""What `relearn import` accepts (the pipeline's ``[pool.import]``); the work is ``relearn.ops.importing``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.import_run import CHAT_COLUMNS, ChatPreset, ImportFormat
from relearn.options import option

POOL_IS_THE_PIPELINES = "the pipeline's pool is the work folder's"


@dataclass
class ImportOptions:
    """Import other tools' trajectories into a pool of relearn trajectories.

    Appends to the pool and skips trajectories whose stable id it already holds, so a rerun over the same inputs adds nothing. A damaged file (or, in row formats, a damaged row) is rejected with its file, line and field and the batch goes on; unknown record types and fields are kept under each trajectory's `source` and counted. A grade the source carries (reward, resolved) becomes the outcome, marked imported, until `relearn verify` grades the patch. The pipeline's `[pool.import]` table takes the same fields.
    """

    # The chat fields (preset and the column names) apply to the chat format only; None takes
    # the preset's column, else the generic one.
    format: ImportFormat = option(help=" | ".join(ImportFormat), argument=True, metavar="FORMAT")
    paths: list[Path] = option(
        help="Files, or directories walked recursively (e.g. ~/.codex/sessions); in a pipeline file, relative to it.",
        argument=True, metavar="PATH", min_length=1, table_type=list[str],  # kept as written: the stage resolves them
    )  # fmt: skip
    output: Path = option(
        help="Pool to append to (.jsonl or .jsonl.zst).", flags=("-o", "--output"), metavar="FILE", front="cli", why=POOL_IS_THE_PIPELINES
    )
    salvage: bool = option(False, "Keep what parses from a damaged file (each skipped line is a warning) instead of rejecting it.")
    overwrite: bool = option(
        False, "Rebuild the pool instead of appending to it (atomic swap at the end).", front="cli",
        why="the pipeline sets a stage's pool aside itself when the stage's fields change, and resumes it otherwise",
    )  # fmt: skip
    preset: ChatPreset | None = option(None, "chat: the columns of a published set.", metavar=f"[{'|'.join(ChatPreset)}]")
    messages: str | None = option(
        None,
        "chat: the column of messages (default: the preset's, else `messages`; dotted paths reach nested columns).",
        metavar="COLUMN",
        min_length=1,
    )
    tools: str | None = option(
        None, "chat: the column of tool schemas (default: the preset's, else `tools`).", metavar="COLUMN", min_length=1
    )
    id: str | None = option(
        None, "chat: the column(s) of the trajectory's own id, comma-separated (default: the preset's, else `id`, else a content hash).",
        metavar="COLUMNS", min_length=1,
    )  # fmt: skip
    task_id: str | None = option(None, "chat: the column of the task id (default `instance_id`).", metavar="COLUMN", min_length=1)
    resolved: str | None = option(
        None, "chat: the column of the resolved flag (default: the preset's, else `resolved`).", metavar="COLUMN", min_length=1
    )
    patch: str | None = option(
        None, "chat: the column of the final patch (default: the preset's, else `patch`).", metavar="COLUMN", min_length=1
    )

    def chat_columns(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in CHAT_COLUMNS}


def chat_only_fields(options: ImportOptions) -> list[str]:
    """The chat fields set for another format (names as both the flags and the pipeline file
    spell them, ``task_id`` as ``task-id`` on the command line)."""
    if options.format == ImportFormat.chat:
        return []
    return [name for name, value in (("preset", options.preset), *options.chat_columns().items()) if value is not None]
