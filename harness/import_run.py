"""Importing a batch: walk the inputs, convert each file, append to a pool, count.

A pool is appended to and resumed by stable trajectory ids: a rerun over the same
inputs skips what the pool already holds. A rejected file never stops the batch.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from harness.importers import FORMATS, chat, harbor
from harness.importers.base import Importer, ImportResult, conversion_error
from records.pools import JsonlWriter, RecordError, dump_line, iter_lines, loads, write_atomic
from records.trajectory import content_id, dump_record, record_content_id

# The one list of import formats (the keys of harness.importers.FORMATS, in its order): the
# `relearn import` FORMAT argument and the pipeline's [pool.import] format are made from it.
ImportFormat = StrEnum("ImportFormat", {name.replace("-", "_"): name for name in FORMATS})  # type: ignore[misc]
# Formats whose files hold many trajectories: a damaged row is rejected and the file read on.
ROW_FORMATS = frozenset({"openhands", "chat", "nemo-gym", "verl"})
# The chat format's presets (the columns of published sets) and the columns a run can rename.
ChatPreset = StrEnum("ChatPreset", {name.replace("-", "_"): name for name in chat.PRESETS})  # type: ignore[misc]
CHAT_COLUMNS = ("messages", "tools", "id", "task_id", "resolved", "patch")
# Which of a Harbor trial's trajectories to read: the richest it holds, Codex's rollout, or ATIF.
HarborTrajectory = StrEnum("HarborTrajectory", {name: name for name in harbor.TRAJECTORY_SOURCES})  # type: ignore[misc]


@dataclass
class ImportSummary:
    files: int = 0
    imported: int = 0
    skipped_existing: int = 0
    rejected: list[RecordError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unknown: Counter[str] = field(default_factory=Counter)
    messages: int = 0
    input_bytes: int = 0
    # Inputs that hold no trajectory to import, by why (``ImportResult.skipped``).
    not_imported: Counter[str] = field(default_factory=Counter)


def discover(format_name: str, inputs: Iterable[Path], importer: Importer | None = None) -> list[Path]:
    """Files to read: each file as given, and each directory walked recursively."""
    module: Importer = importer or FORMATS[format_name]
    found: list[Path] = []
    for path in inputs:
        if path.is_dir():
            found.extend(module.discover(path))
        else:
            found.append(path)
    return found


class _Source(msgspec.Struct):
    content_hash: str | None = None


class _Indexed(msgspec.Struct):
    """The two fields of a pool line that resuming needs; msgspec skips the rest unparsed."""

    id: str
    source: _Source | None = None


_INDEX_DECODER = msgspec.json.Decoder(_Indexed)


def pool_index(path: Path) -> dict[str, str | None]:
    """Id -> content hash of every trajectory already in a pool (torn lines skipped)."""
    index: dict[str, str | None] = {}
    if not path.exists():
        return index
    for _number, text in iter_lines(path):
        try:
            entry = _INDEX_DECODER.decode(text)
        except (msgspec.DecodeError, UnicodeEncodeError):
            _index_slowly(text, index)  # a line of another shape, or text msgspec refuses
            continue
        index[entry.id] = entry.source.content_hash if entry.source is not None else None
    return index


def _index_slowly(text: str, index: dict[str, str | None]) -> None:
    try:
        data = loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(data, dict) and isinstance(data.get("id"), str):
        source = data.get("source") if isinstance(data.get("source"), dict) else {}
        index[data["id"]] = source.get("content_hash")


def _claim_id(trajectory_id: str, digest: str, seen: dict[str, str | None], summary: ImportSummary) -> str | None:
    """The id under which content ``digest`` goes into the pool: its own, or where the pool
    holds other content under that id, ``<id>~<hash>``; None when the pool already has this
    very content under this id.

    A source id can be reused for other content (a Codex session resumed and grown, a
    run-scoped id): that content is kept too, never dropped. The same content under two ids is
    kept twice: RL samples of one prompt often say the same thing, and each is an attempt.
    """
    if trajectory_id in seen:
        if seen[trajectory_id] == digest:
            return None
        other = f"{trajectory_id}~{digest.removeprefix('t-')[:12]}"
        summary.warnings.append(f"{trajectory_id}: the pool holds other content under this id; imported as {other}")
        if seen.get(other) == digest:
            return None
        trajectory_id = other
    seen[trajectory_id] = digest
    return trajectory_id


def _pool_line(result: ImportResult, seen: dict[str, str | None], summary: ImportSummary) -> bytes | None:
    """The pool line of an imported trajectory, with its claimed id and content hash; None
    when the pool already holds it. A record an importer built as a dict is written as it
    stands, never validated again. A value no pool line can hold (a lone surrogate, which
    JSON text can spell) raises pydantic's error, and the id stays unclaimed."""
    record = result.record
    if record is None:
        trajectory = result.trajectory
        assert trajectory is not None
        digest = content_id(trajectory)
        claimed = _claim_id(trajectory.id, digest, seen, summary)
        if claimed is None:
            return None
        trajectory.id = claimed
        if trajectory.source is not None:
            trajectory.source.content_hash = digest
        summary.messages += len(trajectory.messages)
        return _unclaimed_on_error(claimed, seen, dump_line, trajectory)
    digest = result.content_hash or record_content_id(record)
    claimed = _claim_id(record["id"], digest, seen, summary)
    if claimed is None:
        return None
    record["id"] = claimed
    if "source" in record:
        record["source"]["content_hash"] = digest
    summary.messages += len(record["messages"])
    return _unclaimed_on_error(claimed, seen, dump_record, record) + b"\n"


