"""Pools back into chat-message datasets: the generic OpenAI form, or the rows of one of the
published SWE sets ``relearn import chat --preset`` reads (``harness.importers.chat``).

Messages are what the Hugging Face templates take (``harness.exporters.hf_chat``: the
leading instructions merged into one system message), with tool-call arguments as JSON text,
the way these datasets store them (Arrow cannot hold free-form argument objects). The
generic form also keeps what only relearn has: token ids and log-probs, and a ``mask`` on
assistant turns when some of them are not trainable. Importing an export with the same
preset gives back the same messages.

A trajectory a preset cannot hold without losing part of it (tool calls or reasoning in the
text-only nebius rows) is refused with the reason, never written in part. JSON Lines rows
also carry back the columns a chat import kept under ``source.meta.columns``; Parquet rows
have a fixed schema per preset and do not.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.exporters.hf_chat import chat_messages_with_sources
from harness.importers.chat import PRESETS as IMPORT_PRESETS
from records.pools import write_atomic
from records.trajectory import ExitStatus, Trajectory

PRESETS = tuple(IMPORT_PRESETS)  # the same names as the importer's, one list
PARQUET_BATCH_ROWS = 256


class Refused(Exception):
    """This trajectory does not fit the chosen preset's rows."""


@dataclass
class ChatExport:
    rows: int = 0
    refused: list[str] | None = None


