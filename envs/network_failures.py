"""Which graded tests failed for want of the network, read from their own part of the test log.

Grading runs with the network off; the official SWE-bench harness runs its containers with it.
A listed test that reaches the internet (requests' tests call httpbin.org, Sphinx's linkcheck
tests www.google.com) then fails here and passes there. Its verdict stays unresolved, but it
says which of its failed tests failed with a network error, so that a rerun with the network
on (``relearn verify --network``) can grade it as the official harness does.

Precise per test, never per log: the error must be in the test's own section (pytest's
``____ name ____`` block under FAILURES or ERRORS, its short summary line, SymPy's
``____ file:name ____`` block, Django's ``FAIL:``/``ERROR:`` block). A section whose heading
more than one failed test could own is left out rather than blamed on the wrong one. A refused
connection to this machine (a test's own local server) is not the network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from envs.frameworks.unittest import FRAMEWORK as UNITTEST

# What a connection to the internet ends with inside a container that has no network:
# name resolution fails (glibc's gaierror texts), or an address outside has no route.
NETWORK_ERROR = re.compile(
    r"gaierror|Name or service not known|Temporary failure in name resolution|nodename nor servname provided"
    r"|No address associated with hostname|Network is unreachable|\[Errno 101\]"
)
# urllib3/requests name the host they could not reach: only a remote one is the network.
CONNECTION_FAILED = re.compile(r"ConnectionError|Max retries exceeded")
HOST = re.compile(r"host='(?P<host>[^']+)'")
LOCAL_HOST = re.compile(r"localhost|127\.\d+\.\d+\.\d+|::1|0\.0\.0\.0")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BANNER = re.compile(r"^=+ (?P<title>.+?) =+$")  # pytest's `==== FAILURES ====`
RULE = re.compile(r"^={20,}$")  # unittest's line above each failure (its dashed line is inside one)
HEADING = re.compile(r"^_{3,} (?P<name>.+?) _{3,}$")  # pytest's and SymPy's failure headings
# Django's runner's failure heading (group 2 `name (where)`) and its closing line, as the
# framework registry declares them.
UNITTEST_HEADING = UNITTEST.failure_heading
NAME_WHERE = re.compile(r"^(?P<name>\S+) \((?P<where>[^)]*)\)$")
SUMMARY_LINE = re.compile(r"^(?:FAILED|ERROR) (?P<id>\S+) - (?P<message>.*)$")
UNITTEST_END = UNITTEST.summary
PYTEST_PREFIXES = ("ERROR at setup of ", "ERROR at teardown of ")
COLLECTING = "ERROR collecting "
# Blocks of a pytest log whose headings are not failures.
NOT_FAILURES = ("PASSES", "warnings summary", "short test summary info", "slowest")


@dataclass
class Section:
    """One test's part of the log: the names its heading gives it, and its text."""

    names: frozenset[str]
    text: str
    exact: bool = False  # a short summary line: it names the test's whole id
    collecting: str | None = None  # pytest could not import this file: every test of it


def sections(log: str) -> Iterator[Section]:
    """The per-test sections of a test log, of every runner whose layout is known."""
    current: list[str] | None = None
    names: frozenset[str] = frozenset()
    collecting: str | None = None
    block = ""
    lines = ANSI.sub("", log).split("\n")

    def close() -> Iterator[Section]:
        if current is not None and names:
            yield Section(names, "\n".join(current), collecting=collecting)

    for index, raw in enumerate(lines):
        line = raw.rstrip()
        summary = SUMMARY_LINE.match(line)
        if summary and needs_network(summary.group("message")):
            yield Section(frozenset({summary.group("id")}), summary.group("message"), exact=True)
        banner = BANNER.match(line)
        heading = HEADING.match(line) if not any(block.startswith(b) for b in NOT_FAILURES) else None
        unittest = NAME_WHERE.match(failure.group(2)) if (failure := UNITTEST_HEADING.match(line)) else None
        if banner or heading or unittest or RULE.match(line) or UNITTEST_END.match(line):
            yield from close()
            current, names, collecting = None, frozenset(), None
        if banner:
            block = banner.group("title").strip()
        elif heading:
            names, collecting = _pytest_names(heading.group("name")), None
            if heading.group("name").startswith(COLLECTING):
                collecting = heading.group("name").removeprefix(COLLECTING).strip()
            current = []
        elif unittest:
            names = _unittest_names(unittest.group("name"), unittest.group("where"), lines[index + 1 : index + 2])
            current = []
        elif current is not None:
            current.append(line)
    yield from close()


