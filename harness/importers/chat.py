"""Chat-message datasets: rows of OpenAI-style messages in JSON Lines, a JSON array or Parquet.

Which column holds what is named by options (``relearn import chat --messages --tools --id
--task-id --resolved --patch``) or by a preset for the published SWE trajectory sets:

- ``swe-gym`` (SWE-Gym's OpenHands trajectories): ``messages`` with ``tool_calls`` whose
  ``arguments`` is JSON text and ``tool`` answers by ``tool_call_id``; ``resolved``,
  ``run_id``, ``test_result``. Parquet fills every key any message has with null.
- ``swe-smith`` (SWE-smith trajectories): ``messages`` of ``role``/``content`` only (actions
  inside the assistant text, observations as ``user`` turns); ``resolved``, ``patch``,
  ``traj_id``, ``model``.
- ``nebius-swe-agent`` (nebius/SWE-agent-trajectories): ``trajectory`` items with ``role``
  system/user/``ai``, ``text`` and a per-turn ``mask``; ``target`` is resolved;
  ``exit_status``, ``generated_patch``, ``eval_logs``.
- ``swe-rebench-openhands`` (nebius/SWE-rebench-openhands-trajectories): ``trajectory_id``,
  ``instance_id``, ``repo``, ``trajectory`` (messages with ``tool_calls``), ``tools``,
  ``model_patch``, ``exit_status``, ``resolved``.

Column names may be dotted paths into nested (or JSON-text) columns (``test_result.git_patch``);
``--id`` may join several columns with commas. A per-turn training mask in the source
(``mask``, ``loss_mask``, ``train``, ``weight``) is the source's own eligibility: an assistant
turn it masks out is kept as context, not generated. Null-valued message keys (Parquet's
fill) are dropped and said so in ``source.meta.dropped``; every other unmapped message key
stays in the message's ``extra``, and every column without a field stays under
``source.meta.columns`` and is counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.importers import swe_agent
from harness.importers.base import Diagnostics, Fields, ImportResult, fail, flag, imported_outcome, number, openai_tool_call, text_of_parts
from harness.importers.rows import JSON_SUFFIXES, JSONL_SUFFIXES, PARQUET_SUFFIXES, Row, decode_json_text, drop_nulls, pick, read_rows
from records.trajectory import ExitStatus, Message, Policy, Source, ToolCall, Trajectory

FORMAT = "chat"
ROLES = {"system", "developer", "user", "assistant", "tool"}
ROLE_ALIASES = {"ai": "assistant", "gpt": "assistant", "model": "assistant", "human": "user", "function": "tool", "ipython": "tool"}
CONTENT_KEYS = ("content", "text", "value")
ROLE_KEYS = ("role", "from")
MASK_KEYS = ("mask", "loss_mask", "train", "weight")
TOKEN_ID_KEYS = ("token_ids", "generation_token_ids")
LOGPROB_KEYS = ("logprobs", "generation_log_probs")
MESSAGE_FIELDS = {"reasoning_content", "tool_calls", "tool_call_id", "name"}


@dataclass(frozen=True)
class ChatOptions:
    """Which column holds what. ``None`` leaves that field unset."""

    preset: str | None = None
    messages: str = "messages"
    tools: str | None = "tools"
    id: str | None = "id"  # comma-separated columns make one id
    task_id: str | None = "instance_id"
    resolved: str | None = "resolved"
    reward: str | None = "reward"
    patch: str | None = "patch"
    model: str | None = "model"
    exit_status: str | None = "exit_status"
    # Columns a preset knows and keeps under source.meta without counting them as unknown.
    known: frozenset[str] = field(default_factory=frozenset)

    def columns(self) -> dict[str, str]:
        """Mapped option -> column path, for the options that name one."""
        names = ("messages", "tools", "id", "task_id", "resolved", "reward", "patch", "model", "exit_status")
        return {name: getattr(self, name) for name in names if getattr(self, name)}


PRESETS: dict[str, ChatOptions] = {
    "swe-gym": ChatOptions(preset="swe-gym", id="run_id,instance_id", patch="test_result.git_patch", known=frozenset({"run_id", "test_result"})),
    "swe-smith": ChatOptions(preset="swe-smith", id="traj_id", model="model"),
    "nebius-swe-agent": ChatOptions(
        preset="nebius-swe-agent", messages="trajectory", tools=None, resolved="target", patch="generated_patch", model="model_name", known=frozenset({"eval_logs"})
    ),
    "swe-rebench-openhands": ChatOptions(preset="swe-rebench-openhands", messages="trajectory", id="trajectory_id", patch="model_patch", known=frozenset({"repo"})),
}


def options_for(preset: str | None = None, **overrides: str | None) -> ChatOptions:
    """A preset's options (or the generic ones) with the named columns replaced."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    base = PRESETS[preset] if preset else ChatOptions()
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **given) if given else base


