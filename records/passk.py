"""Unbiased pass@k (Chen et al., 2021) and the per-task table built on it.

Its own module, light to import, because the command line, ``relearn stats`` and
``relearn analyze passk`` need it without the agent loop and the model SDKs.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import comb

from records.trajectory import Trajectory, is_verified_positive


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c successes."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts, have {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def task_table(attempts: dict[str, list[bool]], ks: Iterable[int]) -> dict[str, dict[str, float | int]]:
    """Per task (sorted): attempts, successes and pass@k for each k ≤ its attempts."""
    table: dict[str, dict[str, float | int]] = {}
    for task_id, results in sorted(attempts.items()):
        row: dict[str, float | int] = {"attempts": len(results), "resolved": sum(results)}
        for k in ks:
            if k <= len(results):
                row[f"pass@{k}"] = pass_at_k(len(results), sum(results), k)
        table[task_id] = row
    return table


def pass_at_k_table(trajectories: Iterable[Trajectory], ks: tuple[int, ...] = (1,)) -> dict[str, dict[str, float | int]]:
    """``task_table`` of a pool; success is the verifier's (``is_verified_positive``)."""
    attempts: dict[str, list[bool]] = {}
    for trajectory in trajectories:
        attempts.setdefault(trajectory.task_id or "?", []).append(is_verified_positive(trajectory))
    return task_table(attempts, ks)