def _pytest_names(heading: str) -> frozenset[str]:
    """``Class.test_x[p]`` (pytest's head line), ``sympy/x/tests/test_y.py:test_z`` (SymPy's)."""
    for prefix in PYTEST_PREFIXES:
        heading = heading.removeprefix(prefix)
    names = {heading}
    if ":" in heading and "::" not in heading:
        names.add(heading.rsplit(":", 1)[1])
    return frozenset(names)


def _unittest_names(name: str, where: str, after: list[str]) -> frozenset[str]:
    """``test_x (app.tests.T)`` as the rows list it (Python 3.11 prints ``app.tests.T.test_x``),
    and the docstring's first line the runner prints under it, by which swebench names the test."""
    where = where.removesuffix("." + name)
    names = {f"{name} ({where})"}
    if after and after[0].strip() and set(after[0].strip()) != {"-"}:
        names.add(after[0].strip())
    return frozenset(names)


def _remote(text: str) -> bool:
    """A line of a failed connection (``HTTPSConnectionPool(host='x', port=443): Max retries
    exceeded``) that names a host other than this machine."""
    return any(
        not LOCAL_HOST.fullmatch(host.group("host"))
        for line in text.split("\n")
        if CONNECTION_FAILED.search(line)
        for host in HOST.finditer(line)
    )


def needs_network(text: str) -> bool:
    """A network error in this text: a name that did not resolve, no route out, or a
    connection to a remote host that failed."""
    return bool(NETWORK_ERROR.search(text)) or _remote(text)


def _keys(test: str) -> tuple[str, set[str]]:
    """A listed test's file (pytest ids) and the names a section heading gives it."""
    if "::" in test:
        path, *parts = test.split("::")
        return path, {".".join(parts)}
    return "", {test}


def network_needed(log: str, failed: Iterable[str]) -> list[str]:
    """The tests of ``failed`` (in its order) whose own section of ``log`` shows a network error."""
    failed = list(dict.fromkeys(failed))
    keys = {test: _keys(test) for test in failed}
    found: set[str] = set()
    for section in sections(log):
        if section.exact:
            found |= section.names & set(failed)
            continue
        if not needs_network(section.text):
            continue
        if section.collecting is not None:
            found |= {t for t in failed if keys[t][0] == section.collecting}
            continue
        owners = [t for t in failed if keys[t][1] & section.names]
        if len(owners) > 1:  # the same heading in two files: the file the section names decides
            owners = [t for t in owners if keys[t][0] and f"{keys[t][0]}:" in section.text]
        if len(owners) == 1:
            found.add(owners[0])
    return [t for t in failed if t in found]


def offline_failures(verdict: object, log: str) -> list[str]:
    """For a verdict graded with the network off and not resolved: its failed FAIL_TO_PASS and
    PASS_TO_PASS tests that failed with a network error. Nothing when the network was on."""
    limits = getattr(verdict, "limits", None) or {}
    tests = getattr(verdict, "tests", None) or {}
    if limits.get("network") or getattr(verdict, "resolved", False) or not tests:
        return []
    failed = [t for kind in ("FAIL_TO_PASS", "PASS_TO_PASS") for t in tests.get(kind, {}).get("failure", [])]
    return network_needed(log, failed) if failed else []
