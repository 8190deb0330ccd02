"""NeMo Gym rollouts (Responses-API layout), one rollout per JSON line.

A line holds ``responses_create_params`` (the prompt: ``instructions``, ``input`` as text
or items, ``tools``), the ``response`` (``output[]`` items: ``reasoning``, ``message``,
``function_call``, ``function_call_output``; ``usage``), a scalar ``reward``,
``_ng_task_index``/``_ng_rollout_index``, and whatever the resources server added
(SWE servers: ``verifier_exit_code``, ``f2p_*``/``p2p_*``, ``resolved``, ``model_patch``).

One model call is the run of reasoning, message and function_call items up to the next
function_call_output or non-assistant message; it becomes one assistant message. NeMo Gym
puts that call's ``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs``
on the call's last item (its converter's ``postprocess_assistant_message_dict``), so an item
carrying them also ends the call. The generation ids and log-probs become the message's
``token_ids``/``logprobs`` (what ``relearn masks`` checks its render against) and the prompt
ids stay in ``extra.prompt_token_ids``. Input items are context, never generated, unless
they carry generation ids of their own (an earlier call of the same policy).

The reward (and ``resolved`` where the server gives it) becomes the outcome, marked
imported; the rollout index becomes ``attempt``. Every top-level field without a place is
kept under ``source.meta`` and counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.importers.base import (
    PLAIN,
    Diagnostics,
    Fields,
    ImportResult,
    fail,
    flag,
    imported_outcome,
    number,
    parse_arguments,
    text_of_parts,
)
from harness.importers.rows import JSONL_SUFFIXES, MARKED, Row, RowRecord, read_rows
from records.pools import RecordError
from records.trajectory import (
    SCHEMA_VERSION,
    ExitStatus,
    FunctionCall,
    Message,
    Policy,
    Source,
    ToolCall,
    Trajectory,
    Usage,
    WideFloat,
    is_wide,
    record_content_id,
)

FORMAT = "nemo-gym"
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
ROLES = {"system", "developer", "user", "assistant"}
ITEM_TYPES = {"message", "reasoning", "function_call", "function_call_output"}
# Top-level fields NeMo Gym itself writes; any other is a resources server's and is counted.
KNOWN_FIELDS = {"responses_create_params", "response", "reward", "_ng_task_index", "_ng_rollout_index", "agent_ref"}
# A resources server's verifier fields, kept with the imported outcome as its evidence.
VERIFIER_FIELDS = (
    "verifier_exit_code",
    "verifier_error",
    "f2p_total",
    "f2p_passed",
    "p2p_total",
    "p2p_passed",
    "f2p",
    "p2p",
    "partial",
    "apply_failed",
    "evaluation_completed",
    "model_patch_sha256",
)
ID_FIELDS = ("task_id", "instance_id")
MAPPED_FIELDS = {*VERIFIER_FIELDS, "resolved", "model_patch"}
# Top-level keys with a place (never counted as a server's); the keys a message item's and a
# function_call item's own fields take (left out of what is kept of the item). Sets: tested per key.
NAMED_FIELDS = frozenset({*KNOWN_FIELDS, *ID_FIELDS, *MAPPED_FIELDS})
MESSAGE_ITEM_FIELDS = frozenset({"content", *TOKEN_FIELDS})
CALL_ITEM_FIELDS = frozenset({"type", "call_id", "name", "arguments", *TOKEN_FIELDS})
# HF messages hold reasoning, then content, then tool calls: a part out of that order starts a new call.
PART_ORDER = {"reasoning": 0, "message": 1, "function_call": 2}


def discover(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(JSONL_SUFFIXES))


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    return read_rows(path, lambda row, diagnostics: convert_row(row, str(path), diagnostics), empty="no rollouts", decoder=MARKED)


def convert_row(row: Row, path: str, diag: Diagnostics) -> RowRecord | Trajectory:
    """The rollout as its pool line's JSON object where it has the usual shape and every value is
    one the models would keep (``_record``); else ``convert``'s Trajectory, which reads
    it, warns or rejects it with the located error."""
    return _record(row, path, diag) or convert(row, path, diag)


def convert(row: Row, path: str, diag: Diagnostics) -> Trajectory:
    """The rollout's Trajectory, every value validated by the models: the reference that
    ``_record`` is measured against."""
    top = Fields(row.data, path, row.line, row.prefix)
    params = top.obj("responses_create_params", required=True)
    response = top.obj("response", required=True)
    assert params is not None and response is not None
    builder = _Calls(path, row.line, diag)

    instructions = params.str("instructions")
    if instructions:
        builder.messages.append(Message(role="system", content=instructions, extra={"nemo_gym_field": "instructions"}))
    prompt = params.get("input", (str, list), required=True)
    if isinstance(prompt, str):
        builder.messages.append(Message(role="user", content=prompt))
    else:
        for item in params.items("input"):
            builder.item(item, from_input=True)
    builder.end_call()
    for item in response.items("output"):
        builder.item(item, from_input=False)
    builder.end_call()
    builder.check_calls()
    if not any(m.generated for m in builder.messages):
        raise fail(path, row.line, response._name("output"), "no model output: nothing the policy generated")

    for key in top.data:
        if key not in NAMED_FIELDS:
            diag.unknown_kind(row.line, f"server field {key!r}")
    reward = number(top.data.get("reward"))
    if "reward" in top.data and reward is None and top.data["reward"] is not None:
        raise fail(path, row.line, top._name("reward"), f"expected a number, got {type(top.data['reward']).__name__}")
    details = {k: top.data[k] for k in VERIFIER_FIELDS if k in top.data}
    meta = {k: v for k, v in top.data.items() if k not in ("responses_create_params", "response")}
    meta["responses_create_params"] = {k: v for k, v in params.data.items() if k != "input"}
    meta["response"] = {k: v for k, v in response.data.items() if k != "output"}
    task_index = top.get("_ng_task_index", int)
    task_id = next((top.str(k) for k in ID_FIELDS if top.str(k)), None)
    if task_id is None and task_index is not None:
        task_id = f"ng-task-{task_index}"  # rollouts of one task share it, which pass@k needs
    response_id = response.str("id")
    return Trajectory(
        id=f"nemo-gym-{response_id}" if response_id else "",
        task_id=task_id,
        policy=Policy(name=response.str("model")),
        attempt=top.get("_ng_rollout_index", int),
        messages=builder.messages,
        tools=[_chat_tool(t) for t in params.list("tools") if isinstance(t, dict)] or None,
        final_patch=top.str("model_patch"),
        exit_status=_exit_status(response),
        outcome=imported_outcome(FORMAT, reward=reward, resolved=flag(top.data.get("resolved")), details=details or None),
        usage=_usage(response.obj("usage"), builder.calls),
        source=Source(format=FORMAT, path=path, meta=meta, records=builder.records or None),
    )


class _Calls:
    """Folds Responses-API items into chat messages, one assistant message per model call."""

    def __init__(self, path: str, line: int | None, diag: Diagnostics) -> None:
        self.path = path
        self.line = line
        self.diag = diag
        self.messages: list[Message] = []
        self.current: Message | None = None
        self.calls = 0
        self.open_calls: dict[str, str] = {}  # call id -> tool name
        self.answered: set[str] = set()
        self.records: list[dict[str, Any]] = []

    def item(self, item: Fields, *, from_input: bool) -> None:
        kind = item.str("type") or ("message" if "role" in item.data else None)
        if kind not in ITEM_TYPES:
            # A tool NeMo Gym ran on the server side (web search, MCP): no chat message of its own.
            self.diag.unknown_kind(self.line, f"item type {kind!r}")
            self.end_call()
            self.records.append({"at_message": len(self.messages), "from": "input" if from_input else "output", "record": item.data})
        elif kind == "function_call_output":
            self.tool_output(item)
        elif kind == "message" and item.str("role", required=True) != "assistant":
            self.input_message(item)
        else:
            self.model_part(kind, item, from_input)

    def input_message(self, item: Fields) -> None:
        self.end_call()
        role = item.str("role", required=True)
        if role not in ROLES:
            raise fail(self.path, self.line, item._name("role"), f"unknown role {role!r}")
        text, extra = _content(item)
        extra.update({k: v for k, v in item.data.items() if k not in ("type", "role", "content")})
        self.messages.append(Message(role=role, content=text, extra=extra or None))

    def model_part(self, kind: str, item: Fields, from_input: bool) -> None:
        message = self.assistant_for(kind, from_input)
        extra = dict(message.extra or {})
        if kind == "reasoning":
            content = [p.get("text") for p in item.list("content") if isinstance(p, dict) and isinstance(p.get("text"), str)]
            summary = [p.get("text") for p in item.list("summary") if isinstance(p, dict) and isinstance(p.get("text"), str)]
            # The raw reasoning when the server kept it, else the summary (NeMo Gym's own
            # converter writes the parsed <think> text there).
            text = "\n\n".join(content) if content else "\n\n".join(summary)
            message.reasoning_content = text if message.reasoning_content is None else message.reasoning_content + "\n\n" + text
            extra.setdefault("reasoning_items", []).append({k: v for k, v in item.data.items() if k not in TOKEN_FIELDS})
        elif kind == "message":
            text, parts = _content(item)
            message.content = text
            extra.setdefault("message_items", []).append({k: v for k, v in item.data.items() if k not in MESSAGE_ITEM_FIELDS} | parts)
        else:
            call_id = item.str("call_id", required=True) or ""
            name = item.str("name", required=True) or ""
            given = item.get("arguments", (str, dict), default="")
            arguments, raw = (given, None) if isinstance(given, dict) else parse_arguments(given)
            if raw is not None:
                self.diag.warn(self.line, f"{item._name('arguments')}: not a JSON object (kept verbatim in raw_arguments)")
            if call_id in self.open_calls or call_id in self.answered:
                raise fail(self.path, self.line, item._name("call_id"), f"call_id {call_id!r} used twice")
            self.open_calls[call_id] = name
            call_extra = {k: v for k, v in item.data.items() if k not in CALL_ITEM_FIELDS}
            call = ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments), raw_arguments=raw, extra=call_extra or None)
            message.tool_calls = [*(message.tool_calls or []), call]
        message.extra = extra
        if any(k in item.data for k in TOKEN_FIELDS):
            self.token_ids(message, item)
            self.end_call()  # the call's last item carries its ids

    def token_ids(self, message: Message, item: Fields) -> None:
        generation = item.get("generation_token_ids", list)
        logprobs = item.get("generation_log_probs", list)
        prompt = item.get("prompt_token_ids", list)
        for name, values, kinds in (
            ("generation_token_ids", generation, int),
            ("generation_log_probs", logprobs, (int, float)),
            ("prompt_token_ids", prompt, int),
        ):
            if values and not all(isinstance(v, kinds) and not isinstance(v, bool) for v in values):
                raise fail(self.path, self.line, item._name(name), "expected an array of numbers")
        if generation and logprobs and len(generation) != len(logprobs):
            raise fail(
                self.path,
                self.line,
                item._name("generation_log_probs"),
                f"{len(logprobs)} log-probs for {len(generation)} generated tokens",
            )
        extra = dict(message.extra or {})
        if generation:
            message.token_ids = list(generation)
            message.generated = True
        if logprobs:
            message.logprobs = [float(v) for v in logprobs]
        if prompt:
            extra["prompt_token_ids"] = list(prompt)
        empty = [k for k in TOKEN_FIELDS if item.data.get(k) == []]
        if empty:
            extra["empty_token_fields"] = empty  # recorded, but the server filled nothing in
        message.extra = extra

    def assistant_for(self, kind: str, from_input: bool) -> Message:
        """The message a part of the current model call goes in. HF messages hold reasoning,
        then content, then tool calls; a part that comes out of that order starts a new call
        (only tool calls repeat within one)."""
        current = self.current
        if current is not None:
            parts = ((0, current.reasoning_content is not None), (1, current.content is not None), (2, bool(current.tool_calls)))
            filled = max((rank for rank, present in parts if present), default=-1)
            if PART_ORDER[kind] > filled or (kind == "function_call" and filled == 2):
                return current
        self.end_call()
        message = Message(role="assistant", generated=not from_input)
        self.messages.append(message)
        self.current = message
        if not from_input:
            self.calls += 1
        return message

    def end_call(self) -> None:
        self.current = None

    def tool_output(self, item: Fields) -> None:
        self.end_call()
        call_id = item.str("call_id", required=True) or ""
        if call_id not in self.open_calls:
            why = "answered twice" if call_id in self.answered else "no earlier function_call has this call_id"
            raise fail(self.path, self.line, item._name("call_id"), f"output for {call_id!r}: {why}")
        name = self.open_calls.pop(call_id)
        self.answered.add(call_id)
        output = item.get("output", (str, list), default="")
        extra = {k: v for k, v in item.data.items() if k not in ("type", "call_id", "output")}
        if isinstance(output, list):
            extra["content_parts"] = output
            output = text_of_parts(output)
        self.messages.append(Message(role="tool", content=output, tool_call_id=call_id, name=name, extra=extra or None))

    def check_calls(self) -> None:
        for call_id, name in self.open_calls.items():
            self.diag.warn(self.line, f"call {call_id!r} ({name}) has no function_call_output: the rollout ended during it")


def _content(item: Fields) -> tuple[str, dict[str, Any]]:
    """A message item's text, and its parts when they hold more than one plain text."""
    content = item.get("content", (str, list), default="")
    return (content, {}) if isinstance(content, str) else _parts_text(content)


