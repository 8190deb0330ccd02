"""``relearn export``: pools as Harbor ATIF, Hugging Face chat JSON or chat-message rows, and a
compiled dataset in a trainer's own format or as its A \\ E spans.

Three operations: ``run_export_pool`` (atif, hf, chat), ``run_export_dataset`` (--for trl,
axolotl, verl, llamafactory, hf) and ``run_export_masks``. Each streams: a trajectory or a
sample is read, converted and written before the next is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from harness.exporters import chat as chat_export
from harness.exporters.atif import to_atif
from harness.exporters.hf_chat import to_chat_record
from records.pools import RecordError, read_trajectories_lenient, write_atomic, write_text_atomic
from relearn.ops.outputs import (
    CHAT_ROWS,
    HF_ROWS,
    SPANS,
    check_atif_dir,
    check_export_dir,
    check_jsonl_output,
    check_parquet_output,
    empty_pool,
    prepare_parent,
)
from relearn.ops.reporting import SILENT, OpError, Reporter, check_writable, stage
from relearn.verbs.export import DatasetExportOptions, MasksExportOptions, PoolExportOptions, PoolFormat

if TYPE_CHECKING:
    from collections.abc import Iterator

    from records.trajectory import Trajectory
    from relearn.export.source import DatasetInfo

POOL_FORMATS: tuple[str, ...] = get_args(PoolFormat)
CHAT_PRESETS = chat_export.PRESETS


@dataclass
class PoolExportSummary:
    format: str
    output: Path
    preset: str | None
    exported: int
    rejected: list[str]  # records of the pools that are not trajectories, located (file:line: why)
    refused: list[str]  # trajectories the chat preset cannot hold whole (id: why)
    warnings: list[str] = field(default_factory=list)  # nothing to export: the pools are empty

    @property
    def complete(self) -> bool:
        return not self.rejected and not self.refused


def run_export_pool(options: PoolExportOptions, reporter: Reporter = SILENT) -> PoolExportSummary:
    if options.format not in POOL_FORMATS:
        raise OpError(f"export format {options.format!r}: expected one of {', '.join(POOL_FORMATS)}")
    if options.preset is not None and options.format != "chat":
        raise OpError(f"preset {options.preset!r}: only the chat export has presets, not {options.format}")
    if options.preset is not None and options.preset not in CHAT_PRESETS:
        raise OpError(f"preset {options.preset!r}: expected one of {', '.join(CHAT_PRESETS)}")
    if not options.pools:
        raise OpError("no pool to export: name one or more pool files")
    for pool in options.pools:
        if not pool.is_file():
            raise OpError(f"{pool}: no such pool file")
    if options.format == "atif":
        check_atif_dir(options.output)
    elif options.format == "chat" and options.output.name.lower().endswith((".parquet", ".pq")):
        check_parquet_output(options.output)
    else:
        check_jsonl_output(options.output, HF_ROWS if options.format == "hf" else CHAT_ROWS)
    check_writable(options.output, "-o")
    prepare_parent(options.output, reporter)
    errors: list[RecordError] = []

    def trajectories() -> Iterator[Trajectory]:
        for pool in options.pools:
            for trajectory in read_trajectories_lenient(pool, errors):
                reporter.advance()
                yield trajectory

    refused: list[str] = []
    with stage(reporter, f"exporting as {options.format}"):
        if options.format == "atif":
            exported = _write_atif(trajectories(), options.output)
        elif options.format == "hf":
            exported = write_atomic(options.output, (to_chat_record(t) for t in trajectories()))
        else:
            written = chat_export.export_chat(trajectories(), options.output, options.preset)
            exported, refused = written.rows, written.refused or []
    summary = PoolExportSummary(options.format, options.output, options.preset, exported, [str(e) for e in errors], refused)
    if not exported and not errors and not refused:
        summary.warnings = [empty_pool(pool) for pool in options.pools]
    return summary


def _write_atif(trajectories: Iterator[Trajectory], folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for trajectory in trajectories:
        write_text_atomic(folder / f"{trajectory.id}.trajectory.json", json.dumps(to_atif(trajectory), ensure_ascii=False, indent=2))
        count += 1
    return count


@dataclass
class DatasetExportSummary:
    trainer: str
    output: Path
    rows: int
    tokens: int
    supervised: int
    skipped_unsupervised: int  # rows with no supervised token, left out
    files: list[str] = field(default_factory=list)

    @property
    def manifest(self) -> Path:
        return self.output / "relearn-export.json"

    @property
    def warnings(self) -> list[str]:
        return [] if self.rows else [f"no sample of the dataset has a supervised token: {self.output} holds no row"]


def run_export_dataset(options: DatasetExportOptions, reporter: Reporter = SILENT) -> DatasetExportSummary:
    from relearn.export.source import ExportError, open_dataset
    from relearn.export.trainers import export_dataset  # refuses a trainer it has no format for

    if options.rows_per_file < 1:
        raise OpError(f"rows per file {options.rows_per_file}: at least 1")
    check_export_dir(options.output, overwrite=options.overwrite)
    check_writable(options.output, "-o")
    try:
        info = open_dataset(options.dataset)
        if options.tokenizer is not None or options.chat_template is not None:  # what the trainer will load: checked, not used
            _checked_tokenizer(info, options.tokenizer or info.tokenizer, options.chat_template)
        with stage(reporter, f"exporting for {options.trainer}", int(info.stats.get("samples", 0))):
            written = export_dataset(
                info, options.trainer, options.output, rows_per_file=options.rows_per_file, overwrite=options.overwrite,
                on_row=reporter.advance,
            )  # fmt: skip
    except (ExportError, ValueError) as exc:
        raise OpError(str(exc)) from None
    return DatasetExportSummary(
        options.trainer, options.output, written.rows, written.tokens, written.supervised, written.skipped_unsupervised, list(written.files)
    )


@dataclass
class MasksExportSummary:
    output: Path
    samples: int
    tokenizer: str

    @property
    def warnings(self) -> list[str]:
        return [] if self.samples else [f"the dataset holds no sample: {self.output} is empty"]


def run_export_masks(options: MasksExportOptions, reporter: Reporter = SILENT) -> MasksExportSummary:
    from relearn.export.source import ExportError, open_dataset
    from relearn.export.spans import export_spans

    check_jsonl_output(options.output, SPANS)
    check_writable(options.output, "-o")
    try:
        info = open_dataset(options.dataset)
        name = options.tokenizer or info.tokenizer  # the spans are text: decoded with the ids' own tokenizer
        tokenizer = _checked_tokenizer(info, name, options.chat_template)
        with stage(reporter, "exporting spans", int(info.stats.get("samples", 0))):
            samples = export_spans(info, tokenizer, options.output, on_row=reporter.advance)
    except (ExportError, ValueError) as exc:
        raise OpError(str(exc)) from None
    return MasksExportSummary(options.output, samples, name)


def _checked_tokenizer(info: DatasetInfo, name: str, chat_template: str | None = None) -> Any:
    """The tokenizer ``name`` (rendering with ``chat_template`` where one is named), refused
    unless its ids and template are the dataset's."""
    from relearn.export.source import ExportError, check_tokenizer
    from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template, with_chat_template

    try:
        template = resolve_chat_template(chat_template) if chat_template is not None else None
    except (ValueError, OSError) as exc:
        raise ExportError(f"--chat-template {chat_template}: {exc}") from None
    try:
        tokenizer = with_chat_template(load_tokenizer(name), template)
    except OSError as exc:
        raise ExportError(f"--tokenizer {name}: {exc}") from None
    check_tokenizer(info, tokenizer, name if chat_template is None else f"{name} --chat-template {chat_template}")
    return tokenizer
