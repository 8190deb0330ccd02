"""OpenHands: the real saved event streams and the flat resolver output, an evaluation
``output.jsonl`` built from a real stream, GUI bookkeeping events, damaged records.

Expected counts are walked out of the raw JSON here, independently of the importer."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.import_run import import_files
from harness.importers import openhands
from records.pools import read_trajectories, write_atomic
from records.trajectory import ExitStatus, Trajectory, tool_call_pairs

EVENT_FILES = ["openhands_trajs_basic.json", "openhands_trajs_basic_interactions.json", "openhands_trajs_wrong_initial_state.json"]


def _read(path: Path) -> list[Any]:
    return list(openhands.read(path))


def _one(path: Path) -> Trajectory:
    (result,) = _read(path)
    assert result.error is None, result.error
    assert result.trajectory is not None
    return result.trajectory


def _expected_from_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a faithful import must hold, counted straight from the events: one assistant
    message per distinct model response (or per agent action that has none), the calls those
    responses made, one result per observation answering a call, usage summed per response."""
    responses: dict[str, dict[str, Any]] = {}
    assistant = users = 0
    calls: list[str] = []
    call_of_action: dict[Any, str] = {}
    for event in events:
        if "action" not in event:
            continue
        if event["action"] == "message" and event.get("source") == "user":
            users += 1
            continue
        tcm = event.get("tool_call_metadata") or {}
        response = tcm.get("model_response")
        if response:
            if response["id"] not in responses:
                responses[response["id"]] = response
                assistant += 1
                calls += [c["id"] for c in response["choices"][0]["message"].get("tool_calls") or []]
            call_of_action[event["id"]] = tcm["tool_call_id"]
        else:
            assistant += 1
    results = [call_of_action[e["cause"]] for e in events if "observation" in e and e.get("cause") in call_of_action]
    usage = {
        "input": sum(r["usage"]["prompt_tokens"] for r in responses.values()),
        "output": sum(r["usage"]["completion_tokens"] for r in responses.values()),
    }
    finish = [tcm["tool_call_id"] for e in events if e.get("action") == "finish" and (tcm := e.get("tool_call_metadata"))]
    return {
        "users": users,
        "assistant": assistant,
        "calls": calls,
        "results": results,
        "usage": usage,
        "finish": finish,
        "responses": responses,
    }


def _calls(t: Trajectory) -> list[str]:
    return [c.id for m in t.messages for c in m.tool_calls or []]


@pytest.mark.parametrize("name", EVENT_FILES)
def test_real_event_streams(samples: Path, tmp_path: Path, name: str) -> None:
    path = samples / name
    events = json.loads(path.read_text())
    expected = _expected_from_events(events)
    t = _one(path)
    roles = [m.role for m in t.messages]
    assert roles.count("user") == expected["users"]
    assert roles.count("assistant") == expected["assistant"]
    assert roles.count("tool") == len(expected["results"])
    assert len(t.messages) == expected["users"] + expected["assistant"] + len(expected["results"])
    assert _calls(t) == expected["calls"]
    assert [m.tool_call_id for m in t.messages if m.role == "tool"] == expected["results"]
    # Every call has its result, except finish, which OpenHands never answers.
    calls, results = tool_call_pairs(t.messages)
    assert set(calls) - set(results) == set(expected["finish"])
    assert all(calls[c] < results[c] for c in results)
    assert t.usage.input_tokens == expected["usage"]["input"] and t.usage.output_tokens == expected["usage"]["output"]
    assert t.usage.api_calls == len(expected["responses"])
    # The model's messages are what it generated: text and calls from the model response.
    for message in (m for m in t.messages if m.role == "assistant" and m.extra.get("model_response")):
        body = message.extra["model_response"]["choices"][0]["message"]
        assert message.content == body["content"] and message.generated
        assert [c.function.arguments for c in message.tool_calls or []] == [
            json.loads(c["function"]["arguments"]) for c in body.get("tool_calls") or []
        ]
        assert message.usage.input_tokens == message.extra["model_response"]["usage"]["prompt_tokens"]
    assert t.exit_status is ExitStatus.submitted  # each of these ends on finish
    assert t.policy.name == next(iter(expected["responses"].values()))["model"]
    # Nothing lost: each action event is kept on its message, each observation's fields on its result.
    kept = [e for m in t.messages for e in (m.extra or {}).get("openhands_events", [])]
    kept += [m.extra["openhands_event"] for m in t.messages if m.extra and "openhands_event" in m.extra]
    kept += [r["record"] for r in t.source.records or []]
    assert sorted(e.get("id") for e in kept) == sorted(e["id"] for e in events)
    write_atomic(tmp_path / "a.jsonl", [t])
    write_atomic(tmp_path / "b.jsonl", read_trajectories(tmp_path / "a.jsonl"))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_exit_codes_and_command_output_as_the_agent_saw_it(samples: Path) -> None:
    events = json.loads((samples / "openhands_trajs_wrong_initial_state.json").read_text())
    run = next(e for e in events if e.get("observation") == "run")
    t = _one(samples / "openhands_trajs_wrong_initial_state.json")
    (result,) = [m for m in t.messages if m.role == "tool" and m.metadata]
    assert result.metadata == {"exit_code": run["extras"]["metadata"]["exit_code"]}
    assert result.content == run["content"] + run["extras"]["metadata"]["suffix"]
    assert result.name == "execute_bash"
    # The observation repeated its action's tool_call_metadata: dropped once, and said so.
    assert "tool_call_metadata" not in result.extra["openhands_event"]
    assert t.source.meta["dropped"] == ["observation tool_call_metadata (a copy of its action's)"]


