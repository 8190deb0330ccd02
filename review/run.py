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

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.executor import NODE_RETRIES, Backend, LocalBackend, NodeLost, run_units
from harness.policies.base import PolicyError
from records.pools import JsonlWriter, RecordError, read_trajectories_lenient
from records.review import Review
from records.trajectory import Trajectory, is_verified_positive
from review.batch import BatchError, BatchOptions, BatchState, BatchSummary, batch_prefill
from review.heuristic import heuristic_review
from review.in_order import InOrder
from review.judges import JUDGE_ERROR, CallCache, Judge, Ledger, SpendCapReached, review_trajectory
from review.resume import reviewed_ids


@dataclass
class ReviewSummary:
    """What a review run did, as counts: the reviews themselves are in the output file, and a
    run over a pool of any size holds none of them."""

    reviewed: int = 0  # reviews written now that stand (judge_error ones are retried, not counted)
    decisions: Counter[str] = field(default_factory=Counter)  # "accept", or "reject: REASON"
    categories: Counter[str] = field(default_factory=Counter)  # the errors' categories
    defects: int = 0
    grounded: int = 0  # quoted spans that grounded in the trajectory
    rejected_spans: int = 0  # quoted spans that did not
    cost_usd: float = 0.0  # what the reviews written now cost
    skipped: int = 0  # already in the output
    not_reviewed: int = 0  # spend cap reached, or the judge could not be called
    errors: list[str] = field(default_factory=list)
    unreadable: list[RecordError] = field(default_factory=list)
    batch: BatchSummary | None = None  # with batch mode
    per_node: dict[str, int] = field(default_factory=dict)  # reviews by node

    def count(self, review: Review) -> None:
        """Count a review just written. A judge_error review is written too (the file says
        what happened), but it is no review: the trajectory counts as not reviewed, and a
        rerun retries it."""
        if (review.reason or "").startswith(JUDGE_ERROR):
            self.not_reviewed += 1
            self.errors.append(f"{review.trajectory_id}: {review.reason} (a rerun reviews it again)")
            return
        self.reviewed += 1
        self.decisions[review.decision if review.decision == "accept" else f"reject: {(review.reason or '').split(':')[0]}"] += 1
        self.categories.update(str(e.get("category")) for e in review.errors)
        self.defects += len(review.defects)
        grounding = (review.model_extra or {}).get("grounding", {})
        self.grounded += grounding.get("grounded", len(review.defects))
        self.rejected_spans += grounding.get("rejected", 0)
        self.cost_usd += review.cost_usd or 0.0


@dataclass
class NodeCache:
    """The call cache as a review unit on a cluster node sees it: the driver's answers as
    they stood, read-only, plus the ones this unit asked for (which it returns)."""

    known: dict[str, dict[str, Any]]
    new: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.new.get(key) or self.known.get(key)

    def put(self, key: str, entry: dict[str, Any], *, unattributed: bool = False) -> None:
        self.new[key] = {"key": key, **entry}

    def attribute(self, _key: str) -> bool:
        return False  # batch-paid answers never reach a node (--batch is refused with --ray)


