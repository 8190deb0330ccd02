"""Codex rollout lines written to the published format (formats.md §1), for the tests and
the import benchmark. Both layouts: the current envelope and the legacy bare items."""

from __future__ import annotations

import json
from typing import Any


def envelope(kind: str, payload: dict[str, Any], second: int = 0) -> dict[str, Any]:
    return {"timestamp": f"2026-06-05T04:58:{second:02d}.000Z", "type": kind, "payload": payload}


def token_count(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    usage = {
        "input_tokens": input_tokens,
        "cached_input_tokens": 0,
        "output_tokens": output_tokens,
        "reasoning_output_tokens": 0,
        "total_tokens": input_tokens + output_tokens,
    }
    return {
        "type": "token_count",
        "info": {"total_token_usage": usage, "last_token_usage": usage, "model_context_window": 258400},
        "rate_limits": None,
    }


def text_message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


PATCH = "*** Begin Patch\n*** Update File: calc.py\n@@ def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"


def session(session_id: str = "019e0000-0000-7000-8000-000000000001", steps: int = 1, filler: str = "") -> list[dict[str, Any]]:
    """A current-layout rollout: meta, context, then ``steps`` rounds of reasoning +
    shell call + output, an apply_patch custom call, and a final answer."""
    lines = [
        envelope(
            "session_meta",
            {
                "id": session_id,
                "timestamp": "2026-06-05T04:58:00.000Z",
                "cwd": "/repo",
                "originator": "codex_exec",
                "cli_version": "0.135.0",
                "source": "exec",
                "model_provider": "vllm",
                "base_instructions": {"text": "You are Codex, a coding agent."},
            },
        ),
        envelope("event_msg", {"type": "task_started", "turn_id": "t1", "model_context_window": 258400}),
        envelope(
            "response_item", text_message("developer", "<permissions instructions>sandbox: danger-full-access</permissions instructions>")
        ),
        envelope("response_item", text_message("user", "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>")),
        envelope(
            "turn_context",
            {
                "turn_id": "t1",
                "cwd": "/repo",
                "approval_policy": "never",
                "sandbox_policy": {"type": "danger-full-access"},
                "model": "qwen3.6-35b-a3b",
                "summary": "auto",
            },
        ),
        envelope("response_item", text_message("user", "Fix add() in calc.py: it subtracts.")),
        envelope("event_msg", {"type": "user_message", "message": "Fix add() in calc.py: it subtracts.", "images": []}),
    ]
    for step in range(steps):
        call_id = f"call_{step}"
        lines += [
            envelope(
                "response_item",
                {
                    "type": "reasoning",
                    "id": f"rs_{step}",
                    "summary": [{"type": "summary_text", "text": f"Look at calc.py (step {step}). {filler}"}],
                    "content": [{"type": "reasoning_text", "text": f"I should read calc.py first, step {step}. {filler}"}],
                    "encrypted_content": "gAAAAB" + "x" * 40,
                },
            ),
            envelope(
                "response_item",
                {
                    "type": "function_call",
                    "name": "shell",
                    "arguments": json.dumps({"command": ["bash", "-lc", "cat calc.py"], "workdir": "/repo", "timeout_ms": 10000}),
                    "call_id": call_id,
                },
            ),
            envelope("event_msg", token_count(1000 + step, 50)),
            envelope(
                "event_msg",
                {
                    "type": "exec_command_end",
                    "call_id": call_id,
                    "command": ["bash", "-lc", "cat calc.py"],
                    "exit_code": 0,
                    "duration": {"secs": 0, "nanos": 5000000},
                    "aggregated_output": "def add(a, b):\n    return a - b\n",
                    "status": "completed",
                },
            ),
            envelope(
                "response_item",
                {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": f"Process exited with code 0\nOutput:\ndef add(a, b):\n    return a - b\n{filler}",
                },
            ),
        ]
    lines += [
        envelope(
            "response_item",
            {
                "type": "reasoning",
                "id": "rs_patch",
                "summary": [{"type": "summary_text", "text": "Patch the sign."}],
                "encrypted_content": "gAAAAB",
            },
        ),
        envelope("response_item", text_message("assistant", "The function subtracts; I will fix the operator.") | {"phase": "commentary"}),
        envelope(
            "response_item",
            {"type": "custom_tool_call", "status": "completed", "call_id": "call_patch", "name": "apply_patch", "input": PATCH},
        ),
        envelope("event_msg", token_count(2000, 80)),
        envelope(
            "response_item",
            {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Success. Updated the following files:\nM calc.py\n"},
        ),
        envelope("response_item", text_message("assistant", "Fixed: add() now returns a + b.") | {"phase": "final_answer"}),
        envelope("event_msg", {"type": "agent_message", "message": "Fixed: add() now returns a + b.", "phase": "final_answer"}),
        envelope("event_msg", token_count(2100, 20)),
        envelope(
            "event_msg",
            {"type": "task_complete", "turn_id": "t1", "last_agent_message": "Fixed: add() now returns a + b.", "duration_ms": 9000},
        ),
    ]
    return lines


def legacy_session() -> list[dict[str, Any]]:
    """The pre-envelope layout: bare meta, bare items, ``record_type: state`` lines,
    legacy JSON-string tool outputs, apply_patch through a shell heredoc."""
    heredoc = f"apply_patch << 'PATCH'\n{PATCH}PATCH"
    return [
        {
            "id": "5973b6c0-94b8-487b-a530-2aeb6098ae0e",
            "timestamp": "2025-08-01T10:00:00.000Z",
            "instructions": "You are Codex.",
            "git": {"commit_hash": "abc123", "branch": "main", "repository_url": "https://example.invalid/repo.git"},
        },
        {"record_type": "state"},
        text_message("user", "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"),
        text_message("user", "Fix add()."),
        {"record_type": "state"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB"},
        {
            "type": "function_call",
            "id": "fc_1",
            "name": "shell",
            "arguments": json.dumps({"command": ["bash", "-lc", "cat calc.py"]}),
            "call_id": "call_a",
        },
        {
            "type": "function_call_output",
            "call_id": "call_a",
            "output": json.dumps({"output": "def add(a, b):\n    return a - b\n", "metadata": {"exit_code": 0, "duration_seconds": 0.1}}),
        },
        {"record_type": "state"},
        {
            "type": "function_call",
            "id": "fc_2",
            "name": "shell",
            "arguments": json.dumps({"command": ["bash", "-lc", heredoc]}),
            "call_id": "call_b",
        },
        {
            "type": "function_call_output",
            "call_id": "call_b",
            "output": json.dumps({"output": "Done!", "metadata": {"exit_code": 0, "duration_seconds": 0.0}}),
        },
        {
            "type": "function_call",
            "id": "fc_3",
            "name": "update_plan",
            "arguments": json.dumps({"plan": [{"step": "fix add", "status": "completed"}]}),
            "call_id": "call_c",
        },
        {"type": "function_call_output", "call_id": "call_c", "output": "Plan updated"},
        text_message("assistant", "Done."),
        {"record_type": "state"},
    ]


def write_rollout(path: Any, lines: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")
