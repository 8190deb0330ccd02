"""What every policy client shares: the spec, the turn it returns, its errors, and the
request/response cycle with retries.

Retries are ours, not the SDKs' (their ``max_retries`` is 0): the attempt count is
recorded on every turn, and the backoff is one policy for all three protocols.

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

from records.trajectory import FunctionCall, Message, ToolCall, Usage

Kind = Literal["chat", "responses", "anthropic"]
KINDS: tuple[str, ...] = ("chat", "responses", "anthropic")

# Request fields the client owns; a sampling dict that set them would silently change the
# protocol (stream=True), the conversation, or the retry behaviour (timeout).
RESERVED_SAMPLING = frozenset(
    {"model", "messages", "input", "instructions", "system", "tools", "stream", "store", "timeout", "extra_headers", "extra_query"}
)

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
    # vLLM's token ids, for training on exactly what was sampled and seen: chat asks with
    # return_token_ids and logprobs, responses with enable_response_messages. Strict servers
    # (api.openai.com) reject both: set False there. Anthropic has none to ask for.
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


class MalformedResponse(Exception):
    """A 200 whose body is no answer of the protocol: an HTML page from a proxy, a body cut
    short, an empty one, JSON of another shape. Retried like a 5xx."""


class Policy(Protocol):
    spec: PolicySpec

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn: ...


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Failure:
    reason: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None
    overflow: bool = False


class SdkPolicy:
    """The request/response cycle common to the three protocols; subclasses convert."""

    # The SDK module whose exception classes this client raises.
    sdk: Any = None

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        request = self._request(messages, tools)
        started = time.monotonic()
        (message, finish_reason), attempts = self._send_with_retries(request)
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

    def _send_with_retries(self, request: dict[str, Any]) -> tuple[tuple[Message, str | None], int]:
        """Send and parse, retrying what a retry can fix; the parsed answer and the attempts."""
        spec = self.spec
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._parse(self._check_shape(self._send(request)), attempt), attempt
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

    def _check_shape(self, response: Any) -> Any:
        """The SDKs hand back a non-JSON body as a string and JSON of another shape as a
        hollow model object; both are no answer."""
        if isinstance(response, str | bytes) or response is None:
            raise MalformedResponse(f"the body is not a JSON object: {_short(str(response), 200)!r}")
        return response

    def _classify(self, exc: Exception) -> _Failure | None:
        sdk = self.sdk
        if isinstance(exc, MalformedResponse | ValueError) and not isinstance(exc, sdk.APIError):
            # ValueError: the SDK's json.loads of a truncated or empty body.
            return _Failure(f"malformed response: {_short(str(exc), 300)}", retryable=True)
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


def split_sampling(
    create: Callable[..., Any], sampling: dict[str, Any], rename: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
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


def function_schema(tool: dict[str, Any]) -> dict[str, Any] | None:
    """The function part of an OpenAI chat tool schema, or None for other tool kinds."""
    if tool.get("type", "function") == "function" and isinstance(tool.get("function"), dict):
        return tool["function"]
    return None


def empty_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


def system_text(messages: list[Message]) -> str | None:
    parts = [m.content for m in messages if m.role in ("system", "developer") and m.content]
    return "\n\n".join(parts) if parts else None


def call_usage(input_tokens: int | None, output_tokens: int | None, cached: int | None = None, reasoning: int | None = None) -> Usage:
    total = (input_tokens or 0) + (output_tokens or 0) if input_tokens is not None or output_tokens is not None else None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached,
        reasoning_output_tokens=reasoning,
        total_tokens=total,
        api_calls=1,
    )


def sdk_field(obj: Any, name: str) -> Any:
    """A field of an SDK object, including ones the SDK does not model (vLLM's extras)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        value = (getattr(obj, "model_extra", None) or {}).get(name)
    return value
