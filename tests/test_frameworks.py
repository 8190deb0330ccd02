"""The test frameworks as plug-ins (issue 45): one module per framework in one registry, which
the verifier, the grader, the candidate checks, the scan and the image contract consult.

The detection is checked on the 500 real SWE-bench Verified eval scripts against swebench's own
choice of log parser for each row's repository (the independent truth: the parser reads the
framework's log); the one-file extension with a framework defined here, in a registry of the
test's own (no test-only framework is added to the production registry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY, parse_log_django, parse_log_sympy

import envs.grading as grading
import envs.test_run as test_run
from envs.candidate import SHADOWED, _decides_tests, framework_sections, shadow_problem
from envs.code_scan import scan_source
from envs.contract import runner_probes, script_parts
from envs.frameworks import FRAMEWORKS, REGISTRY, Framework, Internals, Launcher, Registry, by_name, detect, for_log_parser
from envs.frameworks.base import first_test_file
from envs.tasks import Task, load_tasks


@pytest.fixture(scope="module")
def verified() -> list[Task]:
    tasks, errors = load_tasks(Path(__file__).resolve().parent.parent.parent / "shared" / "samples" / "swebench_verified.parquet")
    assert not errors and len(tasks) == 500
    return tasks


# django__django-10097 runs the whole suite (`runtests.py` with no label): no module to put the
# canary in, so its run is graded from the log without one.
NO_CANARY = 1


def _expected(repo: str) -> str:
    """The framework whose log swebench's parser for the repository reads."""
    parser = MAP_REPO_TO_PARSER_PY[repo]
    return "unittest" if parser is parse_log_django else "sympy" if parser is parse_log_sympy else "pytest"


def test_every_verified_rows_test_command_is_detected_as_the_framework_its_log_parser_reads(verified: list[Task]) -> None:
    counts: dict[tuple[str, str], int] = {}
    no_canary = 0
    for task in verified:
        assert PARSER_REGISTRY[task.log_parser] is MAP_REPO_TO_PARSER_PY[task.repo]  # the row's parser is its repository's
        expected = _expected(task.repo)
        phases = test_run.split_eval_script(task.eval_script or "", task.workdir, tests=[*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
        assert phases is not None and phases.pytest == (expected == "pytest"), task.instance_id
        # No canary only where the command names no module it could go into: the run is graded
        # from its log alone.
        assert phases.framework == expected or (phases.framework is None and expected == "unittest"), task.instance_id
        no_canary += phases.framework is None
        _environment, command = script_parts(task.eval_script or "")
        launch = detect(command or "")
        assert launch is not None and launch.framework.name == expected, task.instance_id
        # A parser named for its framework says so; the repositories' own aliases (astropy's,
        # Sphinx's...) name no framework, and the instrumented one is used.
        named = for_log_parser(task.log_parser)
        assert named is None or named.name == expected
        key = (expected, launch.launcher.label)
        counts[key] = counts.get(key, 0) + 1
    assert counts == {("unittest", "runtests.py"): 231, ("pytest", "pytest"): 150, ("pytest", "tox"): 44, ("sympy", "bin/test"): 75}
    assert no_canary == NO_CANARY


def test_detection_reads_each_way_a_framework_is_started() -> None:
    cases = {
        "pytest -rA tests/test_x.py": ("pytest", ""),
        "py.test tests": ("pytest", ""),
        "python3 -X dev -m pytest -p no:cacheprovider tests/test_x.py": ("pytest", ""),
        "tox --current-env -epy39 -v -- tests/test_directive_code.py": ("pytest", "--"),
        "PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose sympy/core/tests/test_numbers.py": ("sympy", ""),
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 validators.tests": ("unittest", ""),
        "python3 runtests.py --verbosity 2 tests.test_units": ("unittest", ""),
    }
    for line, (name, passthrough) in cases.items():
        launch = detect(line)
        assert launch is not None and (launch.framework.name, launch.launcher.passthrough) == (name, passthrough), line
    for line in ("make test", "python setup.py test", "echo pytest-style", "nosetests tests", "./bin/testing"):
        assert detect(line) is None, line
    # A here-document is data, not the command; the first line a framework starts is.
    assert REGISTRY.test_command(["cat <<EOF > x.py\npytest\nEOF", "echo hi", "pytest tests"]) == (2, detect("pytest tests"))
    assert [f.name for f in FRAMEWORKS] == ["pytest", "sympy", "unittest"]
    assert by_name("sympy") is FRAMEWORKS[1] and by_name("nose2") is None and by_name(None) is None
    assert for_log_parser("parse_log_pytest_v2") is FRAMEWORKS[0] and for_log_parser("parse_log_astropy") is None


def test_the_canary_shape_and_runner_files_each_framework_declares() -> None:
    assert {f.name: f.canary_shape for f in FRAMEWORKS} == {"pytest": "as the file", "sympy": "functions", "unittest": "class"}
    assert [f.name for f in FRAMEWORKS if f.junit_report] == ["pytest"]
    assert (
        REGISTRY.is_runner_file("bin/test") and REGISTRY.is_runner_file("tests/runtests.py") and not REGISTRY.is_runner_file("tests/x.py")
    )
    words = ["./tests/runtests.py", "--verbosity", "2", "django.test.testcases", "servers.tests"]
    unittest = by_name("unittest")
    assert unittest is not None
    assert unittest.canary_files(words, (), REGISTRY.is_runner_file) == ["tests/servers/tests.py", "tests/django/test/testcases.py"]
    assert (
        first_test_file(["bin/test", "sympy/a/tests/test_b.py", "x/runtests.py"], (), REGISTRY.is_runner_file) == "sympy/a/tests/test_b.py"
    )
    assert runner_probes("python -m pytest tests") == [
        ("the interpreter", "python --version"),
        ("the test runner (python -m pytest)", "python -m pytest --version"),
    ]
    assert runner_probes("tox -e py39 -- tests") == [("the test runner (tox)", "tox --version")]
    assert runner_probes("./tests/runtests.py validators")[0][0] == "the test runner (./tests/runtests.py)"


def test_configuration_shadowed_names_and_internals_come_from_the_frameworks() -> None:
    touched = ["pytest.ini", "sub/conftest.py", "tox.ini", "pyproject.toml", "tests/runtests.py", ".coveragerc", "pkg/mod.py"]
    decides = _decides_tests(touched, set(), frozenset())
    assert decides == {p: "config" for p in touched if p != "pkg/mod.py"} | {"tests/runtests.py": "test"}
    assert {"pytest", "_pytest", "pluggy", "iniconfig", "unittest"} <= SHADOWED
    assert shadow_problem("pluggy/__init__.py", {"src"}, set()) is not None and shadow_problem("pkg/pluggy.py", {"pkg"}, set()) is None
    # Each framework's section of a shared file, read as that framework reads it.
    before = "[tool.pytest.ini_options]\naddopts = '-x'\n[tool.black]\nline-length = 88\n"
    assert framework_sections("pyproject.toml", before) == ({"ini_options": {"addopts": "-x"}},)
    assert framework_sections("pyproject.toml", before.replace("88", "100")) == framework_sections("pyproject.toml", before)
    assert framework_sections("setup.cfg", "[tool:pytest]\nxfail_strict = false\n") == ({"xfail_strict": "false"},)
    assert framework_sections("tox.ini", "[pytest\n") is ...
    # The scan's words for each runner's internals: pytest's test call, unittest's, SymPy's runner.
    source = (
        "from sympy.testing import runtests\n\n"
        "def patch(item, case, reporter):\n"
        "    item.runtest = lambda: None\n"
        "    case._callTestMethod = print\n"
        "    reporter.test_fail = reporter.test_pass\n"
        "    return runtests\n"
    )
    findings = "\n".join(scan_source("sympy/core/numbers.py", source.encode(), None))
    for what in ("SymPy's test runner", "reaches pytest's test call", "reaches unittest's test call", "touches a test result"):
        assert what in findings, what
    assert scan_source("_pytest/runner.py", b"def pytest_runtest_call(item):\n    item.runtest()\n", None) == []


# --- adding a framework: one file, one registry entry -----------------------------------------
# What a file envs/frameworks/nose2.py would hold: nose2, a unittest-based runner
# (`nose2 -v tests.test_units`, configured by unittest.cfg or nose2.cfg, `Ran N tests in Xs`).


class Nose2(Framework):
    def canary_files(self, words: list[str], tests: list[str] | tuple[str, ...], is_runner: object) -> list[str]:
        labels = [w for w in words[words.index("nose2") + 1 :] if not w.startswith("-")]
        return [label.replace(".", "/") + ".py" for label in labels]


NOSE2 = Nose2(
    name="nose2",
    launchers=(Launcher(re.compile(r"(^|[\s;&|(])nose2(\s|$)"), label="nose2"),),
    log_parsers=frozenset(),
    summary=re.compile(r"^Ran \d+ tests? in [\d.]+s$"),
    canary_shape="functions",
    config_files=frozenset({"unittest.cfg", "nose2.cfg"}),
    always_suspicious=frozenset({"nose2.cfg"}),
    shadowed=frozenset({"nose2"}),
    internals=Internals(modules={"nose2": "nose2's runner"}, words=("nose2",)),
)


def test_a_framework_is_one_module_and_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    assert detect("nose2 -v tests.test_units") is None  # production knows no nose2
    mine = Registry((*FRAMEWORKS, NOSE2))
    launch = mine.detect("python3 -m nose2 -v tests.test_units")
    assert launch is not None and launch.framework is NOSE2
    assert {"unittest.cfg", "nose2.cfg", "pytest.ini"} <= mine.config_files and "nose2" in mine.shadowed
    assert mine.internals.modules["nose2"] == "nose2's runner" and "nose2" in mine.internals.words
    with pytest.raises(ValueError, match="share a name"):
        Registry((*FRAMEWORKS, NOSE2, NOSE2))

    # The verifier and the grader consult the registry: with this one, a nose2 command gets its
    # canary in the test module its label names, and its log's summary line is the runner's.
    monkeypatch.setattr(test_run, "REGISTRY", mine)
    monkeypatch.setattr(grading, "REGISTRY", mine)
    script = "#!/bin/bash\ncd /testbed\n: '>>>>> Start Test Output'\nnose2 -v tests.test_units\n: '>>>>> End Test Output'\n"
    tests = ["test_feet_to_inches (tests.test_units.SmallerUnitTests)"]
    phases = test_run.split_eval_script(script, "/testbed", tests=tests)
    assert phases is not None and phases.framework == "nose2" and phases.canary_file == "tests/test_units.py" and not phases.pytest
    assert 'for f in /testbed/tests/test_units.py; do if [ -f "$f" ] || [ 0 = 1 ]' in phases.test
    spec = type("Spec", (), {"log_parser": "parse_log_django", "FAIL_TO_PASS": tests, "PASS_TO_PASS": []})()
    log = "test_feet_to_inches (tests.test_units.SmallerUnitTests) ... ok\n\n" + "-" * 70 + "\nRan 1 test in 0.001s\n\nOK\n"
    lines = grading.line_results(spec, log, "nose2")
    assert lines.summaries == [3] and [s for _n, s in lines.of(tests[0])] == ["PASSED"]
