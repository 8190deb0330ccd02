"""`relearn import harbor`: Harbor job folders, one trajectory per trial, with the trial's grade.

The trial folders here are built as Harbor 0.25/0.26 writes them (``harbor.models.trial``:
``TrialResult``, ``AgentContext`` with ``rollout_details``, ``ExceptionInfo``; ATIF v1.8 from
terminus-2; the codex agent's raw rollout beside its ATIF conversion; the oracle's folder with
no trajectory; a trial that crashed before its result). The real job folders in
``tests/fixtures/harbor/`` are read by the tests at the end of this file.
"""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.import_run import discover, import_files
from harness.importers import harbor
from harness.importers.harbor import NO_RESULT, HarborImporter, HarborOptions
from harness.scripted.codex_sessions import session, write_rollout
from records.pools import read_trajectories
from records.trajectory import ExitStatus, Trajectory, is_verified_positive
from relearn.ops.importing import count_pool, run_import
from relearn.verbs.importing import ImportOptions

JOB_STARTED = "2026-12-06T10:00:00.000000Z"
FIXTURES = Path(__file__).parent / "fixtures" / "harbor"


# ---------------------------------------------------------------- trial folders as Harbor writes them


def _atif(turns: int, *, version: str = "ATIF-v1.8", with_ids: bool = False) -> dict[str, Any]:
    """terminus-2's trajectory.json: a system prompt, then one agent step per model call, each
    with a command (terminus sends keystrokes: no tool calls) and what the terminal showed."""
    steps: list[dict[str, Any]] = [
        {"step_id": 1, "timestamp": "2026-12-06T10:00:05Z", "source": "system", "message": "You are an AI assistant in a terminal."},
        {"step_id": 2, "timestamp": "2026-12-06T10:00:05Z", "source": "user", "message": "Fix add() in calc.py so the tests pass."},
    ]
    for turn in range(turns):
        metrics: dict[str, Any] = {"prompt_tokens": 100 + turn, "completion_tokens": 3, "cost_usd": 0.0}
        if with_ids:
            metrics |= {"prompt_token_ids": [9, 9, turn], "completion_token_ids": [7, 7, turn], "logprobs": [-0.5, -0.5, -0.5]}
        steps.append(
            {
                "step_id": len(steps) + 1,
                "timestamp": f"2026-12-06T10:00:{10 + turn:02d}Z",
                "source": "agent",
                "model_name": "openai/scripted",
                "message": f'{{"analysis": "turn {turn}", "commands": [{{"keystrokes": "cat calc.py\\n"}}]}}',
                "observation": {"results": [{"content": f"$ cat calc.py\ndef add(a, b):\n    return a - b  # {turn}\n"}]},
                "metrics": metrics,
            }
        )
    return {
        "schema_version": version,
        "session_id": "f3c1e2d4-0000-4000-8000-000000000000",
        "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "openai/scripted"},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": 100 * turns, "total_completion_tokens": 3 * turns, "total_steps": len(steps)},
    }


def _rollout_details(turns: int) -> list[dict[str, Any]]:
    return [
        {
            "prompt_token_ids": [[1, 2, 3, turn] for turn in range(turns)],
            "completion_token_ids": [[40 + turn, 41, 42] for turn in range(turns)],
            "logprobs": [[-0.1, -0.2, -0.3] for _ in range(turns)],
        },
        {"prompt_token_ids": [[5]], "completion_token_ids": [[6]], "logprobs": [[-1.0]]},  # a summarisation sub-agent
    ]


