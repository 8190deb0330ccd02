"""Math: the response's final answer against the reference answer, by ``math-verify``.

The final answer is read from the response's visible text (``content``), not its reasoning:
math-verify extracts the boxed answer (every ``\\boxed{}`` of the text: two different boxed
answers are a set, which matches no single reference, so hedging fails) or else the last
LaTeX or plain expression, and compares it with the parsed reference symbolically
(fractions and decimals, LaTeX forms, sets regardless of order).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from math_verify import parse, verify

TIMEOUT_S = 5  # math-verify's own limit per parse and comparison


@dataclass(frozen=True)
class MathResult:
    correct: bool
    extracted: str | None  # the answer math-verify found in the response, as text
    reference: str


def verify_math(response: str, reference: str) -> MathResult:
    # math-verify times out with SIGALRM, which only the main thread can use; elsewhere the
    # comparison runs without its timer (the expressions here are a line long).
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(reference if "$" in reference or "\\boxed" in reference else f"${reference}$", parsing_timeout=timeout)  # type: ignore[arg-type]
    found = parse(response, parsing_timeout=timeout)  # type: ignore[arg-type]
    extracted = str(found[-1]) if found else None
    correct = bool(found) and bool(gold) and verify(gold, found, timeout_seconds=timeout)
    return MathResult(correct, extracted, reference)
