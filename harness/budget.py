"""A fixed budget for one episode, checked before every model call.

Evaluation compares policies only under the same budget, so it is a first-class,
recorded object, not loop counters scattered through the code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from records.trajectory import ExitStatus, Usage


@dataclass(frozen=True)
class Budget:
    max_turns: int | None = 50  # model calls
    max_tokens: int | None = None  # input + output tokens over all calls
    max_seconds: float | None = None  # wall clock for the whole episode
    max_cost_usd: float | None = None
    max_format_errors: int = 3  # consecutive tool calls the model could not have meant

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "max_turns": self.max_turns,
            "max_tokens": self.max_tokens,
            "max_seconds": self.max_seconds,
            "max_cost_usd": self.max_cost_usd,
            "max_format_errors": self.max_format_errors,
        }


@dataclass
class Ledger:
    """What an episode has spent against its budget."""

    budget: Budget
    started: float = field(default_factory=time.monotonic)
    turns: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    format_errors: int = 0  # consecutive

    def charge(self, usage: Usage | None) -> None:
        self.turns += 1
        if usage is not None:
            self.tokens += (usage.input_tokens or 0) + (usage.output_tokens or 0)
            self.cost_usd += usage.cost_usd or 0.0

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def exhausted(self) -> ExitStatus | None:
        """Why no further model call may be made, or None."""
        b = self.budget
        if b.max_turns is not None and self.turns >= b.max_turns:
            return ExitStatus.turns_exhausted
        if b.max_tokens is not None and self.tokens >= b.max_tokens:
            return ExitStatus.tokens_exhausted
        if b.max_seconds is not None and self.seconds >= b.max_seconds:
            return ExitStatus.time_exhausted
        if b.max_cost_usd is not None and self.cost_usd >= b.max_cost_usd:
            return ExitStatus.cost_exhausted
        if self.format_errors >= b.max_format_errors:
            return ExitStatus.format_error
        return None

    def to_dict(self) -> dict[str, float | int]:
        return {"turns": self.turns, "tokens": self.tokens, "seconds": round(self.seconds, 3), "cost_usd": round(self.cost_usd, 6)}
