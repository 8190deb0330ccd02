"""mini-swe-agent trajectories (``*.traj.json``; formats ``mini-swe-agent-1`` and ``-1.1``).

Messages are OpenAI chat messages plus an ``extra`` dict; they map one to one, so the
message count and roles of the input are kept. Text-protocol observations stay ``user``
messages (that is what the model saw); tool-calling runs (v2) bring ``tool_calls`` and
``tool`` messages. The final ``exit`` message (v2) carries the exit status and
submission and is kept under ``source.records``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

from harness.importers.base import (
    Diagnostics,
    Fields,
    ImportResult,
    chat_message,
    fail,
    read_guarded,
    read_json_document,
)
from records.trajectory import ExitStatus, Message, Policy, Source, Trajectory, Usage

FORMAT = "mini-swe-agent"
KNOWN_FORMATS = {"mini-swe-agent-1", "mini-swe-agent-1.1"}
ROLES = {"system", "user", "assistant", "tool"}

EXIT_STATUS = {
    "submitted": ExitStatus.submitted,
    "limitsexceeded": ExitStatus.turns_exhausted,
    "timeexceeded": ExitStatus.time_exhausted,
    "repeatedformaterror": ExitStatus.format_error,
    "formaterror": ExitStatus.format_error,
    "contextwindowexceedederror": ExitStatus.context_overflow,
}


def discover(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.traj.json") if p.is_file())


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    return read_guarded(path, lambda diagnostics: [convert(read_json_document(path), str(path), diagnostics)])


def exit_status(raw: str | None, info: dict[str, Any]) -> ExitStatus:
    if not raw:
        return ExitStatus.unknown
    status = EXIT_STATUS.get(raw.lower().replace("_", ""))
    if status is ExitStatus.turns_exhausted:
        # LimitsExceeded covers both the step and the cost limit; the stats tell which.
        agent = ((info.get("config") or {}).get("agent") or {}) if isinstance(info.get("config"), dict) else {}
        stats = info.get("model_stats") or {}
        cost_limit = agent.get("cost_limit") or 0
        if cost_limit and (stats.get("instance_cost") or 0) >= cost_limit:
            return ExitStatus.cost_exhausted
    if status is None:
        # Any other value is the name of the exception that ended the run.
        return ExitStatus.env_error
    return status


def convert(document: Any, path: str, diag: Diagnostics) -> Trajectory:
    if isinstance(document, list):
        document = {"messages": document}
    top = Fields(document, path, None, "")
    trajectory_format = top.str("trajectory_format")
    if trajectory_format is not None and trajectory_format not in KNOWN_FORMATS:
        diag.warn(
            None, f"trajectory_format {trajectory_format!r} is newer than the formats known here; read as {sorted(KNOWN_FORMATS)[-1]}"
        )
    info = top.obj("info")
    info_data = info.data if info is not None else {}
    raw_messages = top.list("messages", required=True)
    if not raw_messages:
        raise fail(path, None, "messages", "empty: nothing to import")

    messages: list[Message] = []
    records: list[dict[str, Any]] = []
    exit_record: dict[str, Any] | None = None
    for index, raw in enumerate(raw_messages):
        item = Fields(raw, path, None, f"messages[{index}]")
        role = item.str("role", required=True)
        if role == "exit":
            exit_record = raw
            records.append({"at_message": len(messages), "record": raw})
            continue
        if role not in ROLES:
            diag.unknown_kind(None, f"message role {role!r}")
            records.append({"at_message": len(messages), "record": raw})
            continue
        messages.append(_message(item, role, diag))

    model_stats = info.obj("model_stats") if info is not None else None
    config = info.obj("config") if info is not None else None
    model = config.obj("model") if config is not None else None
    policy = Policy(name=model.str("model_name") if model is not None else None)
    submission = info.str("submission") if info is not None else None
    status_text = info.str("exit_status") if info is not None else None
    if exit_record is not None:
        exit_extra = exit_record.get("extra") or {}
        status_text = status_text or exit_extra.get("exit_status")
        submission = submission if submission is not None else exit_extra.get("submission")
    usage = None
    if model_stats is not None:
        cost = model_stats.get("instance_cost", (int, float))
        usage = Usage(cost_usd=float(cost) if cost is not None else None, api_calls=model_stats.get("api_calls", int))
    meta = {k: v for k, v in document.items() if k not in ("messages",)}
    return Trajectory(
        task_id=top.str("instance_id"),
        policy=policy,
        messages=messages,
        final_patch=submission,
        exit_status=exit_status(status_text, info_data),
        usage=usage,
        source=Source(
            format=FORMAT,
            format_version=info.str("mini_version") if info is not None else None,
            path=path,
            meta=meta,
            records=records or None,
            warnings=diag.warnings or None,
        ),
    )


def _message(item: Fields, role: str, diag: Diagnostics) -> Message:
    message = chat_message(item, role, diag)
    source_extra = item.get("extra", dict)
    if source_extra is not None:
        message.timestamp = _timestamp(source_extra)
        message.usage = _usage(source_extra)
        if isinstance(source_extra.get("returncode"), int):
            message.metadata = {"exit_code": source_extra["returncode"]}
    return message


def _timestamp(extra: dict[str, Any] | None) -> str | None:
    if not extra or extra.get("timestamp") is None:
        return None
    value = extra["timestamp"]
    if isinstance(value, (int, float)):
        from datetime import datetime

        return datetime.fromtimestamp(value, tz=UTC).isoformat().replace("+00:00", "Z")
    return str(value)


def _usage(extra: dict[str, Any] | None) -> Usage | None:
    if not extra:
        return None
    response = extra.get("response")
    raw = response.get("usage") if isinstance(response, dict) else None
    cost = extra.get("cost")
    if not isinstance(raw, dict) and not isinstance(cost, (int, float)):
        return None
    raw = raw if isinstance(raw, dict) else {}

    def number(key: str) -> int | None:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        input_tokens=number("prompt_tokens"),
        output_tokens=number("completion_tokens"),
        total_tokens=number("total_tokens"),
        cached_input_tokens=cached if isinstance(cached, int) else None,
        cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
    )
