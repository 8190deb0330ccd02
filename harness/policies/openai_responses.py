"""OpenAI Responses.

Round trip: ``store=False``, so the server keeps nothing between calls. Reasoning items
are kept in ``message.extra["responses_reasoning"]`` and sent back only when they carry
``encrypted_content``; without it the server would look up an id it never stored and
reject the request. Reasoning from elsewhere is not sent.

Token ids (``PolicySpec.request_token_ids``): vLLM answers ``enable_response_messages`` with the
engine's raw messages beside the parsed output, ``output_messages`` (what was generated, with its
token ids) and ``input_messages`` (the prompt as the engine was given it). The generated ids become
the message's ``token_ids`` and the prompt's its ``extra.prompt_token_ids``, as the chat protocol's
``return_token_ids`` does, for ``relearn masks`` to train on exactly what was sampled and seen.
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
        if self.spec.request_token_ids:
            extra.setdefault("enable_response_messages", True)
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
        prompt_ids = raw_message_token_ids(sdk_field(response, "input_messages"))
        if prompt_ids is not None:
            extra["prompt_token_ids"] = prompt_ids
        message = Message(
            role="assistant",
            generated=True,
            content="".join(texts) if texts else None,
            reasoning_content="\n\n".join(reasoning_parts) if reasoning_parts else None,
            tool_calls=calls or None,
            token_ids=raw_message_token_ids(sdk_field(response, "output_messages")),
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


def generated_token_ids(response: dict[str, Any]) -> list[int] | None:
    """vLLM's ``output_messages`` (asked for with ``enable_response_messages``): the ids of what
    the call generated."""
    return raw_message_token_ids(response.get("output_messages"))


def prompt_token_ids(response: dict[str, Any]) -> list[int] | None:
    """vLLM's ``input_messages`` (beside ``output_messages``): the prompt as the engine was
    given it, with its token ids: the context the call saw."""
    return raw_message_token_ids(response.get("input_messages"))


def raw_message_token_ids(messages: Any) -> list[int] | None:
    """The token ids of vLLM's raw messages (``{"type": "raw_message_tokens", "tokens": [...]}``)
    laid end to end; None where there are none."""
    if not isinstance(messages, list):
        return None
    ids: list[int] = []
    for message in messages:
        tokens = message.get("tokens") if isinstance(message, dict) else sdk_field(message, "tokens")
        if isinstance(tokens, list):
            ids.extend(int(t) for t in tokens)
    return ids or None


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
