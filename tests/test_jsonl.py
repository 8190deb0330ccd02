from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.import_run import pool_index
from records.pools import (
    JsonlWriter,
    RecordError,
    iter_lines,
    read_trajectories,
    read_trajectories_lenient,
    write_atomic,
)
from records.trajectory import Trajectory


def _make(n: int) -> list[Trajectory]:
    return [
        Trajectory(
            task_id=f"task-{i}",
            messages=[{"role": "user", "content": f"do {i} ✓ 日本"}, {"role": "assistant", "content": "ok", "generated": True}],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_append_then_read_back(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"pool{suffix}"
    items = _make(5)
    with JsonlWriter(path) as writer:
        for t in items[:3]:
            writer.write(t)
    with JsonlWriter(path) as writer:  # a second session appends
        for t in items[3:]:
            writer.write(t)
    back = list(read_trajectories(path))
    assert [t.id for t in back] == [t.id for t in items]
    assert set(pool_index(path)) == {t.id for t in items}


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_round_trip_is_byte_identical(tmp_path: Path, suffix: str) -> None:
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    write_atomic(first, _make(4))
    write_atomic(second, read_trajectories(first))
    assert list(iter_lines(first)) == list(iter_lines(second))


def test_records_survive_a_crash_mid_write(tmp_path: Path) -> None:
    """Each record is flushed as written: a writer that dies leaves every finished record readable."""
    path = tmp_path / "pool.jsonl.zst"
    writer = JsonlWriter(path)
    for t in _make(3):
        writer.write(t)
    # No close(): simulate the process dying, then read with a fresh reader.
    assert len(list(read_trajectories(path))) == 3
    writer.close()


def test_partial_last_line_is_isolated_on_append(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    write_atomic(path, _make(2))
    with open(path, "ab") as handle:
        handle.write(b'{"schema_version": "1.0", "id": "cut')  # killed mid-line
    assert len(pool_index(path)) == 2  # the torn line is not an id, and not fatal
    with JsonlWriter(path) as writer:
        writer.write(_make(3)[2])
    errors: list[RecordError] = []
    back = list(read_trajectories_lenient(path, errors))
    assert len(back) == 3
    assert len(errors) == 1 and errors[0].line == 3


def test_atomic_rewrite_leaves_the_old_file_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    write_atomic(path, _make(2))
    before = path.read_bytes()

    def broken():
        yield _make(1)[0]
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomic(path, broken())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["pool.jsonl"]


def test_errors_name_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    good = _make(1)[0].to_dict()
    bad = dict(good, messages=[{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 3}}]}])
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n" + "{not json\n")
    errors: list[RecordError] = []
    back = list(read_trajectories_lenient(path, errors))
    assert len(back) == 1
    assert str(errors[0]).startswith(f"{path}:2: messages[0].tool_calls[0].function.name:")
    assert errors[1].line == 3 and "invalid JSON" in errors[1].message
    with pytest.raises(RecordError, match=":2: messages"):
        list(read_trajectories(path))


def test_binary_and_corrupt_zstd_are_located_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "pool.jsonl"
    garbage.write_bytes(b"\x00\xff\xfe\x89PNG\r\n\x1a\n" * 20)
    with pytest.raises(RecordError, match="not UTF-8|invalid JSON"):
        list(read_trajectories(garbage))
    corrupt = tmp_path / "pool.jsonl.zst"
    corrupt.write_bytes(b"not zstd at all")
    with pytest.raises(RecordError, match="zstd"):
        list(read_trajectories(corrupt))
