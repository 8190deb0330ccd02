"""Files of many records (JSON Lines, a JSON array, Parquet): one trajectory per row.

Row formats differ from the whole-file formats in one way that matters: a damaged row is
rejected with its file, line (or row index) and field, and the rows after it are still
read. Parquet is read one row group batch at a time (``ParquetFile.iter_batches``) and each
row is converted as it is reached, so memory holds one batch, never the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from pydantic import ValidationError

from harness.importers.base import MODELS, PLAIN, Diagnostics, ImportResult, Kinds, Plain, fail, read_json_document
from records.pools import RecordError, iter_lines, loads, parse_json_line, validation_error
from records.trajectory import Trajectory, WideFloat, is_wide, mark_wide_floats, record_content_id

JSONL_SUFFIXES = (".jsonl", ".jsonl.zst", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet", ".pq")
# Rows per Parquet batch: trajectories run to hundreds of kilobytes a row, so a batch of
# this many stays within tens of megabytes.
PARQUET_BATCH_ROWS = 64


@dataclass(frozen=True)
class RowRecord:
    """A row converted to its pool line's JSON object (see ``ImportResult.record``), valid by
    construction, with its content id where the converter computed it for the row's id."""

    record: dict[str, Any]
    content_hash: str | None = None


Converter = Callable[["Row", Diagnostics], "Trajectory | RowRecord"]


@dataclass(frozen=True)
class Row:
    """One record and where it was: a JSONL line number, or a row index (JSON arrays and
    Parquet, which have no lines worth naming)."""

    data: Any
    index: int
    line: int | None
    # Parquet gives every struct every key any row has, null where a row had none.
    null_filled: bool = False
    # JSON whose every wide float is a WideFloat (read with a ``decoder``): ``plain_or_model`` may
    # build its record without the models.
    marked: bool = False

    @property
    def prefix(self) -> str:
        """The row's name inside field paths: empty where the line number locates it."""
        return "" if self.line is not None else f"[{self.index}]"

    def field(self, name: str | None) -> str | None:
        if not self.prefix:
            return name
        return f"{self.prefix}.{name}" if name else self.prefix


def kind_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSON_SUFFIXES):
        return "json"
    return "jsonl"


def _marked_float(text: str) -> float:
    number = float(text)
    return WideFloat(number) if is_wide(number) else number


# Decodes rows with every float that ``is_wide`` marked (``WideFloat``), so that a record built of
# their values (``plain``) is written as pydantic writes it with no walk over them.
MARKED = msgspec.json.Decoder(float_hook=_marked_float)


def iter_rows(path: Path, decoder: msgspec.json.Decoder | None = None) -> Iterator[Row | RecordError]:
    """Every row of ``path``, or a located error in its place (a line that is not JSON).
    A file that cannot be read at all raises RecordError. ``decoder``: JSON Lines rows decoded
    by it (``MARKED``), as ``records.pools.loads`` takes one."""
    kind = kind_of(path)
    if kind == "parquet":
        yield from _parquet_rows(path)
    elif kind == "json":
        document = read_json_document(path)
        if decoder is not None:
            mark_wide_floats(document)
        rows = document if isinstance(document, list) else [document]
        for index, data in enumerate(rows):
            yield Row(data, index, None, marked=decoder is not None)
    else:
        for index, (number, text) in enumerate(iter_lines(path)):
            try:
                if decoder is None:
                    yield Row(parse_json_line(path, number, text), index, number)
                else:
                    yield Row(_decoded(path, number, text, decoder), index, number, marked=True)
            except RecordError as exc:
                yield exc


def _decoded(path: Path, number: int, text: str, decoder: msgspec.json.Decoder) -> Any:
    try:
        return loads(text, decoder)
    except json.JSONDecodeError:
        return parse_json_line(path, number, text)  # raises the located error


def _parquet_rows(path: Path) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise fail(path, None, None, f"not a readable Parquet file ({exc})") from None
    index = 0
    with handle:
        for batch in handle.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for data in batch.to_pylist():
                yield Row(data, index, None, null_filled=True)
                index += 1


