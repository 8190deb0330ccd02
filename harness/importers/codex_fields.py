"""The vocabulary of Codex rollout lines and the values inside them: which line, item and
event kinds are known, a line's JSON, a tool call, a tool output (legacy Codex's
JSON-encoded ``{"output", "metadata"}`` included), usage counts. ``codex`` assembles them
into a trajectory."""

from __future__ import annotations

import json
from typing import Any

from harness.importers.base import Diagnostics, Fields, fail, parse_arguments
from records.pools import loads as fast_loads

# Event kinds that only mirror a response item (kept once, as the message).
MIRROR_EVENTS = {"user_message", "agent_message"}
# Response item kinds we know that have no chat message of their own.
KNOWN_UNMAPPED_ITEMS = {
    "web_search_call",
    "tool_search_call",
    "tool_search_output",
    "image_generation_call",
    "ghost_snapshot",
    "compaction",
    "other",
}
KNOWN_LINE_TYPES = {
    "session_meta",
    "turn_context",
    "response_item",
    "event_msg",
    "compacted",
    "world_state",
    "token_usage_record",
    "security_risk_score",
    "inter_agent_communication",
    "inter_agent_communication_metadata",
    "realtime_item",
}
# The keys each item kind maps; whatever else an item holds is kept beside them.
MESSAGE_KEYS = frozenset({"type", "role", "content"})
REASONING_KEYS = frozenset({"type"})
OUTPUT_KEYS = frozenset({"type", "call_id", "output"})
CALL_KEYS = frozenset({"type", "name", "arguments", "input", "call_id", "action"})
USAGE_KEYS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens", "total_tokens")


def loads(path: str, number: int, text: str) -> Any:
    try:
        return fast_loads(text)
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip("\n")) - 1
        hint = " (the line is truncated)" if truncated else ""
        raise fail(path, number, None, f"invalid JSON at column {exc.colno}: {exc.msg}{hint}") from None


def extra_fields(data: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    if data.keys() <= known:  # the usual item: nothing beside the known keys
        return {}
    return {k: v for k, v in data.items() if k not in known}


def usage_counts(fields: Fields) -> dict[str, int]:
    """A usage object's token counts, as ``records.trajectory.Usage`` fields."""
    data = fields.data
    values = {key: value for key in USAGE_KEYS if type(value := data.get(key)) is int}
    if len(values) < len(USAGE_KEYS):
        for key in USAGE_KEYS:
            if key not in values and data.get(key) is not None:
                fields.get(key, int)  # present and not an integer: raises, naming the field
    return values


def tool_output_parts(path: str, number: int, prefix: str, output: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Text, metadata (exit code, duration) and leftovers of a tool output."""
    field = f"{prefix}.output".lstrip(".")
    if output is None:
        raise fail(path, number, field, "missing")
    if isinstance(output, list):
        texts = []
        for index, part in enumerate(output):
            if not isinstance(part, dict):
                raise fail(path, number, f"{field}[{index}]", f"expected an object, got {type(part).__name__}")
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
        extra = {} if all(isinstance(p.get("text"), str) and set(p) <= {"type", "text"} for p in output) and len(output) == 1 else {"content_parts": output}
        return "\n".join(texts), {}, extra
    if isinstance(output, dict):
        # Some writers store the legacy {"output", "metadata"} shape unencoded.
        return tool_output_parts(path, number, prefix, json.dumps(output))
    if not isinstance(output, str):
        raise fail(path, number, field, f"expected string or array, got {type(output).__name__}")
    # Legacy Codex encoded {"output": ..., "metadata": {"exit_code", "duration_seconds"}} as a string.
    if output.startswith("{") and '"output"' in output:
        try:
            decoded = fast_loads(output)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("output"), str):
            metadata = decoded.get("metadata") if isinstance(decoded.get("metadata"), dict) else {}
            extra = {"output_encoding": "legacy_json"}
            leftover = {k: v for k, v in decoded.items() if k not in ("output", "metadata")}
            if leftover:
                extra["output_fields"] = leftover
            return decoded["output"], dict(metadata), extra
    return output, {}, {}


def tool_call_of(path: str, number: int, kind: str, item: Fields, diag: Diagnostics) -> dict[str, Any]:
    """A ``function_call``, ``custom_tool_call`` or ``local_shell_call`` item as a tool call
    (a ``records.trajectory.ToolCall``'s fields, in its order)."""
    call_id = item.str("call_id") or item.str("id")
    if not call_id:
        raise fail(path, number, f"{item.prefix}.call_id".lstrip("."), "missing")
    raw = None
    call_type = "function"
    if kind == "function_call":
        name = item.str("name", required=True) or ""
        arguments, raw = parse_arguments(item.str("arguments", default="") or "")
        if raw is not None:
            diag.warn(number, f"call {call_id}: arguments are not a JSON object (kept verbatim in raw_arguments)")
    elif kind == "custom_tool_call":
        name = item.str("name", required=True) or ""
        call_type = "custom"
        arguments = {"input": item.str("input", default="")}
    else:
        # The model's local_shell action is what Codex's shell tool takes.
        action = item.obj("action", required=True)
        assert action is not None
        arguments = {}
        for src, dst in (("command", "command"), ("working_directory", "workdir"), ("timeout_ms", "timeout_ms"), ("env", "env"), ("user", "user")):
            if action.data.get(src) is not None:
                arguments[dst] = action.data[src]
        if "command" not in arguments:
            diag.warn(number, f"local_shell_call {call_id}: action has no command")
        name = "shell"
    call: dict[str, Any] = {"id": call_id, "type": call_type, "function": {"name": name, "arguments": arguments}}
    if raw is not None:
        call["raw_arguments"] = raw
    call["extra"] = {**extra_fields(item.data, CALL_KEYS), "codex_type": kind}
    return call
