"""``relearn train --plan`` against measured peaks: the plan's prediction for one process on CPU
next to the trainer's real peak, on three real transformers models with random weights.

    python bench/bench_train_plan.py [--sizes tiny-qwen3,qwen3-h256,qwen3.5-moe-h256]

Each size trains two optimizer steps (the second has AdamW's states, the steady state) through
``relearn.train.loop.train``, the function ``relearn train`` calls, in a fresh process. Measured:
the process's peak resident memory from the moment the trainer is called (Linux: ``clear_refs``
resets the high-water mark ``VmHWM`` after the imports) minus its resident memory then, so the
interpreter, torch and transformers are left out, as the plan leaves out what is not the step's.
``MALLOC_MMAP_THRESHOLD_`` is fixed at 128 KiB: every tensor larger than that is its own mapping,
returned to the system when freed, so resident memory follows the live tensors as a GPU's
allocator statistics would (glibc's adaptive threshold would otherwise keep freed blocks of up to
32 MiB resident). Printed: predicted, measured, their ratio; exit 1 when a ratio is outside 0.8-1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BAND = (0.8, 1.2)
SUPERVISED = 0.3
# name -> (model: a tiny name of relearn's or a config to save with random weights, ctx, chunk)
SIZES: dict[str, tuple[str | dict[str, Any], int, int]] = {
    "tiny-qwen3": ("qwen3", 4096, 256),
    "qwen3-h256": (
        dict(
            model_type="qwen3", vocab_size=32_000, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            head_dim=32, intermediate_size=1024, tie_word_embeddings=False, max_position_embeddings=262_144,
        ),
        16_384,
        1024,
    ),
    "qwen3.5-moe-h256": (
        dict(
            model_type="qwen3_5_moe_text", vocab_size=32_000, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=2, head_dim=32, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
            linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
            shared_expert_intermediate_size=256, full_attention_interval=4, tie_word_embeddings=False, max_position_embeddings=262_144,
        ),
        8192,
        1024,
    ),
}  # fmt: skip
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def write_rows(folder: Path, ctx: int, vocab: int, rows: int = 2) -> Path:
    """``rows`` samples of exactly ``ctx`` tokens, ``SUPERVISED`` of them supervised in assistant-like spans."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from relearn.masks.rows import SCHEMA

    rng = np.random.default_rng(0)
    records = []
    for i in range(rows):
        ids = rng.integers(0, vocab, ctx).tolist()
        mask = np.zeros(ctx, dtype=np.uint8)
        at = 0
        while at < ctx:
            context = int(rng.integers(200, 800))
            at += context
            mask[at : at + int(context * SUPERVISED / (1 - SUPERVISED))] = 1
            at += int(context * SUPERVISED / (1 - SUPERVISED))
        m = mask.tolist()
        records.append(
            {
                "sample_id": f"s{i}",
                "trajectory_id": f"t{i}",
                "input_ids": ids,
                "loss_mask": m,
                "n_tokens": ctx,
                "eligible": sum(m),
                "excluded": 0,
                "supervised": sum(m),
                "ter": 0.0,
                "mode": "ross",
            }  # fmt: skip
        )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=SCHEMA), folder / "shard-00000.parquet")
    return folder


def model_source(model: str | dict[str, Any], folder: Path) -> dict[str, Any]:
    """``--tiny NAME`` or ``--init FOLDER`` (the config saved with random weights)."""
    if isinstance(model, str):
        return {"tiny": model}
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(model)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return {"init": str(folder)}


def config_of(source: dict[str, Any]) -> Any:
    from relearn.train.model import tiny_config

    if "tiny" in source:
        return tiny_config(source["tiny"])
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(source["init"])


def predict(source: dict[str, Any], ctx: int, chunk: int, supervised: float) -> int:
    from relearn.train.plan import Setting, estimate, shape_of

    shape = shape_of(config_of(source), "bench", "bench")
    return estimate(shape, Setting(ctx=ctx, chunk=chunk, supervised=supervised, device="cpu")).peak


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: import what training imports, then train two steps, measuring the peak."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from relearn.train.loop import train
    from relearn.train.options import TrainOptions

    config_of(spec["source"])  # the model's transformers module imported before the baseline
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak from here on
    opts = TrainOptions(
        dataset=Path(spec["dataset"]), out=Path(spec["out"]), ctx=spec["ctx"], chunk=spec["chunk"], epochs=1, save_every=0,
        progress=False, warmup=0, **spec["source"],
    )  # fmt: skip
    summary = train(opts)
    peak = _status_kib("VmHWM")
    return {"steps": summary.steps, "baseline_kib": base, "peak_kib": peak, "measured_bytes": (peak - base) * 1024}


def measure(name: str, root: Path) -> dict[str, Any]:
    model, ctx, chunk = SIZES[name]
    source = model_source(model, root / name / "model")
    vocab = config_of(source).vocab_size
    dataset = write_rows(root / name / "data", ctx, vocab)
    spec = {"source": source, "dataset": str(dataset), "out": str(root / name / "run"), "ctx": ctx, "chunk": chunk}
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, env={**os.environ, **MALLOC_ENV}
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: the training run failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    import pyarrow.parquet as pq

    table = pq.read_table(dataset / "shard-00000.parquet", columns=["supervised", "n_tokens"])
    share = max(table["supervised"].to_pylist()) / ctx
    result["predicted_bytes"] = predict(source, ctx, chunk, share)
    result["ratio"] = result["predicted_bytes"] / result["measured_bytes"]
    result["name"], result["ctx"], result["chunk"] = name, ctx, chunk
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    gib = 2**30
    print(f"one process on CPU, fp32, two optimizer steps; peak resident memory above the imports ({SUPERVISED:.0%} supervised)")
    print(f"{'size':18s} {'tokens':>7s} {'chunk':>6s} {'predicted':>10s} {'measured':>10s} {'ratio':>6s}")
    outside = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes.split(","):
            r = measure(name, Path(tmp))
            ok = BAND[0] <= r["ratio"] <= BAND[1]
            outside += not ok
            print(
                f"{name:18s} {r['ctx']:>7,} {r['chunk']:>6,} {r['predicted_bytes'] / gib:>7.2f} GiB {r['measured_bytes'] / gib:>6.2f} GiB "
                f"{r['ratio']:>6.2f}{'' if ok else '  OUTSIDE the 20% band'}",
                flush=True,
            )
    sys.exit(1 if outside else 0)


if __name__ == "__main__":
    main()
