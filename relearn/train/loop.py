"""The training loop: ``relearn train`` from shards to a Hugging Face folder.

One optimizer step = ``(world / sp) x grad_accum`` micro-batches of ``batch_trajectories`` rows
(with sequence parallelism, ``sp`` consecutive ranks share each row, 1/sp of its tokens each).
Every rank derives the whole step's plan from ``(seed, epoch)``, so the loss normaliser of
the step (trajectories with supervision, each sample counting for its share of its
trajectory's supervised targets; or supervised tokens; over all ranks and micro-batches) is
known before the forward pass and costs no communication; each micro-batch's loss is its
share of the step's loss, and the shares add up exactly.

Rerunning the same command resumes from the latest checkpoint (``checkpoints``), and the
metrics of steps after it are dropped, so a killed run reproduces the uninterrupted run's
losses. SIGTERM or Ctrl-C ends the current step, writes a checkpoint and stops (exit 128 +
signal). ``--max-steps`` stops the run early (smoke tests, or a planned interruption); the
learning-rate schedule always spans the full ``--epochs`` so that a stopped-and-resumed run
matches one that never stopped.

The pieces around the loop: ``options`` (flags and checks), ``engines`` (plain PyTorch or
DeepSpeed, the process group, the schedule), ``checkpoints`` (the run folder), ``data``,
``model`` and ``loss``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import resource
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from records.pools import write_text_atomic
from relearn.masks.rows import ShardRow
from relearn.train.checkpoints import (
    CARRY_DIR,
    CHECKPOINTS,
    METRICS,
    MODEL_DIR,
    RUN_FILE,
    TrainerState,
    ignored_at_load,
    latest_checkpoint,
    load_checkpoint,
    run_identity,
    save_checkpoint,
    save_final,
    stage_carry,
    truncate_metrics,
)
from relearn.train.data import (
    Batch,
    Layout,
    LoadReport,
    Row,
    collate,
    epoch_order,
    load_samples,
    plan_rows,
    shard_sequence,
    tokenizer_mismatch,
    trajectory_totals,
)
from relearn.train.deepspeed_config import deepspeed_config
from relearn.train.engines import DeepSpeedEngine, Dist, PlainEngine, any_across, setup_distributed, shutdown, sum_across
from relearn.train.kernels import KernelReport, detect, refusal
from relearn.train.loss import step_denominator
from relearn.train.model import (
    RossLM,
    build_model,
    chunks_needed,
    enable_activation_checkpointing,
    has_linear_attention,
    parameter_count,
)
from relearn.train.options import TrainOptions, UsageError, check_options, model_config


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


@dataclass
class _Totals:
    """What this invocation trained (a resumed run counts from where it resumed)."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    supervised: int = 0
    seconds: float = 0.0

    def add(self, record: dict[str, Any]) -> None:
        self.losses.append(record["loss"])
        self.tokens += record["tokens"]
        self.supervised += record["supervised_tokens"]
        self.seconds += record["seconds"]


def train(opts: TrainOptions, console: Console | None = None) -> Summary:
    """Run (or resume) a training run into ``opts.out``. Raises ``UsageError`` for bad input."""
    console = console or Console(stderr=True)
    config = _checked_config(opts)
    # Before any process group or model: a run that asked for the fast kernels and would get
    # the reference path stops here, on every rank alike.
    kernels = detect(
        linear_attention=has_linear_attention(config),
        attn=opts.attn,
        device="cuda" if torch.cuda.is_available() else "cpu",
        mode=opts.kernels,
    )
    why = refusal(kernels)
    if why is not None:
        raise UsageError(why)
    dist = setup_distributed(opts)
    # Before the model is built: weights trained on one vocabulary's ids are never saved with another.
    tokenizer = _load_tokenizer(opts)
    mismatch = tokenizer_mismatch(opts.dataset, tokenizer, opts.tokenizer or f"--init {opts.init}'s")
    if mismatch is not None:
        raise UsageError(mismatch)
    summary = _train(opts, config, dist, console, kernels, tokenizer)
    # Not on an error: a barrier there would wait for ranks that went on without it.
    shutdown(dist)
    return summary


