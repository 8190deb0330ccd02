"""Real fixes graded as the official harness grades them (issue 50): the false negatives a
sweep of SWE-bench Verified found, each on its real row's shape (its test lists, log parser
and eval script), graded by ``envs.grading.grade`` from a log in the runner's own format."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envs.canary import canary_class, canary_id, canary_names, canary_text
from envs.grading import UNITTEST_ID, grade
from envs.images import build_base
from envs.tasks import Task, load_tasks
from envs.test_run import Phases, outcome_class, parse_junit, split_eval_script
from envs.verify import Verdict, swebench_test_spec

SHARED_DOCSTRING = "The right link is displayed if view_on_site is a callable"


@pytest.fixture
def verified(samples: Path) -> dict[str, Task]:
    tasks, errors = load_tasks(samples / "swebench_verified.parquet")
    assert not errors
    return {task.instance_id: task for task in tasks}


def _verdict(task: Task) -> Verdict:
    return Verdict(
        instance_id=task.instance_id, patch_hash="-", resolved=False, reward=0.0, patch_exists=True, patch_applied=True, image="-"
    )


def _django_line(test_id: str, result: str, docstring: str | None = None) -> str:
    """A result as Django's runner prints it at --verbosity 2: a test with a docstring has its
    id on one line and the docstring's first line, with the result, on the next."""
    return f"{test_id}\n{docstring} ... {result}" if docstring else f"{test_id} ... {result}"


def _django_log(task: Task, canary: dict[str, str], shared: list[tuple[str, str]], *, new_style: bool) -> str:
    """Every listed test passing, the tests listed by a docstring under an id of their own, the
    shared docstring under each of ``shared`` (owner id, result), the canary as it must end."""

    def test_id(name: str, cls: str) -> str:  # Python 3.11 names the method twice
        return f"{name} (admin_views.tests.{cls}.{name})" if new_style else f"{name} (admin_views.tests.{cls})"

    lines = []
    for number, test in enumerate([*task.FAIL_TO_PASS, *task.PASS_TO_PASS]):
        if test == SHARED_DOCSTRING:
            lines += [_django_line(test_id(name, cls), result, test) for (name, cls), result in shared]
        elif UNITTEST_ID.fullmatch(test):
            lines.append(_django_line(test, "ok"))
        else:
            lines.append(_django_line(test_id(f"test_documented_{number}", "AdminViewBasicTest"), "ok", test))
    for name, expected in canary.items():
        lines.append(_django_line(test_id(name, "CanaryLikeTests"), "FAIL" if expected == "failed" else "ok"))
    count = len(lines)
    return "\n".join([*lines, "", "-" * 70, f"Ran {count} tests in 12.345s", "", "FAILED (failures=1)", ""])


@pytest.mark.parametrize(("instance", "new_style"), [("django__django-14404", False), ("django__django-16612", True)])
def test_a_docstring_two_django_tests_share_is_graded_as_the_official_harness_grades_it(
    verified: dict[str, Task], instance: str, new_style: bool
) -> None:
    """Gold of django__django-14404 (4.0) and -16612 (5.0) was graded unresolved: two tests of
    admin_views share the docstring line the row names one of its tests by, so the log has two
    result lines of that name, which the line check took for one test reported twice."""
    task = verified[instance]
    assert SHARED_DOCSTRING in task.PASS_TO_PASS
    phases = split_eval_script(task.eval_script or "", task.workdir, tests=[*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    assert phases is not None and phases.framework == "unittest" and len(phases.canary) == 2
    spec = swebench_test_spec(task, task.base_commit or "")
    two_owners = [(("test_view_on_site_callable", "AdminViewOnSiteTests"), "ok"), (("test_callable", "AdminViewOnSiteTests2"), "ok")]

    verdict = _verdict(task)
    grade(spec, task, phases, _django_log(task, phases.canary, two_owners, new_style=new_style), 1, None, verdict)
    assert verdict.error is None and verdict.disagreements == []
    assert verdict.resolved and verdict.tests is not None and not verdict.tests["PASS_TO_PASS"]["failure"]

    # One of the two failing: the name fails, wherever its line is (swebench keeps the last).
    for failing in (0, 1):
        results = [(owner, "FAIL" if index == failing else "ok") for index, (owner, _r) in enumerate(two_owners)]
        verdict = _verdict(task)
        grade(spec, task, phases, _django_log(task, phases.canary, results, new_style=new_style), 1, None, verdict)
        assert not verdict.resolved and verdict.disagreements == []
        assert verdict.tests is not None and SHARED_DOCSTRING in verdict.tests["PASS_TO_PASS"]["failure"]

    # One test printed twice is still a log written twice.
    verdict = _verdict(task)
    once_more = [two_owners[0], two_owners[0]]
    grade(spec, task, phases, _django_log(task, phases.canary, once_more, new_style=new_style), 1, None, verdict)
    assert not verdict.resolved
    assert f"{SHARED_DOCSTRING}: 2 result lines: the log reports it twice" in verdict.disagreements


def test_a_result_line_forged_under_a_made_up_id_does_not_pass_a_failing_test(verified: dict[str, Task]) -> None:
    """A patch that prints a passing line for a failing docstring-named test under an id line
    of its own: the name has two owners, one failed, so it fails."""
    task = verified["django__django-16612"]
    phases = split_eval_script(task.eval_script or "", task.workdir, tests=[*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    assert phases is not None
    spec = swebench_test_spec(task, task.base_commit or "")
    log = _django_log(task, phases.canary, [(("test_view_on_site_callable", "AdminViewOnSiteTests"), "FAIL")], new_style=True)
    forged = log.replace("Ran ", f"forged_line (admin_views.tests.X)\n{SHARED_DOCSTRING} ... ok\nRan ", 1)
    assert re.search(r"^forged_line", forged, re.MULTILINE)
    verdict = _verdict(task)
    grade(spec, task, phases, forged, 1, None, verdict)
    assert not verdict.resolved and json.dumps(verdict.tests).count(SHARED_DOCSTRING) == 1
    assert SHARED_DOCSTRING in verdict.tests["PASS_TO_PASS"]["failure"]  # type: ignore[index]


# sphinx-doc__sphinx-7910's tests/test_ext_napoleon.py in miniature: it imports the extension's
# `setup(app)` into the module, and its tests are TestCase methods, which pytest's nose support
# leaves alone. A module-level function there has `setup()` called before it, with no `app`.
NAPOLEON_LIKE = """\
import unittest

from napoleon_like import Config, setup


class SetupTest(unittest.TestCase):
    def test_add_config_values(self):
        assert Config.napoleon_use_param
"""
EXTENSION = """\
class Config:
    napoleon_use_param = True


def setup(app):
    return {"version": app.version}
"""


@pytest.fixture
def pytest6_image(docker_client) -> str:  # noqa: ANN001
    """A base image of Debian bullseye, whose pytest is 6.0: nose-style `setup` as the Sphinx
    3.x images' pytest 6 runs it (bookworm's 7.2 calls it with the module as `app`, which
    breaks the module's own tests too, unlike the real row)."""
    return build_base(docker_client, suite="bullseye", log=lambda _m: None)


def _run_canary(docker_client, image: str, canary: str) -> dict[str, str]:  # noqa: ANN001
    """The miniature module with ``canary`` appended, run by the image's pytest as the
    verifier runs a pytest task: its JUnit report, parsed."""
    script = (
        "set -e; mkdir -p /work/tests && cd /work\n"
        f"cat > napoleon_like.py <<'EOF_EXT'\n{EXTENSION}EOF_EXT\n"
        f"cat > tests/test_ext_napoleon.py <<'EOF_MOD'\n{NAPOLEON_LIKE}{canary}EOF_MOD\n"
        "PYTHONPATH=/work python3 -m pytest -rA -p no:cacheprovider tests/test_ext_napoleon.py "
        "--junitxml=/tmp/junit.xml -o junit_family=xunit1 >/dev/null 2>&1 || true\ncat /tmp/junit.xml\n"
    )
    # Waited for and read before removal: `run(remove=True)` can return a long output cut short.
    container = docker_client.containers.run(image, ["bash", "-c", script], detach=True, network_disabled=True)
    try:
        container.wait(timeout=120)
        return parse_junit(container.logs(stdout=True, stderr=False))
    finally:
        container.remove(force=True)


@pytest.mark.slow
def test_the_canary_runs_in_a_test_module_that_imports_a_function_named_setup(docker_client, pytest6_image: str) -> None:  # noqa: ANN001
    """Gold of sphinx-doc__sphinx-7910 was graded "tampered": the canary, appended to the
    row's test module as two functions, failed both with a TypeError from nose-style setup."""
    tests = ["tests/test_ext_napoleon.py::SetupTest::test_add_config_values"]
    names = canary_names(tests, 2)
    phases = Phases(setup="", test="", pytest=True, framework="pytest", canary_file="tests/test_ext_napoleon.py")
    phases.canary = {names[0]: "failed", names[1]: "passed"}
    phases.canary_class = canary_class(names, "pytest", ["SetupTest::test_add_config_values"])
    assert phases.canary_class.endswith("Test") and phases.canary_class != "SetupTest"

    report = _run_canary(docker_client, pytest6_image, canary_text(names, phases.canary_class))
    assert report[tests[0]] == "PASSED"
    assert {name: outcome_class(report.get(canary_id(phases, name))) for name in names} == phases.canary
    # The shape the canary had: module-level functions, both errored in nose-style setup.
    functions = _run_canary(docker_client, pytest6_image, canary_text(names))
    assert [functions.get(f"tests/test_ext_napoleon.py::{name}") for name in names] == ["ERROR", "ERROR"]


def test_the_sphinx_7910_row_puts_its_canary_in_the_napoleon_module_as_a_test_case(verified: dict[str, Task]) -> None:
    task = verified["sphinx-doc__sphinx-7910"]
    phases = split_eval_script(task.eval_script or "", task.workdir, tests=[*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    assert phases is not None and phases.pytest and phases.canary_file == "tests/test_ext_napoleon.py"
    assert "(__import__('unittest').TestCase):" in phases.canary_text and "\ndef test_" not in phases.canary_text
    assert all(canary_id(phases, name).startswith("tests/test_ext_napoleon.py::") for name in phases.canary)


def test_a_canary_stopped_before_it_ran_is_not_called_tampering() -> None:
    """Both canary tests errored (the one that must pass too): the module stopped them in a
    setup of its own. The run is not graded, and the verdict says why, not "tampered"."""
    from types import SimpleNamespace

    from envs.grading import _check_canary

    names = canary_names(["tests/test_ext_napoleon.py::SetupTest::test_add_config_values"], 2)
    phases = Phases(setup="", test="", pytest=True, framework="pytest", canary_file="tests/test_ext_napoleon.py")
    phases.canary = {names[0]: "failed", names[1]: "passed"}
    task = SimpleNamespace(workdir="/testbed")
    errored = {canary_id(phases, name): "ERROR" for name in names}
    verdict = SimpleNamespace(disagreements=[], error=None)
    _check_canary(phases, task, {}, errored, 1, verdict)  # type: ignore[arg-type]
    assert verdict.disagreements == [] and "errored before they ran" in verdict.error
    # pytest interrupted by a collection error (pylint-dev__pylint-4661 before its fix's
    # requirement was in the image): neither canary ran, and that is no tampering either.
    verdict = SimpleNamespace(disagreements=[], error=None)
    _check_canary(phases, task, {}, {"tests/test_ext_napoleon.py": "ERROR"}, 2, verdict)  # type: ignore[arg-type]
    assert verdict.disagreements == [] and verdict.error == "pytest ended with interrupted (exit status 2) before the canary tests ran"
    # One that must pass ending failed, or the failing one erroring alone, is still tampering.
    for report in ({**errored, canary_id(phases, names[1]): "FAILED"}, {canary_id(phases, names[0]): "ERROR"}):
        verdict = SimpleNamespace(disagreements=[], error=None)
        _check_canary(phases, task, {}, report, 1, verdict)  # type: ignore[arg-type]
        assert verdict.error is None and any("tampered" in d for d in verdict.disagreements)


# pylint-dev__pylint-8898's tests/config/test_config.py: four parameter sets, two of which
# ("foo, bar" and "foo, bar{1,3}") the rows' log parser names alike, cut at the space.
CUT_ID = "tests/config/test_config.py::test_csv_regex_comma_in_quantifier[foo,"
PARAMETER_SETS = {
    "[foo-expected0]": "PASSED",
    "[foo,bar-expected1]": "PASSED",
    "[foo, bar-expected2]": "PASSED",
    "[foo, bar{1,3}-expected3]": None,
}


def _pytest_run(task: Task, phases: Phases, outcomes: dict[str, str]) -> tuple[str, bytes]:
    """The log (``pytest -rA``'s short summary) and the xunit1 report of a run where each
    listed test passed but for ``outcomes`` (test id -> FAILED), the canary as it must end."""
    tests = {t: "PASSED" for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS] if t != CUT_ID}
    function = CUT_ID.rsplit("[", 1)[0]
    tests |= {function + params: status or outcomes.get("expected3", "PASSED") for params, status in PARAMETER_SETS.items()}
    tests |= {t: outcomes[t] for t in outcomes if t in tests}
    tests |= {canary_id(phases, name): "FAILED" if end == "failed" else "PASSED" for name, end in phases.canary.items()}
    log = "\n".join([f"{status} {test}" for test, status in tests.items()] + ["==== 1 failed, 30 passed in 3.21s ===="])
    cases = []
    for test, status in tests.items():
        path, *inner, name = test.split("::")
        classname = ".".join([path.removesuffix(".py").replace("/", "."), *inner])
        body = '<failure message="assert">assert</failure>' if status == "FAILED" else ""
        cases.append(f'<testcase file="{path}" classname="{classname}" name="{name}">{body}</testcase>')
    return log, f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>'.encode()


def test_a_parametrised_id_the_parser_cuts_at_a_space_is_two_tests_not_one_reported_twice(verified: dict[str, Task]) -> None:
    """pylint-dev__pylint-8898 lists `...[foo,`: the log parser splits a result line at spaces,
    so `[foo, bar-expected2]` and `[foo, bar{1,3}-expected3]` both read as it. The line check
    took them for one test with two contradictory lines, and the report had no such id
    ("the report says missing"): a gold run where only one of them failed could not be graded
    as the official harness grades it. The name now passes only when both passed."""
    task = verified["pylint-dev__pylint-8898"]
    assert CUT_ID in task.PASS_TO_PASS
    phases = split_eval_script(task.eval_script or "", task.workdir, tests=[*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
    assert phases is not None and phases.pytest
    spec = swebench_test_spec(task, task.base_commit or "")

    verdict = _verdict(task)
    log, report = _pytest_run(task, phases, {})
    grade(spec, task, phases, log, 1, report, verdict)  # 1: the canary fails by design
    assert verdict.error is None and verdict.disagreements == [] and verdict.resolved

    # The empty patch's run: the fix's test and one of the two cut sets fail.
    verdict = _verdict(task)
    log, report = _pytest_run(task, phases, {task.FAIL_TO_PASS[0]: "FAILED", "expected3": "FAILED"})
    grade(spec, task, phases, log, 1, report, verdict)
    assert verdict.error is None and verdict.disagreements == [] and not verdict.resolved
    assert verdict.tests is not None and verdict.tests["PASS_TO_PASS"]["failure"] == [CUT_ID]
