"""Reading a compiled dataset for export: its samples streamed shard by shard, and what its
token ids mean (the tokenizer and chat template recorded in its ``stats.json``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relearn.masks.rows import RowProblem, ShardError, ShardRow, iter_rows


class ExportError(ValueError):
    """The dataset cannot be exported as asked (exit code 2): nothing was written."""


@dataclass(frozen=True)
class DatasetInfo:
    path: Path
    stats: dict[str, Any]
    shards: list[Path]

    @property
    def tokenizer(self) -> str:
        return str(self.stats.get("tokenizer", ""))


def open_dataset(path: Path) -> DatasetInfo:
    stats_path = path / "stats.json"
    if not stats_path.is_file():
        raise ExportError(f"{path}: no stats.json (not a folder `relearn masks` wrote)")
    try:
        stats = json.loads(stats_path.read_text())
    except ValueError as exc:
        raise ExportError(f"{stats_path}: not JSON ({exc})") from None
    if "tokenizer_fingerprint" not in stats:
        raise ExportError(
            f"{stats_path}: records no tokenizer fingerprint (compiled by an older relearn); rerun `relearn masks` on it, which reuses its shards"
        )
    shards = sorted(path.glob("shard-*.parquet"))
    if not shards:
        raise ExportError(f"{path}: no shard-*.parquet")
    return DatasetInfo(path, stats, shards)


def iter_samples(info: DatasetInfo) -> Iterator[ShardRow]:
    """Every sample in shard order, a batch of rows at a time (``relearn.masks.rows``)."""
    try:
        for row in iter_rows(info.shards):
            if isinstance(row, RowProblem):
                raise ExportError(str(row))
            yield row
    except ShardError as exc:
        raise ExportError(str(exc)) from None


def check_tokenizer(info: DatasetInfo, tokenizer: Any, name: str) -> None:
    """Refuse a tokenizer whose ids or template differ from the dataset's: the ids would mean
    other text, and the trainer would silently learn from it."""
    from relearn.masks.shards import chat_template_sha256, tokenizer_fingerprint

    template = chat_template_sha256(tokenizer)
    compiled = str(info.stats.get("chat_template_sha256"))
    if template != compiled:
        shipped = shipped_template_named(compiled)
        hint = f"; it was trl's {shipped}: add --chat-template {shipped}" if shipped else ""
        raise ExportError(
            f"--tokenizer {name}: its chat template (sha256 {template[:12]}) is not the one {info.path} was compiled with ({compiled[:12]}, {info.tokenizer}){hint}"
        )
    if tokenizer_fingerprint(tokenizer) != info.stats["tokenizer_fingerprint"]:
        raise ExportError(
            f"--tokenizer {name}: its vocabulary or normaliser is not that of {info.tokenizer}, which {info.path} was compiled with; the token ids would mean other text"
        )


def shipped_template_named(sha256: str) -> str | None:
    """The name of the template trl ships whose text has this sha256, if one has: what to pass
    as --chat-template to render as a dataset compiled with it did."""
    import hashlib

    from relearn.masks.tokenizers import trl_chat_templates

    for path in sorted(trl_chat_templates().glob("*.jinja")):
        if hashlib.sha256(path.read_text(encoding="utf-8").encode()).hexdigest() == sha256:
            return path.stem
    return None
