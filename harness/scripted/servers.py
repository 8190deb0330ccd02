"""Local HTTP servers that answer like a model server, from a script.

One ``ModelServer`` speaks one protocol: OpenAI Chat Completions as vLLM serves it
(``POST /v1/chat/completions``), OpenAI Responses (``POST /v1/responses``) or Anthropic
Messages (``POST /v1/messages``). Responses requests with ``"stream": true`` (what the Codex
CLI sends) are answered with server-sent events; everything else is answered whole. Every
request consumes the next
``ScriptedTurn`` (error turns too, so "429 then success" is two turns) and is recorded in
``requests`` so a test can assert what the client sent. The real SDKs talk to it over
real HTTP, so a test exercises the production path.

    with ModelServer("chat", [ScriptedTurn(content="hi")]) as server:
        spec = PolicySpec(kind="chat", model="m", base_url=server.base_url)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Protocol = Literal["chat", "responses", "anthropic"]

PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}


@dataclass
class ScriptedTurn:
    """What the fake model answers next."""

    content: str = ""
    reasoning: str | None = None
    # (name, arguments): a dict is sent as JSON; a string is sent verbatim, to play a
    # model that wrote malformed JSON.
    tool_calls: Sequence[tuple[str, dict[str, Any] | str]] = ()
    # responses only: freeform (custom) tool calls, (name, input text), after the function
    # calls: how Codex's apply_patch is called by the models it offers it to as a grammar.
    custom_tool_calls: Sequence[tuple[str, str]] = ()
    # Normalised ("stop", "tool_calls", "length", "content_filter"), translated into the
    # protocol's own value; default "tool_calls" if tool_calls else "stop".
    finish_reason: str | None = None
    input_tokens: int = 100  # the whole prompt, cached tokens included
    output_tokens: int = 20
    cached_input_tokens: int = 0
    # Returned when the request asked for them: chat, vLLM's return_token_ids / logprobs;
    # responses, vLLM's enable_response_messages (token ids only).
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # chat: the prompt's ids, on the response beside the choices as vLLM puts them.
    prompt_token_ids: list[int] | None = None
    # Answer with this HTTP status instead; error_body replaces the protocol's usual error
    # body. 429s carry Retry-After: 0 unless headers say otherwise.
    error: int | None = None
    error_body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    delay_s: float = 0.0  # sleep before answering, to trigger client timeouts
    # Answer 200 with these bytes instead of a protocol answer: what a broken proxy or server
    # sends (an HTML page, a body cut short, nothing at all, JSON of another shape).
    raw_body: bytes | None = None
    raw_content_type: str = "application/json"


def context_overflow(protocol: Protocol) -> ScriptedTurn:
    """The error each kind of server gives for a prompt over the context window."""
    if protocol == "chat":  # vLLM
        body: dict[str, Any] = {
            "object": "error",
            "message": "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens "
            "(39000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    elif protocol == "responses":
        body = {
            "error": {
                "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }
        }
    else:
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "prompt is too long: 215000 tokens > 200000 maximum"},
        }
    return ScriptedTurn(error=400, error_body=body)


class ModelServer:
    """A scripted model server on a free port of ``host`` (127.0.0.1; a container reaches one on
    the Docker bridge's address), in a background thread."""

    def __init__(
        self,
        protocol: Protocol,
        script: Sequence[ScriptedTurn] | Callable[[dict[str, Any]], ScriptedTurn],
        *,
        chat_reasoning_field: str = "reasoning_content",  # vLLM >= 0.11 and SGLang say "reasoning"
        host: str = "127.0.0.1",
    ) -> None:
        if protocol not in PATHS:
            raise ValueError(f"protocol must be one of {sorted(PATHS)}, not {protocol!r}")
        self.protocol = protocol
        self.script = script if callable(script) else list(script)
        self.chat_reasoning_field = chat_reasoning_field
        self.host = host
        self.requests: list[dict[str, Any]] = []  # every request body, in order
        self.headers: list[dict[str, str]] = []  # their headers, lower-cased names
        self._served = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """What the SDK takes as base_url: OpenAI's wants .../v1, Anthropic's the root."""
        if self._httpd is None:
            raise RuntimeError("ModelServer is not running: use it as a context manager")
        host, port = self._httpd.server_address[:2]
        root = f"http://{host}:{port}"
        return root if self.protocol == "anthropic" else root + "/v1"

    def start(self) -> ModelServer:
        self._httpd = ThreadingHTTPServer((self.host, 0), _Handler)
        self._httpd.model_server = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes handlers sleeping through delay_s
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- answering ---------------------------------------------------------------

    def _next_turn(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[ScriptedTurn | None, int, str | None]:
        """(turn, its index, an error message instead)."""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            expected = PATHS[self.protocol]
            if path.split("?", 1)[0] != expected:
                return None, -1, f"ModelServer({self.protocol}) serves POST {expected}, not {path}"
            index = self._served
            self._served += 1
            if callable(self.script):
                return self.script(body), index, None
            if index >= len(self.script):
                return (
                    None,
                    index,
                    f"ModelServer({self.protocol}): script exhausted: this is request {index + 1}, only {len(self.script)} turns were scripted",
                )
            return self.script[index], index, None

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        if self.protocol == "anthropic":
            kind = {
                400: "invalid_request_error",
                401: "authentication_error",
                404: "not_found_error",
                429: "rate_limit_error",
                529: "overloaded_error",
            }
            return {"type": "error", "error": {"type": kind.get(status, "api_error"), "message": message}}
        kind = {429: "rate_limit_error"}.get(status, "server_error" if status >= 500 else "invalid_request_error")
        code = {429: "rate_limit_exceeded"}.get(status)
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def _answer(self, turn: ScriptedTurn, index: int, body: dict[str, Any]) -> dict[str, Any]:
        finish = turn.finish_reason or ("tool_calls" if turn.tool_calls or turn.custom_tool_calls else "stop")
        if turn.custom_tool_calls and self.protocol != "responses":
            raise ValueError("ScriptedTurn.custom_tool_calls exist only in the responses protocol")
        if self.protocol == "chat":
            return self._chat(turn, index, body, finish)
        if self.protocol == "responses":
            return self._responses(turn, index, body, finish)
        return self._anthropic(turn, index, body, finish)

    def _chat(self, turn: ScriptedTurn, index: int, body: dict[str, Any], finish: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content if turn.content or not turn.tool_calls else None}
        if turn.reasoning is not None:
            message[self.chat_reasoning_field] = turn.reasoning
        if turn.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{index}_{i}", "type": "function", "function": {"name": name, "arguments": _arguments_text(arguments)}}
                for i, (name, arguments) in enumerate(turn.tool_calls)
            ]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if body.get("logprobs") and turn.logprobs is not None:
            choice["logprobs"] = {
                "content": [{"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in enumerate(turn.logprobs)]
            }
        if body.get("return_token_ids") and turn.token_ids is not None:
            choice["token_ids"] = turn.token_ids  # vLLM's field
        response: dict[str, Any] = {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": turn.input_tokens,
                "completion_tokens": turn.output_tokens,
                "total_tokens": turn.input_tokens + turn.output_tokens,
                "prompt_tokens_details": {"cached_tokens": turn.cached_input_tokens},
            },
        }
        if body.get("return_token_ids") and turn.prompt_token_ids is not None:
            response["prompt_token_ids"] = turn.prompt_token_ids  # vLLM's field, beside the choices
        return response

    def _responses(self, turn: ScriptedTurn, index: int, body: dict[str, Any], finish: str) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if turn.reasoning is not None:
            output.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{index}",
                    "summary": [{"type": "summary_text", "text": turn.reasoning}],
                    # OpenAI returns it by default; a client can only send reasoning back
                    # with store=False when it has it.
                    "encrypted_content": f"enc_{index}",
                }
            )
        if turn.content:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{index}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": turn.content, "annotations": []}],
                }
            )
        for i, (name, arguments) in enumerate(turn.tool_calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{index}_{i}",
                    "call_id": f"call_{index}_{i}",
                    "name": name,
                    "arguments": _arguments_text(arguments),
                    "status": "completed",
                }
            )
        for i, (name, text) in enumerate(turn.custom_tool_calls):
            output.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{index}_{i}",
                    "call_id": f"custom_{index}_{i}",
                    "name": name,
                    "input": text,
                    "status": "completed",
                }
            )
        incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish)
        raw: dict[str, Any] = {}
        if body.get("enable_response_messages") and turn.token_ids is not None:
            # vLLM's raw generated message and its token ids, beside the parsed output.
            raw = {
                "input_messages": (
                    [{"type": "raw_message_tokens", "message": "(the prompt)", "tokens": turn.prompt_token_ids}]
                    if turn.prompt_token_ids is not None
                    else []
                ),
                "output_messages": [{"type": "raw_message_tokens", "message": turn.content, "tokens": turn.token_ids}],
            }
        return {
            **raw,
            "id": f"resp_{index}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "error": None,
            "model": body.get("model", "scripted"),
            "instructions": body.get("instructions"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools", []),
            "metadata": {},
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "usage": {
                "input_tokens": turn.input_tokens,
                "input_tokens_details": {"cached_tokens": turn.cached_input_tokens},
                "output_tokens": turn.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": turn.input_tokens + turn.output_tokens,
            },
        }

    def _anthropic(self, turn: ScriptedTurn, index: int, body: dict[str, Any], finish: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if turn.reasoning is not None:
            content.append({"type": "thinking", "thinking": turn.reasoning, "signature": f"sig_{index}"})
        if turn.content:
            content.append({"type": "text", "text": turn.content})
        for i, (name, arguments) in enumerate(turn.tool_calls):
            # The real API always sends an object; a string here plays a broken proxy.
            content.append({"type": "tool_use", "id": f"toolu_{index}_{i}", "name": name, "input": arguments})
        stop = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}.get(finish, finish)
        return {
            "id": f"msg_{index}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "scripted"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                # Anthropic counts cache reads apart from input_tokens.
                "input_tokens": turn.input_tokens - turn.cached_input_tokens,
                "cache_read_input_tokens": turn.cached_input_tokens,
                "cache_creation_input_tokens": 0,
                "output_tokens": turn.output_tokens,
            },
        }


