"""SymPy's own runner, ``bin/test`` (``sympy.testing.runtests``, ``sympy.utilities.runtests``
before 1.6): module-level test functions only, named without their file in the log, which is
the channel (no report)."""

from __future__ import annotations

import re

from envs.frameworks.base import Framework, Internals, Launcher

RUNNER = "bin/test"
RUNNER_MODULE = "SymPy's test runner"


class Sympy(Framework):
    def is_runner_file(self, path: str) -> bool:
        return path == RUNNER


FRAMEWORK = Sympy(
    name="sympy",
    launchers=(Launcher(re.compile(r"(^|[\s;&|(])(\./)?bin/test(\s|$)"), label=RUNNER),),
    log_parsers=frozenset({"parse_log_sympy"}),
    summary=re.compile(r"^=+ tests finished: .* =+$"),
    canary_shape="functions",  # the runner collects module-level functions only
    config_files=frozenset(),
    # `sympy/core/tests/test_x.py[12] `: a file's section begins, and the result lines under it
    # name tests without their file. The verbose runner ends a file's last result line with the
    # file's own status, which the parser does not read as a result.
    section_start=re.compile(r"^(\S+\.py)\[\d+\]"),
    line_suffix=re.compile(r"\s+\[(OK|FAIL)\]\s*$"),
    internals=Internals(
        modules={"sympy.testing.runtests": RUNNER_MODULE, "sympy.utilities.runtests": RUNNER_MODULE},
        # Its reporter's calls decide what a test is reported as.
        results=frozenset({"test_pass", "test_fail", "test_exception", "test_xfail", "test_xpass", "test_skip", "doctest_fail"}),
        attributes={"_enhance_asserts": "reaches SymPy's test call"},
    ),
)
