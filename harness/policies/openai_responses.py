"""OpenAI Responses.

Round trip: ``store=False``, so the server keeps nothing between calls. Reasoning items
are kept in ``message.extra["responses_reasoning"]`` and sent back only when they carry
``encrypted_content``; without it the server would look up an id it never stored and
reject the request. Reasoning from elsewhere is not sent.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from harness.policies.base import (
    ContextOverflow,
    MalformedResponse,
    PolicyError,
    PolicySpec,
    SdkPolicy,
    call_usage,
    empty_schema,
    function_schema,
    is_context_overflow,
    sdk_field,
    split_sampling,
    system_text,
    tool_call,
)
from records.trajectory import FunctionCall, Message, ToolCall


class ResponsesPolicy(SdkPolicy):
    sdk = openai

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.client = openai.OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs, extra = split_sampling(self.client.responses.create, self.spec.sampling, rename={"max_tokens": "max_output_tokens"})
        request: dict[str, Any] = {"model": self.spec.model, "input": responses_input(messages), "store": False, **kwargs}
        instructions = system_text(messages)
        if instructions is not None:
            request["instructions"] = instructions
        if tools:
            request["tools"] = [responses_tool(t) for t in tools]
        if extra:
            request["extra_body"] = extra
        return request

    def _send(self, request: dict[str, Any]) -> Any:
        return self.client.responses.create(**request, timeout=self.spec.timeout_s)

    def _parse(self, response: Any, attempts: int) -> tuple[Message, str | None]:
        where = f"responses call to {self.spec.model!r}"
        if not isinstance(getattr(response, "output", None), list) or not getattr(response, "status", None):
            raise MalformedResponse("no status and output list in the answer")
        if response.status == "failed":
            error = response.error
            code = str(sdk_field(error, "code") or "")
            text = f"{code}: {sdk_field(error, 'message')}"
            if code == "context_length_exceeded" or is_context_overflow(text):
                raise ContextOverflow(f"{where}: the prompt exceeds the context window: {text}", attempts=attempts)
            raise PolicyError(f"{where} failed: {text}", attempts=attempts)
        texts: list[str] = []
        summaries: list[str] = []
        reasoning_texts: list[str] = []
        reasoning_items: list[dict[str, Any]] = []
        calls: list[ToolCall] = []
        for item in response.output or []:
            kind = item.type
            if kind == "message":
                for part in item.content or []:
                    if part.type == "output_text":
                        texts.append(part.text)
                    elif part.type == "refusal":
                        texts.append(part.refusal)
            elif kind == "reasoning":
                summaries += [s.text for s in item.summary or []]
                reasoning_texts += [c.text for c in sdk_field(item, "content") or []]
                reasoning_items.append(item.model_dump(mode="json", exclude_none=True))
            elif kind == "function_call":
                calls.append(tool_call(item.call_id, item.name, item.arguments, extra={"item_id": item.id} if item.id else None))
            elif kind == "custom_tool_call":
                calls.append(
                    ToolCall(id=item.call_id, type="custom", function=FunctionCall(name=item.name, arguments={"input": item.input}))
                )
        # Full reasoning text (open models on vLLM) when there is any, else OpenAI's summaries.
        reasoning_parts = reasoning_texts or summaries
        usage = None
        if response.usage is not None:
            u = response.usage
            usage = call_usage(
                u.input_tokens,
                u.output_tokens,
                cached=sdk_field(sdk_field(u, "input_tokens_details"), "cached_tokens"),
                reasoning=sdk_field(sdk_field(u, "output_tokens_details"), "reasoning_tokens"),
            )
        extra: dict[str, Any] = {"response_id": response.id, "model": response.model}
        if reasoning_items:
            extra["responses_reasoning"] = reasoning_items
        message = Message(
            role="assistant",
            generated=True,
            content="".join(texts) if texts else None,
            reasoning_content="\n\n".join(reasoning_parts) if reasoning_parts else None,
            tool_calls=calls or None,
            usage=usage,
            extra=extra,
        )
        if response.status == "incomplete":
            reason = sdk_field(response.incomplete_details, "reason")
            finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(reason, reason or "incomplete")
        elif response.status == "completed":
            finish = "tool_calls" if calls else "stop"
        else:
            finish = response.status
        return message, finish


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = function_schema(tool)
    if function is None:
        return tool  # already a Responses tool (or a built-in one)
    out: dict[str, Any] = {
        "type": "function",
        "name": function["name"],
        "parameters": function.get("parameters") or empty_schema(),
        # Responses makes function tools strict by default, which rejects any schema with
        # optional properties; chat schemas are written for non-strict use.
        "strict": function.get("strict", False),
    }
    if function.get("description"):
        out["description"] = function["description"]
    return out


def responses_input(messages: list[Message]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("system", "developer"):
            continue  # sent as instructions
        if m.role == "user":
            items.append({"type": "message", "role": "user", "content": m.content or ""})
        elif m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content or ""})
        else:
            for reasoning in (m.extra or {}).get("responses_reasoning") or []:
                if reasoning.get("encrypted_content"):
                    items.append({k: reasoning[k] for k in ("type", "id", "summary", "encrypted_content") if k in reasoning})
            if m.content:
                items.append({"type": "message", "role": "assistant", "content": m.content})
            for c in m.tool_calls or []:
                # No item id: with store=False the server could not resolve it.
                items.append(
                    {"type": "function_call", "call_id": c.id, "name": c.function.name, "arguments": json.dumps(c.function.arguments)}
                )
    return items
