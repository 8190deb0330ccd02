"""``relearn train``: masked SFT (the ROSS objective) on Parquet shards from ``relearn masks``.

Runs as one process, or under ``torchrun`` / ``deepspeed`` for ZeRO-2/3 data parallelism:

    relearn train data/ --out runs/r1 --init Qwen3-1.7B/ --tokenizer qwen3.6
    torchrun --nproc_per_node 8 -m relearn.cli.train data/ --out runs/r1 --init ... --zero 3 --bf16
    deepspeed --num_gpus 8 relearn/cli/train.py data/ --out runs/r1 --init ... --zero 3 --bf16 --sp 2

``python -m relearn.cli.train`` is the same command without the ``relearn`` entry point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error
from relearn.ops.reporting import OpError
from relearn.ops.train import TrainOptions, run_train

SP_HELP = (
    "Ulysses sequence parallelism (DeepSpeed ALST, UlyssesSPAttentionHF): each group of N ranks shares one sequence, "
    "1/N of the tokens each, exchanging attention heads by all-to-all. Launch N x data-parallel ranks with torchrun; "
    "needs sdpa or flash attention and no --pack; runs on CPU (gloo) too. Refused for models with linear-attention "
    "(Gated DeltaNet) layers, such as Qwen3.5/3.6 and Qwen3-Next: DeepSpeed's Ulysses gives them wrong gradients."
)


def train_command(
    dataset: Annotated[
        Path, typer.Argument(metavar="DATASET", help="Dataset folder of shard-*.parquet (from `relearn masks`) or one Parquet file.")
    ],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoints/, metrics.jsonl, run.json, model/ (Hugging Face).")],
    init: Annotated[str | None, typer.Option(help="Model folder (Hugging Face causal LM) to start from.")] = TrainOptions.init,
    tiny: Annotated[
        str | None, typer.Option(help="Tiny random model instead of --init: qwen3 | qwen3-moe | qwen3.5-moe (tests, benchmarks).")
    ] = TrainOptions.tiny,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer saved with the final weights: `qwen3.6` or a folder (default: the --init folder's).")
    ] = TrainOptions.tokenizer,
    ctx: Annotated[
        int, typer.Option(help="Longest sequence in tokens; longer samples are refused and listed, never cut.")
    ] = TrainOptions.ctx,
    epochs: Annotated[int, typer.Option(help="Passes over the data.")] = TrainOptions.epochs,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = TrainOptions.lr,
    warmup: Annotated[
        float, typer.Option(help="Warmup: a fraction of all steps (< 1) or a number of steps; then cosine decay to 0.")
    ] = TrainOptions.warmup,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = TrainOptions.weight_decay,
    clip: Annotated[float, typer.Option(help="Gradient-norm clipping (0: off).")] = TrainOptions.clip,
    batch_trajectories: Annotated[
        int, typer.Option(help="Rows per micro-batch per rank (a row is one trajectory, or one pack with --pack).")
    ] = TrainOptions.batch_trajectories,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step per rank.")] = TrainOptions.grad_accum,
    loss_norm: Annotated[
        str, typer.Option(help="trajectory: mean over trajectories of each one's mean supervised NLL (ROSS); token: global token mean.")
    ] = TrainOptions.loss_norm,
    chunk: Annotated[
        int, typer.Option(help="Supervised positions per LM-head chunk (loss memory is ~3 x chunk x vocab x 4 bytes).")
    ] = TrainOptions.chunk,
    bf16: Annotated[
        bool, typer.Option("--bf16", help="bf16 compute (autocast, or DeepSpeed bf16 with fp32 master weights).")
    ] = TrainOptions.bf16,
    pack: Annotated[
        bool, typer.Option("--pack", help="Pack short trajectories up to --ctx; attention never crosses trajectories.")
    ] = TrainOptions.pack,
    zero: Annotated[int, typer.Option(help="DeepSpeed ZeRO stage 0 | 2 | 3 (0 and one process: plain PyTorch).")] = TrainOptions.zero,
    offload: Annotated[
        bool, typer.Option("--offload", help="ZeRO-2/3: optimizer state (and ZeRO-3 parameters) in CPU memory.")
    ] = TrainOptions.offload,
    offload_activations: Annotated[
        bool, typer.Option("--offload-activations", help="GPU: keep checkpointed activations in host memory.")
    ] = TrainOptions.offload_activations,
    attn: Annotated[
        str, typer.Option(help="Attention implementation: sdpa | flash_attention_2 | flash_attention_3 | eager.")
    ] = TrainOptions.attn,
    sp: Annotated[int, typer.Option(help=SP_HELP)] = TrainOptions.sp,
    seed: Annotated[int, typer.Option(help="Seed of the data order and of a tiny model's init.")] = TrainOptions.seed,
    save_every: Annotated[
        int,
        typer.Option(help="Checkpoint every N optimizer steps (0: only when stopping early). SIGTERM/Ctrl-C also checkpoint, then stop."),
    ] = TrainOptions.save_every,
    max_steps: Annotated[
        int | None, typer.Option(help="Stop after this many optimizer steps in all (the schedule still spans --epochs); rerun to continue.")
    ] = TrainOptions.max_steps,
    keep_checkpoints: Annotated[int, typer.Option(help="Checkpoints kept in the run folder.")] = TrainOptions.keep_checkpoints,
    resume: Annotated[bool, typer.Option(help="Continue from the run folder's latest checkpoint when there is one.")] = TrainOptions.resume,
    progress: Annotated[bool, typer.Option(help="Show the progress bar.")] = TrainOptions.progress,
    local_rank: Annotated[
        int | None, typer.Option("--local_rank", "--local-rank", hidden=True, help="Set by the `deepspeed` launcher.")
    ] = None,
) -> None:
    """Masked SFT: imitation loss only on supervised tokens, whole trajectories kept as context.

    Never materialises full logits: the LM head and cross-entropy run only at supervised positions, in checkpointed chunks. Checkpoints hold the data position; rerunning the same command resumes where a killed run stopped and reproduces its loss curve.
    """
    import os

    if local_rank is not None:  # the `deepspeed` launcher passes --local_rank; torchrun sets the variable
        os.environ.setdefault("LOCAL_RANK", str(local_rank))

    opts = TrainOptions(
        dataset=dataset, out=out_dir, init=init, tiny=tiny, tokenizer=tokenizer, ctx=ctx, epochs=epochs, lr=lr, warmup=warmup,
        weight_decay=weight_decay, clip=clip, batch_trajectories=batch_trajectories, grad_accum=grad_accum, loss_norm=loss_norm,
        chunk=chunk, bf16=bf16, pack=pack, zero=zero, offload=offload, offload_activations=offload_activations, attn=attn, sp=sp,
        seed=seed, save_every=save_every, max_steps=max_steps, keep_checkpoints=keep_checkpoints, resume=resume, progress=progress,
    )  # fmt: skip
    try:
        summary = run_train(opts, console=err)
    except OpError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    # Stopped by SIGTERM/SIGINT (after writing a checkpoint): the shell's 128 + signal number.
    code = 128 + summary.stopped_by if summary.stopped_by else EXIT_PARTIAL if summary.report.problems else EXIT_OK
    if int(os.environ.get("RANK", "0")) != 0:
        raise typer.Exit(code)
    table = Table(title=f"relearn train -> {out_dir}", show_header=False)
    rows: list[tuple[str, str]] = [
        (
            "steps this run",
            f"{summary.steps} (of {summary.total_steps}{', resumed at ' + str(summary.resumed_from) if summary.resumed_from is not None else ''})",
        ),
        ("finished", "yes" if summary.finished else "no (rerun the same command to continue)"),
        ("loss first -> last", f"{summary.first_loss:.4f} -> {summary.last_loss:.4f}" if summary.losses else "-"),
        ("tokens / supervised", f"{summary.tokens:,} / {summary.supervised:,}"),
        ("supervised tokens/s", f"{summary.supervised_per_s:,.0f}"),
        ("train time", f"{summary.seconds:.1f} s"),
        ("peak RSS", f"{summary.peak_rss_gib:.2f} GiB"),
        ("samples refused", str(len(summary.report.problems))),
        ("weights (Hugging Face)", str(summary.model_dir) if summary.model_dir else "-"),
    ]
    if summary.peak_gpu_gib is not None:
        rows.insert(7, ("peak GPU memory", f"{summary.peak_gpu_gib:.2f} GiB"))
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(_app)
    _app()
