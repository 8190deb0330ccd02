"""pytest: ``pytest``, ``py.test``, ``python -m pytest``, and tox running pytest after its ``--``
(Sphinx's rows). tox is a way of starting pytest, not a framework of its own: its run is
pytest's, with the same report, canary, log and configuration, and only the arguments that
reach pytest go after ``--``."""

from __future__ import annotations

import re
import shlex

from envs.frameworks.base import Framework, Internals, Launcher

DIRECT = Launcher(re.compile(r"(^|[\s;&|(])(python[0-9.]*\s+(-\S+\s+)*-m\s+pytest|pytest|py\.test)(\s|$)"), label="pytest")
TOX = Launcher(re.compile(r"(^|[\s;&|(])tox(\s|$)"), passthrough="--", label="tox")


class Pytest(Framework):
    def report_arguments(self, report_path: str) -> str:
        return f" --junitxml={report_path} -o junit_family=xunit1"

    def file_arguments(self, paths: list[str]) -> str:
        return "".join(f" {shlex.quote(path)}" for path in paths)

    def probes(self, words: list[str]) -> list[tuple[str, str]] | None:
        first = words[0]
        if first in ("pytest", "py.test"):
            return [("the test runner (pytest)", f"{first} --version")]
        if first.startswith("python") and "-m" in words[1:] and words[words.index("-m") + 1 : words.index("-m") + 2] == ["pytest"]:
            return [("the interpreter", f"{first} --version"), ("the test runner (python -m pytest)", f"{first} -m pytest --version")]
        if first == "tox":
            return [("the test runner (tox)", "tox --version")]
        return None

    def collect_command(self, words: list[str], files: str) -> str | None:
        runner = f"{words[0]} -m pytest" if words and words[0].startswith("python") and "-m" in words else "pytest"
        return f"{runner} --collect-only -q -p no:cacheprovider {files}"


FRAMEWORK = Pytest(
    name="pytest",
    launchers=(DIRECT, TOX),
    log_parsers=frozenset({"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"}),
    summary=re.compile(r"^=+ .*\bin [\d.]+s\b.* =+$"),
    # A file whose tests are methods of classes gets a class (a unittest.TestCase, which pytest
    # collects whatever its naming settings and which no module-level set-up reaches).
    canary_shape="as the file",
    junit_report=True,
    creates_canary_file=True,
    config_files=frozenset(
        {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml", ".coveragerc"}
    ),
    always_suspicious=frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", ".coveragerc"}),
    config_sections={"tox.ini": ("pytest",), "setup.cfg": ("tool:pytest",), "pyproject.toml": ("tool", "pytest")},
    # pytest and what it imports at start: the work directory on sys.path (``python -m
    # pytest``, rootdir conftest insertion) would put a new top-level module of these names first.
    shadowed=frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup", "tomli"}),
    internals=Internals(
        modules={
            "_pytest": "the test framework's internals",
            "pytest": "the test framework",
            "pluggy": "the test framework's plugin system",
        },
        imported=("_pytest", "pluggy"),
        attributes={"runtest": "reaches pytest's test call", "pytest_plugins": "names pytest plugins to load"},
        names={"pytest_plugins": "names pytest plugins to load"},
        hook_prefix="pytest_",
        words=("junit", "conftest", "pytest"),
        packages=("_pytest", "pytest", "pluggy"),
    ),
)
