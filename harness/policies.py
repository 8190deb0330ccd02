"""Policy clients: how the agent loop asks a model for its next message.

Three wire protocols, one interface: OpenAI-compatible Chat Completions (vLLM, SGLang),
OpenAI Responses, Anthropic Messages. Each client turns our ``Message`` records into a
request, sends it through the vendor SDK (the path production uses), and turns the
answer back into one generated assistant ``Message``.

Retries are ours, not the SDKs' (their ``max_retries`` is 0): the attempt count is
recorded on every turn, and the backoff is one policy for all three protocols.

What survives a round trip (a generated message sent back as history):

- chat: ``reasoning_content`` is sent back as a field of the assistant message; vLLM
  hands it to the chat template (Qwen-style templates read it).
- responses: ``store=False``, so the server keeps nothing between calls. Reasoning items
  are kept in ``message.extra["responses_reasoning"]`` and sent back only when they carry
  ``encrypted_content``; without it the server would look up an id it never stored and
  reject the request. Reasoning from elsewhere is not sent.
- anthropic: thinking blocks are kept verbatim (with their signatures) in
  ``message.extra["anthropic_thinking"]`` and sent back first in the assistant turn, as
  the API requires for tool use with thinking. ``reasoning_content`` from another source
  has no signature, the API would reject it as a thinking block, and passing it as text
  would put words in the model's mouth, so it is not sent at all.

Tool calls are always sent back as function calls with ``json.dumps(arguments)``: a call
whose text was not a JSON object (``raw_arguments`` set) goes back as ``{}``, because
vLLM parses the arguments of history tool calls and would fail the whole request.
"""

from __future__ import annotations

import email.utils
import inspect
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import anthropic
import openai

from harness.trajectory import FunctionCall, Message, ToolCall, Usage

Kind = Literal["chat", "responses", "anthropic"]
KINDS: tuple[str, ...] = ("chat", "responses", "anthropic")

# Request fields the client owns; a sampling dict that set them would silently change the
# protocol (stream=True), the conversation, or the retry behaviour (timeout).
RESERVED_SAMPLING = frozenset(
    {"model", "messages", "input", "instructions", "system", "tools", "stream", "store", "timeout", "extra_headers", "extra_query"}
)

# Anthropic requires max_tokens; the others leave the limit to the server.
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096

# Lower-cased fragments of the errors servers give for a prompt over the context window:
# OpenAI's error code, vLLM (v0 and v1), SGLang, OpenAI Responses, Anthropic.
CONTEXT_OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "longer than the maximum model length",
    "longer than the model's context length",
    "exceeds the context window",
    "prompt is too long",
)


@dataclass
class PolicySpec:
    kind: Kind
    model: str
    base_url: str | None = None
    # None: the kind's usual variable (OPENAI_API_KEY, or ANTHROPIC_API_KEY for anthropic),
    # so an OpenAI key is never sent to another vendor by default. A missing key becomes
    # "EMPTY", which local servers accept.
    api_key_env: str | None = None
    # Passed through: known SDK arguments by name, anything else (top_k, min_p,
    # repetition_penalty, ...) in the request body via extra_body (an "extra_body" dict
    # here is merged in too). For responses, max_tokens is renamed max_output_tokens.
    sampling: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0
    # Retried: 408, 429, 5xx, timeouts, connection errors. Delay: Retry-After when the
    # server sends one, else base * 2**(attempt-1) scaled by a random 0.5-1.0, both
    # capped at backoff_cap_s.
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    price_in_per_mtok: float = 0.0
    price_out_per_mtok: float = 0.0
    # Cached prompt tokens are billed at a discount by every hosted vendor; None bills
    # them at the full input price. Anthropic cache writes are billed at the input price
    # (the API charges them 1.25x): a small underestimate, not worth a fourth price.
    price_cached_in_per_mtok: float | None = None
    # chat only: vLLM's return_token_ids and logprobs, for training on exactly what was
    # sampled. Strict servers (api.openai.com) reject return_token_ids: set False there.
    request_token_ids: bool = True
    checkpoint: str | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"PolicySpec.kind must be one of {KINDS}, not {self.kind!r}")
        reserved = sorted(RESERVED_SAMPLING & set(self.sampling))
        if reserved:
            raise ValueError(f"PolicySpec.sampling may not set {reserved}: the policy client sets them")
        if self.max_retries < 0:
            raise ValueError("PolicySpec.max_retries must be >= 0")

    @property
    def key_env(self) -> str:
        if self.api_key_env:
            return self.api_key_env
        return "ANTHROPIC_API_KEY" if self.kind == "anthropic" else "OPENAI_API_KEY"

    def api_key(self) -> str:
        return os.environ.get(self.key_env) or "EMPTY"

    def cost_usd(self, usage: Usage) -> float:
        cached = usage.cached_input_tokens or 0
        fresh = max((usage.input_tokens or 0) - cached, 0)
        cached_price = self.price_in_per_mtok if self.price_cached_in_per_mtok is None else self.price_cached_in_per_mtok
        total = fresh * self.price_in_per_mtok + cached * cached_price + (usage.output_tokens or 0) * self.price_out_per_mtok
        return total / 1_000_000


