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


# `--plan` only: the launch's size, a named model shape, JSON output.
PLAN_EXTRA = [
    inspect.Parameter(
        "gpus_per_node", inspect.Parameter.KEYWORD_ONLY, default=1,
        annotation=Annotated[int, typer.Option("--gpus-per-node", min=1, metavar="N", help="--plan: GPUs (processes) per node of the launch.")],
    ),
    inspect.Parameter(
        "nodes", inspect.Parameter.KEYWORD_ONLY, default=1,
        annotation=Annotated[int, typer.Option("--nodes", min=1, metavar="N", help="--plan: nodes of the launch.")],
    ),
    inspect.Parameter(
        "shape", inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[
            str | None,
            typer.Option("--shape", metavar="NAME", help="--plan: a named model shape instead of --init/--tiny (no weights needed): qwen3.6-35b-a3b, qwen3-30b-a3b."),
        ],
    ),
    inspect.Parameter(
        "json_out", inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[str | None, typer.Option("--json", metavar="FILE", help="--plan: write the plan as JSON to this file (`-`: stdout, no table).")],
    ),
]  # fmt: skip


def plan(options: TrainOptions, gpus_per_node: int, nodes: int, shape: str | None, json_out: str | None) -> None:
    """``--plan``: the memory per GPU of the configuration, by part, and whether it fits."""
    import json
    from pathlib import Path

    from records.pools import write_text_atomic
    from relearn.cli.output import grid
    from relearn.train.options import UsageError
    from relearn.train.plan import describe, plan_options, table_rows, to_json, verdict_lines

    try:
        estimate, alternatives = plan_options(options, gpus_per_node=gpus_per_node, nodes=nodes, shape=shape)
    except UsageError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    report = {**to_json(estimate), "fits_with": {k: to_json(v) if v else None for k, v in alternatives.items()}}
    if json_out == "-":
        out.file.write(json.dumps(report, indent=1) + "\n")
        raise typer.Exit(EXIT_OK)
    if json_out:
        write_text_atomic(Path(json_out), json.dumps(report, indent=1))
    out.print(grid(f"relearn train --plan: {describe(estimate)}", ("part", "per GPU", "what"), table_rows(estimate)), highlight=False)
    for line in verdict_lines(estimate, alternatives):
        out.print(line, highlight=False, markup=False)
    if estimate.shape.source:
        out.print(f"model figures: {estimate.shape.source}", highlight=False, markup=False, style="dim")
    raise typer.Exit(EXIT_OK)


def train(
    options: TrainOptions,
    local_rank: int | None,
    gpus_per_node: int = 1,
    nodes: int = 1,
    shape: str | None = None,
    json_out: str | None = None,
) -> None:
    if options.plan:
        plan(options, gpus_per_node, nodes, shape, json_out)
    if options.dataset is None or options.out is None:
        print_error("give DATASET and --out (only --plan goes without them)")
        raise typer.Exit(EXIT_USAGE)
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


def _train_verb() -> object:
    """The verb from ``TrainOptions``, with DATASET and --out optional on the command line: ``--plan`` needs neither."""
    verb = command(TrainOptions, train, extra=[LOCAL_RANK, *PLAN_EXTRA])
    signature = inspect.signature(verb)
    verb.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(default=None) if p.name in ("dataset", "out") else p for p in signature.parameters.values()]
    )
    return verb


def register(app: typer.Typer) -> None:
    app.command("train")(_train_verb())


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(_app)
    _app()
