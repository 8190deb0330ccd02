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

A log is also read one line at a time (``line_results``): a graded test or a canary with
contradictory result lines, or (where there is no report: Django's runner, SymPy's
``bin/test``) with two result lines or one after the runner's own summary line, is a
disagreement, never "the last line wins". A run graded from its log alone has its canary
checked in the log, and must exit non-zero (the canary fails).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
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

from envs.frameworks import REGISTRY, Framework
from envs.frameworks import unittest as unittest_framework
from envs.tasks import Task
from envs.test_run import Phases, canary_id, outcome_class, parse_junit

MARKERS = (START_TEST_OUTPUT, END_TEST_OUTPUT, TEST_EXIT_CODE, APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)
PYTEST_EXIT = {2: "interrupted", 3: "an internal error", 4: "a usage error", 5: "no tests collected"}
OPENSWE_PASS = re.compile(r"^OPENSWE_EXIT_CODE=(-?\d+)\s*$", re.MULTILINE)
PASSING = {"PASSED", "XFAIL"}
# A test's own id line in unittest's log (`test_x (app.tests.T)`, `test_x (app.tests.T.test_x)`);
# each framework's line patterns (its summary line, SymPy's file sections) are in envs.frameworks.
UNITTEST_ID = unittest_framework.TEST_ID
# Two Verified rows (pytest-dev__pytest-5262 and -7521) list "[100%]" among their tests: the
# official parser read the progress column of a line such as `PASSED [100%]` as a test name.
PROGRESS = re.compile(r"\[\s*\d+%\]")
OPTION = re.compile(r"(.*?)\[(.*)\]")  # swebench's option_pattern: a test id's parameter


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
            junit = _as_the_parser_names(parse_junit(report), spec.log_parser)
        except ValueError as exc:
            verdict.error = f"the test report is unreadable ({exc})"
            return
        verdict.report = "junit"
        _check_canary(phases, task, parsed, junit, exit_code, verdict)
    else:
        verdict.report = "log only (the test command is not pytest)" + (f", with a {phases.framework} canary" if phases.canary else "")
    lines = line_results(spec, clean, phases.framework)
    _check_lines(spec, phases, lines, verdict)
    if not phases.pytest and phases.canary:
        _check_log_canary(phases, lines, exit_code, verdict)
    if statuses is not None:
        statuses = shared_names_fold(statuses, lines, [*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS])
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
        verdict.disagreements += log_and_report_disagree([*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS], statuses, junit)
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


def log_and_report_disagree(tests: list[str], statuses: dict[str, str], junit: dict[str, str]) -> list[str]:
    """The graded tests whose outcome the log and the report tell differently."""
    out = []
    for test in tests:
        if PROGRESS.fullmatch(test):
            continue  # not a test: pytest's progress column, which the rows' parser read as one
        in_log, in_report = outcome_class(_lookup(test, statuses)), outcome_class(_lookup(test, junit))
        if in_log != in_report and not (in_log == "missing" and in_report != "passed"):
            out.append(f"{test}: the log says {in_log}, the report says {in_report}")
    return out


def _as_the_parser_names(junit: dict[str, str], log_parser: str | None) -> dict[str, str]:
    """The report's test ids as the task's log parser names them. swebench's options parser
    (requests, pylint, pydicom) keeps only the last part of a parameter that is a path,
    `[/testbed/tests/test_utils.py]` as `[/test_utils.py]`, and so do the rows' test lists; the
    report keeps it whole, and every such test disagreed with the log (requests 2.27's gold
    graded unresolved)."""
    if PARSER_REGISTRY.get(log_parser or "") is not PARSER_REGISTRY["parse_log_pytest_options"]:
        return junit
    named: dict[str, str] = {}
    for test_id, status in junit.items():
        option = OPTION.search(test_id)
        if option and option.group(2).startswith("/") and not option.group(2).startswith("//") and "*" not in option.group(2):
            test_id = f"{option.group(1)}[/{option.group(2).split('/')[-1]}]"
        named[test_id] = status
    return named


def framework_of(spec: Any, framework: str | None) -> str | None:
    """The runner whose summary line and result lines the log has: the instrumented one, else
    the one the log parser is for."""
    if framework is not None:
        return framework
    found = REGISTRY.for_log_parser(spec.log_parser)
    return found.name if found is not None else None