class ChatImporter:
    """The ``chat`` importer configured with column names: offers ``discover``/``read`` as an
    importer module does, for ``import_files(..., importer=...)``."""

    def __init__(self, options: ChatOptions) -> None:
        self.options = options

    def discover(self, root: Path) -> list[Path]:
        return discover(root)

    def read(self, path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
        return read(path, salvage=salvage, options=self.options)


def discover(root: Path) -> list[Path]:
    suffixes = (*JSONL_SUFFIXES, *JSON_SUFFIXES, *PARQUET_SUFFIXES)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.lower().endswith(suffixes))


def read(path: Path, *, salvage: bool = False, options: ChatOptions | None = None) -> Iterator[ImportResult]:
    chosen = options or ChatOptions()
    return read_rows(path, lambda row, diagnostics: convert(row, str(path), chosen, diagnostics), empty="no rows")


def convert(row: Row, path: str, options: ChatOptions, diag: Diagnostics) -> Trajectory:
    top = Fields(row.data, path, row.line, row.prefix)
    columns = options.columns()
    raw_messages = decode_json_text(pick(top.data, options.messages))
    if raw_messages is None:
        hint = "" if options.preset else f" (name the column with --messages, or choose a --preset: {', '.join(PRESETS)})"
        raise fail(path, row.line, top._name(options.messages), f"missing{hint}")
    if not isinstance(raw_messages, list):
        raise fail(path, row.line, top._name(options.messages), f"expected an array of messages, got {type(raw_messages).__name__}")
    if not raw_messages:
        raise fail(path, row.line, top._name(options.messages), "empty: nothing to import")
    reader = _Messages(path, row.line, top._name(options.messages), diag)
    messages = [reader.message(index, raw) for index, raw in enumerate(raw_messages)]

    tools = decode_json_text(pick(top.data, options.tools)) if options.tools else None
    if row.null_filled and tools is not None:
        tools = drop_nulls(tools)
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise fail(path, row.line, top._name(options.tools or ""), "expected an array of tool schemas")
    resolved = _flag_column(top, options.resolved)
    reward = _number_column(top, options.reward)
    patch = _text_column(top, options.patch)
    status_text = _text_column(top, options.exit_status)

    paths = [column.strip() for value in columns.values() for column in value.split(",")]
    # A column mapped whole has its field; one reached by a dotted path may hold more than
    # the mapped value: the rest of it is kept (and, being known, not counted).
    used = {column for column in paths if "." not in column}
    reached = {column.split(".", 1)[0] for column in paths if "." in column}
    leftover = {k: v for k, v in top.data.items() if k not in used}
    for column in paths:
        if "." in column:
            root, rest = column.split(".", 1)
            if root in leftover:
                leftover[root] = _without(leftover[root], rest)
    for key in leftover:
        if key not in options.known and key not in reached:
            diag.unknown_kind(row.line, f"column {key!r}")
    meta: dict[str, Any] = {"preset": options.preset, "columns": leftover}
    if options.id:
        # The id's own columns, as they were (the id prefixes and joins them): an export writes them back.
        values = {column.strip(): pick(top.data, column.strip()) for column in options.id.split(",")}
        if any(v is not None for v in values.values()):
            meta["id_columns"] = values
    if status_text is not None:
        meta["exit_status"] = status_text
    if reader.dropped_nulls or (row.null_filled and tools is not None):
        meta["dropped"] = ["null-valued message keys (Parquet fills every key any message has)"]
        if row.null_filled and tools is not None:
            meta["dropped"].append("null-valued keys of Parquet tool schemas")
    if reader.masked:
        meta["source_mask"] = {"key": sorted(reader.mask_keys), "assistant_turns_masked_out": reader.masked_out}
    return Trajectory(
        id=_row_id(top, options.id),
        task_id=_text_column(top, options.task_id),
        policy=Policy(name=_text_column(top, options.model)),
        messages=messages,
        tools=tools,
        final_patch=patch,
        exit_status=_exit_status(status_text),
        outcome=imported_outcome(FORMAT, reward=reward, resolved=resolved, details={"preset": options.preset} if options.preset else None),
        source=Source(format=FORMAT, format_version=options.preset, path=path, meta=meta),
    )


