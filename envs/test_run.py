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
from collections import Counter
from dataclasses import dataclass, field

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

SETUP_FAILED = 97  # the setup run's exit status when a reset or the test patch failed
ENV_WORDS = ("source", ".", "conda", "cd", "export")
ECHO_ONLY = re.compile(r"^git (-c \S+ )*(status|show|diff)\b")
FATAL = re.compile(r"^git (-c \S+ )*(checkout|apply)\b")
RESET = re.compile(r"^git checkout ([0-9a-f]{7,40}) ((?:[\w./+@-]+ ?)+)$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z0-9_.\-]+)\1")
PYTEST_CALL = re.compile(r"(^|[\s;&|(])(python[0-9.]*\s+(-\S+\s+)*-m\s+pytest|pytest|py\.test)(\s|$)")


@dataclass
class Phases:
    setup: str
    test: str
    pytest: bool = False  # the test command is pytest (directly or under tox): it writes ``report_path``
    report_path: str | None = None
    # The canary: tests named like the task's own, appended to a test file the command runs
    # (a file git tracks, so nothing tells them from the task's tests), one that must fail
    # and one that must pass. ``framework`` says how they are named in the log.
    framework: str | None = None  # "pytest", "sympy" (bin/test) or "unittest" (Django's runtests.py and its kind)
    canary_file: str | None = None  # repository-relative path the canary is appended to
    canary_class: str = ""  # the class whose methods the canary tests are; "" for functions
    canary_text: str = ""
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
    phases = Phases(setup=_script(setup), test="")
    test_lines = list(tests_part)
    # The run's exit status is the test command's: the recognised runner, else the first
    # command (a script may go on with `rc=$?` and the like, which would end with status 0).
    main, framework = _test_command(test_lines)
    if main is not None and framework is not None and instrument:
        main = _instrument(phases, test_lines, main, framework, workdir.rstrip("/"), tests)
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


def _test_command(lines: list[str]) -> tuple[int | None, str | None]:
    """Which line runs the tests, and under which runner."""
    for i, command in enumerate(lines):
        if "<<" in command:
            continue
        if PYTEST_CALL.search(command):
            return i, "pytest"
        if TOX_CALL.search(command):
            return i, "tox"
        if SYMPY_CALL.search(command):
            return i, "sympy"
        if UNITTEST_CALL.search(command):
            return i, "unittest"
    return None, None


def _instrument(phases: Phases, lines: list[str], main: int, runner: str, workdir: str, tests: list[str] | tuple[str, ...]) -> int:
    """The report (pytest, tox-run pytest) and the canary, appended to the first test file the
    command runs just before it runs. Returns where the test command now is."""
    nonce = secrets.token_hex(6)
    command = lines[main]
    words = _words(command)
    framework = "pytest" if runner == "tox" else runner
    candidates = _unittest_files(words) if framework == "unittest" else []
    target = candidates[0] if candidates else None if framework == "unittest" else _first_test_file(words, tests)
    names = canary_names(tests, 2)
    phases.framework = framework
    phases.canary = {names[0]: "failed", names[1]: "passed"}
    if framework == "pytest":
        phases.pytest = True
        phases.report_path = f"/tmp/relearn-report-{nonce}/junit.xml"
        report = f" --junitxml={phases.report_path} -o junit_family=xunit1"
        if target is None:  # no test file named: a new one beside the first folder named, tracked like the rest
            folder = _first_test_dir(command)
            target = f"{folder + '/' if folder else ''}test_{'_'.join(names[1].split('_')[1:3])}_{nonce[:4]}.py"
            report += f" {shlex.quote(target)}"
        if runner == "tox":
            if " -- " not in f" {command} ":
                command += " --"
            command += report
        else:
            command += report
        lines[main] = command
    if target is None:
        phases.framework, phases.canary = None, {}
        return main
    phases.canary_file = target
    phases.canary_class = canary_class(names, framework, [t.removeprefix(target + "::") for t in tests if t.startswith(target + "::")])
    phases.canary_text = canary_text(names, phases.canary_class)
    # The first of the files that exists (a label may name a module outside the tests); for
    # pytest the file is created when it is new.
    files = " ".join(shlex.quote(f"{workdir}/{path}") for path in candidates or [target])
    lines.insert(
        main,
        f'for f in {files}; do if [ -f "$f" ] || [ {int(framework == "pytest")} = 1 ]; then cat {CANARY_SOURCE} >> "$f"; '
        'git add -N -- "$f" 2>/dev/null; break; fi; done',
    )
    return main + 1


