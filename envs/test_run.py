"""Running a task's tests so that only the test command speaks for the result.

A SWE-bench eval script (and the one the mini suite gets) is split at its
``>>>>> Start Test Output`` / ``>>>>> End Test Output`` markers into two runs in the
container:

- **setup**: the environment lines (``source``, ``conda activate``, ``cd``, ``export``),
  installs, and the reset of the test files and the test patch, where a failed
  ``git checkout`` or ``git apply`` ends the run as an error instead of testing whatever
  the candidate left (the scripts run without ``set -e``). Lines that only echo the
  candidate's changes (``git status``, ``git show``, ``git diff``) are dropped.
- **tests**: the environment lines again, then the test command alone. Its output is the
  only text graded, and its exit status comes from Docker, not from a line it prints.

A pytest command (run directly or by tox after its ``--``) also writes a JUnit XML report
outside the repository. Every recognised runner (pytest, tox-run pytest, SymPy's
``bin/test``, Django's ``runtests.py`` and its kind) runs a canary: two tests appended to
the first test file the command runs, just before it runs, named with the words of the
task's own test names: one that must fail and one that must pass. The file is one git
tracks, so tampering that spares untracked files or odd names does not spare the canary. A
run whose canary is reported otherwise had its reporting rewritten (a plugin, a patched
outcome, an xfail marker added to every test, results printed at exit), and is not graded
as resolved.
"""

from __future__ import annotations

import re
import secrets
import shlex
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

from envs.canary import canary_class, canary_id, canary_names, canary_text  # noqa: F401 - canary_id: callers import it from here
from envs.frameworks import REGISTRY, Launch
from envs.frameworks.base import command_words, first_test_file
from envs.runner_guard import Placement, place_guard

SETUP_FAILED = 97  # the setup run's exit status when a reset or the test patch failed
ENV_WORDS = ("source", ".", "conda", "cd", "export")
ECHO_ONLY = re.compile(r"^git (-c \S+ )*(status|show|diff)\b")
FATAL = re.compile(r"^git (-c \S+ )*(checkout|apply)\b")
RESET = re.compile(r"^git checkout ([0-9a-f]{7,40}) ((?:[\w./+@-]+ ?)+)$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z0-9_.\-]+)\1")


@dataclass
class Phases:
    setup: str
    test: str
    pytest: bool = False  # the test command's framework writes a JUnit report (pytest, directly or under tox) to ``report_path``
    report_path: str | None = None
    # The canary: tests named like the task's own, appended to a test file the command runs
    # (a file git tracks, so nothing tells them from the task's tests), one that must fail
    # and one that must pass. ``framework`` says how they are named in the log.
    framework: str | None = None  # its name in ``envs.frameworks``: "pytest", "sympy" (bin/test), "unittest" (runtests.py)
    canary_file: str | None = None  # repository-relative path the canary is appended to
    canary_class: str = ""  # the class whose methods the canary tests are; "" for functions
    canary_text: str = ""
    canary: dict[str, str] = field(default_factory=dict)  # test name -> the outcome it must have
    environment: list[str] = field(default_factory=list)  # the eval script's environment lines, which both runs start with
    guard: Placement | None = None  # the runner guard (envs.runner_guard): its report's path, or why it was not placed


def commands(script: str) -> list[str]:
    """The script's commands, one per entry; a here-document stays with its command."""
    lines = script.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.startswith("#!") or re.match(r"^set\s+[-+]", line):
            continue
        block = [line]
        heredoc = HEREDOC.search(line)
        if heredoc:
            delimiter = heredoc.group(2)
            while i < len(lines):
                block.append(lines[i])
                i += 1
                if lines[i - 1].rstrip() == delimiter:
                    break
        out.append("\n".join(block))
    return out


