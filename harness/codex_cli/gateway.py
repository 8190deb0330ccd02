"""The model gateway: the only endpoint a Codex container can reach.

Codex speaks the Responses API with server-sent events (``POST {base_url}/responses``,
``"stream": true``) and re-sends the whole history on every call. The gateway:

- admits a call only while the episode's fixed ``Budget`` (turns, tokens, cost, wall
  time) is not spent; past it, it refuses with HTTP 400 and an error that names the
  budget, which Codex (configured with no retries) reports and stops on. As in our own
  loop, the check comes before each call, so the call that crosses a token or cost
  limit completes and the next one is refused;
- forwards the call to the policy server as one non-streaming Responses request (any
  OpenAI-compatible Responses endpoint, vLLM's included), with the run's sampling
  settings and the real API key, which never enters the container (Codex holds a
  per-episode dummy key that the gateway checks);
- retries the upstream on 408/429/5xx and connection errors with backoff (Codex's own
  retries are off, so a retry can never slip past the budget);
- answers Codex with the event stream of that response: ``response.created``, for each
  output item ``response.output_item.added`` and ``.done``, then ``response.completed``
  (or ``.incomplete`` / ``.failed``) with the response's id and usage;
- records every call, refused ones included, as one JSON line: the request as Codex
  sent it (its ``input`` stored as the items added since the previous request, which is
  a prefix of it, so the file grows linearly; ``requests()`` rebuilds them), what was
  changed on the way up, the response, usage, cost, latencies, and the generated token
  ids where the server returns them (vLLM's ``enable_response_messages``).

It listens on a Unix socket (the relay's end, see ``network``) or on a loopback port.
"""

from __future__ import annotations

import json
import random
import secrets
import socketserver
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import zstandard

from harness.budget import Budget, Ledger
from harness.codex_cli.responses_api import (
    complete_response,
    decoded_body,
    error_body,
    events,
    retry_after_s,
    usage_of,
)
from harness.policies.base import PolicySpec, is_context_overflow
from harness.policies.openai_responses import generated_token_ids, prompt_token_ids
from records.pools import JsonlWriter
from records.trajectory import ExitStatus, Usage

# What a refusal says, per budget: Codex shows the message, our exit status takes the kind.
BUDGET_FIELDS = {
    ExitStatus.turns_exhausted: ("max_turns", "model calls"),
    ExitStatus.tokens_exhausted: ("max_tokens", "tokens"),
    ExitStatus.time_exhausted: ("max_seconds", "seconds"),
    ExitStatus.cost_exhausted: ("max_cost_usd", "USD"),
}
RETRYABLE = {408, 429}


