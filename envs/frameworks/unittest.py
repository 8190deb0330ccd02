"""unittest run by a Django-style runner: ``tests/runtests.py`` (Django) and runners like it
(``runtests.py LABELS``: unittest at verbosity 2, dotted labels relative to the runner's folder,
exit status 1 on failure; the mini suite's ``mini__unitconv-1``). Its log is read by
swebench's Django parser; it writes no report, so the log, read line by line, is the channel."""

from __future__ import annotations

import re
from collections.abc import Callable

from envs.frameworks.base import Framework, Internals, Launcher

RUNNER = "runtests.py"
LABEL = re.compile(r"[A-Za-z_][\w.]*")
LOOKS_LIKE_TESTS = re.compile(r"(^|/)tests?(_[^/]*)?\.py$|(^|/)tests/")
UNITTEST_MACHINERY = "reaches unittest's test machinery"
# A test's own id line: `test_x (app.tests.T)`, `test_x (app.tests.T.test_x)` (Python 3.11+).
TEST_ID = re.compile(r"\w+ \([\w.]+\)")


class Unittest(Framework):
    def is_runner_file(self, path: str) -> bool:
        return path.endswith(RUNNER)

    def canary_files(self, words: list[str], tests: list[str] | tuple[str, ...], is_runner: Callable[[str], bool]) -> list[str]:
        """The module files of the runner's dotted labels (relative to the runner's folder),
        those that look like test modules first: the canary class goes into the first that
        exists (a label may name a module outside the tests, or a class)."""
        runner = next((w for w in words if w.endswith(RUNNER)), None)
        if runner is None:
            return []
        folder = runner.removeprefix("./").rpartition("/")[0]
        labels = [w for w in words[words.index(runner) + 1 :] if not w.startswith("-") and LABEL.fullmatch(w)]
        files = [f"{folder + '/' if folder else ''}{label.replace('.', '/')}.py" for label in labels]
        looks_like_tests = [f for f in files if LOOKS_LIKE_TESTS.search(f.removeprefix(folder + "/"))]
        return list(dict.fromkeys(looks_like_tests + files))


FRAMEWORK = Unittest(
    name="unittest",
    launchers=(Launcher(re.compile(r"(^|[\s;&|(/])runtests\.py(\s|$)"), label="runtests.py"),),
    log_parsers=frozenset({"parse_log_django"}),
    summary=re.compile(r"^Ran \d+ tests? in [\d.]+s$"),
    canary_shape="class",  # the runner runs the methods of TestCase classes only
    config_files=frozenset({RUNNER}),
    always_suspicious=frozenset({RUNNER}),
    shadowed=frozenset({"unittest"}),
    # Its id lines, and the heading of a failure's traceback, which the parser files under the
    # bare name.
    test_id=TEST_ID,
    failure_heading=re.compile(r"^(FAIL|ERROR): (\S+ \([^)]*\))"),
    internals=Internals(
        modules={
            "unittest.result": "unittest's result machinery",
            "unittest.runner": "unittest's result machinery",
            "unittest.case": "unittest's test cases",
            "unittest.loader": "unittest's test loader",
            "unittest.suite": "unittest's test suites",
            "unittest.main": "unittest's test program",
        },
        paths={
            f"unittest.{name}": UNITTEST_MACHINERY
            for name in (
                "TestCase",
                "TestResult",
                "TextTestResult",
                "TextTestRunner",
                "TestSuite",
                "TestLoader",
                "defaultTestLoader",
                "TestProgram",
                "main",
            )
        },  # fmt: skip
        attributes={
            "_callTestMethod": "reaches unittest's test call",
            "_callSetUp": "reaches unittest's test call",
            "_callTearDown": "reaches unittest's test call",
            "_outcome": "reaches unittest's test outcome",
        },
        results=frozenset({"addFailure", "addError", "addSuccess", "addExpectedFailure", "wasSuccessful", "failures", "errors"}),
        words=("unittest", "_calltestmethod"),
        packages=("unittest",),
    ),
)
