"""`relearn validate`: check pools in one streaming pass (records parse, ids are unique, tool
results answer earlier calls, something can be supervised)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from records.pools import RecordError, iter_pool
from records.trajectory import Trajectory, tool_call_pairs
from relearn.ops.outputs import POOL, check_jsonl_input, empty_pool
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.validate import ValidateOptions


@dataclass
class ValidateSummary:
    trajectories: int = 0
    with_problems: int = 0
    repeated: int = 0  # lines whose trajectory id an earlier line (of any pool given) has
    unreadable: list[RecordError] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "POOL:LINE: ID: field: what", then repeated ids
    formats: Counter[str] = field(default_factory=Counter)  # the source format ("relearn": our own)
    exit_status: Counter[str] = field(default_factory=Counter)
    empty: list[Path] = field(default_factory=list)  # pools without a single record

    @property
    def clean(self) -> bool:
        return not self.unreadable and not self.problems

    @property
    def warnings(self) -> list[str]:
        return [empty_pool(pool) for pool in self.empty]


def check_trajectory(trajectory: Trajectory) -> list[str]:
    """Structural problems a pool record can have even when every field parses."""
    problems = []
    calls, results = tool_call_pairs(trajectory.messages)
    for call_id, index in results.items():
        if call_id not in calls:
            problems.append(f"messages[{index}].tool_call_id: {call_id!r} answers no call")
        elif calls[call_id] > index:
            problems.append(f"messages[{index}].tool_call_id: {call_id!r} answers a later call")
    if not any(m.generated for m in trajectory.messages):
        problems.append("no generated message: nothing could ever be supervised")
    return problems


def run_validate(options: ValidateOptions, reporter: Reporter = SILENT) -> ValidateSummary:
    """Read every pool once, one trajectory at a time; only the ids are kept (to find repeats)."""
    for pool in options.pools:
        if pool.is_dir():
            raise OpError(f"{pool}: is a folder, not a pool file; give the pool's .jsonl or .jsonl.zst file")
        if not pool.is_file():
            raise OpError(f"{pool}: no such pool file; check the path")
        check_jsonl_input(pool, POOL, flag="POOL")
    summary = ValidateSummary()
    # Each id's first place (which pool, which line): a repeat names both lines. Ids are what
    # memory holds, with two small ints each, never the trajectories.
    first: dict[str, tuple[int, int]] = {}
    repeats: list[str] = []
    with stage(reporter, "validating", total=len(options.pools)):
        for number, pool in enumerate(options.pools):
            before = summary.trajectories, len(summary.unreadable)
            for line, trajectory in iter_pool(pool, summary.unreadable):
                summary.trajectories += 1
                seen = first.setdefault(trajectory.id, (number, line))
                if seen != (number, line):
                    where = f"{options.pools[seen[0]]}:{seen[1]}"
                    summary.repeated += 1
                    repeats.append(f"{pool}:{line}: {trajectory.id}: repeated trajectory id, first at {where}")
                found = check_trajectory(trajectory)
                summary.problems.extend(f"{pool}:{line}: {trajectory.id}: {p}" for p in found)
                summary.with_problems += bool(found)
                summary.formats[trajectory.source.format if trajectory.source else "relearn"] += 1
                summary.exit_status[trajectory.exit_status.value] += 1
            if (summary.trajectories, len(summary.unreadable)) == before:
                summary.empty.append(pool)
            reporter.advance(1, trajectories=summary.trajectories)
    summary.problems.extend(repeats)
    return summary
