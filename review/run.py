"""Reviewing a pool: judges (or the offline heuristic reviewer) over every trajectory,
Reviews appended to a JSONL file, resumable by trajectory id.

Only verifier-positive trajectories reach the judges; the others get a Review that
rejects them without a call. A trajectory the judges could not review (unusable answers
after retries, an endpoint that keeps failing) gets a ``judge_error`` Review and the run
goes on. A rerun skips every trajectory already reviewed, reviews the ``judge_error`` ones
again, and answers repeated judge requests from the call cache, so it costs nothing more
than those.
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
from review.batch import BatchError, BatchOptions, BatchState, BatchSummary, batch_prefill
from review.heuristic import heuristic_review
from review.judges import JUDGE_ERROR, CallCache, Judge, Ledger, SpendCapReached, review_trajectory


@dataclass
class ReviewSummary:
    reviewed: list[Review] = field(default_factory=list)
    skipped: int = 0  # already in the output
    not_reviewed: int = 0  # spend cap reached, or the judge could not be called
    errors: list[str] = field(default_factory=list)
    unreadable: list[RecordError] = field(default_factory=list)
    batch: BatchSummary | None = None  # with batch mode

    def decisions(self) -> Counter[str]:
        return Counter(r.decision if r.decision == "accept" else f"reject: {(r.reason or '').split(':')[0]}" for r in self.reviewed)


def reviewed_ids(path: Path) -> set[str]:
    """Trajectories whose latest review stands (a ``judge_error`` review is retried)."""
    latest: dict[str, Review] = {}
    for item in iter_reviews(path) if path.exists() else []:
        if isinstance(item, Review):
            latest[item.trajectory_id] = item
    return {i for i, review in latest.items() if not (review.reason or "").startswith(JUDGE_ERROR)}


def batch_state_path(output: Path) -> Path:
    return output.with_name(output.name + ".batches.json")


def review_pool(
    pool: Path,
    output: Path,
    *,
    judges: tuple[Judge, Judge] | None,
    workers: int = 4,
    spend_cap_usd: float | None = None,
    on_done: Callable[[Review | None, Ledger], None] | None = None,
    include_suspicious: bool = False,
    batch: BatchOptions | None = None,
) -> tuple[ReviewSummary, Ledger]:
    """Review every trajectory of ``pool`` not yet in ``output``; ``judges=None`` uses
    the heuristic reviewer. Successes the verifier found suspicious are rejected unreviewed
    unless ``include_suspicious``. With ``batch``, the judges' requests go through the batch
    APIs first (review.batch); the review then reads their answers from the call cache."""
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
            return heuristic_review(trajectory, include_suspicious=include_suspicious)
        if not is_verified_positive(trajectory, allow_suspicious=include_suspicious):
            reason = "suspicious verdict" if is_verified_positive(trajectory, allow_suspicious=True) else "not verified positive"
            return Review(trajectory_id=trajectory.id, decision="reject", reason=reason, cost_usd=0.0)
        assert cache is not None
        return review_trajectory(trajectory, judges[0], judges[1], cache, ledger)

    try:
        if batch is not None and judges is not None and cache is not None:
            judged = [t for t in todo if is_verified_positive(t, allow_suspicious=include_suspicious)]
            try:
                summary.batch = batch_prefill(judged, judges, cache, ledger, BatchState(batch_state_path(output)), batch)
            except (BatchError, SpendCapReached) as exc:
                # Nothing is reviewed: what the batches answered stays in the cache, and a
                # rerun polls the batches still recorded as open.
                summary.errors.append(str(exc))
                summary.not_reviewed += len(todo)
                return summary, ledger
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
                        review = Review(trajectory_id=trajectory.id, decision="reject", reason=f"{JUDGE_ERROR}: judge call failed: {exc}", cost_usd=0.0)
                    # A judge_error review is written too (the file says what happened), but it
                    # is no review: the trajectory counts as not reviewed, and a rerun retries it.
                    writer.write(review.model_dump(mode="json"))
                    if (review.reason or "").startswith(JUDGE_ERROR):
                        summary.not_reviewed += 1
                        summary.errors.append(f"{trajectory.id}: {review.reason} (a rerun reviews it again)")
                    else:
                        summary.reviewed.append(review)
                    if on_done:
                        on_done(review, ledger)
            summary.not_reviewed += len(todo)
    finally:
        if cache is not None:
            cache.close()
    return summary, ledger
