"""`relearn envs` and `relearn verify` run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from envs.tasks import load_tasks
from tests.test_cli import run

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"


def test_verify_command_is_resumable(relearn_bin: str, base_image: str, tmp_path: Path) -> None:
    tasks, _ = load_tasks(MINI_SUITE)
    task = tasks[0]
    predictions = tmp_path / "preds.jsonl"
    rows = [
        {"instance_id": task.instance_id, "model_name_or_path": "gold", "model_patch": task.patch},
        {"instance_id": task.instance_id, "model_name_or_path": "empty", "model_patch": ""},
    ]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    verdicts = tmp_path / "verdicts.jsonl"
    first = run(relearn_bin, "verify", "-t", "mini", "-p", str(predictions), "-o", str(verdicts))
    assert first.returncode == 1, first.stderr  # one prediction line was unreadable
    assert "preds.jsonl:3: invalid JSON" in " ".join(first.stderr.split())
    assert "2 verified, 1 resolved" in first.stdout
    saved = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert sorted(v["resolved"] for v in saved) == [False, True]
    again = run(relearn_bin, "verify", "-t", "mini", "-p", str(predictions), "-o", str(verdicts))
    assert "0 verified, 0 resolved, 2 already verified" in again.stdout
    assert len(verdicts.read_text().splitlines()) == 2


def test_audit_command_flags_the_leaky_build(relearn_bin: str, base_image: str) -> None:
    tasks, _ = load_tasks(MINI_SUITE)
    exposed = next(t for t in tasks if "git_history_exposes_fix" in t.model_extra["features"])
    leaky = run(relearn_bin, "envs", "audit", "--id", exposed.instance_id, "--leaky")
    assert leaky.returncode == 1 and "EXPOSED" in leaky.stdout and "1 of 1 task images expose" in leaky.stdout
    clean = run(relearn_bin, "envs", "audit", "--id", exposed.instance_id)
    assert clean.returncode == 0 and "clean" in clean.stdout


def test_envs_usage_errors(relearn_bin: str, tmp_path: Path) -> None:
    assert run(relearn_bin, "envs", "build", "--id", "no-such-task").returncode == 2
    assert run(relearn_bin, "verify", "-p", str(tmp_path / "missing.jsonl")).returncode == 2
    gc = run(relearn_bin, "envs", "gc")
    assert gc.returncode == 0 and "removed" in gc.stdout
