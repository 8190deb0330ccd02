"""Anthropic Messages.

Round trip: thinking blocks are kept verbatim (with their signatures) in
``message.extra["anthropic_thinking"]`` and sent back first in the assistant turn, as
the API requires for tool use with thinking. ``reasoning_content`` from another source
has no signature, the API would reject it as a thinking block, and passing it as text
would put words in the model's mouth, so it is not sent at all.
"""

from __future__ import annotations

from typing import Any

import anthropic

from harness.policies.base import (
    MalformedResponse,
    PolicySpec,
    SdkPolicy,
    call_usage,
    empty_schema,
    function_schema,
    sdk_field,
    split_sampling,
    system_text,
    tool_call,
)
from records.trajectory import Message, ToolCall

# Anthropic requires max_tokens; the others leave the limit to the server.
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096


class AnthropicPolicy(SdkPolicy):
    sdk = anthropic

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.client = anthropic.Anthropic(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        sampling = dict(self.spec.sampling)
        max_tokens = sampling.pop("max_tokens", ANTHROPIC_DEFAULT_MAX_TOKENS)
        kwargs, extra = split_sampling(self.client.messages.create, sampling)
        request: dict[str, Any] = {"model": self.spec.model, "max_tokens": max_tokens, "messages": anthropic_messages(messages), **kwargs}
        system = system_text(messages)
        if system is not None:
            request["system"] = system
        if tools:
            request["tools"] = [anthropic_tool(t) for t in tools]
        if extra:
            request["extra_body"] = extra
        return request

    def _send(self, request: dict[str, Any]) -> Any:
        # An explicit timeout also stops the SDK from refusing large max_tokens without streaming.
        return self.client.messages.create(**request, timeout=self.spec.timeout_s)

    def _parse(self, response: Any, attempts: int) -> tuple[Message, str | None]:
        if not isinstance(getattr(response, "content", None), list) or getattr(response, "type", None) != "message":
            raise MalformedResponse("no message content in the answer")
        texts: list[str] = []
        thinking: list[str] = []
        blocks: list[dict[str, Any]] = []
        calls: list[ToolCall] = []
        for block in response.content or []:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "thinking":
                thinking.append(block.thinking)
                blocks.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
            elif block.type == "redacted_thinking":
                blocks.append({"type": "redacted_thinking", "data": block.data})
            elif block.type == "tool_use":
                calls.append(tool_call(block.id, block.name, block.input))
        u = response.usage
        usage = None
        if u is not None:
            cache_read = sdk_field(u, "cache_read_input_tokens")
            cache_write = sdk_field(u, "cache_creation_input_tokens")
            # Anthropic's input_tokens leaves out cached and cache-written tokens; ours is
            # the whole prompt, as for the OpenAI protocols, so budgets compare.
            input_tokens = (u.input_tokens or 0) + (cache_read or 0) + (cache_write or 0)
            usage = call_usage(input_tokens, u.output_tokens, cached=cache_read)
        extra: dict[str, Any] = {"response_id": response.id, "model": response.model}
        if blocks:
            extra["anthropic_thinking"] = blocks
        message = Message(
            role="assistant",
            generated=True,
            content="".join(texts) if texts else None,
            reasoning_content="\n\n".join(thinking) if thinking else None,
            tool_calls=calls or None,
            usage=usage,
            extra=extra,
        )
        stop = response.stop_reason
        finish = {
            "end_turn": "stop",
            "stop_sequence": "stop",
            "tool_use": "tool_calls",
            "max_tokens": "length",
            "model_context_window_exceeded": "length",
            "refusal": "content_filter",
        }.get(stop, stop)
        return message, finish


def anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = function_schema(tool)
    if function is None:
        return tool  # already an Anthropic tool (or a server tool)
    out: dict[str, Any] = {"name": function["name"], "input_schema": function.get("parameters") or empty_schema()}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def anthropic_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """User and tool messages become user turns, assistant messages assistant turns;
    consecutive turns of one role are merged, which puts all the results of one batch of
    tool calls into the single user message the API requires right after them."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return  # an empty turn carries nothing, and the API rejects empty content
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role in ("system", "developer"):
            continue  # sent as the system parameter
        if m.role == "user":
            add("user", [{"type": "text", "text": m.content}] if m.content else [])
        elif m.role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content or ""}])
        else:
            blocks: list[dict[str, Any]] = [dict(b) for b in (m.extra or {}).get("anthropic_thinking") or []]
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            for c in m.tool_calls or []:
                blocks.append({"type": "tool_use", "id": c.id, "name": c.function.name, "input": c.function.arguments})
            add("assistant", blocks)
    return out
