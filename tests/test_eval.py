"""`relearn eval` on the mini suite with scripted policies served over HTTP, and on the
real SWE-bench Verified parquet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from swebench.harness.utils import make_test_spec

from envs.tasks import load_tasks
from envs.verify import swebench_test_spec
from eval.dataset import Selection, load_dataset_tasks
from eval.report import bootstrap_ci, mcnemar_exact, paired_bootstrap
from harness.scripted.servers import ModelServer
from harness.scripted.solutions import flailer, solver

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
TASKS = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
IDS = ["mini__calc-1", "mini__ledger-1", "mini__pager-1", "mini__textkit-1"]
SOLVES = {"mini__calc-1", "mini__pager-1"}


def eval_run(relearn_bin: str, out: Path, server: ModelServer, *extra: str) -> subprocess.Popen[str]:
    command = [relearn_bin, "eval", "run", "--out", str(out), "--model", "scripted", "--base-url", server.base_url, "--workers", "2"]
    command += [arg for iid in IDS for arg in ("--id", iid)] + list(extra)
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OPENAI_API_KEY": "local"},
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=900)
    return process.returncode, stdout, stderr


def report_of(relearn_bin: str, run: Path) -> dict:
    result = subprocess.run([relearn_bin, "eval", "report", str(run)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Resolved" in result.stdout
    return json.loads((run / "report.json").read_text())


@pytest.fixture(scope="module")
def runs(relearn_bin: str, base_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    out = {"solver": root / "solver", "never": root / "never", "flailer": root / "flailer", "flailer_big_budget": root / "flailer2"}
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        assert finish(eval_run(relearn_bin, out["solver"], server, "--max-turns", "3"))[0] == 0
    with ModelServer("chat", solver(TASKS, set())) as server:
        assert finish(eval_run(relearn_bin, out["never"], server, "--max-turns", "3"))[0] == 0
    with ModelServer("chat", flailer) as server:
        assert finish(eval_run(relearn_bin, out["flailer"], server, "--max-turns", "3"))[0] == 0
        assert finish(eval_run(relearn_bin, out["flailer_big_budget"], server, "--max-turns", "4"))[0] == 0
    return out


def test_reports_give_exactly_the_expected_resolved_sets(relearn_bin: str, runs: dict[str, Path]) -> None:
    solver_report = report_of(relearn_bin, runs["solver"])
    assert solver_report["resolved_ids"] == sorted(SOLVES)
    assert solver_report["unresolved_ids"] == sorted(set(IDS) - SOLVES)
    assert solver_report["by_exit_status"] == {"submitted": 4}
    assert solver_report["by_repo"]["relearn-mini/calc"] == {"instances": 1, "resolved": 1, "rate": 1.0}
    assert report_of(relearn_bin, runs["never"])["resolved_ids"] == []
    flail = report_of(relearn_bin, runs["flailer"])
    assert flail["resolved_ids"] == [] and flail["by_exit_status"] == {"turns_exhausted": 4}
    assert flail["tokens_per_instance"]["mean"] == 3 * 1100
    manifest = json.loads((runs["solver"] / "manifest.json").read_text())
    assert manifest["budget"]["max_turns"] == 3 and manifest["scaffold"]["tools"] == ["shell", "apply_patch", "update_plan"]
    assert sorted(manifest["image_digests"]) == sorted(IDS) and manifest["policy"]["model"] == "scripted"
    predictions = [json.loads(line) for line in (runs["solver"] / "predictions.jsonl").read_text().splitlines()]
    assert {p["instance_id"] for p in predictions} == set(IDS)
    assert all(p["model_patch"] for p in predictions if p["instance_id"] in SOLVES)
    assert json.loads((runs["solver"] / "reports" / "mini__calc-1.json").read_text())["resolved"] is True


def test_compare_pairs_runs_and_refuses_different_budgets(relearn_bin: str, runs: dict[str, Path], tmp_path: Path) -> None:
    result = subprocess.run(
        [
            relearn_bin,
            "eval",
            "compare",
            str(runs["never"]),
            str(runs["solver"]),
            "--name",
            "Upstream",
            "--name",
            "ROSS",
            "-o",
            str(tmp_path / "cmp"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    ross = data["runs"][1]
    assert data["paired_instances"] == 4 and ross["resolved"] == 2 and ross["only_this"] == 2 and ross["only_baseline"] == 0
    assert ross["mcnemar_p"] == pytest.approx(0.5)
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000
    assert "| ROSS | scripted | 2 | 50.0%" in (tmp_path / "cmp" / "compare.md").read_text()
    refused = subprocess.run(
        [relearn_bin, "eval", "compare", str(runs["flailer"]), str(runs["flailer_big_budget"])], capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2 and "budget.max_turns: 3 vs 4" in " ".join(refused.stderr.split())


def test_a_killed_run_resumes_to_the_same_report(relearn_bin: str, runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "killed"
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        process = eval_run(relearn_bin, out, server, "--max-turns", "3")
        pool = out / "trajectories.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (not pool.exists() or not pool.read_text().strip()):
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert len(pool.read_text().splitlines()) < 4
        code, stdout, stderr = finish(eval_run(relearn_bin, out, server, "--max-turns", "3"))
    assert code == 0, stderr
    assert "already done" in stdout
    resumed, uninterrupted = report_of(relearn_bin, out), report_of(relearn_bin, runs["solver"])
    for key in (
        "resolved_ids",
        "unresolved_ids",
        "by_exit_status",
        "by_repo",
        "by_difficulty",
        "tokens_per_instance",
        "resolved_rate_ci95",
        "infra_errors",
    ):
        assert resumed[key] == uninterrupted[key], key
    # A different run in the same folder is refused, naming what differs.
    with ModelServer("chat", flailer) as server:
        code, _stdout, stderr = finish(eval_run(relearn_bin, out, server, "--max-turns", "9"))
    assert code == 2 and "budget.max_turns: 3 vs 9" in " ".join(stderr.split())


@pytest.mark.slow  # loads the 500 Verified rows and builds swebench test specs
def test_verified_parquet_and_its_eval_scripts(samples: Path) -> None:
    tasks, errors = load_dataset_tasks(str(samples / "swebench_verified.parquet"))
    assert len(tasks) == 500 and not errors
    import pyarrow.parquet as pq

    rows = {row["instance_id"]: row for row in pq.read_table(samples / "swebench_verified.parquet").to_pylist()}
    for task in tasks[::50]:
        row = rows[task.instance_id]
        assert task.FAIL_TO_PASS == json.loads(row["FAIL_TO_PASS"]) and task.PASS_TO_PASS == json.loads(row["PASS_TO_PASS"])
        assert swebench_test_spec(task, task.base_commit).eval_script == make_test_spec(row).eval_script
    django = Selection(repos=("django/django",), difficulties=("<15 min fix",), slice=":5").apply(tasks)
    assert len(django) == 5 and all(t.repo == "django/django" and t.difficulty == "<15 min fix" for t in django)
    with pytest.raises(ValueError, match="not in the dataset: nope"):
        Selection(ids=("nope",)).apply(tasks)
    with pytest.raises(ValueError, match="not a local file"):
        load_dataset_tasks("no-such-org/no-such-dataset")


def test_statistics() -> None:
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(3, 3) == 1.0
    low, high = bootstrap_ci([True] * 60 + [False] * 40)
    assert 0.49 < low < 0.52 and 0.68 < high < 0.71
    assert paired_bootstrap([False] * 10, [True] * 10) == (1.0, 1.0)


def test_a_moved_endpoint_is_the_same_run_but_another_model_is_not() -> None:
    from eval.run import differences

    a = {"policy": {"model": "m", "base_url": "http://127.0.0.1:4001/v1"}, "seed": 0}
    assert differences(a, {"policy": {"model": "m", "base_url": "http://127.0.0.1:4999/v1"}, "seed": 0}) == []
    assert differences(a, {"policy": {"model": "n", "base_url": "http://127.0.0.1:4001/v1"}, "seed": 0}) == ["policy.model: 'm' vs 'n'"]
