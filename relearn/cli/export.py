"""``relearn export``: pools as ATIF or chat JSON, compiled datasets for other trainers, and the
A \\ E spans themselves."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.exporters import chat as chat_export
from harness.exporters.atif import to_atif
from harness.exporters.hf_chat import to_chat_record
from records.pools import RecordError, read_trajectories_lenient, write_atomic, write_text_atomic
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems

if TYPE_CHECKING:
    from relearn.export.source import DatasetInfo

export_app = typer.Typer(
    help="Export pools (Harbor ATIF, Hugging Face chat JSON, chat-message datasets) and compiled datasets (TRL, axolotl, verl, LLaMA-Factory, datasets; the A \\ E spans as JSONL).",
    no_args_is_help=True,
)
PoolsArgument = Annotated[list[Path], typer.Argument(help="Pool files (.jsonl or .jsonl.zst).")]


@export_app.command("atif")
def atif_command(pools: PoolsArgument, output: Annotated[Path, typer.Option("-o", "--output", help="A directory.")]) -> None:
    """One Harbor ATIF v1.7 `<id>.trajectory.json` per trajectory (Harbor's viewer, `harbor analyze`, SkyRL)."""
    errors: list[RecordError] = []
    count = 0
    output.mkdir(parents=True, exist_ok=True)
    for pool in pools:
        for trajectory in read_trajectories_lenient(pool, errors):
            write_text_atomic(output / f"{trajectory.id}.trajectory.json", json.dumps(to_atif(trajectory), ensure_ascii=False, indent=2))
            count += 1
    _pool_summary(count, "atif", output, errors)


@export_app.command("hf")
def hf_command(pools: PoolsArgument, output: Annotated[Path, typer.Option("-o", "--output", help="A .jsonl file.")]) -> None:
    """One `{id, messages, tools}` row per trajectory, ready for `tokenizer.apply_chat_template(messages, tools=tools)`."""
    errors: list[RecordError] = []
    count = write_atomic(output, (to_chat_record(t) for pool in pools for t in read_trajectories_lenient(pool, errors)))
    _pool_summary(count, "hf", output, errors)


ChatPreset = StrEnum("ChatPreset", {name.replace("-", "_"): name for name in chat_export.PRESETS})  # type: ignore[misc]


@export_app.command("chat")
def chat_command(
    pools: PoolsArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="A .jsonl, .jsonl.zst or .parquet file.")],
    preset: Annotated[
        ChatPreset | None,
        typer.Option(
            help="Rows in the shape of a published set (what `relearn import chat --preset` reads); default: the generic OpenAI form."
        ),
    ] = None,
) -> None:
    """One chat-message row per trajectory: OpenAI messages (tool-call arguments as JSON text), tools, id, task, resolved, reward, patch.

    With --preset, the rows of SWE-Gym, SWE-smith, nebius SWE-agent-trajectories or SWE-rebench-openhands, so `relearn import chat --preset` reads them back to the same messages. A trajectory the preset cannot hold whole (tool calls in the text-only nebius rows) is refused and listed. Exit codes: 0 written, 1 written with records rejected or refused.
    """
    errors: list[RecordError] = []
    name = preset.value if preset else None
    summary = chat_export.export_chat((t for pool in pools for t in read_trajectories_lenient(pool, errors)), output, name)
    show_problems("refused (the preset cannot hold them)", summary.refused or [])
    show_problems("rejected records", [str(e) for e in errors])
    out.print(
        f"exported {summary.rows} trajectories as chat{f' ({name})' if name else ''} to {output}; {len(errors)} records rejected, {len(summary.refused or [])} refused"
    )
    raise typer.Exit(EXIT_PARTIAL if errors or summary.refused else EXIT_OK)


def _pool_summary(count: int, fmt: str, output: Path, errors: list[RecordError]) -> None:
    show_problems("rejected records", [str(e) for e in errors])
    out.print(f"exported {count} trajectories as {fmt} to {output}; {len(errors)} records rejected")
    raise typer.Exit(EXIT_PARTIAL if errors else EXIT_OK)