@dataclass
class PolicyTurn:
    message: Message
    # "stop", "tool_calls", "length", "content_filter", or the server's own value. Decide
    # on message.tool_calls, not on this: some servers say "stop" next to tool calls.
    finish_reason: str | None
    attempts: int


class PolicyError(Exception):
    """A model call failed: after its retries, or at once for an error retrying cannot fix."""

    def __init__(self, message: str, *, attempts: int = 0, status: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status = status


class ContextOverflow(PolicyError):
    """The server said the prompt does not fit the model's context window."""


class Policy(Protocol):
    spec: PolicySpec

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn: ...


def make_policy(spec: PolicySpec) -> Policy:
    policies: dict[str, type[_SdkPolicy]] = {"chat": ChatPolicy, "responses": ResponsesPolicy, "anthropic": AnthropicPolicy}
    return policies[spec.kind](spec)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Failure:
    reason: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None
    overflow: bool = False


class _SdkPolicy:
    """The request/response cycle common to the three protocols; subclasses convert."""

    # The SDK module whose exception classes this client raises.
    sdk: Any = None

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        request = self._request(messages, tools)
        started = time.monotonic()
        response, attempts = self._send_with_retries(request)
        message, finish_reason = self._parse(response, attempts)
        message.duration_ms = round((time.monotonic() - started) * 1000, 3)
        message.timestamp = now_iso()
        if message.usage is not None:
            message.usage.cost_usd = self.spec.cost_usd(message.usage)
        return PolicyTurn(message=message, finish_reason=finish_reason, attempts=attempts)

    # Per protocol.
    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError

    def _send(self, request: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _parse(self, response: Any, attempts: int) -> tuple[Message, str | None]:
        raise NotImplementedError

    def _send_with_retries(self, request: dict[str, Any]) -> tuple[Any, int]:
        spec = self.spec
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._send(request), attempt
            except Exception as exc:
                failure = self._classify(exc)
                if failure is None:
                    raise  # not an API failure: a bug, which retrying would hide
                where = f"{spec.kind} call to {spec.model!r}"
                if failure.overflow:
                    raise ContextOverflow(
                        f"{where}: the prompt exceeds the context window: {failure.reason}", attempts=attempt, status=failure.status
                    ) from exc
                if not failure.retryable:
                    hint = f" ({spec.key_env} is not set)" if failure.status == 401 and not os.environ.get(spec.key_env) else ""
                    raise PolicyError(
                        f"{where} failed with a non-retryable error{hint}: {failure.reason}", attempts=attempt, status=failure.status
                    ) from exc
                if attempt > spec.max_retries:
                    raise PolicyError(
                        f"{where} failed after {attempt} attempts: {failure.reason}", attempts=attempt, status=failure.status
                    ) from exc
                time.sleep(self._delay(attempt, failure.retry_after_s))

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        spec = self.spec
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), spec.backoff_cap_s)
        # Jitter keeps parallel episodes that failed together from retrying together.
        return min(spec.backoff_cap_s, spec.backoff_base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    def _classify(self, exc: Exception) -> _Failure | None:
        sdk = self.sdk
        if isinstance(exc, sdk.APITimeoutError):
            return _Failure(f"timed out after {self.spec.timeout_s:g} s", retryable=True)
        if isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            return _Failure(f"connection error: {cause or exc}", retryable=True)
        if isinstance(exc, sdk.APIStatusError):
            status = exc.status_code
            full = str(exc)
            text = _short(full)
            code = str(getattr(exc, "code", None) or "")
            if status < 500 and (code == "context_length_exceeded" or is_context_overflow(full)):
                return _Failure(text, retryable=False, status=status, overflow=True)
            retryable = status in (408, 429) or status >= 500
            return _Failure(f"HTTP {status}: {text}", retryable=retryable, status=status, retry_after_s=_retry_after(exc.response))
        if isinstance(exc, sdk.APIError):  # e.g. a response that does not parse
            return _Failure(_short(str(exc)), retryable=False)
        return None


def is_context_overflow(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in CONTEXT_OVERFLOW_MARKERS)


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return (when - datetime.now(UTC)).total_seconds() if when.tzinfo else None


def _split_sampling(create: Callable[..., Any], sampling: dict[str, Any], rename: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keyword arguments the SDK method takes, the rest for extra_body).

    SDKs drop and add parameters between versions (anthropic 2.x takes no temperature
    argument, though the API does); asking the signature keeps every value on the wire.
    """
    params = inspect.signature(create).parameters
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = dict(sampling.get("extra_body") or {})
    for key, value in sampling.items():
        if key == "extra_body":
            continue
        key = (rename or {}).get(key, key)
        if key in params:
            kwargs[key] = value
        else:
            extra[key] = value
    return kwargs, extra


def tool_call(call_id: str, name: str, raw: Any, extra: dict[str, Any] | None = None) -> ToolCall:
    """A tool call with its arguments as an object; text that is not a JSON object is
    kept verbatim in raw_arguments (the toolbox reports it to the model as a format error)."""
    if isinstance(raw, dict):
        return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=raw), extra=extra)
    text = raw if isinstance(raw, str) else json.dumps(raw)
    if not text.strip():  # some servers send "" for a call without arguments
        return ToolCall(id=call_id, function=FunctionCall(name=name, arguments={}), extra=extra)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=parsed), extra=extra)
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments={}), raw_arguments=text, extra=extra)


def _function(tool: dict[str, Any]) -> dict[str, Any] | None:
    """The function part of an OpenAI chat tool schema, or None for other tool kinds."""
    if tool.get("type", "function") == "function" and isinstance(tool.get("function"), dict):
        return tool["function"]
    return None


def _empty_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


def _system_text(messages: list[Message]) -> str | None:
    parts = [m.content for m in messages if m.role in ("system", "developer") and m.content]
    return "\n\n".join(parts) if parts else None


def _usage(input_tokens: int | None, output_tokens: int | None, cached: int | None = None, reasoning: int | None = None) -> Usage:
    total = (input_tokens or 0) + (output_tokens or 0) if input_tokens is not None or output_tokens is not None else None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached,
        reasoning_output_tokens=reasoning,
        total_tokens=total,
        api_calls=1,
    )


def _field(obj: Any, name: str) -> Any:
    """A field of an SDK object, including ones the SDK does not model (vLLM's extras)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        value = (getattr(obj, "model_extra", None) or {}).get(name)
    return value


# --- Chat Completions ---------------------------------------------------------------


class ChatPolicy(_SdkPolicy):
    sdk = openai

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.client = openai.OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs, extra = _split_sampling(self.client.chat.completions.create, self.spec.sampling)
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
        if not response.choices:
            raise PolicyError(f"chat call to {self.spec.model!r} returned no choices", attempts=attempts)
        choice = response.choices[0]
        reply = choice.message
        reasoning = _field(reply, "reasoning_content")
        if reasoning is None:
            reasoning = _field(reply, "reasoning")  # vLLM >= 0.11 and SGLang name it so
        calls = []
        for call in reply.tool_calls or []:
            function = _field(call, "function")
            if function is None:  # a custom (freeform) tool call: not offered by our tools
                custom = _field(call, "custom")
                calls.append(ToolCall(id=call.id, type="custom", function=FunctionCall(name=custom.name, arguments={"input": custom.input})))
                continue
            calls.append(tool_call(call.id, function.name, function.arguments))
        logprobs = None
        content_logprobs = _field(choice.logprobs, "content")
        if content_logprobs is not None:
            logprobs = [float(_field(item, "logprob")) for item in content_logprobs]
        token_ids = _field(choice, "token_ids")
        usage = None
        if response.usage is not None:
            u = response.usage
            usage = _usage(
                u.prompt_tokens,
                u.completion_tokens,
                cached=_field(_field(u, "prompt_tokens_details"), "cached_tokens"),
                reasoning=_field(_field(u, "completion_tokens_details"), "reasoning_tokens"),
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
            extra={"response_id": response.id, "model": response.model},
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


# --- Responses ----------------------------------------------------------------------


class ResponsesPolicy(_SdkPolicy):
    sdk = openai

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.client = openai.OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs, extra = _split_sampling(self.client.responses.create, self.spec.sampling, rename={"max_tokens": "max_output_tokens"})
        request: dict[str, Any] = {"model": self.spec.model, "input": responses_input(messages), "store": False, **kwargs}
        instructions = _system_text(messages)
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
        if response.status == "failed":
            error = response.error
            code = str(_field(error, "code") or "")
            text = f"{code}: {_field(error, 'message')}"
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
                reasoning_texts += [c.text for c in _field(item, "content") or []]
                reasoning_items.append(item.model_dump(mode="json", exclude_none=True))
            elif kind == "function_call":
                calls.append(tool_call(item.call_id, item.name, item.arguments, extra={"item_id": item.id} if item.id else None))
            elif kind == "custom_tool_call":
                calls.append(ToolCall(id=item.call_id, type="custom", function=FunctionCall(name=item.name, arguments={"input": item.input})))
        # Full reasoning text (open models on vLLM) when there is any, else OpenAI's summaries.
        reasoning_parts = reasoning_texts or summaries
        usage = None
        if response.usage is not None:
            u = response.usage
            usage = _usage(
                u.input_tokens,
                u.output_tokens,
                cached=_field(_field(u, "input_tokens_details"), "cached_tokens"),
                reasoning=_field(_field(u, "output_tokens_details"), "reasoning_tokens"),
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
            reason = _field(response.incomplete_details, "reason")
            finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(reason, reason or "incomplete")
        elif response.status == "completed":
            finish = "tool_calls" if calls else "stop"
        else:
            finish = response.status
        return message, finish


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = _function(tool)
    if function is None:
        return tool  # already a Responses tool (or a built-in one)
    out: dict[str, Any] = {
        "type": "function",
        "name": function["name"],
        "parameters": function.get("parameters") or _empty_schema(),
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
                items.append({"type": "function_call", "call_id": c.id, "name": c.function.name, "arguments": json.dumps(c.function.arguments)})
    return items


# --- Anthropic Messages -------------------------------------------------------------


class AnthropicPolicy(_SdkPolicy):
    sdk = anthropic

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.client = anthropic.Anthropic(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s, max_retries=0)

    def _request(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        sampling = dict(self.spec.sampling)
        max_tokens = sampling.pop("max_tokens", ANTHROPIC_DEFAULT_MAX_TOKENS)
        kwargs, extra = _split_sampling(self.client.messages.create, sampling)
        request: dict[str, Any] = {"model": self.spec.model, "max_tokens": max_tokens, "messages": anthropic_messages(messages), **kwargs}
        system = _system_text(messages)
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
            cache_read = _field(u, "cache_read_input_tokens")
            cache_write = _field(u, "cache_creation_input_tokens")
            # Anthropic's input_tokens leaves out cached and cache-written tokens; ours is
            # the whole prompt, as for the OpenAI protocols, so budgets compare.
            input_tokens = (u.input_tokens or 0) + (cache_read or 0) + (cache_write or 0)
            usage = _usage(input_tokens, u.output_tokens, cached=cache_read)
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
    function = _function(tool)
    if function is None:
        return tool  # already an Anthropic tool (or a server tool)
    out: dict[str, Any] = {"name": function["name"], "input_schema": function.get("parameters") or _empty_schema()}
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
