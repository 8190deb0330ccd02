"""A Chat Completions request, validated; what the server refuses is a ``RequestError`` naming
the field, in an OpenAI-style error body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# vLLM's cap on top_logprobs (and OpenAI's).
MAX_TOP_LOGPROBS = 20
# Template arguments the server sets itself; chat_template_kwargs may not replace them.
OWN_TEMPLATE_ARGS = frozenset({"conversation", "messages", "tools", "tokenize", "add_generation_prompt", "return_dict"})


class RequestError(Exception):
    """A request the server refuses, with the HTTP status and an OpenAI-style error body."""

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, kind: str = "BadRequestError", code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind
        self.code = code  # OpenAI's error code where one fits (context_length_exceeded)

    def body(self) -> dict[str, Any]:
        """vLLM's error body on its chat route: the exception's class name and the HTTP status."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}

    def responses_body(self) -> dict[str, Any]:
        """OpenAI's error body, as Responses clients read it (the Codex CLI matches on ``code``)."""
        kind = {400: "invalid_request_error", 404: "invalid_request_error"}.get(self.status, "server_error")
        code = self.code or {404: "not_found"}.get(self.status)
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": code}}


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    template_kwargs: dict[str, Any]
    max_tokens: int | None
    sampling: dict[str, Any]  # temperature, top_p, top_k, min_p, repetition_penalty: only those given
    seed: int | None
    stop: list[str]
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    skip_special_tokens: bool


def request_number(body: dict[str, Any], key: str, *, low: float | None = None, high: float | None = None, integer: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(f"{key} must be {'an integer' if integer else 'a number'}, not {value!r}", param=key)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low:g}" if high is None else f"between {low:g} and {high:g}"
        raise RequestError(f"{key} must be {bounds}, not {value!r}", param=key)
    return value


def request_flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, not {value!r}", param=key)
    return value


def _template_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages as the chat template wants them (arguments as mappings)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"{where} must be an object with a string role", param=where)
        message = dict(message)
        if message.get("reasoning_content") is None and isinstance(message.get("reasoning"), str):
            message["reasoning_content"] = message["reasoning"]  # vLLM >= 0.11 names it so
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            message["tool_calls"] = [_template_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
        out.append(message)
    return out


def _template_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"{where} must have a function with a string name", param=f"{where}.function")
    return {**call, "function": {**function, "arguments": request_arguments(function.get("arguments"), f"{where}.function.arguments")}}


def request_arguments(raw: Any, where: str) -> dict[str, Any]:
    """A call's arguments as a request gives them (a JSON object, or its text; none is {})."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise RequestError(f"{where} is not valid JSON: {e}", param=where) from None
    if not isinstance(raw, dict):
        raise RequestError(f"{where} must be a JSON object", param=where)
    return raw


def parse_request(body: Any, model_name: str) -> ChatRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("model") not in (None, model_name):
        raise RequestError(f"The model `{body['model']}` does not exist.", param="model", status=404, kind="NotFoundError")
    if body.get("stream"):
        raise RequestError("stream=true is not supported by this server: send stream=false (or leave it out)", param="stream")
    if request_number(body, "n", low=1, integer=True) not in (None, 1):
        raise RequestError("n > 1 is not supported by this server (one completion per request)", param="n")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of tool objects", param="tools")
    choice = tool_choice(body)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them", param="stop")
    top_logprobs = request_number(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS, integer=True)
    logprobs = request_flag(body, "logprobs", False)
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    max_tokens = request_number(body, "max_completion_tokens", low=1, integer=True) or request_number(
        body, "max_tokens", low=1, integer=True
    )
    return ChatRequest(
        messages=_template_messages(body.get("messages")),
        tools=tools or None,
        parse_tools=bool(tools) and choice != "none",
        template_kwargs=template_kwargs_of(body),
        max_tokens=max_tokens,
        sampling=sampling_of(body),
        seed=request_number(body, "seed", integer=True),
        stop=stops,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        return_token_ids=request_flag(body, "return_token_ids", False),
        skip_special_tokens=request_flag(body, "skip_special_tokens", True),
    )


def tool_choice(body: dict[str, Any]) -> Any:
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError("tool_choice must be auto or none here (forcing a call needs guided decoding)", param="tool_choice")
    return choice


def template_kwargs_of(body: dict[str, Any]) -> dict[str, Any]:
    """``chat_template_kwargs`` (vLLM's extension), checked."""
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict) or OWN_TEMPLATE_ARGS & set(template_kwargs):
        raise RequestError(f"chat_template_kwargs must be an object without {sorted(OWN_TEMPLATE_ARGS)}", param="chat_template_kwargs")
    return template_kwargs


def sampling_of(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields given (OpenAI's and vLLM's extensions), checked; the penalties this
    server lacks refused."""
    for key in ("frequency_penalty", "presence_penalty"):
        if request_number(body, key) not in (None, 0):
            raise RequestError(f"{key} is not supported by this server (use repetition_penalty)", param=key)
    sampling = {
        "temperature": request_number(body, "temperature", low=0, high=2),
        "top_p": request_number(body, "top_p", low=0, high=1),
        "top_k": request_number(body, "top_k", low=-1, integer=True),
        "min_p": request_number(body, "min_p", low=0, high=1),
        "repetition_penalty": request_number(body, "repetition_penalty", low=0),
    }
    for key in ("top_p", "repetition_penalty"):
        if sampling[key] == 0:
            raise RequestError(f"{key} must be greater than 0", param=key)
    return {k: v for k, v in sampling.items() if v is not None}


def context_overflow(max_context: int, prompt_tokens: int, completion_tokens: int) -> RequestError:
    """vLLM's wording, which clients (ours: harness.policies.base.is_context_overflow) match on."""
    return RequestError(
        f"This model's maximum context length is {max_context} tokens. However, you requested "
        f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, {completion_tokens} in the completion). "
        "Please reduce the length of the messages or completion.",
        param="messages",
        code="context_length_exceeded",
    )
