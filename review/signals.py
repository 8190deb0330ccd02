"""What the cheap checks report: a Signal points at one action of one step, with its kind.

Kinds in ``HINT_KINDS`` inform the judges and claim no mistake; the offline reviewer
excludes nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from review.actions import Action

KINDS = (
    "failed_command",
    "tool_error",
    "traceback",
    "expected_failure",
    "reverted_edit",
    "repeated_command",
    "repeated_test_run",
    "stuck_loop",
    "abab",
)
# Kinds that inform the judges but are no mistake: nothing is excluded for them.
HINT_KINDS = frozenset({"expected_failure"})


@dataclass
class Signal:
    message_index: int  # the assistant message (step) the signal points at
    kind: str
    category: str  # one of records.review.CATEGORIES
    detail: str
    call_index: int | None = None  # which tool call of that message; None for text-protocol steps
    evidence: str = ""  # what in the observation shows it (an excerpt)

    @property
    def is_defect(self) -> bool:
        """Whether the signal claims a mistake (hints such as an expected failure do not)."""
        return self.kind not in HINT_KINDS


def signal_at(action: Action, kind: str, category: str, detail: str, evidence: str) -> Signal:
    return Signal(action.message_index, kind, category, detail, action.call_index, evidence)


def describe(action: Action) -> str:
    if action.tool == "apply_patch":
        return f"apply_patch on {', '.join(sorted(action.files)) or 'unparsed patch'}"
    if action.script is not None:
        text = " ".join(action.script.split())
        return f"`{text[:100]}{'…' if len(text) > 100 else ''}`"
    return action.tool


def excerpt(output: str, last_lines: int = 0, limit: int = 300) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip() and not line.startswith("Wall time:")]
    text = "\n".join(lines[-last_lines:] if last_lines else lines[:6])
    return text[:limit]