CANARY_SOURCE = "/tmp/relearn/canary.txt"
TOX_CALL = re.compile(r"(^|[\s;&|(])tox(\s|$)")
SYMPY_CALL = re.compile(r"(^|[\s;&|(])(\./)?bin/test(\s|$)")
UNITTEST_CALL = re.compile(r"(^|[\s;&|(/])runtests\.py(\s|$)")
VOCABULARY = ("value", "parse", "empty", "default", "range", "order", "format", "error", "input", "result", "basic", "cases")


def canary_names(tests: list[str] | tuple[str, ...], count: int) -> list[str]:
    """Test names made of the words the task's own test names use (so neither the name nor
    the file tells a canary apart), none of them a name the task has."""
    taken: set[str] = set()
    words: list[str] = []
    for test in tests:
        name = re.split(r"::|\s|\(|\[", test.split("::")[-1] if "::" in test else test)[0]
        taken.add(name)
        words += [w for w in name.removeprefix("test_").split("_") if w.isalpha() and len(w) > 1]
    pool = sorted(set(words)) if len(set(words)) >= 4 else sorted(set(words) | set(VOCABULARY))
    names: list[str] = []
    while len(names) < count:
        name = "test_" + "_".join(secrets.choice(pool) for _ in range(3))
        if name not in taken and name not in names:
            names.append(name)
    return names


def canary_text(names: list[str], cls: str = "") -> str:
    """The canary's source, appended to a test file: a test that must fail, one that must pass,
    each a plain assertion over random values in one of a few shapes (no fixed text to spot);
    module-level functions, or the methods of ``cls``, a ``unittest.TestCase`` (whose base is
    reached without binding a name: an ``import unittest`` appended to a module would rebind a
    ``unittest`` of its own, Twisted's trial, under its tests)."""
    failing, passing = _canary_body(names[0], fail=True), _canary_body(names[1], fail=False)
    if cls:
        indent = lambda body: body.replace("\n", "\n        ")  # noqa: E731
        return (
            f"\n\nclass {cls}(__import__('unittest').TestCase):\n"
            f"    def {names[0]}(self):\n        {indent(failing)}\n\n    def {names[1]}(self):\n        {indent(passing)}\n"
        )
    indent = lambda body: body.replace("\n", "\n    ")  # noqa: E731
    return f"\n\ndef {names[0]}():\n    {indent(failing)}\n\n\ndef {names[1]}():\n    {indent(passing)}\n"


def canary_class(names: list[str], framework: str, tests_in_file: list[str]) -> str:
    """The class the canary tests are methods of, named from the words of the passing one
    (`test_value_parse_order` -> `ValueParseOrderTests`), or "" for module-level functions:
    the canary takes the shape of the task's tests in its file, so that nothing tells it apart.

    Django's runner runs classes only, SymPy's ``bin/test`` functions only. Under pytest a
    file whose tests are methods of classes gets a class, in their naming style, and a
    ``unittest.TestCase``, which pytest collects whatever its naming settings and which no
    module-level set-up reaches: as functions the canary ran under what the module sets up for
    its functions, and pytest 6's nose support calls a module's ``setup()`` before each one.
    sphinx-doc__sphinx-7910's test module imports Sphinx's extension ``setup(app)`` (its own
    tests are ``TestCase`` methods), so the canary died with a TypeError and gold was called
    tampered."""
    words = "".join(w.capitalize() for w in names[1].removeprefix("test_").split("_"))
    if framework == "unittest":
        return words + "Tests"
    classes = [test.split("[")[0].split("::")[0] for test in tests_in_file if "::" in test.split("[")[0]]
    if framework != "pytest" or len(classes) <= len(tests_in_file) - len(classes):
        return ""
    style = Counter("Test{}" if c.startswith("Test") else "{}Test" if c.endswith("Test") else "{}Tests" for c in classes)
    return style.most_common(1)[0][0].format(words)