def _trial(
    job: Path,
    task: str,
    *,
    agent: str = "terminus-2",
    model: str | None = "openai/scripted",
    rewards: dict[str, float] | None = None,
    exception: str | None = None,
    atif: dict[str, Any] | None = None,
    rollout: list[dict[str, Any]] | None = None,
    rollout_details: list[dict[str, Any]] | None = None,
    patch: str | None = None,
    stdout: str = "",
    started: str = "2026-12-06T10:00:01.000000Z",
    result: bool = True,
) -> tuple[Path, str]:
    """One trial folder, ``<task>__<7 chars>``, as TrialPaths lays it out; returns it and its id."""
    trial_id = str(uuid.uuid4())
    name = f"{task}__{trial_id[:7]}"
    folder = job / name
    for sub in ("agent", "verifier", "artifacts"):
        (folder / sub).mkdir(parents=True)
    task_config = {"path": f"/work/tasks/{task}", "git_url": None, "overwrite": False, "source": "fixtures"}
    config = {"schema_version": 1, "task": task_config, "trial_name": name, "trials_dir": str(job), "agent": {"name": agent}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "trial.log").write_text("")
    manifest = [{"source": "/logs/artifacts", "destination": "artifacts", "type": "directory", "status": "ok"}]
    (folder / "artifacts" / "manifest.json").write_text(json.dumps(manifest))
    if atif is not None:
        (folder / "agent" / "trajectory.json").write_text(json.dumps(atif, indent=2))
    if rollout is not None:
        day = folder / "agent" / "sessions" / "2026" / "12" / "06"
        day.mkdir(parents=True)
        write_rollout(day / "rollout-2026-12-06T10-00-02-0001.jsonl", rollout)
    if agent == "oracle":
        (folder / "agent" / "oracle.txt").write_text("patched\n")
    if patch is not None:
        (folder / "artifacts" / "model.patch").write_text(patch)
    if rewards is not None:
        (folder / "verifier" / "reward.txt").write_text(str(rewards.get("reward", 0)))
        (folder / "verifier" / "test-stdout.txt").write_text(stdout)
    if not result:
        return folder, trial_id
    exception_info = None
    if exception is not None:
        exception_info = {
            "exception_type": exception,
            "exception_message": f"{exception} raised",
            "exception_traceback": "Traceback (most recent call last):\n  ...",
            "occurred_at": "2026-12-06T10:00:30.000000Z",
        }
        (folder / "exception.txt").write_text(exception_info["exception_traceback"])
    document = {
        "id": trial_id,
        "task_name": f"fixtures/{task}",
        "trial_name": name,
        "trial_uri": f"file://{folder}",
        "task_id": {"path": f"/work/tasks/{task}"},
        "source": "fixtures",
        "task_checksum": "c0ffee",
        "config": config,
        "agent_info": {"name": agent, "version": "2.0.0", "model_info": {"name": model, "provider": "openai"} if model else None},
        "agent_result": {
            "n_input_tokens": 1200,
            "n_cache_tokens": 200,
            "n_output_tokens": 30,
            "cost_usd": 0.25,
            "rollout_details": rollout_details,
            "metadata": {"n_episodes": 2},
        },
        "verifier_result": {"rewards": rewards} if rewards is not None else None,
        "exception_info": exception_info,
        "started_at": started,
        "finished_at": "2026-12-06T10:00:40.000000Z",
        "environment_setup": {"started_at": started, "finished_at": "2026-12-06T10:00:02.000000Z"},
        "agent_setup": None,
        "agent_execution": {"started_at": "2026-12-06T10:00:03.000000Z", "finished_at": "2026-12-06T10:00:30.000000Z"},
        "verifier": {"started_at": "2026-12-06T10:00:31.000000Z", "finished_at": "2026-12-06T10:00:39.000000Z"},
    }
    (folder / "result.json").write_text(json.dumps(document, indent=2))
    return folder, trial_id


PATCH = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)


