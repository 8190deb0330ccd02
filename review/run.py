"""Reviewing a pool: judges (or the offline heuristic reviewer) over every trajectory,
Reviews appended to a JSONL file, resumable by trajectory id.

Only verifier-positive trajectories reach the judges; the others get a Review that
rejects them without a call. A rerun skips every trajectory already reviewed and
answers repeated judge requests from the call cache, so it costs nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from harness.policies.base import PolicyError
from records.pools import JsonlWriter, RecordError, read_trajectories_lenient
from records.review import Review, iter_reviews
from records.trajectory import Trajectory, is_verified_positive
from review.heuristic import heuristic_review
from review.judges import CallCache, Judge, Ledger, SpendCapReached, review_trajectory


@dataclass
class ReviewSummary:
    reviewed: list[Review] = field(default_factory=list)
    skipped: int = 0  # already in the output
    not_reviewed: int = 0  # spend cap reached, or the judge could not be called
    errors: list[str] = field(default_factory=list)
    unreadable: list[RecordError] = field(default_factory=list)

    def decisions(self) -> Counter[str]:
        return Counter(r.decision if r.decision == "accept" else f"reject: {(r.reason or '').split(':')[0]}" for r in self.reviewed)


def reviewed_ids(path: Path) -> set[str]:
    return {item.trajectory_id for item in iter_reviews(path) if isinstance(item, Review)} if path.exists() else set()


def review_pool(
    pool: Path,
    output: Path,
    *,
    judges: tuple[Judge, Judge] | None,
    workers: int = 4,
    spend_cap_usd: float | None = None,
    on_done: Callable[[Review | None, Ledger], None] | None = None,
) -> tuple[ReviewSummary, Ledger]:
    """Review every trajectory of ``pool`` not yet in ``output``; ``judges=None`` uses
    the heuristic reviewer."""
    summary = ReviewSummary()
    ledger = Ledger(cap_usd=spend_cap_usd)
    done = reviewed_ids(output)
    todo: list[Trajectory] = []
    for trajectory in read_trajectories_lenient(pool, summary.unreadable):
        if trajectory.id in done:
            summary.skipped += 1
        else:
            todo.append(trajectory)
    cache = CallCache(output.with_name(output.name + ".calls.jsonl")) if judges else None

    def one(trajectory: Trajectory) -> Review:
        if judges is None:
            return heuristic_review(trajectory)
        if not is_verified_positive(trajectory):
            return Review(trajectory_id=trajectory.id, decision="reject", reason="not verified positive", cost_usd=0.0)
        assert cache is not None
        return review_trajectory(trajectory, judges[0], judges[1], cache, ledger)

    try:
        with JsonlWriter(output, fsync=True) as writer, ThreadPoolExecutor(max_workers=max(1, workers)) as executor:
            running: dict[Future[Review], Trajectory] = {}
            stop = False
            while (todo and not stop) or running:
                while todo and not stop and len(running) < max(1, workers):
                    trajectory = todo.pop(0)
                    running[executor.submit(one, trajectory)] = trajectory
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    trajectory = running.pop(future)
                    try:
                        review = future.result()
                    except SpendCapReached as exc:
                        summary.not_reviewed += 1
                        summary.errors.append(f"{trajectory.id}: {exc}")
                        stop = True
                        if on_done:
                            on_done(None, ledger)
                        continue
                    except PolicyError as exc:  # the judge endpoint failed after retries
                        summary.not_reviewed += 1
                        summary.errors.append(f"{trajectory.id}: judge call failed: {exc}")
                        if on_done:
                            on_done(None, ledger)
                        continue
                    writer.write(review.model_dump(mode="json"))
                    summary.reviewed.append(review)
                    if on_done:
                        on_done(review, ledger)
            summary.not_reviewed += len(todo)
    finally:
        if cache is not None:
            cache.close()
    return summary, ledger
