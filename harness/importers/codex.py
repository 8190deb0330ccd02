"""Codex CLI rollout files (``~/.codex/sessions/**/rollout-*.jsonl[.zst]``).

Both layouts are read: the current ``{timestamp, type, payload}`` envelope and the
legacy one (a bare meta line, bare response items, ``record_type: state`` lines).

How a rollout becomes chat messages:
- the session's base instructions become the system message;
- ``message`` items keep their role (developer/user/assistant);
- the model output of one API call (reasoning, text, tool calls; bounded by the
  ``token_usage_record`` line newer versions write right after each call, else by the
  ``token_count`` event that follows it, or by the next input item) becomes one
  assistant message, split only where HF message order (reasoning, content,
  tool_calls) could not hold it; the call's usage and response id go on it;
- ``exec_command_end`` events and (paginated history) ``item_completed`` events for a
  ``CommandExecution`` give tool results their exit code and duration;
- ``function_call_output``/``custom_tool_call_output`` become ``tool`` messages paired
  by ``call_id``;
- a ``compacted`` line is a context reset: its replacement history follows as
  non-generated messages.
Every line that maps to no message is kept verbatim under ``source.records``.

The trajectory is built as plain dicts in its pool line's shape, not as pydantic models:
every value comes through a typed ``Fields`` check, so the record is valid by construction
and import writes it without validating it again (pydantic was import's largest cost).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zstandard

from harness.importers.base import (
    Diagnostics,
    Fields,
    ImportResult,
    fail,
    read_guarded,
)
from harness.importers.codex_fields import (
    KNOWN_LINE_TYPES,
    KNOWN_UNMAPPED_ITEMS,
    MESSAGE_KEYS,
    MIRROR_EVENTS,
    OUTPUT_KEYS,
    REASONING_KEYS,
    NotPlain,
    RolloutJson,
    extra_fields,
    obj_at,
    part_texts,
    str_at,
    tool_call_of,
    tool_output_parts,
    usage_counts,
)
from records.pools import RecordError, iter_lines, open_bytes_read
from records.trajectory import SCHEMA_VERSION, ExitStatus, mark_wide_floats, record_content_id

Message = dict[str, Any]  # one chat message, in the shape of records.trajectory.Message

# The fields in the models' order: a record's dicts are written in it, None left out, which
# makes its line the one ``Trajectory.model_dump_json`` writes.
MESSAGE_FIELDS = (
    "role",
    "content",
    "reasoning_content",
    "tool_calls",
    "tool_call_id",
    "name",
    "generated",
    "timestamp",
    "usage",
    "metadata",
    "extra",
)
POLICY_FIELDS = ("name", "checkpoint", "step", "provider")

FORMAT = "codex"
SUFFIXES = (".jsonl", ".jsonl.zst")


def discover(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    return read_guarded(path, lambda diagnostics: [_read(path, diagnostics, salvage)])


def _read(path: Path, diagnostics: Diagnostics, salvage: bool) -> dict[str, Any]:
    """Lines are read as bytes, which msgspec decodes without a text copy. A file with a line
    that takes more (invalid JSON, NaN, escaped lone surrogates, text that is not UTF-8, a
    broken zstd stream) is read again as text from the start, where every such line is
    decoded or located as ``records.pools`` does it; so is a file rejected for anything
    else, because the text reader may meet bytes that are not UTF-8 first (it decodes
    ahead of the line it yields)."""
    try:
        return _RolloutReader(path, diagnostics, salvage).run(plain=True)
    except Exception:  # the text reader, the reference, decides
        diagnostics.warnings.clear()
        diagnostics.unknown.clear()
        return _RolloutReader(path, diagnostics, salvage).run(plain=False)


def _byte_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``records.pools.iter_lines`` as bytes, undecoded."""
    try:
        with open_bytes_read(path) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.isspace():
                    yield number, line
    except zstandard.ZstdError:
        raise NotPlain from None


