"""The Responses API (``POST /v1/responses``) over the chat engine, as the Codex CLI and
``harness.policies.openai_responses.ResponsesPolicy`` speak it.

A request becomes the conversation a trajectory of the same calls would hold, rendered
the way ``relearn masks`` renders that trajectory for training: ``instructions`` a system
message; input items turned into messages by the rule the Codex importer uses
(``harness.importers.codex``: one assistant message per call holding reasoning, then text,
then tool calls; a tool output or a user message ends the call); the messages made
template input by ``harness.exporters.hf_chat`` (leading system/developer text merged
into one system message, later ones shown as user text); the tools in the chat shape
``harness.codex_cli.config.chat_tools`` gives Codex trajectories, freeform (``custom``)
tools included. So a model trained here on Codex episodes is prompted as it was trained.

The completion is parsed by the chat route's parsers (``relearn.serve.parsers``) and its
parts become output items: ``reasoning`` (the text as ``reasoning_text`` content, as vLLM
gives it), ``message``, ``function_call``, and ``custom_tool_call`` for a call to a freeform
tool (its one parameter is the input, as trajectories record it: ``arguments["input"]``).
``enable_response_messages`` (vLLM's extension) adds ``input_messages`` and
``output_messages``, the prompt's and the output's token ids.

Streaming sends ``response.created`` and ``response.in_progress`` once the prompt fits,
then, after generation, each item's events (``output_item.added``, its content part and
text, argument or input delta and done events, ``output_item.done``) and
``response.completed`` (``response.incomplete`` when the output hit its limit) with usage.
The deltas come whole, one per part: generation is not streamed token by token.

Nothing is stored: ``previous_response_id``, ``conversation`` and ``item_reference`` items
are refused (send the whole history, as Codex does with ``store: false``), as are
``background``, structured output (``text.format``), ``top_logprobs``, forced tool choice
and non-text input; each with a 400 naming the field.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from harness.codex_cli.config import chat_tools
from harness.exporters.hf_chat import chat_messages_with_sources
from records.trajectory import FunctionCall, Message, ToolCall
from relearn.serve.chat_request import (
    ChatRequest,
    RequestError,
    request_arguments,
    request_flag,
    request_number,
    sampling_of,
    template_kwargs_of,
    tool_choice,
)
from relearn.serve.engine import Generation

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "reasoning_text", "summary_text"})
OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
# Request fields a response repeats back (OpenAI's Response object carries them).
ECHOED = ("instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "max_output_tokens", "reasoning", "text")


@dataclass
class ResponsesRequest:
    chat: ChatRequest  # what the engine generates from
    stream: bool
    custom_tools: frozenset[str]  # names of the freeform tools: their calls are custom_tool_call items
    echo: dict[str, Any]  # request fields the response repeats
    token_messages: bool  # enable_response_messages: input_messages and output_messages with token ids


def parse_responses_request(body: Any, model_name: str) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("model") not in (None, model_name):
        raise RequestError(
            f"The model `{body['model']}` does not exist.", param="model", status=404, kind="NotFoundError", code="model_not_found"
        )
    for key, why in (
        ("previous_response_id", "this server stores no responses: send the whole conversation in input (store=false)"),
        ("conversation", "this server stores no conversations: send the whole conversation in input"),
        ("prompt", "this server has no stored prompt templates"),
    ):
        if body.get(key) is not None:
            raise RequestError(f"{key} is not supported: {why}", param=key)
    if request_flag(body, "background", False):
        raise RequestError("background=true is not supported: this server answers while the request waits", param="background")
    if request_number(body, "top_logprobs", low=0, integer=True):
        raise RequestError("top_logprobs is not supported on /v1/responses here (the chat route returns logprobs)", param="top_logprobs")
    text = body.get("text")
    if text is not None:
        form = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (form is not None and (not isinstance(form, dict) or form.get("type") != "text")):
            raise RequestError("text.format must be {type: text}: structured output needs guided decoding", param="text.format")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise RequestError("truncation must be disabled: this server does not cut the conversation to fit", param="truncation")
    tools, custom = _tools(body.get("tools"))
    choice = tool_choice(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string", param="instructions")
    messages = conversation(instructions, body.get("input"))
    if not messages:
        raise RequestError("input holds no message to answer", param="input")
    chat = ChatRequest(
        messages=chat_messages_with_sources(messages)[0],
        tools=tools,
        parse_tools=bool(tools) and choice != "none",
        template_kwargs=template_kwargs_of(body),
        max_tokens=request_number(body, "max_output_tokens", low=1, integer=True),
        sampling=sampling_of(body),
        seed=request_number(body, "seed", integer=True),
        stop=[],
        logprobs=False,
        top_logprobs=0,
        return_token_ids=False,
        skip_special_tokens=True,
    )
    echo = {key: body.get(key) for key in ECHOED}
    echo["tool_choice"] = choice or "auto"
    echo["parallel_tool_calls"] = body.get("parallel_tool_calls", True)
    echo["tools"] = body.get("tools") or []
    echo["metadata"] = body.get("metadata") or {}
    return ResponsesRequest(
        chat=chat,
        stream=request_flag(body, "stream", False),
        custom_tools=custom,
        echo=echo,
        token_messages=request_flag(body, "enable_response_messages", False),
    )


def _tools(tools: Any) -> tuple[list[dict[str, Any]] | None, frozenset[str]]:
    """Responses tools in the chat shape, and the names of the freeform ones."""
    if tools is None:
        return None, frozenset()
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of tool objects", param="tools")
    custom = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in ("function", "custom"):
            raise RequestError(f"{where}: type must be function or custom, not {kind!r} (no built-in tools here)", param=where)
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(f"{where} needs a name", param=f"{where}.name")
        if kind == "custom":
            custom.add(tool["name"])
    return chat_tools(tools) or None, frozenset(custom)


def _text(content: Any, where: str, *, output: bool = False) -> str:
    """A message's content (or a tool output): a string, or text parts joined by lines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            what = "tool outputs" if output else "messages"
            raise RequestError(f"{where}[{j}]: a {kind!r} part is not supported in {what} here (text only)", param=f"{where}[{j}]")
    return "\n".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


