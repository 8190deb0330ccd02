"""Contrast integrity: the three datasets must differ only in what each contrast is about.

ROSS and ROSS w/o mask are compiled from the same pool and the same reviews, so they must
hold the same trajectories: then ROSS w/o mask vs ROSS isolates the mask, and Positive-Rollout
SFT vs ROSS w/o mask isolates the review's filtering. A trajectory in one and not the other
(say, a defect that fails VALIDATE rejects it under ``ross`` only) would confound the two, so
the pipeline refuses to train until the sets agree, naming the trajectories. The sets are
read from the shards (``trajectory_id``), which is what the trainer reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHOWN = 10  # ids named in an error; the file lists them all


class ContrastError(RuntimeError):
    """ROSS and ROSS w/o mask hold different trajectories."""


def dataset_trajectories(folder: Path) -> set[str]:
    """The trajectory ids of a dataset folder's shards."""
    from relearn.masks.rows import read_trajectory_ids

    shards = sorted(folder.glob("shard-*.parquet"))
    if not shards and not (folder / "stats.json").is_file():
        raise FileNotFoundError(f"{folder}: no dataset here (no shard-*.parquet, no stats.json)")
    return read_trajectory_ids(shards)


def _rejections(folder: Path) -> dict[str, str]:
    """Why the dataset left trajectories out, by id (the first ones its stats.json lists)."""
    try:
        stats = json.loads((folder / "stats.json").read_text())
    except (OSError, ValueError):
        return {}
    return {
        r["trajectory_id"]: f"{r.get('reason', '')}: {r.get('detail', '')}".rstrip(": ")
        for r in stats.get("rejections", [])
        if r.get("trajectory_id")
    }


@dataclass
class Contrasts:
    sets: dict[str, set[str]]  # variant -> its trajectory ids

    def only(self, a: str, b: str) -> list[str]:
        return sorted(self.sets[a] - self.sets[b])

    def relation(self) -> str:
        """The sets' relation in one line, e.g. ``ross = ross-nomask ⊆ positive (positive holds 2 more)``."""
        sets = self.sets
        ross = [v for v in ("ross", "ross-nomask") if v in sets]
        if len(ross) == 2 and sets["ross"] != sets["ross-nomask"]:
            head = f"ross ≠ ross-nomask ({len(self.only('ross', 'ross-nomask'))} only in ross, {len(self.only('ross-nomask', 'ross'))} only in ross-nomask)"
        else:
            head = " = ".join(ross)
        if "positive" not in sets or not ross:
            return head or "one variant: nothing to compare"
        outside = {v: self.only(v, "positive") for v in ross}
        if any(outside.values()):
            return f"{head}; " + "; ".join(f"{v} ⊄ positive ({len(ids)} of {v} not in positive)" for v, ids in outside.items() if ids)
        more = sorted({len(self.only("positive", v)) for v in ross})
        return f"{head} ⊆ positive (positive holds {' / '.join(map(str, more))} more)"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"trajectories": {v: len(ids) for v, ids in self.sets.items()}, "relation": self.relation()}
        for a in self.sets:
            for b in self.sets:
                if a != b:
                    data.setdefault("only", {})[f"{a} not {b}"] = self.only(a, b)
        data["ids"] = {v: sorted(ids) for v, ids in self.sets.items()}
        return data


def read_contrasts(datasets: dict[str, Path]) -> Contrasts:
    return Contrasts({v: dataset_trajectories(folder) for v, folder in datasets.items()})


def contrast_problem(contrasts: Contrasts, datasets: dict[str, Path]) -> str | None:
    """Why training must not start (ROSS and ROSS w/o mask disagree, with the ids and, where
    the other dataset's stats.json says, why it left each out), or None."""
    sets = contrasts.sets
    if "ross" not in sets or "ross-nomask" not in sets or sets["ross"] == sets["ross-nomask"]:
        return None
    described = []
    for a, b in (("ross", "ross-nomask"), ("ross-nomask", "ross")):
        ids = contrasts.only(a, b)
        why = _rejections(datasets[b])
        named = ", ".join(f"{i} ({b}: {why[i]})" if i in why else i for i in ids[:SHOWN])
        more = f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else ""
        described.append(f"{len(ids)} only in {a}" + (f": {named}{more}" if ids else ""))
    return (
        f"ross ({len(sets['ross'])} trajectories) and ross-nomask ({len(sets['ross-nomask'])}) were compiled from the same "
        f"pool and reviews but hold different trajectories: {'; '.join(described)}. Training on them would mix the mask's effect with "
        "the filtering's, so nothing is trained; each dataset's stats.json says why it rejected what it rejected."
    )
