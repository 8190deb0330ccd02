"""What the verifier knows about one test framework, in one place (``envs.frameworks``).

A framework is a frozen value: how a command line starts it, the files and sections it reads
its configuration from, the names a patch must not shadow or reach, the shape the canary takes
under it, and how its log ends and is parsed. Behaviour that differs between frameworks (where
the canary goes, the arguments that give a run its report) is a method a framework's own class
overrides; everything else is data that the verifier (``envs.test_run``), the grader
(``envs.grading``), the candidate checks (``envs.candidate``), the scan (``envs.code_scan``) and
the image contract (``envs.contract``) read through the registry.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

# Where the canary goes and what it looks like: module-level functions, the methods of a
# ``unittest.TestCase`` class, or whichever of the two the task's tests in its file are.
CanaryShape = Literal["functions", "class", "as the file"]


@dataclass(frozen=True)
class Launcher:
    """One way a command line starts a framework: ``pytest``, or tox running pytest."""

    pattern: re.Pattern[str]
    # The word after which the command's arguments reach the framework: "" when they go to it
    # directly, "--" for tox, which hands what follows its ``--`` to the command it runs.
    passthrough: str = ""
    label: str = ""  # how a reader names this way of starting it ("tox")


@dataclass(frozen=True)
class Launch:
    """A test command recognised: the framework it starts, and how."""

    framework: Framework
    launcher: Launcher

    @property
    def direct(self) -> bool:
        return not self.launcher.passthrough


@dataclass(frozen=True)
class Internals:
    """What package code must not reach in a framework: the scan (``envs.code_scan``) marks it.

    ``modules``: dotted module names whose import or any attribute of reaches the run (module ->
    what that means); ``imported``: top-level packages whose mere import is reported as such
    (``imports _pytest.x``); ``paths``: attribute paths (``unittest.TestCase``); ``attributes``:
    attribute names of its test call (``runtest``, ``_callTestMethod``); ``results``: attribute
    names of its result objects; ``names``: bare names that mean something to it at module level
    (``pytest_plugins``); ``hook_prefix``: functions it calls as hooks by their name alone;
    ``words``: strings that name it (lower case); ``packages``: folder names of its own code (a
    repository that is the framework itself names it freely) and the bases a ``getattr`` with a
    name built at run time must not be called on."""

    modules: dict[str, str] = field(default_factory=dict)
    imported: tuple[str, ...] = ()
    paths: dict[str, str] = field(default_factory=dict)
    attributes: dict[str, str] = field(default_factory=dict)
    results: frozenset[str] = frozenset()
    names: dict[str, str] = field(default_factory=dict)
    hook_prefix: str = ""
    words: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Framework:
    """A test framework. Subclasses override the methods where their runner differs."""

    name: str  # as ``Phases.framework`` and the verdict name it
    launchers: tuple[Launcher, ...]
    log_parsers: frozenset[str]  # swebench's parsers (``PARSER_REGISTRY`` keys) that read its log
    summary: re.Pattern[str]  # the line its run ends with; result lines after it were printed by something else
    canary_shape: CanaryShape
    junit_report: bool = False  # writes the JUnit XML report the verifier reads as the independent channel
    # The canary may go into a new file when the command names none (the file is then named on
    # the command); otherwise it goes only into a file that exists.
    creates_canary_file: bool = False
    # Files whose bytes decide which tests run and how, wherever they are in the tree, and those
    # of them a patch has no reason to touch at all (a change is suspicious, not only put back).
    config_files: frozenset[str] = frozenset()
    always_suspicious: frozenset[str] = frozenset()
    # Shared configuration files and the section of each that is this framework's (a key path:
    # ``("tool:pytest",)`` in ``setup.cfg``, ``("tool", "pytest")`` in ``pyproject.toml``).
    config_sections: dict[str, tuple[str, ...]] = field(default_factory=dict)
    shadowed: frozenset[str] = frozenset()  # top-level modules it imports that a patch must not add
    internals: Internals = field(default_factory=Internals)
    # Line patterns of its log beyond the parser's: a line that begins one file's section (its
    # group 1 the file), text a result line may end with that is not the result, a test's own
    # id line, and a failure heading (group 1 FAIL or ERROR, group 2 the test).
    section_start: re.Pattern[str] | None = None
    line_suffix: re.Pattern[str] | None = None
    test_id: re.Pattern[str] | None = None
    failure_heading: re.Pattern[str] | None = None

    def is_runner_file(self, path: str) -> bool:
        """Whether a repository path the command names is this framework's runner script
        (``bin/test``, ``tests/runtests.py``): restored like configuration."""
        return False

    def canary_files(self, words: list[str], tests: list[str] | tuple[str, ...], is_runner: Callable[[str], bool]) -> list[str]:
        """Repository files the canary may go into, best first (the first that exists is used):
        by default the test file ``first_test_file`` picks. ``is_runner``: whether a path is a
        runner script of any framework (never a test file)."""
        target = first_test_file(words, tests, is_runner)
        return [target] if target else []

    def report_arguments(self, report_path: str) -> str:
        """Arguments that make the run write its report to ``report_path`` ("" for none)."""
        return ""

    def file_arguments(self, paths: list[str]) -> str:
        """Arguments that add test files to the run (the canary's new file)."""
        return ""

    def probes(self, words: list[str]) -> list[tuple[str, str]] | None:
        """(what, shell command) pairs that show the runner starts without running tests, for a
        command whose words are ``words``; None leaves it to the generic probes."""
        return None

    def collect_command(self, words: list[str], files: str) -> str | None:
        """A command that only imports the tests in ``files`` (shell-quoted), or None."""
        return None


def command_words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def first_test_file(words: list[str], tests: list[str] | tuple[str, ...], is_runner: Callable[[str], bool]) -> str | None:
    """The test file the canary goes into: the first the command names that holds one of the
    task's tests, else the first it names. A file none of them is in may be skipped whole
    (pytest 6.3's testing/test_nose.py without nose), and the canary with it. ``is_runner``
    leaves out the runner scripts the command names."""
    files = []
    for word in words:
        path = word.split("::")[0].removeprefix("./")
        if path.endswith(".py") and not path.startswith(("-", "/")) and ".." not in path.split("/"):
            if not is_runner(path):
                files.append(path)
    listed = {test.split("::")[0] for test in tests}
    return next((f for f in files if f in listed), files[0] if files else None)