def _parts_text(content: list[Any]) -> tuple[str, dict[str, Any]]:
    texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    plain = (
        len(content) == 1
        and isinstance(content[0], dict)
        and set(content[0]) <= {"type", "text", "annotations", "logprobs"}
        and not content[0].get("annotations")
        and not content[0].get("logprobs")
    )
    return "".join(texts) if len(texts) != 1 else texts[0], {} if plain else {"content_parts": content}


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses-API tool (``{type, name, description, parameters, strict}``) as the
    chat-completions schema templates take (``{type: function, function: {...}}``)."""
    if tool.get("type") != "function" or "function" in tool:
        return tool
    return {"type": "function", "function": {k: v for k, v in tool.items() if k not in ("type", "strict")}}


def _exit_status(response: Fields) -> ExitStatus:
    if response.data.get("error"):
        return ExitStatus.policy_error
    details = response.obj("incomplete_details")
    if details is not None and details.str("reason") == "max_output_tokens":
        return ExitStatus.tokens_exhausted
    status = response.str("status")
    return {"completed": ExitStatus.submitted, "incomplete": ExitStatus.tokens_exhausted, "failed": ExitStatus.policy_error}.get(
        status or "", ExitStatus.unknown
    )


def _usage(fields: Fields | None, calls: int) -> Usage | None:
    if fields is None:
        return Usage(api_calls=calls) if calls else None
    input_details = fields.obj("input_tokens_details")
    output_details = fields.obj("output_tokens_details")
    return Usage(
        input_tokens=fields.get("input_tokens", int),
        cached_input_tokens=input_details.get("cached_tokens", int) if input_details is not None else None,
        output_tokens=fields.get("output_tokens", int),
        reasoning_output_tokens=output_details.get("reasoning_tokens", int) if output_details is not None else None,
        total_tokens=fields.get("total_tokens", int),
        api_calls=calls or None,
    )


# ---- the usual rollout, straight to its pool line ---------------------------------------
# ``_record`` builds the pool line's JSON object of a rollout of the usual shape in one pass over
# plain dicts, in the models' field order with None left out (what ``model_dump_json`` writes), in
# two fifths of the time ``convert`` takes. Every value goes through the check the model would make;
# anything else (a value the model would coerce or reject, an unknown item type, a row that
# warns beyond its unknown server fields, an error of the input) is ``_Unusual``, and the row
# goes to ``convert``, which reads, warns and rejects as the reference does.
# ``tests/test_import_rows_bytes.py`` holds the two to the same bytes.


class _Unusual(Exception):
    pass


def _record(row: Row, path: str, diag: Diagnostics) -> RowRecord | None:
    """The rollout's pool line as a JSON object, or None for ``convert`` to read. Only a row
    decoded with its wide floats marked (``rows.MARKED``) is built here."""
    data = row.data
    if not row.marked or type(data) is not dict:
        return None
    try:
        record = _Rollout(path).record(data)
        digest = None if record["id"] else record_content_id(record)
    except (_Unusual, ValueError):  # ValueError: text no pool line holds (a lone surrogate)
        return None
    if digest is not None:
        record["id"] = digest
    # Last, once nothing can send the row to ``convert``, which would count them again.
    diag.unknown_kinds(row.line, [f"server field {key!r}" for key in data if key not in NAMED_FIELDS])
    return RowRecord(record, content_hash=digest)


class _Turn:
    """An assistant message being folded from a model call's items (fields in the model's order)."""

    __slots__ = ("content", "extra", "generated", "logprobs", "reasoning", "token_ids", "tool_calls")

    def __init__(self, generated: bool) -> None:
        self.reasoning: str | None = None
        self.content: str | None = None
        self.tool_calls: list[dict[str, Any]] = []
        self.generated = generated
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.extra: dict[str, Any] = {}

    def filled(self) -> int:
        return 2 if self.tool_calls else 1 if self.content is not None else 0 if self.reasoning is not None else -1

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant"}
        if self.content is not None:
            message["content"] = self.content
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        message["generated"] = self.generated
        if self.token_ids is not None:
            message["token_ids"] = self.token_ids
        if self.logprobs is not None:
            message["logprobs"] = self.logprobs
        message["extra"] = self.extra
        return message


class _Rollout:
    """``convert``'s fold of items into messages (``_Calls``), on dicts."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[dict[str, Any] | _Turn] = []
        self.current: _Turn | None = None
        self.calls = 0
        self.open_calls: dict[str, str] = {}
        self.answered: set[str] = set()

    def record(self, data: dict[str, Any]) -> dict[str, Any]:
        params, response = data.get("responses_create_params"), data.get("response")
        if type(params) is not dict or type(response) is not dict:
            raise _Unusual
        instructions = _text(params.get("instructions"))
        if instructions:
            self.messages.append(
                {"role": "system", "content": instructions, "generated": False, "extra": {"nemo_gym_field": "instructions"}}
            )
        prompt = params.get("input")
        if type(prompt) is str:
            self.messages.append({"role": "user", "content": prompt, "generated": False})
        else:
            for item in _list(prompt, required=True):
                self.item(item, from_input=True)
        self.current = None
        for item in _list(response.get("output")):
            self.item(item, from_input=False)
        if self.open_calls:  # warned by ``convert``
            raise _Unusual
        messages = [m if type(m) is dict else m.message() for m in self.messages]
        if not any(m["generated"] for m in messages):
            raise _Unusual
        return self.trajectory(data, params, response, messages)

    def trajectory(
        self, data: dict[str, Any], params: dict[str, Any], response: dict[str, Any], messages: list[dict[str, Any]]
    ) -> dict[str, Any]:
        given = data.get("reward")
        reward = number(given)
        if reward is None and given is not None:
            raise _Unusual
        task_index = _int(data.get("_ng_task_index"))
        task_id = None
        for key in ID_FIELDS:
            value = _text(data.get(key))
            if value:
                task_id = value
                break
        if task_id is None and task_index is not None:
            task_id = f"ng-task-{task_index}"
        response_id, model = _text(response.get("id")), _text(response.get("model"))
        attempt = _int(data.get("_ng_rollout_index"))
        tools = [_chat_tool(t) for t in _list(params.get("tools")) if isinstance(t, dict)]
        patch = _text(data.get("model_patch"))
        try:
            status = _exit_status(Fields(response, self.path, None, "response"))
        except RecordError:
            raise _Unusual from None
        record: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "id": f"nemo-gym-{response_id}" if response_id else ""}
        if task_id is not None:
            record["task_id"] = task_id
        record["policy"] = {} if model is None else {"name": model}
        if attempt is not None:
            record["attempt"] = attempt
        record["messages"] = messages
        if tools:
            record["tools"] = tools
        if patch is not None:
            record["final_patch"] = patch
        record["exit_status"] = status.value
        details = {k: data[k] for k in VERIFIER_FIELDS if k in data}
        outcome = imported_outcome(FORMAT, reward=reward, resolved=flag(data.get("resolved")), details=details or None, kinds=PLAIN)
        if outcome is not None:
            record["outcome"] = outcome.to_record()
        usage = self.usage(response.get("usage"))
        if usage is not None:
            record["usage"] = usage
        # ``convert``'s comprehensions, as copies less a key (the same order, in C).
        meta = dict(data)
        del meta["responses_create_params"], meta["response"]
        meta["responses_create_params"] = _less(params, "input")
        meta["response"] = _less(response, "output")
        record["source"] = {"format": FORMAT, "path": self.path, "meta": meta}
        return record

    def item(self, item: Any, *, from_input: bool) -> None:
        if type(item) is not dict:
            raise _Unusual
        kind = _text(item.get("type")) or ("message" if "role" in item else None)
        if kind == "function_call_output":
            self.tool_output(item)
        elif kind == "message":
            role = item.get("role")
            if type(role) is not str:
                raise _Unusual
            if role == "assistant":
                self.model_part(kind, item, from_input)
            else:
                self.input_message(role, item)
        elif kind == "reasoning" or kind == "function_call":
            self.model_part(kind, item, from_input)
        else:  # an item type kept under source.records by ``convert``
            raise _Unusual

    def input_message(self, role: str, item: dict[str, Any]) -> None:
        self.current = None
        if role not in ROLES:
            raise _Unusual
        text, extra = _item_text(item)
        extra.update((k, v) for k, v in item.items() if k != "type" and k != "role" and k != "content")
        message: dict[str, Any] = {"role": role, "content": text, "generated": False}
        if extra:
            message["extra"] = extra
        self.messages.append(message)

    def tool_output(self, item: dict[str, Any]) -> None:
        self.current = None
        call_id = item.get("call_id")
        if type(call_id) is not str or call_id not in self.open_calls or not call_id:  # an empty id: the model refuses it
            raise _Unusual
        name = self.open_calls.pop(call_id)
        self.answered.add(call_id)
        output = item.get("output")
        extra = {k: v for k, v in item.items() if k != "type" and k != "call_id" and k != "output"}
        if output is None:
            output = ""
        elif type(output) is list:
            extra["content_parts"] = output
            output = text_of_parts(output)
        elif type(output) is not str:
            raise _Unusual
        message = {"role": "tool", "content": output, "tool_call_id": call_id, "name": name, "generated": False}
        if extra:
            message["extra"] = extra
        self.messages.append(message)

    def model_part(self, kind: str, item: dict[str, Any], from_input: bool) -> None:
        turn = self.turn_for(kind, from_input)
        if kind == "reasoning":
            content = [p["text"] for p in _list(item.get("content")) if type(p) is dict and type(p.get("text")) is str]
            summary = [p["text"] for p in _list(item.get("summary")) if type(p) is dict and type(p.get("text")) is str]
            text = "\n\n".join(content) if content else "\n\n".join(summary)
            turn.reasoning = text if turn.reasoning is None else turn.reasoning + "\n\n" + text
            turn.extra.setdefault("reasoning_items", []).append({k: v for k, v in item.items() if k not in TOKEN_FIELDS})
        elif kind == "message":
            text, parts = _item_text(item)
            turn.content = text
            turn.extra.setdefault("message_items", []).append({k: v for k, v in item.items() if k not in MESSAGE_ITEM_FIELDS} | parts)
        else:
            turn.tool_calls.append(self.call(item))
        if "generation_token_ids" in item or "generation_log_probs" in item or "prompt_token_ids" in item:
            _token_ids(turn, item)
            self.current = None  # the call's last item carries its ids

    def call(self, item: dict[str, Any]) -> dict[str, Any]:
        call_id, name, given = item.get("call_id"), item.get("name"), item.get("arguments")
        if type(call_id) is not str or not call_id or type(name) is not str:
            raise _Unusual
        if type(given) is dict:
            arguments = given
        elif given is None or type(given) is str:
            # Marked: a wide float in the text is written as the model writes it.
            arguments, raw = parse_arguments(given or "", MARKED)
            if raw is not None:  # kept verbatim, with a warning, by ``convert``
                raise _Unusual
        else:
            raise _Unusual
        if call_id in self.open_calls or call_id in self.answered:
            raise _Unusual
        self.open_calls[call_id] = name
        call: dict[str, Any] = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        extra = {k: v for k, v in item.items() if k not in CALL_ITEM_FIELDS}
        if extra:
            call["extra"] = extra
        return call

    def turn_for(self, kind: str, from_input: bool) -> _Turn:
        """``_Calls.assistant_for``: the current turn, unless this part comes out of order."""
        current = self.current
        if current is not None:
            filled = current.filled()
            if PART_ORDER[kind] > filled or (kind == "function_call" and filled == 2):
                return current
        turn = _Turn(generated=not from_input)
        self.messages.append(turn)
        self.current = turn
        if not from_input:
            self.calls += 1
        return turn

    def usage(self, usage: Any) -> dict[str, Any] | None:
        if usage is None:
            return {"api_calls": self.calls} if self.calls else None
        if type(usage) is not dict:
            raise _Unusual
        given = _object(usage.get("input_tokens_details")), _object(usage.get("output_tokens_details"))
        values = (
            ("input_tokens", usage.get("input_tokens")),
            ("cached_input_tokens", given[0].get("cached_tokens") if given[0] is not None else None),
            ("output_tokens", usage.get("output_tokens")),
            ("reasoning_output_tokens", given[1].get("reasoning_tokens") if given[1] is not None else None),
            ("total_tokens", usage.get("total_tokens")),
            ("api_calls", self.calls or None),
        )
        return {name: value for name, value in values if _int(value) is not None}


