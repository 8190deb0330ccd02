"""The image contract: what an image must hold for a SWE-bench-style task to run in it, and
a check of one image against it, offline.

An image for a task must have, with the network off:

- the repository in the task's work directory (``/testbed``) as a git repository, with
  the task's base commit in its history, and git itself;
- what the eval script's environment lines call: for SWE-bench rows
  ``source /opt/miniconda3/bin/activate`` and ``conda activate testbed``;
- the test command's interpreter and test runner, with everything the tests import
  already installed (containers have no network, so nothing can be fetched at test time).

``check_image`` starts the image without network and checks each point in turn; the
report lists what is missing in the words of the check that failed.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

import docker
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.frameworks import REGISTRY
from envs.images import image_exists
from envs.tasks import Task
from envs.test_run import ENV_WORDS, commands

CHECK_TIMEOUT_S = 300.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


@dataclass
class ContractReport:
    instance_id: str
    image: str
    checks: list[Check] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok for c in self.checks if c.required)

    def missing(self) -> list[str]:
        failed = [f"{c.name}: {c.detail}" for c in self.checks if c.required and not c.ok]
        return ([self.error] if self.error else []) + failed


def script_parts(script: str) -> tuple[list[str], str | None]:
    """The eval script's environment commands before its tests, and its test command."""
    parts = commands(script)
    starts = [i for i, c in enumerate(parts) if START_TEST_OUTPUT in c and c.lstrip().startswith(":")]
    if not starts:
        return [c for c in parts if c.split(maxsplit=1)[0] in ENV_WORDS], None
    before = parts[: starts[0]]
    tests = [c for c in parts[starts[0] + 1 :] if not (END_TEST_OUTPUT in c and c.lstrip().startswith(":"))]
    environment = [c for c in before if c.split(maxsplit=1)[0] in ENV_WORDS]
    found = REGISTRY.test_command(tests)  # the line the verifier instruments and grades
    return environment, tests[found[0]] if found is not None else tests[0] if tests else None


