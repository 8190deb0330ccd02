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
import re
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
CARRY_DIR = ".init-carry"  # what the final save takes from --init, copied at the start
_IGNORED_FILE = "ignored-at-load.safetensors"
_DTYPES_FILE = "dtypes.json"
_FILES_DIR = "files"


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


# Files of an --init folder that save_pretrained writes itself, or that hold weights.
_WRITTEN = {"config.json", "generation_config.json"}
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".msgpack", ".h5")
# Tokenizer files: carried over from --init only when the tokenizer saved is --init's own.
_TOKENIZER = ("tokenizer", "vocab", "merges", "special_tokens_map", "added_tokens", "chat_template")
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def _headers(folder: Path) -> dict[str, dict[str, Any]]:
    """Each safetensors file's header in a folder, by file name (no weight is read)."""
    headers = {}
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            headers[path.name] = json.loads(f.read(size))
    return headers


def ignored_at_load(lm: Any, init: Path) -> dict[str, str]:
    """The tensors of the --init checkpoint that the model class drops at load by design (its
    ``_keys_to_ignore_on_load_unexpected``: Qwen3.5/3.6's and Qwen3-Next's multi-token-prediction
    layer ``mtp.*``), each with the file holding it. They are not the model's, but a server
    (vLLM's MTP speculative decoding) reads them from the saved folder."""
    patterns = [re.compile(p) for p in getattr(lm, "_keys_to_ignore_on_load_unexpected", None) or ()]
    if not patterns:
        return {}
    return {
        name: file
        for file, header in _headers(init).items()
        for name in header
        if name != "__metadata__" and any(p.search(name) for p in patterns)
    }