def _progress(label: str, total: int) -> tuple[Progress, int]:
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True)
    return progress, progress.add_task(label, total=total)


def _open(dataset: Path, tokenizer: str | None) -> tuple[DatasetInfo, Any]:
    """The dataset and, when ``tokenizer`` is named, that tokenizer checked against it."""
    from relearn.export.source import check_tokenizer, open_dataset
    from relearn.masks.tokenizers import load_tokenizer

    info = open_dataset(dataset)
    if tokenizer is None:
        return info, None
    tok = load_tokenizer(tokenizer)
    check_tokenizer(info, tok, tokenizer)
    return info, tok


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
    ] = None,
    rows_per_file: Annotated[int, typer.Option(min=1, help="Rows per Parquet file.")] = 10_000,
    overwrite: Annotated[bool, typer.Option(help="Replace OUTPUT if it exists.")] = False,
) -> None:
    """Write a compiled dataset in a trainer's own pre-tokenized format, supervising exactly the tokens its loss_mask marks.

    trl: Parquet input_ids + assistant_masks (SFTTrainer builds labels from them). axolotl: Parquet input_ids, attention_mask, labels (-100 where not supervised). llamafactory: the same as a save_to_disk folder for tokenized_path. verl: Parquet input_ids + loss_mask and relearn_verl_dataset.py for data.custom_cls. hf: sample and trajectory ids, input_ids, loss_mask, labels and a per-trajectory weight, as Parquet and save_to_disk.

    Beside the data: rows.jsonl (each row's sample and trajectory) and relearn-export.json (tokenizer, chat template hash, the loss that trainer computes and how far it is from relearn's per-trajectory loss). Rows with no supervised token are left out and counted. Exit codes: 0 written, 2 refused (nothing written).
    """
    from relearn.export.source import ExportError
    from relearn.export.trainers import export_dataset

    try:
        info, _tok = _open(dataset, tokenizer)
        progress, bar = _progress(f"exporting for {trainer}", int(info.stats.get("samples", 0)))
        with progress:
            summary = export_dataset(
                info, trainer, output, rows_per_file=rows_per_file, overwrite=overwrite, on_row=lambda: progress.advance(bar)
            )
    except (ExportError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    table = Table(title=f"relearn export dataset --for {trainer} -> {output}", show_header=False)
    for name, value in (
        ("rows", summary.rows),
        ("tokens", summary.tokens),
        ("supervised tokens", summary.supervised),
        ("left out (nothing supervised)", summary.skipped_unsupervised),
        ("files", ", ".join(summary.files)),
    ):
        table.add_row(name, str(value))
    out.print(table)
    out.print(f"manifest: {output / 'relearn-export.json'}")
    raise typer.Exit(EXIT_OK)


@export_app.command("masks")
def masks_command(
    dataset: Annotated[Path, typer.Argument(metavar="DATASET_DIR", help="A folder `relearn masks` wrote.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL file (.jsonl or .jsonl.zst).")],
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer to decode with (default: the one the dataset records); refused unless it is that one.")
    ] = None,
) -> None:
    """Write each sample's A \\ E selection as JSONL: the rendered text, the supervised token runs [start, end) and the same runs as character ranges of the text.

    A trainer with another tokenization supervises the tokens lying wholly inside a character range; one with this tokenizer can use the token runs. Exit codes: 0 written, 2 refused.
    """
    from relearn.export.source import ExportError
    from relearn.export.spans import export_spans

    try:
        info, tok = _open(dataset, tokenizer)
        if tok is None:
            info, tok = _open(dataset, info.tokenizer)
        progress, bar = _progress("exporting spans", int(info.stats.get("samples", 0)))
        with progress:
            count = export_spans(info, tok, output, on_row=lambda: progress.advance(bar))
    except (ExportError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    out.print(f"exported the A \\ E spans of {count} samples to {output}")
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