@dataclass
class LineResults:
    """Every result line of a log, read one line at a time: test -> [(line number, status)],
    and the line numbers of the runner's summary lines."""

    results: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    summaries: list[int] = field(default_factory=list)
    # Who a result line belongs to beyond the name it carries (line number -> owner), so that
    # one name shared by two tests is not one test reported twice. SymPy's runner names tests
    # without their file: the owner is the file whose section the line is in. Django's runner
    # prints a test that has a docstring as `name (module.Class)` on one line and the
    # docstring's first line with the result on the next; swebench's parser names the test by
    # that docstring line, which several tests may share: the owner is the line above.
    owners: dict[int, str] = field(default_factory=dict)

    def of(self, test: str) -> list[tuple[int, str]]:
        """The lines of ``test``; a bare unittest name (``test_x``) also matches
        ``test_x (module.Class...)``, a truncated parametrised id its expansions."""
        found = list(self.results.get(test, []))
        if not found and "(" not in test and "::" not in test:
            found = [r for key, rs in self.results.items() if key.startswith(test + " (") for r in rs]
        elif not found and test.count("[") > test.count("]"):
            found = [r for key, rs in self.results.items() if key.startswith(test) for r in rs]
        return sorted(found)


def line_results(spec: Any, clean: str, framework: str | None) -> LineResults:
    """The log parser run on each line alone, so that nothing is kept "last": a test with two
    result lines shows both. Django's ``FAIL:``/``ERROR:`` lines are filed under the full
    ``name (module.Class)`` they name (swebench's parser files them under the bare name,
    where they contradict nothing)."""
    parser = PARSER_REGISTRY[spec.log_parser]
    runner: Framework | None = REGISTRY.by_name(framework_of(spec, framework))
    summary = runner.summary if runner is not None else None
    sections = runner.section_start if runner is not None else None
    suffix = runner.line_suffix if runner is not None else None
    # The parser's own log format (Django's): its id lines and failure headings.
    read_as = REGISTRY.for_log_parser(spec.log_parser)
    test_id = read_as.test_id if read_as is not None else None
    heading = read_as.failure_heading if read_as is not None else None
    out = LineResults()
    section, above = "", ""
    for number, line in enumerate(clean.split("\n")):
        if suffix is not None:
            line = suffix.sub("", line)
        if sections is not None:
            header = sections.match(line)
            section = header.group(1) if header else section
        stripped = line.strip()
        if not stripped:
            continue
        owner, above = section or (above if test_id is not None and test_id.fullmatch(above) else ""), stripped
        if summary is not None and summary.match(stripped):
            out.summaries.append(number)
            continue
        try:
            found = parser(line, spec)
        except Exception:  # noqa: BLE001 - a parser that cannot read one line alone: that line adds nothing
            continue
        failure = heading.match(stripped) if heading is not None else None
        if failure:
            found = {failure.group(2): "FAILED" if failure.group(1) == "FAIL" else "ERROR"}
        for test, status in found.items():
            out.results.setdefault(test, []).append((number, status))
            if owner and test != owner and not UNITTEST_ID.fullmatch(test):
                out.owners[number] = owner
            elif (whole := _whole_parametrised_id(stripped, test)) is not None:
                out.owners[number] = whole
    return out


def _whole_parametrised_id(line: str, test: str) -> str | None:
    """The whole pytest id a result line prints where the parser kept only its part before a
    space (``test_x[foo, bar-expected2]`` named ``test_x[foo,``, as in the Verified rows of
    pylint-dev__pylint-8898): two parameter sets that share that part are two tests, not one
    test reported twice. None when ``test`` is not cut inside its brackets."""
    if test.count("[") <= test.count("]"):
        return None
    at = line.find(test)
    if at < 0:
        return None
    close = line.find("]", at + len(test))
    return line[at : close + 1] if close >= 0 else None


def shared_names_fold(statuses: dict[str, str], lines: LineResults, tests: list[str]) -> dict[str, str]:
    """The status map with a graded name that several tests share (result lines of different
    owners, ``LineResults.owners``) passing only when every one of them passed. swebench keeps
    whichever line came last; a test that fails under a shared name fails here."""
    folded = dict(statuses)
    for test in tests:
        found = lines.of(test)
        if len({lines.owners.get(n, "") for n, _status in found}) > 1:
            failing = [status for _n, status in found if status not in PASSING | {"SKIPPED"}]
            if failing:
                folded[test] = failing[0]
    return folded


