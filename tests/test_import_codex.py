from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import zstandard

from harness.exporters.hf_chat import to_chat_messages
from harness.import_run import discover, import_files
from harness.importers import codex
from harness.scripted.codex_sessions import (
    PATCH,
    envelope,
    legacy_session,
    session,
    text_message,
    token_count,
    write_rollout,
)
from records.pools import read_trajectories
from records.trajectory import ExitStatus, Trajectory


def _one(path: Path, salvage: bool = False) -> Trajectory:
    (result,) = list(codex.read(path, salvage=salvage))
    assert result.error is None, str(result.error)
    assert result.trajectory is not None
    return result.trajectory


def _error(path: Path) -> str:
    (result,) = list(codex.read(path))
    assert result.trajectory is None and result.error is not None
    return str(result.error)


def test_real_exec_rollout(samples: Path) -> None:
    path = samples / "codex_rollout_v0.135.0_exec.jsonl"
    t = _one(path)
    response_messages = [
        json.loads(line)["payload"]
        for line in path.read_text().splitlines()
        if json.loads(line)["type"] == "response_item" and json.loads(line)["payload"]["type"] == "message"
    ]
    # One message per response_item message, after the system message made from base_instructions.
    assert t.messages[0].role == "system" and t.messages[0].content == "[REDACTED_BASE_INSTRUCTIONS]"
    assert [m.role for m in t.messages[1:]] == [p["role"] for p in response_messages]
    assert [m.content for m in t.messages[1:]] == [p["content"][0]["text"] for p in response_messages]
    assert [m.generated for m in t.messages] == [False, False, False, False, True]
    assert t.id == "codex-019e9625-802f-7e91-840a-cfe88d14117a"
    assert t.policy.name == "gpt-5.5" and t.policy.provider == "openai"
    assert t.source and t.source.format == "codex" and t.source.format_version == "0.135.0"
    assert t.exit_status is ExitStatus.submitted
    assert t.messages[-1].usage and t.messages[-1].usage.output_tokens == 10
    # Every line that is not a message is kept verbatim, with its line number.
    kept = {r["line"]: r["record"]["type"] for r in t.source.records or []}
    assert kept == {1: "session_meta", 2: "event_msg", 5: "turn_context", 10: "event_msg", 11: "event_msg"}


