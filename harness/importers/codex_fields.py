"""The vocabulary of Codex rollout lines and the values inside them: which line, item and
event kinds are known, a line's JSON, a tool call, a tool output (legacy Codex's
JSON-encoded ``{"output", "metadata"}`` included), usage counts. ``codex`` assembles them
into a trajectory."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from harness.importers.base import Diagnostics, Fields, fail, parse_arguments
from records.pools import RecordError, json_problem
from records.pools import loads as fast_loads
from records.trajectory import is_wide

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


class NotPlain(Exception):
    """A line that ``RolloutJson.plain_loads`` cannot decode: the file is read again as text."""


class RolloutJson:
    """The JSON texts of one rollout (its lines, call arguments, legacy outputs), decoded as
    ``records.pools.loads`` decodes them, noting whether any float among them ``is_wide``: only
    then does the record need ``mark_wide_floats`` before ``dump_record`` writes it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.wide_floats = False
        self.decoder = msgspec.json.Decoder(float_hook=self.float)

    def float(self, value: str | float) -> float:
        """A float of the record: decoded (from its JSON text) or computed."""
        number = float(value)
        if is_wide(number):
            self.wide_floats = True
        return number

    def plain_loads(self, number: int, line: bytes) -> Any:
        """A line that msgspec decodes as it stands; NotPlain for any other."""
        try:
            return self.decoder.decode(line)
        except msgspec.DecodeError:
            raise NotPlain from None

    def loads(self, number: int, text: str) -> Any:
        try:
            return fast_loads(text, self.decoder)
        except json.JSONDecodeError:
            raise fail(self.path, number, None, json_problem(text)[1]) from None


def extra_fields(data: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    if data.keys() <= known:  # the usual item: nothing beside the known keys
        return {}
    return {k: v for k, v in data.items() if k not in known}


# Typed reads of one field of a JSON object at ``prefix`` of line ``number``: the value when it
# has the type (checked inline, the reader calls these per field), else ``Fields`` decides,
# which gives the default or raises the located error.


def str_at(
    data: dict[str, Any], key: str, path: str, number: int, prefix: str, *, required: bool = False, default: str | None = None
) -> str | None:
    value = data.get(key)
    if type(value) is str:
        return value
    return Fields(data, path, number, prefix).str(key, required=required, default=default)


def obj_at(data: dict[str, Any], key: str, path: str, number: int, prefix: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None or type(value) is dict:
        return value
    return Fields(data, path, number, prefix).get(key, dict)


def part_texts(data: dict[str, Any], key: str, path: str, number: int, prefix: str) -> list[str]:
    """The ``text`` of each part of the array ``key`` ("" for a part without one)."""
    parts = data.get(key)
    if parts is None:
        return []
    if type(parts) is list:
        texts = [text for part in parts if type(part) is dict and type(text := part.get("text")) is str]
        if len(texts) == len(parts):
            return texts
    return [part.str("text", default="") or "" for part in Fields(data, path, number, prefix).items(key)]


def usage_counts(data: dict[str, Any], path: str, number: int, prefix: str) -> dict[str, int]:
    """A usage object's token counts, as ``records.trajectory.Usage`` fields."""
    if tuple(data) == USAGE_KEYS:  # the usual object: the five counts, in the fields' order
        a, b, c, d, e = data.values()
        if type(a) is int and type(b) is int and type(c) is int and type(d) is int and type(e) is int:
            return dict(data)
    values = {key: value for key in USAGE_KEYS if type(value := data.get(key)) is int}
    if len(values) < len(USAGE_KEYS):
        for key in USAGE_KEYS:
            if key not in values and data.get(key) is not None:
                Fields(data, path, number, prefix).get(key, int)  # present and not an integer: raises, naming the field
    return values


def tool_output_parts(rollout: RolloutJson, number: int, prefix: str, output: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Text, metadata (exit code, duration) and leftovers of a tool output."""
    path = rollout.path
    if type(output) is str and not output.startswith("{"):
        return output, {}, {}  # the usual output: plain text
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
        extra = (
            {}
            if all(isinstance(p.get("text"), str) and set(p) <= {"type", "text"} for p in output) and len(output) == 1
            else {"content_parts": output}
        )
        return "\n".join(texts), {}, extra
    if isinstance(output, dict):
        # Some writers store the legacy {"output", "metadata"} shape unencoded.
        return tool_output_parts(rollout, number, prefix, json.dumps(output))
    if not isinstance(output, str):
        raise fail(path, number, field, f"expected string or array, got {type(output).__name__}")
    # Legacy Codex encoded {"output": ..., "metadata": {"exit_code", "duration_seconds"}} as a string.
    if '"output"' in output:
        try:
            decoded = rollout.loads(number, output)
        except RecordError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("output"), str):
            metadata = decoded.get("metadata") if isinstance(decoded.get("metadata"), dict) else {}
            extra = {"output_encoding": "legacy_json"}
            leftover = {k: v for k, v in decoded.items() if k not in ("output", "metadata")}
            if leftover:
                extra["output_fields"] = leftover
            return decoded["output"], dict(metadata), extra
    return output, {}, {}


def tool_call_of(rollout: RolloutJson, number: int, kind: str, data: dict[str, Any], prefix: str, diag: Diagnostics) -> dict[str, Any]:
    """A ``function_call``, ``custom_tool_call`` or ``local_shell_call`` item (``data``, at
    ``prefix`` of line ``number``) as a tool call (a ``records.trajectory.ToolCall``'s fields,
    in its order)."""
    path = rollout.path
    call_id = data.get("call_id")
    if type(call_id) is not str or not call_id:
        call_id = str_at(data, "call_id", path, number, prefix) or str_at(data, "id", path, number, prefix)
    if not call_id:
        raise fail(path, number, f"{prefix}.call_id".lstrip("."), "missing")
    raw = None
    call_type = "function"
    if kind == "function_call":
        name = str_at(data, "name", path, number, prefix, required=True) or ""
        arguments, raw = parse_arguments(str_at(data, "arguments", path, number, prefix, default="") or "", rollout.decoder)
        if raw is not None:
            diag.warn(number, f"call {call_id}: arguments are not a JSON object (kept verbatim in raw_arguments)")
    elif kind == "custom_tool_call":
        name = str_at(data, "name", path, number, prefix, required=True) or ""
        call_type = "custom"
        arguments = {"input": str_at(data, "input", path, number, prefix, default="")}
    else:
        # The model's local_shell action is what Codex's shell tool takes.
        action = Fields(data, path, number, prefix).obj("action", required=True)
        assert action is not None
        arguments = {}
        for src, dst in (
            ("command", "command"),
            ("working_directory", "workdir"),
            ("timeout_ms", "timeout_ms"),
            ("env", "env"),
            ("user", "user"),
        ):
            if action.data.get(src) is not None:
                arguments[dst] = action.data[src]
        if "command" not in arguments:
            diag.warn(number, f"local_shell_call {call_id}: action has no command")
        name = "shell"
    call: dict[str, Any] = {"id": call_id, "type": call_type, "function": {"name": name, "arguments": arguments}}
    if raw is not None:
        call["raw_arguments"] = raw
    call["extra"] = {**extra_fields(data, CALL_KEYS), "codex_type": kind}
    return call