def _train(opts: TrainOptions, config: Any, dist: Dist, console: Console, kernels: KernelReport, tokenizer: Any) -> Summary:
    say = console.print if dist.main else (lambda *a, **k: None)
    samples, report = _load_data(opts, config, say)
    whole_counts = trajectory_totals(samples)  # per sample: its trajectory's supervised count
    identity = run_identity(opts, dist.world, opts.dataset)
    tag, saved = _existing_run(opts, identity)
    if saved.get("finished"):
        say(f"{opts.out}: this run already finished (step {saved.get('global_step')}); nothing to do")
        return _finished_before(opts, saved, report)

    # Every epoch's plan is known up front: the schedule's length depends on it (with packing
    # the number of rows changes with the order).
    layout = Layout(dist.dp_world, opts.grad_accum, opts.batch_trajectories)
    epoch_rows = [plan_rows(samples, epoch_order(len(samples), opts.seed, e), pack=opts.pack, ctx=opts.ctx) for e in range(opts.epochs)]
    steps_per_epoch = [layout.steps(len(rows)) for rows in epoch_rows]
    total_steps = sum(steps_per_epoch)
    model, engine = _build(opts, dist, total_steps, kernels)
    parameters = parameter_count(model)
    tokenizer = tokenizer if dist.main else None

    state = TrainerState(order=epoch_order(len(samples), opts.seed, 0))
    if tag is not None:
        state = load_checkpoint(engine, opts.out, tag, dist)
        say(
            f"resumed from {opts.out / CHECKPOINTS / tag} (step {state.global_step}, epoch {state.epoch + 1}, step {state.step_in_epoch} in epoch)"
        )
    resumed_from = state.global_step if tag is not None else None
    described = _described(model, kernels)
    if dist.main:
        truncate_metrics(opts.out / METRICS, state.global_step)
        run = {"identity": identity, "finished": False, "total_steps": total_steps, **described}
        write_text_atomic(opts.out / RUN_FILE, json.dumps(run, indent=1))
        engine_name = f"ZeRO-{opts.zero}" if dist.deepspeed else "plain PyTorch"
        say(
            f"training {opts.tiny or opts.init} ({parameters / 1e6:.1f}M parameters) on {len(samples)} samples "
            f"of {report.trajectories} trajectories, "
            f"{opts.epochs} epochs x {steps_per_epoch[0]} steps, world {dist.world}, "
            f"{engine_name}{f', sequence parallel {dist.sp}' if dist.sp > 1 else ''}, loss-norm {opts.loss_norm}"
        )
        say(f"{model.aux.describe() if model.aux else _no_aux(model)}; {kernels.describe()}")
        if model.linear_wrapped:
            how = [f"split by head over the {dist.sp} ranks of a row"] if dist.sp > 1 else []
            how += ["restarted at each packed trajectory"] if opts.pack else []
            say(f"linear-attention (Gated DeltaNet) layers: {' and '.join(how)}")
        if described["frozen"]["parameters"]:
            frozen = described["frozen"]
            say(f"{frozen['class']}: training the language model; {frozen['parameters']:,} other weights frozen and saved as loaded")
        carried = ignored_at_load(model.lm, Path(opts.init)) if opts.init else {}
        if opts.init:
            stage_carry(model.lm, Path(opts.init), opts.out, with_tokenizer=opts.tokenizer is None)
        if carried:
            # The MTP layer: not the model's, so untrained, but a server's speculative decoding reads it.
            kinds = ", ".join(sorted({n.split(".", 1)[0] + ".*" for n in carried}))
            say(
                f"{len(carried)} tensors of --init that {type(model.lm).__name__} ignores at load ({kinds}) are saved with the model as stored"
            )

    stop_at = min(total_steps, opts.max_steps) if opts.max_steps is not None else total_steps
    totals = _Totals()
    last_saved = state.global_step if tag is not None else -1
    stopper = StopOnSignal()
    stopped_by: int | None = None
    metrics_file = open(opts.out / METRICS, "a", encoding="utf-8") if dist.main else contextlib.nullcontext()  # noqa: SIM115
    with _progress(console, opts.progress and dist.main) as progress, stopper, metrics_file as metrics:
        bar = progress.add_task("train", total=stop_at, completed=min(state.global_step, stop_at), info="")
        while state.epoch < opts.epochs and state.global_step < stop_at and stopped_by is None:
            rows = plan_rows(samples, state.order, pack=opts.pack, ctx=opts.ctx)
            while state.step_in_epoch < layout.steps(len(rows)) and state.global_step < stop_at and stopped_by is None:
                record = _train_step(engine, samples, whole_counts, rows, layout, state, opts, dist)
                totals.add(record)
                if metrics is not None:
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
                rate = totals.supervised / max(totals.seconds, 1e-9)
                progress.update(
                    bar, advance=1, info=f"epoch {state.epoch + 1}/{opts.epochs}  loss {record['loss']:.4f}  sup tok/s {rate:,.0f}"
                )
                if opts.save_every and state.global_step % opts.save_every == 0:
                    save_checkpoint(engine, state, opts.out, dist, opts.keep_checkpoints)
                    last_saved = state.global_step
                if any_across(dist, stopper.received is not None):
                    stopped_by = stopper.received or signal.SIGTERM
            if state.step_in_epoch >= layout.steps(len(rows)):
                state.epoch += 1
                state.step_in_epoch = 0
                state.order = epoch_order(len(samples), opts.seed, state.epoch) if state.epoch < opts.epochs else []

    finished = state.global_step >= total_steps
    if not finished and last_saved != state.global_step:
        save_checkpoint(engine, state, opts.out, dist, opts.keep_checkpoints)  # stopped early: keep the position
    if stopped_by is not None:
        say(f"stopped by signal {signal.Signals(stopped_by).name} after step {state.global_step}; checkpoint written, rerun to continue")
    # On a signal there may be little time left (a preemption's grace period): the checkpoint is enough.
    model_dir = (
        save_final(
            engine,
            model,
            opts.out,
            dist,
            tokenizer,
            staged=opts.out / CARRY_DIR if opts.init else None,
            own_tokenizer=opts.tokenizer is None,
        )
        if stopped_by is None
        else None
    )
    if dist.main:
        run = {"identity": identity, "finished": finished, "total_steps": total_steps, "global_step": state.global_step, **described}
        write_text_atomic(opts.out / RUN_FILE, json.dumps(run, indent=1))
    losses = totals.losses
    return Summary(
        steps=len(losses), total_steps=total_steps, losses=losses, first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None,
        tokens=totals.tokens, supervised=totals.supervised, seconds=totals.seconds,
        supervised_per_s=totals.supervised / totals.seconds if totals.seconds else 0.0, peak_rss_gib=_peak_rss_gib(),
        peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30 if dist.device.type == "cuda" else None, resumed_from=resumed_from,
        finished=finished, model_dir=model_dir, report=report, parameters=parameters, stopped_by=stopped_by,
    )  # fmt: skip


