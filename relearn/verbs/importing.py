"""What `relearn import` accepts (the pipeline's ``[pool.import]``); the work is ``relearn.ops.importing``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.import_run import CHAT_COLUMNS, ChatPreset, HarborTrajectory, ImportFormat
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

    # The harbor fields; None takes the importer's default (``harness.importers.harbor.HarborOptions``).
    trajectory: HarborTrajectory | None = option(
        None,
        "harbor: which of a trial's trajectories to read: `auto` (the default) reads Codex's raw rollout (`agent/sessions/**/rollout-*.jsonl`, lossless) where the trial holds one, else Harbor's ATIF `agent/trajectory.json`; `rollout` and `atif` read only that one (a trial without it is counted as not imported).",
        metavar=f"[{'|'.join(HarborTrajectory)}]",
    )
    min_reward: float | None = option(
        None,
        "harbor: the least reward (of `verifier_result.rewards`) that counts as resolved (default 1.0). Every reward key is kept beside the outcome; a reward Harbor holds invalid (the trial failed on the model API or the environment) never counts.",
        metavar="REWARD",
    )
    reward_key: str | None = option(
        None,
        "harbor: the key of `verifier_result.rewards` that decides, where the verifier writes several (default `reward`; a single key decides whatever its name).",
        metavar="KEY",
        min_length=1,
    )

    def chat_columns(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in CHAT_COLUMNS}

    def harbor_fields(self) -> dict[str, object]:
        return {"trajectory": self.trajectory, "min_reward": self.min_reward, "reward_key": self.reward_key}


def misplaced_fields(options: ImportOptions) -> dict[str, list[str]]:
    """Format -> its own fields set for another format (names as both the flags and the
    pipeline file spell them, ``task_id`` as ``task-id`` on the command line)."""
    misplaced: dict[str, list[str]] = {}
    if options.format != ImportFormat.chat:
        chat_set = [name for name, value in (("preset", options.preset), *options.chat_columns().items()) if value is not None]
        if chat_set:
            misplaced["chat"] = chat_set
    if options.format != ImportFormat.harbor:
        harbor_set = [name for name, value in options.harbor_fields().items() if value is not None]
        if harbor_set:
            misplaced["harbor"] = harbor_set
    return misplaced
