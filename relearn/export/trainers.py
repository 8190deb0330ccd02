"""A compiled dataset in each trainer's own pre-tokenized format.

Every format keeps the shard's token ids and supervises exactly the tokens its ``loss_mask``
marks (aligned with ``input_ids``, token 0 never a target), as each trainer's source defines
it (versions read: ``TRAINERS``):

- ``trl``: Parquet ``input_ids`` + ``assistant_masks``; SFTTrainer builds ``labels`` from
  ``assistant_masks``, which it always applies.
- ``axolotl``: Parquet ``input_ids``, ``attention_mask``, ``labels`` (-100 where not
  supervised), its "tokenized" dataset (no ``type``).
- ``llamafactory``: the same three columns as a ``save_to_disk`` folder, its ``tokenized_path``.
- ``verl``: Parquet ``input_ids`` + ``loss_mask`` and ``relearn_verl_dataset.py``, a
  ``data.custom_cls`` for verl's SFT trainers (its own datasets read text, not ids).
- ``hf``: ``datasets`` with ``sample_id``, ``trajectory_id``, ``input_ids``, ``loss_mask``,
  ``labels`` and ``weight`` (``1 /`` the supervised tokens of the row's whole trajectory over
  all its rows: the paper's per-trajectory loss for a trainer that takes token weights), as
  Parquet (``parquet/``) and ``save_to_disk`` (``dataset/``).

Rows stream from the shards to files of ``rows_per_file`` rows; ``rows.jsonl`` names the
sample and trajectory of each row, and ``relearn-export.json`` records the tokenizer, the
chat template's hash, the loss each trainer computes and how far that is from relearn's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from records.pools import write_text_atomic
from relearn.export.source import DatasetInfo, ExportError, iter_samples
from relearn.masks.rows import ShardRow

FORMATS = ("trl", "axolotl", "verl", "llamafactory", "hf")
IGNORE_INDEX = -100
# What each format follows, as read in the trainer's source (docs/export.md, "Train with your own trainer").
TRAINERS = {
    "trl": "TRL 1.16.0 (trl/trainer/sft_trainer.py)",
    "axolotl": "axolotl 0.18.0 at 067b021c (docs/dataset-formats/tokenized.qmd)",
    "verl": "verl 0.8.0.dev at b178a3cd (verl/trainer/fsdp_sft_trainer.py, sft_trainer.py; data.custom_cls)",
    "llamafactory": "LLaMA-Factory 0.9.6.dev0 at ff6d4d12 (data/loader.py tokenized_path)",
    "hf": "datasets (load_dataset('parquet') / load_from_disk)",
}
TOKEN_MEAN = "sum of token NLL over the step's supervised tokens / their number (per token)"
LOSS = {
    "trl": TOKEN_MEAN + ", across gradient accumulation and devices (num_items_in_batch)",
    "axolotl": TOKEN_MEAN + ", across gradient accumulation, per device",
    "verl": "per micro-batch token mean, averaged over micro-batches (fsdp trainer); token mean of the global batch (engine trainer)",
    "llamafactory": TOKEN_MEAN + ", across gradient accumulation and devices (num_items_in_batch)",
    "hf": "yours: `weight` = 1 / the trajectory's supervised tokens (all its rows) gives relearn's per-trajectory loss as a weighted token sum",
}
VERL_DATASET = Path(__file__).with_name("verl_dataset.py")


@dataclass
class ExportSummary:
    out: Path
    rows: int = 0
    tokens: int = 0
    supervised: int = 0
    skipped_unsupervised: int = 0  # rows with no target: every trainer drops or chokes on them
    files: list[str] = field(default_factory=list)
    supervised_per_row: list[int] = field(default_factory=list)


def labels(sample: ShardRow) -> np.ndarray:
    out = np.where(sample.loss_mask == 1, sample.input_ids.astype(np.int64), IGNORE_INDEX)
    out[0] = IGNORE_INDEX
    return out


def trajectory_supervised(info: DatasetInfo) -> dict[str, int]:
    """Each trajectory's supervised targets over all its samples (a context reset or
    ``--per-turn`` gives several): the unit the paper's loss normalises by, as the trainer's."""
    whole: dict[str, int] = {}
    for sample in iter_samples(info):
        whole[sample.trajectory_id] = whole.get(sample.trajectory_id, 0) + sample.supervised
    return whole


def _columns(fmt: str, sample: ShardRow, whole: dict[str, int]) -> dict[str, Any]:
    mask = sample.loss_mask.copy()
    mask[0] = 0
    if fmt == "trl":
        return {"input_ids": sample.input_ids, "assistant_masks": mask.astype(np.int8)}
    if fmt in ("axolotl", "llamafactory"):
        return {"input_ids": sample.input_ids, "attention_mask": np.ones(len(mask), dtype=np.int8), "labels": labels(sample)}
    if fmt == "verl":
        return {"input_ids": sample.input_ids, "loss_mask": mask.astype(np.int8)}
    return {
        "sample_id": sample.sample_id,
        "trajectory_id": sample.trajectory_id,
        "input_ids": sample.input_ids,
        "loss_mask": mask.astype(np.int8),
        "labels": labels(sample),
        "weight": 1.0 / whole[sample.trajectory_id],
    }


def _schema(fmt: str) -> pa.Schema:
    ids, int8 = pa.list_(pa.int32()), pa.list_(pa.int8())
    if fmt == "trl":
        return pa.schema([("input_ids", ids), ("assistant_masks", int8)])
    if fmt in ("axolotl", "llamafactory"):
        return pa.schema([("input_ids", ids), ("attention_mask", int8), ("labels", pa.list_(pa.int64()))])
    if fmt == "verl":
        return pa.schema([("input_ids", ids), ("loss_mask", int8)])
    return pa.schema(
        [
            ("sample_id", pa.string()),
            ("trajectory_id", pa.string()),
            ("input_ids", ids),
            ("loss_mask", int8),
            ("labels", pa.list_(pa.int64())),
            ("weight", pa.float64()),
        ]
    )


def _kept(info: DatasetInfo, summary: ExportSummary, ids_file: Any, on_row: Callable[[], None] | None) -> Iterator[ShardRow]:
    for sample in iter_samples(info):
        if on_row:
            on_row()
        if sample.supervised == 0:
            summary.skipped_unsupervised += 1
            continue
        summary.rows += 1
        summary.tokens += len(sample.input_ids)
        summary.supervised += sample.supervised
        summary.supervised_per_row.append(sample.supervised)
        ids_file.write(
            json.dumps(
                {
                    "row": summary.rows - 1,
                    "sample_id": sample.sample_id,
                    "trajectory_id": sample.trajectory_id,
                    "tokens": len(sample.input_ids),
                    "supervised": sample.supervised,
                }
            )
            + "\n"
        )
        yield sample


def _write_parquet(
    samples: Iterator[ShardRow],
    fmt: str,
    folder: Path,
    rows_per_file: int,
    summary: ExportSummary,
    prefix: str = "",
    whole: dict[str, int] | None = None,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    schema = _schema(fmt)
    writer: pq.ParquetWriter | None = None
    batch: list[dict[str, Any]] = []
    in_file = 0

    def flush() -> None:
        if batch and writer is not None:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            batch.clear()

    for sample in samples:
        if writer is None or in_file == rows_per_file:
            flush()
            if writer is not None:
                writer.close()
            name = f"train-{len([f for f in summary.files if f.startswith(prefix)]):05d}.parquet"
            writer = pq.ParquetWriter(folder / name, schema)
            summary.files.append(f"{prefix}{name}")
            in_file = 0
        batch.append({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in _columns(fmt, sample, whole or {}).items()})
        in_file += 1
        if len(batch) >= 64:
            flush()
    flush()
    if writer is not None:
        writer.close()


def _saved_from_parquet(files: list[Path], fmt: str, folder: Path, scratch: Path) -> None:
    """A ``datasets`` ``save_to_disk`` folder of the Parquet files just written (Arrow, on disk:
    streamed, never all in memory)."""
    import datasets

    if not files:  # nothing supervised: an empty dataset of the same columns
        datasets.Dataset.from_list([], features=datasets.Features.from_arrow_schema(_schema(fmt))).save_to_disk(str(folder))
        return
    datasets.Dataset.from_parquet([str(f) for f in files], cache_dir=str(scratch)).save_to_disk(str(folder), max_shard_size="500MB")


def export_dataset(
    info: DatasetInfo,
    fmt: str,
    out: Path,
    *,
    rows_per_file: int,
    overwrite: bool,
    on_row: Callable[[], None] | None = None,
) -> ExportSummary:
    """Write ``info``'s samples to ``out`` in ``fmt``; ``out`` appears whole or not at all."""
    if fmt not in FORMATS:
        raise ExportError(f"--for must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; pass --overwrite to replace it")
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    summary = ExportSummary(out)
    with open(staging / "rows.jsonl", "w", encoding="utf-8") as ids_file:
        samples = _kept(info, summary, ids_file, on_row)
        if fmt == "llamafactory":
            _write_parquet(samples, fmt, staging / ".parquet", rows_per_file, summary)
            _saved_from_parquet(sorted((staging / ".parquet").glob("*.parquet")), fmt, staging / "tokenized", staging / ".cache")
            shutil.rmtree(staging / ".parquet")
            summary.files = ["tokenized/"]
        elif fmt == "hf":
            whole = trajectory_supervised(info)  # a first pass: a trajectory's samples may lie anywhere
            _write_parquet(samples, fmt, staging / "parquet", rows_per_file, summary, prefix="parquet/", whole=whole)
            _saved_from_parquet(sorted((staging / "parquet").glob("*.parquet")), fmt, staging / "dataset", staging / ".cache")
            summary.files.append("dataset/")
        else:
            _write_parquet(samples, fmt, staging, rows_per_file, summary)
    if fmt == "verl":
        shutil.copyfile(VERL_DATASET, staging / "relearn_verl_dataset.py")
        summary.files.append("relearn_verl_dataset.py")
    shutil.rmtree(staging / ".cache", ignore_errors=True)
    write_text_atomic(staging / "relearn-export.json", json.dumps(manifest(info, fmt, summary), indent=1))
    if out.exists():
        shutil.rmtree(out)
    staging.replace(out)
    return summary


