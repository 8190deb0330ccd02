"""``relearn export``: pools as ATIF or chat JSON, compiled datasets for other trainers, and the
A \\ E spans themselves (the work: ``relearn.ops.export``)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, run_op, show_problems, show_warnings
from relearn.ops.export import (
    CHAT_PRESETS,
    DatasetExportOptions,
    MasksExportOptions,
    PoolExportOptions,
    run_export_dataset,
    run_export_masks,
    run_export_pool,
)

export_app = typer.Typer(
    help="Export pools (Harbor ATIF, Hugging Face chat JSON, chat-message datasets) and compiled datasets (TRL, axolotl, verl, LLaMA-Factory, datasets; the A \\ E spans as JSONL).",
    no_args_is_help=True,
)
PoolsArgument = Annotated[list[Path], typer.Argument(metavar="POOL", help="Pool files (.jsonl or .jsonl.zst).")]


@export_app.command("atif")
def atif_command(pools: PoolsArgument, output: Annotated[Path, typer.Option("-o", "--output", help="A directory.")]) -> None:
    """One Harbor ATIF v1.7 `<id>.trajectory.json` per trajectory (Harbor's viewer, `harbor analyze`, SkyRL)."""
    _pool_export(PoolExportOptions(pools, output, "atif"))


@export_app.command("hf")
def hf_command(pools: PoolsArgument, output: Annotated[Path, typer.Option("-o", "--output", help="A .jsonl file.")]) -> None:
    """One `{id, messages, tools}` row per trajectory, ready for `tokenizer.apply_chat_template(messages, tools=tools)`."""
    _pool_export(PoolExportOptions(pools, output, "hf"))


ChatPreset = StrEnum("ChatPreset", {name.replace("-", "_"): name for name in CHAT_PRESETS})  # type: ignore[misc]


@export_app.command("chat")
def chat_command(
    pools: PoolsArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="A .jsonl, .jsonl.zst or .parquet file.")],
    preset: Annotated[
        ChatPreset | None,
        typer.Option(
            help="Rows in the shape of a published set (what `relearn import chat --preset` reads); default: the generic OpenAI form."
        ),
    ] = PoolExportOptions.preset,
) -> None:
    """One chat-message row per trajectory: OpenAI messages (tool-call arguments as JSON text), tools, id, task, resolved, reward, patch.

    With --preset, the rows of SWE-Gym, SWE-smith, nebius SWE-agent-trajectories or SWE-rebench-openhands, so `relearn import chat --preset` reads them back to the same messages. A trajectory the preset cannot hold whole (tool calls in the text-only nebius rows) is refused and listed.
    """
    _pool_export(PoolExportOptions(pools, output, "chat", preset.value if preset else None))


def _pool_export(options: PoolExportOptions) -> None:
    summary = run_op(run_export_pool, options)
    if summary.format == "chat":
        show_problems("refused (the preset cannot hold them)", summary.refused)
    show_problems("rejected records", summary.rejected)
    shape = f"{summary.format} ({summary.preset})" if summary.preset else summary.format
    refused = f", {len(summary.refused)} refused" if summary.format == "chat" else ""
    out.print(f"exported {summary.exported} trajectories as {shape} to {summary.output}; {len(summary.rejected)} records rejected{refused}")
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_OK if summary.complete and not warned else EXIT_PARTIAL)


@export_app.command("dataset")
def dataset_command(
    dataset: Annotated[
        Path,
        typer.Argument(
            metavar="DATASET_DIR", help="A folder `relearn masks` wrote (shard-*.parquet, stats.json); any of the three contrasts."
        ),
    ],
    trainer: Annotated[str, typer.Option("--for", help="trl | axolotl | verl | llamafactory | hf")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder to write (it appears whole or not at all).")],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="The tokenizer your trainer will load (`qwen3.6` or a folder): refused unless its vocabulary and chat template are the ones the dataset was compiled with."
        ),
    ] = DatasetExportOptions.tokenizer,
    rows_per_file: Annotated[int, typer.Option(min=1, help="Rows per Parquet file.")] = DatasetExportOptions.rows_per_file,
    overwrite: Annotated[bool, typer.Option(help="Replace OUTPUT if it exists.")] = DatasetExportOptions.overwrite,
) -> None:
    """Write a compiled dataset in a trainer's own pre-tokenized format, supervising exactly the tokens its loss_mask marks.

    trl: Parquet input_ids + assistant_masks (SFTTrainer builds labels from them). axolotl: Parquet input_ids, attention_mask, labels (-100 where not supervised). llamafactory: the same as a save_to_disk folder for tokenized_path. verl: Parquet input_ids + loss_mask and relearn_verl_dataset.py for data.custom_cls. hf: sample and trajectory ids, input_ids, loss_mask, labels and a per-trajectory weight, as Parquet and save_to_disk.

    Beside the data: rows.jsonl (each row's sample and trajectory) and relearn-export.json (tokenizer, chat template hash, the loss that trainer computes and how far it is from relearn's per-trajectory loss). Rows with no supervised token are left out and counted.

    Set the trainer's length limit to at least the longest row (`relearn masks --ctx`): axolotl drops every row longer than its `sequence_len` (512 tokens unless set; its default `excess_length_strategy: drop`), and TRL cuts rows at `max_length` (1,024 unless set; `max_length=None` keeps them whole).
    """
    options = DatasetExportOptions(dataset, trainer, output, tokenizer=tokenizer, rows_per_file=rows_per_file, overwrite=overwrite)
    summary = run_op(run_export_dataset, options)
    table = Table(title=f"relearn export dataset --for {summary.trainer} -> {summary.output}", show_header=False)
    for name, value in (
        ("rows", summary.rows),
        ("tokens", summary.tokens),
        ("supervised tokens", summary.supervised),
        ("left out (nothing supervised)", summary.skipped_unsupervised),
        ("files", ", ".join(summary.files)),
    ):
        table.add_row(name, str(value))
    out.print(table)
    out.print(f"manifest: {summary.manifest}")
    raise typer.Exit(EXIT_PARTIAL if show_warnings(summary.warnings) else EXIT_OK)


@export_app.command("masks")
def masks_command(
    dataset: Annotated[Path, typer.Argument(metavar="DATASET_DIR", help="A folder `relearn masks` wrote.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL file (.jsonl or .jsonl.zst).")],
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer to decode with (default: the one the dataset records); refused unless it is that one.")
    ] = MasksExportOptions.tokenizer,
) -> None:
    """Write each sample's A \\ E selection as JSONL: the rendered text, the supervised token runs [start, end) and the same runs as character ranges of the text.

    A trainer with another tokenization supervises the tokens lying wholly inside a character range; one with this tokenizer can use the token runs.
    """
    summary = run_op(run_export_masks, MasksExportOptions(dataset, output, tokenizer=tokenizer))
    out.print(f"exported the A \\ E spans of {summary.samples} samples to {summary.output}")
    raise typer.Exit(EXIT_PARTIAL if show_warnings(summary.warnings) else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