def _job(root: Path, *, token_ids: bool = True) -> dict[str, tuple[Path, str]]:
    """A job folder of six trials: terminus-2 solving (with the RL run's token ids), terminus-2
    failing, a timeout, the codex agent (rollout + ATIF + a patch), the oracle, and a crashed
    trial."""
    job = root / "jobs" / "2026-12-06__10-00-00"
    job.mkdir(parents=True)
    (job / "config.json").write_text(json.dumps({"job_name": "2026-12-06__10-00-00", "jobs_dir": str(root / "jobs"), "n_attempts": 2}))
    (job / "result.json").write_text(json.dumps({"id": str(uuid.uuid4()), "started_at": JOB_STARTED, "n_total_trials": 6, "stats": {}}))
    trials = {
        "solved": _trial(
            job, "fix-add", atif=_atif(2), rollout_details=_rollout_details(2) if token_ids else None, rewards={"reward": 1.0},
            stdout="collected 1 item\n\ntest_calc.py .\n\n1 passed in 0.01s\n",
        ),
        "failed": _trial(
            job, "fix-add", atif=_atif(1), rewards={"reward": 0.0}, stdout="FAILED test_calc.py::test_add\n1 failed\n",
            started="2026-12-06T10:05:00.000000Z",
        ),
        "timeout": _trial(job, "fix-mul", atif=_atif(3), rewards={"reward": 0.0}, exception="AgentTimeoutError"),
        "codex": _trial(
            job, "fix-sub", agent="codex", model="gpt-5.5", atif=_atif(1, version="ATIF-v1.7"), rollout=session(steps=1),
            rewards={"reward": 1.0}, patch=PATCH, stdout="1 passed\n",
        ),
        "oracle": _trial(job, "fix-add", agent="oracle", model=None, rewards={"reward": 1.0}),
        "crashed": _trial(job, "fix-div", result=False),
    }  # fmt: skip
    return trials


def _import(paths: list[Path], pool: Path, **fields: Any):  # noqa: ANN202
    return run_import(ImportOptions("harbor", paths, pool, **fields))


def _by_trial(pool: Path) -> dict[str, Trajectory]:
    return {t.source.meta["trial_name"]: t for t in read_trajectories(pool) if t.source and t.source.format == "harbor"}


# ---------------------------------------------------------------- the import


def test_a_job_folder_imports_every_trial_with_its_grade_and_a_second_import_adds_nothing(tmp_path: Path) -> None:
    trials = _job(tmp_path)
    pool = tmp_path / "pool.jsonl"
    summary = _import([tmp_path / "jobs"], pool)
    assert (summary.files, summary.imported, len(summary.rejected)) == (6, 4, 0), summary.rejected
    assert dict(summary.not_imported) == {NO_RESULT: 1, "no agent trajectory (agent oracle)": 1}
    got = _by_trial(pool)
    name = {key: folder.name for key, (folder, _id) in trials.items()}
    assert set(got) == {name["solved"], name["failed"], name["timeout"], name["codex"]}

    solved = got[name["solved"]]
    assert solved.id == f"harbor-{trials['solved'][1]}" and solved.task_id == "fixtures/fix-add"
    assert (solved.outcome.reward, solved.outcome.resolved) == (1.0, True)
    assert solved.outcome.verdict["imported_from"] == "harbor" and solved.outcome.verdict["re_verified"] is False
    assert solved.outcome.verdict["source_fields"]["rewards"] == {"reward": 1.0}
    assert solved.outcome.verdict["test_output"].endswith("1 passed in 0.01s\n")
    assert solved.outcome.verdict_ref == str(trials["solved"][0] / "verifier" / "test-stdout.txt")
    assert solved.exit_status is ExitStatus.submitted and solved.final_patch is None
    assert (solved.policy.name, solved.policy.provider) == ("openai/scripted", "openai")
    assert (solved.usage.input_tokens, solved.usage.cached_input_tokens, solved.usage.output_tokens, solved.usage.cost_usd) == (
        1200, 200, 30, 0.25,
    )  # fmt: skip
    assert (solved.started_at, solved.finished_at) == ("2026-12-06T10:00:01.000000Z", "2026-12-06T10:00:40.000000Z")
    meta = solved.source.meta
    assert meta["trajectory"]["source"] == "atif" and meta["trajectory"]["format_version"] == "ATIF-v1.8"
    assert meta["task_id"] == {"path": "/work/tasks/fix-add"} and meta["agent"]["name"] == "terminus-2"
    assert meta["timings"]["agent_execution"]["finished_at"] == "2026-12-06T10:00:30.000000Z"
    # Two trials of one task in one job: attempts 0 and 1, in the order they started.
    assert (solved.attempt, got[name["failed"]].attempt, got[name["timeout"]].attempt) == (0, 1, 0)

    failed = got[name["failed"]]
    assert (failed.outcome.reward, failed.outcome.resolved, failed.exit_status) == (0.0, False, ExitStatus.submitted)
    timeout = got[name["timeout"]]
    assert timeout.exit_status is ExitStatus.time_exhausted and timeout.outcome.resolved is False
    assert timeout.source.meta["exception"]["exception_type"] == "AgentTimeoutError"

    codex = got[name["codex"]]
    assert codex.source.meta["trajectory"]["source"] == "codex-rollout" and codex.source.meta["trajectory"]["format"] == "codex"
    assert codex.final_patch == PATCH and codex.outcome.resolved is True
    assert (codex.policy.name, codex.exit_status) == ("gpt-5.5", ExitStatus.submitted)
    assert codex.source.records  # the rollout's lines that made no message, kept
    assert [m.role for m in codex.messages][:2] == ["system", "developer"]

    counts = count_pool(pool)
    assert (counts.trajectories, counts.graded, counts.imported_grades, counts.positive) == (4, 4, 4, 2)
    assert {t.id for t in read_trajectories(pool) if is_verified_positive(t)} == {solved.id, codex.id}

    again = _import([tmp_path / "jobs"], pool)
    assert (again.imported, again.skipped_existing) == (0, 4)
    # One trial folder, or the job folder, finds the same trials.
    assert len(discover("harbor", [trials["codex"][0]])) == 1
    assert len(discover("harbor", [tmp_path / "jobs" / "2026-12-06__10-00-00"])) == 6


