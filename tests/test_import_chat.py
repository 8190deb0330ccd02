"""Chat-message datasets: the four presets' row shapes (built here, as the published sets
write them) in JSON Lines, a JSON array and Parquet; column flags; source training masks;
streaming Parquet; damaged rows; and `relearn export chat` back to the same rows."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.exporters.chat import export_chat, to_row
from harness.import_run import import_files
from harness.importers import FORMATS, chat, rows
from records.pools import read_trajectories, write_atomic
from records.trajectory import ExitStatus, Trajectory, tool_call_pairs

PATCH = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    }
]


def _call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def swe_gym_row(n: int) -> dict[str, Any]:
    """SWE-Gym (OpenHands sampled trajectories): OpenAI messages, arguments as JSON text,
    every message with every key (null where unused), as its Parquet holds them."""
    empty = {"tool_calls": None, "tool_call_id": None, "name": None}
    return {
        "instance_id": f"getmoto__moto-{n}",
        "run_id": "sonnet-t0-run1",
        "messages": [
            {"role": "system", "content": "You are OpenHands agent.", **empty},
            {"role": "user", "content": f"Fix issue {n}.", **empty},
            {"role": "assistant", "content": "Let me look.", **empty, "tool_calls": [_call(f"toolu_{n}a", "execute_bash", command="ls")]},
            {"role": "tool", "content": "a.py", **empty, "tool_call_id": f"toolu_{n}a", "name": "execute_bash"},
            {"role": "assistant", "content": "Fixed.", **empty, "tool_calls": [_call(f"toolu_{n}b", "finish")]},
            {"role": "tool", "content": "", **empty, "tool_call_id": f"toolu_{n}b", "name": "finish"},
        ],
        "resolved": n % 2 == 0,
        "test_result": {"git_patch": PATCH, "exit_code": 0},
    }


def swe_smith_row(n: int) -> dict[str, Any]:
    """SWE-smith: role/content only; the actions live in the assistant text, the observations
    are user turns."""
    return {
        "instance_id": f"pandas-dev__pandas.95280573.pr_{n}",
        "traj_id": f"pandas-dev__pandas.95280573.pr_{n}.abc",
        "model": "claude-3-7-sonnet-20250219",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            {"role": "user", "content": "<uploaded_files>/testbed</uploaded_files> Fix it."},
            {"role": "assistant", "content": "THOUGHT: look first.\n\n```bash\nls /testbed\n```"},
            {"role": "user", "content": "OBSERVATION:\nsetup.py pandas"},
            {"role": "assistant", "content": "```bash\nsubmit\n```"},
        ],
        "resolved": True,
        "patch": PATCH,
    }


def nebius_row(n: int) -> dict[str, Any]:
    """nebius/SWE-agent-trajectories: `trajectory` of system/user/ai turns with `text` and a
    per-turn training `mask`; `target` is resolved."""
    return {
        "instance_id": f"sympy__sympy-{n}",
        "model_name": "swe-agent-llama-70b",
        "target": True,
        "trajectory": [
            {"role": "system", "text": "SETTING: You are an autonomous programmer.", "mask": False},
            {"role": "user", "text": "We're currently solving the following issue.", "mask": False},
            {"role": "ai", "text": "DISCUSSION\nFirst list the files.\n```\nls\n```", "mask": True},
            {"role": "user", "text": "setup.py\nsympy\n(Open file: n/a)", "mask": False},
            {"role": "ai", "text": "DISCUSSION\nA wrong guess.\n```\nedit 1:1\n```", "mask": False},
            {"role": "user", "text": "Your edit failed.", "mask": False},
            {"role": "ai", "text": "```\nsubmit\n```", "mask": True},
        ],
        "exit_status": "submitted",
        "generated_patch": PATCH,
        "eval_logs": "Will execute following command for apply_patch: ... PASSED",
    }


def rebench_row(n: int, parts: bool = True) -> dict[str, Any]:
    """nebius/SWE-rebench-openhands-trajectories: `trajectory` of OpenAI messages with tool
    calls, `tools`, `model_patch`, `exit_status`, `resolved` (0/1). ``parts``: one content as
    a list of parts (JSON only: an Arrow column cannot mix text and lists)."""
    return {
        "trajectory_id": f"traj-{n}",
        "instance_id": f"owner__project-{n}",
        "repo": "owner/project",
        "trajectory": [
            {"role": "system", "content": "You are OpenHands agent."},
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}] if parts else "Fix the bug."},
            {
                "role": "assistant",
                "content": "I will run the tests.",
                "tool_calls": [_call(f"call_{n}", "execute_bash", command="pytest -q")],
            },
            {"role": "tool", "content": "1 failed", "tool_call_id": f"call_{n}", "name": "execute_bash"},
            {"role": "assistant", "content": "Done."},
        ],
        "tools": TOOLS,
        "model_patch": PATCH,
        "exit_status": "submitted",
        "resolved": n % 2,
    }


PRESET_ROWS = {"swe-gym": swe_gym_row, "swe-smith": swe_smith_row, "nebius-swe-agent": nebius_row, "swe-rebench-openhands": rebench_row}
MESSAGES_COLUMN = {"swe-gym": "messages", "swe-smith": "messages", "nebius-swe-agent": "trajectory", "swe-rebench-openhands": "trajectory"}


def write(path: Path, data: list[dict[str, Any]], **parquet: Any) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(data), path, **parquet)
    elif path.suffix == ".json":
        path.write_text(json.dumps(data))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def _import(path: Path, preset: str | None = None, **columns: str) -> list[Any]:
    return list(chat.read(path, options=chat.options_for(preset, **columns)))


def _ok(results: list[Any]) -> list[Trajectory]:
    assert [str(r.error) for r in results if r.error is not None] == []
    return [r.trajectory for r in results]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content", message.get("text"))
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
@pytest.mark.parametrize("preset", list(PRESET_ROWS))
def test_presets_in_every_file_form(tmp_path: Path, preset: str, suffix: str) -> None:
    data = [rebench_row(n, parts=suffix != ".parquet") if preset == "swe-rebench-openhands" else PRESET_ROWS[preset](n) for n in range(3)]
    trajectories = _ok(_import(write(tmp_path / f"rows{suffix}", data), preset))
    every_key = {k for raw in data for m in raw[MESSAGES_COLUMN[preset]] for k in m}
    assert len(trajectories) == len(data)
    for raw, t in zip(data, trajectories, strict=True):
        messages = raw[MESSAGES_COLUMN[preset]]
        # One message per row message, the same roles (ai -> assistant), the same text.
        assert [m.role for m in t.messages] == [{"ai": "assistant"}.get(m["role"], m["role"]) for m in messages]
        assert [m.content for m in t.messages] == [_text(m) for m in messages]
        calls = [c for m in messages for c in m.get("tool_calls") or []]
        made = [c for m in t.messages for c in m.tool_calls or []]
        assert [(c.id, c.function.name, c.function.arguments) for c in made] == [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
        ]
        answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert [m.tool_call_id for m in t.messages if m.role == "tool"] == answers
        pairs, answered = tool_call_pairs(t.messages)
        assert set(pairs) == set(answered)  # every call has its result
        # The source's mask is its eligibility; without one every assistant turn is generated.
        masks = [m.get("mask", m["role"] in ("assistant", "ai")) for m in messages]
        assert [m.generated for m in t.messages] == [bool(k) and m.role == "assistant" for k, m in zip(masks, t.messages, strict=True)]
        assert t.source.format == "chat" and t.source.format_version == preset
        assert t.outcome.verdict["imported_from"] == "chat" and t.outcome.verdict["re_verified"] is False
        assert t.final_patch == PATCH
        # Null-filled keys (SWE-Gym's, and Parquet's everywhere) are dropped, never kept as data.
        assert all(None not in (m.extra or {}).values() for m in t.messages)
        assert not any("tool_call_id" in (m.extra or {}) for m in t.messages)
        filled = any(None in m.values() for m in messages) or (suffix == ".parquet" and any(set(m) != every_key for m in messages))
        assert ("dropped" in t.source.meta) == filled
        if filled:
            assert t.source.meta["dropped"][0].startswith("null-valued message keys")
    first = trajectories[0]
    if preset == "swe-gym":
        assert first.id == "chat-sonnet-t0-run1:getmoto__moto-0" and first.task_id == "getmoto__moto-0"
        assert [t.outcome.resolved for t in trajectories] == [True, False, True]
        # run_id is mapped (the id); test_result only reached into for its patch: the rest is kept.
        assert first.source.meta["columns"] == {"test_result": {"exit_code": 0}}
        assert first.source.meta["id_columns"] == {"run_id": "sonnet-t0-run1", "instance_id": "getmoto__moto-0"}
    elif preset == "swe-smith":
        assert first.id == f"chat-{data[0]['traj_id']}" and first.policy.name == "claude-3-7-sonnet-20250219"
        assert "```bash\nls /testbed\n```" in first.messages[2].content and first.messages[3].role == "user"
    elif preset == "nebius-swe-agent":
        assert first.outcome.resolved is True and first.exit_status is ExitStatus.submitted and first.policy.name == "swe-agent-llama-70b"
        assert first.messages[4].extra["mask"] is False and first.messages[2].extra["mask"] is True
        assert first.source.meta["source_mask"] == {"key": ["mask"], "assistant_turns_masked_out": 1}
        assert first.source.meta["columns"] == {"eval_logs": data[0]["eval_logs"]}
        assert first.messages[2].extra["source_role"] == "ai"
    else:
        assert first.id == "chat-traj-0" and [t.outcome.resolved for t in trajectories] == [False, True, False]
        assert first.tools == TOOLS  # Parquet's null-filled schema keys dropped, the schema as written
        if suffix != ".parquet":
            assert first.messages[1].extra["content_parts"] == data[0]["trajectory"][1]["content"]
        assert first.source.meta["columns"] == {"repo": "owner/project"}


def test_generic_rows_with_column_flags(tmp_path: Path) -> None:
    """A set of no preset: every column named by a flag, dotted paths into nested columns,
    several columns into one id, and unmapped columns kept and counted."""
    data = [
        {
            "conv": {
                "turns": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello", "token_ids": [9, 8], "logprobs": [-0.1, -0.2]},
                ]
            },
            "spec": json.dumps(TOOLS),
            "uid": "u1",
            "shard": 3,
            "task": "t-1",
            "grade": {"ok": "true"},
            "diff": PATCH,
            "split": "train",
        }
    ]
    path = write(tmp_path / "rows.jsonl", data)
    results = _import(path, None, messages="conv.turns", tools="spec", id="uid,shard", task_id="task", resolved="grade.ok", patch="diff")
    (t,) = _ok(results)
    assert [m.content for m in t.messages] == ["hi", "hello"]
    assert t.messages[1].token_ids == [9, 8] and t.messages[1].logprobs == [-0.1, -0.2]
    assert t.tools == TOOLS and t.id == "chat-u1:3" and t.task_id == "t-1" and t.outcome.resolved is True and t.final_patch == PATCH
    assert t.source.meta["columns"] == {"conv": {}, "grade": {}, "split": "train"}  # the rest of the columns reached into
    assert results[0].diagnostics.unknown == {"column 'split'": 1}


def test_damaged_rows_are_located_and_the_batch_goes_on(tmp_path: Path) -> None:
    good = rebench_row(1, parts=False) | {"resolved": "1"}  # text, so that Parquet can hold the bad "maybe" too
    unanswered = copy.deepcopy(good)
    unanswered["trajectory"][3]["tool_call_id"] = "call_nobody"
    bad_role = copy.deepcopy(good)
    bad_role["trajectory"][2]["role"] = "robot"
    bad_flag = good | {"resolved": "maybe"}
    no_messages = {k: v for k, v in good.items() if k != "trajectory"}
    bad_args = copy.deepcopy(good)
    bad_args["trajectory"][2]["tool_calls"][0]["function"]["arguments"] = "ls -la"
    data = [good, unanswered, bad_role, bad_flag, no_messages, bad_args]
    for suffix in (".jsonl", ".json", ".parquet"):
        path = write(tmp_path / f"rows{suffix}", data)
        results = _import(path, "swe-rebench-openhands")
        assert [r.trajectory is not None for r in results] == [True, False, False, False, False, True]
        where = [f"{path}:{n}: " if suffix == ".jsonl" else f"{path}: [{n - 1}]." for n in range(1, 7)]
        errors = [str(r.error) for r in results if r.error is not None]
        assert errors == [
            f"{where[1]}trajectory[3].tool_call_id: 'call_nobody' answers no earlier call",
            f"{where[2]}trajectory[2].role: unknown role 'robot'",
            f"{where[3]}resolved: expected true/false, got 'maybe'",
            f"{where[4]}trajectory: missing",
        ], suffix
        # Text that is not a JSON object stays what the model wrote, with a warning.
        kept = results[5].trajectory.messages[2].tool_calls[0]
        assert kept.raw_arguments == "ls -la" and kept.function.arguments == {}
    generic = _import(write(tmp_path / "plain.jsonl", [no_messages]))
    assert str(generic[0].error).endswith(
        "messages: missing (name the column with --messages, or choose a --preset: swe-gym, swe-smith, nebius-swe-agent, swe-rebench-openhands)"
    )
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    (result,) = _import(broken)
    assert str(result.error).startswith(f"{broken}: not a readable Parquet file")


def test_parquet_is_streamed_in_row_group_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are converted as each batch is read, so memory holds one batch, never the file."""
    data = [swe_gym_row(n) for n in range(50)]
    path = write(tmp_path / "rows.parquet", data, row_group_size=10)
    assert pq.ParquetFile(path).num_row_groups == 5
    monkeypatch.setattr(rows, "PARQUET_BATCH_ROWS", 8)
    pulled: list[int] = []
    original = pq.ParquetFile.iter_batches

    def counting(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        assert kwargs.get("batch_size") == 8
        for batch in original(self, *args, **kwargs):
            pulled.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    results = chat.read(path, options=chat.options_for("swe-gym"))
    first = next(iter(results))
    assert first.trajectory.task_id == "getmoto__moto-0"
    assert pulled == [8]  # one batch read for the first row, the rest not yet
    rest = list(results)
    assert len(rest) == 49 and sum(pulled) == 50 and max(pulled) <= 8
    assert [r.trajectory.task_id for r in rest][-1] == "getmoto__moto-49"


def test_export_round_trips_through_every_preset(tmp_path: Path) -> None:
    for preset, make in PRESET_ROWS.items():
        source = _ok(_import(write(tmp_path / f"{preset}.jsonl", [make(n) for n in range(2)]), preset))
        for suffix in (".jsonl", ".parquet"):
            out = tmp_path / f"{preset}-export{suffix}"
            summary = export_chat(iter(source), out, preset)
            assert summary.rows == 2 and summary.refused == []
            again = _ok(_import(out, preset))

            def shape(t: Trajectory) -> list[Any]:
                return [
                    (
                        m.role,
                        m.content or "",
                        m.reasoning_content,
                        [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []],
                        m.tool_call_id,
                        m.generated,
                    )
                    for m in t.messages
                ]

            assert [shape(t) for t in again] == [shape(t) for t in source], (preset, suffix)
            assert [(t.task_id, t.final_patch, t.outcome.resolved) for t in again] == [
                (t.task_id, t.final_patch, t.outcome.resolved) for t in source
            ], (preset, suffix)
            if suffix == ".jsonl":
                # The columns the first import kept come back too.
                written = [json.loads(line) for line in out.read_text().splitlines()]
                view = _exported_view(preset, make(0))
                assert {k: written[0].get(k) for k in view} == view, preset


def _exported_view(preset: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The columns of a source row that an export writes back unchanged."""
    view = {k: v for k, v in raw.items() if k not in (MESSAGES_COLUMN[preset], "resolved", "target")}
    return view


def test_export_refuses_what_a_preset_cannot_hold_and_keeps_training_fields() -> None:
    with_calls = Trajectory.model_validate(
        {
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "generated": True,
                    "token_ids": [1, 2],
                    "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": {}}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "a"},
                {"role": "assistant", "generated": False, "content": "not trained"},
            ]
        }
    )
    with pytest.raises(chat_export_refused(), match="nebius-swe-agent rows hold text turns only"):
        to_row(with_calls, "nebius-swe-agent")
    row = to_row(with_calls)
    assert row["messages"][1]["token_ids"] == [1, 2] and row["messages"][1]["mask"] is True and row["messages"][3]["mask"] is False
    assert row["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{}"


def chat_export_refused() -> type[Exception]:
    from harness.exporters.chat import Refused

    return Refused


def test_cli_import_and_export_chat(relearn_bin: str, tmp_path: Path) -> None:
    data = write(tmp_path / "gym.parquet", [swe_gym_row(n) for n in range(3)])
    pool = tmp_path / "pool.jsonl"
    imported = subprocess.run(
        [relearn_bin, "import", "chat", str(data), "--preset", "swe-gym", "-o", str(pool)], capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "trajectories imported" in imported.stdout and len(list(read_trajectories(pool))) == 3
    assert subprocess.run([relearn_bin, "validate", str(pool)], capture_output=True, text=True, timeout=120).returncode == 0
    again = subprocess.run(
        [relearn_bin, "import", "chat", str(data), "--preset", "swe-gym", "-o", str(pool)], capture_output=True, text=True, timeout=120
    )
    assert "already in the pool (skipped) │       3" in again.stdout
    flags = tmp_path / "flags.jsonl"
    write(flags, [{"turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "key": "k1", "ok": True}])
    by_flags = subprocess.run(
        [
            relearn_bin,
            "import",
            "chat",
            str(flags),
            "--messages",
            "turns",
            "--id",
            "key",
            "--resolved",
            "ok",
            "-o",
            str(tmp_path / "f.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert by_flags.returncode == 0, by_flags.stdout + by_flags.stderr
    (t,) = read_trajectories(tmp_path / "f.jsonl")
    assert t.id == "chat-k1" and t.outcome.resolved is True
    wrong = subprocess.run(
        [relearn_bin, "import", "codex", str(flags), "--messages", "turns", "-o", str(tmp_path / "x.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrong.returncode == 2 and "--messages only apply to the chat format" in wrong.stderr
    out = tmp_path / "smith.parquet"
    exported = subprocess.run(
        [relearn_bin, "export", "chat", str(pool), "--preset", "swe-smith", "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert pq.read_table(out).column_names == ["instance_id", "traj_id", "model", "messages", "resolved", "patch"]
    refused = subprocess.run(
        [relearn_bin, "export", "chat", str(pool), "--preset", "nebius-swe-agent", "-o", str(tmp_path / "n.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and "refused" in refused.stdout + refused.stderr


def test_a_configured_importer_reads_one_run_and_leaves_the_format_as_it_was(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", [nebius_row(1)])
    summary = import_files("chat", [path], tmp_path / "pool.jsonl", importer=chat.ChatImporter(chat.options_for("nebius-swe-agent")))
    assert summary.imported == 1 and FORMATS["chat"] is chat
    write_atomic(tmp_path / "copy.jsonl", read_trajectories(tmp_path / "pool.jsonl"))
    assert (tmp_path / "copy.jsonl").read_bytes() == (tmp_path / "pool.jsonl").read_bytes()