def split_eval_script(script: str, workdir: str, *, instrument: bool = True, tests: list[str] | tuple[str, ...] = ()) -> Phases | None:
    """The setup and test runs of an eval script, or None when it has no test markers.
    ``instrument``: give the test command its report and canary (graders that read only the
    exit status, OpenSWE's, need neither); ``tests``: the task's test ids, whose words name
    the canary tests."""
    parts = commands(script)
    starts = [i for i, c in enumerate(parts) if START_TEST_OUTPUT in c and c.lstrip().startswith(":")]
    ends = [i for i, c in enumerate(parts) if END_TEST_OUTPUT in c and c.lstrip().startswith(":")]
    if not starts or not ends or ends[0] < starts[0]:
        return None
    before, tests_part = parts[: starts[0]], parts[starts[0] + 1 : ends[0]]
    if not tests_part:
        return None
    environment = [c for c in before if c.split(maxsplit=1)[0] in ENV_WORDS]
    setup: list[str] = []
    for command in before:
        if ECHO_ONLY.match(command):
            continue
        reset = RESET.match(command.strip())
        if reset:
            command = _reset_test_files(reset.group(1), reset.group(2).split())
        if FATAL.match(command):
            first, _, rest = command.partition("\n")
            what = shlex.quote(" ".join(first.split()[:3]))
            first += f' || {{ echo "relearn: setup step failed: "{what} >&2; exit {SETUP_FAILED}; }}'
            command = first + ("\n" + rest if rest else "")
        setup.append(command)
    phases = Phases(setup=_script(setup), test="", environment=environment)
    test_lines = list(tests_part)
    # The run's exit status is the test command's: the recognised runner, else the first
    # command (a script may go on with `rc=$?` and the like, which would end with status 0).
    found = REGISTRY.test_command(test_lines)
    main = found[0] if found is not None else None
    if found is not None and instrument:
        main = _instrument(phases, test_lines, found[0], found[1], workdir.rstrip("/"), tests)
        main, phases.guard = place_guard(test_lines, main, found[1].framework.name, found[1].direct)
    at = main if main is not None else 0
    test_lines.insert(at + 1, "relearn_status=$?")
    phases.test = _script(environment + test_lines + ["exit $relearn_status"])
    return phases


