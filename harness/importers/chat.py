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

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from harness.importers import swe_agent
from harness.importers.base import (
    Diagnostics,
    Fields,
    ImportResult,
    fail,
    flag,
    imported_outcome,
    number,
    openai_tool_call,
    parse_arguments,
    text_of_parts,
)
from harness.importers.rows import (
    JSON_SUFFIXES,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    Row,
    RowRecord,
    decode_json_text,
    drop_nulls,
    pick,
    read_rows,
)
from records.trajectory import (
    SCHEMA_VERSION,
    ExitStatus,
    Message,
    Outcome,
    Policy,
    Source,
    ToolCall,
    Trajectory,
    WideFloat,
    is_wide,
    record_content_id,
)

FORMAT = "chat"
ROLES = {"system", "developer", "user", "assistant", "tool"}
ROLE_ALIASES = {"ai": "assistant", "gpt": "assistant", "model": "assistant", "human": "user", "function": "tool", "ipython": "tool"}
CONTENT_KEYS = ("content", "text", "value")
ROLE_KEYS = ("role", "from")
MASK_KEYS = ("mask", "loss_mask", "train", "weight")
TOKEN_ID_KEYS = ("token_ids", "generation_token_ids")
LOGPROB_KEYS = ("logprobs", "generation_log_probs")
MESSAGE_FIELDS = {"reasoning_content", "tool_calls", "tool_call_id", "name"}
# A message of these keys only, and a call of these, are read without looking for others.
CHAT_KEYS = frozenset({"role", "content", *MESSAGE_FIELDS})
CALL_KEYS = frozenset({"id", "type", "function"})


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
    "swe-gym": ChatOptions(
        preset="swe-gym", id="run_id,instance_id", patch="test_result.git_patch", known=frozenset({"run_id", "test_result"})
    ),
    "swe-smith": ChatOptions(preset="swe-smith", id="traj_id", model="model"),
    "nebius-swe-agent": ChatOptions(
        preset="nebius-swe-agent",
        messages="trajectory",
        tools=None,
        resolved="target",
        patch="generated_patch",
        model="model_name",
        known=frozenset({"eval_logs"}),
    ),
    "swe-rebench-openhands": ChatOptions(
        preset="swe-rebench-openhands", messages="trajectory", id="trajectory_id", patch="model_patch", known=frozenset({"repo"})
    ),
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
    return read_rows(path, lambda row, diagnostics: convert_row(row, str(path), chosen, diagnostics), empty="no rows")


def convert_row(row: Row, path: str, options: ChatOptions, diag: Diagnostics) -> RowRecord | Trajectory:
    """The row's trajectory as its pool line's JSON object, built field by field with the checks
    ``convert`` makes, so that no model is built or validated. A row that would take more (a
    warning, an error, a value Parquet gives that is not JSON's own) goes through ``convert``,
    which reads it, warns or rejects it with the located error; this path never does."""
    messages = _plain_messages(pick(row.data, options.messages) if type(row.data) is dict else None)
    if messages is None:
        return convert(row, path, options, diag)
    records, notes = messages
    top = Fields(row.data, path, row.line, row.prefix)
    warned, unknown = len(diag.warnings), diag.unknown.copy()
    fields = _row_fields(top, row, options, notes, diag)
    if (fields.tools is not None and not _json_marked(fields.tools)) or not _json_marked(fields.meta):
        return _by_the_model(row, path, options, diag, warned, unknown)
    record: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "id": fields.id}
    if fields.task_id is not None:
        record["task_id"] = fields.task_id
    record["policy"] = {"name": fields.model} if fields.model is not None else {}
    record["messages"] = records
    if fields.tools is not None:
        record["tools"] = fields.tools
    if fields.patch is not None:
        record["final_patch"] = fields.patch
    record["exit_status"] = fields.exit_status.value
    if fields.outcome is not None:
        outcome = fields.outcome.model_dump(exclude_none=True)
        if "reward" in outcome and is_wide(outcome["reward"]):
            outcome["reward"] = WideFloat(outcome["reward"])
        record["outcome"] = outcome
    source: dict[str, Any] = {"format": FORMAT}
    if options.preset is not None:
        source["format_version"] = options.preset
    source["path"] = path
    source["meta"] = fields.meta
    record["source"] = source
    if fields.id:
        return RowRecord(record)
    try:
        digest = record_content_id(record)
    except ValueError:  # text no pool line can hold (a lone surrogate): rejected as the model rejects it
        return _by_the_model(row, path, options, diag, warned, unknown)
    record["id"] = digest
    return RowRecord(record, content_hash=digest)


def _by_the_model(row: Row, path: str, options: ChatOptions, diag: Diagnostics, warned: int, unknown: Counter[str]) -> Trajectory:
    """``convert`` of a row whose columns were read already: what that reading told ``diag`` is
    taken back first, so that the row is counted once."""
    del diag.warnings[warned:]
    diag.unknown.clear()
    diag.unknown.update(unknown)
    return convert(row, path, options, diag)


