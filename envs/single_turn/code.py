"""Code: the program a response ends with, run against the task's unit tests in a container.

The program is the last fenced Python block of the response's visible text (``content``): a
response that tried one program and then fixed it is judged by the fix. Every test runs as
its own command in one fresh container per response (the offline base image: python3, no
network, CPU, memory and process limits, a timeout per test with the process group killed):
``stdio`` tests feed ``input`` on standard input and compare the printed lines (trailing
whitespace ignored); ``call`` tests import the program as a module and compare the function's
result with ``expected`` as JSON values. Hidden tests (not shown in the prompt) run too, so a
program that prints the shown example's output passes only what it was shown.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from envs.docker_backend import Container, Limits
from envs.single_turn.tasks import CodeTest

FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.S)
SANDBOX = "/sandbox"
LIMITS = Limits(cpus=1.0, memory_mb=512, pids=64, network=False)
TEST_TIMEOUT_S = 10.0
# Imports the program as a module (its top level runs, ``__main__`` blocks do not) and prints
# the function's result as JSON after a marker, so the program's own prints cannot fake it.
CALL_RUNNER = """\
import importlib.util, json, sys
request = json.loads(sys.stdin.read())
spec = importlib.util.spec_from_file_location("solution", "/sandbox/solution.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = getattr(module, request["function"])(*request["args"])
sys.stdout.write("\\n@@relearn-result@@" + json.dumps(result, sort_keys=True))
"""
MARKER = "@@relearn-result@@"


@dataclass
class TestOutcome:
    index: int
    hidden: bool
    passed: bool
    detail: str = ""


@dataclass
class CodeResult:
    passed: bool
    program: str | None
    tests: list[TestOutcome] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        shown = [t for t in self.tests if not t.hidden]
        hidden = [t for t in self.tests if t.hidden]
        return {
            "visible_passed": sum(t.passed for t in shown), "visible": len(shown),
            "hidden_passed": sum(t.passed for t in hidden), "hidden": len(hidden),
            "failures": [{"test": t.index, "hidden": t.hidden, "detail": t.detail} for t in self.tests if not t.passed][:5],
        }  # fmt: skip


def extract_program(text: str) -> str | None:
    blocks = FENCE.findall(text or "")
    return blocks[-1] if blocks else None


def verify_code(client: Any, image: str, response: str, tests: list[CodeTest], *, timeout_s: float = TEST_TIMEOUT_S) -> CodeResult:
    program = extract_program(response)
    if program is None:
        return CodeResult(False, None, [TestOutcome(i, t.hidden, False, "no ```python block in the response") for i, t in enumerate(tests)])
    outcomes = []
    with Container.start(client, image, limits=LIMITS, workdir=SANDBOX) as box:
        box.put_files({f"{SANDBOX}/solution.py": (program, 0o644), f"{SANDBOX}/call_runner.py": (CALL_RUNNER, 0o644)})
        for index, test in enumerate(tests):
            outcomes.append(_run(box, index, test, timeout_s))
    return CodeResult(all(o.passed for o in outcomes), program, outcomes)


def _run(box: Container, index: int, test: CodeTest, timeout_s: float) -> TestOutcome:
    if test.type == "stdio":
        result = box.exec(["python3", f"{SANDBOX}/solution.py"], stdin=(test.input or "").encode(), timeout_s=timeout_s)
        if result.timed_out or result.exit_code != 0:
            return TestOutcome(index, test.hidden, False, _failure(result))
        ok = _lines(result.stdout) == _lines(test.output or "")
        return TestOutcome(index, test.hidden, ok, "" if ok else f"printed {result.stdout[:200]!r}, expected {test.output!r}")
    request = json.dumps({"function": test.function, "args": test.args})
    result = box.exec(["python3", f"{SANDBOX}/call_runner.py"], stdin=request.encode(), timeout_s=timeout_s)
    if result.timed_out or result.exit_code != 0 or MARKER not in result.stdout:
        return TestOutcome(index, test.hidden, False, _failure(result))
    value = json.loads(result.stdout.rsplit(MARKER, 1)[1])
    ok = value == json.loads(json.dumps(test.expected))
    return TestOutcome(
        index, test.hidden, ok, "" if ok else f"{test.function}(*{test.args!r}) returned {value!r}, expected {test.expected!r}"
    )


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _failure(result: Any) -> str:
    if result.timed_out:
        return "timed out"
    return f"exit {result.exit_code}: {(result.stderr or result.output)[-300:].strip()}"