class _Conversation:
    """Messages built item by item; an assistant message per model call, split only where
    the chat order (reasoning, content, tool calls) could not hold the items."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.current: dict[str, Any] | None = None

    def assistant_for(self, part: str) -> dict[str, Any]:
        current = self.current
        if current is not None:
            if part == "tool_calls":
                return current
            if not current["tool_calls"] and current["content"] is None and (part == "content" or current["reasoning_content"] is None):
                return current
        self.end_call()
        self.current = {"content": None, "reasoning_content": None, "tool_calls": []}
        return self.current

    def end_call(self) -> None:
        if self.current is not None:
            current = self.current
            self.messages.append(
                Message(
                    role="assistant",
                    content=current["content"],
                    reasoning_content=current["reasoning_content"],
                    tool_calls=current["tool_calls"] or None,
                )
            )
        self.current = None

    def add(self, message: Message) -> None:
        self.end_call()
        self.messages.append(message)


def conversation(instructions: str | None, items: Any) -> list[Message]:
    """``instructions`` and ``input`` as the messages a trajectory would hold."""
    built = _Conversation()
    if instructions:
        built.add(Message(role="system", content=instructions))
    if isinstance(items, str):
        built.add(Message(role="user", content=items))
        return built.messages
    if not isinstance(items, list):
        raise RequestError("input must be a string or a list of items", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", param=where)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"{where}.role must be user, assistant, system or developer, not {role!r}", param=f"{where}.role")
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                built.assistant_for("content")["content"] = text
            else:
                built.add(Message(role=role, content=text))
        elif kind == "reasoning":
            # The full text where the item carries it, else its summary; an item with only
            # encrypted content has nothing this model can read.
            content = [p.get("text") for p in item.get("content") or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]
            summary = [p.get("text") for p in item.get("summary") or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]
            text = "\n\n".join(content or summary)
            if text:
                built.assistant_for("reasoning_content")["reasoning_content"] = text
        elif kind in CALL_ITEMS:
            call_id, name = _string(item, "call_id", where), _string(item, "name", where)
            if kind == "function_call":
                call = ToolCall(
                    id=call_id, function=FunctionCall(name=name, arguments=request_arguments(item.get("arguments"), f"{where}.arguments"))
                )
            else:
                text = item.get("input")
                if not isinstance(text, str):
                    raise RequestError(f"{where}.input must be a string", param=f"{where}.input")
                call = ToolCall(id=call_id, type="custom", function=FunctionCall(name=name, arguments={"input": text}))
            built.assistant_for("tool_calls")["tool_calls"].append(call)
        elif kind in OUTPUT_ITEMS:
            call_id = _string(item, "call_id", where)
            built.add(Message(role="tool", tool_call_id=call_id, content=_text(item.get("output"), f"{where}.output", output=True)))
        elif kind == "item_reference":
            raise RequestError(f"{where}: item_reference is not supported: this server stores no items", param=where)
        else:
            raise RequestError(
                f"{where}: items of type {kind!r} are not supported here (message, reasoning, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output)",
                param=f"{where}.type",
            )
    built.end_call()
    return built.messages


# ---- the answer ------------------------------------------------------------------------------


def new_response(request: ResponsesRequest, model_name: str) -> dict[str, Any]:
    """The response as it starts: in progress, with no output yet."""
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "model": model_name,
        "output": [],
        "previous_response_id": None,
        "store": False,
        "truncation": "disabled",
        "usage": None,
        **request.echo,
    }


def finish_response(
    request: ResponsesRequest, response: dict[str, Any], generation: Generation, decode: Any | None = None
) -> dict[str, Any]:
    """The response filled in from the generation; ``decode`` (token ids to text) is needed
    for ``enable_response_messages``."""
    parsed = generation.parsed
    output: list[dict[str, Any]] = []
    if parsed.reasoning_content is not None:
        output.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": parsed.reasoning_content}],
                "encrypted_content": None,
                "status": "completed",
            }
        )
    if parsed.content is not None:
        output.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": parsed.content, "annotations": [], "logprobs": []}],
            }
        )
    for call in parsed.tool_calls:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if name in request.custom_tools:
            output.append(
                {
                    "id": f"ctc_{uuid.uuid4().hex}",
                    "type": "custom_tool_call",
                    "call_id": call["id"],
                    "name": name,
                    "input": _custom_input(arguments),
                    "status": "completed",
                }
            )
        else:
            output.append(
                {
                    "id": f"fc_{uuid.uuid4().hex}",
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
    cut = generation.finish == "length"
    prompt, ids = generation.prompt, generation.ids
    done = {
        **response,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "usage": {
            "input_tokens": len(prompt),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(ids),
            "output_tokens_details": {"reasoning_tokens": generation.reasoning_tokens},
            "total_tokens": len(prompt) + len(ids),
        },
    }
    if request.token_messages:
        if decode is None:
            raise ValueError("enable_response_messages needs decode")
        done["input_messages"] = [{"type": "raw_message_tokens", "message": decode(prompt), "tokens": prompt}]
        done["output_messages"] = [{"type": "raw_message_tokens", "message": decode(ids), "tokens": ids}]
    return done


def _custom_input(arguments: str) -> str:
    """A freeform tool's input from the parsed call: its one parameter (``input``, as
    trajectories write it), else the arguments as JSON."""
    values = json.loads(arguments)
    if "input" in values and isinstance(values["input"], str):
        return values["input"]
    if len(values) == 1 and isinstance(next(iter(values.values())), str):
        return next(iter(values.values()))
    return arguments


def opening_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "response.created", "response": response}, {"type": "response.in_progress", "response": response}]


def output_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """Each output item's events, then the final one (``sequence_number`` is the writer's)."""
    events: list[dict[str, Any]] = []
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        kind = item["type"]
        if kind == "message":
            text = item["content"][0]["text"]
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": {**item["content"][0], "text": ""}},
                {"type": "response.output_text.delta", **at, "content_index": 0, "delta": text, "logprobs": []},
                {"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": item["content"][0]},
            ]
        elif kind == "reasoning":
            text = item["content"][0]["text"]
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": {"type": "reasoning_text", "text": ""}},
                {"type": "response.reasoning_text.delta", **at, "content_index": 0, "delta": text},
                {"type": "response.reasoning_text.done", **at, "content_index": 0, "text": text},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": item["content"][0]},
            ]
        elif kind == "function_call":
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
                {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **at, "name": item["name"], "arguments": item["arguments"]},
            ]
        else:  # custom_tool_call
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "input": ""}},
                {"type": "response.custom_tool_call_input.delta", **at, "delta": item["input"]},
                {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]},
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": response})
    return events


def failed_event(response: dict[str, Any], error: RequestError) -> dict[str, Any]:
    """What a stream ends with when generation fails after its first events went out."""
    body = error.responses_body()["error"]
    failed = {**response, "status": "failed", "error": {"code": body["code"] or "server_error", "message": body["message"]}}
    return {"type": "response.failed", "response": failed}