def _train_step(
    engine: PlainEngine | DeepSpeedEngine,
    samples: list[ShardRow],
    totals: list[int],
    rows: list[Row],
    layout: Layout,
    state: TrainerState,
    opts: TrainOptions,
    dist: Dist,
) -> dict[str, Any]:
    """One optimizer step over this rank's micro-batches; advances ``state`` and returns the step's metrics."""
    step = state.step_in_epoch
    denominator, trajectories, chunks, step_tokens, step_supervised = _step_plan(
        samples, totals, rows, layout, step, opts.loss_norm, opts.chunk
    )
    # Under ZeRO-3 each LM-head call gathers its weight collectively: all ranks
    # must make the same number of calls, whatever their supervised counts.
    min_chunks = chunks if (dist.deepspeed and opts.zero == 3 and dist.world > 1) else 0
    started = time.perf_counter()
    lr = engine.lr()  # the rate this step uses (the scheduler moves on in finish_step)
    ross: RossLM = engine.model
    # The router aux loss is a statistic of a micro-batch's tokens, not a sum over them, so it
    # cannot be split like the NLL: each micro-batch's aux is averaged over the step's
    # micro-batches (all ranks), like transformers' per-batch loss under accumulation and DDP.
    micro_batches = layout.grad_accum * dist.dp_world
    aux_weight = ross.aux.coef / micro_batches if ross.aux else None
    local, local_nll, local_aux = 0.0, 0.0, 0.0
    for micro in layout.micro_rows(rows, step, dist.dp_rank):
        batch = collate(samples, micro, totals=totals)
        if dist.sp > 1:
            batch = shard_sequence(batch, dist.sp, dist.sp_rank)
        batch = batch.to(dist.device)
        loss = engine.forward(**_inputs(batch, denominator, min_chunks), aux_weight=aux_weight)
        engine.backward(loss)
        local += float(loss.detach())
        local_nll += ross.last_nll
        local_aux += (ross.last_aux or 0.0) / micro_batches
    grad_norm = engine.finish_step()
    step_loss = sum_across(dist, local)
    step_nll = sum_across(dist, local_nll)
    step_aux = sum_across(dist, local_aux) if ross.aux else None
    seconds = time.perf_counter() - started
    state.global_step += 1
    state.step_in_epoch += 1
    state.tokens += step_tokens
    state.supervised += step_supervised
    state.train_seconds += seconds
    record = {
        "step": state.global_step, "epoch": state.epoch + 1, "loss": step_loss, "nll": step_nll, "supervised_tokens": step_supervised,
        "trajectories": trajectories, "tokens": step_tokens, "tokens_per_s": step_tokens / seconds, "supervised_tokens_per_s": step_supervised / seconds,
        "lr": lr, "grad_norm": grad_norm, "seconds": seconds,
    }  # fmt: skip
    if step_aux is not None:
        # loss = nll + coef x aux_loss: the masked NLL and the routers' load-balancing loss side by side.
        record["aux_loss"] = step_aux
    return record


