"""`relearn envs` and `relearn verify` run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


@pytest.mark.docker  # `envs gc` asks the engine, through no fixture
def test_envs_usage_errors(relearn_bin: str, tmp_path: Path) -> None:
    assert run(relearn_bin, "envs", "build", "--id", "no-such-task").returncode == 2
    assert run(relearn_bin, "verify", "-p", str(tmp_path / "missing.jsonl")).returncode == 2
    gc = run(relearn_bin, "envs", "gc")
    assert gc.returncode == 0 and "removed" in gc.stdout


TASK_VERBS = [("verify",), ("collect",), ("replay",), ("eval", "run"), ("envs", "check-image"), ("envs", "audit")]
VERIFIED = Path(__file__).resolve().parents[2] / "shared" / "samples" / "swebench_verified.parquet"


def test_every_verb_that_runs_tasks_takes_the_image_and_limit_options(relearn_bin: str) -> None:
    for verb in TASK_VERBS:
        result = run(relearn_bin, *verb, "--help")
        assert result.returncode == 0, result.stderr
        for option in ("--image-map", "--image-template", "--pull", "--cpus", "--memory"):
            assert option in result.stdout, (verb, option)
    for verb in (("envs", "load"), ("envs", "build-swebench")):
        assert "--image-template" in run(relearn_bin, *verb, "--help").stdout


def test_image_and_limit_options_are_checked_before_anything_runs(relearn_bin: str, tmp_path: Path) -> None:
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text(json.dumps({"instance_id": "mini__calc-1", "model_patch": ""}) + "\n")
    template = run(relearn_bin, "verify", "-p", str(predictions), "--image-template", "mirror/{instance}:latest")
    assert template.returncode == 2 and "unknown placeholder {instance}" in " ".join(template.stderr.split())
    memory = run(relearn_bin, "verify", "-p", str(predictions), "--memory", "plenty")
    assert memory.returncode == 2 and "--memory 'plenty'" in memory.stderr
    bad_map = tmp_path / "images.txt"
    bad_map.write_text("mini__calc-1\n")
    mapped = run(relearn_bin, "verify", "-p", str(predictions), "--image-map", str(bad_map))
    assert mapped.returncode == 2 and "images.txt:1: expected `INSTANCE_ID IMAGE`" in " ".join(mapped.stderr.split())
    one = run(relearn_bin, "envs", "check-image", "-t", "mini", "some/image:1")
    assert one.returncode == 2 and "IMAGE is checked against one task" in one.stderr


def test_build_swebench_refuses_what_it_cannot_build_and_says_why(relearn_bin: str) -> None:
    refused = run(relearn_bin, "envs", "build-swebench", "-t", str(VERIFIED), "-i", "astropy__astropy-12907", "--repo", "/nowhere")
    text = " ".join(refused.stderr.split())
    assert refused.returncode == 1 and "astropy/astropy is not supported by the offline builder" in text and "compiles C extensions" in text
    mixed = run(
        relearn_bin,
        "envs",
        "build-swebench",
        "-t",
        str(VERIFIED),
        "-i",
        "sympy__sympy-24562",
        "-i",
        "django__django-11099",
        "--repo",
        "/nowhere",
    )
    assert mixed.returncode == 2 and "--repo is one repository" in mixed.stderr
    missing = run(relearn_bin, "envs", "build-swebench", "-t", str(VERIFIED), "-i", "sympy__sympy-24562", "--repo", "/nowhere")
    assert missing.returncode == 2 and "no such directory, and not a clone URL" in missing.stderr


def test_check_image_on_a_mini_task(relearn_bin: str, base_image: str) -> None:
    result = run(relearn_bin, "envs", "check-image", "--id", "mini__calc-1")
    assert result.returncode == 0, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "keeps the contract" in text and "the test runner (python -m pytest)" in text and "pytest collects the task's test files" in text
