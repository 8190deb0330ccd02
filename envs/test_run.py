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

A pytest command also writes a JUnit XML report outside the repository and runs a canary
file with two tests named by a random nonce: one that must fail and one that must pass.
A run whose canary is reported otherwise had its reporting rewritten (a plugin, a patched
outcome, an xfail marker added to every test), and is not graded as resolved.
"""

from __future__ import annotations

import re
import secrets
import shlex
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

SETUP_FAILED = 97  # the setup run's exit status when a reset or the test patch failed
ENV_WORDS = ("source", ".", "conda", "cd", "export")
ECHO_ONLY = re.compile(r"^git (-c \S+ )*(status|show|diff)\b")
FATAL = re.compile(r"^git (-c \S+ )*(checkout|apply)\b")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z0-9_.\-]+)\1")
PYTEST_CALL = re.compile(r"(^|[\s;&|(])(python[0-9.]*\s+(-\S+\s+)*-m\s+pytest|pytest|py\.test)(\s|$)")


@dataclass
class Phases:
    setup: str
    test: str
    pytest: bool = False  # the test command is pytest: it writes ``report_path`` and runs the canary
    report_path: str | None = None
    canary_path: str | None = None
    canary: dict[str, str] = field(default_factory=dict)  # test name -> the outcome it must have


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


def split_eval_script(script: str, workdir: str, *, instrument: bool = True) -> Phases | None:
    """The setup and test runs of an eval script, or None when it has no test markers.
    ``instrument``: give a pytest command its report and canary (graders that read only the
    exit status, OpenSWE's, need neither)."""
    parts = commands(script)
    starts = [i for i, c in enumerate(parts) if START_TEST_OUTPUT in c and c.lstrip().startswith(":")]
    ends = [i for i, c in enumerate(parts) if END_TEST_OUTPUT in c and c.lstrip().startswith(":")]
    if not starts or not ends or ends[0] < starts[0]:
        return None
    before, tests = parts[: starts[0]], parts[starts[0] + 1 : ends[0]]
    if not tests:
        return None
    environment = [c for c in before if c.split(maxsplit=1)[0] in ENV_WORDS]
    setup: list[str] = []
    for command in before:
        if ECHO_ONLY.match(command):
            continue
        if FATAL.match(command):
            first, _, rest = command.partition("\n")
            what = shlex.quote(" ".join(first.split()[:3]))
            first += f' || {{ echo "relearn: setup step failed: "{what} >&2; exit {SETUP_FAILED}; }}'
            command = first + ("\n" + rest if rest else "")
        setup.append(command)
    phases = Phases(setup=_script(setup), test="")
    test_lines = list(tests)
    # The run's exit status is the test command's: the pytest call, else the first command
    # (a script may go on with `rc=$?` and the like, which would end with status 0).
    main = next((i for i, c in enumerate(test_lines) if PYTEST_CALL.search(c) and "<<" not in c), None)
    if main is not None and instrument:
        nonce = secrets.token_hex(6)
        phases.pytest = True
        phases.report_path = f"/tmp/relearn-report-{nonce}/junit.xml"
        directory = _first_test_dir(test_lines[main])
        phases.canary_path = f"{workdir.rstrip('/')}/{directory + '/' if directory else ''}test_relearn_canary_{nonce}.py"
        phases.canary = {f"test_relearn_must_fail_{nonce}": "failed", f"test_relearn_must_pass_{nonce}": "passed"}
        test_lines[main] += f" --junitxml={phases.report_path} -o junit_family=xunit1 {shlex.quote(phases.canary_path)}"
    at = main if main is not None else 0
    test_lines.insert(at + 1, "relearn_status=$?")
    phases.test = _script(environment + test_lines + ["exit $relearn_status"])
    return phases


def canary_source(phases: Phases) -> str:
    fail, passing = list(phases.canary)
    return f"def {fail}():\n    assert False, 'relearn canary: must fail'\n\n\ndef {passing}():\n    pass\n"


def canary_id(phases: Phases, name: str, workdir: str) -> str:
    assert phases.canary_path is not None
    return f"{phases.canary_path.removeprefix(workdir.rstrip('/') + '/')}::{name}"


def _first_test_dir(command: str) -> str:
    """The folder of the first test file the command names (the canary goes beside it, under
    the same conftest files and rootdir), or "" for the work directory."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for word in words:
        path = word.split("::")[0]
        if path.endswith(".py") and not path.startswith(("-", "/")) and ".." not in path.split("/"):
            return path.rsplit("/", 1)[0] if "/" in path else ""
    return ""


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