def stage_carry(lm: Any, init: Path, out: Path, with_tokenizer: bool) -> Path:
    """Copy into the run folder, at the start of a run, what the final save takes from --init
    besides the model's own weights: the tensors its class ignores at load (``mtp.*``), byte for
    byte in one safetensors file; the files a server needs (processor configs, the tokenizer's
    when it is --init's own, the licence); and every tensor's stored dtype. A run lasts hours or
    days, and the folder it started from may be moved or cleaned before the save: the save then
    reads only the run folder. Written once per run folder (a resumed run reuses it), beside its
    name and renamed into place."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    staged = out / CARRY_DIR
    if staged.is_dir():
        return staged
    tmp = out / f"{CARRY_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    carried = ignored_at_load(lm, init)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(set(carried.values())):
        # safe_open gives each tensor in its stored dtype, and save_file writes its bytes as they are.
        with safe_open(str(init / file), framework="pt") as f:
            tensors.update((n, f.get_tensor(n)) for n, held_in in carried.items() if held_in == file)
    if tensors:
        save_file(tensors, tmp / _IGNORED_FILE, metadata={"format": "pt"})
    (tmp / _FILES_DIR).mkdir()
    carry_over(init, tmp / _FILES_DIR, with_tokenizer)
    dtypes = {n: spec["dtype"] for h in _headers(init).values() for n, spec in h.items() if n != "__metadata__"}
    (tmp / _DTYPES_FILE).write_text(json.dumps(dtypes, sort_keys=True))
    os.replace(tmp, staged)
    return staged


def staged_dtypes(staged: Path) -> dict[str, torch.dtype]:
    """The stored dtype of each tensor of --init, as ``stage_carry`` recorded it."""
    names = json.loads((staged / _DTYPES_FILE).read_text())
    return {n: _SAFETENSORS_DTYPES[d] for n, d in names.items() if d in _SAFETENSORS_DTYPES}


def _carry_ignored(staged: Path, saved: Path) -> list[str]:
    """Add the staged ignored-at-load tensors that ``saved`` lacks, byte for byte in their stored
    dtype, as one more shard of ``saved``. The shards are renumbered ``model-0000i-of-0000n``
    and the index names every tensor: transformers reads a lone ``model.safetensors`` before an
    index, so the single-file form cannot take a second file. They go around
    ``save_pretrained`` because it would rewrite their names (the reverse of its load-time
    conversions splits any ``experts.gate_up_proj``), and a class that ignores them cannot
    convert them on the way in. Returns the names added."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source = staged / _IGNORED_FILE
    if not source.exists():
        return []
    index_path = saved / "model.safetensors.index.json"
    headers = _headers(saved)
    if index_path.exists():
        index = json.loads(index_path.read_text())
        weight_map: dict[str, str] = dict(index["weight_map"])
        metadata = dict(index.get("metadata") or {})
    elif "model.safetensors" in headers:
        weight_map = {n: "model.safetensors" for n in headers["model.safetensors"] if n != "__metadata__"}
        metadata = {}
    else:
        return []
    with safe_open(str(source), framework="pt") as f:
        missing = sorted(n for n in f.keys() if n not in weight_map)  # noqa: SIM118 - safe_open has no __iter__
        tensors = {n: f.get_tensor(n) for n in missing}
    if not missing:
        return []
    files = list(dict.fromkeys(weight_map.values()))
    total = len(files) + 1
    renamed = {old: f"model-{i:05d}-of-{total:05d}.safetensors" for i, old in enumerate(files, start=1)}
    for old, new in renamed.items():
        os.replace(saved / old, saved / new)
    last = f"model-{total:05d}-of-{total:05d}.safetensors"
    save_file(tensors, saved / last, metadata={"format": "pt"})
    weight_map = {n: renamed[f] for n, f in weight_map.items()} | {n: last for n in missing}
    sizes = [
        spec["data_offsets"][1] - spec["data_offsets"][0] for h in _headers(saved).values() for n, spec in h.items() if n != "__metadata__"
    ]
    metadata["total_size"] = sum(sizes)
    index_path.write_text(json.dumps({"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    return missing


def carry_over(init: Path, saved: Path, with_tokenizer: bool) -> list[str]:
    """Copy what a served model needs besides weights and config from the --init folder
    (processor and image/video preprocessor configs, tokenizer files, chat template, licence)
    unless the save already wrote a file of that name. Returns the names copied."""
    copied = []
    for path in sorted(init.iterdir()):
        name = path.name
        if not path.is_file() or name.startswith(".") or name in _WRITTEN or name.endswith(_WEIGHTS) or (saved / name).exists():
            continue
        if not with_tokenizer and name.startswith(_TOKENIZER):
            continue
        shutil.copy2(path, saved / name)
        copied.append(name)
    return copied


def _as_loaded(model: RossLM, full: dict[str, torch.Tensor] | None, staged: Path | None) -> dict[str, torch.Tensor] | None:
    """The state dict to save: the frozen weights (a vision tower) in the dtype the --init
    checkpoint stored them in, so that they are saved byte for byte as they were (a bf16
    checkpoint trained in fp32 would otherwise come back with an fp32 vision tower)."""
    frozen = [name for name, p in model.lm.named_parameters() if not p.requires_grad]
    if not frozen or staged is None:
        return full
    dtypes = staged_dtypes(staged)
    state = full if full is not None else model.lm.state_dict()
    changes = {n: state[n].to(dtypes[n]) for n in frozen if n in state and n in dtypes and state[n].dtype != dtypes[n]}
    if not changes:
        return full
    return {**state, **changes}


def save_final(
    engine: PlainEngine | DeepSpeedEngine,
    model: RossLM,
    out: Path,
    dist: Dist,
    tokenizer: Any,
    staged: Path | None = None,
    own_tokenizer: bool = True,
) -> Path:
    """Hugging Face folder (``save_pretrained``) that transformers and vLLM load, plus the tokenizer.

    Saved as the model it started from: a multimodal ``--init`` (``Qwen3_5MoeForConditionalGeneration``)
    is saved whole, its untrained weights as loaded; the tensors of --init that its class
    ignores at load (the ``mtp.*`` layer) are added byte for byte; and the files of --init that
    are not weights (processor configs; the tokenizer's when ``own_tokenizer``, i.e. no
    ``--tokenizer`` replaced it) are carried over. All of these come from ``staged``, the copy
    ``stage_carry`` made at the start, so the --init folder may be gone by now."""
    full = engine.full_state_dict()  # collective under ZeRO-3
    final = out / MODEL_DIR
    if dist.main:
        tmp = out / f".{MODEL_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.lm.config.use_cache = True  # restore the inference default in the saved config
        state = _as_loaded(model, full, staged)
        # transformers reverts on save the key conversions it recorded at load; loaded under
        # ZeRO-3 (zero.Init) it records legacy renamings and a PrefixChange as well, and the
        # saved names came out doubled (model.language_model.model.language_model.layers...,
        # which nothing loads). Without the record it reverts its default mapping, which gives
        # the class's own checkpoint names.
        conversions = getattr(model.lm, "_weight_conversions", None)
        model.lm._weight_conversions = None
        try:
            if state is not None:
                model.lm.save_pretrained(tmp, state_dict=state)
            else:
                model.lm.save_pretrained(tmp)
        finally:
            model.lm._weight_conversions = conversions
        model.lm.config.use_cache = False
        if staged is not None and own_tokenizer:
            # --init's own tokenizer files are copied as they are (below), not re-serialised.
            tokenizer = None
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if staged is not None:
            _carry_ignored(staged, tmp)
            carry_over(staged / _FILES_DIR, tmp, with_tokenizer=True)  # the tokenizer's are staged only when they are --init's
        old = out / f".{MODEL_DIR}.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier(dist)
    return final
