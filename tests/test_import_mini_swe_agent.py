from __future__ import annotations

import json
from pathlib import Path

from harness.importers import mini_swe_agent
from records.pools import read_trajectories, write_atomic
from records.trajectory import ExitStatus


def _read(path: Path):  # noqa: ANN202
    (result,) = list(mini_swe_agent.read(path))
    return result


def test_real_v1_trajectory(samples: Path, tmp_path: Path) -> None:
    path = samples / "mini_swe_agent_v1.13.4.traj.json"
    source = json.loads(path.read_text())
    result = _read(path)
    assert result.error is None
    t = result.trajectory
    assert [m.role for m in t.messages] == [m["role"] for m in source["messages"]]
    assert len(t.messages) == len(source["messages"]) == 8
    for ours, theirs in zip(t.messages, source["messages"], strict=False):
        content = theirs["content"]
        text = content if isinstance(content, str) else "\n".join(p["text"] for p in content)
        assert ours.content == text
        assert ours.generated == (theirs["role"] == "assistant")
    assert t.exit_status is ExitStatus.submitted
    assert t.final_patch == ""
    assert t.policy.name == source["info"]["config"]["model"]["model_name"]
    assert t.source.format_version == "1.13.4"
    assert t.usage.cost_usd == source["info"]["model_stats"]["instance_cost"] and t.usage.api_calls == 3
    first_answer = t.messages[2]
    assert first_answer.usage.input_tokens == 752 and first_answer.usage.output_tokens == 69
    # Nothing the file carried is lost: parts with cache_control and the raw API response stay.
    assert t.messages[3].extra["content_parts"] == source["messages"][3]["content"]
    assert first_answer.extra["extra"] == source["messages"][2]["extra"]
    assert t.source.meta["info"] == source["info"]
    # And our own file round-trips byte for byte.
    write_atomic(tmp_path / "a.jsonl", [t])
    write_atomic(tmp_path / "b.jsonl", read_trajectories(tmp_path / "a.jsonl"))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def _v2_document() -> dict:
    """A tool-calling mini-swe-agent v2 run (trajectory_format mini-swe-agent-1.1)."""
    return {
        "info": {
            "model_stats": {"instance_cost": 0.02, "api_calls": 2},
            "config": {"agent": {"step_limit": 250, "cost_limit": 3.0}, "model": {"model_name": "hosted_vllm/qwen3.6"}},
            "mini_version": "2.4.6",
            "exit_status": "Submitted",
            "submission": "diff --git a/calc.py b/calc.py\n",
        },
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix add()."},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Look first.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat calc.py"}'}}
                ],
                "extra": {"actions": [{"command": "cat calc.py"}], "cost": 0.01, "timestamp": 1760078127.5},
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "def add(a, b): return a - b", "extra": {"returncode": 0}},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}'},
                    }
                ],
                "extra": {"cost": 0.01},
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "", "extra": {"returncode": 0}},
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted", "submission": "diff --git a/calc.py b/calc.py\n"}},
        ],
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "demo__calc-1",
    }


def test_v2_tool_calling_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "demo__calc-1.traj.json"
    path.write_text(json.dumps(_v2_document()))
    result = _read(path)
    assert result.error is None, result.error
    t = result.trajectory
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert t.task_id == "demo__calc-1"
    call = t.messages[2].tool_calls[0]
    assert call.function.arguments == {"command": "cat calc.py"}
    assert t.messages[2].reasoning_content == "Look first."
    assert t.messages[2].timestamp.startswith("2025-10-10T")
    assert t.messages[3].metadata == {"exit_code": 0}
    assert t.source.records[0]["record"]["role"] == "exit"
    assert t.final_patch.startswith("diff --git")


def test_exit_statuses_map_to_our_vocabulary(tmp_path: Path) -> None:
    doc = _v2_document()
    cases = {
        "LimitsExceeded": ExitStatus.turns_exhausted,
        "TimeExceeded": ExitStatus.time_exhausted,
        "RepeatedFormatError": ExitStatus.format_error,
        "DockerTimeoutError": ExitStatus.env_error,
    }
    for raw, expected in cases.items():
        doc["info"]["exit_status"] = raw
        path = tmp_path / f"{raw}.traj.json"
        path.write_text(json.dumps(doc))
        assert _read(path).trajectory.exit_status is expected
    doc["info"]["exit_status"] = "LimitsExceeded"
    doc["info"]["model_stats"]["instance_cost"] = 3.2
    path = tmp_path / "cost.traj.json"
    path.write_text(json.dumps(doc))
    assert _read(path).trajectory.exit_status is ExitStatus.cost_exhausted


def test_bad_documents_are_located(tmp_path: Path) -> None:
    doc = _v2_document()
    doc["messages"][3] = {"role": "tool", "content": "x"}
    cases = {
        "missing_id": (doc, "messages[3].tool_call_id: missing"),
        "no_messages": ({"info": {}}, "messages: missing"),
        "bad_role_type": ({"messages": [{"role": 5}]}, "messages[0].role: expected string, got integer"),
        "bad_content": ({"messages": [{"role": "user", "content": 12}]}, "messages[0].content: expected string or array, got integer"),
    }
    for name, (document, expected) in cases.items():
        path = tmp_path / f"{name}.traj.json"
        path.write_text(json.dumps(document))
        result = _read(path)
        assert result.trajectory is None and expected in str(result.error), (name, str(result.error))
    truncated = tmp_path / "cut.traj.json"
    truncated.write_text(json.dumps(_v2_document())[:300])
    assert "invalid JSON" in str(_read(truncated).error)