def manifest(info: DatasetInfo, fmt: str, summary: ExportSummary) -> dict[str, Any]:
    counts = summary.supervised_per_row
    spread = max(counts) / min(counts) if counts else 1.0
    return {
        "format": fmt,
        "follows": TRAINERS[fmt],
        "source": str(info.path),
        "mode": info.stats.get("mode"),
        "defect_scope": info.stats.get("defect_scope"),
        "tokenizer": info.tokenizer,
        "tokenizer_fingerprint": info.stats["tokenizer_fingerprint"],
        "chat_template_sha256": info.stats.get("chat_template_sha256"),
        "template_kwargs": info.stats.get("template_kwargs"),
        "rows": summary.rows,
        "tokens": summary.tokens,
        "supervised_tokens": summary.supervised,
        "skipped_unsupervised": summary.skipped_unsupervised,
        "files": summary.files,
        "loss": {
            "this_trainer": LOSS[fmt],
            "relearn": "per trajectory: each trajectory's token NLL mean, averaged over the step's trajectories (relearn train --loss-norm trajectory, the paper's loss)",
            "same_when": "one trajectory per optimizer step (batch 1, no gradient accumulation), or relearn train --loss-norm token",
            "per_token_weight_spread": round(spread, 3),
            "per_token_weight_spread_means": "under per-token normalisation the row with the most supervised tokens weighs this many times the row with the fewest; per trajectory they weigh the same",
        },
    }
