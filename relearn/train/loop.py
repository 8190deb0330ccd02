"""Run management: engine, schedule, checkpoints, resume, metrics, final Hugging Face weights.

One optimizer step = ``(world / sp) x grad_accum`` micro-batches of ``batch_trajectories`` rows
(with sequence parallelism, ``sp`` consecutive ranks share each row, 1/sp of its tokens each).
Every rank derives the whole step's plan from ``(seed, epoch)``, so the loss normaliser of
the step (trajectories with supervision, or supervised tokens, over all ranks and
micro-batches) is known before the forward pass and costs no communication; each
micro-batch's loss is its share of the step's loss, and the shares add up exactly.

A checkpoint holds the model, optimizer, scheduler, every rank's RNG states and the data
position (epoch, step, and the epoch's shuffled order). It is written beside its final name
and renamed into place, then ``checkpoints/latest`` is replaced, so a kill at any moment
leaves the previous checkpoint intact. Rerunning the same command resumes from it, and the
metrics of steps after it are dropped, so a killed run reproduces the uninterrupted run's losses.
SIGTERM or Ctrl-C ends the current step, writes a checkpoint and stops (exit 128 + signal).

``--max-steps`` stops the run early (smoke tests, or a planned interruption); the learning-rate
schedule always spans the full ``--epochs`` so that a stopped-and-resumed run matches one that
never stopped.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import resource
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from relearn.train.data import (
    Batch,
    Layout,
    LoadReport,
    Row,
    Sample,
    collate,
    epoch_order,
    load_samples,
    plan_rows,
    shard_files,
    shard_sequence,
)
from relearn.train.deepspeed_config import STAGES, deepspeed_config, prepare_environment
from relearn.train.loss import NORMS, step_denominator
from relearn.train.model import (
    TINY_MODELS,
    RossLM,
    build_model,
    chunks_needed,
    enable_activation_checkpointing,
    has_linear_attention,
    parameter_count,
    tiny_config,
)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
METRICS = "metrics.jsonl"
RUN_FILE = "run.json"
MODEL_DIR = "model"


class UsageError(ValueError):
    """Bad flags or unusable input: nothing was trained (exit code 2)."""


@dataclass
class TrainOptions:
    dataset: Path
    out: Path
    init: str | None = None
    tiny: str | None = None
    tokenizer: str | None = None
    ctx: int = 65536
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


@dataclass
class Summary:
    steps: int
    total_steps: int
    losses: list[float]
    first_loss: float | None
    last_loss: float | None
    tokens: int
    supervised: int
    seconds: float
    supervised_per_s: float
    peak_rss_gib: float
    peak_gpu_gib: float | None
    resumed_from: int | None
    finished: bool
    model_dir: Path | None
    report: LoadReport
    parameters: int
    stopped_by: int | None = None  # the signal (SIGTERM, SIGINT) that stopped the run after a checkpoint


# ---------------------------------------------------------------- distributed setup


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    deepspeed: bool
    sp: int = 1  # ranks per sequence-parallel group: consecutive ranks share the same rows

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def dp_world(self) -> int:
        return self.world // self.sp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp


def setup_distributed(opts: TrainOptions) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    use_ds = opts.zero > 0 or opts.offload or world > 1 or opts.sp > 1
    if opts.sp > 1 and world % opts.sp:
        raise UsageError(f"--sp {opts.sp} needs a number of processes that it divides (launched with {world}): use torchrun --nproc_per_node")
    if not use_ds:
        return Dist(0, 1, 0, torch.device("cuda" if cuda else "cpu"), False)
    prepare_environment(cuda)
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    return Dist(rank, world, local_rank, torch.device(f"cuda:{local_rank}" if cuda else "cpu"), True, opts.sp)


def _barrier(dist: Dist) -> None:
    if dist.world > 1:
        torch.distributed.barrier()


def _sum_across(dist: Dist, value: float) -> float:
    if dist.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item())


# ---------------------------------------------------------------- engines


def lr_lambda(total_steps: int, warmup_steps: int):
    """Linear warmup from lr/warmup to lr, then cosine decay to 0 at the last step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def warmup_steps(warmup: float, total: int) -> int:
    return int(warmup) if warmup >= 1 else math.ceil(warmup * total)


