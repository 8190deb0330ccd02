"""The installed ``relearn`` command, run as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from harness.scripted.codex_sessions import legacy_session, session, write_rollout
from records.pools import read_trajectories, write_atomic


def run(relearn_bin: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([relearn_bin, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_help_lists_the_verbs(relearn_bin: str) -> None:
    result = run(relearn_bin, "--help")
    assert result.returncode == 0
    for verb in ("import", "export", "validate"):
        assert verb in result.stdout
    for verb in ("import", "export", "validate"):
        sub = run(relearn_bin, verb, "--help")
        assert sub.returncode == 0 and "Usage: relearn " + verb in sub.stdout


def test_import_the_real_samples(relearn_bin: str, samples: Path, tmp_path: Path) -> None:
    codex_out, mini_out = tmp_path / "x.jsonl", tmp_path / "y.jsonl"
    result = run(relearn_bin, "import", "codex", str(samples / "codex_rollout_v0.135.0_exec.jsonl"), "-o", str(codex_out))
    assert result.returncode == 0, result.stderr
    assert "trajectories imported" in result.stdout
    (codex_t,) = list(read_trajectories(codex_out))
    assert [m.role for m in codex_t.messages] == ["system", "developer", "user", "user", "assistant"]

    result = run(relearn_bin, "import", "mini-swe-agent", str(samples / "mini_swe_agent_v1.13.4.traj.json"), "-o", str(mini_out))
    assert result.returncode == 0, result.stderr
    (mini_t,) = list(read_trajectories(mini_out))
    source = json.loads((samples / "mini_swe_agent_v1.13.4.traj.json").read_text())
    assert [m.role for m in mini_t.messages] == [m["role"] for m in source["messages"]]

    # Our format round-trips: reading a pool and writing it again gives the same bytes.
    for pool in (codex_out, mini_out):
        copy = tmp_path / f"copy-{pool.name}"
        write_atomic(copy, read_trajectories(pool))
        assert copy.read_bytes() == pool.read_bytes()

    # Our own files validate, and a second import of the same inputs adds nothing.
    assert run(relearn_bin, "validate", str(codex_out), str(mini_out)).returncode == 0
    again = run(relearn_bin, "import", "mini-swe-agent", str(samples / "mini_swe_agent_v1.13.4.traj.json"), "-o", str(mini_out))
    assert again.returncode == 0 and len(list(read_trajectories(mini_out))) == 1


def test_a_damaged_batch_goes_on_and_counts(relearn_bin: str, samples: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "sessions"
    inputs.mkdir()
    shutil.copy(samples / "codex_rollout_v0.135.0_exec.jsonl", inputs / "good-real.jsonl")
    write_rollout(inputs / "good-tools.jsonl", session())
    write_rollout(inputs / "good-legacy.jsonl", legacy_session())
    lines = [json.dumps(line) for line in session(session_id="cut")]
    (inputs / "truncated.jsonl").write_text("\n".join(lines[:5] + [lines[5][:50]] + lines[6:]) + "\n")
    (inputs / "empty.jsonl").write_text("")
    (inputs / "garbage.jsonl").write_bytes(bytes(range(256)) * 8)
    orphan = session(session_id="orphan")
    del orphan[8]  # the function_call whose output follows
    write_rollout(inputs / "orphan.jsonl", orphan)
    wrong_type = session(session_id="wrongtype")
    wrong_type[5]["payload"]["content"] = 42
    write_rollout(inputs / "wrong-type.jsonl", wrong_type)
    unknown = session(session_id="unknown")
    unknown.insert(2, {"timestamp": "2026-06-05T04:58:00.000Z", "type": "quantum_event", "payload": {"spin": 1}})
    write_rollout(inputs / "unknown.jsonl", unknown)

    pool = tmp_path / "pool.jsonl"
    result = run(relearn_bin, "import", "codex", str(inputs), "-o", str(pool))
    both = result.stdout + result.stderr
    assert result.returncode == 1, both
    assert "Traceback" not in both
    for expected in (
        "truncated.jsonl:6: invalid JSON",
        "empty.jsonl: empty file",
        "garbage.jsonl: not UTF-8",
        "orphan.jsonl:11: payload.call_id: output for call_id 'call_0'",
        "wrong-type.jsonl:6: payload.content: expected array, got integer",
        "unknown.jsonl:3: unknown line type 'quantum_event'",
    ):
        assert expected in " ".join(both.split()), expected
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in result.stdout.splitlines() if line.count("│") == 3}
    assert rows["files read"] == "9"
    assert rows["trajectories imported"] == "4"
    assert rows["files rejected"] == "5"
    assert rows["unknown line type 'quantum_event' (kept)"] == "1"
    assert len(list(read_trajectories(pool))) == 4


def test_exports(relearn_bin: str, tmp_path: Path) -> None:
    rollout = tmp_path / "r.jsonl"
    write_rollout(rollout, session(steps=2))
    pool = tmp_path / "pool.jsonl.zst"
    assert run(relearn_bin, "import", "codex", str(rollout), "-o", str(pool)).returncode == 0
    chat = tmp_path / "chat.jsonl"
    result = run(relearn_bin, "export", "hf", str(pool), "-o", str(chat))
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in chat.read_text().splitlines()]
    assert row["messages"][0]["role"] == "system" and row["id"].startswith("codex-")
    atif_dir = tmp_path / "atif"
    assert run(relearn_bin, "export", "atif", str(pool), "-o", str(atif_dir)).returncode == 0
    (document,) = [json.loads(p.read_text()) for p in atif_dir.glob("*.json")]
    assert document["schema_version"] == "ATIF-v1.7"
    reimported = tmp_path / "again.jsonl"
    assert run(relearn_bin, "import", "atif", str(atif_dir), "-o", str(reimported)).returncode == 0


def test_usage_errors_exit_2(relearn_bin: str, tmp_path: Path) -> None:
    missing = run(relearn_bin, "import", "codex", str(tmp_path / "nope"), "-o", str(tmp_path / "p.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "empty_dir").mkdir()
    nothing = run(relearn_bin, "import", "codex", str(tmp_path / "empty_dir"), "-o", str(tmp_path / "p.jsonl"))
    assert nothing.returncode == 2 and "no codex files" in nothing.stderr
    bad_format = run(relearn_bin, "import", "cursor", str(tmp_path), "-o", str(tmp_path / "p.jsonl"))
    assert bad_format.returncode == 2


def test_validate_reports_broken_pools(relearn_bin: str, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    good = {"schema_version": "1.0", "messages": [{"role": "assistant", "content": "x", "generated": True}]}
    orphan_result = {"schema_version": "1.0", "messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}]}
    newer = dict(good, schema_version="3.0")
    pool.write_text("\n".join(json.dumps(r) for r in (good, orphan_result, newer)) + "\n{\n")
    result = run(relearn_bin, "validate", str(pool))
    both = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1
    assert "'c9' answers no call" in both
    assert f"{pool}:3: major version" in both or f"{pool}:3: Value error, schema_version" in both
    assert f"{pool}:4: invalid JSON" in both


def test_validate_names_both_lines_of_a_repeated_id(relearn_bin: str, tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    record = {"schema_version": "1.0", "id": "t-1", "messages": [{"role": "assistant", "content": "x", "generated": True}]}
    other = dict(record, id="t-2")
    first.write_text(json.dumps(other) + "\n" + json.dumps(record) + "\n")
    second.write_text(json.dumps(record) + "\n")
    result = run(relearn_bin, "validate", str(first), str(second))
    assert result.returncode == 1
    # A path may be folded by the terminal's width: compare without the line breaks.
    text = "".join((result.stdout + result.stderr).split())
    assert f"{second}:1:t-1:repeatedtrajectoryid,firstat{first}:2".replace(" ", "") in text