def _without(value: Any, path: str) -> Any:
    """``value`` less the part at dotted ``path`` (mapped to a field); JSON text is kept as it
    was, since its bytes are the record."""
    if not isinstance(value, dict):
        return value
    head, _, rest = path.partition(".")
    if head not in value:
        return value
    if not rest:
        return {k: v for k, v in value.items() if k != head}
    return {**value, head: _without(value[head], rest)}


def _row_id(top: Fields, spec: str | None) -> str:
    if not spec:
        return ""  # a content hash, given when the record is made
    parts = [pick(top.data, column.strip()) for column in spec.split(",")]
    if any(p is None or p == "" for p in parts):
        return ""
    return "chat-" + ":".join(str(p) for p in parts)


def _text_column(top: Fields, column: str | None) -> str | None:
    value = pick(top.data, column) if column else None
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise fail(top.path, top.line, top._name(column or ""), f"expected text, got {type(value).__name__}")


def _flag_column(top: Fields, column: str | None) -> bool | None:
    value = pick(top.data, column) if column else None
    if value is None:
        return None
    parsed = flag(value)
    if parsed is None:
        raise fail(top.path, top.line, top._name(column or ""), f"expected true/false, got {value!r}")
    return parsed


def _number_column(top: Fields, column: str | None) -> float | None:
    value = pick(top.data, column) if column else None
    if value is None:
        return None
    parsed = number(value)
    if parsed is None:
        raise fail(top.path, top.line, top._name(column or ""), f"expected a number, got {value!r}")
    return parsed


def _exit_status(text: str | None) -> ExitStatus:
    if not text:
        return ExitStatus.unknown
    if text in ExitStatus.__members__:
        return ExitStatus(text)
    # SWE-agent's vocabulary (submitted, exit_cost, ...) is what these sets write.
    return swe_agent.exit_status(text)


