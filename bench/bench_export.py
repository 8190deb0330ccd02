"""Export throughput and memory: `relearn export dataset` against reading the shards whole.

    python bench/bench_export.py [--rows 600] [--tokens 16384] [--format trl]

Dataset: one shard folder of ``--rows`` samples of ``--tokens`` random token ids each, with a
random loss mask (the shape `relearn masks` writes; what is in the ids does not matter to an
export). Ours: ``relearn.export.trainers.export_dataset``, which streams a batch of rows at a
time. Baseline, in its own process: ``pyarrow.parquet.read_table`` of the same shards and one
``write_table`` of the format's columns, the least an exporter that holds the table must do.
Each side runs in a fresh process so that its peak RSS is its own; the figures are wall time,
tokens per second and peak RSS above the interpreter's baseline, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_dataset(folder: Path, rows: int, tokens: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from relearn.masks.shards import SCHEMA

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    batch = []
    for i in range(rows):
        ids = rng.integers(0, 248_000, tokens, dtype=np.int32)
        mask = (rng.random(tokens) < 0.3).astype(np.uint8)
        mask[0] = 0
        batch.append(
            {
                "sample_id": f"s{i}",
                "trajectory_id": f"t{i}",
                "input_ids": ids,
                "loss_mask": mask,
                "n_tokens": tokens,
                "eligible": int(mask.sum()),
                "excluded": 0,
                "supervised": int(mask.sum()),
                "ter": 0.0,
                "mode": "ross",
            }
        )
    with pq.ParquetWriter(folder / "shard-00000.parquet", SCHEMA) as writer:
        for start in range(0, rows, 64):
            writer.write_table(pa.Table.from_pylist(batch[start : start + 64], schema=SCHEMA))
    stats = {"tokenizer": "qwen3.6", "tokenizer_fingerprint": "bench", "chat_template_sha256": "bench", "mode": "ross", "samples": rows}
    (folder / "stats.json").write_text(json.dumps(stats))


def run_side(side: str, dataset: Path, out: Path, fmt: str) -> dict[str, float]:
    """Run one side in this process (called in a child) and report its time and peak RSS."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if side == "ours":
        from relearn.export.source import open_dataset
        from relearn.export.trainers import export_dataset

        summary = export_dataset(open_dataset(dataset), fmt, out)
        tokens = summary.tokens
    else:
        table = pq.read_table(dataset / "shard-00000.parquet", columns=["input_ids", "loss_mask"])
        ids = table.column("input_ids").to_pylist()
        masks = table.column("loss_mask").to_pylist()
        out.mkdir(parents=True)
        pq.write_table(
            pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "assistant_masks": pa.array(masks, pa.list_(pa.int8()))}),
            out / "train.parquet",
        )
        tokens = int(np.sum([len(i) for i in ids]))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "tokens": tokens, "rss_mb": (peak - base) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--format", default="trl")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, Path(args.dataset), Path(args.out), args.format)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "dataset"
        make_dataset(dataset, args.rows, args.tokens)
        size = (dataset / "shard-00000.parquet").stat().st_size / 1e6
        results = {}
        for side in ("baseline", "ours"):
            command = [
                sys.executable,
                __file__,
                "--side",
                side,
                "--dataset",
                str(dataset),
                "--out",
                str(Path(tmp) / side),
                "--format",
                args.format,
            ]
            results[side] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    print(
        f"dataset: {args.rows} rows x {args.tokens:,} tokens = {args.rows * args.tokens / 1e6:.1f}M tokens ({size:.0f} MB of Parquet); format {args.format}"
    )
    for side, r in results.items():
        print(f"  {side:8s} {r['seconds']:6.2f} s  {r['tokens'] / r['seconds'] / 1e6:5.2f}M tok/s  peak RSS +{r['rss_mb']:,.0f} MB")
    ours, base = results["ours"], results["baseline"]
    print(
        f"  time ours/baseline {ours['seconds'] / base['seconds']:.2f}x; peak RSS ours/baseline {ours['rss_mb'] / max(base['rss_mb'], 1):.2f}x"
    )


if __name__ == "__main__":
    main()
