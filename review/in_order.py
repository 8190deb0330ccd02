"""Results written in the units' order, whatever order the workers finish them in.

Several review workers finish trajectories in an order that depends on each judge call's
latency, so two runs of one review would write the same lines in another order. ``InOrder``
numbers the units as they are read and holds a finished unit's write until every unit before
it is written: the file is in the pool's order, byte-identical from run to run, and a run
killed and resumed (which appends the rest in the pool's order) writes the same bytes too.

The window it holds is bounded by the caller: ``full(window)`` tells ``run_units`` (its
``hold``) to start nothing new while that many finished units wait behind a slower one, so
memory holds at most about the work in flight, never the pool."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

U = TypeVar("U")


def _nothing() -> None:
    return None


@dataclass
class InOrder(Generic[U]):
    # By the unit object's identity (the executor hands back the very object it was given);
    # the unit itself is kept with its number so its identity cannot be reused meanwhile.
    _numbers: dict[int, tuple[int, U]] = field(default_factory=dict)
    _waiting: dict[int, Callable[[], None]] = field(default_factory=dict)
    _issued: int = 0
    _next: int = 0

    def numbered(self, units: Iterable[U]) -> Iterator[U]:
        """``units``, each numbered as it is read (lazily: the pool is never read ahead)."""
        for unit in units:
            self._numbers[id(unit)] = (self._issued, unit)
            self._issued += 1
            yield unit

    def done(self, unit: U, write: Callable[[], None] | None = None) -> None:
        """``unit`` is finished: ``write`` (None: it writes nothing) runs once every unit read
        before it has been written, here or in a later call."""
        number, _unit = self._numbers.pop(id(unit))
        self._waiting[number] = write or _nothing
        while self._next in self._waiting:
            self._waiting.pop(self._next)()
            self._next += 1

    def full(self, window: int) -> bool:
        """Whether ``window`` finished units already wait for a slower one."""
        return len(self._waiting) >= max(1, window)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def drain(self) -> None:
        """After a run that left units unstarted (a spend cap, a retry refused): write what
        waits behind them, still in order. Not called when the run is interrupted: what
        waits then is dropped, its judge answers are in the call cache, and the rerun writes
        it in the pool's order for nothing."""
        for number in sorted(self._waiting):
            self._waiting.pop(number)()
        self._next = self._issued
