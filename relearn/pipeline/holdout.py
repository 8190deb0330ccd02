"""The held-out split: the trajectories of some tasks set apart from what every mask variant
trains on, so that the analyze stage has verified, reviewed trajectories no model saw."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from records.pools import iter_pool_records
from records.trajectory import Trajectory


def split_by_task(source: Path, heldout: set[str], train: Path, heldout_pool: Path) -> dict[str, Any]:
    """Set the held-out tasks' trajectories apart, record for record as verify wrote them (so
    the masks' per-record digests are those of the verified pool's bytes)."""
    train.parent.mkdir(parents=True, exist_ok=True)
    heldout_pool.parent.mkdir(parents=True, exist_ok=True)
    targets = {"train": train, "heldout": heldout_pool}
    temporary = {name: path.with_name(f".{path.name}.tmp") for name, path in targets.items()}
    counts: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    files = {name: open(path, "w", encoding="utf-8") for name, path in temporary.items()}  # noqa: SIM115 - closed below
    try:
        for _line, text, item in iter_pool_records(source):
            # An unreadable record goes with the training pool, where the masks reject and count it.
            task = item.task_id if isinstance(item, Trajectory) else None
            name = "heldout" if task in heldout else "train"
            if isinstance(item, Trajectory):
                tasks[task or ""] += 1
                counts[f"{name} readable"] += 1
            if text:
                files[name].write(text if text.endswith("\n") else text + "\n")
                counts[name] += 1
    finally:
        for f in files.values():
            f.close()
    missing = sorted(heldout - set(tasks))
    if missing or not counts["train readable"]:
        for path in temporary.values():
            path.unlink()
    if missing:
        raise ValueError(
            f"[masks].heldout_tasks: no trajectory of {', '.join(missing)} in {source} (its tasks: {', '.join(sorted(t for t in tasks if t)) or 'none'})"
        )
    if not counts["train readable"]:
        raise ValueError(f"[masks].heldout_tasks holds out every trajectory of {source}: nothing is left to train on")
    for name, path in temporary.items():
        path.replace(targets[name])
    return {"train": counts["train"], "heldout": counts["heldout"], "heldout_tasks": len(heldout)}