def to_row(trajectory: Trajectory, preset: str | None = None) -> dict[str, Any]:
    """One dataset row for ``trajectory`` in ``preset``'s shape (None: the generic form)."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    resolved = trajectory.outcome.resolved if trajectory.outcome else None
    reward = trajectory.outcome.reward if trajectory.outcome else None
    status = trajectory.exit_status.value if trajectory.exit_status is not ExitStatus.unknown else None
    columns = _source_columns(trajectory, preset)
    if preset == "nebius-swe-agent":
        return {
            "instance_id": trajectory.task_id,
            "model_name": trajectory.policy.name,
            "target": resolved,
            "trajectory": _nebius_messages(trajectory),
            "exit_status": status,
            "generated_patch": trajectory.final_patch,
        }
    messages = _openai_messages(trajectory, keep_training_fields=preset is None)
    if preset == "swe-gym":
        return {
            "instance_id": trajectory.task_id,
            "run_id": columns.get("run_id") or trajectory.id,
            "messages": messages,
            "tools": trajectory.tools,
            "resolved": resolved,
            "test_result": {
                **(columns.get("test_result") if isinstance(columns.get("test_result"), dict) else {}),
                "git_patch": trajectory.final_patch,
            },
        }
    if preset == "swe-smith":
        return {
            "instance_id": trajectory.task_id,
            "traj_id": columns.get("traj_id") or trajectory.id,
            "model": trajectory.policy.name,
            "messages": messages,
            "resolved": resolved,
            "patch": trajectory.final_patch,
        }
    if preset == "swe-rebench-openhands":
        return {
            "trajectory_id": columns.get("trajectory_id") or trajectory.id,
            "instance_id": trajectory.task_id,
            "repo": columns.get("repo") or _repo_of(trajectory.task_id),
            "trajectory": messages,
            "tools": trajectory.tools,
            "model_patch": trajectory.final_patch,
            "exit_status": status,
            "resolved": resolved,
        }
    return {
        "id": trajectory.id,
        "instance_id": trajectory.task_id,
        "messages": messages,
        "tools": trajectory.tools,
        "resolved": resolved,
        "reward": reward,
        "patch": trajectory.final_patch,
        "model": trajectory.policy.name,
        "exit_status": status,
    }


def _source_columns(trajectory: Trajectory, preset: str | None) -> dict[str, Any]:
    """The columns a chat import of this preset kept without a field (to write them back)."""
    source = trajectory.source
    if source is None or source.format != "chat" or not source.meta or source.meta.get("preset") != preset:
        return {}
    columns = source.meta.get("columns")
    ids = source.meta.get("id_columns")
    return {**(ids if isinstance(ids, dict) else {}), **(columns if isinstance(columns, dict) else {})}


def _openai_messages(trajectory: Trajectory, *, keep_training_fields: bool) -> list[dict[str, Any]]:
    chat, sources = chat_messages_with_sources(trajectory.messages)
    masked = any(m.role == "assistant" and not m.generated for m in trajectory.messages)
    out = []
    for row, index in zip(chat, sources, strict=True):
        source = trajectory.messages[index]
        if row.get("tool_calls"):
            # Text the model wrote that was not a JSON object goes back as it was written.
            row["tool_calls"] = [
                {
                    **call,
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": original.raw_arguments
                        if original.raw_arguments is not None
                        else json.dumps(original.function.arguments, ensure_ascii=False),
                    },
                }
                for call, original in zip(row["tool_calls"], source.tool_calls or [], strict=True)
            ]
        if keep_training_fields and source.role == "assistant":
            if masked:
                row["mask"] = source.generated
            if source.token_ids is not None:
                row["token_ids"] = source.token_ids
            if source.logprobs is not None:
                row["logprobs"] = source.logprobs
        out.append(row)
    return out


def _nebius_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    out = []
    for index, message in enumerate(trajectory.messages):
        if message.tool_calls or message.role == "tool":
            raise Refused(f"messages[{index}]: nebius-swe-agent rows hold text turns only, and this one is a tool call or result")
        if message.reasoning_content:
            raise Refused(f"messages[{index}]: nebius-swe-agent rows have no place for reasoning_content")
        role = {"assistant": "ai", "developer": "system"}.get(message.role, message.role)
        out.append({"role": role, "text": message.content or "", "mask": message.role == "assistant" and message.generated})
    return out


def _repo_of(task_id: str | None) -> str | None:
    """SWE-bench instance ids name their repository: ``owner__repo-123``."""
    if not task_id or "__" not in task_id:
        return None
    owner, rest = task_id.split("__", 1)
    return f"{owner}/{rest.rsplit('-', 1)[0]}"


def export_chat(trajectories: Iterable[Trajectory], output: Path, preset: str | None = None) -> ChatExport:
    """Write one row per trajectory to ``output`` (``.jsonl``/``.jsonl.zst`` or ``.parquet``),
    replacing it atomically. Refused trajectories are listed, never written in part."""
    summary = ChatExport(refused=[])
    assert summary.refused is not None

    def rows(with_columns: bool) -> Iterator[dict[str, Any]]:
        for trajectory in trajectories:
            try:
                row = to_row(trajectory, preset)
            except Refused as exc:
                summary.refused.append(f"{trajectory.id}: {exc}")  # type: ignore[union-attr]
                continue
            if with_columns:
                row.update({k: v for k, v in _source_columns(trajectory, preset).items() if k not in row})
            summary.rows += 1
            yield row

    if output.name.lower().endswith((".parquet", ".pq")):
        _write_parquet(output, rows(False), preset)
    else:
        write_atomic(output, rows(True))
    return summary


# ---- Parquet -------------------------------------------------------------------------------

JSON_COLUMNS = {"tools", "test_result"}  # free-form objects: JSON text, which the importer decodes


def _schema(preset: str | None) -> Any:
    import pyarrow as pa

    text, flag, real = pa.string(), pa.bool_(), pa.float64()
    call = pa.struct([("id", text), ("type", text), ("function", pa.struct([("name", text), ("arguments", text)]))])
    openai = pa.list_(
        pa.struct(
            [
                ("role", text),
                ("content", text),
                ("reasoning_content", text),
                ("tool_calls", pa.list_(call)),
                ("tool_call_id", text),
                ("name", text),
                ("mask", flag),
                ("token_ids", pa.list_(pa.int64())),
                ("logprobs", pa.list_(real)),
            ]
        )
    )
    nebius = pa.list_(pa.struct([("role", text), ("text", text), ("mask", flag)]))
    fields = {
        None: [
            ("id", text),
            ("instance_id", text),
            ("messages", openai),
            ("tools", text),
            ("resolved", flag),
            ("reward", real),
            ("patch", text),
            ("model", text),
            ("exit_status", text),
        ],
        "swe-gym": [
            ("instance_id", text),
            ("run_id", text),
            ("messages", openai),
            ("tools", text),
            ("resolved", flag),
            ("test_result", text),
        ],
        "swe-smith": [("instance_id", text), ("traj_id", text), ("model", text), ("messages", openai), ("resolved", flag), ("patch", text)],
        "nebius-swe-agent": [
            ("instance_id", text),
            ("model_name", text),
            ("target", flag),
            ("trajectory", nebius),
            ("exit_status", text),
            ("generated_patch", text),
        ],
        "swe-rebench-openhands": [
            ("trajectory_id", text),
            ("instance_id", text),
            ("repo", text),
            ("trajectory", openai),
            ("tools", text),
            ("model_patch", text),
            ("exit_status", text),
            ("resolved", flag),
        ],
    }[preset]
    return pa.schema(fields)


def _write_parquet(output: Path, rows: Iterator[dict[str, Any]], preset: str | None) -> None:
    """Stream rows into Parquet in batches under a fixed schema, then swap the file in."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema(preset)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append({k: (json.dumps(v, ensure_ascii=False) if k in JSON_COLUMNS and v is not None else v) for k, v in row.items()})
                if len(batch) == PARQUET_BATCH_ROWS:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    batch = []
            if batch:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
