"""Reading a compiled dataset for export: its samples streamed shard by shard, and what its
token ids mean (the tokenizer and chat template recorded in its ``stats.json``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

COLUMNS = ["sample_id", "trajectory_id", "input_ids", "loss_mask"]
BATCH_ROWS = 64  # rows read at once: memory stays bounded by a few samples, whatever the dataset


class ExportError(ValueError):
    """The dataset cannot be exported as asked (exit code 2): nothing was written."""


@dataclass(frozen=True)
class Sample:
    sample_id: str
    trajectory_id: str
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8: 1 where token t is a target (predicted from t - 1)

    @property
    def supervised(self) -> int:
        return int(self.loss_mask[1:].sum())  # token 0 is never predicted


@dataclass(frozen=True)
class DatasetInfo:
    path: Path
    stats: dict[str, Any]
    shards: list[Path]

    @property
    def tokenizer(self) -> str:
        return str(self.stats.get("tokenizer", ""))


def open_dataset(path: Path) -> DatasetInfo:
    stats_path = path / "stats.json"
    if not stats_path.is_file():
        raise ExportError(f"{path}: no stats.json (not a folder `relearn masks` wrote)")
    try:
        stats = json.loads(stats_path.read_text())
    except ValueError as exc:
        raise ExportError(f"{stats_path}: not JSON ({exc})") from None
    if "tokenizer_fingerprint" not in stats:
        raise ExportError(
            f"{stats_path}: records no tokenizer fingerprint (compiled by an older relearn); rerun `relearn masks` on it, which reuses its shards"
        )
    shards = sorted(path.glob("shard-*.parquet"))
    if not shards:
        raise ExportError(f"{path}: no shard-*.parquet")
    return DatasetInfo(path, stats, shards)


def iter_samples(info: DatasetInfo) -> Iterator[Sample]:
    """Every sample in shard order, a batch of rows at a time."""
    for shard in info.shards:
        for batch in pq.ParquetFile(shard).iter_batches(batch_size=BATCH_ROWS, columns=COLUMNS):
            sample_ids = batch.column("sample_id").to_pylist()
            trajectory_ids = batch.column("trajectory_id").to_pylist()
            ids_column, mask_column = batch.column("input_ids"), batch.column("loss_mask")
            for row in range(batch.num_rows):
                ids = ids_column[row].values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
                mask = mask_column[row].values.to_numpy(zero_copy_only=False).astype(np.uint8, copy=False)
                if ids.shape != mask.shape:
                    raise ExportError(f"{shard.name} ({sample_ids[row]}): input_ids has {len(ids)} tokens but loss_mask {len(mask)}")
                yield Sample(str(sample_ids[row]), str(trajectory_ids[row]), ids, mask)


def check_tokenizer(info: DatasetInfo, tokenizer: Any, name: str) -> None:
    """Refuse a tokenizer whose ids or template differ from the dataset's: the ids would mean
    other text, and the trainer would silently learn from it."""
    from relearn.masks.shards import chat_template_sha256, tokenizer_fingerprint

    template = chat_template_sha256(tokenizer)
    if template != info.stats.get("chat_template_sha256"):
        raise ExportError(
            f"--tokenizer {name}: its chat template (sha256 {template[:12]}) is not the one {info.path} was compiled with ({str(info.stats.get('chat_template_sha256'))[:12]}, {info.tokenizer})"
        )
    if tokenizer_fingerprint(tokenizer) != info.stats["tokenizer_fingerprint"]:
        raise ExportError(
            f"--tokenizer {name}: its vocabulary or normaliser is not that of {info.tokenizer}, which {info.path} was compiled with; the token ids would mean other text"
        )
