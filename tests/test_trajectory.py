from __future__ import annotations

import pytest
from pydantic import ValidationError

from records.trajectory import ExitStatus, Message, Trajectory, content_id


def _trajectory(**overrides: object) -> Trajectory:
    data = {
        "task_id": "demo__calc-1",
        "policy": {"name": "qwen3.6-35b-a3b", "checkpoint": "ckpt-120", "step": 120},
        "attempt": 2,
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix add()."},
            {
                "role": "assistant",
                "reasoning_content": "Read the file.",
                "tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": {"command": ["cat", "calc.py"]}}}],
                "generated": True,
                "token_ids": [1, 2, 3],
                "logprobs": [-0.1, -0.2, -0.3],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b): return a - b", "metadata": {"exit_code": 0}},
            {"role": "assistant", "content": "Done.", "generated": True},
        ],
        "exit_status": "submitted",
        "outcome": {"reward": 1.0, "resolved": True},
    }
    data.update(overrides)
    return Trajectory.model_validate(data)


def test_id_is_stable_and_depends_on_content() -> None:
    a, b = _trajectory(), _trajectory()
    assert a.id == b.id and a.id.startswith("t-")
    changed = _trajectory(attempt=3)
    assert changed.id != a.id
    # Fields that describe the import, not the episode, do not change the id.
    assert _trajectory(source={"format": "codex", "path": "/elsewhere.jsonl"}).id == a.id
    assert content_id(a) == a.id


def test_given_id_is_kept() -> None:
    assert _trajectory(id="codex-abc").id == "codex-abc"


def test_unknown_fields_survive_a_round_trip() -> None:
    data = _trajectory().to_dict()
    data["future_field"] = {"x": 1}
    data["messages"][2]["tool_calls"][0]["function"]["future"] = True
    data["messages"][0]["weight"] = 0.5
    again = Trajectory.model_validate(data).to_dict()
    assert again == data


def test_newer_major_schema_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValidationError, match="major version 2"):
        _trajectory(schema_version="2.0")
    assert _trajectory(schema_version="1.7").schema_version == "1.7"


def test_role_rules() -> None:
    with pytest.raises(ValidationError, match="tool_call_id"):
        Message(role="tool", content="x")
    with pytest.raises(ValidationError, match="only belong on assistant"):
        Message.model_validate({"role": "user", "tool_calls": [{"id": "c", "function": {"name": "f"}}]})
    with pytest.raises(ValidationError):
        Message.model_validate({"role": "robot"})


def test_arguments_must_be_an_object() -> None:
    with pytest.raises(ValidationError, match="arguments"):
        Message.model_validate({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}]})


def test_exit_status_vocabulary() -> None:
    assert _trajectory().exit_status is ExitStatus.submitted
    with pytest.raises(ValidationError):
        _trajectory(exit_status="finished-ish")
