"""Which instances an evaluation runs: SWE-bench Verified (or any SWE-bench-format set)
from a local file, a Hugging Face dataset when online, or the bundled mini suite, then
selected by ids, repositories, difficulty and a slice."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from envs.tasks import Task, load_tasks
from records.pools import RecordError

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"


@dataclass(frozen=True)
class Selection:
    ids: tuple[str, ...] = ()
    repos: tuple[str, ...] = ()
    difficulties: tuple[str, ...] = ()
    slice: str | None = None  # "start:stop" over the selected instances, in dataset order

    def apply(self, tasks: list[Task]) -> list[Task]:
        chosen = [
            t
            for t in tasks
            if (not self.ids or t.instance_id in self.ids)
            and (not self.repos or t.repo in self.repos)
            and (not self.difficulties or t.difficulty in self.difficulties)
        ]
        if self.ids:
            missing = sorted(set(self.ids) - {t.instance_id for t in chosen})
            if missing:
                raise ValueError(f"not in the dataset: {', '.join(missing)}")
        if self.slice:
            start, _, stop = self.slice.partition(":")
            chosen = chosen[int(start) if start else None : int(stop) if stop else None]
        return chosen


def load_dataset_tasks(source: str, split: str = "test") -> tuple[list[Task], list[RecordError]]:
    """``mini``, a local file or folder, or a Hugging Face dataset name (needs network)."""
    if source == "mini":
        return load_tasks(MINI_SUITE)
    path = Path(source)
    if path.exists():
        return load_tasks(path)
    try:
        import datasets

        rows = datasets.load_dataset(source, split=split)
    except Exception as exc:  # no network, no such dataset: say which, and what works offline
        raise ValueError(
            f"cannot load {source!r}: not a local file and not loadable from the Hugging Face Hub ({type(exc).__name__}); pass a local .parquet/.jsonl"
        ) from None
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "rows.parquet"
        rows.to_parquet(str(local))
        return load_tasks(local)


def dataset_digest(tasks: list[Task]) -> str:
    """Names the exact instances (and their tests) a run used, for comparing runs."""
    basis = "\n".join(
        f"{t.instance_id}\t{t.base_commit}\t{sorted(t.FAIL_TO_PASS)}\t{sorted(t.PASS_TO_PASS)}"
        for t in sorted(tasks, key=lambda t: t.instance_id)
    )
    return hashlib.sha256(basis.encode()).hexdigest()[:16]
