"""SWE-agent trajectories (``*.traj``: ``{trajectory, history, info, ...}``).

``history`` is the chat the model saw and becomes the messages, one to one (demo
messages are kept as context, never as generated). Files without ``history`` (old
releases) are rebuilt from the steps: each ``response`` is a generated assistant
message and each ``observation`` the user message after it. The per-step records are
kept under ``source.records`` without their ``query``/``messages`` copies of the
history, which ``source.meta.dropped`` names.
"""

from __future__ import annotations

from collections.abc import Iterator
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

FORMAT = "swe-agent"
ROLES = {"system", "user", "assistant", "tool"}
HISTORY_COPIES = ("query", "messages")

EXIT_STATUS = {
    "submitted": ExitStatus.submitted,
    "exit_cost": ExitStatus.cost_exhausted,
    "exit_context": ExitStatus.context_overflow,
    "exit_format": ExitStatus.format_error,
    "exit_command_timeout": ExitStatus.time_exhausted,
    "exit_total_execution_time": ExitStatus.time_exhausted,
    "exit_error": ExitStatus.env_error,
    "exit_api": ExitStatus.policy_error,
    "exit_forfeit": ExitStatus.aborted,
}


def discover(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.traj") if p.is_file())


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    return read_guarded(path, lambda diagnostics: [convert(read_json_document(path), path, diagnostics)])


def exit_status(raw: str | None) -> ExitStatus:
    if not raw:
        return ExitStatus.unknown
    # "submitted (exit_cost)": autosubmitted after a limit; the limit is why it ended.
    inner = raw[raw.find("(") + 1 : raw.rfind(")")] if "(" in raw else raw
    return EXIT_STATUS.get(inner.strip(), ExitStatus.env_error if inner.startswith("exit_") else ExitStatus.unknown)


def convert(document: Any, path: Path, diag: Diagnostics) -> Trajectory:
    name = str(path)
    top = Fields(document, name, None, "")
    if "trajectory" not in top.data and "history" not in top.data:
        raise fail(name, None, "trajectory", "missing: not a SWE-agent .traj file")
    steps = top.list("trajectory")
    history = top.list("history")
    if history:
        messages = [_history_message(item, diag) for item in top.items("history")]
    else:
        messages = _messages_from_steps(top, diag)
    if not messages:
        raise fail(name, None, "history", "empty, and no trajectory steps to rebuild it from")

    info = top.obj("info")
    stats = info.obj("model_stats") if info is not None else None
    usage = None
    if stats is not None:
        cost = stats.get("instance_cost", (int, float))
        usage = Usage(
            input_tokens=stats.get("tokens_sent", int),
            output_tokens=stats.get("tokens_received", int),
            api_calls=stats.get("api_calls", int),
            cost_usd=float(cost) if cost is not None else None,
        )
    records = [{k: v for k, v in step.items() if k not in HISTORY_COPIES} for step in steps if isinstance(step, dict)]
    meta = {k: v for k, v in document.items() if k not in ("trajectory", "history")}
    if any(isinstance(s, dict) and any(k in s for k in HISTORY_COPIES) for s in steps):
        meta["dropped"] = ["trajectory[].query", "trajectory[].messages"]
    model = _model_name(document)
    return Trajectory(
        task_id=path.name[: -len(".traj")] if path.name.endswith(".traj") else None,
        policy=Policy(name=model),
        messages=messages,
        final_patch=info.str("submission") if info is not None else None,
        exit_status=exit_status(info.str("exit_status") if info is not None else None),
        usage=usage,
        source=Source(
            format=FORMAT,
            format_version=info.str("swe_agent_version") if info is not None else None,
            path=name,
            meta=meta,
            records=records or None,
            warnings=diag.warnings or None,
        ),
    )


def _model_name(document: dict[str, Any]) -> str | None:
    config = document.get("replay_config")
    if isinstance(config, str):
        import json

        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return None
    if isinstance(config, dict):
        model = (config.get("agent") or {}).get("model") or {}
        if isinstance(model, dict) and isinstance(model.get("name"), str):
            return model["name"]
    return None


def _history_message(item: Fields, diag: Diagnostics) -> Message:
    role = item.str("role", required=True)
    if role not in ROLES:
        raise fail(item.path, None, f"{item.prefix}.role", f"unknown role {role!r}")
    # SWE-agent names a tool message's call in a list.
    ids = item.list("tool_call_ids")
    if role == "tool" and item.str("tool_call_id") is None and not ids:
        raise fail(item.path, None, f"{item.prefix}.tool_call_ids", "missing: a tool message must name its call")
    message = chat_message(item, role, diag, handled=frozenset({"is_demo"}), tool_call_id=ids[0] if ids else None)
    if len(ids) > 1:
        diag.warn(None, f"{item.prefix}.tool_call_ids: {len(ids)} ids on one message; paired with the first")
    if "is_demo" in item.data:
        message.extra = {**(message.extra or {}), "is_demo": item.data["is_demo"]}
        # Demonstrations are someone else's text shown as context; older files wrote the flag as a string.
        message.generated = message.generated and item.data["is_demo"] not in (True, "True", "true")
    return message


def _messages_from_steps(top: Fields, diag: Diagnostics) -> list[Message]:
    diag.warn(None, "no history: messages rebuilt from trajectory steps (system and task prompts are not in such files)")
    messages = []
    for step in top.items("trajectory"):
        response = step.str("response")
        if response is None:
            thought, action = step.str("thought") or "", step.str("action") or ""
            response = f"{thought}\n\n{action}".strip()
        messages.append(Message(role="assistant", content=response, generated=True))
        observation = step.str("observation")
        if observation is not None:
            messages.append(Message(role="user", content=observation))
    return messages
