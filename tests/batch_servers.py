"""A local HTTP server speaking the providers' batch APIs as the real SDKs call them.

``BatchServer("anthropic", answer)`` serves Anthropic Message Batches: ``POST
/v1/messages/batches`` (create), ``GET /v1/messages/batches/{id}`` (retrieve) and the
``results_url`` it gives once the batch has ended (a JSONL stream, in another order than
the requests). ``BatchServer("openai", answer)`` serves the OpenAI Files API (multipart
upload with ``purpose=batch``, ``GET /v1/files/{id}/content``) and ``POST /v1/batches`` /
``GET /v1/batches/{id}``, writing an output file and an error file. Both also answer the
ordinary endpoint (``/v1/messages``, ``/v1/chat/completions``, ``/v1/responses``), for the
requests retried one by one.

Each request in a batch is answered by ``answer(body) -> ScriptedTurn``, in the protocol's
own form (harness.scripted.servers builds it). ``fate(custom_id, body)`` can make one request
``"errored"`` or ``"expired"`` instead. While ``hold`` is set a batch stays in progress
(a test kills its client meanwhile); ``expire=True`` ends OpenAI batches as expired.

    with BatchServer("anthropic", answer) as server:
        spec = PolicySpec(kind="anthropic", model="m", base_url=server.base_url)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from harness.scripted.servers import ModelServer, ScriptedTurn

Provider = Literal["anthropic", "openai"]
Fate = Literal["succeeded", "errored", "expired"]
ONLINE = {"/v1/messages": "anthropic", "/v1/chat/completions": "chat", "/v1/responses": "responses"}


class BatchServer:
    def __init__(
        self,
        provider: Provider,
        answer: Callable[[dict[str, Any]], ScriptedTurn],
        *,
        fate: Callable[[str, dict[str, Any]], Fate] | None = None,
    ) -> None:
        self.provider = provider
        self.answer = answer
        self.fate = fate or (lambda _custom_id, _body: "succeeded")
        self.hold = threading.Event()  # set: every batch stays in progress
        self.expire = False
        self.creates: list[dict[str, Any]] = []  # one per batch created: its id and requests
        self.retrieves = 0
        self.online: list[dict[str, Any]] = []  # bodies of the ordinary (non-batch) calls
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def root(self) -> str:
        assert self._httpd is not None, "BatchServer is not running: use it as a context manager"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.root if self.provider == "anthropic" else self.root + "/v1"

    def __enter__(self) -> BatchServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.batch_server = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # --- answering one request, in the protocol of its endpoint -----------------------------

    def respond(self, protocol: str, body: dict[str, Any], index: int) -> dict[str, Any]:
        turn = self.answer(body)
        return ModelServer(protocol, [turn])._answer(turn, index, body)  # type: ignore[arg-type]  # noqa: SLF001 - its protocol bodies

    # --- Anthropic ------------------------------------------------------------------------

    def anthropic_create(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            batch_id = f"msgbatch_{len(self.batches):04d}"
            requests = body["requests"]
            results = []
            for index, item in enumerate(requests):
                fate = self.fate(item["custom_id"], item["params"])
                if fate == "succeeded":
                    result: dict[str, Any] = {"type": "succeeded", "message": self.respond("anthropic", item["params"], index)}
                elif fate == "errored":
                    result = {
                        "type": "errored",
                        "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "scripted failure"}},
                    }
                else:
                    result = {"type": "expired"}
                results.append({"custom_id": item["custom_id"], "result": result})
            self.batches[batch_id] = {"results": results[::-1], "created_at": datetime.now(UTC)}
            self.creates.append({"id": batch_id, "requests": requests})
        return self.anthropic_batch(batch_id)

    def anthropic_batch(self, batch_id: str) -> dict[str, Any]:
        batch = self.batches[batch_id]
        ended = not self.hold.is_set()
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for item in batch["results"]:
            counts[item["result"]["type"] if ended else "processing"] += 1
        created: datetime = batch["created_at"]
        return {
            "id": batch_id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": counts,
            "created_at": created.isoformat(),
            "expires_at": (created + timedelta(hours=24)).isoformat(),
            "ended_at": datetime.now(UTC).isoformat() if ended else None,
            "cancel_initiated_at": None,
            "archived_at": None,
            "results_url": f"{self.root}/v1/messages/batches/{batch_id}/results" if ended else None,
        }

    # --- OpenAI ---------------------------------------------------------------------------

    def upload(self, content_type: str, raw: bytes) -> dict[str, Any]:
        message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
        fields = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        if fields["purpose"].get_content().strip() != "batch":
            raise ValueError("purpose must be batch")
        data = fields["file"].get_payload(decode=True)
        with self._lock:
            file_id = f"file-{len(self.files):04d}"
            self.files[file_id] = data
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": fields["file"].get_filename(),
            "purpose": "batch",
            "status": "processed",
        }

    def openai_create(self, body: dict[str, Any]) -> dict[str, Any]:
        lines = [json.loads(line) for line in self.files[body["input_file_id"]].decode().splitlines() if line.strip()]
        with self._lock:
            batch_id = f"batch_{len(self.batches):04d}"
            self.batches[batch_id] = {
                "lines": lines,
                "endpoint": body["endpoint"],
                "input_file_id": body["input_file_id"],
                "created_at": int(time.time()),
                "metadata": body.get("metadata"),
                "done": None,
            }
            self.creates.append({"id": batch_id, "requests": lines})
        return self.openai_batch(batch_id)

    def _finish_openai(self, batch_id: str) -> None:
        """Run the batch's requests once, into an output file and an error file."""
        batch = self.batches[batch_id]
        if batch["done"] is not None:
            return
        output, errors = [], []
        for index, line in enumerate(batch["lines"]):
            fate = "expired" if self.expire and index % 2 else self.fate(line["custom_id"], line["body"])
            item: dict[str, Any] = {"id": f"batch_req_{index}", "custom_id": line["custom_id"], "response": None, "error": None}
            if fate == "succeeded":
                protocol = ONLINE[line["url"]]
                item["response"] = {"status_code": 200, "request_id": f"req_{index}", "body": self.respond(protocol, line["body"], index)}
                output.append(item)
            elif fate == "errored":
                item["response"] = {
                    "status_code": 400,
                    "request_id": f"req_{index}",
                    "body": {"error": {"message": "scripted failure", "type": "invalid_request_error", "param": None, "code": None}},
                }
                errors.append(item)
            else:
                item["error"] = {
                    "code": "batch_expired",
                    "message": "This request could not be executed before the completion window expired.",
                }
                errors.append(item)
        batch["done"] = {}
        for kind, items in (("output", output), ("error", errors)):
            if items:
                file_id = f"file-{len(self.files):04d}"
                self.files[file_id] = "".join(json.dumps(i) + "\n" for i in items[::-1]).encode()
                batch["done"][kind] = file_id
        batch["counts"] = {"total": len(batch["lines"]), "completed": len(output), "failed": len(errors)}

    def openai_batch(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            batch = self.batches[batch_id]
            ended = not self.hold.is_set()
            if ended:
                self._finish_openai(batch_id)
            status = ("expired" if self.expire else "completed") if ended else "in_progress"
            done = batch["done"] or {}
            return {
                "id": batch_id,
                "object": "batch",
                "endpoint": batch["endpoint"],
                "errors": None,
                "input_file_id": batch["input_file_id"],
                "completion_window": "24h",
                "status": status,
                "output_file_id": done.get("output"),
                "error_file_id": done.get("error"),
                "created_at": batch["created_at"],
                "in_progress_at": batch["created_at"],
                "completed_at": int(time.time()) if ended and not self.expire else None,
                "expired_at": int(time.time()) if ended and self.expire else None,
                "request_counts": batch.get("counts") or {"total": len(batch["lines"]), "completed": 0, "failed": 0},
                "metadata": batch["metadata"],
            }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: object) -> None:
        pass

    @property
    def server_(self) -> BatchServer:
        return self.server.batch_server  # type: ignore[attr-defined]

    def _send(self, status: int, body: dict[str, Any] | bytes, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        if self.server_.provider == "anthropic":
            self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {self.command} {self.path}"}})
        else:
            self._send(
                404,
                {
                    "error": {
                        "message": f"no route {self.command} {self.path}",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
            )

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server = self.server_
        path = self.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if server.provider == "anthropic" and parts[:3] == ["v1", "messages", "batches"] and len(parts) in (4, 5):
            batch_id = parts[3]
            if batch_id not in server.batches:
                return self._not_found()
            if len(parts) == 4:
                server.retrieves += 1
                return self._send(200, server.anthropic_batch(batch_id))
            if parts[4] == "results" and not server.hold.is_set():
                lines = "".join(json.dumps(item) + "\n" for item in server.batches[batch_id]["results"])
                return self._send(200, lines.encode(), "application/binary")
        if server.provider == "openai" and parts[:2] == ["v1", "batches"] and len(parts) == 3 and parts[2] in server.batches:
            server.retrieves += 1
            return self._send(200, server.openai_batch(parts[2]))
        if (
            server.provider == "openai"
            and parts[:2] == ["v1", "files"]
            and len(parts) == 4
            and parts[3] == "content"
            and parts[2] in server.files
        ):
            return self._send(200, server.files[parts[2]], "application/octet-stream")
        return self._not_found()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        server = self.server_
        path = self.path.split("?", 1)[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if server.provider == "openai" and path == "/v1/files":
            return self._send(200, server.upload(self.headers["Content-Type"], raw))
        body = json.loads(raw or b"{}")
        if server.provider == "anthropic" and path == "/v1/messages/batches":
            return self._send(200, server.anthropic_create(body))
        if server.provider == "openai" and path == "/v1/batches":
            return self._send(200, server.openai_create(body))
        protocol = ONLINE.get(path)
        if protocol is not None and (protocol == "anthropic") == (server.provider == "anthropic"):
            with server._lock:  # noqa: SLF001 - the server's own lock
                server.online.append(body)
                index = len(server.online)
            return self._send(200, server.respond(protocol, body, index))
        return self._not_found()