def _step_plan(
    samples: list[ShardRow], totals: list[int], rows: list[Row], layout: Layout, step: int, norm: str, chunk: int
) -> tuple[float, float, int, int, int]:
    """(denominator, trajectories in fractions of one, max head chunks of any micro-batch, tokens,
    supervised) of a global step."""
    step_rows = layout.step_rows(rows, step)
    counts = [samples[i].supervised for row in step_rows for i in row]
    whole = [totals[i] for row in step_rows for i in row]
    micro = [step_rows[k : k + layout.rows_per_micro] for k in range(0, len(step_rows), layout.rows_per_micro)]
    chunks = max(chunks_needed(sum(samples[i].supervised for row in m for i in row), chunk) for m in micro)
    tokens = sum(samples[i].n_tokens for row in step_rows for i in row)
    trajectories = step_denominator(counts, "trajectory", whole)
    return step_denominator(counts, norm, whole), trajectories, chunks, tokens, sum(counts)  # type: ignore[arg-type]


def _inputs(batch: Batch, denominator: float, min_chunks: int) -> dict[str, Any]:
    return dict(
        input_ids=batch.input_ids, loss_mask=batch.loss_mask, segments=batch.segments, n_segments=batch.n_segments,
        docs=batch.docs, position_ids=batch.position_ids, packed=batch.packed, denominator=float(denominator), min_chunks=min_chunks,
        targets=batch.targets, shifted=batch.shifted, real=batch.real,
        segment_counts=torch.tensor(batch.trajectory_supervised, dtype=torch.long, device=batch.input_ids.device),
    )  # fmt: skip


def _checked_config(opts: TrainOptions) -> Any:
    """The model config, once the flags alone and then flags and config together pass the checks."""
    check_options(opts)
    try:
        config = model_config(opts)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--init {opts.init}: cannot read the model config: {exc}") from None
    check_options(opts, config)
    return config


def _load_data(opts: TrainOptions, config: Any, say: Any) -> tuple[list[ShardRow], LoadReport]:
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
    return samples, report