class PlainEngine:
    """Single process, plain PyTorch: AdamW, clipping, bf16 autocast over fp32 weights."""

    def __init__(self, model: RossLM, opts: TrainOptions, total_steps: int, device: torch.device) -> None:
        self.model = model.to(device)
        self.device = device
        self.bf16 = opts.bf16
        self.clip = opts.clip
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(total_steps, warmup_steps(opts.warmup, total_steps)))

    def forward(self, **inputs: Any) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.model(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def finish_step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip if self.clip > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save(self, root: Path, tag: str) -> None:
        (root / tag).mkdir(parents=True, exist_ok=True)
        state = {"model": self.model.lm.state_dict(), "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        torch.save(state, root / tag / "state.pt")

    def load(self, root: Path, tag: str) -> None:
        state = torch.load(root / tag / "state.pt", map_location=self.device, weights_only=False)
        self.model.lm.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return None  # the module itself holds whole weights


class DeepSpeedEngine:
    """DeepSpeed ZeRO-0/2/3 with a torch AdamW; one ``engine.step()`` per micro-batch, as DeepSpeed wants."""

    def __init__(self, model: RossLM, opts: TrainOptions, total_steps: int, dist: Dist, mpu: Any = None) -> None:
        import deepspeed

        self.dist = dist
        self.stage = opts.zero
        config = deepspeed_config(
            stage=opts.zero, rows_per_micro=opts.batch_trajectories, grad_accum=opts.grad_accum, world=dist.world,
            bf16=opts.bf16, offload=opts.offload, clip=opts.clip, pin_memory=dist.device.type == "cuda", sequence_parallel=dist.sp,
        )  # fmt: skip
        optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, warmup_steps(opts.warmup, total_steps)))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config, mpu=mpu)
        self.model = model

    def forward(self, **inputs: Any) -> torch.Tensor:
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        # Our micro-batch losses already add up to the step's loss over all micro-batches and
        # ranks; DeepSpeed would divide by grad_accum (turned off), and it sums gradients over
        # all ranks then divides by the data-parallel size (world / sp): the factor undoes that,
        # so the gradient is that of the step's loss.
        self.engine.backward(loss * self.dist.dp_world, scale_wrt_gas=False)
        self.engine.step()

    def finish_step(self) -> float:
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, root: Path, tag: str) -> None:
        self.engine.save_checkpoint(str(root), tag=tag, client_state={}, save_latest=False)

    def load(self, root: Path, tag: str) -> None:
        path, _ = self.engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {root / tag}")

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Whole weights on rank 0 (a collective under ZeRO-3: every rank must call it)."""
        if self.stage == 3:
            state = self.engine._zero3_consolidated_16bit_state_dict()
            return None if state is None else {k.removeprefix("lm."): v for k, v in state.items()}
        return None


# ---------------------------------------------------------------- run folder


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def dataset_fingerprint(dataset: Path) -> list[list[Any]]:
    return [[f.name, f.stat().st_size] for f in shard_files(dataset)]


def latest_checkpoint(out: Path) -> str | None:
    marker = out / CHECKPOINTS / LATEST
    if not marker.exists():
        return None
    tag = marker.read_text().strip()
    return tag if (out / CHECKPOINTS / tag / "trainer.json").exists() else None


def _identity(opts: TrainOptions, world: int, dataset: Path) -> dict[str, Any]:
    ident = {k: getattr(opts, k) for k in IDENTITY}
    ident["world"] = world
    ident["dataset"] = dataset_fingerprint(dataset)
    return ident


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop the metrics of steps after ``last_step`` (they were run after the checkpoint we resume from)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= last_step]
    _write_atomic(path, "".join(line + "\n" for line in kept))


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
    _barrier(dist)
    engine.save(root, tmp)
    (root / tmp).mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), root / tmp / f"rng-rank{dist.rank}.pt")
    if dist.main:
        _write_atomic(root / tmp / "trainer.json", json.dumps(asdict(state)))
    _barrier(dist)
    if dist.main:
        if (root / tag).exists():
            shutil.rmtree(root / tag)
        os.replace(root / tmp, root / tag)
        _write_atomic(root / LATEST, tag)
        old = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != tag)
        for p in old[: max(0, len(old) - max(keep, 1) + 1)]:
            shutil.rmtree(p, ignore_errors=True)
    _barrier(dist)
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
    _barrier(dist)
    return final


class StopOnSignal:
    """SIGTERM (a scheduler's preemption, torchrun forwarding) or Ctrl-C: finish the current step,
    write a checkpoint and stop. A second signal acts as usual (force quit)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _any_across(dist: Dist, flag: bool) -> bool:
    """True on every rank when it is true on one (ranks must stop at the same step)."""
    if dist.world == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


# ---------------------------------------------------------------- checks


def model_config(opts: TrainOptions) -> Any:
    if opts.tiny is not None:
        return tiny_config(opts.tiny)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(opts.init)


def check_options(opts: TrainOptions, config: Any | None = None) -> None:
    """Refuse, with the reason, what the trainer cannot do correctly. Raises ``UsageError``."""
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
            raise UsageError("--sp > 1 with --pack is refused: Ulysses discards attention masks, so packed trajectories would see each other")
    if opts.pack and linear:
        raise UsageError(
            f"--pack refused: {config.model_type} has linear-attention (Gated DeltaNet) layers, whose recurrent state and "
            "causal convolution would carry over from one packed trajectory into the next"
        )


# ---------------------------------------------------------------- the run


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def _load_tokenizer(opts: TrainOptions) -> Any:
    if opts.tokenizer is not None:
        from relearn.tokenizers import load_tokenizer

        return load_tokenizer(opts.tokenizer)
    if opts.init is not None:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(opts.init)
        except Exception:  # noqa: BLE001 - a weights-only folder has no tokenizer; that is allowed
            return None
    return None


def _step_plan(samples: list[Sample], rows: list[Row], layout: Layout, step: int, norm: str, chunk: int) -> tuple[int, int, int, int]:
    """(denominator, max head chunks of any micro-batch, tokens, supervised) of a global step."""
    step_rows = layout.step_rows(rows, step)
    counts = [samples[i].supervised for row in step_rows for i in row]
    micro = [step_rows[k : k + layout.rows_per_micro] for k in range(0, len(step_rows), layout.rows_per_micro)]
    chunks = max(chunks_needed(sum(samples[i].supervised for row in m for i in row), chunk) for m in micro)
    tokens = sum(samples[i].n_tokens for row in step_rows for i in row)
    return step_denominator(counts, norm), chunks, tokens, sum(counts)  # type: ignore[arg-type]


def _inputs(batch: Batch, denominator: int, min_chunks: int) -> dict[str, Any]:
    return dict(
        input_ids=batch.input_ids, loss_mask=batch.loss_mask, segments=batch.segments, n_segments=batch.n_segments,
        docs=batch.docs, position_ids=batch.position_ids, packed=batch.packed, denominator=float(denominator), min_chunks=min_chunks,
        targets=batch.targets, shifted=batch.shifted,
        segment_counts=torch.tensor(batch.supervised_per_segment, dtype=torch.long, device=batch.input_ids.device),
    )  # fmt: skip


def train(opts: TrainOptions, console: Console | None = None) -> Summary:
    """Run (or resume) a training run into ``opts.out``. Raises ``UsageError`` for bad input."""
    console = console or Console(stderr=True)
    check_options(opts)
    try:
        config = model_config(opts)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--init {opts.init}: cannot read the model config: {exc}") from None
    check_options(opts, config)
    dist = setup_distributed(opts)
    say = console.print if dist.main else (lambda *a, **k: None)

    vocab = getattr(getattr(config, "text_config", None) or config, "vocab_size", None)
    try:
        samples, report = load_samples(opts.dataset, ctx=opts.ctx, vocab_size=vocab)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if report.problems:
        say(f"[yellow]refused samples[/yellow] ({len(report.problems)}; listed, never cut or dropped in silence):")
        for line in report.problems[:20]:
            say(f"  {line}", markup=False, highlight=False)
        if len(report.problems) > 20:
            say(f"  ... and {len(report.problems) - 20} more")
    if report.unsupervised:
        say(f"{report.unsupervised} sample(s) without any supervised token left out (they carry no loss)")
    if not samples:
        raise UsageError(f"{opts.dataset}: no usable sample")

    opts.out.mkdir(parents=True, exist_ok=True)
    identity = _identity(opts, dist.world, opts.dataset)
    tag = latest_checkpoint(opts.out)
    run_file = opts.out / RUN_FILE
    saved = json.loads(run_file.read_text()) if run_file.exists() else {}
    finished_before = bool(saved.get("finished"))
    if tag is not None or finished_before:
        if not opts.resume:
            raise UsageError(f"{opts.out} already holds a run ({tag or 'finished'}); rerun without --no-resume to continue it, or choose another --out")
        old = saved.get("identity", {})
        changed = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
        if changed:
            raise UsageError(f"{opts.out} holds a run with different settings ({', '.join(changed)}); use another --out")
    if finished_before:
        say(f"{opts.out}: this run already finished (step {saved.get('global_step')}); nothing to do")
        return Summary(
            steps=0, total_steps=int(saved.get("total_steps", 0)), losses=[], first_loss=None, last_loss=None, tokens=0, supervised=0,
            seconds=0.0, supervised_per_s=0.0, peak_rss_gib=_peak_rss_gib(), peak_gpu_gib=None, resumed_from=None, finished=True,
            model_dir=opts.out / MODEL_DIR if (opts.out / MODEL_DIR).exists() else None, report=report, parameters=0,
        )  # fmt: skip

    # Every epoch's plan is known up front: the schedule's length depends on it (with packing
    # the number of rows changes with the order).
    layout = Layout(dist.dp_world, opts.grad_accum, opts.batch_trajectories)
    epoch_rows = [plan_rows(samples, epoch_order(len(samples), opts.seed, e), pack=opts.pack, ctx=opts.ctx) for e in range(opts.epochs)]
    steps_per_epoch = [layout.steps(len(rows)) for rows in epoch_rows]
    total_steps = sum(steps_per_epoch)

    random.seed(opts.seed)
    np.random.seed(opts.seed)
    torch.manual_seed(opts.seed)
    hf_ds_config = None
    if dist.deepspeed and opts.zero == 3 and opts.init is not None:
        # Keep this object alive while loading: it makes from_pretrained build the model partitioned.
        from transformers.integrations import HfDeepSpeedConfig

        importlib.import_module("torch._dynamo")  # before zero.Init patches tensor constructors, or its import fails

        hf_ds_config = HfDeepSpeedConfig(
            deepspeed_config(
                stage=3, rows_per_micro=opts.batch_trajectories, grad_accum=opts.grad_accum, world=dist.world, bf16=opts.bf16,
                offload=opts.offload, sequence_parallel=dist.sp,
            )  # fmt: skip
        )
    lm = build_model(init=opts.init, tiny=opts.tiny, seed=opts.seed, attn_implementation=opts.attn, max_positions=max(opts.ctx, 262_144))
    del hf_ds_config
    if opts.gradient_checkpointing:
        enable_activation_checkpointing(lm, offload=opts.offload_activations and dist.device.type == "cuda")
    mpu = None
    if dist.sp > 1:
        # Ulysses: each rank holds 1/sp of the sequence; around every softmax attention an
        # all-to-all trades sequence shards for head shards (DeepSpeed ALST).
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=lm, core_attn_implementation=opts.attn, sequence_parallel_size=dist.sp,
            micro_batch_size=opts.batch_trajectories, seq_length_is_variable=True,
        )  # fmt: skip
    model = RossLM(lm, norm=opts.loss_norm, chunk=opts.chunk)  # type: ignore[arg-type]
    model.train()
    parameters = parameter_count(model)
    engine: PlainEngine | DeepSpeedEngine = DeepSpeedEngine(model, opts, total_steps, dist, mpu) if dist.deepspeed else PlainEngine(model, opts, total_steps, dist.device)
    tokenizer = _load_tokenizer(opts) if dist.main else None

    state = TrainerState(order=epoch_order(len(samples), opts.seed, 0))
    resumed_from: int | None = None
    if tag is not None:
        state = load_checkpoint(engine, opts.out, tag, dist)
        resumed_from = state.global_step
        say(f"resumed from {opts.out / CHECKPOINTS / tag} (step {state.global_step}, epoch {state.epoch + 1}, step {state.step_in_epoch} in epoch)")
    metrics_path = opts.out / METRICS
    if dist.main:
        truncate_metrics(metrics_path, state.global_step)
        _write_atomic(run_file, json.dumps({"identity": identity, "finished": False, "total_steps": total_steps}, indent=1))
        say(
            f"training {opts.tiny or opts.init} ({parameters / 1e6:.1f}M parameters) on {len(samples)} samples, "
            f"{opts.epochs} epochs x {steps_per_epoch[0]} steps, world {dist.world}, "
            f"{'ZeRO-' + str(opts.zero) if dist.deepspeed else 'plain PyTorch'}{f', sequence parallel {dist.sp}' if dist.sp > 1 else ''}, loss-norm {opts.loss_norm}"
        )

    stop_at = min(total_steps, opts.max_steps) if opts.max_steps is not None else total_steps
    losses: list[float] = []
    run_tokens = run_supervised = 0
    run_seconds = 0.0
    last_saved = state.global_step if tag is not None else -1
    progress = Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        disable=not (opts.progress and dist.main),
    )  # fmt: skip
    metrics = open(metrics_path, "a", encoding="utf-8") if dist.main else None  # noqa: SIM115 - closed below
    stopper = StopOnSignal()
    stopped_by: int | None = None
    try:
        with progress, stopper:
            bar = progress.add_task("train", total=stop_at, completed=min(state.global_step, stop_at), info="")
            while state.epoch < opts.epochs and state.global_step < stop_at and stopped_by is None:
                rows = plan_rows(samples, state.order, pack=opts.pack, ctx=opts.ctx)
                while state.step_in_epoch < layout.steps(len(rows)) and state.global_step < stop_at and stopped_by is None:
                    step = state.step_in_epoch
                    denominator, chunks, step_tokens, step_supervised = _step_plan(samples, rows, layout, step, opts.loss_norm, opts.chunk)
                    # Under ZeRO-3 each LM-head call gathers its weight collectively: all ranks
                    # must make the same number of calls, whatever their supervised counts.
                    min_chunks = chunks if (dist.deepspeed and opts.zero == 3 and dist.world > 1) else 0
                    started = time.perf_counter()
                    lr = engine.lr()  # the rate this step uses (the scheduler moves on in finish_step)
                    local = 0.0
                    for micro in layout.micro_rows(rows, step, dist.dp_rank):
                        batch = collate(samples, micro)
                        if dist.sp > 1:
                            batch = shard_sequence(batch, dist.sp, dist.sp_rank)
                        batch = batch.to(dist.device)
                        loss = engine.forward(**_inputs(batch, denominator, min_chunks))
                        engine.backward(loss)
                        local += float(loss.detach())
                    grad_norm = engine.finish_step()
                    step_loss = _sum_across(dist, local)
                    seconds = time.perf_counter() - started
                    state.global_step += 1
                    state.step_in_epoch += 1
                    state.tokens += step_tokens
                    state.supervised += step_supervised
                    state.train_seconds += seconds
                    run_tokens += step_tokens
                    run_supervised += step_supervised
                    run_seconds += seconds
                    losses.append(step_loss)
                    record = {
                        "step": state.global_step, "epoch": state.epoch + 1, "loss": step_loss, "supervised_tokens": step_supervised,
                        "tokens": step_tokens, "tokens_per_s": step_tokens / seconds, "supervised_tokens_per_s": step_supervised / seconds,
                        "lr": lr, "grad_norm": grad_norm, "seconds": seconds,
                    }  # fmt: skip
                    if metrics is not None:
                        metrics.write(json.dumps(record) + "\n")
                        metrics.flush()
                    progress.update(
                        bar, advance=1,
                        info=f"epoch {state.epoch + 1}/{opts.epochs}  loss {step_loss:.4f}  sup tok/s {run_supervised / max(run_seconds, 1e-9):,.0f}",
                    )  # fmt: skip
                    if opts.save_every and state.global_step % opts.save_every == 0:
                        save_checkpoint(engine, state, opts.out, dist, opts.keep_checkpoints)
                        last_saved = state.global_step
                    if _any_across(dist, stopper.received is not None):
                        stopped_by = stopper.received or signal.SIGTERM
                if state.step_in_epoch >= layout.steps(len(rows)):
                    state.epoch += 1
                    state.step_in_epoch = 0
                    state.order = epoch_order(len(samples), opts.seed, state.epoch) if state.epoch < opts.epochs else []
    finally:
        if metrics is not None:
            metrics.close()

    finished = state.global_step >= total_steps
    if not finished and last_saved != state.global_step:
        save_checkpoint(engine, state, opts.out, dist, opts.keep_checkpoints)  # stopped early: keep the position
    if stopped_by is not None:
        say(f"stopped by signal {signal.Signals(stopped_by).name} after step {state.global_step}; checkpoint written, rerun to continue")
    # On a signal there may be little time left (a preemption's grace period): the checkpoint is enough.
    model_dir = save_final(engine, model, opts.out, dist, tokenizer) if stopped_by is None else None
    if dist.main:
        _write_atomic(run_file, json.dumps({"identity": identity, "finished": finished, "total_steps": total_steps, "global_step": state.global_step}, indent=1))
    peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if dist.device.type == "cuda" else None
    return Summary(
        steps=len(losses), total_steps=total_steps, losses=losses, first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None,
        tokens=run_tokens, supervised=run_supervised, seconds=run_seconds, supervised_per_s=run_supervised / run_seconds if run_seconds else 0.0,
        peak_rss_gib=_peak_rss_gib(), peak_gpu_gib=peak_gpu, resumed_from=resumed_from, finished=finished, model_dir=model_dir,
        report=report, parameters=parameters, stopped_by=stopped_by,
    )  # fmt: skip


def step_at(out: Path) -> int:
    """The global step of a run folder's latest checkpoint (0 if none)."""
    tag = latest_checkpoint(out)
    if tag is None:
        return 0
    return int(json.loads((out / CHECKPOINTS / tag / "trainer.json").read_text())["global_step"])


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = out / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