def command_words(command: str) -> list[str]:
    """The test command's words without its ``VAR=value`` prefixes."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    while words and "=" in words[0] and not words[0].startswith(("-", "/", ".")):
        words = words[1:]
    return words


def runner_probes(command: str) -> list[tuple[str, str]]:
    """(what, shell command) pairs that show the test command's interpreter and runner
    start, without running the tests."""
    words = command_words(command)
    if not words:
        return []
    launch = REGISTRY.detect(command)
    framework_probes = launch.framework.probes(words) if launch is not None else None
    if framework_probes is not None:
        return framework_probes
    first = words[0]
    if first.startswith("python"):
        probes = [("the interpreter", f"{first} --version")]
        if "-m" in words[1:]:
            module = words[words.index("-m") + 1] if words.index("-m") + 1 < len(words) else ""
            if module:
                probes.append((f"the test runner (python -m {module})", f"{first} -c {shlex.quote(f'import {module}')}"))
        return probes
    if "/" in first:  # a script in the repository: sympy's bin/test, Django's tests/runtests.py
        return [(f"the test runner ({first})", f"test -e {shlex.quote(first)} && python {shlex.quote(first)} --help >/dev/null")]
    return [(f"the test command ({first})", f"command -v {shlex.quote(first)}")]


def check_image(client: docker.DockerClient, task: Task, image: str, script: str, *, limits: Limits = DEFAULT_LIMITS) -> ContractReport:
    """Start ``image`` offline and check it against the contract for ``task`` whose eval
    script is ``script``."""
    report = ContractReport(task.instance_id, image)
    if not image_exists(client, image):
        report.error = f"image {image} is not on this engine"
        return report
    environment, test_command = script_parts(script)
    offline = Limits(cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids, network=False)
    workdir = task.workdir
    with Container.start(client, image, limits=offline, workdir="/") as box:

        def run(command: str, cwd: str = "/") -> tuple[bool, str]:
            result = box.exec(command, timeout_s=CHECK_TIMEOUT_S, workdir=cwd)
            tail = result.output.strip().splitlines()[-3:]
            return result.ok, " / ".join(tail)

        def add(name: str, ok: bool, good: str, bad: str, required: bool = True) -> bool:
            report.checks.append(Check(name, ok, good if ok else bad, required))
            return ok

        present, _ = run(f"test -d {shlex.quote(workdir)}")
        add("work directory", present, f"{workdir} exists", f"{workdir} does not exist: the repository must be there")
        has_git, _ = run("command -v git")
        add("git", has_git, "git is installed", "git is not on PATH: the verifier applies patches and resets test files with it")
        if not (present and has_git):
            return report
        repo, _ = run("git -c safe.directory='*' rev-parse --git-dir", workdir)
        if not add("repository", repo, f"{workdir} is a git repository", f"{workdir} is not a git repository"):
            return report
        if task.base_commit:
            base = shlex.quote(task.base_commit + "^{commit}")
            reachable, _ = run(f"git -c safe.directory='*' cat-file -e {base}", workdir)
            add(
                "base commit",
                reachable,
                f"{task.base_commit[:12]} is in the repository's history",
                f"{task.base_commit[:12]} is not in the repository's history: the image holds another revision (or a shallow clone without it)",
            )
        patch_ok, _ = run("command -v patch")
        add(
            "patch",
            patch_ok,
            "GNU patch is installed",
            "GNU patch is missing: only `git apply` will be tried on candidate patches",
            required=False,
        )
        prefix = "set -uo pipefail\n"  # as the verifier runs the eval script's lines
        for line in dict.fromkeys(environment):  # scripts repeat their activation: check each line once
            ok, output = run(f"{prefix}{line}", workdir)
            if not add(f"environment: {line.splitlines()[0]}", ok, "runs", f"fails ({output or 'no output'})"):
                return report
            prefix += f"{line} || exit 97\n"
        if test_command is None:
            report.checks.append(Check("test command", False, "the eval script has no test command between its test markers"))
            return report
        for what, probe in runner_probes(test_command):
            ok, output = run(f"{prefix}{probe}", workdir)
            add(what, ok, f"starts (`{probe}`)", f"does not start offline (`{probe}`: {output or 'no output'})")
        _where(run, prefix, test_command, workdir, report)
        launch = REGISTRY.detect(test_command)
        if launch is not None and launch.direct:  # a runner under tox gets its arguments through tox
            collect = launch.framework.collect_command(command_words(test_command), "$existing")
            _collect(box, task, prefix, launch.framework.name, collect, report)
    return report


def _where(run: Callable[[str, str], tuple[bool, str]], prefix: str, command: str, workdir: str, report: ContractReport) -> None:
    """Where the test command's program lives, and a warning when an activated environment
    does not hold it (a system pytest would run the tests without the environment's
    packages)."""
    words = command_words(command)
    if not words or "/" in words[0]:
        return
    ok, output = run(f'{prefix}echo "$(command -v {shlex.quote(words[0])})|${{CONDA_PREFIX:-}}"', workdir)
    found, _, environment = output.rpartition("|")
    if not ok or not found:
        return
    inside = not environment or found.startswith(environment.rstrip("/") + "/")
    detail = f"{words[0]} is {found}" + ("" if inside else f", outside the activated environment {environment}")
    report.checks.append(Check("test runner location", inside, detail, required=False))


def _collect(box: Container, task: Task, prefix: str, runner: str, collect: str | None, report: ContractReport) -> None:
    """The runner collects the task's test files that exist at the base commit (``collect``, the
    framework's command that only imports ``$existing``): their imports, and so the installed
    dependencies, work offline."""
    if collect is None:
        return
    files = sorted({t.split("::")[0] for t in task.FAIL_TO_PASS + task.PASS_TO_PASS if t.split("::")[0].endswith(".py")})
    if not files:
        files = [f for f in task.test_files if f.endswith(".py")]
    if not files:
        return
    quoted = " ".join(shlex.quote(f) for f in files)
    probe = f'existing=$(for f in {quoted}; do [ -e "$f" ] && echo "$f"; done); [ -z "$existing" ] || {collect}'
    result = box.exec(prefix + probe, timeout_s=CHECK_TIMEOUT_S, workdir=task.workdir)
    # 5: nothing collected (the test patch adds every test), which is no import error
    ok = result.exit_code in (0, 5)
    tail = " / ".join(result.output.strip().splitlines()[-3:])
    report.checks.append(
        Check(
            "test files import", ok, f"{runner} collects the task's test files" if ok else f"{runner} cannot collect them offline: {tail}"
        )
    )
