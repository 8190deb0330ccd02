"""The DeepSpeed config, generated from the trainer's flags (no hand-written JSON to drift).

Choices that are not DeepSpeed's defaults, and why:
  * ``zero_allow_untested_optimizer``: we pass a plain ``torch.optim.AdamW`` (DeepSpeed's fused
    and CPU Adam need compiled ops; torch's works everywhere, CPU CI included);
  * ``zero_force_ds_cpu_optimizer: false``: the same AdamW also runs the CPU-offloaded update;
  * ``stage3_gather_16bit_weights_on_model_save``: the final Hugging Face folder needs whole
    weights, gathered from the ZeRO-3 partitions;
  * ``steps_per_print`` very large: the trainer prints its own metrics.
No ZeRO-3 leaf modules are declared for MoE blocks: transformers >= 5 fuses a layer's experts
into one module with 3-D parameters, so ranks that route tokens differently still gather the
same parameters in the same order (observed: no hang with different data per rank).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

STAGES = (0, 2, 3)


def deepspeed_config(
    *,
    stage: int,
    rows_per_micro: int,
    grad_accum: int,
    world: int,
    bf16: bool = False,
    offload: bool = False,
    clip: float = 1.0,
    pin_memory: bool = False,
    sequence_parallel: int = 1,
) -> dict[str, Any]:
    """The config dict for ``deepspeed.initialize``. ``offload`` moves the optimizer state (ZeRO-2/3)
    and, under ZeRO-3, the parameters too, to CPU memory. ``world`` counts all ranks; with
    ``sequence_parallel`` > 1, each group of that many ranks works on the same rows."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, not {stage}")
    if offload and stage == 0:
        raise ValueError("CPU offload needs ZeRO stage 2 or 3")
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 2:
        zero.update(overlap_comm=False, contiguous_gradients=True, reduce_scatter=True)
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    if world % sequence_parallel:
        raise ValueError(f"world size {world} is not a multiple of the sequence-parallel size {sequence_parallel}")
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": rows_per_micro,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": rows_per_micro * grad_accum * (world // sequence_parallel),
        "gradient_clipping": clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if sequence_parallel > 1:
        config["sequence_parallel_size"] = sequence_parallel
    return config


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops (the CPU shared-memory comm op: 30-50 s to build) are kept
    between runs: a persistent folder under the user's cache, unless TORCH_EXTENSIONS_DIR says otherwise."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "relearn" / "torch_extensions"


# torch's JIT build marks a build in progress with a bare `lock` file and waits, forever, while
# it exists; a build killed part way (a timeout, Ctrl-C) leaves it behind and every later run
# hangs at start. The build takes under a minute, so a lock this old belongs to no live build.
STALE_BUILD_LOCK_S = 600


def clear_stale_build_locks(root: Path, older_than_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Remove the build locks under ``root`` that no build can still hold; returns them."""
    now = time.time()
    removed = []
    for lock in root.glob("*/lock") if root.is_dir() else []:
        try:
            if now - lock.stat().st_mtime > older_than_s:
                lock.unlink()
                removed.append(lock)
        except FileNotFoundError:  # the other rank removed it first
            continue
    return removed


def prepare_environment(cuda: bool) -> None:
    """Set what DeepSpeed reads at import time; call before ``import deepspeed``."""
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    clear_stale_build_locks(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    # A single process launched without torchrun/deepspeed still needs a rendezvous.
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