def test_rollout_token_ids_go_on_the_messages_as_the_chat_policy_records_them(tmp_path: Path) -> None:
    """``rollout_details[0]`` per turn: completion ids and logprobs on the generated assistant
    message, the prompt ids in ``extra.prompt_token_ids``; the sub-agent's segment kept."""
    _trial(tmp_path, "fix-add", atif=_atif(2, with_ids=True), rollout_details=_rollout_details(2), rewards={"reward": 1.0})
    pool = tmp_path / "pool.jsonl"
    _import([tmp_path], pool)
    (t,) = read_trajectories(pool)
    calls = [m for m in t.messages if m.role == "assistant"]
    assert [m.token_ids for m in calls] == [[40, 41, 42], [41, 41, 42]]
    assert [m.logprobs for m in calls] == [[-0.1, -0.2, -0.3]] * 2
    assert [m.extra["prompt_token_ids"] for m in calls] == [[1, 2, 3, 0], [1, 2, 3, 1]]
    assert t.source.meta["rollout_details"] == [{}, _rollout_details(2)[1]]
    # ATIF's own ids differed from the trainer's: said, and the trainer's kept.
    assert any("differ from rollout_details" in w for w in t.source.warnings)


def test_a_turn_count_that_disagrees_places_no_ids_and_says_so(tmp_path: Path) -> None:
    _trial(tmp_path, "fix-add", atif=_atif(3), rollout_details=_rollout_details(2), rewards={"reward": 1.0})
    summary = _import([tmp_path], tmp_path / "pool.jsonl")
    (t,) = read_trajectories(tmp_path / "pool.jsonl")
    assert all(m.token_ids is None and "prompt_token_ids" not in (m.extra or {}) for m in t.messages)
    assert t.source.meta["rollout_details"] == _rollout_details(2)
    assert any("2 turns, the trajectory 3 generated assistant messages" in w for w in summary.warnings)


def test_the_trajectory_option_chooses_the_source(tmp_path: Path) -> None:
    folder, _ = _trial(
        tmp_path / "a", "fix-sub", agent="codex", atif=_atif(1, version="ATIF-v1.7"), rollout=session(), rewards={"reward": 1.0}
    )
    _trial(tmp_path / "b", "fix-add", atif=_atif(1), rewards={"reward": 1.0})
    (atif_read,) = [t for t in read_trajectories_of(tmp_path / "a", trajectory="atif")]
    assert atif_read.source.meta["trajectory"]["source"] == "atif" and atif_read.source.meta["trajectory"]["path"] == str(
        folder / "agent" / "trajectory.json"
    )
    summary = _import([tmp_path / "b"], tmp_path / "b.jsonl", trajectory="rollout")
    assert summary.imported == 0 and dict(summary.not_imported) == {"no agent trajectory (agent terminus-2)": 1}
    assert any("no rollout trajectory in the trial" in w for w in summary.warnings)