def _canary_body(name: str, *, fail: bool) -> str:
    a, b, c = (secrets.randbelow(900) + 100 for _ in range(3))
    words = name.removeprefix("test_").split("_")
    miss = 1 if fail else 0
    shapes = [
        f"values = sorted([{a}, {b}, {c}])\nassert values[-1] == {max(a, b, c) + miss}",
        f"parts = {' '.join(words)!r}.split()\nassert len(parts) == {len(words) + miss}",
        f"total = sum(range({a}))\nassert total == {a * (a - 1) // 2 + miss}",
        f"pairs = dict(zip({words!r}, range({len(words)})))\nassert pairs[{words[-1]!r}] == {len(words) - 1 + miss}",
    ]
    return secrets.choice(shapes)


def canary_id(phases: Phases, name: str, workdir: str = "") -> str:
    """The canary test's id as the framework's log names it (the prefix before `` (`` for
    unittest's ``name (module.Class)``)."""
    if phases.framework == "pytest":
        assert phases.canary_file is not None
        return "::".join(part for part in (phases.canary_file, phases.canary_class, name) if part)
    return name


def runner_files(command: str) -> frozenset[str]:
    """Repository files the test command names as its runner or settings (``bin/test``,
    ``./tests/runtests.py``): restored like configuration when a patch touches them."""
    found: set[str] = set()
    for word in _words(command):
        path = word.split("::")[0].removeprefix("./")
        if word.startswith("-") or "=" in word or path.startswith("/") or ".." in path.split("/"):
            continue
        if path == "bin/test" or path.endswith("runtests.py"):
            found.add(path)
    return frozenset(found)


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _first_test_file(words: list[str], tests: list[str] | tuple[str, ...] = ()) -> str | None:
    """The test file the canary goes into: the first the command names that holds one of the
    task's tests, else the first it names. A file none of them is in may be skipped whole
    (pytest 6.3's testing/test_nose.py without nose), and the canary with it."""
    files = []
    for word in words:
        path = word.split("::")[0].removeprefix("./")
        if path.endswith(".py") and not path.startswith(("-", "/")) and ".." not in path.split("/") and not path.endswith("runtests.py"):
            if path != "bin/test":
                files.append(path)
    listed = {test.split("::")[0] for test in tests}
    return next((f for f in files if f in listed), files[0] if files else None)


def _unittest_files(words: list[str]) -> list[str]:
    """The module files of the dotted labels of a Django-style ``runtests.py`` command (labels
    are relative to the runner's folder), those that look like test modules first."""
    runner = next((w for w in words if w.endswith("runtests.py")), None)
    if runner is None:
        return []
    folder = runner.removeprefix("./").rpartition("/")[0]
    labels = [w for w in words[words.index(runner) + 1 :] if not w.startswith("-") and re.fullmatch(r"[A-Za-z_][\w.]*", w)]
    files = [f"{folder + '/' if folder else ''}{label.replace('.', '/')}.py" for label in labels]
    looks_like_tests = [f for f in files if re.search(r"(^|/)tests?(_[^/]*)?\.py$|(^|/)tests/", f.removeprefix(folder + "/"))]
    return list(dict.fromkeys(looks_like_tests + files))


def _first_test_dir(command: str) -> str:
    """The folder of the first test file the command names (the canary goes beside it, under
    the same conftest files and rootdir), or "" for the work directory."""
    path = _first_test_file(_words(command))
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
