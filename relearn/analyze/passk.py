"""Complementarity: which problems each pool solves, and how often.

The paper's point: historical rollouts solve problems the current policy no longer solves,
so relearning from them can add what the policy lost. Per pool we give each problem's
success rate, the unbiased pass@k curve (Chen et al., 2021; ``records.passk.pass_at_k``,
the estimator every verb shares) and, over the problems the pools share, the problems
solved by one pool and not by another.

Success is the verifier's: ``resolved``, or a positive reward where the verifier gives only
a reward (``is_verified_positive``). A trajectory with no verifier result is not a failure,
so it is rejected (listed), never counted as one; so is one without ``task_id``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from records.passk import pass_at_k_table
from records.pools import RecordError, iter_pool
from records.trajectory import Outcome, Trajectory, is_verified_positive
from relearn.analyze.pools import NamedPool


@dataclass
class PoolOutcomes:
    """One pool reduced to what pass@k needs: per problem, its attempts and successes."""

    name: str
    path: str
    records: int = 0
    rejected: list[RecordError] = field(default_factory=list)
    table: dict[str, dict[str, float | int]] = field(default_factory=dict)  # pass_at_k_table's rows

    def attempts(self, task: str) -> int:
        return int(self.table[task]["attempts"])

    def resolved(self, task: str) -> int:
        return int(self.table[task]["resolved"])

    def solved(self) -> set[str]:
        return {task for task, row in self.table.items() if row["resolved"]}


def _verified(trajectory: Trajectory) -> bool:
    outcome = trajectory.outcome
    return outcome is not None and (outcome.resolved is not None or outcome.reward is not None)


def read_outcomes(pool: NamedPool, limit: int | None = None, on_record: Callable[[], None] | None = None) -> PoolOutcomes:
    result = PoolOutcomes(pool.name, str(pool.path))
    path = str(pool.path)
    first_line: dict[str, int] = {}
    light: list[Trajectory] = []
    for line, trajectory in iter_pool(pool.path, result.rejected, limit):
        result.records += 1
        if on_record:
            on_record()
        if not trajectory.task_id:
            result.rejected.append(RecordError(path, line, "task_id", "missing: attempts are grouped by problem"))
        elif not _verified(trajectory):
            result.rejected.append(
                RecordError(path, line, "outcome", "no verifier result (resolved or reward); run `relearn verify` first")
            )
        elif trajectory.id in first_line:
            # Counting one attempt twice would inflate both n and c.
            result.rejected.append(RecordError(path, line, "id", f"{trajectory.id!r} repeats line {first_line[trajectory.id]}"))
        else:
            first_line[trajectory.id] = line
            # Only what pass_at_k_table reads is kept (a pool can be gigabytes of messages);
            # success is folded into ``resolved``, which it reads through is_verified_positive.
            light.append(
                Trajectory(
                    id=trajectory.id, task_id=trajectory.task_id, messages=[], outcome=Outcome(resolved=is_verified_positive(trajectory))
                )
            )
    most = max(Counter(t.task_id for t in light).values(), default=0)
    result.table = pass_at_k_table(light, ks=tuple(range(1, most + 1)))
    return result


def curve(pool: PoolOutcomes, max_k: int | None) -> list[dict[str, float | int]]:
    """Mean pass@k over the problems with at least k attempts, for k = 1..K.

    K defaults to the fewest attempts any problem has, so every point averages the same
    problems; a larger ``max_k`` extends the curve over fewer problems (each point says how many).
    """
    counts = [int(row["attempts"]) for row in pool.table.values()]
    if not counts:
        return []
    top = min(max_k, max(counts)) if max_k else min(counts)
    points = []
    for k in range(1, top + 1):
        values = [float(row[f"pass@{k}"]) for row in pool.table.values() if f"pass@{k}" in row]
        points.append({"k": k, "pass": sum(values) / len(values), "problems": len(values)})
    return points


def pair(a: PoolOutcomes, b: PoolOutcomes) -> dict[str, Any]:
    """Problems attempted by both, split by which of the two solved them (at least once)."""
    common = set(a.table) & set(b.table)
    solved_a, solved_b = a.solved() & common, b.solved() & common
    return {
        "a": a.name,
        "b": b.name,
        "problems": len(common),
        "both": len(solved_a & solved_b),
        "only_a": len(solved_a - solved_b),
        "only_b": len(solved_b - solved_a),
        "neither": len(common - solved_a - solved_b),
        "only_a_tasks": sorted(solved_a - solved_b),
        "only_b_tasks": sorted(solved_b - solved_a),
    }


def analyze(pools: list[PoolOutcomes], max_k: int | None = None) -> dict[str, Any]:
    """Everything ``relearn analyze passk`` writes to passk.json."""
    common = set.intersection(*(set(p.table) for p in pools)) if pools else set()
    summaries = []
    for pool in pools:
        others = set().union(*(p.solved() for p in pools if p is not pool))
        points = curve(pool, max_k)
        counts = [pool.attempts(t) for t in pool.table]
        summaries.append(
            {
                "name": pool.name,
                "path": pool.path,
                "records": pool.records,
                "rejected": len(pool.rejected),
                "problems": len(pool.table),
                "attempts": sum(counts),
                "attempts_min": min(counts, default=0),
                "attempts_max": max(counts, default=0),
                # pass@1 is the mean per-problem success rate.
                "success_rate": points[0]["pass"] if points else 0.0,
                "solved": len(pool.solved()),
                "solved_common": len(pool.solved() & common),
                "solved_only_here": len((pool.solved() & common) - others),
                "curve": points,
            }
        )
    union = set().union(*(p.solved() for p in pools)) & common if pools else set()
    problems: dict[str, dict[str, Any]] = {}
    for task in sorted(set().union(*(set(p.table) for p in pools))):
        row: dict[str, Any] = {}
        for pool in pools:
            if task in pool.table:
                n, c = pool.attempts(task), pool.resolved(task)
                row[pool.name] = {"attempts": n, "resolved": c, "rate": c / n}
        problems[task] = row
    return {
        "pools": summaries,
        "common_problems": len(common),
        "solved_by_any_common": len(union),
        "pairs": [pair(a, b) for i, a in enumerate(pools) for b in pools[i + 1 :]],
        "problems": problems,
    }


def markdown(result: dict[str, Any]) -> str:
    pools = result["pools"]
    lines = [
        f"# pass@k and complementarity ({len(pools)} pools, {result['common_problems']} problems in common)",
        "",
        "| pool | problems | attempts (min–max per problem) | success rate | pass@k (K) | solved | solved only here (common) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pools:
        last = p["curve"][-1] if p["curve"] else {"k": 0, "pass": 0.0}
        lines.append(
            f"| {p['name']} | {p['problems']} | {p['attempts']} ({p['attempts_min']}–{p['attempts_max']}) | {p['success_rate']:.1%} "
            f"| {last['pass']:.1%} ({last['k']}) | {p['solved']} | {p['solved_only_here']} |"
        )
    lines += ["", f"Solved by at least one pool, of the {result['common_problems']} common problems: {result['solved_by_any_common']}.", ""]
    if result["pairs"]:
        lines += ["| A | B | common problems | both | only A | only B | neither |", "|---|---|---|---|---|---|---|"]
        for q in result["pairs"]:
            lines.append(f"| {q['a']} | {q['b']} | {q['problems']} | {q['both']} | {q['only_a']} | {q['only_b']} | {q['neither']} |")
        lines.append("")
    names = [p["name"] for p in pools]
    lines += ["## pass@k", "", "| k | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in range(1, max((len(p["curve"]) for p in pools), default=0) + 1):
        cells = [f"{p['curve'][k - 1]['pass']:.1%} ({p['curve'][k - 1]['problems']})" if k <= len(p["curve"]) else "–" for p in pools]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", "## per problem (resolved / attempts)", "", "| problem | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for task, row in result["problems"].items():
        cells = [f"{row[n]['resolved']}/{row[n]['attempts']}" if n in row else "–" for n in names]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