class _RolloutReader:
    def __init__(self, path: Path, diagnostics: Diagnostics, salvage: bool) -> None:
        self.path = path
        self.name = str(path)
        self.diag = diagnostics
        self.json = RolloutJson(self.name)
        self.salvage = salvage
        self.messages: list[Message] = []
        self.records: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        self.layout = "envelope"
        self.policy: dict[str, str | None] = {"name": None, "provider": None}
        self.session_id: str | None = None
        self.cli_version: str | None = None
        # The assistant message being filled by the current model call, if any.
        self.current: Message | None = None
        self.group: list[Message] = []
        self.open_calls: dict[str, tuple[int, str]] = {}  # call_id -> (line, tool name)
        self.answered: set[str] = set()
        self.results: dict[str, int] = {}  # call_id -> index of its tool message
        self.exec_metadata: dict[str, dict[str, Any]] = {}
        # Newer Codex writes a token_usage_record per call, before the call's tool runs;
        # its token_count event comes only after the tool output, too late to say which
        # message the usage belongs to.
        self.usage_records = False
        self.resets: list[dict[str, Any]] = []
        self.total_usage: dict[str, int] | None = None
        self.exit_status = ExitStatus.unknown
        self.first_ts: str | None = None
        self.last_ts: str | None = None
        self.skipped_lines: list[int] = []

    # ---- driving -------------------------------------------------------------

    def run(self, *, plain: bool) -> dict[str, Any]:
        """The record of the file's lines: read as bytes where ``plain`` (raising NotPlain at a
        line that needs more), else as text."""
        seen_any = False
        lines, decode = (_byte_lines(self.path), self.json.plain_loads) if plain else (iter_lines(self.path), self.json.loads)
        for number, text in lines:
            seen_any = True
            try:
                self.line(number, decode(number, text))
            except RecordError as exc:
                if not self.salvage:
                    raise
                self.diag.warn(number, f"skipped (salvage): {exc.what}")
                self.skipped_lines.append(number)
        if not seen_any:
            raise fail(self.name, None, None, "empty file")
        self.end_call()
        self.check_unanswered()
        if not self.messages:
            raise fail(self.name, None, None, "no messages: not a Codex rollout, or one that recorded nothing")
        return self.build()

    def line(self, number: int, data: Any) -> None:
        if type(data) is not dict:
            raise fail(self.name, number, None, f"expected a JSON object, got {type(data).__name__}")
        timestamp = data.get("timestamp")
        if timestamp is not None and type(timestamp) is not str:
            raise fail(self.name, number, "timestamp", f"expected string, got {type(timestamp).__name__}")
        if "payload" in data and "type" in data:
            kind = data["type"]
            if type(kind) is not str:
                raise fail(self.name, number, "type", "expected string")
            if timestamp is not None:
                self.first_ts = self.first_ts or timestamp
                self.last_ts = timestamp
            payload = data["payload"]
            if len(data) <= 3:
                # The kinds of nearly every line first, without the general dispatch.
                if kind == "response_item" and type(payload) is dict:
                    self.response_item(number, payload, "payload", timestamp)
                elif kind == "event_msg" and type(payload) is dict:
                    self.event(number, payload, data)
                else:
                    self.envelope(number, kind, payload, data, timestamp)
                return
            kept, at = len(self.records), len(self.messages)
            self.envelope(number, kind, payload, data, timestamp)
            self.line_fields(number, data, at, whole_line_kept=len(self.records) > kept)
        elif "record_type" in data:
            self.layout = "legacy"
            if set(data) != {"record_type"} or data["record_type"] != "state":
                self.keep(number, data)
        elif "type" in data:
            self.layout = "legacy"
            self.stamp(timestamp)
            self.response_item(number, data, "", timestamp)
        elif number == 1 or (not self.meta and "id" in data and "instructions" in data):
            self.layout = "legacy"
            self.session_meta(number, Fields(data, self.name, number, ""))
        else:
            raise fail(self.name, number, "type", "missing: a rollout line needs `type` (with `payload`) or `record_type`")

    def envelope(self, number: int, kind: str, payload: Any, line: dict[str, Any], timestamp: str | None) -> None:
        if kind == "response_item" or kind == "event_msg":
            if type(payload) is not dict:
                Fields(payload, self.name, number, "payload")  # raises: the payload must be an object
            if kind == "response_item":
                self.response_item(number, payload, "payload", timestamp)
            else:
                self.event(number, payload, line)
            return
        if kind not in KNOWN_LINE_TYPES:
            self.diag.unknown_kind(number, f"line type {kind!r}")
            self.keep(number, line)
            return
        fields = Fields(payload, self.name, number, "payload")
        if kind == "session_meta":
            self.session_meta(number, fields)
        elif kind == "compacted":
            self.compacted(number, fields, timestamp)
        elif kind == "token_usage_record":
            self.usage_record(number, fields)
        elif kind == "turn_context":
            model = fields.str("model")
            name = self.policy["name"]
            if model and name and model != name:
                self.diag.warn(number, f"model changed from {name!r} to {model!r} within the session")
            self.policy["name"] = name or model
        self.keep(number, line)

    def line_fields(self, number: int, line: dict[str, Any], at: int, *, whole_line_kept: bool) -> None:
        """Fields beside ``timestamp``/``type``/``payload`` (Codex 0.171's ``ordinal`` and
        ``metadata``): counted, and kept under ``source.records`` (at the message count when the
        line was read) when the line itself went into a message rather than a kept record."""
        extra = {k: v for k, v in line.items() if k not in ("timestamp", "type", "payload")}
        for key in extra:
            self.diag.unknown_kind(number, f"line field {key!r}")
        if not whole_line_kept:
            self.records.append({"line": number, "at_message": at, "line_fields": extra})

    def keep(self, number: int, line: dict[str, Any]) -> None:
        self.records.append({"line": number, "at_message": len(self.messages), "record": line})

    def stamp(self, timestamp: str | None) -> None:
        if timestamp is not None:
            self.first_ts = self.first_ts or timestamp
            self.last_ts = timestamp

    # ---- record kinds ----------------------------------------------------------
    # A response item or event comes as its JSON object and where it lies in its line
    # (``prefix``), read field by field with the checks of ``codex_fields``.

    def session_meta(self, number: int, fields: Fields) -> None:
        self.meta = dict(fields.data)
        self.session_id = fields.str("id") or self.session_id
        self.cli_version = fields.str("cli_version") or self.cli_version
        self.policy["provider"] = fields.str("model_provider") or self.policy["provider"]
        instructions = None
        base = fields.get("base_instructions", (dict, str))
        if isinstance(base, dict):
            instructions = Fields(base, self.name, number, f"{fields.prefix}.base_instructions".lstrip(".")).str("text")
        elif isinstance(base, str):
            instructions = base
        instructions = instructions or fields.str("instructions")
        if instructions and not any(m["role"] == "system" for m in self.messages):
            self.messages.insert(0, {"role": "system", "content": instructions, "timestamp": fields.str("timestamp")})
        if self.layout == "legacy":
            self.keep(number, fields.data)

    def response_item(self, number: int, item: dict[str, Any], prefix: str, timestamp: str | None) -> None:
        kind = item.get("type")
        if type(kind) is not str:
            kind = str_at(item, "type", self.name, number, prefix, required=True)
        if kind == "reasoning":
            self.reasoning(number, item, prefix, timestamp)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            self.tool_call(number, kind, item, prefix, timestamp)
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            self.tool_output(number, kind, item, prefix, timestamp)
        elif kind == "message":
            self.message(number, Fields(item, self.name, number, prefix), timestamp)
        else:
            if kind not in KNOWN_UNMAPPED_ITEMS:
                self.diag.unknown_kind(number, f"response item {kind!r}")
            self.keep(number, {"timestamp": timestamp, "type": "response_item", "payload": item})

    def message(self, number: int, item: Fields, timestamp: str | None) -> None:
        role = item.str("role", required=True)
        if role not in ("user", "assistant", "developer", "system"):
            raise fail(self.name, number, f"{item.prefix}.role".lstrip("."), f"unknown role {role!r}")
        texts: list[str] = []
        plain = True
        for part in item.items("content"):
            part_type = part.str("type", required=True)
            if part_type in ("input_text", "output_text", "text", "reasoning_text"):
                texts.append(part.str("text", default="") or "")
            else:
                plain = False
        extra = extra_fields(item.data, MESSAGE_KEYS)
        if not plain or len(texts) != 1:
            extra["content_parts"] = item.data.get("content", [])
        if role == "assistant":
            target = self.assistant_for("content", timestamp)
            target["content"] = "\n".join(texts)
            if extra:
                target["extra"] = {**(target.get("extra") or {}), **extra}
            return
        self.end_call()
        self.messages.append({"role": role, "content": "\n".join(texts), "timestamp": timestamp, "extra": extra or None})

    def reasoning(self, number: int, item: dict[str, Any], prefix: str, timestamp: str | None) -> None:
        summary = part_texts(item, "summary", self.name, number, prefix)
        content = part_texts(item, "content", self.name, number, prefix)
        target = self.assistant_for("reasoning_content", timestamp)
        # Raw reasoning text when Codex kept it; otherwise the summary the API returned.
        text = "\n\n".join(content) if content else "\n\n".join(summary)
        kept = {key: value for key, value in item.items() if key not in REASONING_KEYS}
        kept["reasoning_kind"] = "content" if content else ("summary" if summary else "encrypted")
        extra = target.get("extra")
        if not extra:
            target["extra"] = {"reasoning_items": [kept]}
        elif "reasoning_items" in extra:
            extra["reasoning_items"].append(kept)
        else:
            extra["reasoning_items"] = [kept]
        before = target.get("reasoning_content")
        target["reasoning_content"] = text if before is None else before + "\n\n" + text

    def tool_call(self, number: int, kind: str, item: dict[str, Any], prefix: str, timestamp: str | None) -> None:
        call = tool_call_of(self.json, number, kind, item, prefix, self.diag)
        call_id = call["id"]
        target = self.assistant_for("tool_calls", timestamp)
        calls = target.get("tool_calls")
        if calls is None:
            target["tool_calls"] = [call]
        else:
            calls.append(call)
        if call_id in self.open_calls or call_id in self.answered:
            raise fail(self.name, number, f"{prefix}.call_id".lstrip("."), f"call_id {call_id!r} used twice")
        self.open_calls[call_id] = (number, call["function"]["name"])

    def tool_output(self, number: int, kind: str, item: dict[str, Any], prefix: str, timestamp: str | None) -> None:
        self.end_call()
        call_id = item.get("call_id")
        if type(call_id) is not str:
            call_id = str_at(item, "call_id", self.name, number, prefix, required=True) or ""
        opened = self.open_calls.pop(call_id, None)
        if opened is None:
            reason = "answered twice" if call_id in self.answered else "no earlier call has this call_id"
            raise fail(self.name, number, f"{prefix}.call_id".lstrip("."), f"output for call_id {call_id!r}: {reason}")
        self.answered.add(call_id)
        content, metadata, extra = tool_output_parts(self.json, number, prefix, item.get("output"))
        pending = self.exec_metadata.pop(call_id, None)
        if pending is not None:
            metadata = {**pending, **metadata} if metadata else pending
        extra.update(extra_fields(item, OUTPUT_KEYS))
        extra["codex_type"] = kind
        self.results[call_id] = len(self.messages)
        # In field order, None left out, as build() needs it: only exec_result changes it after.
        message: Message = {"role": "tool", "content": content, "tool_call_id": call_id, "name": opened[1], "generated": False}
        if timestamp is not None:
            message["timestamp"] = timestamp
        if metadata:
            message["metadata"] = metadata
        message["extra"] = extra
        self.messages.append(message)

    def usage_record(self, number: int, fields: Fields) -> None:
        """One model call's usage (``token_usage_record``): ends the call."""
        self.usage_records = True
        usage = fields.obj("usage")
        response_id = fields.str("response_id")
        if self.group:
            if usage is not None:
                self.group[-1]["usage"] = usage_counts(usage.data, self.name, number, usage.prefix)
            if response_id:
                for message in self.group:
                    message["extra"] = {**(message.get("extra") or {}), "response_id": response_id}
        self.end_call()

    def event(self, number: int, payload: dict[str, Any], line: dict[str, Any]) -> None:
        kind = payload.get("type")
        if type(kind) is not str:
            kind = str_at(payload, "type", self.name, number, "payload", required=True)
        if kind == "token_count":
            info = obj_at(payload, "info", self.name, number, "payload")
            if info is not None:
                last = obj_at(info, "last_token_usage", self.name, number, "payload.info")
                total = obj_at(info, "total_token_usage", self.name, number, "payload.info")
                if last is not None and self.group and not self.usage_records:
                    self.group[-1]["usage"] = usage_counts(last, self.name, number, "payload.info.last_token_usage")
                if total is not None:
                    self.total_usage = usage_counts(total, self.name, number, "payload.info.total_token_usage")
            self.end_call()
            self.keep(number, line)
            return
        if kind == "exec_command_end":
            call_id = str_at(payload, "call_id", self.name, number, "payload")
            self.exec_result(call_id, {k: payload[k] for k in ("exit_code", "duration", "status") if k in payload})
        elif kind == "item_completed":
            item = Fields(payload, self.name, number, "payload").obj("item")
            if item is not None and item.data.get("type") == "CommandExecution":
                metadata = {k: item.data[k] for k in ("exit_code", "status") if k in item.data}
                duration = item.data.get("duration")
                if isinstance(duration, dict) and isinstance(duration.get("secs"), int):
                    metadata["duration_seconds"] = self.json.float(duration["secs"] + (duration.get("nanos") or 0) / 1e9)
                self.exec_result(item.str("id"), metadata)
        elif kind in ("task_complete", "turn_complete"):
            self.exit_status = ExitStatus.submitted
        elif kind == "turn_aborted":
            self.exit_status = ExitStatus.aborted
        elif kind in ("task_started", "turn_started"):
            self.exit_status = ExitStatus.unknown  # a new turn: its end decides
        if kind not in MIRROR_EVENTS:
            self.keep(number, line)

    def exec_result(self, call_id: str | None, metadata: dict[str, Any]) -> None:
        """A command's exit code and duration, for its tool message (which may come later)."""
        target = self.tool_message(call_id)
        if target is not None:
            placed = "metadata" in target
            target["metadata"] = {**(target.get("metadata") or {}), **metadata}
            if not placed:  # it goes before extra, in field order
                ordered = _in_field_order(target)
                target.clear()
                target.update(ordered)
        elif call_id:
            pending = self.exec_metadata.get(call_id)
            self.exec_metadata[call_id] = metadata if pending is None else {**pending, **metadata}

    def compacted(self, number: int, fields: Fields, timestamp: str | None) -> None:
        self.end_call()
        start = len(self.messages)
        history = fields.get("replacement_history", list)
        if history:
            # Replay the rebuilt history as context. It was generated long ago, not by
            # the call that follows, so none of it is eligible again.
            for index, raw in enumerate(history):
                item = Fields(raw, self.name, number, f"payload.replacement_history[{index}]")
                before = len(self.messages)
                self.response_item(number, item.data, item.prefix, timestamp)
                self.end_call()
                for message in self.messages[before:]:
                    message["generated"] = False
                    message["extra"] = {**(message.get("extra") or {}), "replayed": True}
            # Calls replayed without outputs are history, not open calls.
            for message in self.messages[start:]:
                for call in message.get("tool_calls") or []:
                    self.open_calls.pop(call["id"], None)
                    self.answered.add(call["id"])
        else:
            summary = fields.str("message", default="") or ""
            self.messages.append({"role": "user", "content": summary, "timestamp": timestamp, "extra": {"compaction_summary": True}})
        self.resets.append({"message_index": start, "reason": "compacted", "replacement_known": True})

    # ---- assistant message assembly -----------------------------------------

    def assistant_for(self, part: str, timestamp: str | None) -> Message:
        """The assistant message that ``part`` of the current call belongs in.

        HF messages hold reasoning, then content, then tool calls; output that comes in
        another order (or a second text) opens a new assistant message.
        """
        current = self.current
        if current is not None:
            if part == "tool_calls":
                return current  # calls follow whatever the message holds, other calls too
            if (
                current.get("tool_calls") is None
                and current.get("content") is None
                and (part == "content" or current.get("reasoning_content") is None)
            ):
                return current
        message: Message = {"role": "assistant", "generated": True, "timestamp": timestamp}
        self.messages.append(message)
        self.group.append(message)
        self.current = message
        return message

    def end_call(self) -> None:
        self.current = None
        self.group = []

    def tool_message(self, call_id: str | None) -> Message | None:
        index = self.results.get(call_id) if call_id else None
        return None if index is None else self.messages[index]

    def check_unanswered(self) -> None:
        if not self.open_calls:
            return
        last_assistant = max((i for i, m in enumerate(self.messages) if m["role"] == "assistant"), default=-1)
        for call_id, (number, _name) in sorted(self.open_calls.items(), key=lambda kv: kv[1][0]):
            index = next(i for i, m in enumerate(self.messages) if any(c["id"] == call_id for c in m.get("tool_calls") or []))
            if index == last_assistant:
                self.diag.warn(number, f"call {call_id} has no output: the session ended during the call")
                if self.exit_status == ExitStatus.unknown:
                    self.exit_status = ExitStatus.aborted
            elif self.salvage:
                self.diag.warn(number, f"call {call_id} has no output (kept, salvage)")
            else:
                raise fail(self.name, number, "payload.call_id", f"call {call_id!r} has no function_call_output, yet the session went on")

    def build(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"layout": self.layout}
        if self.skipped_lines:
            meta["skipped_lines"] = self.skipped_lines
        if self.diag.unknown:
            meta["unknown"] = dict(self.diag.unknown)
        source = {
            "format": FORMAT,
            "format_version": self.cli_version,
            "path": self.name,
            "meta": meta,
            "records": self.records or None,
            "warnings": self.diag.warnings or None,
        }
        record = {
            "schema_version": SCHEMA_VERSION,
            "id": f"codex-{self.session_id}" if self.session_id else "",
            "policy": {key: self.policy[key] for key in POLICY_FIELDS if self.policy.get(key) is not None},
            "messages": [message if message["role"] == "tool" else _in_field_order(message) for message in self.messages],
            "exit_status": self.exit_status.value,
            "usage": self.total_usage,
            "context_resets": self.resets or None,
            "started_at": self.first_ts,
            "finished_at": self.last_ts,
            "source": {key: value for key, value in source.items() if value is not None},
        }
        record = {key: value for key, value in record.items() if value is not None}
        if self.json.wide_floats:
            mark_wide_floats(record)
        if not record["id"]:
            record["id"] = record_content_id(record)
        return record


def _in_field_order(message: Message) -> Message:
    """``message`` with its fields in ``MESSAGE_FIELDS`` order, None left out (tool messages are
    built so, and kept so)."""
    message.setdefault("generated", False)  # a default the model writes out
    return {key: message[key] for key in MESSAGE_FIELDS if message.get(key) is not None}
