"""Outputs that cannot destroy data, and runs that matched nothing (issue 37): every verb that
writes an output is run against an existing file that is not its output, a folder that is not
its own, another pool's reviews and an empty pool. Each must exit 1 or 2 with one line that
names the path, and no file but the command's own output may change (every file's bytes are
compared before and after)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from records.pools import write_atomic
from records.review import Review
from relearn.cli.main import app
from relearn.ops.masks import run_masks
from relearn.ops.outputs import POOL, REVIEWS, check_dataset_dir, check_jsonl_output
from relearn.ops.reporting import OpError
from relearn.verbs.masks import MasksOptions
from tests.conftest import SAMPLES
from tests.test_masks import BASE, trajectory

CODEX = "codex_rollout_v0.135.0_exec.jsonl"
PREDICTIONS = "swebench_verified_2_gold_predictions.jsonl"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def changed(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tok) -> Path:  # noqa: ANN001
    """A pool and its reviews and dataset, another pool's reviews, an empty pool, and the things
    an output must not overwrite: a JSON document, a binary file, someone's folder."""
    root = tmp_path_factory.mktemp("world")
    good, other = trajectory(BASE), trajectory(BASE, task_id="other-task")
    write_atomic(root / "pool.jsonl", [good, other])
    write_atomic(root / "other-pool.jsonl", [trajectory(BASE, task_id="elsewhere")])
    (root / "reviews.jsonl").write_text(
        "".join(Review(trajectory_id=t.id, decision="accept").model_dump_json() + "\n" for t in (good, other))
    )
    (root / "other-reviews.jsonl").write_text(Review(trajectory_id="not-in-the-pool", decision="accept").model_dump_json() + "\n")
    (root / "rejecting.jsonl").write_text(
        "".join(Review(trajectory_id=t.id, decision="reject", reason="wrong").model_dump_json() + "\n" for t in (good, other))
    )
    (root / "empty.jsonl").write_bytes(b"")
    (root / "no-reviews.jsonl").write_bytes(b"")
    (root / "rollouts.jsonl").write_text(json.dumps({"prompt": "1+1?", "response": "2", "reward": 1.0, "task_id": "t"}) + "\n")
    (root / "stats.json").write_text(json.dumps({"mode": "ross", "note": "a JSON document"}, indent=1))
    (root / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (root / "stats.parquet").write_text("not parquet\n")
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("someone's notes\n")
    run_masks(MasksOptions(root / "pool.jsonl", root / "dataset", root / "reviews.jsonl"), tokenizer=tok)
    shutil.copy(SAMPLES / CODEX, root / CODEX)
    shutil.copy(SAMPLES / PREDICTIONS, root / PREDICTIONS)
    return root


@pytest.fixture
def world(base: Path, tmp_path: Path, tokenizer_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of ``base`` as the working folder."""
    monkeypatch.setenv("RELEARN_CACHE", str(tokenizer_cache))  # the CLI's qwen3.6: the one `tok` built
    root = tmp_path / "world"
    shutil.copytree(base, root)
    monkeypatch.chdir(root)
    return root


def relearn(*args: str) -> tuple[int, list[str]]:
    """Exit code and the non-blank lines on stderr."""
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, [line for line in result.stderr.splitlines() if line.strip()]


REFUSED = [
    # (a) an existing file that is not what the verb writes
    ("import codex", ["import", "codex", CODEX, "-o", "stats.json"], "stats.json"),
    ("import into binary", ["import", "codex", CODEX, "-o", "image.bin"], "image.bin"),
    ("import into reviews", ["import", "codex", CODEX, "-o", "reviews.jsonl"], "reviews.jsonl"),
    ("review", ["review", "pool", "pool.jsonl", "--reviewer", "heuristic", "-o", "stats.json"], "stats.json"),
    ("review into the pool", ["review", "pool", "pool.jsonl", "--reviewer", "heuristic", "-o", "pool.jsonl"], "pool.jsonl"),
    ("verify", ["verify", "--patches", PREDICTIONS, "-o", "stats.json"], "stats.json"),
    ("masks into a file", ["masks", "pool.jsonl", "--mode", "positive", "-o", "stats.json"], "stats.json"),
    ("export hf", ["export", "hf", "pool.jsonl", "-o", "stats.json"], "stats.json"),
    ("export hf into reviews", ["export", "hf", "pool.jsonl", "-o", "reviews.jsonl"], "reviews.jsonl"),
    ("export chat", ["export", "chat", "pool.jsonl", "-o", "image.bin"], "image.bin"),
    ("export hf over the pool", ["export", "hf", "pool.jsonl", "-o", "pool.jsonl"], "pool.jsonl"),
    ("export chat over the reviews", ["export", "chat", "pool.jsonl", "-o", "reviews.jsonl"], "reviews.jsonl"),
    ("import the pool into itself", ["import", "chat", "pool.jsonl", "-o", "pool.jsonl"], "pool.jsonl"),
    ("export chat parquet", ["export", "chat", "pool.jsonl", "-o", "stats.parquet"], "stats.parquet"),
    ("export masks", ["export", "masks", "dataset", "-o", "stats.json"], "stats.json"),
    ("stats --json", ["stats", "pool.jsonl", "--no-cache", "--json", "image.bin"], "image.bin"),
    ("stats --plots", ["stats", "pool.jsonl", "--no-cache", "--plots", "stats.json"], "stats.json"),
    # (b) a folder that is not the verb's
    ("import into a folder", ["import", "codex", CODEX, "-o", "foreign"], "foreign"),
    ("masks into a foreign folder", ["masks", "pool.jsonl", "--mode", "positive", "-o", "foreign"], "foreign"),
    ("export dataset --overwrite", ["export", "dataset", "dataset", "--for", "trl", "-o", "foreign", "--overwrite"], "foreign"),
    ("export dataset over the dataset", ["export", "dataset", "dataset", "--for", "trl", "-o", "dataset", "--overwrite"], "dataset"),
    ("export atif", ["export", "atif", "pool.jsonl", "-o", "foreign"], "foreign"),
    ("single-turn import", ["single-turn", "import", "rollouts.jsonl", "-o", "stats.json"], "stats.json"),
    ("single-turn review", ["single-turn", "review", "pool.jsonl", "--judge", "m", "-o", "stats.json"], "stats.json"),
    ("collect", ["collect", "--out", "foreign", "--model", "m"], "foreign"),
    ("eval run", ["eval", "run", "--out", "foreign", "--model", "m"], "foreign"),
    ("train", ["train", "dataset", "--out", "foreign", "--tiny", "qwen3"], "foreign"),
]


@pytest.mark.parametrize(("args", "path"), [pytest.param(a, p, id=i) for i, a, p in REFUSED])
def test_an_output_that_is_not_the_verbs_is_refused(world: Path, args: list[str], path: str) -> None:
    before = snapshot(world)
    code, lines = relearn(*args)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error:") and path in lines[0], lines
    assert "Traceback" not in lines[0]
    assert changed(before, snapshot(world)) == set()


MATCHED_NOTHING = [
    # (c) reviews or a dataset of another pool
    ("masks, another pool's reviews", ["masks", "pool.jsonl", "-r", "other-reviews.jsonl", "-o", "new"], "other-reviews.jsonl", "new"),
    ("stats, another pool's reviews", ["stats", "pool.jsonl", "--no-cache", "-r", "other-reviews.jsonl"], "other-reviews.jsonl", None),
    ("stats, another pool's dataset", ["stats", "other-pool.jsonl", "--no-cache", "-d", "dataset"], "dataset", None),
    # (d) an empty pool
    ("masks, empty pool", ["masks", "empty.jsonl", "--mode", "positive", "-o", "new"], "empty.jsonl", "new"),
    ("review, empty pool", ["review", "pool", "empty.jsonl", "--reviewer", "heuristic", "-o", "new.jsonl"], "empty.jsonl", "new.jsonl"),
    ("stats, empty pool", ["stats", "empty.jsonl", "--no-cache"], "empty.jsonl", None),
    ("validate, empty pool", ["validate", "empty.jsonl"], "empty.jsonl", None),
    ("export hf, empty pool", ["export", "hf", "empty.jsonl", "-o", "new.jsonl"], "empty.jsonl", "new.jsonl"),
    ("export atif, empty pool", ["export", "atif", "empty.jsonl", "-o", "new"], "empty.jsonl", "new"),
    ("masks, an empty reviews file", ["masks", "pool.jsonl", "-r", "no-reviews.jsonl", "-o", "new"], "no-reviews.jsonl", "new"),
    # a filter that keeps nothing: every trajectory of the pool is rejected by its review
    ("masks, nothing kept", ["masks", "pool.jsonl", "-r", "rejecting.jsonl", "-o", "new"], "pool.jsonl", "new"),
]


@pytest.mark.parametrize(("args", "path", "output"), [pytest.param(a, p, o, id=i) for i, a, p, o in MATCHED_NOTHING])
def test_a_run_that_matched_nothing_warns_and_exits_1(world: Path, args: list[str], path: str, output: str | None) -> None:
    before = snapshot(world)
    code, lines = relearn(*args)
    assert code == 1, lines
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and path in warnings[0], lines
    assert all(name == output or name.startswith(f"{output}/") for name in changed(before, snapshot(world))), output


def test_the_masks_summary_says_what_matched(base: Path, tmp_path: Path, tok) -> None:  # noqa: ANN001
    """The facts the pipeline's masks stage fails on: another pool's reviews, an empty pool."""
    foreign = run_masks(MasksOptions(base / "pool.jsonl", tmp_path / "a", base / "other-reviews.jsonl"), tokenizer=tok)
    assert (foreign.records, foreign.reviewed, foreign.matched, foreign.foreign_reviews) == (2, 1, 0, True)
    assert foreign.stats["samples"] == 0 and "another pool's reviews" in foreign.warnings[0]
    own = run_masks(MasksOptions(base / "pool.jsonl", tmp_path / "b", base / "reviews.jsonl"), tokenizer=tok)
    assert (own.records, own.reviewed, own.matched, own.foreign_reviews, own.warnings) == (2, 2, 2, False, [])
    empty = run_masks(MasksOptions(base / "empty.jsonl", tmp_path / "c", mode="positive"), tokenizer=tok)
    assert empty.records == 0 and empty.warnings == [f"the pool {base / 'empty.jsonl'} is empty: nothing to do"]


def test_the_verbs_own_outputs_are_still_written(world: Path) -> None:
    """What each verb wrote before is what it may write again: a pool is appended to (plain or
    zstd), a dataset folder recompiled, an export replaced with --overwrite."""
    assert relearn("import", "codex", CODEX, "-o", "pool.jsonl")[0] == 0
    assert relearn("import", "codex", CODEX, "-o", "pool.jsonl.zst")[0] == 0
    assert relearn("import", "codex", CODEX, "-o", "pool.jsonl.zst")[0] == 0  # the compressed pool is recognised
    assert relearn("masks", "pool.jsonl", "-r", "reviews.jsonl", "-o", "dataset")[0] == 0
    assert relearn("export", "dataset", "dataset", "--for", "trl", "-o", "trl")[0] == 0
    code, lines = relearn("export", "dataset", "dataset", "--for", "trl", "-o", "trl")
    assert code == 2 and "--overwrite" in lines[0]
    assert relearn("export", "dataset", "dataset", "--for", "trl", "-o", "trl", "--overwrite")[0] == 0
    assert relearn("export", "hf", "pool.jsonl", "-o", "hf.jsonl")[0] == 0
    assert relearn("export", "hf", "pool.jsonl", "-o", "hf.jsonl")[0] == 0
    assert relearn("stats", "pool.jsonl", "--no-cache", "--json", "report.json")[0] == 0
    assert relearn("stats", "pool.jsonl", "--no-cache", "--json", "report.json")[0] == 0


def test_a_missing_folder_is_created_and_said(world: Path) -> None:
    result = CliRunner().invoke(app, ["import", "codex", CODEX, "-o", "runs/new/pool.jsonl"])
    assert result.exit_code == 0
    assert "created the folder runs/new" in result.stderr
    assert (world / "runs" / "new" / "pool.jsonl").is_file()


def test_the_checks(tmp_path: Path) -> None:
    """The sniffing itself: a pool with a torn last or first line is still a pool, a zstd one
    is read, and the kinds are told apart."""
    pool = tmp_path / "pool.jsonl"
    line = trajectory(BASE).model_dump_json(exclude_none=True)
    pool.write_text(line + "\n" + line[:40])  # a crash mid-append
    check_jsonl_output(pool, POOL)
    torn = tmp_path / "torn.jsonl"
    torn.write_text(line[:40])  # the only record cut by a crash
    check_jsonl_output(torn, POOL)
    first_torn = tmp_path / "first-torn.jsonl"
    first_torn.write_text(line[:40] + "\n" + line + "\n")
    check_jsonl_output(first_torn, POOL)
    zst = tmp_path / "pool.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress((line + "\n").encode()))
    check_jsonl_output(zst, POOL)
    with pytest.raises(OpError, match="not a reviews file .line 1 has no decision, trajectory_id"):
        check_jsonl_output(pool, REVIEWS)
    broken = tmp_path / "broken.jsonl.zst"
    broken.write_bytes(b"not zstd at all")
    with pytest.raises(OpError, match="broken.jsonl.zst.*not a zstd stream"):
        check_jsonl_output(broken, POOL)
    array = tmp_path / "array.jsonl"
    array.write_text("[1, 2]\n")
    with pytest.raises(OpError, match="line 1 is a JSON list"):
        check_jsonl_output(array, POOL)
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    (interrupted / "shard-00000.parquet").write_bytes(b"PAR1")
    (interrupted / "shard-00000.stats.json").write_text("{}")
    check_dataset_dir(interrupted)  # a compile cut before its stats.json: resumed, not refused
    (interrupted / "mine.txt").write_text("x")
    with pytest.raises(OpError, match="did not write"):
        check_dataset_dir(interrupted)
    # Cut between its first shard and that shard's stats.json: the shard's columns say whose it is.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from relearn.masks.rows import SCHEMA

    first = tmp_path / "first"
    first.mkdir()
    pq.write_table(SCHEMA.empty_table(), first / "shard-00000.parquet")
    check_dataset_dir(first)
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"x": [1]}), other / "shard-00000.parquet")
    with pytest.raises(OpError, match="did not write"):
        check_dataset_dir(other)
