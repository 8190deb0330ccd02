"""`relearn import` and the pipeline's ``[pool.import]``: other tools' trajectories into a pool.

The work itself is ``harness.import_run`` (discover the files, convert, append, resume by stable
ids); this module checks the options, configures the chat importer, reports progress in bytes
and records, and counts the pool it wrote in one streaming pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zstandard

from harness.import_run import ImportFormat, ImportSummary, discover, import_files
from harness.importers import chat, harbor
from records.pools import is_zstd, iter_lines
from relearn.ops.outputs import POOL, check_jsonl_output, check_not_an_input, output_lock, prepare_parent
from relearn.ops.reporting import SILENT, OpError, OpInterrupted, Reporter, check_writable, stage
from relearn.verbs.importing import ImportOptions, misplaced_fields

__all__ = ["ImportOptions", "ImportSummary", "PoolCounts", "count_pool", "run_import"]

# How often the bar's record count is refreshed: a Parquet file is one step of bytes but many records.
RECORDS_PER_UPDATE = 100


def run_import(options: ImportOptions, reporter: Reporter = SILENT) -> ImportSummary:
    """Import ``options.paths`` into ``options.output``; a damaged file (a damaged row in row
    formats) is rejected, counted in the summary, and the batch goes on."""
    if options.format not in set(ImportFormat):
        raise OpError(f"unknown import format {options.format!r}; known: {', '.join(ImportFormat)}")
    for fmt, names in misplaced_fields(options).items():
        raise OpError(f"{', '.join('--' + n.replace('_', '-') for n in names)} only apply to the {fmt} format")
    missing = [str(p) for p in options.paths if not p.exists()]
    if missing:
        raise OpError(f"no such file or directory: {', '.join(missing)}")
    importer = None
    if options.format == ImportFormat.chat:
        try:
            importer = chat.ChatImporter(chat.options_for(options.preset, **options.chat_columns()))
        except ValueError as exc:  # an unknown preset
            raise OpError(str(exc)) from None
    elif options.format == ImportFormat.harbor:
        importer = harbor.HarborImporter(harbor.HarborOptions(**{k: v for k, v in options.harbor_fields().items() if v is not None}))  # type: ignore[arg-type]
    files = discover(options.format, options.paths, importer)
    if not files:
        raise OpError(f"no {options.format} files under {', '.join(map(str, options.paths))}")
    check_not_an_input(options.output, files)
    check_jsonl_output(options.output, POOL)
    check_writable(options.output, "-o", appended=not options.overwrite)
    prepare_parent(options.output, reporter)
    size_before = options.output.stat().st_size if options.output.is_file() else 0
    try:
        with output_lock(options.output):  # the pool's ids are read once: a second writer would append them again
            return import_reporting(
                f"importing {options.format}", options.format, files, options.output, reporter,
                salvage=options.salvage, overwrite=options.overwrite, importer=importer,
            )  # fmt: skip
    except KeyboardInterrupt:
        if options.overwrite:
            raise OpInterrupted(f"{options.output} is as it was (--overwrite swaps the new pool in at the end)", resumes=False) from None
        added = records_after(options.output, size_before)
        what = "1 trajectory was" if added == 1 else f"{added:,} trajectories were"
        raise OpInterrupted(f"{what} added to {options.output}, each whole (a rerun skips what the pool holds)") from None


def records_after(path: Path, offset: int) -> int:
    """The lines a pool gained past ``offset`` (its size before a run appended to it): the
    records it flushed, read from there on only. A ``.zst`` pool's appends are whole frames."""
    if not path.is_file():
        return 0
    with open(path, "rb") as raw:
        raw.seek(offset)
        stream: Any = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) if is_zstd(path) else raw
        return sum(chunk.count(b"\n") for chunk in iter(lambda: stream.read(1 << 20), b""))


def import_reporting(label: str, fmt: str, files: list[Path], output: Path, reporter: Reporter, **kwargs: Any) -> ImportSummary:
    """``import_files`` with its progress in input bytes, file by file, and a live count of the
    records read (one large Parquet or JSONL file is one step of the bar but many records)."""
    sizes = {path: path.stat().st_size for path in files}
    read = 0

    def on_record() -> None:
        nonlocal read
        read += 1
        if read % RECORDS_PER_UPDATE == 0:
            reporter.advance(0, records=read)

    with stage(reporter, label, total=sum(sizes.values())):
        return import_files(
            fmt, files, output, on_file=lambda path: reporter.advance(sizes[path], records=read), on_record=on_record, **kwargs
        )


class _Outcome(msgspec.Struct):
    reward: float | None = None
    resolved: bool | None = None
    verdict: dict[str, object] | None = None
    suspicious: list[str] | None = None


class _Counted(msgspec.Struct):
    """The fields of a pool line that the counts need; msgspec skips the rest unparsed."""

    exit_status: str = "unknown"
    outcome: _Outcome | None = None


_COUNT_DECODER = msgspec.json.Decoder(_Counted)


@dataclass
class PoolCounts:
    trajectories: int = 0
    graded: int = 0  # with an outcome that says resolved or gives a reward
    positive: int = 0  # verified positive (records.trajectory.is_verified_positive): resolved, or a reward > 0
    imported_grades: int = 0  # the grade is the source's (verdict.imported_from), not one of ours
    unreadable: int = 0
    exit_status: Counter[str] = field(default_factory=Counter)


def count_pool(path: Path) -> PoolCounts:
    """What a pool holds, in one pass that keeps nothing but the counts (a pool of any size)."""
    counts = PoolCounts()
    for _number, text in iter_lines(path):
        try:
            line = _COUNT_DECODER.decode(text)
        except (msgspec.DecodeError, UnicodeEncodeError):
            counts.unreadable += 1
            continue
        counts.trajectories += 1
        counts.exit_status[line.exit_status] += 1
        outcome = line.outcome
        if outcome is None or (outcome.resolved is None and outcome.reward is None):
            continue
        counts.graded += 1
        counts.imported_grades += bool(outcome.verdict and outcome.verdict.get("imported_from"))
        success = outcome.resolved if outcome.resolved is not None else (outcome.reward or 0.0) > 0.0
        counts.positive += bool(success and not outcome.suspicious)
    return counts
