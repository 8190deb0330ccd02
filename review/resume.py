"""What a rerun of a review skips: the trajectories whose latest review in the output file
stands. A ``judge_error`` review does not stand, so its trajectory is reviewed again.
``relearn review`` (``review.run``), the keep review (``review.keep``) and the cost estimate
(``review.estimate``) all resume from it."""

from __future__ import annotations

from pathlib import Path

from records.review import latest_reviews
from review.judges import JUDGE_ERROR


def reviewed_ids(path: Path) -> set[str]:
    """Trajectories whose latest review stands (a ``judge_error`` review is retried)."""
    if not path.exists():
        return set()
    stands, _unreadable = latest_reviews(path, lambda review: not (review.reason or "").startswith(JUDGE_ERROR))
    return {trajectory_id for trajectory_id, standing in stands.items() if standing}