class _Messages:
    """Reads one row's messages, pairing tool results with the calls they answer."""

    def __init__(self, path: str, line: int | None, prefix: str, diag: Diagnostics) -> None:
        self.path = path
        self.line = line
        self.prefix = prefix
        self.diag = diag
        self.open_calls: list[str] = []
        self.made: set[str] = set()
        self.dropped_nulls = False
        self.mask_keys: set[str] = set()
        self.masked = False
        self.masked_out = 0

    def message(self, index: int, raw: Any) -> Message:
        where = f"{self.prefix}[{index}]"
        if not isinstance(raw, dict):
            raise fail(self.path, self.line, where, f"expected an object, got {type(raw).__name__}")
        data = {k: v for k, v in raw.items() if v is not None}
        self.dropped_nulls = self.dropped_nulls or len(data) != len(raw)
        item = Fields(data, self.path, self.line, where)
        role_key = next((k for k in ROLE_KEYS if k in data), "role")
        given_role = item.str(role_key, required=True) or ""
        role = ROLE_ALIASES.get(given_role, given_role)
        if role not in ROLES:
            raise fail(self.path, self.line, item._name(role_key), f"unknown role {given_role!r}")
        content_key = next((k for k in CONTENT_KEYS if k in data), "content")
        content = item.get(content_key, (str, list))
        consumed = {role_key, content_key, *MESSAGE_FIELDS}
        extra: dict[str, Any] = {}
        if given_role != role:
            extra["source_role"] = given_role
        if isinstance(content, list):
            extra["content_parts"] = content
            content = text_of_parts(content)
        calls = [self.call(index, number, call) for number, call in enumerate(item.items("tool_calls"))] if role == "assistant" and data.get("tool_calls") else None
        if data.get("tool_calls") and role != "assistant":
            raise fail(self.path, self.line, item._name("tool_calls"), f"only assistant messages make tool calls, not {given_role!r}")
        answers = self.answered(item) if role == "tool" else None
        if role != "tool" and data.get("tool_call_id") is not None:
            extra["tool_call_id"] = data["tool_call_id"]
        message = Message(
            role=role,  # type: ignore[arg-type]
            content=content,
            reasoning_content=item.str("reasoning_content"),
            tool_calls=calls,
            tool_call_id=answers,
            name=item.str("name"),
            generated=role == "assistant",
        )
        self.tokens(item, message, consumed)
        self.mask(item, message, consumed)
        extra.update({k: v for k, v in data.items() if k not in consumed})
        message.extra = extra or None
        return message

    def call(self, index: int, number: int, call: Fields) -> ToolCall:
        clean = {k: v for k, v in call.data.items() if v is not None}
        if isinstance(clean.get("function"), dict):
            clean["function"] = {k: v for k, v in clean["function"].items() if v is not None}
        call = Fields(clean, call.path, call.line, call.prefix)
        if not call.str("id"):
            # Some sets leave ids out; results then answer calls in order.
            call = Fields({**call.data, "id": f"call-{index}-{number}"}, call.path, call.line, call.prefix)
            self.diag.warn(self.line, f"{call.prefix}.id: missing; named {call.data['id']!r}")
        made = openai_tool_call(call, self.diag)
        if made.id in self.made:
            raise fail(self.path, self.line, f"{call.prefix}.id", f"tool call id {made.id!r} used twice")
        self.made.add(made.id)
        self.open_calls.append(made.id)
        return made

    def answered(self, item: Fields) -> str:
        call_id = item.str("tool_call_id")
        if call_id is None:
            if not self.open_calls:
                raise fail(self.path, self.line, item._name("tool_call_id"), "missing, and no earlier call is unanswered")
            call_id = self.open_calls[0]
            self.diag.warn(self.line, f"{item._name('tool_call_id')}: missing; paired with the earliest unanswered call {call_id!r}")
        if call_id not in self.open_calls:
            why = "answered twice" if call_id in self.made else "answers no earlier call"
            raise fail(self.path, self.line, item._name("tool_call_id"), f"{call_id!r} {why}")
        self.open_calls.remove(call_id)
        return call_id

    def tokens(self, item: Fields, message: Message, consumed: set[str]) -> None:
        """Token ids and log-probs the inference engine recorded for this turn, as lists."""
        for key in TOKEN_ID_KEYS:
            value = item.data.get(key)
            if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                message.token_ids = value or None
                consumed.add(key)
                break
        for key in LOGPROB_KEYS:
            value = item.data.get(key)
            if isinstance(value, list) and all(number(v) is not None for v in value):
                message.logprobs = [float(v) for v in value] or None
                consumed.add(key)
                break

    def mask(self, item: Fields, message: Message, consumed: set[str]) -> None:
        """The source's own training mask decides eligibility; the key stays in ``extra``."""
        key = next((k for k in MASK_KEYS if k in item.data), None)
        if key is None:
            return
        value = flag(item.data[key])
        if value is None:
            raise fail(self.path, self.line, item._name(key), f"expected a 0/1 or true/false training mask, got {item.data[key]!r}")
        self.masked = True
        self.mask_keys.add(key)
        if message.role == "assistant":
            message.generated = value
            self.masked_out += not value
        elif value:
            self.diag.warn(self.line, f"{item._name(key)}: the source marks a {message.role} turn trainable; only assistant turns are")
