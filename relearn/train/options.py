"""The trainer's options (``relearn train`` flags, ``[train]`` of a pipeline file), the settings
that define a run, and the checks that refuse what the trainer cannot do correctly.

``TrainOptions`` is the only place the trainer's defaults are written; this module imports no
torch, so the CLI and the pipeline's config can read them without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relearn.masks.compile import CONTEXT_TOKENS


class UsageError(ValueError):
    """Bad flags or unusable input: nothing was trained (exit code 2)."""


@dataclass
class TrainOptions:
    dataset: Path
    out: Path
    init: str | None = None
    tiny: str | None = None
    tokenizer: str | None = None
    ctx: int = CONTEXT_TOKENS
    epochs: int = 3
    lr: float = 1e-5
    warmup: float = 0.03  # < 1: fraction of all steps; >= 1: a number of steps
    weight_decay: float = 0.0
    clip: float = 1.0
    batch_trajectories: int = 1
    grad_accum: int = 1
    loss_norm: str = "trajectory"
    chunk: int = 1024
    bf16: bool = False
    pack: bool = False
    zero: int = 0
    offload: bool = False
    offload_activations: bool = False
    gradient_checkpointing: bool = True
    attn: str = "sdpa"
    sp: int = 1
    seed: int = 0
    save_every: int = 200  # 0: a checkpoint only when the run stops (--max-steps or a signal)
    max_steps: int | None = None
    keep_checkpoints: int = 2
    resume: bool = True
    progress: bool = True


# The options that define what is being trained; a resumed run must agree on every one.
IDENTITY = (
    "init", "tiny", "ctx", "epochs", "lr", "warmup", "weight_decay", "clip", "batch_trajectories", "grad_accum",
    "loss_norm", "bf16", "pack", "zero", "offload", "attn", "sp", "seed",
)  # fmt: skip


def model_config(opts: TrainOptions) -> Any:
    from relearn.train.model import tiny_config

    if opts.tiny is not None:
        return tiny_config(opts.tiny)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(opts.init)


def check_options(opts: TrainOptions, config: Any | None = None) -> None:
    """Refuse, with the reason, what the trainer cannot do correctly. Raises ``UsageError``."""
    from relearn.train.deepspeed_config import STAGES
    from relearn.train.loss import NORMS
    from relearn.train.model import TINY_MODELS, has_linear_attention

    if (opts.init is None) == (opts.tiny is None):
        raise UsageError("give exactly one of --init PATH or --tiny NAME")
    if opts.tiny is not None and opts.tiny not in TINY_MODELS:
        raise UsageError(f"--tiny must be one of {', '.join(TINY_MODELS)}")
    if opts.init is not None and not Path(opts.init).is_dir():
        raise UsageError(f"--init {opts.init}: not a model folder")
    if opts.loss_norm not in NORMS:
        raise UsageError(f"--loss-norm must be one of {', '.join(NORMS)}")
    if opts.zero not in STAGES:
        raise UsageError(f"--zero must be one of {', '.join(map(str, STAGES))}")
    if opts.offload and opts.zero == 0:
        raise UsageError("--offload needs --zero 2 or 3")
    for name in ("ctx", "epochs", "batch_trajectories", "grad_accum", "chunk", "sp"):
        if getattr(opts, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if opts.max_steps is not None and opts.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    if opts.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    if config is None:
        return
    linear = has_linear_attention(config)
    if opts.sp > 1 and linear:
        raise UsageError(
            f"--sp {opts.sp} refused: {config.model_type} has linear-attention (Gated DeltaNet) layers. DeepSpeed's Ulysses "
            "sequence parallelism shards only softmax attention, so each rank's DeltaNet layers restart their recurrent state "
            "from zero: the forward looks right but the gradients are wrong. Use --sp 1."
        )
    if opts.sp > 1:
        text = getattr(config, "text_config", None) or config
        heads, kv = text.num_attention_heads, getattr(text, "num_key_value_heads", text.num_attention_heads)
        if heads % opts.sp or (kv % opts.sp and opts.sp % kv):
            raise UsageError(f"--sp {opts.sp}: Ulysses splits attention heads; {heads} query / {kv} key-value heads do not divide by it")
        if opts.attn == "eager":
            raise UsageError("--sp > 1 needs --attn sdpa or a flash attention (Ulysses discards masks; eager needs one)")
        if opts.pack:
            raise UsageError(
                "--sp > 1 with --pack is refused: Ulysses discards attention masks, so packed trajectories would see each other"
            )
    if opts.pack and linear:
        raise UsageError(
            f"--pack refused: {config.model_type} has linear-attention (Gated DeltaNet) layers, whose recurrent state and "
            "causal convolution would carry over from one packed trajectory into the next"
        )