class Gateway:
    """One episode's gateway. ``start()`` it, hand Codex ``token`` as its API key and
    the address (``base_url``, or the socket via the relay), call ``begin()`` when the
    episode's clock should start, ``close()`` at the end."""

    def __init__(
        self,
        spec: PolicySpec,
        budget: Budget,
        *,
        record_path: Path | None = None,
        socket_path: Path | None = None,
        request_token_ids: bool = False,
    ) -> None:
        if spec.kind != "responses":
            raise ValueError(
                f"the Codex gateway forwards the Responses API; the policy endpoint must be kind 'responses', not {spec.kind!r}"
            )
        if not spec.base_url:
            raise ValueError("the Codex gateway needs the policy endpoint's base_url")
        self.spec = spec
        self.budget = budget
        self.token = "relearn-" + secrets.token_hex(16)  # what the container holds: worthless elsewhere
        self.socket_path = socket_path
        self.request_token_ids = request_token_ids
        self.ledger = Ledger(budget)
        self.refused: ExitStatus | None = None  # the first budget that refused a call
        self.upstream_error: dict[str, Any] | None = None  # the first call the policy server failed
        # Why the last answer was cut (max_output_tokens): Codex stops on such an answer, which is
        # the policy's end, not the environment's.
        self.cut_off: str | None = None
        self.tools: list[dict[str, Any]] | None = None  # as offered in the first call
        self.token_ids: dict[str, list[int]] = {}  # response id -> generated token ids
        self.prompt_ids: dict[str, list[int]] = {}  # response id -> the prompt's token ids
        self.calls: list[dict[str, Any]] = []  # a summary per call: status, latencies
        self.first_request: float | None = None  # monotonic: when Codex was up and asking
        self.last_answer: float | None = None  # monotonic: when the last call was answered
        self._record = JsonlWriter(record_path) if record_path is not None else None
        self._previous_input: list[Any] | None = None
        self._previous_tools: Any = None
        self._lock = threading.Lock()
        self._server: socketserver.BaseServer | None = None
        self._thread: threading.Thread | None = None

    # ---- life cycle --------------------------------------------------------------

    def start(self) -> Gateway:
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
            server: socketserver.BaseServer = _UnixHTTPServer(str(self.socket_path), _Handler)
            self.socket_path.chmod(0o666)  # the relay connects as nobody
        else:
            server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
            server.daemon_threads = True
        server.gateway = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="codex-gateway")
        self._thread.start()
        return self

    def begin(self) -> None:
        """Start the episode's clock (the time budget counts from here)."""
        self.ledger.started = time.monotonic()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._record is not None:
            self._record.close()
            self._record = None
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        self._server = None

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """The loopback address (only when not listening on a socket)."""
        if not isinstance(self._server, ThreadingHTTPServer):
            raise RuntimeError("the gateway is not listening on a loopback port")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def summary(self) -> dict[str, Any]:
        """What the episode's trajectory keeps about its gateway (``source.meta.gateway``)."""
        upstream = [c["upstream_ms"] for c in self.calls if c.get("upstream_ms") is not None]
        own = [c["gateway_ms"] for c in self.calls if c.get("gateway_ms") is not None]
        return {
            "calls": len(self.calls),
            "forwarded": sum(1 for c in self.calls if c["status"] == 200),
            "refused": self.refused.value if self.refused else None,
            "upstream_error": self.upstream_error,
            "ledger": self.ledger.to_dict(),
            "upstream_ms_total": round(sum(upstream), 3),
            "gateway_ms_median": round(sorted(own)[len(own) // 2], 3) if own else None,
        }

    # ---- one request ---------------------------------------------------------------

    def handle(self, request: _Handler) -> None:
        received = time.monotonic()
        if self.first_request is None and request.command == "POST":
            self.first_request = received
        at = _now()
        path = request.path.split("?", 1)[0]
        if request.command != "POST" or not path.endswith("/responses"):
            # Codex may probe other endpoints (model discovery); the gateway serves one.
            self._finish(
                request,
                received,
                at,
                path,
                None,
                404,
                error_body("not_found", f"the relearn gateway serves POST /v1/responses, not {request.command} {path}"),
            )
            return
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self._finish(
                request, received, at, path, None, 401, error_body("invalid_api_key", "the relearn gateway does not know this key")
            )
            return
        try:
            body = json.loads(decoded_body(request))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except (ValueError, OSError, zstandard.ZstdError) as exc:
            self._finish(request, received, at, path, None, 400, error_body("invalid_request_error", f"request body: {exc}"))
            return
        with self._lock:
            if self.tools is None and isinstance(body.get("tools"), list):
                self.tools = body["tools"]
            reason = self.ledger.exhausted()
            if reason is None:
                self.ledger.turns += 1  # admitted: counted now, so concurrent calls cannot both slip in
            elif self.refused is None:
                self.refused = reason
        if reason is not None:
            self._finish(request, received, at, path, body, 400, self._refusal(reason), refused=reason)
            return
        upstream_body, overrides = self._upstream_body(body)
        started = time.monotonic()
        status, payload, attempts, failure = self._send(upstream_body)
        upstream_ms = (time.monotonic() - started) * 1000
        if status != 200 or not isinstance(payload, dict):
            error = payload if isinstance(payload, dict) else error_body("upstream_error", failure or f"HTTP {status}")
            text = json.dumps(error)
            kind = ExitStatus.context_overflow if status == 400 and is_context_overflow(text) else ExitStatus.policy_error
            with self._lock:
                if self.upstream_error is None:
                    self.upstream_error = {
                        "status": status,
                        "exit_status": kind.value,
                        "error": failure or text[:2000],
                        "attempts": attempts,
                    }
            out_status = status if 400 <= status < 600 else 502
            self._finish(
                request, received, at, path, body, out_status, error, overrides=overrides, upstream=(status, attempts, upstream_ms)
            )
            return
        response = payload
        if response.get("status") == "incomplete":
            with self._lock:
                self.cut_off = (response.get("incomplete_details") or {}).get("reason") or "incomplete"
        notes = complete_response(response)
        usage = usage_of(response)
        cost = self.spec.cost_usd(usage)
        usage.cost_usd = cost
        token_ids = generated_token_ids(response)
        prompt_ids = prompt_token_ids(response)
        with self._lock:
            self.ledger.tokens += (usage.input_tokens or 0) + (usage.output_tokens or 0)
            self.ledger.cost_usd += cost
            if token_ids is not None:
                self.token_ids[response["id"]] = token_ids
            if prompt_ids is not None:
                self.prompt_ids[response["id"]] = prompt_ids
        self._finish(
            request, received, at, path, body, 200, response,
            overrides=overrides, upstream=(status, attempts, upstream_ms), usage=usage, token_ids=token_ids, notes=notes, stream=body.get("stream") is not False,
        )  # fmt: skip

    def _refusal(self, reason: ExitStatus) -> dict[str, Any]:
        field, unit = BUDGET_FIELDS[reason]
        limit = getattr(self.budget, field)
        spent = {
            ExitStatus.turns_exhausted: self.ledger.turns,
            ExitStatus.tokens_exhausted: self.ledger.tokens,
            ExitStatus.time_exhausted: round(self.ledger.seconds, 1),
            ExitStatus.cost_exhausted: round(self.ledger.cost_usd, 6),
        }[reason]
        message = (
            f"relearn gateway: the episode's budget is spent ({reason.value}: {spent} of {limit} {unit}, {field}); no further model calls"
        )
        return error_body("budget_exhausted", message, code=reason.value)

    def _upstream_body(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The request as the policy server gets it, and what was changed (recorded)."""
        overrides: dict[str, Any] = {"stream": False, "model": self.spec.model}
        sampling = dict(self.spec.sampling)
        extra = sampling.pop("extra_body", None) or {}
        if "max_tokens" in sampling:
            sampling["max_output_tokens"] = sampling.pop("max_tokens")
        overrides.update(sampling)
        overrides.update(extra)
        if self.request_token_ids:
            overrides["enable_response_messages"] = True
        return {**body, **overrides}, overrides

    def _send(self, body: dict[str, Any]) -> tuple[int, Any, int, str | None]:
        """(HTTP status, parsed body or None, attempts, failure text)."""
        spec = self.spec
        url = spec.base_url.rstrip("/") + "/responses"  # type: ignore[union-attr]
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {spec.api_key()}", "Accept": "application/json"}
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(url, data=data, headers=headers, method="POST"), timeout=spec.timeout_s
                ) as response:  # noqa: S310 (the configured policy endpoint)
                    raw = response.read()
                try:
                    return 200, json.loads(raw), attempt, None
                except ValueError:
                    return 502, None, attempt, f"the policy server's answer is not JSON: {raw[:300]!r}"
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                try:
                    payload: Any = json.loads(raw)
                except ValueError:
                    payload = None
                status, failure = exc.code, f"HTTP {exc.code}: {raw[:600].decode(errors='replace')}"
                retry_after = retry_after_s(exc.headers.get("Retry-After"))
                if status not in RETRYABLE and status < 500:
                    return status, payload, attempt, failure
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                status, payload, failure = 502, None, f"cannot reach the policy server at {url}: {getattr(exc, 'reason', exc)}"
            if attempt > spec.max_retries:
                return status, payload, attempt, f"{failure} (after {attempt} attempts)"
            delay = retry_after if retry_after is not None else spec.backoff_base_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
            time.sleep(min(max(delay, 0.0), spec.backoff_cap_s))

    def _finish(
        self,
        request: _Handler,
        received: float,
        at: str,
        path: str,
        body: dict[str, Any] | None,
        status: int,
        payload: dict[str, Any],
        *,
        refused: ExitStatus | None = None,
        overrides: dict[str, Any] | None = None,
        upstream: tuple[int, int, float] | None = None,
        usage: Usage | None = None,
        token_ids: list[int] | None = None,
        notes: list[str] | None = None,
        stream: bool = False,
    ) -> None:
        if status == 200 and stream:
            request.send_events(events(payload))
        else:
            request.send_json(status, payload)
        done = time.monotonic()
        self.last_answer = done
        upstream_ms = upstream[2] if upstream else None
        summary: dict[str, Any] = {"status": status, "total_ms": round((done - received) * 1000, 3)}
        if upstream_ms is not None:
            summary["upstream_ms"] = round(upstream_ms, 3)
            summary["gateway_ms"] = round((done - received) * 1000 - upstream_ms, 3)
        record: dict[str, Any] = {"kind": "call", "at": at, "path": path, **summary}
        if refused is not None:
            record["refused"] = refused.value
        if upstream is not None:
            record["upstream"] = {"status": upstream[0], "attempts": upstream[1], "overrides": overrides}
        if usage is not None:
            record["usage"] = usage.to_dict()
        if token_ids is not None:
            record["token_ids"] = token_ids
        if notes:
            record["notes"] = notes
        record["response" if status == 200 else "error"] = payload
        with self._lock:
            record["n"] = len(self.calls)
            if body is not None:
                record["request"] = self._compact(body)
            self.calls.append(summary)
            if self._record is not None:
                self._record.write(record)

    def _compact(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request with its input stored as the items added since the previous
        request, when that one's input is a prefix of it (Codex re-sends the history)."""
        stored = dict(body)
        current = body.get("input")
        previous = self._previous_input
        if isinstance(current, list) and previous is not None and current[: len(previous)] == previous:
            stored.pop("input")
            stored["input_continues"] = len(previous)
            stored["input_added"] = current[len(previous) :]
        if "tools" in body and body["tools"] == self._previous_tools:
            stored.pop("tools")
            stored["tools_unchanged"] = True
        if isinstance(current, list):
            self._previous_input = current
        if "tools" in body:
            self._previous_tools = body["tools"]
        return stored


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Codex reuses its connection
    server_version = "relearn-gateway/1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.gateway.handle(self)  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802
        self.server.gateway.handle(self)  # type: ignore[attr-defined]

    def send_json(self, status: int, payload: dict[str, Any]) -> None:
        self._write(status, "application/json", json.dumps(payload).encode())

    def send_events(self, stream: list[dict[str, Any]]) -> None:
        data = b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in stream)
        self._write(200, "text/event-stream", data)

    def _write(self, status: int, content_type: str, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # Codex gave up on this call (killed at the end of its time)

    def address_string(self) -> str:
        return "relay" if not self.client_address else str(self.client_address[0])

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass
