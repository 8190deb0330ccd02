"""The verifier: a final repository state (a patch) into a terminal reward.

Always in a *fresh* container from the task image, never the agent's own. The candidate
patch goes in under ``envs.candidate``'s policy (git's own file list, nothing into ``.git``
or out of the repository, everything that decides what the tests are put back); the
tests run as ``envs.test_run`` splits them (a fatal setup, then the test command alone,
with a JUnit report for pytest and a canary for every runner it knows); ``envs.grading`` reads only the test
command's output with swebench's log parsers and grading functions, checked against the
report. OpenSWE tasks pass on their ``OPENSWE_EXIT_CODE=0`` marker (one without an eval script
that prints it is refused, never graded by another script), Harbor tasks on the reward file
their ``test.sh`` writes.

Every decision is in the verdict: the apply command, the files the patch touched, what was
refused, restored or neutralized, the report used, every disagreement, and what looks
suspicious (kept out of review and training by default, see ``records.trajectory``).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from pathlib import Path
from typing import Any

import docker
from pydantic import BaseModel, ConfigDict
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
from swebench.harness.utils import make_test_spec

from envs.canary import canary_text
from envs.candidate import GIT_ENV, INFRASTRUCTURE, apply_candidate
from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.grading import grade, grade_openswe
from envs.network_failures import offline_failures
from envs.package_probe import probe_package
from envs.runner_guard import judge as judge_guard
from envs.tasks import OPENSWE_MARKER, Task, patch_files
from envs.test_run import CANARY_SOURCE, SETUP_FAILED, Phases, runner_files, split_eval_script

SCHEMA_VERSION = "1.3"  # 1.3: network_needed, canary
SETUP_PATH = "/tmp/relearn/setup.sh"
TESTS_PATH = "/tmp/relearn/tests.sh"
SCRIPT_PATH = "/tmp/relearn/eval.sh"
TEST_PATCH_PATH = "/tmp/relearn/test.patch"
# The setup's output (installs, resets) is never graded: past its cap its middle is cut,
# counted in the verdict. The test command's output is graded, so it is kept whole up to a
# far larger cap; past that the run is not graded at all rather than graded on a log with
# a hole in it.
LOG_CAP = 16 << 20
TEST_LOG_CAP = 128 << 20
TEST_PATCH_MISSING = 98  # the setup's exit status when the test patch is not in place after it


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
    touched_files: list[str] = []  # as git lists them, before and after applying
    refused: list[str] = []  # why the patch was not graded at all
    restored_files: list[str] = []  # taken back to the base commit (or removed): they decide what the tests are
    neutralized: list[str] = []  # changed to be harmless (an executable bit dropped)
    report: str | None = None  # what the results were read from: "junit", or the log only
    disagreements: list[str] = []  # between the log, the report, the canary and the exit status: never resolved
    suspicious: list[str] = []  # resolved or not, what a reviewer should look at
    timed_out: bool = False
    error: str | None = None
    image: str
    image_digest: str | None = None
    log_path: str | None = None
    log_tail: str = ""
    log_omitted_bytes: dict[str, int] = {}  # run ("setup", "tests") -> bytes cut from its output
    limits: dict[str, float | int | bool] | None = None  # what the grading container ran under
    # Graded offline and unresolved: the listed tests that failed with a network error in their
    # own part of the log (envs.network_failures). The official harness grades with the network;
    # `relearn verify --network` does too. Never makes a verdict resolved.
    network_needed: list[str] = []
    # What the canary calls: "calls the package under test, NAME", or "builtins only: the package
    # canary was not placed (why)"; None where the run has no canary.
    canary: str | None = None
    durations_s: dict[str, float] = {}
    model_name_or_path: str | None = None


def patch_hash(patch: str | None) -> str:
    """The patch's id in the verdicts file; any string hashes, a lone surrogate included
    (``surrogatepass``: a malformed prediction must not cost its batch the resume check)."""
    return hashlib.sha256((patch or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]


def mini_eval_script(task: Task, base_commit: str) -> str:
    """A SWE-bench 5.x eval script for a task that has none (the mini suite): reset the
    test files, apply the test patch, run the tests between the markers, reset again. The
    image is ours, so pytest runs without the work directory on ``sys.path`` (``-P``) and
    without plugin autoloading (it needs none). A task with a ``test_command`` (one graded
    from its log alone, by a Django-style runner) runs that instead."""
    test_files = " ".join(shlex.quote(f) for f in task.test_files)
    targets = sorted({test.split("::")[0] for test in task.FAIL_TO_PASS + task.PASS_TO_PASS})
    pytest = f"python3 -P -m pytest -rA -p no:cacheprovider {' '.join(shlex.quote(t) for t in targets)}"
    command = (task.model_extra or {}).get("test_command") or pytest
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {task.workdir}",
            "export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
            f"git config --global --add safe.directory {task.workdir}",
            "git status",
            f"git -c core.fileMode=false diff {base_commit}",
            f"git checkout {base_commit} {test_files}",
            "git apply -v - <<'EOF_114329324912'",
            task.test_patch.rstrip("\n"),
            "EOF_114329324912",
            f": '{START_TEST_OUTPUT}'",
            command,
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
    if task.kind == "openswe" and OPENSWE_MARKER not in (task.eval_script or ""):
        # Never graded by another script (a run of the whole suite once stood in): refused, with why.
        verdict.refused = [f"the OpenSWE task has no eval script printing {OPENSWE_MARKER}: nothing grades it"]
        verdict.error = "not graded: " + verdict.refused[0]
        return verdict
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
    verdict.limits = limits.to_dict()
    if patch is not None and _unencodable(patch):
        verdict.refused = [f"the patch is not valid Unicode ({_unencodable(patch)}): git could not read what it would write"]
        verdict.error = "the patch was refused: " + verdict.refused[0]
        return verdict
    log = ""
    try:
        with Container.start(client, image, limits=limits, workdir=task.workdir) as container:
            verdict.durations_s["start"] = time.monotonic() - started
            if task.kind == "harbor":
                log = _run_harbor(container, task, patch, verdict, timeout_s)
            else:
                log = _run_eval_script(container, task, patch, verdict, timeout_s)
    except INFRASTRUCTURE:
        raise  # the engine failed, not the patch: the batch retries or reports it
    except Exception as exc:  # noqa: BLE001 - a check that raises still leaves this row a verdict
        verdict.resolved, verdict.reward = False, 0.0
        verdict.error = f"the verifier failed on this patch ({type(exc).__name__}: {str(exc)[:300]}): not graded"
    verdict.durations_s["total"] = time.monotonic() - started
    verdict.log_tail = log[-4000:]
    if log_dir is not None:
        path = log_dir / task.instance_id / f"{verdict.patch_hash}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(log)
        verdict.log_path = str(path)
    return verdict


def _unencodable(patch: str) -> str | None:
    """Where a string holds what UTF-8 cannot write (a lone surrogate), or None."""
    try:
        patch.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{exc.reason} at offset {exc.start}"
    return None


def _apply_candidate(
    container: Container, task: Task, patch: str | None, base_commit: str, verdict: Verdict, runner: frozenset[str] = frozenset()
) -> list[str]:
    """Apply the candidate, if there is one, under ``envs.candidate``'s policy; sets
    ``verdict.error`` when it is refused or does not apply. Returns the log lines."""
    if not verdict.patch_exists or patch is None:
        return []
    protected = set(task.test_files) | set(patch_files(task.test_patch))
    applied = apply_candidate(container, patch, base_commit, protected, runner_files=runner)
    verdict.apply_command = applied.command
    verdict.touched_files = applied.touched
    verdict.refused = applied.refused
    verdict.restored_files = applied.restored
    verdict.neutralized = applied.neutralized
    verdict.suspicious = applied.suspicious
    if applied.refused:
        verdict.error = "the patch was refused: " + "; ".join(applied.refused)
    elif applied.error:
        verdict.error = applied.error
    else:
        verdict.patch_applied = True
    return [applied.log] if applied.log else []


def _base_commit(container: Container, task: Task) -> str:
    """The task's base commit, else the work directory's HEAD ("HEAD" where it is no git
    repository, as some Harbor environments are: git then only applies the patch)."""
    if task.base_commit:
        return task.base_commit
    head = container.exec("git rev-parse HEAD", timeout_s=60, env=GIT_ENV)
    return head.stdout.strip() if head.ok else "HEAD"


def _run_eval_script(container: Container, task: Task, patch: str | None, verdict: Verdict, timeout_s: float) -> str:
    base_commit = _base_commit(container, task)
    script = task.eval_script or mini_eval_script(task, base_commit)
    phases = split_eval_script(script, task.workdir, instrument=task.kind == "swebench", tests=task.FAIL_TO_PASS + task.PASS_TO_PASS)
    runner = frozenset().union(*(runner_files(line) for line in phases.test.split("\n"))) if phases else frozenset()
    if phases is not None and phases.canary:
        _package_canary(container, task, phases, verdict)  # at the base: before the candidate goes in
    log_lines = _apply_candidate(container, task, patch, base_commit, verdict, runner)
    if verdict.error:
        return "\n".join(log_lines)
    if phases is None:
        return _run_whole_script(container, task, script, verdict, timeout_s, log_lines)
    files: dict[str, tuple[bytes | str, int]] = {SETUP_PATH: (phases.setup, 0o755), TESTS_PATH: (phases.test, 0o755)}
    if task.test_patch.strip():
        # The test patch must be in place when the tests start, whatever the setup did.
        files[TEST_PATCH_PATH] = (task.test_patch if task.test_patch.endswith("\n") else task.test_patch + "\n", 0o644)
        files[SETUP_PATH] = (phases.setup + f"git apply --check --reverse {TEST_PATCH_PATH} || exit {TEST_PATCH_MISSING}\n", 0o755)
    if phases.canary_text:
        files[CANARY_SOURCE] = (phases.canary_text, 0o644)
    if phases.guard is not None:
        files.update(phases.guard.files)  # the launcher and the guard, outside the repository
    container.put_files(files)
    setup = container.exec(f"bash {SETUP_PATH}", timeout_s=timeout_s, env=GIT_ENV, output_cap=LOG_CAP)
    if setup.omitted_bytes:
        verdict.log_omitted_bytes["setup"] = setup.omitted_bytes
    log_lines.append(f"$ setup\n{setup.output}")
    if setup.timed_out or setup.exit_code in (SETUP_FAILED, TEST_PATCH_MISSING):
        if setup.timed_out:
            verdict.error = "the test setup timed out"
        elif setup.exit_code == TEST_PATCH_MISSING:
            verdict.error = "the test patch is not in place after the setup (the test files are not the ones the task grades with)"
        else:
            verdict.error = f"the test setup failed, nothing was graded: {_last_relearn_line(setup.output)}"
        return "\n".join(log_lines)
    output, exit_code, report = _run_tests(container, phases, verdict, timeout_s)
    log_lines.append(f"$ tests (exit status {exit_code})\n{output}")
    if verdict.log_omitted_bytes.get("tests"):
        verdict.error = (
            f"the test output is {verdict.log_omitted_bytes['tests'] + TEST_LOG_CAP:,} bytes, over the {TEST_LOG_CAP >> 20} MiB "
            "the verifier keeps whole: not graded (a log with its middle cut could hide results)"
        )
        return "\n".join(log_lines)
    if task.kind == "openswe":
        grade_openswe(exit_code, verdict)
    else:
        grade(swebench_test_spec(task, base_commit), task, phases, output, exit_code, report, verdict)
        verdict.network_needed = offline_failures(verdict, output)
    verdict.reward = 1.0 if verdict.resolved else 0.0
    return "\n".join(log_lines)


def _package_canary(container: Container, task: Task, phases: Phases, verdict: Verdict) -> None:
    """The canary rewritten to call the package under test, with the facts the base commit
    has (``envs.package_probe``, cached per image); where none was found it stays builtins
    only, and ``verdict.canary`` says why (a run graded so is never called tampered for it)."""
    started = time.monotonic()
    probe = probe_package(
        container,
        image_key=verdict.image_digest or verdict.image,
        workdir=task.workdir,
        environment=phases.environment,
        target=phases.canary_file,
        test_patch=task.test_patch,
    )
    if probe.probed:
        verdict.durations_s["package_probe"] = time.monotonic() - started
    if probe.facts is None:
        verdict.canary = f"builtins only: the package canary was not placed ({probe.reason})"
        return
    failing = [name for name, end in phases.canary.items() if end == "failed"]
    passing = [name for name, end in phases.canary.items() if end == "passed"]
    phases.canary_text = canary_text(failing + passing, phases.canary_class, probe.facts)
    verdict.canary = f"calls the package under test, {probe.facts.package}"


def _run_tests(container: Container, phases: Phases, verdict: Verdict, timeout_s: float) -> tuple[str, int | None, bytes | None]:
    """The test command alone (its script and canary are in place): its output, its exit
    status (from Docker), its report."""
    started = time.monotonic()
    # Only the interleaved output is graded: stdout and stderr apart need no big cap.
    result = container.exec(f"bash {TESTS_PATH}", timeout_s=timeout_s, env=GIT_ENV, output_cap=TEST_LOG_CAP, stream_cap=1 << 20)
    verdict.durations_s["tests"] = time.monotonic() - started
    if result.omitted_bytes:
        verdict.log_omitted_bytes["tests"] = result.omitted_bytes
    verdict.timed_out = result.timed_out
    report = None
    if phases.report_path is not None:
        try:
            report = container.get_file(phases.report_path)
        except (FileNotFoundError, IsADirectoryError):
            report = None
    if phases.guard is not None and phases.guard.report_path is not None:
        # Read back before grading: a report missing or unfinished is a disagreement, so never resolved.
        try:
            guard_report = container.get_file(phases.guard.report_path)
        except (FileNotFoundError, IsADirectoryError):
            guard_report = None
        judge_guard(guard_report, phases.guard.report_path, verdict)
    return result.output, result.exit_code, report


def _run_whole_script(container: Container, task: Task, script: str, verdict: Verdict, timeout_s: float, log_lines: list[str]) -> str:
    """An eval script without test markers runs whole (OpenSWE scripts that echo their own
    marker); only an OpenSWE task can be graded that way."""
    container.put_file(SCRIPT_PATH, script, mode=0o755)
    result = container.exec(f"bash {SCRIPT_PATH}", timeout_s=timeout_s, env=GIT_ENV, output_cap=LOG_CAP)
    verdict.timed_out = result.timed_out
    log_lines.append(result.output)
    if task.kind == "openswe":
        grade_openswe(result.exit_code, verdict, result.output)
    else:
        verdict.error = (
            f"the eval script has no {START_TEST_OUTPUT!r} / {END_TEST_OUTPUT!r} markers around its test command: nothing to grade"
        )
    verdict.reward = 1.0 if verdict.resolved else 0.0
    return "\n".join(log_lines)


def _last_relearn_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("relearn: ")]
    return lines[-1].removeprefix("relearn: ") if lines else "see the log"


def _run_harbor(container: Container, task: Task, patch: str | None, verdict: Verdict, timeout_s: float) -> str:
    """Harbor's protocol: upload tests/ to /tests, run test.sh, read the reward file."""
    assert task.task_dir is not None
    log_lines = _apply_candidate(container, task, patch, _base_commit(container, task), verdict)
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