@dataclass(frozen=True)
class NodeReview:
    """One review work unit's function on a cluster node: a trajectory in; its review, the
    judge answers it asked for and its spend out (the driver caps the spend: it admits a
    unit only while its ledger is under the cap)."""

    judges: tuple[Judge, Judge] | None
    include_suspicious: bool
    known: dict[str, dict[str, Any]]

    def __call__(self, trajectory: Trajectory) -> tuple[Review, dict[str, dict[str, Any]], dict[str, float]]:
        if self.judges is None:
            return heuristic_review(trajectory, include_suspicious=self.include_suspicious), {}, {}
        if not is_verified_positive(trajectory, allow_suspicious=self.include_suspicious):
            reason = "suspicious verdict" if is_verified_positive(trajectory, allow_suspicious=True) else "not verified positive"
            return Review(trajectory_id=trajectory.id, decision="reject", reason=reason, cost_usd=0.0), {}, {}
        cache, ledger = NodeCache(self.known), Ledger()
        review = review_trajectory(trajectory, self.judges[0], self.judges[1], cache, ledger)  # type: ignore[arg-type]
        return review, cache.new, ledger.counters()


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
    backend: Backend | None = None,
) -> tuple[ReviewSummary, Ledger]:
    """Review every trajectory of ``pool`` not yet in ``output``; ``judges=None`` uses
    the heuristic reviewer. Successes the verifier found suspicious are rejected unreviewed
    unless ``include_suspicious``. With ``batch``, the judges' requests go through the batch
    APIs first (review.batch); the review then reads their answers from the call cache.

    ``backend``: where the reviews run (default: ``workers`` threads here). On a cluster
    each trajectory's review is a unit that sees the call cache as it stood and returns
    its review, its new judge answers and its spend; only this process writes the reviews
    and the cache, and it admits a unit only while the one ledger is under the cap."""
    remote = backend is not None and not isinstance(backend, LocalBackend)
    if remote and batch is not None:
        raise ValueError("--batch and --ray do not go together: the batches are one account, submit them from one machine")
    summary = ReviewSummary()
    ledger = Ledger(cap_usd=spend_cap_usd)
    done = reviewed_ids(output)

    def todo(counted: bool) -> Iterator[Trajectory]:
        """The pool's trajectories still to review, read as they are needed (never the whole
        pool in memory); the pass that reviews them counts what it skips and cannot read."""
        unreadable: list[RecordError] = summary.unreadable if counted else []
        for trajectory in read_trajectories_lenient(pool, unreadable):
            if trajectory.id not in done:
                yield trajectory
            elif counted:
                summary.skipped += 1

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
            # A batch holds every request it sends, so this mode holds the judged trajectories.
            judged = [t for t in todo(counted=False) if is_verified_positive(t, allow_suspicious=include_suspicious)]
            try:
                summary.batch = batch_prefill(judged, judges, cache, ledger, BatchState(batch_state_path(output)), batch)
            except (BatchError, SpendCapReached) as exc:
                # Nothing is reviewed: what the batches answered stays in the cache, and a
                # rerun polls the batches still recorded as open.
                summary.errors.append(str(exc))
                summary.not_reviewed += sum(1 for _ in todo(counted=True))
                return summary, ledger
        runner = backend or LocalBackend(workers)
        work: Callable[[Trajectory], Review] | NodeReview = one
        if remote:
            fresh = (dataclasses.replace(judges[0]), dataclasses.replace(judges[1])) if judges else None  # without their clients
            work = NodeReview(fresh, include_suspicious, dict(cache.entries) if cache else {})
        order: InOrder[Trajectory] = InOrder()
        try:
            with JsonlWriter(output, fsync=True) as writer:
                stop = False

                def write(review: Review) -> Callable[[], None]:
                    def now() -> None:
                        writer.write(review.model_dump(mode="json"))
                        summary.count(review)
                        if on_done:
                            on_done(review, ledger)

                    return now

                def finished(trajectory: Trajectory, answer: Review | tuple[Review, dict[str, dict[str, Any]], dict[str, float]]) -> None:
                    if isinstance(answer, tuple):  # from a node: its judge answers and spend join ours at once
                        review, answers, spend = answer
                        for key, entry in answers.items():
                            if cache is not None and key not in cache.entries:
                                cache.put(key, {k: v for k, v in entry.items() if k != "key"})
                        ledger.add(spend)
                    else:
                        review = answer
                    # The review waits for the ones before it in the pool: the file is in the
                    # pool's order whatever the judges' latencies (its answers are cached already).
                    order.done(trajectory, write(review))

                def failed(trajectory: Trajectory, exc: BaseException, tries: int) -> bool:
                    nonlocal stop
                    if isinstance(exc, NodeLost) and tries <= NODE_RETRIES:
                        return True  # the node running it died: review it elsewhere
                    if isinstance(exc, PolicyError):  # the judge endpoint failed after retries
                        failure = Review(
                            trajectory_id=trajectory.id, decision="reject", reason=f"{JUDGE_ERROR}: judge call failed: {exc}", cost_usd=0.0
                        )
                        order.done(trajectory, write(failure))
                        return False
                    if not isinstance(exc, SpendCapReached):
                        raise exc
                    summary.not_reviewed += 1
                    summary.errors.append(f"{trajectory.id}: {exc}")
                    stop = True
                    order.done(trajectory)
                    if on_done:
                        on_done(None, ledger)
                    return False

                def admit(_trajectory: Trajectory) -> bool:
                    nonlocal stop
                    if remote and not stop and ledger.cap_usd is not None and ledger.spent_usd >= ledger.cap_usd:
                        summary.errors.append(f"spend cap ${ledger.cap_usd:.2f} reached (${ledger.spent_usd:.4f} spent)")
                        stop = True
                    return not stop

                def hold() -> bool:
                    # At most about the work in flight waits behind a slow review, never the pool.
                    return order.full(runner.slots())

                units = order.numbered(todo(counted=True))
                left = run_units(runner, units, work, on_result=finished, on_error=failed, admit=admit, hold=hold)
                order.drain()
                summary.not_reviewed += len(left.not_started)
                summary.per_node = left.per_node
        finally:
            if backend is None:
                runner.close()
    finally:
        if cache is not None:
            cache.close()
    return summary, ledger
