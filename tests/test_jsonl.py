from __future__ import annotations

import errno
import json
import logging
from pathlib import Path
from typing import Any

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


def test_a_torn_last_line_is_set_aside_on_append_and_the_pool_validates(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "pool.jsonl"
    write_atomic(path, _make(2))
    whole = path.read_bytes()
    with open(path, "ab") as handle:
        handle.write(b'{"schema_version": "1.0", "id": "cut')  # killed mid-line
    assert len(pool_index(path)) == 2  # the torn line is not an id, and not fatal
    with caplog.at_level(logging.WARNING, logger="records.pools"), JsonlWriter(path) as writer:
        writer.write(_make(3)[2])
    errors: list[RecordError] = []
    assert len(list(read_trajectories_lenient(path, errors))) == 3 and errors == []
    assert path.read_bytes().startswith(whole)
    assert (tmp_path / "pool.jsonl.torn").read_bytes() == b'{"schema_version": "1.0", "id": "cut\n'  # kept, not dropped
    assert "pool.jsonl: its last line was cut off (36 bytes" in caplog.text and "pool.jsonl.torn" in caplog.text


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    items = _make(3)
    path.write_bytes(b"".join(t.model_dump_json().encode() + b"\n" for t in items[:2]).rstrip(b"\n"))  # another tool's file
    with JsonlWriter(path) as writer:
        writer.write(items[2])
    assert [t.id for t in read_trajectories(path)] == [t.id for t in items]
    assert not (tmp_path / "pool.jsonl.torn").exists()


def test_a_write_the_disk_refuses_is_undone_and_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pool.jsonl"
    items = _make(3)
    writer = JsonlWriter(path)
    writer.write(items[0])
    before = path.read_bytes()
    real_write = writer._raw.write

    def half_then_full(data: memoryview) -> int:  # the OS takes 10 bytes, then the disk is full
        if len(data) > 10:
            return real_write(data[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "_raw", _RawStandIn(writer._raw, half_then_full))
    with pytest.raises(OSError) as raised:
        writer.write(items[1])
    assert raised.value.filename == str(path) and raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == before  # no torn record left behind
    writer.close()


class _RawStandIn:
    """The writer's file with its ``write`` replaced (a file object's methods are read-only)."""

    def __init__(self, raw: Any, write: Any) -> None:
        self._inner, self.write = raw, write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


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


def test_a_line_that_is_not_utf8_is_its_own_error_and_the_pool_reads_on(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    lines = [t.model_dump_json().encode() for t in _make(6)]
    lines[2] = lines[2].replace("日本".encode(), b"\xe6\x97")  # a Latin-1 editor's save, one line
    path.write_bytes(b"\n".join(lines) + b"\n")
    errors: list[RecordError] = []
    back = list(read_trajectories_lenient(path, errors))
    assert len(back) == 5 and [t.task_id for t in back] == ["task-0", "task-1", "task-3", "task-4", "task-5"]
    (error,) = errors
    assert (error.path, error.line) == (str(path), 3) and error.message.startswith("not UTF-8 text (") and "at column" in error.message