def _existing_run(opts: TrainOptions, identity: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The latest checkpoint tag and the saved run file of ``opts.out``, once it is certain
    that resuming them continues the same run."""
    opts.out.mkdir(parents=True, exist_ok=True)
    tag = latest_checkpoint(opts.out)
    run_file = opts.out / RUN_FILE
    saved = json.loads(run_file.read_text()) if run_file.exists() else {}
    if tag is not None or saved.get("finished"):
        if not opts.resume:
            raise UsageError(
                f"{opts.out} already holds a run ({tag or 'finished'}); rerun without --no-resume to continue it, or choose another --out"
            )
        old = saved.get("identity", {})
        changed = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
        if changed:
            raise UsageError(f"{opts.out} holds a run with different settings ({', '.join(changed)}); use another --out")
    return tag, saved


def _finished_before(opts: TrainOptions, saved: dict[str, Any], report: LoadReport) -> Summary:
    return Summary(
        steps=0, total_steps=int(saved.get("total_steps", 0)), losses=[], first_loss=None, last_loss=None, tokens=0, supervised=0,
        seconds=0.0, supervised_per_s=0.0, peak_rss_gib=_peak_rss_gib(), peak_gpu_gib=None, resumed_from=None, finished=True,
        model_dir=opts.out / MODEL_DIR if (opts.out / MODEL_DIR).exists() else None, report=report, parameters=0,
    )  # fmt: skip


def _build(opts: TrainOptions, dist: Dist, total_steps: int, kernels: KernelReport) -> tuple[RossLM, PlainEngine | DeepSpeedEngine]:
    """The seeded model, wrapped for the ROSS loss, inside its engine."""
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
                stage=3,
                rows_per_micro=opts.batch_trajectories,
                grad_accum=opts.grad_accum,
                world=dist.world,
                bf16=opts.bf16,
                offload=opts.offload,
                sequence_parallel=dist.sp,
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
    if has_linear_attention(lm.config) and (dist.sp > 1 or opts.pack):
        # Gated DeltaNet layers by head shards (the same all-to-all as Ulysses, for the recurrence
        # and its convolution) and restarted at each packed trajectory: relearn.train.linear_sp.
        from relearn.train.linear_sp import install

        group = mpu.get_sequence_parallel_group() if mpu is not None else None
        used = {k.name for k in kernels.kernels if k.used}
        try:
            install(lm, sp=dist.sp, group=group, varlen_rule="fla" in used, varlen_conv="fla" in used and "causal_conv1d" in used)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    model = RossLM(lm, norm=opts.loss_norm, chunk=opts.chunk)  # type: ignore[arg-type]
    if mpu is not None:
        model.sp, model.sp_group = dist.sp, mpu.get_sequence_parallel_group()
    model.train()
    engine = DeepSpeedEngine(model, opts, total_steps, dist, mpu) if dist.deepspeed else PlainEngine(model, opts, total_steps, dist.device)
    return model, engine


def _no_aux(model: RossLM) -> str:
    from relearn.train.model import router_modules

    if router_modules(model.lm):
        return "router aux loss off (the config's output_router_logits is false)"
    return "no router aux loss (no MoE routers)"


def _described(model: RossLM, kernels: KernelReport) -> dict[str, Any]:
    """What run.json says about how the run trains: the router aux loss, the kernels, what is frozen."""
    from relearn.train.model import language_model_parameters

    aux = model.aux
    trained = language_model_parameters(model.lm)
    frozen = [n for n, _ in model.lm.named_parameters() if n not in trained]
    sizes = dict((n, getattr(p, "ds_numel", p.numel())) for n, p in model.lm.named_parameters())
    return {
        "router_aux_loss": None if aux is None else {"coef": aux.coef, "top_k": aux.top_k, "moe_layers": aux.routers},
        "kernels": kernels.to_json(),
        "frozen": {"class": type(model.lm).__name__, "tensors": len(frozen), "parameters": sum(sizes[n] for n in frozen)},
    }


def _progress(console: Console, show: bool) -> Progress:
    return Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False, disable=not show,
    )  # fmt: skip


def _load_tokenizer(opts: TrainOptions) -> Any:
    from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template

    try:
        template = resolve_chat_template(opts.chat_template) if opts.chat_template is not None else None
    except (ValueError, OSError) as exc:
        raise UsageError(f"--chat-template {opts.chat_template}: {exc}") from None
    tokenizer = None
    if opts.tokenizer is not None:
        tokenizer = load_tokenizer(opts.tokenizer)
    elif opts.init is not None:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(opts.init)
        except Exception:  # noqa: BLE001 - a weights-only folder has no tokenizer; that is allowed
            return None
    if tokenizer is not None and template is not None:
        tokenizer.chat_template = template  # a fresh object: nobody else holds it
    return tokenizer


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


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