def _token_ids(turn: _Turn, item: dict[str, Any]) -> None:
    """``_Calls.token_ids`` on a turn: ids and log-probs the model keeps as they are, or _Unusual."""
    generation = _list(item.get("generation_token_ids"))
    logprobs = _list(item.get("generation_log_probs"))
    prompt = _list(item.get("prompt_token_ids"))
    if not _ints(generation) or not _ints(prompt) or not set(map(type, logprobs)) <= _NUMBERS:
        raise _Unusual
    if generation and logprobs and len(generation) != len(logprobs):
        raise _Unusual
    if generation:
        turn.token_ids = generation
        turn.generated = True
    if logprobs:
        turn.logprobs = _floats(logprobs)
    if prompt:
        turn.extra["prompt_token_ids"] = prompt
    empty = [k for k in TOKEN_FIELDS if item.get(k) == []]
    if empty:
        turn.extra["empty_token_fields"] = empty


_NUMBERS = frozenset({int, float, WideFloat})


def _ints(values: list[Any]) -> bool:
    return set(map(type, values)) <= {int}  # a boolean's type is bool: not a token id


def _floats(values: list[float]) -> list[float]:
    """Log-probs as the model holds them: floats, the wide ones marked (none, nearly always: a
    finite sum and bounds inside the wide range say so without a look at each)."""
    floats = list(map(float, values))
    total = sum(floats)
    if total - total == 0.0 and not is_wide(min(floats)) and not is_wide(max(floats)):
        return floats
    return [WideFloat(f) if is_wide(f) else f for f in floats]


def _less(data: dict[str, Any], key: str) -> dict[str, Any]:
    copy = dict(data)
    copy.pop(key, None)
    return copy


def _item_text(item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    content = item.get("content")
    if content is None:
        return "", {}
    if type(content) is str:
        return content, {}
    if type(content) is not list:
        raise _Unusual
    return _parts_text(content)


def _text(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise _Unusual
    return value


def _int(value: Any) -> int | None:
    if value is not None and type(value) is not int:
        raise _Unusual
    return value


def _object(value: Any) -> dict[str, Any] | None:
    if value is not None and type(value) is not dict:
        raise _Unusual
    return value


def _list(value: Any, *, required: bool = False) -> list[Any]:
    if value is None and not required:
        return []
    if type(value) is not list:
        raise _Unusual
    return value