def test_real_flat_resolver_output(samples: Path, tmp_path: Path) -> None:
    path = samples / "openhands_resolver_output_legacy.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    results = _read(path)
    assert [r.error for r in results] == [None] * len(records)
    for record, result in zip(records, results, strict=True):
        t = result.trajectory
        history = record["history"]
        actions = [e for e in history if "action" in e and e["action"] != "message"]
        observations = [e for e in history if "observation" in e]
        assert [m.role for m in t.messages].count("user") == sum(e.get("action") == "message" for e in history)
        assert [m.role for m in t.messages].count("assistant") == len(actions)
        assert [m.role for m in t.messages].count("tool") == len(observations)
        # Rebuilt from thought + arguments: each action is a call, each observation answers the one before it.
        assert [c.function.name for m in t.messages for c in m.tool_calls or []] == [e["action"] for e in actions]
        assistants = [m for m in t.messages if m.role == "assistant"]
        assert [m.content for m in assistants] == [e["thought"] for e in actions]
        for message, action in zip(assistants, actions, strict=True):
            assert message.tool_calls[0].extra["rebuilt"] is True
            argument = {"run": "command", "run_ipython": "code", "finish": "outputs"}[action["action"]]
            assert message.tool_calls[0].function.arguments[argument] == action[argument]
        calls, answered = tool_call_pairs(t.messages)
        assert set(calls) - set(answered) == {c.id for m in assistants for c in m.tool_calls if c.function.name == "finish"}
        tools = [m for m in t.messages if m.role == "tool"]
        assert [m.content for m in tools] == [e["content"] for e in observations]
        assert [(m.metadata or {}).get("exit_code") for m in tools] == [e.get("exit_code") for e in observations]
        assert t.task_id == f"{record['issue']['owner']}/{record['issue']['repo']}#{record['issue']['number']}"
        assert t.final_patch == record["git_patch"]
        assert t.usage.cost_usd == record["metrics"]["accumulated_cost"] and t.usage.api_calls == len(record["metrics"]["costs"])
        assert t.outcome.resolved is record["success"] and t.outcome.verdict["imported_from"] == "openhands"
        assert t.outcome.verdict["re_verified"] is False
        assert t.source.meta["result_explanation"] == record["result_explanation"] and t.source.meta["layout"] == "flat"
    pool = tmp_path / "pool.jsonl"
    summary = import_files("openhands", [path], pool)
    assert summary.imported == len(records) and not summary.rejected


