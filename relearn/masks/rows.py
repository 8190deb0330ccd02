"""One row of a dataset shard: its Parquet schema, the class that holds it, the one writer and
the one reader, and what "supervised" means.

Every reader of shards (the trainer, the exports, the pipeline's contrasts, the statistics)
goes through ``iter_rows``; ``relearn masks`` alone writes them, through ``ShardWriter``. The
one exception is ``relearn/export/verl_dataset.py``, which is copied beside exported data and
runs inside verl without relearn, so it reads its two columns itself.

Supervised: ``loss_mask[t] = 1`` means token ``t`` is a target, predicted from the tokens before
it. Token 0 has no context and is never predicted, so a row's supervised count is
``loss_mask[1:].sum()`` everywhere (``supervised_targets``): in the shard's ``supervised``
column, the masks statistics, the trainer's loss denominators and the exports.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("n_tokens", pa.int32()),
        ("eligible", pa.int32()),
        ("excluded", pa.int32()),
        ("supervised", pa.int32()),
        ("ter", pa.float64()),
        ("mode", pa.string()),
    ]
)
# What a reader cannot do without; the statistics columns default to 0 when a file lacks them.
REQUIRED_COLUMNS = ("sample_id", "trajectory_id", "input_ids", "loss_mask")
STATISTICS_COLUMNS = ("eligible", "excluded", "ter")
BATCH_ROWS = 64  # rows read at once: memory holds a few samples, whatever the shard's size


class ShardError(ValueError):
    """A shard cannot be read at all (not Parquet, or a required column is missing)."""


def supervised_targets(loss_mask: np.ndarray) -> int:
    """The number of supervised targets of a row: token 0 is never predicted."""
    return int(loss_mask[1:].sum())


@dataclass(frozen=True)
class ShardRow:
    """One training sequence as a shard holds it (a whole trajectory, or one turn per-turn).

    ``supervised`` is derived from ``loss_mask`` (``supervised_targets``), never given."""

    sample_id: str
    trajectory_id: str
    input_ids: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # uint8 [n]: 1 where token t is a target (predicted from t - 1)
    eligible: int = 0  # tokens in A
    excluded: int = 0  # tokens in A ∩ E
    ter: float = 0.0  # excluded / eligible
    supervised: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "supervised", supervised_targets(self.loss_mask))

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class RowProblem:
    """A row that cannot be used, located: the caller refuses it and goes on, or stops."""

    where: str  # "shard-00000.parquet row 3 (sample id)"
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class ShardWriter:
    """Writes one shard a batch at a time (one Parquet row group per ``write``), so memory holds
    a batch's rows, never the shard's; the shard appears under its name only once complete."""

    def __init__(self, path: Path, mode: str) -> None:
        self.path = path
        self.mode = mode
        self.tmp = path.with_name(f".{path.name}.tmp")
        self.writer = pq.ParquetWriter(self.tmp, SCHEMA, compression="zstd")

    def write(self, rows: list[ShardRow]) -> None:
        if not rows:
            return
        columns = {
            "sample_id": [r.sample_id for r in rows],
            "trajectory_id": [r.trajectory_id for r in rows],
            "input_ids": [r.input_ids for r in rows],
            "loss_mask": [r.loss_mask for r in rows],
            "n_tokens": [r.n_tokens for r in rows],
            "eligible": [r.eligible for r in rows],
            "excluded": [r.excluded for r in rows],
            "supervised": [r.supervised for r in rows],
            "ter": [r.ter for r in rows],
            "mode": [self.mode] * len(rows),
        }
        self.writer.write_table(pa.table(columns, schema=SCHEMA))

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.writer.close()
        if kind is None:
            self.tmp.replace(self.path)
        else:
            self.tmp.unlink(missing_ok=True)


def shard_files(path: Path) -> list[Path]:
    """A dataset folder's shards in order (``shard-*.parquet``, else any ``*.parquet``), or the one file."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ShardError(f"{path}: no such file or folder")
    files = sorted(path.glob("shard-*.parquet")) or sorted(path.glob("*.parquet"))
    if not files:
        raise ShardError(f"{path}: no Parquet shards (shard-*.parquet) in this folder")
    return files


def _numpy(values: pa.Array, dtype: type) -> np.ndarray:
    array = values.to_numpy(zero_copy_only=False)  # a view into the batch's buffer where it can be
    return array if array.dtype == dtype else array.astype(dtype)


def _open(file: Path, required: tuple[str, ...] = REQUIRED_COLUMNS) -> pq.ParquetFile:
    try:
        parquet = pq.ParquetFile(file)
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{file}: not a readable Parquet file ({exc})") from None
    names = parquet.schema_arrow.names
    missing = [c for c in required if c not in names]
    if missing:
        raise ShardError(f"{file}: missing column(s) {', '.join(missing)} (see relearn.masks.rows.SCHEMA)")
    return parquet


def iter_rows(files: Iterable[Path], *, batch_rows: int = BATCH_ROWS) -> Iterator[ShardRow | RowProblem]:
    """Every row of ``files`` in order, a batch of rows at a time; a row whose ids or mask are
    null or of different lengths comes as a ``RowProblem`` (raises ``ShardError`` for a file
    that cannot be read at all)."""
    for _where, item in iter_located_rows(files, batch_rows=batch_rows):
        yield item


def iter_located_rows(files: Iterable[Path], *, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[str, ShardRow | RowProblem]]:
    """``iter_rows`` with where each row is ("shard-00000.parquet row 3 (sample id)"), for
    readers that refuse rows for reasons of their own."""
    for file in files:
        parquet = _open(file)
        present = [c for c in STATISTICS_COLUMNS if c in parquet.schema_arrow.names]
        row = -1
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=[*REQUIRED_COLUMNS, *present]):
            sample_ids = batch.column("sample_id").to_pylist()
            trajectory_ids = batch.column("trajectory_id").to_pylist()
            ids_column, mask_column = batch.column("input_ids"), batch.column("loss_mask")
            stats = {c: batch.column(c).to_pylist() for c in present}
            for k in range(batch.num_rows):
                row += 1
                where = f"{file.name} row {row} ({sample_ids[k]})"
                if not ids_column[k].is_valid or not mask_column[k].is_valid:
                    yield where, RowProblem(where, "input_ids or loss_mask is null")
                    continue
                ids = _numpy(ids_column[k].values, np.int32)
                mask = _numpy(mask_column[k].values, np.uint8)
                if ids.shape != mask.shape:
                    yield where, RowProblem(where, f"input_ids has {ids.shape[0]} tokens but loss_mask {mask.shape[0]}")
                    continue
                yield where, ShardRow(
                    str(sample_ids[k]), str(trajectory_ids[k]), ids, mask,
                    **{c: values[k] or 0 for c, values in stats.items()},
                )  # fmt: skip


def read_trajectory_ids(files: Iterable[Path]) -> set[str]:
    """The trajectory ids of a dataset's rows (one column read, no token data)."""
    ids: set[str] = set()
    for file in files:
        parquet = _open(file, ("trajectory_id",))
        for batch in parquet.iter_batches(columns=["trajectory_id"]):
            ids.update(str(i) for i in batch.column("trajectory_id").to_pylist())
    return ids