def convert(row: Row, path: str, options: ChatOptions, diag: Diagnostics) -> Trajectory:
    """The row's Trajectory, every value validated by the model: the reference ``convert_row``
    is measured against, and the reader of rows it does not take."""
    top = Fields(row.data, path, row.line, row.prefix)
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
    fields = _row_fields(top, row, options, reader.notes, diag)
    return Trajectory(
        id=fields.id,
        task_id=fields.task_id,
        policy=Policy(name=fields.model),
        messages=messages,
        tools=fields.tools,
        final_patch=fields.patch,
        exit_status=fields.exit_status,
        outcome=fields.outcome,
        source=Source(format=FORMAT, format_version=options.preset, path=path, meta=fields.meta),
    )


@dataclass
class _Notes:
    """What reading a row's messages found that its ``source.meta`` says."""

    dropped_nulls: bool = False
    mask_keys: set[str] = field(default_factory=set)
    masked_out: int = 0


@dataclass(frozen=True)
class _RowFields:
    """A row's values outside its messages."""

    id: str
    task_id: str | None
    model: str | None
    tools: list[dict[str, Any]] | None
    patch: str | None
    exit_status: ExitStatus
    outcome: Outcome | None
    meta: dict[str, Any]


def _row_fields(top: Fields, row: Row, options: ChatOptions, notes: _Notes, diag: Diagnostics) -> _RowFields:
    """Read after the messages (whose errors come first), as both readers do."""
    path = top.path
    columns = options.columns()
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
    if notes.dropped_nulls or (row.null_filled and tools is not None):
        meta["dropped"] = ["null-valued message keys (Parquet fills every key any message has)"]
        if row.null_filled and tools is not None:
            meta["dropped"].append("null-valued keys of Parquet tool schemas")
    if notes.mask_keys:
        meta["source_mask"] = {"key": sorted(notes.mask_keys), "assistant_turns_masked_out": notes.masked_out}
    return _RowFields(
        id=_row_id(top, options.id),
        task_id=_text_column(top, options.task_id),
        model=_text_column(top, options.model),
        tools=tools,
        patch=patch,
        exit_status=_exit_status(status_text),
        outcome=imported_outcome(FORMAT, reward=reward, resolved=resolved, details={"preset": options.preset} if options.preset else None),
        meta=meta,
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
        self.notes = _Notes()

    def message(self, index: int, raw: Any) -> Message:
        where = f"{self.prefix}[{index}]"
        if not isinstance(raw, dict):
            raise fail(self.path, self.line, where, f"expected an object, got {type(raw).__name__}")
        data = {k: v for k, v in raw.items() if v is not None}
        self.notes.dropped_nulls = self.notes.dropped_nulls or len(data) != len(raw)
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
        calls = (
            [self.call(index, number, call) for number, call in enumerate(item.items("tool_calls"))]
            if role == "assistant" and data.get("tool_calls")
            else None
        )
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
        self.notes.mask_keys.add(key)
        if message.role == "assistant":
            message.generated = value
            self.notes.masked_out += not value
        elif value:
            self.diag.warn(self.line, f"{item._name(key)}: the source marks a {message.role} turn trainable; only assistant turns are")


# ---- the record path ---------------------------------------------------------------
# ``convert_row``'s reading of the messages: what ``_Messages`` does for a message it takes
# without a warning or an error, each message a dict of ``records.trajectory.Message``'s fields
# in its order, None left out (the line ``model_dump_json`` writes). ``_NotPlain`` is any other
# message: ``convert`` then reads the row, and says what is wrong with it.


class _NotPlain(Exception):
    pass


def _plain_messages(raw_messages: Any) -> tuple[list[dict[str, Any]], _Notes] | None:
    raw_messages = decode_json_text(raw_messages)
    if type(raw_messages) is not list or not raw_messages:
        return None
    reader = _PlainMessages()
    try:
        return [reader.message(raw) for raw in raw_messages], reader.notes
    except _NotPlain:
        return None


class _PlainMessages:
    def __init__(self) -> None:
        self.open_calls: list[str] = []
        self.made: set[str] = set()
        self.notes = _Notes()

    def message(self, raw: Any) -> dict[str, Any]:
        if type(raw) is not dict:
            raise _NotPlain
        data = raw
        if None in raw.values():
            data = {k: v for k, v in raw.items() if v is not None}
            self.notes.dropped_nulls = True
        # The usual message has the chat fields only: no other key to look for.
        usual = data.keys() <= CHAT_KEYS
        role_key = "role" if usual or "role" in data or "from" not in data else "from"
        given_role = data.get(role_key)
        if type(given_role) is not str:
            raise _NotPlain
        role = ROLE_ALIASES.get(given_role, given_role)
        if role not in ROLES:
            raise _NotPlain
        content_key = "content" if usual or "content" in data else next((k for k in CONTENT_KEYS if k in data), "content")
        content = data.get(content_key)
        extra: dict[str, Any] = {}
        if given_role != role:
            extra["source_role"] = given_role
        if type(content) is list:
            extra["content_parts"] = content
            content = text_of_parts(content)
        elif content is not None and type(content) is not str:
            raise _NotPlain
        message: dict[str, Any] = {"role": role}
        if content is not None:
            message["content"] = content
        reasoning = data.get("reasoning_content")
        if reasoning is not None:
            if type(reasoning) is not str:
                raise _NotPlain
            message["reasoning_content"] = reasoning
        calls = data.get("tool_calls")
        if calls:
            if role != "assistant" or type(calls) is not list:
                raise _NotPlain
            message["tool_calls"] = [self.call(call) for call in calls]
        if role == "tool":
            message["tool_call_id"] = self.answered(data.get("tool_call_id"))
        elif data.get("tool_call_id") is not None:
            extra["tool_call_id"] = data["tool_call_id"]
        name = data.get("name")
        if name is not None:
            if type(name) is not str:
                raise _NotPlain
            message["name"] = name
        if usual:
            message["generated"] = role == "assistant"
        else:
            self.rest(data, role, role_key, content_key, message, extra)
        if extra:
            if not _json_marked(extra):
                raise _NotPlain
            message["extra"] = extra
        return message

    def rest(
        self, data: dict[str, Any], role: str, role_key: str, content_key: str, message: dict[str, Any], extra: dict[str, Any]
    ) -> None:
        """A message's fields after ``name``, from keys beside the chat fields: its training mask,
        token ids and log-probs; every other key goes to ``extra``."""
        message["generated"] = self.generated(data, role)
        consumed = {role_key, content_key, *MESSAGE_FIELDS}
        for key in TOKEN_ID_KEYS:
            value = data.get(key)
            if type(value) is list and all(type(v) is int for v in value):
                if value:
                    message["token_ids"] = value
                consumed.add(key)
                break
        for key in LOGPROB_KEYS:
            value = data.get(key)
            if type(value) is list and all(number(v) is not None for v in value):
                if value:
                    message["logprobs"] = [WideFloat(v) if is_wide(v) else float(v) for v in value]
                consumed.add(key)
                break
        extra.update({k: v for k, v in data.items() if k not in consumed})

    def call(self, raw: Any) -> dict[str, Any]:
        if type(raw) is not dict:
            raise _NotPlain
        clean = raw if None not in raw.values() else {k: v for k, v in raw.items() if v is not None}
        function = clean.get("function")
        if type(function) is not dict:
            raise _NotPlain
        call_id = clean.get("id")
        name = function.get("name")
        if type(call_id) is not str or not call_id or type(name) is not str or call_id in self.made:
            raise _NotPlain
        arguments = function.get("arguments")
        if type(arguments) is str:
            arguments = _arguments(arguments)
        elif arguments is None:
            arguments = {}
        elif type(arguments) is not dict or not _json_marked(arguments):
            raise _NotPlain
        call: dict[str, Any] = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if not clean.keys() <= CALL_KEYS:
            extra = {k: v for k, v in clean.items() if k not in CALL_KEYS}
            if not _json_marked(extra):
                raise _NotPlain
            call["extra"] = extra
        self.made.add(call_id)
        self.open_calls.append(call_id)
        return call

    def answered(self, call_id: Any) -> str:
        if type(call_id) is not str or call_id not in self.open_calls:
            raise _NotPlain
        self.open_calls.remove(call_id)
        return call_id

    def generated(self, data: dict[str, Any], role: str) -> bool:
        key = next((k for k in MASK_KEYS if k in data), None)
        if key is None:
            return role == "assistant"
        value = flag(data[key])
        if value is None or (value and role != "assistant"):
            raise _NotPlain  # a bad mask, or one that marks a turn no model generated
        self.notes.mask_keys.add(key)
        if role != "assistant":
            return False
        self.notes.masked_out += not value
        return value


def _marked_float(text: str) -> float:
    number = float(text)
    return WideFloat(number) if is_wide(number) else number


# Decodes call arguments with their wide floats marked: the objects it gives need no walk.
_ARGUMENTS = msgspec.json.Decoder(float_hook=_marked_float)


def _arguments(text: str) -> dict[str, Any]:
    """``base.parse_arguments`` of text that is a JSON object (or nothing): any other text is
    kept verbatim with a warning, which ``convert`` gives."""
    value, raw = parse_arguments(text, _ARGUMENTS)
    if raw is not None:
        raise _NotPlain
    return value


def _json_marked(value: dict[str, Any] | list[Any]) -> bool:
    """Whether ``value`` holds JSON's own types only, which msgspec writes as pydantic does once
    each float that ``is_wide`` is marked (done here, in place). Parquet can give others (bytes,
    datetimes, decimals), which pydantic writes its own way: such a row goes to the model."""
    pending: list[Any] = [value]
    while pending:
        container = pending.pop()
        for key, item in container.items() if type(container) is dict else enumerate(container):
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                continue
            if kind is float:
                if is_wide(item):
                    container[key] = WideFloat(item)
            elif kind is dict or kind is list:
                pending.append(item)
            else:
                return False
    return True
