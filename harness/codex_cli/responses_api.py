"""The Responses API as the gateway speaks it: request bodies as Codex sends them, answers
completed where servers leave fields out, the event stream Codex reads, usage, and the
gateway's record of calls read back whole (``requests``)."""

from __future__ import annotations

import gzip
import json
import secrets
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import zstandard

from records.pools import iter_lines
from records.trajectory import Usage


def requests(path: Path) -> Iterator[dict[str, Any]]:
    """Every call of a gateway record with its request rebuilt whole."""
    previous_input: list[Any] = []
    previous_tools: Any = None
    for _number, text in iter_lines(path):
        record = json.loads(text)
        stored = record.get("request")
        if stored is not None:
            request = dict(stored)
            if "input_continues" in request:
                request["input"] = previous_input[: request.pop("input_continues")] + request.pop("input_added")
            if request.pop("tools_unchanged", False):
                request["tools"] = previous_tools
            if isinstance(request.get("input"), list):
                previous_input = request["input"]
            if "tools" in request:
                previous_tools = request["tools"]
            record["request"] = request
        yield record


def events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole Responses API answer as the event stream Codex reads."""
    final = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}.get(
        response.get("status") or "completed", "response.completed"
    )
    stream: list[dict[str, Any]] = [{"type": "response.created", "response": {**response, "status": "in_progress", "output": []}}]
    for index, item in enumerate(response.get("output") or []):
        stream.append({"type": "response.output_item.added", "output_index": index, "item": item})
        stream.append({"type": "response.output_item.done", "output_index": index, "item": item})
    stream.append({"type": final, "response": response})
    for number, event in enumerate(stream):
        event["sequence_number"] = number
    return stream


def usage_of(response: dict[str, Any]) -> Usage:
    raw = response.get("usage") or {}
    cached = (raw.get("input_tokens_details") or {}).get("cached_tokens")
    reasoning = (raw.get("output_tokens_details") or {}).get("reasoning_tokens")
    return Usage(
        input_tokens=raw.get("input_tokens"),
        cached_input_tokens=cached,
        output_tokens=raw.get("output_tokens"),
        reasoning_output_tokens=reasoning,
        total_tokens=raw.get("total_tokens"),
    )


def complete_response(response: dict[str, Any]) -> list[str]:
    """Fill what Codex needs and some servers leave out: an id and a usage object."""
    notes = []
    if not response.get("id"):
        response["id"] = "resp_relearn_" + secrets.token_hex(8)
        notes.append("the policy server's response had no id; one was given")
    if not isinstance(response.get("usage"), dict):
        response["usage"] = {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        notes.append("the policy server's response had no usage; zeros were sent to Codex (token and cost budgets cannot count this call)")
    if not isinstance(response.get("output"), list):
        response["output"] = []
        notes.append("the policy server's response had no output list")
    return notes


def decoded_body(request: BaseHTTPRequestHandler) -> bytes:
    if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
        raw = b""
        while True:
            size = int(request.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                request.rfile.readline()
                break
            raw += request.rfile.read(size)
            request.rfile.readline()
    else:
        raw = request.rfile.read(int(request.headers.get("Content-Length") or 0))
    encoding = (request.headers.get("Content-Encoding") or "identity").lower()
    if encoding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    if encoding != "identity":
        raise ValueError(f"unsupported Content-Encoding {encoding!r}")
    return raw


def error_body(kind: str, message: str, *, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code or kind}}


def retry_after_s(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