def test_tool_calls_reasoning_and_usage(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    write_rollout(path, session(steps=2))
    t = _one(path)
    roles = [m.role for m in t.messages]
    assert roles == ["system", "developer", "user", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    first = t.messages[4]
    assert first.reasoning_content == "I should read calc.py first, step 0. "  # raw reasoning preferred to the summary
    call = first.tool_calls[0]
    assert call.function.name == "shell" and call.function.arguments["command"] == ["bash", "-lc", "cat calc.py"]
    assert first.usage.input_tokens == 1000
    tool = t.messages[5]
    assert tool.tool_call_id == "call_0" and tool.name == "shell" and tool.content.startswith("Process exited with code 0")
    assert tool.metadata["exit_code"] == 0  # from exec_command_end
    patch_msg = t.messages[8]
    assert patch_msg.reasoning_content == "Patch the sign."
    assert patch_msg.content == "The function subtracts; I will fix the operator."
    patch_call = patch_msg.tool_calls[0]
    assert patch_call.type == "custom" and patch_call.function.arguments == {"input": PATCH}
    assert t.messages[-1].content == "Fixed: add() now returns a + b." and t.messages[-1].usage.output_tokens == 20
    assert t.usage.total_tokens == 2120
    assert all(m.generated == (m.role == "assistant") for m in t.messages)
    # HF chat messages: one system message, developer text as user, tool results paired.
    chat = to_chat_messages(t)
    assert chat[0] == {"role": "system", "content": "You are Codex, a coding agent.\n\n" + t.messages[1].content}
    assert chat[3]["tool_calls"][0]["function"]["arguments"] == {
        "command": ["bash", "-lc", "cat calc.py"],
        "workdir": "/repo",
        "timeout_ms": 10000,
    }


def test_legacy_layout(tmp_path: Path) -> None:
    path = tmp_path / "rollout-2025-08-01T10-00-00-5973b6c0.jsonl"
    write_rollout(path, legacy_session())
    t = _one(path)
    assert t.source.meta["layout"] == "legacy"
    assert t.id == "codex-5973b6c0-94b8-487b-a530-2aeb6098ae0e"
    assert [m.role for m in t.messages] == [
        "system",
        "user",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    read_output = t.messages[4]
    assert read_output.content == "def add(a, b):\n    return a - b\n"  # decoded from the legacy JSON string
    assert read_output.metadata == {"exit_code": 0, "duration_seconds": 0.1}
    heredoc_call = t.messages[5].tool_calls[0]
    assert "*** Begin Patch" in heredoc_call.function.arguments["command"][2]
    assert t.messages[7].tool_calls[0].function.name == "update_plan"
    assert t.messages[3].reasoning_content == ""  # encrypted only: the text is not available
    assert t.messages[3].extra["reasoning_items"][0]["reasoning_kind"] == "encrypted"
    # Bare state lines carry nothing; the meta line is kept.
    assert [r["line"] for r in t.source.records] == [1]


def test_compaction_is_a_context_reset(tmp_path: Path) -> None:
    lines = session()[:7] + [
        envelope("response_item", text_message("assistant", "Working on it.")),
        envelope("event_msg", token_count(100, 5)),
        envelope(
            "compacted",
            {
                "message": "summary",
                "replacement_history": [
                    text_message("user", "Fix add() in calc.py: it subtracts."),
                    text_message("assistant", "Working on it."),
                    {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "old_call"},
                ],
            },
        ),
        envelope("response_item", text_message("assistant", "Continuing after compaction.")),
    ]
    path = tmp_path / "r.jsonl"
    write_rollout(path, lines)
    t = _one(path)
    (reset,) = t.context_resets
    replayed = t.messages[reset.message_index : reset.message_index + 3]
    assert [m.role for m in replayed] == ["user", "assistant", "assistant"]
    assert not any(m.generated for m in replayed)  # history is context, never supervised twice
    assert t.messages[-1].generated and t.messages[-1].content == "Continuing after compaction."
    # Masks render the turn after the compaction after the instructions and the replacement
    # history only: what Codex sent with that call.
    from records.trajectory import Outcome
    from relearn.masks.compile import CompileOptions, compile_trajectory
    from relearn.masks.tokenizers import load_tokenizer

    tok = load_tokenizer("qwen3.6")
    samples = compile_trajectory(t.model_copy(update={"outcome": Outcome(resolved=True)}), None, tok, CompileOptions(mode="positive"))
    assert [s.sample_id for s in samples] == [t.id + "#r0", t.id + "#r1"]
    after = tok.decode(samples[1].input_ids.tolist())
    assert after.startswith("<|im_start|>system\n" + t.messages[0].content.strip()[:40])
    assert "Fix add() in calc.py: it subtracts." in after and after.count("Working on it.") == 1  # the replayed copy only


def test_walks_session_trees_including_zstd(tmp_path: Path, samples: Path) -> None:
    day = tmp_path / "sessions" / "2026" / "06" / "05"
    day.mkdir(parents=True)
    shutil.copy(samples / "codex_rollout_v0.135.0_exec.jsonl", day / "rollout-a.jsonl")
    archived = tmp_path / "archived_sessions"
    archived.mkdir()
    raw = "".join(json.dumps(line) + "\n" for line in session(session_id="zst-session"))
    (archived / "rollout-b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw.encode()))
    (day / "notes.txt").write_text("not a rollout")
    files = discover("codex", [tmp_path])
    assert [f.name for f in files] == ["rollout-b.jsonl.zst", "rollout-a.jsonl"]
    summary = import_files("codex", files, tmp_path / "pool.jsonl")
    assert summary.imported == 2 and not summary.rejected
    # A rerun adds nothing: ids are stable.
    again = import_files("codex", files, tmp_path / "pool.jsonl")
    assert again.imported == 0 and again.skipped_existing == 2
    assert len(list(read_trajectories(tmp_path / "pool.jsonl"))) == 2


def test_a_resumed_session_is_imported_again_under_a_new_id(tmp_path: Path) -> None:
    """Codex appends to a session's file when it is resumed: same session id, more content."""
    path, pool = tmp_path / "rollout.jsonl", tmp_path / "pool.jsonl"
    lines = session()
    write_rollout(path, lines)
    assert import_files("codex", [path], pool).imported == 1
    write_rollout(
        path,
        lines
        + [
            envelope("response_item", text_message("user", "And add tests.")),
            envelope("response_item", text_message("assistant", "Added.")),
        ],
    )
    grown = import_files("codex", [path], pool)
    assert grown.imported == 1 and any("other content under this id" in w for w in grown.warnings)
    ids = [t.id for t in read_trajectories(pool)]
    assert ids[0] == "codex-019e0000-0000-7000-8000-000000000001" and ids[1].startswith(ids[0] + "~")
    # Importing the grown file once more adds nothing.
    again = import_files("codex", [path], pool)
    assert again.imported == 0 and again.skipped_existing == 1


def test_unknown_types_and_fields_are_kept_and_counted(tmp_path: Path) -> None:
    lines = session()
    lines.insert(3, envelope("hologram", {"shape": "cube"}))
    lines.insert(4, envelope("response_item", {"type": "telepathy", "thought": "x"}))
    lines[5]["payload"]["brand_new_field"] = 7
    path = tmp_path / "r.jsonl"
    write_rollout(path, lines)
    (result,) = list(codex.read(path))
    t = result.trajectory
    assert t is not None
    assert result.diagnostics.unknown == {"line type 'hologram'": 1, "response item 'telepathy'": 1}
    kept = [r["record"] for r in t.source.records]
    assert {"timestamp": lines[3]["timestamp"], "type": "hologram", "payload": {"shape": "cube"}} in kept
    assert any(r["payload"].get("type") == "telepathy" for r in kept)


def test_line_fields_beside_the_payload_are_kept_and_counted(tmp_path: Path) -> None:
    """Codex 0.171 numbers each line (``ordinal``) and can add ``metadata``: on lines that become
    messages as on lines kept whole, nothing of it is lost, and each field is counted."""
    lines = [{**line, "ordinal": number} for number, line in enumerate(session())]
    lines[5]["metadata"] = {"history_sequence": 4, "retained_source": "rollout"}
    path = tmp_path / "r.jsonl"
    write_rollout(path, lines)
    (result,) = list(codex.read(path))
    t = result.trajectory
    assert t is not None and t.source is not None and t.source.records is not None
    assert result.diagnostics.unknown == {"line field 'ordinal'": len(lines), "line field 'metadata'": 1}
    ordinals = {r["record"]["ordinal"] for r in t.source.records if "record" in r} | {
        r["line_fields"]["ordinal"] for r in t.source.records if "line_fields" in r
    }
    assert ordinals == set(range(len(lines)))
    (fields,) = [r for r in t.source.records if r.get("line") == 6]
    assert fields == {
        "line": 6,
        "at_message": 3,
        "line_fields": {"ordinal": 5, "metadata": {"history_sequence": 4, "retained_source": "rollout"}},
    }
    # The messages are what they are without the fields.
    write_rollout(path, session())
    (plain,) = list(codex.read(path))
    assert plain.trajectory is not None and [m.content for m in plain.trajectory.messages] == [m.content for m in t.messages]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        # A truncated line in the middle of the file.
        (lambda lines: lines[:5] + [json.dumps(lines[5])[:40]] + lines[6:], ":6: invalid JSON"),
        # An output whose call never happened.
        (lambda lines: lines[:8] + lines[9:], ":11: payload.call_id: output for call_id 'call_0': no earlier call"),
        # Arguments must be a string in the rollout format.
        (
            lambda lines: [
                {**line, "payload": {**line["payload"], "arguments": {"command": "ls"}}}
                if line["payload"].get("type") == "function_call"
                else line
                for line in lines
            ],
            ":9: payload.arguments: expected string, got object",
        ),
        # content must be a list of parts.
        (
            lambda lines: lines[:5] + [{**lines[5], "payload": {**lines[5]["payload"], "content": "plain"}}] + lines[6:],
            ":6: payload.content: expected array, got string",
        ),
        # A call left unanswered while the session went on.
        (lambda lines: lines[:11] + lines[12:], "call 'call_0' has no function_call_output, yet the session went on"),
    ],
)
def test_broken_structure_is_rejected_with_a_location(tmp_path: Path, mutate, expected: str) -> None:  # noqa: ANN001
    lines = [json.dumps(line) if isinstance(line, dict) else line for line in mutate(session())]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    message = _error(path)
    assert message.startswith(str(path)) and expected in message


def test_salvage_keeps_what_parses(tmp_path: Path) -> None:
    lines = [json.dumps(line) for line in session()]
    lines[5] = lines[5][:30]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (result,) = list(codex.read(path, salvage=True))
    assert result.trajectory is not None
    assert result.trajectory.source.meta["skipped_lines"] == [6]
    assert any("skipped (salvage)" in w for w in result.diagnostics.warnings)


def test_session_ending_during_a_call_is_a_warning(tmp_path: Path) -> None:
    lines = session()[:9]  # ends right after the first function_call
    path = tmp_path / "r.jsonl"
    write_rollout(path, lines)
    (result,) = list(codex.read(path))
    assert result.trajectory is not None
    assert result.trajectory.exit_status is ExitStatus.aborted
    assert any("ended during the call" in w for w in result.diagnostics.warnings)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty file"),
        (b"\n\n", "empty file"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe garbage", "not UTF-8"),
        (b"[1, 2, 3]\n", "expected a JSON object"),
        (b'{"hello": "world"}\n', "no messages"),
    ],
)
def test_unusable_files(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    assert expected in _error(path)


def test_invalid_json_arguments_are_kept_verbatim(tmp_path: Path) -> None:
    lines = session()
    for line in lines:
        if line["payload"].get("type") == "function_call":
            line["payload"]["arguments"] = '{"command": ["ls"'
    path = tmp_path / "r.jsonl"
    write_rollout(path, lines)
    (result,) = list(codex.read(path))
    call = result.trajectory.messages[4].tool_calls[0]
    assert call.function.arguments == {} and call.raw_arguments == '{"command": ["ls"'
    assert any("not a JSON object" in w for w in result.diagnostics.warnings)