def _check_lines(spec: Any, phases: Phases, lines: LineResults, verdict: Any) -> None:
    """Contradictory or duplicated result lines of a graded test or a canary, and (for a log
    with no report) result lines after the runner's own summary, are disagreements: the
    result is not taken from whichever line came last."""
    log_only = not phases.pytest
    if log_only and len(lines.summaries) > 1:
        verdict.disagreements.append(f"the runner's summary line appears {len(lines.summaries)} times: the log was written twice")
    last = lines.summaries[-1] if lines.summaries else None
    for test in [*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS, *phases.canary]:
        found = lines.of(test)
        by_owner: dict[str, list[str]] = {}
        for n, status in found:
            by_owner.setdefault(lines.owners.get(n, ""), []).append(status)
        for statuses in by_owner.values():  # the lines of one test: those of one owner
            passing = [status for status in statuses if status in PASSING]
            if passing and set(statuses) - PASSING - {"SKIPPED"}:
                verdict.disagreements.append(
                    f"{test}: contradictory result lines ({', '.join(sorted(set(statuses)))}): the log reports it twice"
                )
            elif log_only and len(passing) > 1:
                verdict.disagreements.append(f"{test}: {len(passing)} result lines: the log reports it twice")
        if log_only and last is not None and any(n > last for n, _status in found):
            verdict.disagreements.append(f"{test}: a result line after the runner's summary (printed at exit, not by the runner)")


def _check_log_canary(phases: Phases, lines: LineResults, exit_code: int, verdict: Any) -> None:
    """The canary of a run graded from its log alone: its failing test must show failed and its
    passing test passed, in the log, and the exit status must say that a test failed."""
    for name, expected in phases.canary.items():
        statuses = {outcome_class(status) for _n, status in lines.of(name)}
        if statuses != {expected}:
            shown = ", ".join(sorted(statuses)) or "missing"
            verdict.disagreements.append(
                f"a canary test that must end {expected} ended {shown} in the log: the run's results were tampered with (or it did not run)"
            )
    if exit_code == 0:
        verdict.disagreements.append("the test command exited 0 although the canary test failed: the exit status was tampered with")


def _parse_log(spec: Any, clean: str, exit_code: int) -> dict[str, str] | None:
    log = f"{START_TEST_OUTPUT}\n{clean}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {exit_code}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=True) as handle:
        handle.write(log)
        handle.flush()
        statuses, found = get_logs_eval(spec, handle.name)
    return statuses if found else None


def _check_canary(phases: Phases, task: Task, statuses: dict[str, str], junit: dict[str, str], exit_code: int, verdict: Any) -> None:
    ids = [canary_id(phases, name, task.workdir) for name in phases.canary]
    if all(_lookup(test, junit) == "ERROR" for test in ids):
        # Both errored, the one that must pass too: something in the module stopped them
        # before they ran (a setup of its own). Not graded, and not called tampering.
        verdict.error = f"the canary tests appended to {phases.canary_file} errored before they ran: the run cannot be checked, not graded"
        return
    if exit_code in PYTEST_EXIT and not any(_lookup(test, junit) for test in ids):
        # pytest stopped before running them (a collection error: a module that does not
        # import): the run is not graded, for pytest's reason, and nothing was tampered with.
        verdict.error = f"pytest ended with {PYTEST_EXIT[exit_code]} (exit status {exit_code}) before the canary tests ran"
        return
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
    """A test's status; a truncated parametrised id (SWE-bench Verified has some: the parser
    cut the id at its first space) matches the ids it was cut from, and like a name several
    tests share (``shared_names_fold``) passes only when every one of them passed."""
    if test in statuses:
        return statuses[test]
    if test.count("[") > test.count("]"):
        prefixed = {k: s for k, s in statuses.items() if k.startswith(test)}
        cut_here = {k: s for k, s in prefixed.items() if len(k) > len(test) and k[len(test)].isspace()}
        found = {outcome_class(s): s for s in (cut_here or prefixed).values()}
        return next((found[cls] for cls in ("failed", "passed", "skipped") if cls in found), None)
    return None
