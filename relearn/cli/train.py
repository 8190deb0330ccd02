"""``relearn train``: masked SFT (the ROSS objective) on Parquet shards from ``relearn masks``.

Runs as one process, or under ``torchrun`` / ``deepspeed`` for ZeRO-2/3 data parallelism:

    relearn train data/ --out runs/r1 --init Qwen3-1.7B/ --tokenizer qwen3.6
    torchrun --nproc_per_node 8 -m relearn.cli.train data/ --out runs/r1 --init ... --zero 3 --bf16
    deepspeed --num_gpus 8 relearn/cli/train.py data/ --out runs/r1 --init ... --zero 3 --bf16 --sp 2

``python -m relearn.cli.train`` is the same command without the ``relearn`` entry point. The
flags are ``TrainOptions``' fields (``relearn.train.options``).
"""

from __future__ import annotations

import inspect
import os
from typing import Annotated

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, pairs, print_error
from relearn.ops.reporting import OpError
from relearn.ops.train import TrainOptions, run_train

# The `deepspeed` launcher passes --local_rank; torchrun sets the variable.
LOCAL_RANK = inspect.Parameter(
    "local_rank",
    inspect.Parameter.KEYWORD_ONLY,
    default=None,
    annotation=Annotated[int | None, typer.Option("--local_rank", "--local-rank", hidden=True, help="Set by the `deepspeed` launcher.")],
)


def train(options: TrainOptions, local_rank: int | None) -> None:
    if local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
    try:
        summary = run_train(options, console=err)
    except OpError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    # Stopped by SIGTERM/SIGINT (after writing a checkpoint): the shell's 128 + signal number.
    code = 128 + summary.stopped_by if summary.stopped_by else EXIT_PARTIAL if summary.report.problems else EXIT_OK
    if int(os.environ.get("RANK", "0")) != 0:
        raise typer.Exit(code)
    resumed = f", resumed at {summary.resumed_from}" if summary.resumed_from is not None else ""
    rows = [
        ("steps this run", f"{summary.steps} (of {summary.total_steps}{resumed})"),
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
    out.print(pairs(f"relearn train -> {options.out}", rows))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("train")(command(TrainOptions, train, extra=[LOCAL_RANK]))


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(_app)
    _app()
