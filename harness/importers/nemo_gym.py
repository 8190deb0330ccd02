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
    MODELS,
    Diagnostics,
    Fields,
    ImportResult,
    Kinds,
    fail,
    flag,
    imported_outcome,
    number,
    parse_arguments,
    text_of_parts,
)
from harness.importers.rows import JSONL_SUFFIXES, MARKED, Row, RowRecord, plain_or_model, read_rows
from records.trajectory import ExitStatus, Message, Trajectory, Usage

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


def discover(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(JSONL_SUFFIXES))


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    return read_rows(path, lambda row, diagnostics: convert_row(row, str(path), diagnostics), empty="no rollouts", decoder=MARKED)


def convert_row(row: Row, path: str, diag: Diagnostics) -> RowRecord | Trajectory:
    """The rollout as its pool line's JSON object, built by ``convert`` without the models where
    every value is one they would keep (``rows.plain_or_model``); else ``convert``'s Trajectory."""
    return plain_or_model(row, diag, lambda kinds: convert(row, path, diag, kinds))


def convert(row: Row, path: str, diag: Diagnostics, kinds: Kinds = MODELS) -> Trajectory:
    """The rollout's Trajectory, built with ``kinds``: the models (the reference), or the plain
    records (``base.PLAIN``) that ``convert_row`` writes."""
    top = Fields(row.data, path, row.line, row.prefix)
    params = top.obj("responses_create_params", required=True)
    response = top.obj("response", required=True)
    assert params is not None and response is not None
    builder = _Calls(path, row.line, diag, kinds)

    instructions = params.str("instructions")
    if instructions:
        builder.messages.append(kinds.message(role="system", content=instructions, extra={"nemo_gym_field": "instructions"}))
    prompt = params.get("input", (str, list), required=True)
    if isinstance(prompt, str):
        builder.messages.append(kinds.message(role="user", content=prompt))
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
    return kinds.trajectory(
        id=f"nemo-gym-{response_id}" if response_id else "",
        task_id=task_id,
        policy=kinds.policy(name=response.str("model")),
        attempt=top.get("_ng_rollout_index", int),
        messages=builder.messages,
        tools=[_chat_tool(t) for t in params.list("tools") if isinstance(t, dict)] or None,
        final_patch=top.str("model_patch"),
        exit_status=_exit_status(response),
        outcome=imported_outcome(FORMAT, reward=reward, resolved=flag(top.data.get("resolved")), details=details or None, kinds=kinds),
        usage=_usage(response.obj("usage"), builder.calls, kinds),
        source=kinds.source(format=FORMAT, path=path, meta=meta, records=builder.records or None),
    )


class _Calls:
    """Folds Responses-API items into chat messages, one assistant message per model call."""

    def __init__(self, path: str, line: int | None, diag: Diagnostics, kinds: Kinds) -> None:
        self.path = path
        self.line = line
        self.diag = diag
        self.kinds = kinds
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
        self.messages.append(self.kinds.message(role=role, content=text, extra=extra or None))

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
            call = self.kinds.tool_call(
                id=call_id, function=self.kinds.function_call(name=name, arguments=arguments), raw_arguments=raw, extra=call_extra or None
            )
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
        order = {"reasoning": 0, "message": 1, "function_call": 2}
        current = self.current
        if current is not None:
            parts = ((0, current.reasoning_content is not None), (1, current.content is not None), (2, bool(current.tool_calls)))
            filled = max((rank for rank, present in parts if present), default=-1)
            if order[kind] > filled or (kind == "function_call" and filled == 2):
                return current
        self.end_call()
        message = self.kinds.message(role="assistant", generated=not from_input)
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
        self.messages.append(self.kinds.message(role="tool", content=output, tool_call_id=call_id, name=name, extra=extra or None))

    def check_calls(self) -> None:
        for call_id, name in self.open_calls.items():
            self.diag.warn(self.line, f"call {call_id!r} ({name}) has no function_call_output: the rollout ended during it")


def _content(item: Fields) -> tuple[str, dict[str, Any]]:
    """A message item's text, and its parts when they hold more than one plain text."""
    content = item.get("content", (str, list), default="")
    if isinstance(content, str):
        return content, {}
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


def _usage(fields: Fields | None, calls: int, kinds: Kinds) -> Usage | None:
    if fields is None:
        return kinds.usage(api_calls=calls) if calls else None
    input_details = fields.obj("input_tokens_details")
    output_details = fields.obj("output_tokens_details")
    return kinds.usage(
        input_tokens=fields.get("input_tokens", int),
        cached_input_tokens=input_details.get("cached_tokens", int) if input_details is not None else None,
        output_tokens=fields.get("output_tokens", int),
        reasoning_output_tokens=output_details.get("reasoning_tokens", int) if output_details is not None else None,
        total_tokens=fields.get("total_tokens", int),
        api_calls=calls or None,
    )