def _evaluation_record(samples: Path) -> dict[str, Any]:
    """An evaluation output.jsonl record, built around the real basic stream: event 0 the
    system action with the prompt and tools, then the events, then the run's fields."""
    events = json.loads((samples / "openhands_trajs_basic.json").read_text())
    tools = [
        {
            "type": "function",
            "function": {"name": "str_replace_editor", "description": "Edit files", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    system = {
        "id": -1,
        "timestamp": "2025-01-27T22:44:56.0",
        "source": "agent",
        "message": "You are OpenHands.",
        "action": "system",
        "args": {"content": "You are OpenHands.", "tools": tools, "openhands_version": "0.39.0", "agent_class": "CodeActAgent"},
    }
    history = [system, *copy.deepcopy(events)]
    history[2]["llm_metrics"] = {"accumulated_cost": 0.01, "accumulated_token_usage": {"prompt_tokens": 3486, "completion_tokens": 1135}}
    return {
        "instance_id": "django__django-11099",
        "instruction": events[0]["args"]["content"],
        "metadata": {
            "llm_config": {"model": "litellm_proxy/claude-3-5-sonnet-20241022"},
            "agent_class": "CodeActAgent",
            "max_iterations": 100,
        },
        "history": history,
        "test_result": {"git_patch": "diff --git a/game.py b/game.py\n", "report": {"resolved": True, "failed_apply_patch": False}},
        "metrics": {
            "accumulated_cost": 0.0321,
            "accumulated_token_usage": {"prompt_tokens": 8132, "completion_tokens": 1312, "cache_read_tokens": 3482},
            "costs": [0.01, 0.0221],
        },
        "error": None,
        "instance": {"repo": "django/django", "base_commit": "abc"},
        "run_host": "node-7",
    }


def test_evaluation_output_jsonl(samples: Path, tmp_path: Path) -> None:
    record = _evaluation_record(samples)
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (result,) = _read(path)
    assert result.error is None, result.error
    t = result.trajectory
    assert t.messages[0].role == "system" and t.messages[0].content == "You are OpenHands."
    assert t.tools == record["history"][0]["args"]["tools"] and t.source.format_version == "0.39.0"
    assert t.task_id == "django__django-11099" and t.final_patch == record["test_result"]["git_patch"]
    assert t.policy.name == "litellm_proxy/claude-3-5-sonnet-20241022"
    assert t.outcome.resolved is True and t.outcome.verdict["source_fields"]["field"] == "test_result.report.resolved"
    assert (t.usage.input_tokens, t.usage.output_tokens, t.usage.cached_input_tokens, t.usage.cost_usd) == (8132, 1312, 3482, 0.0321)
    assert t.source.meta["instance"] == record["instance"] and t.source.meta["metadata"]["max_iterations"] == 100
    # The per-action metrics stay on the action's event; an unknown record field is kept and counted.
    assert t.messages[2].extra["openhands_events"][0]["llm_metrics"] == record["history"][2]["llm_metrics"]
    assert t.source.meta["run_host"] == "node-7" and result.diagnostics.unknown["record field 'run_host'"] == 1
    assert openhands.discover(tmp_path) == [path]


def test_errors_map_to_exit_statuses(samples: Path, tmp_path: Path) -> None:
    cases = {
        "Agent reached maximum iteration in headless mode": ExitStatus.turns_exhausted,
        "Task budget exceeded": ExitStatus.cost_exhausted,
        "litellm.ContextWindowExceededError: too long": ExitStatus.context_overflow,
        "RuntimeError: sandbox died": ExitStatus.env_error,
    }
    for index, (error, status) in enumerate(cases.items()):
        record = _evaluation_record(samples)
        record["history"] = [e for e in record["history"] if e.get("action") != "finish"]
        record["error"] = error
        path = tmp_path / f"output-{index}.jsonl"
        path.write_text(json.dumps(record) + "\n")
        (result,) = _read(path)
        assert result.trajectory.exit_status is status, error


def test_one_response_with_two_calls_and_gui_bookkeeping(tmp_path: Path) -> None:
    """Two actions cut from one model response are one assistant message; state changes,
    null observations and recall events are bookkeeping the model never read."""
    response = {
        "id": "chatcmpl-1",
        "model": "qwen3.6",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "Look at both.",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'}},
                        {"id": "c2", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "pwd"}'}},
                    ],
                }
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }
    tcm = lambda call: {"function_name": "execute_bash", "tool_call_id": call, "model_response": response, "total_calls_in_response": 2}  # noqa: E731
    events = [
        {"id": 0, "source": "user", "action": "message", "args": {"content": "Where am I?"}},
        {"id": 1, "source": "user", "action": "recall", "args": {"query": "Where am I?", "recall_type": "workspace_context"}},
        {"id": 2, "source": "environment", "observation": "recall", "content": "Added workspace context", "cause": 1, "extras": {}},
        {"id": 3, "source": "environment", "observation": "agent_state_changed", "content": "", "extras": {"agent_state": "running"}},
        {
            "id": 4,
            "source": "agent",
            "action": "run",
            "args": {"command": "ls", "thought": "Look at both."},
            "tool_call_metadata": tcm("c1"),
        },
        {"id": 5, "source": "agent", "action": "run", "args": {"command": "pwd", "thought": ""}, "tool_call_metadata": tcm("c2")},
        {
            "id": 6,
            "source": "agent",
            "observation": "run",
            "content": "a.py",
            "cause": 4,
            "extras": {"metadata": {"exit_code": 0}},
            "tool_call_metadata": tcm("c1"),
        },
        {
            "id": 7,
            "source": "agent",
            "observation": "run",
            "content": "/ws",
            "cause": 5,
            "extras": {"metadata": {"exit_code": 0}},
            "tool_call_metadata": tcm("c2"),
        },
        {"id": 8, "source": "environment", "observation": "null", "content": "", "cause": None, "extras": {}},
        {
            "id": 9,
            "source": "environment",
            "observation": "agent_state_changed",
            "content": "",
            "extras": {"agent_state": "awaiting_user_input"},
        },
    ]
    path = tmp_path / "gui.json"
    path.write_text(json.dumps(events))
    t = _one(path)
    assert [m.role for m in t.messages] == ["user", "assistant", "tool", "tool"]
    assert _calls(t) == ["c1", "c2"] and [m.tool_call_id for m in t.messages[2:]] == ["c1", "c2"]
    assert [e["id"] for e in t.messages[1].extra["openhands_events"]] == [4, 5]
    assert t.usage.input_tokens == 100 and t.usage.api_calls == 1  # one response, counted once
    assert [r["record"]["id"] for r in t.source.records] == [1, 2, 3, 8, 9]
    assert t.exit_status is ExitStatus.aborted  # left waiting for the user


def test_damaged_records_are_located_and_the_batch_goes_on(samples: Path, tmp_path: Path) -> None:
    good = _evaluation_record(samples)
    no_history = {k: v for k, v in good.items() if k != "history"}
    bad_event = copy.deepcopy(good)
    bad_event["history"][2]["args"] = "not an object"
    bad_call = copy.deepcopy(good)
    bad_call["history"][4]["tool_call_metadata"]["model_response"]["choices"][0]["message"]["tool_calls"][0]["function"] = {
        "arguments": "{}"
    }
    path = tmp_path / "output.jsonl"
    lines = [
        json.dumps(good),
        '{"instance_id": "cut',
        json.dumps(no_history),
        json.dumps(bad_event),
        json.dumps(bad_call),
        json.dumps(good | {"instance_id": "x__y-2"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    results = _read(path)
    errors = [str(r.error) for r in results if r.error is not None]
    assert [r.trajectory.task_id for r in results if r.trajectory is not None] == ["django__django-11099", "x__y-2"]
    assert errors[0].startswith(f"{path}:2: invalid JSON")
    assert errors[1] == f"{path}:3: history: missing"
    assert errors[2] == f"{path}:4: history[2].args: expected object, got string"
    assert errors[3] == f"{path}:5: history[4].tool_call_metadata.model_response.choices[0].message.tool_calls[0].function.name: missing"


def test_cli_imports_and_validates_every_sample(relearn_bin: str, samples: Path, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    files = [str(samples / n) for n in [*EVENT_FILES, "openhands_resolver_output_legacy.jsonl"]]
    result = subprocess.run([relearn_bin, "import", "openhands", *files, "-o", str(pool)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(read_trajectories(pool))) == 5
    check = subprocess.run([relearn_bin, "validate", str(pool)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout
