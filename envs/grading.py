"""A test run into per-test results and a resolved status, trusting nothing the tests print
about themselves.

Only the test command's own output is parsed (by swebench's log parser for the task), with
its exit status from Docker appended as the exit-code marker. Lines of that output that
carry a grader marker (start, end, exit code, apply or reset failure, timeout) are forged
results: they are removed before parsing and the run is not resolved. For pytest commands
the JUnit report must exist (a run that ended early writes none), must agree with the log
on every FAIL_TO_PASS and PASS_TO_PASS test, and must show the canary tests as they must
be; the exit status must be pytest's "tests failed" (the canary fails), never 0 or an
error status. A FAIL_TO_PASS test must pass: xfail is not what the task asks for
(stricter than swebench, which counts XFAIL as passed).
"""

from __future__ import annotations

import re
import tempfile
from typing import Any

from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TESTS_ERROR,
    TESTS_TIMEOUT,
    EvalType,
)
from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
from swebench.harness.log_parsers import PARSER_REGISTRY

from envs.tasks import Task
from envs.test_run import Phases, canary_id, outcome_class, parse_junit

MARKERS = (START_TEST_OUTPUT, END_TEST_OUTPUT, TEST_EXIT_CODE, APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)
PYTEST_EXIT = {2: "interrupted", 3: "an internal error", 4: "a usage error", 5: "no tests collected"}
OPENSWE_PASS = re.compile(r"^OPENSWE_EXIT_CODE=(-?\d+)\s*$", re.MULTILINE)


def sanitize(output: str) -> tuple[str, int]:
    """The output without lines that carry a grader marker, and how many there were."""
    kept, forged = [], 0
    for line in output.split("\n"):
        if any(marker in line for marker in MARKERS):
            forged += 1
        else:
            kept.append(line)
    return "\n".join(kept), forged


def grade(spec: Any, task: Task, phases: Phases, output: str, exit_code: int | None, report: bytes | None, verdict: Any) -> None:
    """Fill ``verdict`` (status map, per-test results, resolved, error, disagreements)."""
    clean, forged = sanitize(output)
    if forged:
        verdict.disagreements.append(f"the test output carries {forged} line(s) with grader markers (forged results); they were not read")
    if exit_code is None:
        verdict.error = "the tests timed out and were killed"
        return
    statuses = _parse_log(spec, clean, exit_code)  # None: swebench finds nothing gradable
    parsed = PARSER_REGISTRY[spec.log_parser](clean, spec)  # what the log claims, gradable or not
    junit: dict[str, str] | None = None
    if phases.pytest:
        if report is None:
            verdict.error = f"the test run wrote no report: it ended early (exit status {exit_code})"
            if exit_code in PYTEST_EXIT:
                verdict.error = f"pytest ended with {PYTEST_EXIT[exit_code]} (exit status {exit_code}) and wrote no report"
            return
        try:
            junit = parse_junit(report)
        except ValueError as exc:
            verdict.error = f"the test report is unreadable ({exc})"
            return
        verdict.report = "junit"
        _check_canary(phases, task, parsed, junit, exit_code, verdict)
    else:
        verdict.report = "log only (the test command is not pytest)"
    if statuses is None:
        if parsed:
            verdict.error = (
                verdict.error or f"the log reports no failure, yet the test command exited {exit_code}: the log contradicts its exit status"
            )
        else:
            verdict.error = (
                verdict.error or f"the test output has no results the {spec.log_parser} parser recognises (exit status {exit_code})"
            )
        return
    verdict.status_map = statuses
    gold = {"instance_id": task.instance_id, "FAIL_TO_PASS": spec.FAIL_TO_PASS, "PASS_TO_PASS": spec.PASS_TO_PASS}
    tests = get_eval_tests_report(statuses, gold, eval_type=EvalType(spec.eval_type))
    verdict.tests = {key: {"success": value["success"], "failure": value["failure"]} for key, value in tests.items()}
    if junit is not None:
        for test in [*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS]:
            in_log, in_report = outcome_class(_lookup(test, statuses)), outcome_class(_lookup(test, junit))
            if in_log != in_report and not (in_log == "missing" and in_report != "passed"):
                verdict.disagreements.append(f"{test}: the log says {in_log}, the report says {in_report}")
    xfail = [t for t in spec.FAIL_TO_PASS if _lookup(t, statuses) == "XFAIL" or (junit is not None and _lookup(t, junit) == "XFAIL")]
    if xfail:
        verdict.disagreements.append(f"FAIL_TO_PASS test(s) only marked as expected to fail (xfail), not passing: {', '.join(xfail[:5])}")
    verdict.resolved = get_resolution_status(tests) == "RESOLVED_FULL" and not verdict.disagreements and not verdict.error


def grade_openswe(exit_code: int | None, verdict: Any, output: str | None = None) -> None:
    """OpenSWE's grade: with the test command run apart, its own exit status; for a script run
    whole (``output``), the last marker it printed (its own echo comes after the tests; a line
    the tests printed earlier does not count)."""
    if exit_code is None:
        verdict.error = "the tests timed out and were killed"
        return
    if output is None:
        verdict.resolved = exit_code == 0
        return
    markers = OPENSWE_PASS.findall(output)
    verdict.resolved = bool(markers) and markers[-1] == "0"


def _parse_log(spec: Any, clean: str, exit_code: int) -> dict[str, str] | None:
    log = f"{START_TEST_OUTPUT}\n{clean}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {exit_code}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=True) as handle:
        handle.write(log)
        handle.flush()
        statuses, found = get_logs_eval(spec, handle.name)
    return statuses if found else None


def _check_canary(phases: Phases, task: Task, statuses: dict[str, str], junit: dict[str, str], exit_code: int, verdict: Any) -> None:
    for name, expected in phases.canary.items():
        test = canary_id(phases, name, task.workdir)
        reported = outcome_class(_lookup(test, junit))
        logged = outcome_class(_lookup(test, statuses))
        if reported != expected or logged not in (expected, "missing"):
            verdict.disagreements.append(
                f"a canary test that must end {expected} ended {reported} in the report and {logged} in the log: the run's results were tampered with"
            )
    if exit_code == 0:
        verdict.disagreements.append("pytest exited 0 although the canary test failed: the exit status was tampered with")
    elif exit_code != 1:
        verdict.error = f"pytest ended with {PYTEST_EXIT.get(exit_code, 'an unexpected status')} (exit status {exit_code})"


def _lookup(test: str, statuses: dict[str, str]) -> str | None:
    """A test's status; a truncated parametrised id (SWE-bench Verified has some) matches by
    prefix when every match agrees, as swebench's grading does."""
    if test in statuses:
        return statuses[test]
    if test.count("[") > test.count("]"):
        found = {outcome_class(s): s for k, s in statuses.items() if k.startswith(test)}
        if len(found) == 1:
            return next(iter(found.values()))
    return None
