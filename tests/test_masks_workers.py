"""``relearn masks --workers N``: shards compiled in worker processes, each a work unit
whose rows come back to the driver, which writes the files: the same bytes as compiling
them here, one after another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envs.executor import LocalBackend
from relearn.masks.compile import CompileOptions
from relearn.masks.shards import build_dataset, load_reviews
from tests.test_outputs_unchanged import masks_pool

pytestmark = pytest.mark.slow  # worker processes each load the tokenizer


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_worker_processes_write_the_same_shard_bytes(tok, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    pool, reviews_path = (p.relative_to(tmp_path) for p in masks_pool(tmp_path))
    errors: list[str] = []
    reviews = load_reviews(reviews_path, errors)
    assert not errors
    options = CompileOptions(mode="ross")
    here, _ = build_dataset(pool, reviews, tok, "qwen3.6", options, Path("here"), shard_size=2)
    seen: list[tuple[int, int]] = []
    backend = LocalBackend(2, processes=True)
    try:
        there, reused = build_dataset(
            pool, reviews, tok, "qwen3.6", options, Path("there"), shard_size=2, backend=backend, on_record=lambda s, t: seen.append((s, t))
        )
    finally:
        backend.close()
    assert reused == 0 and here == there
    assert len(files(Path("here"))) > 3 and files(Path("there")) == files(Path("here"))
    # Progress came back for every record, with the tokens each gave.
    assert len(seen) == here["trajectories_in"] and sum(t for _s, t in seen) == here["tokens"]["total"]
    assert sum(s for s, _t in seen) == os.path.getsize(pool)


def test_cli_masks_workers_matches_one_process(relearn_bin: str, tmp_path: Path, tokenizer_cache: Path) -> None:
    import subprocess

    pool, reviews = masks_pool(tmp_path)

    def masks(out: str, *extra: str) -> None:
        done = subprocess.run(
            [relearn_bin, "masks", str(pool), "-r", str(reviews), "-o", str(tmp_path / out), "--shard-size", "2", *extra],
            capture_output=True,
            text=True,
            env={**os.environ, "RELEARN_CACHE": str(tokenizer_cache)},
            timeout=600,
        )
        assert done.returncode == 0, done.stderr

    masks("one")
    masks("two", "--workers", "2")
    assert files(tmp_path / "two") == files(tmp_path / "one")


def test_units_are_read_from_the_pool_as_slots_free_up(tok, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """With a backend the driver holds the shards in flight, never the whole pool's lines: the
    first shard starts compiling while the rest of the pool is unread."""
    from relearn.masks import shards

    pool, reviews_path = masks_pool(tmp_path)
    reviews = load_reviews(reviews_path, [])
    read = [0]
    pool_items = shards._pool_items

    def counted(path: Path):  # noqa: ANN202
        for item in pool_items(path):
            read[0] += 1
            yield item

    read_at_start: list[int] = []
    compile_shard = shards.ShardJob.__call__

    def job(self: shards.ShardJob, unit: shards.ShardUnit) -> shards.CompiledShard:
        read_at_start.append(read[0])
        return compile_shard(self, unit)

    monkeypatch.setattr(shards, "_pool_items", counted)
    monkeypatch.setattr(shards.ShardJob, "__call__", job)
    backend = LocalBackend(1)  # one thread: the monkeypatched job runs here
    try:
        there, _ = build_dataset(
            pool, reviews, tok, "qwen3.6", CompileOptions(mode="ross"), tmp_path / "there", shard_size=1, backend=backend
        )
    finally:
        backend.close()
    total = there["trajectories_in"]
    assert total >= 4 and read[0] == total and len(read_at_start) == total
    assert read_at_start[0] <= 2  # the first shard, and at most the next one read ahead
    here, _ = build_dataset(pool, reviews, tok, "qwen3.6", CompileOptions(mode="ross"), tmp_path / "here", shard_size=1)
    assert files(tmp_path / "there") == files(tmp_path / "here")
