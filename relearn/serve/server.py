"""The HTTP side of ``relearn serve``: ``/v1/chat/completions``, ``/v1/responses``, ``/v1/models``, ``/health``."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import zstandard

from harness.codex_cli.responses_api import decoded_body
from relearn.serve import DEFAULT_MAX_NEW_TOKENS
from relearn.serve.chat_request import RequestError, parse_request
from relearn.serve.engine import ChatEngine, check_model_folder, load_model, load_tokenizer_folder
from relearn.serve.responses import (
    ResponsesRequest,
    failed_event,
    finish_response,
    new_response,
    opening_events,
    output_events,
    parse_responses_request,
)

ROUTES = ("/v1/chat/completions", "/v1/responses")


def _is_tokenizer(value: Any) -> bool:
    return value is not None and not isinstance(value, str | Path)


class _Handler(BaseHTTPRequestHandler):
    server_version = "relearn-serve"
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects

    @property
    def engine(self) -> ChatEngine:
        return self.server.engine  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        log = self.server.log  # type: ignore[attr-defined]
        if log is not None:
            log(f"{self.address_string()} {format % args}")

    def _send(self, status: int, body: dict[str, Any] | None) -> None:
        data = b"" if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send(200, None)
        elif path == "/v1/models":
            self._send(200, self.engine.models())
        else:
            self._send(404, RequestError(f"no route GET {path}", status=404, kind="NotFoundError").body())

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ROUTES:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            routes = " and ".join(f"POST {r}" for r in ROUTES)
            self._send(404, RequestError(f"no route POST {path}; this server answers {routes}", status=404, kind="NotFoundError").body())
            return
        responses = path == "/v1/responses"
        try:
            try:
                # The Codex CLI may send its body chunked or compressed; chat clients do neither.
                body = json.loads(decoded_body(self) or b"null")
            except (ValueError, OSError, zstandard.ZstdError) as e:
                raise RequestError(f"the request body is not JSON: {e}") from None
            if responses:
                self._respond(parse_responses_request(body, self.engine.model_name))
            else:
                self._send(200, self.engine.complete(parse_request(body, self.engine.model_name)))
        except RequestError as e:
            self._send(e.status, e.responses_body() if responses else e.body())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on this request
        except Exception as e:  # a bug or an engine failure: say so, keep serving
            print(f"relearn serve: request failed: {e!r}", file=sys.stderr)
            error = RequestError(f"internal error: {e}", status=500, kind="InternalServerError")
            self._send(500, error.responses_body() if responses else error.body())

    def _respond(self, request: ResponsesRequest) -> None:
        engine = self.engine
        response = new_response(request, engine.model_name)

        def decode(ids: list[int]) -> str:
            return engine.tokenizer.decode(ids, skip_special_tokens=False)

        if not request.stream:
            self._send(200, finish_response(request, response, engine.generate(request.chat), decode))
            return
        stream = _EventStream(self)
        try:
            # Headers and the first events go out once the prompt fits (an overflow is still a 400).
            generation = engine.generate(request.chat, on_start=lambda: stream.send(opening_events(response)))
            events = output_events(finish_response(request, response, generation, decode))
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as e:
            if not stream.started:
                raise
            # The status line is sent: the stream itself has to say that it failed.
            print(f"relearn serve: request failed: {e!r}", file=sys.stderr)
            events = [failed_event(response, RequestError(f"internal error: {e}", status=500))]
        stream.send(events)
        stream.close()


class _EventStream:
    """Server-sent events over a chunked HTTP/1.1 body (the connection stays open for the next
    request); each event numbered in order."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self.handler = handler
        self.sequence = 0
        self.started = False

    def send(self, events: list[dict[str, Any]]) -> None:
        if not self.started:
            self.handler.send_response(200)
            self.handler.send_header("Content-Type", "text/event-stream")
            self.handler.send_header("Cache-Control", "no-cache")
            self.handler.send_header("Transfer-Encoding", "chunked")
            self.handler.end_headers()
            self.started = True
        data = b""
        for event in events:
            event["sequence_number"] = self.sequence
            self.sequence += 1
            data += f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
        self._chunk(data)

    def close(self) -> None:
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.handler.wfile.flush()


class Server:
    """A running server: ``url`` is the base URL an OpenAI client takes (``.../v1``)."""

    def __init__(self, engine: ChatEngine, host: str, port: int, log: Callable[[str], None] | None) -> None:
        self.engine = engine
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.engine = engine  # type: ignore[attr-defined]
        self._httpd.log = log  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="relearn-serve", daemon=True)
        self._thread.start()

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = str(host)
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"  # a client cannot connect to the wildcard address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(
    model: str | Path | Any,
    tokenizer: str | Path | Any | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    model_name: str | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_context: int | None = None,
    device: str = "cpu",
    seed: int | None = None,
    log: Callable[[str], None] | None = None,
) -> Server:
    """Serve ``model`` (a Hugging Face folder or a loaded causal LM) in a background thread.

    ``tokenizer``: a loaded tokenizer, a folder, or None for the model folder's own.
    ``port=0`` picks a free port; ``max_context`` defaults to the model's position limit.
    ``seed`` makes the n-th request after start sample the same way each run (a request's
    own seed wins). ValueError when the model or tokenizer cannot be used.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    if isinstance(model, str | Path):
        name = model_name or str(model)
        folder = check_model_folder(model)
        # The tokenizer first: a missing one should not cost the wait for a large model.
        tokenizer = load_tokenizer_folder(folder if tokenizer is None else tokenizer) if not _is_tokenizer(tokenizer) else tokenizer
        model = load_model(folder, device)
    else:
        name = model_name or getattr(model, "name_or_path", None) or "model"
        if tokenizer is None:
            raise ValueError("a loaded model needs a tokenizer")
        if not _is_tokenizer(tokenizer):
            tokenizer = load_tokenizer_folder(tokenizer)
    engine = ChatEngine(model, tokenizer, model_name=name, max_new_tokens=max_new_tokens, max_context=max_context, device=device, seed=seed)
    return Server(engine, host, port, log)