def read_trajectories_of(root: Path, **fields: Any) -> list[Trajectory]:
    pool = root.parent / f"{root.name}-{len(list(root.parent.glob('*.jsonl')))}.jsonl"
    _import([root], pool, **fields)
    return list(read_trajectories(pool))


@pytest.mark.parametrize(
    ("rewards", "fields", "expected"),
    [
        ({"reward": 0.5}, {}, (0.5, False)),
        ({"reward": 0.5}, {"min_reward": 0.5}, (0.5, True)),
        ({"pass_rate": 1.0}, {}, (1.0, True)),  # a single key decides, whatever its name
        ({"tests": 1.0, "style": 0.0}, {"reward_key": "style"}, (0.0, False)),
        ({"tests": 1.0, "style": 0.0}, {}, (None, None)),  # no `reward` among several: not graded, said
    ],
)
def test_the_resolved_rule(tmp_path: Path, rewards: dict[str, float], fields: dict[str, Any], expected: tuple[Any, Any]) -> None:
    _trial(tmp_path, "fix-add", atif=_atif(1), rewards=rewards)
    (t,) = read_trajectories_of(tmp_path, **fields)
    if expected == (None, None):
        assert t.outcome is None and any("has no 'reward'" in w for w in t.source.warnings)
    else:
        assert (t.outcome.reward, t.outcome.resolved) == expected
        assert t.outcome.verdict["source_fields"]["rewards"] == rewards


@pytest.mark.parametrize(
    ("exception", "status", "resolved"),
    [
        ("ContextWindowExceededError", ExitStatus.context_overflow, True),
        ("ApiRateLimitError", ExitStatus.policy_error, False),  # Harbor holds the reward invalid
        ("SandboxBuildFailedError", ExitStatus.env_error, False),
        ("NonZeroAgentExitCodeError", ExitStatus.aborted, True),
        ("RewardFileNotFoundError", ExitStatus.submitted, False),  # the verifier failed, not the agent
        ("SomethingNewError", ExitStatus.aborted, True),
    ],
)
def test_exceptions_map_to_exit_statuses(tmp_path: Path, exception: str, status: ExitStatus, resolved: bool) -> None:
    _trial(tmp_path, "fix-add", atif=_atif(1), rewards={"reward": 1.0}, exception=exception)
    (t,) = read_trajectories_of(tmp_path)
    assert t.exit_status is status and t.outcome.resolved is resolved
    assert t.source.meta["exception"]["exception_type"] == exception


def test_damaged_trials_are_rejected_with_their_location_and_the_batch_goes_on(tmp_path: Path) -> None:
    good, _ = _trial(tmp_path, "fix-add", atif=_atif(1), rewards={"reward": 1.0})
    bad, _ = _trial(tmp_path, "fix-mul", atif=_atif(1), rewards={"reward": 1.0})
    document = json.loads((bad / "result.json").read_text())
    document["verifier_result"]["rewards"]["reward"] = "yes"
    (bad / "result.json").write_text(json.dumps(document))
    worse, _ = _trial(tmp_path, "fix-sub", atif=_atif(1), rewards={"reward": 1.0})
    (worse / "agent" / "trajectory.json").write_text('{"schema_version": "ATIF-v1.8", "agent": {}, "steps": [}')
    summary = _import([tmp_path], tmp_path / "pool.jsonl")
    assert summary.imported == 1
    problems = sorted(str(e) for e in summary.rejected)
    assert problems[0].startswith(f"{bad / 'result.json'}: verifier_result.rewards.reward: expected a number"), problems
    assert problems[1].startswith(f"{worse / 'agent' / 'trajectory.json'}:1"), problems


