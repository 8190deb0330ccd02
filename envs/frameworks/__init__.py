"""The test frameworks the verifier knows, one module each, in one registry.

Every part of the verifier that depends on the framework asks the registry: which line of an
eval script runs the tests and under which framework (``envs.test_run``), where the canary
goes and in what shape, which report the run writes, how its log ends and which swebench
parsers read it (``envs.grading``), which files and sections configure it, which top-level
names a patch must not shadow (``envs.candidate``), which of its internals package code must
not reach (``envs.code_scan``), and how to see that it starts (``envs.contract``).

Adding a framework is one module that builds a ``Framework`` (``envs.frameworks.base``) and one
entry in ``FRAMEWORKS``. The order of ``FRAMEWORKS`` is the order detection tries them in, on
each line of the test section.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from envs.frameworks import pytest, sympy, unittest
from envs.frameworks.base import Framework, Internals, Launch, Launcher

__all__ = ["FRAMEWORKS", "REGISTRY", "Framework", "Internals", "Launch", "Launcher", "Registry", "by_name", "detect", "for_log_parser"]


@dataclass(frozen=True)
class Registry:
    """Frameworks, in the order detection tries them, and what they declare taken together."""

    frameworks: tuple[Framework, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.frameworks]
        if len(set(names)) != len(names):
            raise ValueError(f"two frameworks share a name: {names}")

    def detect(self, line: str) -> Launch | None:
        """The framework a command line starts (the first whose launcher matches), or None."""
        for framework in self.frameworks:
            for launcher in framework.launchers:
                if launcher.pattern.search(line):
                    return Launch(framework, launcher)
        return None

    def test_command(self, lines: list[str]) -> tuple[int, Launch] | None:
        """Which line of a test section runs the tests, and how (a here-document is data)."""
        for i, line in enumerate(lines):
            if "<<" in line:
                continue
            launch = self.detect(line)
            if launch is not None:
                return i, launch
        return None

    def by_name(self, name: str | None) -> Framework | None:
        return next((f for f in self.frameworks if f.name == name), None)

    def for_log_parser(self, parser: str | None) -> Framework | None:
        """The framework whose log a swebench parser (a ``PARSER_REGISTRY`` key) reads."""
        return next((f for f in self.frameworks if parser in f.log_parsers), None)

    def is_runner_file(self, path: str) -> bool:
        """Whether a path is the runner script of any framework (``bin/test``, ``runtests.py``)."""
        return any(f.is_runner_file(path) for f in self.frameworks)

    @cached_property
    def config_files(self) -> frozenset[str]:
        return frozenset().union(*(f.config_files for f in self.frameworks))

    @cached_property
    def always_suspicious(self) -> frozenset[str]:
        return frozenset().union(*(f.always_suspicious for f in self.frameworks))

    @cached_property
    def config_sections(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """Shared configuration file -> the key path of each framework's section in it."""
        out: dict[str, tuple[tuple[str, ...], ...]] = {}
        for framework in self.frameworks:
            for name, section in framework.config_sections.items():
                out[name] = (*out.get(name, ()), section)
        return out

    @cached_property
    def shadowed(self) -> frozenset[str]:
        return frozenset().union(*(f.shadowed for f in self.frameworks))

    @cached_property
    def internals(self) -> Internals:
        """Every framework's internals in one table (the scan's)."""
        parts = [f.internals for f in self.frameworks]
        return Internals(
            modules={k: v for p in parts for k, v in p.modules.items()},
            imported=tuple(dict.fromkeys(i for p in parts for i in p.imported)),
            paths={k: v for p in parts for k, v in p.paths.items()},
            attributes={k: v for p in parts for k, v in p.attributes.items()},
            results=frozenset().union(*(p.results for p in parts)),
            names={k: v for p in parts for k, v in p.names.items()},
            words=tuple(dict.fromkeys(w for p in parts for w in p.words)),
            packages=tuple(dict.fromkeys(k for p in parts for k in p.packages)),
        )

    @cached_property
    def hook_prefixes(self) -> dict[str, str]:
        """Prefix of the functions a framework calls as hooks -> the framework's name."""
        return {f.internals.hook_prefix: f.name for f in self.frameworks if f.internals.hook_prefix}


FRAMEWORKS: tuple[Framework, ...] = (pytest.FRAMEWORK, sympy.FRAMEWORK, unittest.FRAMEWORK)
REGISTRY = Registry(FRAMEWORKS)


def detect(line: str) -> Launch | None:
    return REGISTRY.detect(line)


def by_name(name: str | None) -> Framework | None:
    return REGISTRY.by_name(name)


def for_log_parser(parser: str | None) -> Framework | None:
    return REGISTRY.for_log_parser(parser)
