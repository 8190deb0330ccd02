"""The trainer's options (``relearn train`` flags, ``[train]`` of a pipeline file), the settings
that define a run, and the checks that refuse what the trainer cannot do correctly.

``TrainOptions`` is the only place the trainer's defaults are written; this module imports no
torch, so the CLI and the pipeline's config can read them without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from relearn.masks.compile import CONTEXT_TOKENS
from relearn.options import option


class UsageError(ValueError):
    """Bad flags or unusable input: nothing was trained (exit code 2)."""


SP_HELP = (
    "Ulysses sequence parallelism (DeepSpeed ALST, UlyssesSPAttentionHF): each group of N ranks shares one sequence, "
    "1/N of the tokens each, exchanging attention heads by all-to-all. Launch N x data-parallel ranks with torchrun; "
    "needs sdpa or flash attention and no --pack; runs on CPU (gloo) too. Linear-attention (Gated DeltaNet) layers, as "
    "in Qwen3.5/3.6 and Qwen3-Next, are split the same way, by head, around their convolution and recurrence: their key "
    "and value head counts must divide by N."
)
PIPELINE_NAMES = (
    "the pipeline names it: the masks stage's dataset, the run folder under the work folder, [masks].tokenizer and chat_template"
)
LAUNCHER = "needs a launcher (torchrun, deepspeed) over several processes; the pipeline trains in one"


@dataclass
class TrainOptions:
    """Masked SFT: imitation loss only on supervised tokens, whole trajectories kept as context.

    Never materialises full logits: the LM head and cross-entropy run only at supervised positions, in checkpointed chunks. Checkpoints hold the data position; rerunning the same command resumes where a killed run stopped and reproduces its loss curve.
    """

    dataset: Path = option(
        help="Dataset folder of shard-*.parquet (from `relearn masks`) or one Parquet file.",
        argument=True, metavar="DATASET", front="cli", why=PIPELINE_NAMES,
    )  # fmt: skip
    out: Path = option(
        help="Run folder: checkpoints/, metrics.jsonl, run.json, model/ (Hugging Face).",
        flags=("--out", "-o"), metavar="DIR", front="cli", why=PIPELINE_NAMES,
    )  # fmt: skip
    init: str | None = option(None, "Model folder (Hugging Face causal LM) to start from.", metavar="DIR")
    tiny: Literal["qwen3", "qwen3-moe", "qwen3.5-moe"] | None = option(None, "Tiny random model instead of --init (tests, benchmarks).")
    tokenizer: str | None = option(
        None, "Tokenizer saved with the final weights: `qwen3.6` or a folder (default: the --init folder's).",
        front="cli", why=PIPELINE_NAMES,
    )  # fmt: skip
    chat_template: str | None = option(
        None, "The chat template saved with the tokenizer, in place of its own: a Jinja file or the name of a template trl ships "
        "(give the one the dataset was compiled with, `relearn masks --chat-template`, so the model is served as it was trained).",
        metavar="NAME|FILE", front="cli", why=PIPELINE_NAMES,
    )  # fmt: skip
    ctx: int = option(
        CONTEXT_TOKENS, "Longest sequence in tokens; longer samples are refused and listed, never cut.", ge=1, metavar="TOKENS"
    )
    epochs: int = option(3, "Passes over the data.", ge=1)
    lr: float = option(1e-5, "Peak learning rate (AdamW); 0 measures the loss without moving the weights.", ge=0)
    warmup: float = option(0.03, "Warmup: a fraction of all steps (< 1) or a number of steps; then cosine decay to 0.", ge=0)
    weight_decay: float = option(0.0, "AdamW weight decay.", ge=0)
    clip: float = option(1.0, "Gradient-norm clipping (0: off).", ge=0)
    batch_trajectories: int = option(1, "Rows per micro-batch per rank (a row is one trajectory, or one pack with --pack).", ge=1)
    grad_accum: int = option(1, "Micro-batches per optimizer step per rank.", ge=1)
    loss_norm: Literal["trajectory", "token"] = option(
        "trajectory", "trajectory: mean over trajectories of each one's mean supervised NLL (ROSS); token: global token mean."
    )
    chunk: int = option(1024, "Supervised positions per LM-head chunk (loss memory is ~3 x chunk x vocab x 4 bytes).", ge=1)
    bf16: bool = option(False, "bf16 compute (autocast, or DeepSpeed bf16 with fp32 master weights).", flag_only=True)
    pack: bool = option(
        False, "Pack short trajectories up to --ctx; attention never crosses trajectories, and linear-attention (Gated "
        "DeltaNet) layers restart their state and convolution at each one.", flag_only=True,
    )  # fmt: skip
    zero: Literal[0, 2, 3] = option(0, "DeepSpeed ZeRO stage (0 and one process: plain PyTorch).", front="cli", why=LAUNCHER)
    offload: bool = option(
        False, "ZeRO-2/3: optimizer state (and ZeRO-3 parameters) in CPU memory.", flag_only=True, front="cli", why=LAUNCHER
    )
    offload_activations: bool = option(False, "GPU: keep checkpointed activations in host memory.", flag_only=True)
    gradient_checkpointing: bool = option(
        True, "Recompute each layer's activations in the backward pass instead of keeping them (the memory of 65,536 tokens)."
    )
    attn: Literal["sdpa", "flash_attention_2", "flash_attention_3", "eager"] = option("sdpa", "Attention implementation.")
    kernels: Literal["auto", "fast"] = option(
        "auto",
        "auto: the fast GPU kernels that are installed (flash-linear-attention and causal-conv1d for Gated DeltaNet "
        "layers, flash-attn behind --attn flash_attention_2/3), else transformers' PyTorch reference path; run.json "
        "names which ran. fast: refuse to start unless every kernel this model needs is installed and a CUDA GPU is "
        "there (install them with pip install --no-build-isolation 'relearn[gpu]').",
    )  # fmt: skip
    sp: int = option(1, SP_HELP, ge=1, front="cli", why=LAUNCHER)
    seed: int = option(0, "Seed of the data order and of a tiny model's init.")
    save_every: int = option(
        200, "Checkpoint every N optimizer steps (0: only when stopping early). SIGTERM/Ctrl-C also checkpoint, then stop.", ge=0
    )
    max_steps: int | None = option(
        None, "Stop after this many optimizer steps in all (the schedule still spans --epochs); rerun to continue.", ge=1
    )
    keep_checkpoints: int = option(2, "Checkpoints kept in the run folder.", ge=1)
    resume: bool = option(
        True, "Continue from the run folder's latest checkpoint when there is one.",
        front="cli", why="the pipeline always resumes: a stage reruns where it stopped",
    )  # fmt: skip
    progress: bool = option(True, "Show the progress bar.", front="cli", why="the pipeline draws its own progress")
    plan: bool = option(
        False,
        "Train nothing: print the memory per GPU of this configuration by part (parameters, gradients, optimizer states, "
        "checkpointed activations, one layer's recompute, loss chunks, ZeRO buffers) and whether it fits 80 GB and 141 GB cards, "
        "with a configuration that would. DATASET and --out are not needed; the model is --init's config.json, --tiny or "
        "--shape; the launch's size is --gpus-per-node x --nodes.",
        flag_only=True, front="cli", why="`relearn run --dry-run` prints the plan of a train stage",
    )  # fmt: skip


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
    if opts.kernels not in ("auto", "fast"):
        raise UsageError("--kernels must be auto or fast")
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
    if opts.sp > 1 and has_linear_attention(config):
        from relearn.train.linear_sp import head_counts

        counts = head_counts(config)
        if len(counts) != 2 or any(n % opts.sp for n in counts):
            heads = f"{counts[0]} key and {counts[1]} value heads" if len(counts) == 2 else "heads of unknown number"
            raise UsageError(
                f"--sp {opts.sp} refused: {config.model_type}'s linear-attention (Gated DeltaNet) layers have {heads}; "
                f"sequence parallelism gives each of the {opts.sp} ranks of a row the same share of both, so both must divide by {opts.sp}"
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