def test_the_harbor_fields_are_refused_for_other_formats(tmp_path: Path, relearn_bin: str) -> None:
    (tmp_path / "x.jsonl").write_text("")
    wrong = subprocess.run(
        [relearn_bin, "import", "codex", str(tmp_path / "x.jsonl"), "-o", str(tmp_path / "p.jsonl"), "--min-reward", "0.5"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert wrong.returncode == 2 and "--min-reward only apply to the harbor format" in wrong.stderr


def test_the_cli_counts_the_trials_it_did_not_import(tmp_path: Path, relearn_bin: str) -> None:
    _job(tmp_path)
    done = subprocess.run(
        [relearn_bin, "import", "harbor", str(tmp_path / "jobs"), "-o", str(tmp_path / "pool.jsonl"), "--trajectory", "auto"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not imported: no agent trajectory (agent oracle)" in done.stdout and "not imported: no result.json" in done.stdout


def test_judge_one_reads_the_verifier_output(tmp_path: Path) -> None:
    from review.reading import render_for_reading

    _trial(tmp_path, "fix-add", atif=_atif(1), rewards={"reward": 1.0}, stdout="=== 1 passed in 0.02s ===\n")
    (t,) = read_trajectories_of(tmp_path)
    text = render_for_reading(t, []).text
    assert "the verifier's output (harbor):\n=== 1 passed in 0.02s ===" in text


def test_masks_positive_keeps_exactly_the_reward_one_trials_with_a_trajectory(tmp_path: Path, tok) -> None:  # noqa: ANN001
    from relearn.ops.masks import MasksOptions, run_masks

    # Made-up token ids would be refused by the masks (they decode to no rendered turn): none here.
    trials = _job(tmp_path, token_ids=False)
    pool = tmp_path / "pool.jsonl"
    _import([tmp_path / "jobs"], pool)
    summary = run_masks(MasksOptions(pool=pool, output=tmp_path / "out", mode="positive"), tokenizer=tok)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert (stats["trajectories_in"], stats["trajectories_out"]) == (4, 2), summary
    kept = set(_trajectory_ids(tmp_path / "out"))
    assert kept == {f"harbor-{trials['solved'][1]}", f"harbor-{trials['codex'][1]}"}


def _trajectory_ids(dataset: Path) -> list[str]:
    from relearn.masks.rows import ShardRow, iter_rows

    return [row.trajectory_id for row in iter_rows(sorted(dataset.glob("shard-*.parquet"))) if isinstance(row, ShardRow)]


def test_importer_object_and_module_agree(tmp_path: Path) -> None:
    _trial(tmp_path, "fix-add", atif=_atif(1), rewards={"reward": 1.0})
    files = harbor.discover(tmp_path)
    a = import_files("harbor", files, tmp_path / "a.jsonl")
    b = import_files("harbor", files, tmp_path / "b.jsonl", importer=HarborImporter(HarborOptions()))
    assert (a.imported, b.imported) == (1, 1)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


# ---------------------------------------------------------------- the pipeline


@pytest.mark.docker
@pytest.mark.slow
def test_the_pipeline_trains_on_the_imported_grades(tmp_path: Path) -> None:
    from relearn.pipeline.config import load_pipeline
    from relearn.pipeline.plan import run_pipeline

    _job(tmp_path, token_ids=False)
    (tmp_path / "p.toml").write_text(
        'workdir = "work"\n[pool.import]\nformat = "harbor"\npaths = ["jobs"]\n[review]\nreviewer = "heuristic"\n'
        '[masks]\nvariants = ["positive"]\n[train]\ntiny = "qwen3"\nepochs = 1\n'
    )
    config = load_pipeline(tmp_path / "p.toml")
    results, _ctx = run_pipeline(config, Console(file=io.StringIO()))
    assert [(r.name, r.status, r.error) for r in results] == [
        (n, "ran", None) for n in ("pool", "verify", "review", "masks:positive", "upstream", "train:positive", "report")
    ]
    work = config.workdir
    pool = json.loads((work / ".pipeline" / "pool.json").read_text())["counts"]
    assert (pool["imported"], pool["imported_grades"], pool["positive"]) == (4, 4, 2)
    assert pool["not imported"] == {NO_RESULT: 1, "no agent trajectory (agent oracle)": 1}
    verify = json.loads((work / ".pipeline" / "verify.json").read_text())["counts"]
    assert verify["kept the imported grade, not re-verified ([verify] again = true grades it)"] == 4
    stats = json.loads((work / "datasets" / "positive" / "stats.json").read_text())
    assert (stats["trajectories_in"], stats["trajectories_out"]) == (4, 2)
    # The report says the grades were the run's own, not graded here.
    report = (work / "report" / "report.md").read_text()
    assert "kept the imported grade, not re-verified" in report and "not imported: no agent trajectory (agent oracle)" in report


# ---------------------------------------------------------------- the real job folders (harbor itself wrote them)


def _real_trials() -> list[Path]:
    return harbor.discover(FIXTURES) if FIXTURES.is_dir() else []


@pytest.mark.skipif(not _real_trials(), reason="tests/fixtures/harbor/ holds no job folder yet")
def test_real_harbor_job_folders_import_with_what_their_result_json_says(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    summary = _import([FIXTURES], pool)
    assert not summary.rejected, summary.rejected
    got = {t.source.meta["trial_name"]: t for t in read_trajectories(pool) if t.source.format == "harbor"}
    for path in _real_trials():
        if path.name != "result.json":
            continue
        result = json.loads(path.read_text())
        trial = path.parent
        has_trajectory = (trial / "agent" / "trajectory.json").is_file() or any((trial / "agent").rglob("rollout-*.jsonl"))
        assert (result["trial_name"] in got) == has_trajectory, result["trial_name"]
        if not has_trajectory:
            continue
        t = got[result["trial_name"]]
        assert t.id == f"harbor-{result['id']}" and t.task_id == result["task_name"]
        rewards = (result.get("verifier_result") or {}).get("rewards")
        if rewards:
            assert t.outcome.verdict["source_fields"]["rewards"] == rewards
            assert t.outcome.reward == float(rewards.get("reward", next(iter(rewards.values()))))
        else:
            assert t.outcome is None
        exception = (result.get("exception_info") or {}).get("exception_type")
        if exception == "AgentTimeoutError":
            assert t.exit_status is ExitStatus.time_exhausted
        elif exception is None:
            assert t.exit_status is ExitStatus.submitted
        model = (result["agent_info"].get("model_info") or {}).get("name")
        if model:
            assert t.policy.name == model
        agent_result = result.get("agent_result") or {}
        if agent_result.get("n_input_tokens") is not None:
            assert (t.usage.input_tokens, t.usage.output_tokens) == (agent_result["n_input_tokens"], agent_result.get("n_output_tokens"))
        source = "codex-rollout" if any((trial / "agent").rglob("rollout-*.jsonl")) else "atif"
        assert t.source.meta["trajectory"]["source"] == source
        details = agent_result.get("rollout_details") or []
        if details and details[0].get("completion_token_ids"):
            calls = [m for m in t.messages if m.role == "assistant" and m.generated]
            if len(calls) == len(details[0]["completion_token_ids"]):
                assert [m.token_ids for m in calls] == details[0]["completion_token_ids"]
                assert [m.extra["prompt_token_ids"] for m in calls] == details[0]["prompt_token_ids"]
    again = _import([FIXTURES], pool)
    assert again.imported == 0


@pytest.mark.skipif(not _real_trials(), reason="tests/fixtures/harbor/ holds no job folder yet")
def test_real_job_folders_what_their_readme_says_and_masks_positive(tmp_path: Path, tok) -> None:  # noqa: ANN001
    """The trials of tests/fixtures/harbor/README.md: the oracle's and the broken environment's
    are counted, not imported; the timed-out terminus-2 trial gets the ids of its one written
    step; `masks --mode positive` keeps exactly the reward-1 trials with a trajectory."""
    from relearn.ops.masks import MasksOptions, run_masks

    pool = tmp_path / "pool.jsonl"
    summary = _import([FIXTURES], pool)
    assert dict(summary.not_imported) == {
        "no agent trajectory (agent oracle)": 1,
        "no agent trajectory (agent oracle, RuntimeError)": 1,
    }
    got = {t.policy.name: t for t in read_trajectories(pool)}
    assert set(got) == {"gpt-5.5", "qwen3.6-scripted-solve", "qwen3.6-scripted-flail", "qwen3.6-scripted-sleep"}
    assert got["gpt-5.5"].source.meta["trajectory"]["source"] == "codex-rollout" and got["gpt-5.5"].final_patch
    sleep = got["qwen3.6-scripted-sleep"]
    assert sleep.exit_status is ExitStatus.time_exhausted and sleep.outcome.resolved is False and sleep.final_patch is None
    assert sleep.source.meta["rollout_details"][0]["first_turn"] == 1
    solve = got["qwen3.6-scripted-solve"]
    assert solve.outcome.verdict["test_output"] and solve.final_patch.startswith("diff --git")
    positive = {t.id for t in read_trajectories(pool) if is_verified_positive(t)}
    assert positive == {got["gpt-5.5"].id, solve.id}
    run_masks(MasksOptions(pool=pool, output=tmp_path / "out", mode="positive"), tokenizer=tok)
    assert set(_trajectory_ids(tmp_path / "out")) == positive


@pytest.mark.docker
def test_relearn_verify_again_grades_what_the_verdicts_file_holds(base_image: str, tmp_path: Path) -> None:
    """`relearn verify --again`: the predictions already graded are graded again and their new
    verdicts appended after the old (without it, they are skipped)."""
    from envs.tasks import load_tasks
    from eval.dataset import MINI_SUITE
    from relearn.ops.verify import run_verify
    from relearn.verbs.verify import VerifyOptions

    task = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}["mini__calc-1"]
    patches = tmp_path / "preds.jsonl"
    patches.write_text(json.dumps({"instance_id": task.instance_id, "model_patch": task.patch}) + "\n")
    options = VerifyOptions(patches, output=tmp_path / "verdicts.jsonl")
    assert len(run_verify(options).verdicts) == 1
    assert run_verify(options).skipped == 1
    again = run_verify(VerifyOptions(patches, output=tmp_path / "verdicts.jsonl", again=True))
    assert len(again.verdicts) == 1 and again.verdicts[0].resolved and not again.errors
    lines = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and not (tmp_path / "verdicts.jsonl.again").exists()


def test_turns_past_the_messages_are_placed_where_the_trajectorys_own_ids_prove_the_pairing(tmp_path: Path) -> None:
    """A timeout while a command ran: rollout_details has a call whose ATIF step was never
    written. The steps' own completion ids match the first turns: those get the prompt ids and
    logprobs, the last turn is kept aside; ids that do not match place nothing."""
    details = [{"prompt_token_ids": [[1], [2]], "completion_token_ids": [[7, 7, 0], [8]], "logprobs": [[-0.5, -0.5, -0.5], [-1.0]]}]
    _trial(
        tmp_path / "a",
        "fix-add",
        atif=_atif(1, with_ids=True),
        rollout_details=details,
        rewards={"reward": 0.0},
        exception="AgentTimeoutError",
    )
    (t,) = read_trajectories_of(tmp_path / "a")
    (call,) = [m for m in t.messages if m.role == "assistant"]
    assert (call.token_ids, call.extra["prompt_token_ids"]) == ([7, 7, 0], [1])
    assert t.source.meta["rollout_details"] == [
        {"prompt_token_ids": [[2]], "completion_token_ids": [[8]], "logprobs": [[-1.0]], "first_turn": 1}
    ]
    details[0]["completion_token_ids"][0] = [9]
    details[0]["logprobs"][0] = [-0.1]
    _trial(tmp_path / "b", "fix-add", atif=_atif(1, with_ids=True), rollout_details=details, rewards={"reward": 0.0})
    (t,) = read_trajectories_of(tmp_path / "b")
    (call,) = [m for m in t.messages if m.role == "assistant"]
    assert call.extra["prompt_token_ids"] == [9, 9, 0]  # ATIF's own, untouched
    assert t.source.meta["rollout_details"] == details
