from __future__ import annotations

import json
from pathlib import Path

from harness.importers import swe_agent
from records.trajectory import ExitStatus


def _document() -> dict:
    """A SWE-agent 1.x function-calling .traj, shaped as SWE-agent writes it."""
    return {
        "environment": "main",
        "trajectory": [
            {
                "action": "find_file missing_colon.py",
                "observation": "Found 1 matches",
                "response": "Search first.",
                "thought": "Search first.",
                "execution_time": 0.2,
                "state": {"open_file": "n/a", "working_dir": "/repo"},
                "query": [{"role": "system", "content": "SETTING: ..."}],
            },
            {
                "action": "submit",
                "observation": "diff --git ...",
                "response": "Submit.",
                "thought": "Submit.",
                "execution_time": 0.1,
                "state": {},
            },
        ],
        "history": [
            {"role": "system", "content": "SETTING: ...", "agent": "main", "message_type": "system_prompt"},
            {"role": "user", "content": "Demonstration ...", "agent": "main", "is_demo": "True", "message_type": "demonstration"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Fix the missing colon."}],
                "agent": "main",
                "message_type": "observation",
            },
            {
                "role": "assistant",
                "content": "Search first.",
                "thought": "Search first.",
                "action": "find_file missing_colon.py",
                "agent": "main",
                "tool_calls": [
                    {"function": {"arguments": '{"file_name":"missing_colon.py"}', "name": "find_file"}, "id": "call_1", "type": "function"}
                ],
                "message_type": "action",
            },
            {"role": "tool", "content": "Found 1 matches", "agent": "main", "tool_call_ids": ["call_1"], "message_type": "observation"},
            {
                "role": "assistant",
                "content": "Submit.",
                "thought": "Submit.",
                "action": "submit",
                "agent": "main",
                "tool_calls": [{"function": {"arguments": "{}", "name": "submit"}, "id": "call_2", "type": "function"}],
                "message_type": "action",
            },
            {"role": "tool", "content": "diff --git ...", "agent": "main", "tool_call_ids": ["call_2"], "message_type": "observation"},
        ],
        "info": {
            "swe_agent_version": "1.1.0",
            "exit_status": "submitted (exit_cost)",
            "submission": "diff --git a/x b/x\n",
            "model_stats": {"instance_cost": 0.5, "tokens_sent": 52861, "tokens_received": 326, "api_calls": 2},
        },
        "replay_config": json.dumps({"agent": {"model": {"name": "openai/qwen3.6"}}}),
    }


def test_history_becomes_messages(tmp_path: Path) -> None:
    path = tmp_path / "owner__repo-1.traj"
    document = _document()
    path.write_text(json.dumps(document))
    (result,) = list(swe_agent.read(path))
    assert result.error is None, result.error
    t = result.trajectory
    assert [m.role for m in t.messages] == [m["role"] for m in document["history"]]
    assert [m.generated for m in t.messages] == [False, False, False, True, False, True, False]
    assert t.messages[2].content == "Fix the missing colon."
    assert t.messages[3].tool_calls[0].function.arguments == {"file_name": "missing_colon.py"}
    assert t.messages[4].tool_call_id == "call_1"
    assert t.messages[3].extra["thought"] == "Search first." and t.messages[3].extra["message_type"] == "action"
    assert t.task_id == "owner__repo-1"
    assert t.policy.name == "openai/qwen3.6"
    assert t.exit_status is ExitStatus.cost_exhausted  # autosubmitted after the cost limit
    assert t.final_patch == "diff --git a/x b/x\n"
    assert t.usage.input_tokens == 52861 and t.usage.api_calls == 2
    # Step records are kept; only their copies of the history are dropped, and that is said.
    assert t.source.records[0]["execution_time"] == 0.2 and "query" not in t.source.records[0]
    assert t.source.meta["dropped"] == ["trajectory[].query", "trajectory[].messages"]


def test_old_files_without_history_are_rebuilt_from_steps(tmp_path: Path) -> None:
    document = _document()
    del document["history"]
    path = tmp_path / "old.traj"
    path.write_text(json.dumps(document))
    (result,) = list(swe_agent.read(path))
    t = result.trajectory
    assert [m.role for m in t.messages] == ["assistant", "user", "assistant", "user"]
    assert t.messages[0].content == "Search first." and t.messages[1].content == "Found 1 matches"
    assert any("rebuilt from trajectory steps" in w for w in result.diagnostics.warnings)


def test_bad_files_are_located(tmp_path: Path) -> None:
    document = _document()
    document["history"][4]["tool_call_ids"] = []
    cases = {
        "no_call_ids": (document, "history[4].tool_call_ids: missing"),
        "not_traj": ({"hello": 1}, "trajectory: missing"),
        "bad_history": ({"history": "x", "trajectory": []}, "history: expected array, got string"),
    }
    for name, (doc, expected) in cases.items():
        path = tmp_path / f"{name}.traj"
        path.write_text(json.dumps(doc))
        (result,) = list(swe_agent.read(path))
        assert result.trajectory is None and expected in str(result.error), (name, str(result.error))
