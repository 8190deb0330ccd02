"""OpenAI-compatible Chat Completions (vLLM, SGLang, api.openai.com).

Round trip: ``reasoning_content`` is sent back as a field of the assistant message; vLLM
hands it to the chat template (Qwen-style templates read it).
"""

from __future__ import annotations

import json
from typing import Any

import openai

from harness.policies.base import MalformedResponse, PolicySpec, SdkPolicy, call_usage, sdk_field, split_sampling, tool_call
from records.trajectory import FunctionCall, Message, ToolCall


class ChatPolicy(SdkPolicy):
    sdk = openai

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.client = openai.OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs, extra = split_sampling(self.client.chat.completions.create, self.spec.sampling)
        if self.spec.request_token_ids:
            kwargs.setdefault("logprobs", True)
            extra.setdefault("return_token_ids", True)
        request: dict[str, Any] = {"model": self.spec.model, "messages": chat_messages(messages), **kwargs}
        if tools:  # OpenAI rejects an empty tools array
            request["tools"] = tools
        if extra:
            request["extra_body"] = extra
        return request

    def _send(self, request: dict[str, Any]) -> Any:
        return self.client.chat.completions.create(**request, timeout=self.spec.timeout_s)

    def _parse(self, response: Any, attempts: int) -> tuple[Message, str | None]:
        if not isinstance(getattr(response, "choices", None), list) or not response.choices:
            raise MalformedResponse("no choices in the answer")
        choice = response.choices[0]
        reply = choice.message
        reasoning = sdk_field(reply, "reasoning_content")
        if reasoning is None:
            reasoning = sdk_field(reply, "reasoning")  # vLLM >= 0.11 and SGLang name it so
        calls = []
        for call in reply.tool_calls or []:
            function = sdk_field(call, "function")
            if function is None:  # a custom (freeform) tool call: not offered by our tools
                custom = sdk_field(call, "custom")
                calls.append(
                    ToolCall(id=call.id, type="custom", function=FunctionCall(name=custom.name, arguments={"input": custom.input}))
                )
                continue
            calls.append(tool_call(call.id, function.name, function.arguments))
        logprobs = None
        content_logprobs = sdk_field(choice.logprobs, "content")
        if content_logprobs is not None:
            logprobs = [float(sdk_field(item, "logprob")) for item in content_logprobs]
        token_ids = sdk_field(choice, "token_ids")
        # vLLM (return_token_ids) and `relearn serve` put the prompt's ids on the response: the
        # context exactly as the model was given it, for `relearn stats --context` to check.
        prompt_ids = sdk_field(response, "prompt_token_ids")
        usage = None
        if response.usage is not None:
            u = response.usage
            usage = call_usage(
                u.prompt_tokens,
                u.completion_tokens,
                cached=sdk_field(sdk_field(u, "prompt_tokens_details"), "cached_tokens"),
                reasoning=sdk_field(sdk_field(u, "completion_tokens_details"), "reasoning_tokens"),
            )
        message = Message(
            role="assistant",
            generated=True,
            content=reply.content,
            reasoning_content=reasoning,
            tool_calls=calls or None,
            token_ids=list(token_ids) if token_ids is not None else None,
            logprobs=logprobs,
            usage=usage,
            extra={"response_id": response.id, "model": response.model}
            | ({"prompt_token_ids": list(prompt_ids)} if prompt_ids is not None else {}),
        )
        finish = choice.finish_reason
        return message, "tool_calls" if finish == "function_call" else finish


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("system", "developer"):
            # Many vLLM chat templates know no "developer" role.
            out.append({"role": "system", "content": m.content or ""})
        elif m.role == "user":
            out.append({"role": "user", "content": m.content or ""})
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""})
        else:
            item: dict[str, Any] = {"role": "assistant", "content": m.content or ""}
            if m.reasoning_content is not None:
                item["reasoning_content"] = m.reasoning_content
            if m.tool_calls:
                item["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": json.dumps(c.function.arguments)}}
                    for c in m.tool_calls
                ]
            out.append(item)
    return out
