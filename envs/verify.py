"""The verifier: a final repository state (a patch) into a terminal reward.

Always in a *fresh* container from the task image, never the agent's own. SWE-bench
and mini tasks are graded by ``swebench`` itself: its patch-application fallbacks,
its eval script (with the recorded test exit code that defeats printed ``PASSED``
lines) and its log parsers and grading functions. OpenSWE tasks pass on the
``OPENSWE_EXIT_CODE=0`` marker, Harbor tasks on the reward file their ``test.sh``
writes.

Reward hacking: edits the candidate makes to test files (the task's own, any
``tests/`` path, ``conftest.py``) are reverted before grading and listed in the
verdict.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
from pydantic import BaseModel, ConfigDict
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TESTS_TIMEOUT, EvalType
from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
from swebench.harness.run_evaluation import GIT_APPLY_CMDS
from swebench.harness.utils import make_test_spec

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.tasks import Task, patch_files

SCHEMA_VERSION = "1.0"
PATCH_PATH = "/tmp/relearn/patch.diff"
EVAL_PATH = "/tmp/relearn/eval.sh"
LOG_CAP = 16 << 20
TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_test\.py$|(^|/)conftest\.py$")
OPENSWE_PASS = re.compile(r"^OPENSWE_EXIT_CODE=0$", re.MULTILINE)


class Verdict(BaseModel):
    model_config = ConfigDict(extra="allow")

    schema_version: str = SCHEMA_VERSION
    instance_id: str
    patch_hash: str
    resolved: bool
    reward: float
    patch_exists: bool
    patch_applied: bool
    apply_command: str | None = None
    # FAIL_TO_PASS / PASS_TO_PASS -> {"success": [...], "failure": [...]} (swebench's report)
    tests: dict[str, dict[str, list[str]]] | None = None
    status_map: dict[str, str] | None = None
    rewards: dict[str, float] | None = None
    test_files_reverted: list[str] = []
    timed_out: bool = False
    error: str | None = None
    image: str
    image_digest: str | None = None
    log_path: str | None = None
    log_tail: str = ""
    durations_s: dict[str, float] = {}
    model_name_or_path: str | None = None


def patch_hash(patch: str | None) -> str:
    return hashlib.sha256((patch or "").encode()).hexdigest()[:16]


def mini_eval_script(task: Task, base_commit: str) -> str:
    """A SWE-bench 5.x eval script for a task that has none (the mini suite): reset the
    test files, apply the test patch, run pytest between the markers, reset again."""
    test_files = " ".join(shlex.quote(f) for f in task.test_files)
    targets = sorted({test.split("::")[0] for test in task.FAIL_TO_PASS + task.PASS_TO_PASS})
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {task.workdir}",
            f"git config --global --add safe.directory {task.workdir}",
            "git status",
            f"git -c core.fileMode=false diff {base_commit}",
            f"git checkout {base_commit} {test_files}",
            "git apply -v - <<'EOF_114329324912'",
            task.test_patch.rstrip("\n"),
            "EOF_114329324912",
            f": '{START_TEST_OUTPUT}'",
            f"python3 -m pytest -rA -p no:cacheprovider {' '.join(shlex.quote(t) for t in targets)}",
            f": '{END_TEST_OUTPUT}'",
            f"git checkout {base_commit} {test_files}",
        ]
    )


def swebench_test_spec(task: Task, base_commit: str) -> Any:
    """swebench's TestSpec for the task: its own eval script when it has one (SWE-bench
    5.x rows), else the mini suite's generated one."""
    instance = task.model_dump()
    instance["eval_script"] = task.eval_script or mini_eval_script(task, base_commit)
    instance["log_parser"] = task.log_parser or "parse_log_pytest"
    instance["image"] = task.image or ""
    instance["version"] = task.version or "0"
    return make_test_spec(instance)


def _protected(task: Task, touched: list[str]) -> list[str]:
    declared = set(task.test_files) | set(patch_files(task.test_patch))
    return [f for f in touched if f in declared or TEST_PATH.search(f)]


def verify(
    client: docker.DockerClient,
    task: Task,
    patch: str | None,
    image: str,
    *,
    log_dir: Path | None = None,
    timeout_s: float = 1800.0,
    limits: Limits = DEFAULT_LIMITS,
    model_name_or_path: str | None = None,
) -> Verdict:
    """Grade ``patch`` against ``task`` in a fresh container from ``image``."""
    started = time.monotonic()
    verdict = Verdict(
        instance_id=task.instance_id,
        patch_hash=patch_hash(patch),
        resolved=False,
        reward=0.0,
        patch_exists=bool(patch and patch.strip()),
        patch_applied=False,
        image=image,
        model_name_or_path=model_name_or_path,
    )
    try:
        verdict.image_digest = client.images.get(image).id
    except docker.errors.ImageNotFound:
        verdict.error = f"image {image} is not on this engine"
        return verdict
    limits = Limits(
        cpus=task.cpus or limits.cpus,
        memory_mb=task.memory_mb or limits.memory_mb,
        pids=limits.pids,
        network=task.network or limits.network,
    )
    with Container.start(client, image, limits=limits, workdir=task.workdir) as container:
        verdict.durations_s["start"] = time.monotonic() - started
        if task.kind == "harbor":
            log = _run_harbor(container, task, patch, verdict, timeout_s)
        else:
            log = _run_eval_script(container, task, patch, verdict, timeout_s)
    verdict.durations_s["total"] = time.monotonic() - started
    verdict.log_tail = log[-4000:]
    if log_dir is not None:
        path = log_dir / task.instance_id / f"{verdict.patch_hash}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(log)
        verdict.log_path = str(path)
    return verdict


def _apply(container: Container, patch: str, verdict: Verdict) -> list[str]:
    """Apply with SWE-bench's fallbacks; returns the log lines."""
    container.put_file(PATCH_PATH, patch if patch.endswith("\n") else patch + "\n")
    lines = []
    for command in GIT_APPLY_CMDS:
        result = container.exec(f"{command} {PATCH_PATH}", timeout_s=120)
        lines.append(f"$ {command} {PATCH_PATH}\n{result.output}")
        if result.ok:
            verdict.patch_applied = True
            verdict.apply_command = command
            break
        # --reject and patch may leave partial edits behind; start the next try from base.
        # (No `git clean`: SWE-bench images keep untracked build products in the tree.)
        container.exec("git reset -q --hard", timeout_s=120)
    return lines


def _apply_candidate(container: Container, patch: str | None, verdict: Verdict) -> list[str]:
    """Apply the candidate, if there is one; sets ``verdict.error`` when it does not apply."""
    if not verdict.patch_exists or patch is None:
        return []
    log_lines = _apply(container, patch, verdict)
    if not verdict.patch_applied:
        verdict.error = "the patch does not apply"
    return log_lines


def _revert_test_edits(container: Container, task: Task, patch: str, base_commit: str, verdict: Verdict) -> None:
    protected = _protected(task, patch_files(patch))
    for path in protected:
        quoted = shlex.quote(path)
        container.exec(f"git checkout -q {base_commit} -- {quoted} 2>/dev/null || rm -f -- {quoted}", timeout_s=60)
    verdict.test_files_reverted = protected


def _base_commit(container: Container, task: Task) -> str:
    if task.base_commit:
        return task.base_commit
    return container.sh("git rev-parse HEAD", timeout_s=60).stdout.strip()


def _run_eval_script(container: Container, task: Task, patch: str | None, verdict: Verdict, timeout_s: float) -> str:
    base_commit = _base_commit(container, task)
    log_lines = _apply_candidate(container, patch, verdict)
    if verdict.error:
        return "\n".join(log_lines)
    if patch and verdict.patch_applied:
        _revert_test_edits(container, task, patch, base_commit, verdict)
    spec = swebench_test_spec(task, base_commit)
    container.put_file(EVAL_PATH, spec.eval_script, mode=0o755)
    tests_started = time.monotonic()
    result = container.exec(f"bash {EVAL_PATH}", timeout_s=timeout_s, output_cap=LOG_CAP)
    verdict.durations_s["tests"] = time.monotonic() - tests_started
    log = result.output
    if result.timed_out:
        verdict.timed_out = True
        log += f"\n{TESTS_TIMEOUT}\n"
    log_lines.append(log)
    full_log = "\n".join(log_lines)
    if task.kind == "openswe":
        verdict.resolved = bool(OPENSWE_PASS.search(log)) and not result.timed_out
    else:
        _grade_swebench(spec, task, full_log, verdict)
    verdict.reward = 1.0 if verdict.resolved else 0.0
    return full_log


def _grade_swebench(spec: Any, task: Task, log: str, verdict: Verdict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=True) as handle:
        handle.write(log)
        handle.flush()
        status_map, found = get_logs_eval(spec, handle.name)
    if not found:
        verdict.error = verdict.error or "no gradable test output (tests did not run, timed out, or the log contradicts the exit code)"
        return
    verdict.status_map = status_map
    gold = {"instance_id": task.instance_id, "FAIL_TO_PASS": spec.FAIL_TO_PASS, "PASS_TO_PASS": spec.PASS_TO_PASS}
    report = get_eval_tests_report(status_map, gold, eval_type=EvalType(spec.eval_type))
    verdict.tests = {key: {"success": value["success"], "failure": value["failure"]} for key, value in report.items()}
    verdict.resolved = get_resolution_status(report) == "RESOLVED_FULL"


def _run_harbor(container: Container, task: Task, patch: str | None, verdict: Verdict, timeout_s: float) -> str:
    """Harbor's protocol: upload tests/ to /tests, run test.sh, read the reward file."""
    assert task.task_dir is not None
    log_lines = _apply_candidate(container, patch, verdict)
    if verdict.error:
        return "\n".join(log_lines)
    container.put_dir(str(Path(task.task_dir) / "tests"), "/tests")
    container.sh("mkdir -p /logs/verifier /logs/agent /logs/artifacts")
    budget = min(timeout_s, task.verifier_timeout_s or timeout_s)
    result = container.exec("bash /tests/test.sh", timeout_s=budget, workdir=task.workdir, output_cap=LOG_CAP)
    verdict.timed_out = result.timed_out
    log_lines.append(result.output)
    rewards = _read_rewards(container)
    if rewards is None:
        verdict.error = "test.sh wrote no /logs/verifier/reward.json or reward.txt"
    else:
        verdict.rewards = rewards
        verdict.reward = float(rewards.get("reward", next(iter(rewards.values()), 0.0)))
        verdict.resolved = verdict.reward >= 1.0 and not result.timed_out
    return "\n".join(log_lines)


def _read_rewards(container: Container) -> dict[str, float] | None:
    try:
        data = json.loads(container.get_file("/logs/verifier/reward.json"))
        if isinstance(data, dict):
            return {str(k): float(v) for k, v in data.items()}
    except (FileNotFoundError, ValueError, TypeError):
        pass
    try:
        text = container.get_file("/logs/verifier/reward.txt").decode().strip()
        return {"reward": float(text)}
    except (FileNotFoundError, ValueError):
        return None
