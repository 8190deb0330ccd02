"""Scripted keep judge and auditor for the mini single-turn suite: what the fake model servers
answer. The answers (``single_turn_judge.json`` beside this module, written by
``scripts/generate_single_turn_suite.py``) are keyed by a digest of the
response they review; the judge rebuilds the response from the sections of its request."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from harness.scripted.servers import ScriptedTurn

ANSWERS: dict[str, dict[str, Any]] = json.loads((Path(__file__).parent / "single_turn_judge.json").read_text())
SECTIONS = re.compile(r"## reasoning_content\n(.*)\n\n## content\n(.*)\Z", re.S)


def _user(request: dict[str, Any]) -> str:
    messages = request.get("messages") or []
    user = next((m for m in messages if m.get("role") == "user"), None)
    if user is None:  # the Responses protocol
        user = next(m for m in request["input"] if m.get("role") == "user")
    content = user["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def response_digest(reasoning: str, content: str) -> str:
    response = f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning else content
    return hashlib.sha256(response.encode()).hexdigest()[:16]


def keep_judge(request: dict[str, Any], overrides: dict[str, dict[str, Any]] | None = None) -> ScriptedTurn:
    found = SECTIONS.search(_user(request))
    assert found is not None, "the keep judge's request has no response sections"
    key = response_digest(found.group(1), found.group(2))
    answer = (overrides or {}).get(key) or ANSWERS[key]["keep"]
    return ScriptedTurn(content=json.dumps(answer), input_tokens=800, output_tokens=120)


def auditor(request: dict[str, Any]) -> ScriptedTurn:
    text = _user(request)
    verdict = {"verdict": "pass", "self_contained": True, "correct": True, "reason": "the kept text solves the task"}
    for entry in ANSWERS.values():
        quotes = [i["quote"] for i in entry["keep"]["intervals"]]
        if quotes and all(q in text for q in quotes):
            verdict = entry["audit"]
            break
    return ScriptedTurn(content=json.dumps(verdict), input_tokens=400, output_tokens=40)


def judges(request: dict[str, Any]) -> ScriptedTurn:
    """One server for both roles: the system prompt says which is asked."""
    system = json.dumps(request.get("system") or request.get("messages", [{}])[0] or request.get("instructions"))
    return auditor(request) if "Keep-interval auditor" in system else keep_judge(request)
