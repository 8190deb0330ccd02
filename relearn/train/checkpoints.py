"""The run folder: checkpoints (model, optimizer, scheduler, every rank's RNG states, the
data position), the run's identity, metrics, and the final Hugging Face weights.

A checkpoint is written beside its final name and renamed into place, then
``checkpoints/latest`` is replaced, so a kill at any moment leaves the previous checkpoint
intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from records.pools import write_text_atomic
from relearn.train.data import shard_files
from relearn.train.engines import DeepSpeedEngine, Dist, PlainEngine, barrier
from relearn.train.model import RossLM
from relearn.train.options import IDENTITY, TrainOptions

CHECKPOINTS = "checkpoints"
LATEST = "latest"
METRICS = "metrics.jsonl"
RUN_FILE = "run.json"
MODEL_DIR = "model"


@dataclass
class TrainerState:
    """The data position and counters; saved in every checkpoint as ``trainer.json``."""

    global_step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0  # the next step to run within ``epoch``
    order: list[int] = field(default_factory=list)  # the shuffled sample order of ``epoch``
    tokens: int = 0
    supervised: int = 0
    train_seconds: float = 0.0


def dataset_fingerprint(dataset: Path) -> list[list[Any]]:
    return [[f.name, f.stat().st_size] for f in shard_files(dataset)]


def run_identity(opts: TrainOptions, world: int, dataset: Path) -> dict[str, Any]:
    ident = {k: getattr(opts, k) for k in IDENTITY}
    ident["world"] = world
    ident["dataset"] = dataset_fingerprint(dataset)
    return ident


def latest_checkpoint(out: Path) -> str | None:
    marker = out / CHECKPOINTS / LATEST
    if not marker.exists():
        return None
    tag = marker.read_text().strip()
    return tag if (out / CHECKPOINTS / tag / "trainer.json").exists() else None


def step_at(out: Path) -> int:
    """The global step of a run folder's latest checkpoint (0 if none)."""
    tag = latest_checkpoint(out)
    if tag is None:
        return 0
    return int(json.loads((out / CHECKPOINTS / tag / "trainer.json").read_text())["global_step"])


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop the metrics of steps after ``last_step`` (they were run after the checkpoint we resume from)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= last_step]
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = out / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(engine: PlainEngine | DeepSpeedEngine, state: TrainerState, out: Path, dist: Dist, keep: int) -> str:
    root = out / CHECKPOINTS
    tag = f"step-{state.global_step:08d}"
    tmp = f".tmp-{tag}"
    if dist.main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(root / tmp, ignore_errors=True)
    barrier(dist)
    engine.save(root, tmp)
    (root / tmp).mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), root / tmp / f"rng-rank{dist.rank}.pt")
    if dist.main:
        write_text_atomic(root / tmp / "trainer.json", json.dumps(asdict(state)))
    barrier(dist)
    if dist.main:
        if (root / tag).exists():
            shutil.rmtree(root / tag)
        os.replace(root / tmp, root / tag)
        write_text_atomic(root / LATEST, tag)
        old = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != tag)
        for p in old[: max(0, len(old) - max(keep, 1) + 1)]:
            shutil.rmtree(p, ignore_errors=True)
    barrier(dist)
    return tag


def load_checkpoint(engine: PlainEngine | DeepSpeedEngine, out: Path, tag: str, dist: Dist) -> TrainerState:
    root = out / CHECKPOINTS
    engine.load(root, tag)
    state = TrainerState(**json.loads((root / tag / "trainer.json").read_text()))
    rng = root / tag / f"rng-rank{dist.rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return state


def save_final(engine: PlainEngine | DeepSpeedEngine, model: RossLM, out: Path, dist: Dist, tokenizer: Any) -> Path:
    """Hugging Face folder (``save_pretrained``) that transformers and vLLM load, plus the tokenizer."""
    full = engine.full_state_dict()  # collective under ZeRO-3
    final = out / MODEL_DIR
    if dist.main:
        tmp = out / f".{MODEL_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.lm.config.use_cache = True  # restore the inference default in the saved config
        if full is not None:
            model.lm.save_pretrained(tmp, state_dict=full)
        else:
            model.lm.save_pretrained(tmp)
        model.lm.config.use_cache = False
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        old = out / f".{MODEL_DIR}.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier(dist)
    return final