def _reset_test_files(commit: str, paths: list[str]) -> str:
    """The eval script's `git checkout BASE TEST_FILES`, one file at a time: a file the test
    patch creates does not exist at the base, and git refuses the whole checkout for it
    (15 of the 500 Verified rows), which here is fatal. It is removed instead, so that the
    test patch creates it; every other file is reset, and a missing base commit still fails."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f"git checkout {commit} -- {quoted} 2>/dev/null || (git cat-file -e {commit}^{{commit}} && for relearn_path in {quoted}; do "
        f'if git cat-file -e {commit}:"$relearn_path" 2>/dev/null; then git checkout {commit} -- "$relearn_path" || exit 1; '
        f'else rm -rf -- "$relearn_path"; fi; done)'
    )


def _instrument(phases: Phases, lines: list[str], main: int, launch: Launch, workdir: str, tests: list[str] | tuple[str, ...]) -> int:
    """The report (a framework that writes one: pytest, tox-run pytest) and the canary, appended
    to the first test file the command runs just before it runs. Returns where the test command
    now is."""
    nonce = secrets.token_hex(6)
    command = lines[main]
    framework = launch.framework
    candidates = framework.canary_files(_words(command), tests, REGISTRY.is_runner_file)
    target = candidates[0] if candidates else None
    names = canary_names(tests, 2)
    phases.framework = framework.name
    phases.canary = {names[0]: "failed", names[1]: "passed"}
    arguments = ""
    if framework.junit_report:
        phases.pytest = True
        phases.report_path = f"/tmp/relearn-report-{nonce}/junit.xml"
        arguments = framework.report_arguments(phases.report_path)
    if target is None and framework.creates_canary_file:
        # no test file named: a new one beside the first folder named, tracked like the rest
        folder = _first_test_dir(command)
        target = f"{folder + '/' if folder else ''}test_{'_'.join(names[1].split('_')[1:3])}_{nonce[:4]}.py"
        arguments += framework.file_arguments([target])
    if arguments:
        # tox hands pytest what follows its `--`
        passthrough = launch.launcher.passthrough
        if passthrough and f" {passthrough} " not in f" {command} ":
            command += f" {passthrough}"
        lines[main] = command + arguments
    if target is None:
        phases.framework, phases.canary = None, {}
        return main
    phases.canary_file = target
    phases.canary_class = canary_class(names, framework.name, [t.removeprefix(target + "::") for t in tests if t.startswith(target + "::")])
    phases.canary_text = canary_text(names, phases.canary_class)
    # The first of the files that exists (a label may name a module outside the tests); where
    # the framework takes a new file (pytest), it is created when it is new.
    files = " ".join(shlex.quote(f"{workdir}/{path}") for path in candidates or [target])
    lines.insert(
        main,
        f'for f in {files}; do if [ -f "$f" ] || [ {int(framework.creates_canary_file)} = 1 ]; then cat {CANARY_SOURCE} >> "$f"; '
        'git add -N -- "$f" 2>/dev/null; break; fi; done',
    )
    return main + 1


CANARY_SOURCE = "/tmp/relearn/canary.txt"


def runner_files(command: str) -> frozenset[str]:
    """Repository files the test command names as its runner or settings (``bin/test``,
    ``./tests/runtests.py``): restored like configuration when a patch touches them."""
    found: set[str] = set()
    for word in _words(command):
        path = word.split("::")[0].removeprefix("./")
        if word.startswith("-") or "=" in word or path.startswith("/") or ".." in path.split("/"):
            continue
        if REGISTRY.is_runner_file(path):
            found.add(path)
    return frozenset(found)


def _words(command: str) -> list[str]:
    return command_words(command)


def _first_test_dir(command: str) -> str:
    """The folder of the first test file the command names (the canary goes beside it, under
    the same conftest files and rootdir), or "" for the work directory."""
    path = first_test_file(_words(command), (), REGISTRY.is_runner_file)
    return path.rsplit("/", 1)[0] if path and "/" in path else ""


def _script(lines: list[str]) -> str:
    return "#!/bin/bash\nset -uo pipefail\n" + "\n".join(lines) + "\n"


# --- the report ----------------------------------------------------------------------------


def parse_junit(xml: bytes) -> dict[str, str]:
    """Test id (``path::Class::name``, as pytest and swebench's parser write it) -> PASSED,
    FAILED, ERROR, SKIPPED or XFAIL, from a ``junit_family=xunit1`` report. ValueError when
    the report is not JUnit XML."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise ValueError(f"the report is not XML: {exc}") from None
    statuses: dict[str, str] = {}
    for case in root.iter("testcase"):
        path, classname, name = case.get("file") or "", case.get("classname") or "", case.get("name") or ""
        module = path.removesuffix(".py").replace("/", ".")
        inner = classname[len(module) + 1 :] if path and classname.startswith(module + ".") else ""
        parts = [path or classname.replace(".", "/") + ".py", *(inner.split(".") if inner else []), name]
        test_id = "::".join(p for p in parts if p)
        kinds = {child.tag: child for child in case}
        if "error" in kinds:
            status = "ERROR"
        elif "failure" in kinds:
            status = "FAILED"
        elif "skipped" in kinds:
            status = "XFAIL" if (kinds["skipped"].get("type") or "") == "pytest.xfail" else "SKIPPED"
        else:
            status = "PASSED"
        # A failure in teardown adds an <error> to a passed test: the worse result stands.
        if statuses.get(test_id) in ("FAILED", "ERROR") and status not in ("FAILED", "ERROR"):
            continue
        statuses[test_id] = status
    return statuses


def outcome_class(status: str | None) -> str:
    """passed / failed / skipped / missing: what two reports must agree on."""
    if status is None:
        return "missing"
    return {"PASSED": "passed", "XFAIL": "passed", "SKIPPED": "skipped"}.get(status, "failed")
