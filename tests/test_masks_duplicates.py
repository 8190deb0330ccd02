"""A pool holding one trajectory id twice (issue 47): `relearn masks` compiles the first line of
the id and rejects each later one, counted with its reason (same content or not), in the same
shard or another, one worker or two, resumed or not; the exit code says so."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from relearn.cli.main import app as cli_app
from relearn.masks.shards import DUPLICATE_DIFFERS, DUPLICATE_SAME
from relearn.ops.masks import run_masks
from relearn.verbs.masks import MasksOptions
from tests.test_masks import BASE, trajectory


def _line(trajectory_id: str, user: str = "Fix add() in calc.py.") -> str:
    messages = copy.deepcopy(BASE)
    messages[1]["content"] = user
    return trajectory(messages, id=trajectory_id, task_id="calc").model_dump_json() + "\n"


def _pool(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines))
    return path


# Shards of two lines: [a, a] [b, c] [b', d]: "a" repeated identically in its shard, "b" with
# other content in the next one.
LINES = [
    _line("a"),
    _line("a"),
    _line("b", "MARK-FIRST fix add()."),
    _line("c"),
    _line("b", "MARK-SECOND fix add()."),
    _line("d"),
]


def _sample_ids(folder: Path) -> list[str]:
    return [i for shard in sorted(folder.glob("shard-*.parquet")) for i in pq.read_table(shard).column("sample_id").to_pylist()]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_repeated_id_is_compiled_once_and_its_repeats_counted(tok, tmp_path: Path) -> None:  # noqa: ANN001
    pool = _pool(tmp_path / "pool.jsonl", LINES)
    out = tmp_path / "dataset"
    summary = run_masks(MasksOptions(pool=pool, output=out, mode="positive", shard_size=2), tokenizer=tok)
    stats = summary.stats
    assert stats["shards"] == 3 and stats["trajectories_in"] == 6 and stats["trajectories_out"] == 4
    ids = _sample_ids(out)
    assert len(ids) == len(set(ids)) == stats["samples"] == 4
    assert stats["rejected"] == {DUPLICATE_SAME: 1, DUPLICATE_DIFFERS: 1}
    same, differs = stats["rejections"]
    assert same == {"trajectory_id": "a", "reason": DUPLICATE_SAME, "detail": "line 2 repeats line 1"}
    assert differs["trajectory_id"] == "b" and differs["reason"] == DUPLICATE_DIFFERS
    assert differs["detail"].startswith("line 5 differs from line 3, which is compiled (content ")
    assert summary.invalid == stats["rejected"] and summary.partial  # a problem with the input: exit 1
    # The first line of "b" is the one compiled.
    (row,) = [r for r in pq.read_table(out / "shard-00001.parquet").to_pylist() if r["trajectory_id"] == "b"]
    text = tok.decode(row["input_ids"])
    assert "MARK-FIRST" in text and "MARK-SECOND" not in text

    # A rerun keeps every shard, byte for byte.
    before = _files(out)
    again = run_masks(MasksOptions(pool=pool, output=out, mode="positive", shard_size=2), tokenizer=tok)
    assert again.reused == 3 and again.stats == stats and _files(out) == before


def test_a_resumed_build_rejects_a_line_its_earlier_shard_kept(tok, tmp_path: Path) -> None:  # noqa: ANN001
    """Shard 1's bytes are unchanged, but an edit to shard 0 makes its line a repeat: the shard's
    digest holds its repeated lines, so it is compiled again, not kept."""
    pool = tmp_path / "pool.jsonl"
    out = tmp_path / "dataset"
    _pool(pool, [_line("x"), _line("y"), _line("a"), _line("c")])
    first = run_masks(MasksOptions(pool=pool, output=out, mode="positive", shard_size=2), tokenizer=tok)
    assert first.stats["samples"] == 4 and not first.stats["rejected"]
    _pool(pool, [_line("a"), _line("y"), _line("a"), _line("c")])
    resumed = run_masks(MasksOptions(pool=pool, output=out, mode="positive", shard_size=2), tokenizer=tok)
    assert resumed.reused == 0 and resumed.stats["rejected"] == {DUPLICATE_SAME: 1}
    ids = _sample_ids(out)
    assert len(ids) == len(set(ids)) == 3
    # The same as a build from nothing.
    fresh = run_masks(MasksOptions(pool=pool, output=tmp_path / "fresh", mode="positive", shard_size=2), tokenizer=tok)
    assert fresh.stats == resumed.stats and _files(tmp_path / "fresh") == _files(out)


def _cli_masks(pool: Path, out: Path, *extra: str) -> str:
    args = ["masks", str(pool), "-o", str(out), "--mode", "positive", "--shard-size", "2", *extra]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 1, result.output  # rejections are exit 1 (README)
    return " ".join(result.output.replace("│", " ").split())


def test_cli_lists_the_repeats_and_exits_1(tok, tmp_path: Path, tokenizer_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("RELEARN_CACHE", str(tokenizer_cache))
    pool = _pool(tmp_path / "pool.jsonl", LINES)
    words = _cli_masks(pool, tmp_path / "one")
    assert "rejected (2):" in words
    assert f"a: {DUPLICATE_SAME}: line 2 repeats line 1" in words and f"b: {DUPLICATE_DIFFERS}: line 5 differs" in words
    stats = json.loads((tmp_path / "one" / "stats.json").read_text())
    assert stats["rejected"] == {DUPLICATE_SAME: 1, DUPLICATE_DIFFERS: 1} and stats["samples"] == 4
    before = _files(tmp_path / "one")
    assert "shards (reused) 3 (3)" in _cli_masks(pool, tmp_path / "one")  # resumed: the same bytes
    assert _files(tmp_path / "one") == before


@pytest.mark.slow  # worker processes each load the tokenizer
def test_two_workers_write_the_same_bytes(tok, tmp_path: Path, tokenizer_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("RELEARN_CACHE", str(tokenizer_cache))  # (the worker processes load it by name)
    pool = _pool(tmp_path / "pool.jsonl", LINES)
    _cli_masks(pool, tmp_path / "one")
    _cli_masks(pool, tmp_path / "two", "--workers", "2")
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    assert len(set(_sample_ids(tmp_path / "two"))) == 4