def _unclaimed_on_error(claimed: str, seen: dict[str, str | None], dump: Callable[[Any], bytes], record: Any) -> bytes:
    try:
        return dump(record)
    except ValueError:
        del seen[claimed]
        raise


def import_files(
    format_name: str,
    files: list[Path],
    output: Path,
    *,
    salvage: bool = False,
    overwrite: bool = False,
    on_file: Callable[[Path], None] | None = None,
    on_record: Callable[[], None] | None = None,
    importer: Importer | None = None,
) -> ImportSummary:
    """Convert ``files`` into trajectories in ``output``.

    Records are appended and flushed as they are made; with ``overwrite`` the pool is
    written beside the old one and swapped in atomically at the end. ``importer``: one
    configured for this run (``chat`` with its columns) in place of ``FORMATS[format_name]``;
    ``on_file`` follows each file read, ``on_record`` each record of it.
    """
    summary = ImportSummary()
    seen = {} if overwrite else pool_index(output)
    lines = _convert(importer or FORMATS[format_name], files, summary, seen, salvage, on_file, on_record)
    if overwrite:
        write_atomic(output, lines)
    else:
        with JsonlWriter(output) as writer:
            for line in lines:
                writer.write(line)
    return summary


def _convert(
    module: Importer,
    files: list[Path],
    summary: ImportSummary,
    seen: dict[str, str | None],
    salvage: bool,
    on_file: Callable[[Path], None] | None,
    on_record: Callable[[], None] | None,
) -> Iterator[bytes]:
    for path in files:
        summary.files += 1
        try:
            summary.input_bytes += path.stat().st_size
        except OSError as exc:
            summary.rejected.append(RecordError(str(path), None, None, f"cannot read: {exc.strerror}"))
            continue
        # Results stream: a file of many records (a Parquet dataset) is never held whole.
        diagnostics = None
        with _collector_paused():
            for result in module.read(path, salvage=salvage):
                diagnostics = result.diagnostics  # one per file, shared by its results
                if on_record is not None:
                    on_record()
                if result.error is not None:
                    summary.rejected.append(result.error)
                    continue
                if result.skipped is not None:
                    summary.not_imported[result.skipped] += 1
                    continue
                try:
                    line = _pool_line(result, seen, summary)
                except ValueError as exc:
                    summary.rejected.append(conversion_error(path, exc))
                    continue
                if line is None:
                    summary.skipped_existing += 1
                    continue
                summary.imported += 1
                yield line
        if diagnostics is not None:
            summary.warnings.extend(diagnostics.warnings)
            summary.unknown.update(diagnostics.unknown)
        if on_file is not None:
            on_file(path)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while one file is converted: its decoded JSON,
    thousands of dicts and lists that reference counting frees with the file, would otherwise
    be traversed again and again (a tenth of import's time). What cycles the file leaves are
    collected once the collector runs again."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