def read_rows(
    path: Path, convert: Converter, *, empty: str = "no rows", decoder: msgspec.json.Decoder | None = None
) -> Iterator[ImportResult]:
    """Convert each row of ``path``: one result per row, a rejected row located and the rest
    read on. Every result of the file shares one Diagnostics (the batch summary reads the
    first); each trajectory's own ``source.warnings`` are the warnings its row raised. A converter
    gives a Trajectory, or a ``RowRecord`` that import writes as it stands."""
    diagnostics = Diagnostics(str(path))
    seen = False
    try:
        for row in iter_rows(path, decoder):
            seen = True
            if isinstance(row, RecordError):
                yield ImportResult(str(path), None, row, diagnostics)
                continue
            yield _convert_row(path, row, convert, diagnostics)
    except RecordError as exc:  # the file itself is unreadable: one rejection, the batch goes on
        yield ImportResult(str(path), None, exc, diagnostics)
        return
    if not seen:
        yield ImportResult(str(path), None, fail(path, None, None, empty), diagnostics)


def _convert_row(path: Path, row: Row, convert: Converter, diagnostics: Diagnostics) -> ImportResult:
    before = len(diagnostics.warnings)
    try:
        converted = convert(row, diagnostics)
    except RecordError as exc:
        return ImportResult(str(path), None, exc, diagnostics)
    except ValidationError as exc:
        located = validation_error(path, row.line, exc)
        return ImportResult(
            str(path), None, RecordError(located.path, located.line, row.field(located.field), located.message), diagnostics
        )
    except Exception as exc:  # a row our converter did not foresee: reject that row, keep going
        error = fail(path, row.line, row.field(None), f"could not be converted ({type(exc).__name__}: {exc})")
        return ImportResult(str(path), None, error, diagnostics)
    own = diagnostics.warnings[before:]
    if isinstance(converted, RowRecord):
        source = converted.record.get("source")
        if source is not None:
            if own:
                source["warnings"] = own  # after format, path, meta and records, as the model orders them
            else:
                source.pop("warnings", None)
        return ImportResult(str(path), None, None, diagnostics, record=converted.record, content_hash=converted.content_hash)
    if converted.source is not None:
        converted.source.warnings = own or None
    return ImportResult(str(path), converted, None, diagnostics)


def plain_or_model(row: Row, diagnostics: Diagnostics, convert: Callable[[Kinds], Trajectory | Plain]) -> RowRecord | Trajectory:
    """``convert`` run with the plain records (``base.PLAIN``), its trajectory as its pool line's
    JSON object; where that fails in any way (a value the model would coerce or reject, an error
    of the input), run again with the models, so that what is written, warned and rejected is the
    model path's. Only a ``marked`` row is built plain."""
    if not row.marked:
        return convert(MODELS)  # type: ignore[return-value]
    warned, unknown = len(diagnostics.warnings), dict(diagnostics.unknown)
    try:
        built = convert(PLAIN)
        assert isinstance(built, Plain)
        record = built.to_record()
        if record["id"]:
            return RowRecord(record)
        digest = record_content_id(record)  # ValueError: text no pool line holds (a lone surrogate)
    except Exception:
        # Taken back, so that the row is counted once.
        del diagnostics.warnings[warned:]
        diagnostics.unknown.clear()
        diagnostics.unknown.update(unknown)
        return convert(MODELS)  # type: ignore[return-value]
    record["id"] = digest
    return RowRecord(record, content_hash=digest)


def decode_json_text(value: Any) -> Any:
    """Datasets store nested columns as JSON text when Arrow cannot hold their shape
    (tool schemas, free-form dicts): decode such text, leave anything else alone."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def pick(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted column path (``test_result.git_patch``), decoding JSON text met
    on the way; None where any step is missing."""
    value: Any = data
    for part in path.split("."):
        value = decode_json_text(value)
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def drop_nulls(value: Any) -> Any:
    """``value`` without the null-valued keys Parquet filled in, at every depth."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value