def _arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def sse_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole Responses API answer as the events the streaming API sends for it:
    created, in_progress, per output item added / text deltas / done, then completed
    (or incomplete) with the whole response and its usage."""
    events: list[dict[str, Any]] = []
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events.append({"type": "response.created", "response": pending})
    events.append({"type": "response.in_progress", "response": pending})
    for position, item in enumerate(response["output"]):
        opened = {**item, "status": "in_progress"} if "status" in item else dict(item)
        if item["type"] == "message":
            opened["content"] = []
        events.append({"type": "response.output_item.added", "output_index": position, "item": opened})
        if item["type"] == "message":
            for part_index, part in enumerate(item["content"]):
                events.append(
                    {
                        "type": "response.content_part.added",
                        "item_id": item["id"],
                        "output_index": position,
                        "content_index": part_index,
                        "part": {**part, "text": ""},
                    }
                )
                events.append(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": position,
                        "content_index": part_index,
                        "delta": part["text"],
                    }
                )
                events.append(
                    {
                        "type": "response.output_text.done",
                        "item_id": item["id"],
                        "output_index": position,
                        "content_index": part_index,
                        "text": part["text"],
                    }
                )
                events.append(
                    {
                        "type": "response.content_part.done",
                        "item_id": item["id"],
                        "output_index": position,
                        "content_index": part_index,
                        "part": part,
                    }
                )
        elif item["type"] == "function_call":
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": position,
                    "arguments": item["arguments"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": position, "item": item})
    final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    events.append({"type": final, "response": response})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


class _Handler(BaseHTTPRequestHandler):
    server_version = "ModelServer/1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        model_server: ModelServer = self.server.model_server  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, model_server._error_body(400, "request body is not JSON"))
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        turn, index, problem = model_server._next_turn(self.path, body, headers)
        if problem is not None:
            status = 404 if index < 0 else 500
            self._send(status, model_server._error_body(status, problem))
            return
        assert turn is not None
        if turn.delay_s and model_server._closing.wait(turn.delay_s):
            return  # shutting down
        if turn.error is not None:
            extra = {"Retry-After": "0"} if turn.error == 429 else {}
            extra.update(turn.headers or {})
            body_out = (
                turn.error_body if turn.error_body is not None else model_server._error_body(turn.error, f"scripted error {turn.error}")
            )
            self._send(turn.error, body_out, extra)
            return
        if turn.raw_body is not None:
            self._send_bytes(200, turn.raw_content_type, turn.raw_body, turn.headers)
            return
        answer = model_server._answer(turn, index, body)
        if model_server.protocol == "responses" and body.get("stream") is True:
            self._send_events(sse_events(answer), turn.headers)
            return
        self._send(200, answer, turn.headers)

    def do_GET(self) -> None:  # noqa: N802
        self._send(404, {"error": {"message": "ModelServer answers POST only"}})

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, "application/json", json.dumps(payload).encode(), headers)

    def _send_events(self, events: list[dict[str, Any]], headers: dict[str, str] | None = None) -> None:
        data = b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)
        self._send_bytes(200, "text/event-stream", data, headers)

    def _send_bytes(self, status: int, content_type: str, data: bytes, headers: dict[str, str] | None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout under test)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # keep test output clean
