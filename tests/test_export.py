"""Compiled masks exported for other trainers: every format supervises exactly the shard's
loss_mask, TRL's SFTTrainer trains on the same positions with the same loss as relearn train,
and a tokenizer that is not the dataset's is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from records.pools import write_atomic
from records.review import Review
from relearn.cli.main import app
from relearn.export.source import ExportError, iter_samples, open_dataset
from relearn.export.spans import sample_spans
from relearn.export.trainers import FORMATS
from relearn.masks.compile import CompileOptions
from relearn.masks.shards import build_dataset
from relearn.ops.export import run_export_dataset, run_export_masks, run_export_pool
from relearn.ops.reporting import OpError
from relearn.verbs.export import DatasetExportOptions, MasksExportOptions, PoolExportOptions
from tests.test_masks import BASE, call, defect, trajectory

MODES = ("ross", "ross-nomask", "positive")


def _pool() -> tuple[list, list[Review]]:
    """Three successes: two with defects (one a whole redundant call), one clean."""
    first = trajectory(BASE, task_id="calc")
    second_messages = [dict(m) for m in BASE]
    second_messages[2] = {**second_messages[2], "tool_calls": [call("c1", "shell", command=["bash", "-lc", "ls -R"])]}
    second = trajectory(second_messages, task_id="calc-ls")
    clean = trajectory(BASE[:2] + [{"role": "assistant", "generated": True, "content": "add() now returns a + b."}], task_id="clean")
    reviews = [
        Review(
            trajectory_id=first.id,
            decision="accept",
            defects=[defect(first, 2, "reasoning_content", "probably in parse()", category="wrong_hypothesis")],
        ),
        Review(
            trajectory_id=second.id,
            decision="accept",
            defects=[defect(second, 2, "tool_calls[0].arguments.command", "ls -R", category="redundant_exploration")],
        ),
        Review(trajectory_id=clean.id, decision="accept"),
    ]
    return [first, second, clean], reviews


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory, tok) -> dict[str, Path]:  # noqa: ANN001
    folder = tmp_path_factory.mktemp("compiled")
    trajectories, reviews = _pool()
    pool = folder / "pool.jsonl"
    write_atomic(pool, trajectories)
    by_id = {r.trajectory_id: r for r in reviews}
    out = {}
    for mode in MODES:
        build_dataset(pool, by_id, tok, "qwen3.6", CompileOptions(mode=mode), folder / mode)  # type: ignore[arg-type]
        out[mode] = folder / mode
    return out


def shard_masks(dataset: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    rows = []
    for sample in iter_samples(open_dataset(dataset)):
        mask = sample.loss_mask.copy()
        mask[0] = 0
        rows.append((sample.sample_id, sample.input_ids, mask))
    return rows


def read_back(fmt: str, out: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input_ids, supervised positions) of every exported row, read as the trainer reads them."""
    if fmt == "trl":
        table = pq.read_table(out / "train-00000.parquet")
        return [
            (np.array(i), np.array(m)) for i, m in zip(table["input_ids"].to_pylist(), table["assistant_masks"].to_pylist(), strict=True)
        ]
    if fmt == "axolotl":
        table = pq.read_table(out / "train-00000.parquet")
        assert set(table.column_names) == {"input_ids", "attention_mask", "labels"}
        return [
            (np.array(i), (np.array(lab) != -100).astype(np.uint8))
            for i, lab in zip(table["input_ids"].to_pylist(), table["labels"].to_pylist(), strict=True)
        ]
    if fmt == "llamafactory":
        import datasets

        saved = datasets.load_from_disk(str(out / "tokenized"))
        assert set(saved.column_names) == {"input_ids", "attention_mask", "labels"}
        return [(np.array(r["input_ids"]), (np.array(r["labels"]) != -100).astype(np.uint8)) for r in saved]
    if fmt == "verl":
        spec = importlib.util.spec_from_file_location("relearn_verl_dataset", out / "relearn_verl_dataset.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        padded = module.RelearnSFTDataset([str(out / "train-00000.parquet")], tokenizer=None, config={"max_length": 4096})
        unpadded = module.RelearnSFTDataset(str(out / "train-00000.parquet"), config={"pad_mode": "no_padding"})
        rows = []
        for index in range(len(padded)):
            item, bare = padded[index], unpadded[index]
            n = int(item["attention_mask"].sum())
            assert len(bare["input_ids"]) == n and "attention_mask" not in bare and bool((bare["loss_mask"] == item["loss_mask"][:n]).all())
            assert item["position_ids"][:n].tolist() == list(range(n)) and not item["loss_mask"][n:].any()
            rows.append((item["input_ids"][:n].numpy(), item["loss_mask"][:n].numpy()))
        with pytest.raises(ValueError, match="longer than data.max_length"):
            module.RelearnSFTDataset(str(out / "train-00000.parquet"), config={"max_length": 8})[0]
        return rows
    import datasets

    parquet = datasets.load_dataset("parquet", data_files=str(out / "parquet" / "*.parquet"), split="train")
    saved = datasets.load_from_disk(str(out / "dataset"))
    assert parquet.to_list() == saved.to_list()
    whole: dict[str, int] = {}
    for row in saved:
        whole[row["trajectory_id"]] = whole.get(row["trajectory_id"], 0) + sum(row["loss_mask"])
    for row in saved:
        # Per trajectory, as the trainer normalises: every row of it shares one weight.
        assert (
            row["weight"] == pytest.approx(1 / whole[row["trajectory_id"]])
            and [t if m else -100 for t, m in zip(row["input_ids"], row["loss_mask"], strict=True)] == row["labels"]
        )
    return [(np.array(r["input_ids"]), np.array(r["loss_mask"])) for r in saved]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_supervises_exactly_the_shards_loss_mask(tmp_path: Path, datasets: dict[str, Path], fmt: str) -> None:
    for mode in MODES:
        out = tmp_path / f"{fmt}-{mode}"
        summary = run_export_dataset(DatasetExportOptions(datasets[mode], fmt, out))
        expected = shard_masks(datasets[mode])
        got = read_back(fmt, out)
        assert len(got) == len(expected) == summary.rows == 3
        for (sample_id, ids, mask), (got_ids, got_mask) in zip(expected, got, strict=True):
            assert np.array_equal(got_ids, ids) and np.array_equal(got_mask.astype(np.uint8), mask), (fmt, mode, sample_id)
        rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
        assert [r["sample_id"] for r in rows] == [e[0] for e in expected]
        manifest = json.loads((out / "relearn-export.json").read_text())
        assert (
            manifest["mode"] == mode
            and manifest["tokenizer"] == "qwen3.6"
            and manifest["supervised_tokens"] == sum(int(m.sum()) for _s, _i, m in expected)
        )
    # Excluded tokens are never supervised: where ross-nomask trains and ross does not.
    excluded = [(n[2] == 1) & (r[2] == 0) for n, r in zip(shard_masks(datasets["ross-nomask"]), shard_masks(datasets["ross"]), strict=True)]
    assert sum(int(e.sum()) for e in excluded) > 20
    ross_rows = read_back(fmt, tmp_path / f"{fmt}-ross")
    assert not any(bool((got_mask[e] == 1).any()) for (_ids, got_mask), e in zip(ross_rows, excluded, strict=True))


def test_a_tokenizer_that_is_not_the_datasets_is_refused(tmp_path: Path, datasets: dict[str, Path], tok) -> None:  # noqa: ANN001
    other = tmp_path / "other-template"
    tok.save_pretrained(other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    config.pop("chat_template", None)
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(OpError, match="chat template"):
        run_export_dataset(DatasetExportOptions(datasets["ross"], "trl", tmp_path / "out", tokenizer=str(other)))
    assert not (tmp_path / "out").exists()
    with pytest.raises(OpError, match="chat template"):
        run_export_masks(MasksExportOptions(datasets["ross"], tmp_path / "spans.jsonl", tokenizer=str(other)))
    assert not (tmp_path / "spans.jsonl").exists()
    same = run_export_dataset(DatasetExportOptions(datasets["ross"], "trl", tmp_path / "ok", tokenizer="qwen3.6"))
    assert same.rows == 3 and same.manifest.is_file()
    with pytest.raises(OpError, match="--overwrite"):
        run_export_dataset(DatasetExportOptions(datasets["ross"], "trl", tmp_path / "ok"))
    again = run_export_dataset(DatasetExportOptions(datasets["ross"], "axolotl", tmp_path / "ok", overwrite=True))
    assert again.files == ["train-00000.parquet"] and json.loads(again.manifest.read_text())["format"] == "axolotl"
    # The command line: the same refusal is exit 2 with the op's one line.
    runner = CliRunner()
    result = runner.invoke(
        app, ["export", "dataset", str(datasets["ross"]), "--for", "trl", "-o", str(tmp_path / "out"), "--tokenizer", str(other)]
    )
    assert result.exit_code == 2 and "chat template" in result.output and not (tmp_path / "out").exists()
    unknown = runner.invoke(app, ["export", "dataset", str(datasets["ross"]), "--for", "megatron", "-o", str(tmp_path / "m")])
    assert unknown.exit_code == 2 and "'megatron' is not one of 'trl', 'axolotl', 'verl', 'llamafactory', 'hf'" in unknown.output
    stats = json.loads((datasets["ross"] / "stats.json").read_text())
    old = tmp_path / "old"
    old.mkdir()
    (old / "stats.json").write_text(json.dumps({k: v for k, v in stats.items() if k != "tokenizer_fingerprint"}))
    with pytest.raises(ExportError, match="older relearn"):
        open_dataset(old)


def test_spans_select_the_same_tokens_by_token_runs_and_by_characters(tmp_path: Path, datasets: dict[str, Path], tok) -> None:  # noqa: ANN001
    out = tmp_path / "spans.jsonl"
    summary = run_export_masks(MasksExportOptions(datasets["ross"], out))
    assert summary.samples == 3 and summary.tokenizer == "qwen3.6"
    result = CliRunner().invoke(app, ["export", "masks", str(datasets["ross"]), "-o", str(tmp_path / "cli.jsonl")])
    assert result.exit_code == 0 and "spans of 3 samples" in result.output, result.output
    assert (tmp_path / "cli.jsonl").read_bytes() == out.read_bytes()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    for line, (sample_id, ids, mask) in zip(lines, shard_masks(datasets["ross"]), strict=True):
        assert line["sample_id"] == sample_id and tok(line["text"], add_special_tokens=False)["input_ids"] == ids.tolist()
        by_runs = np.zeros(len(ids), dtype=np.uint8)
        for a, b in line["token_spans"]:
            by_runs[a:b] = 1
        assert np.array_equal(by_runs, mask)
        # Another trainer's view: the tokens lying wholly inside a character span.
        offsets = tok(line["text"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        by_chars = np.array([any(lo <= s and e <= hi for lo, hi in line["char_spans"]) and e > s for s, e in offsets], dtype=np.uint8)
        assert np.array_equal(by_chars, mask)
    first = next(iter_samples(open_dataset(datasets["ross"])))
    assert sample_spans(first, tok)["supervised"] == first.supervised


@pytest.mark.slow
def test_trl_sft_trainer_trains_the_same_positions_with_the_same_loss_as_relearn_train(
    tmp_path: Path, datasets: dict[str, Path], tok
) -> None:  # noqa: ANN001
    import datasets as hf_datasets
    import torch
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from relearn.train.loop import train
    from relearn.train.model import build_model
    from relearn.train.options import TrainOptions

    start = tmp_path / "start"
    build_model(tiny="qwen3", seed=0).save_pretrained(start)
    tok.save_pretrained(start)
    run_export_dataset(DatasetExportOptions(datasets["ross"], "trl", tmp_path / "trl"))
    rows = hf_datasets.load_dataset("parquet", data_files=str(tmp_path / "trl" / "train-00000.parquet"), split="train")
    expected = shard_masks(datasets["ross"])

    # One optimizer step over all three trajectories, per-token normalisation on both sides.
    summary = train(
        TrainOptions(dataset=datasets["ross"], out=tmp_path / "relearn", init=str(start), tokenizer="qwen3.6", epochs=1, max_steps=1, lr=1e-4, warmup=0,
                     batch_trajectories=len(expected), loss_norm="token", progress=False, save_every=0),
    )  # fmt: skip
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32),
        # One trajectory per micro-batch (no padding), the step's tokens normalised together (num_items_in_batch).
        args=SFTConfig(output_dir=str(tmp_path / "trl-run"), per_device_train_batch_size=1, gradient_accumulation_steps=len(expected), max_steps=1, learning_rate=1e-4, lr_scheduler_type="constant",
                       max_length=None, bf16=False, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0),
        train_dataset=rows,
        processing_class=tok,
    )  # fmt: skip
    prepared = trainer.train_dataset
    for row, (_sample_id, ids, mask) in zip(prepared, expected, strict=True):
        assert row["input_ids"] == ids.tolist()
        assert [int(label != -100) for label in row["labels"]] == mask.tolist()  # the same supervised positions
    trainer.train()
    trl_loss = trainer.state.log_history[0]["loss"]
    assert summary.first_loss is not None and abs(trl_loss - summary.first_loss) < 1e-5, (trl_loss, summary.first_loss)


def test_rows_stream_into_files_of_the_asked_size(tmp_path: Path, datasets: dict[str, Path]) -> None:
    import datasets as hf_datasets

    summary = run_export_dataset(DatasetExportOptions(datasets["ross"], "trl", tmp_path / "trl", rows_per_file=2))
    assert summary.files == ["train-00000.parquet", "train-00001.parquet"]
    assert [pq.read_metadata(tmp_path / "trl" / f).num_rows for f in summary.files] == [2, 1]
    rows = hf_datasets.load_dataset("parquet", data_files=str(tmp_path / "trl" / "*.parquet"), split="train")
    assert [r["input_ids"] for r in rows] == [ids.tolist() for _s, ids, _m in shard_masks(datasets["ross"])]


class Recording:
    """A reporter that keeps what the operation told it."""

    def __init__(self) -> None:
        self.begun: list[tuple[str, float | None]] = []
        self.advanced = 0.0
        self.ended = 0

    def begin(self, label: str, total: float | None = None) -> None:
        self.begun.append((label, total))

    def advance(self, amount: float = 1, **fields: object) -> None:
        self.advanced += amount

    def end(self) -> None:
        self.ended += 1

    def note(self, message: str) -> None:
        pass


def test_the_for_flag_takes_exactly_the_trainers_formats() -> None:
    from typing import get_args

    from relearn.verbs.export import Trainer

    assert get_args(Trainer) == FORMATS


def test_dataset_export_reports_one_advance_per_sample(tmp_path: Path, datasets: dict[str, Path]) -> None:
    reporter = Recording()
    summary = run_export_dataset(DatasetExportOptions(datasets["ross"], "verl", tmp_path / "verl"), reporter)
    assert reporter.begun == [("exporting for verl", 3)] and reporter.advanced == 3 == summary.rows and reporter.ended == 1
    assert "relearn_verl_dataset.py" in summary.files and (tmp_path / "verl" / "relearn_verl_dataset.py").is_file()
    with pytest.raises(OpError, match="rows per file 0"):
        run_export_dataset(DatasetExportOptions(datasets["ross"], "trl", tmp_path / "zero", rows_per_file=0))
    with pytest.raises(OpError, match="no stats.json"):
        run_export_dataset(DatasetExportOptions(tmp_path, "trl", tmp_path / "none"))


@pytest.fixture
def pool_with_a_bad_record(tmp_path: Path) -> Path:
    """The three trajectories of ``_pool`` and, on line 4, a record that is not one."""
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, _pool()[0])
    with open(pool, "a", encoding="utf-8") as f:
        f.write('{"id": 3}\n')
    return pool


def test_pool_exports_write_every_trajectory_and_name_the_records_they_reject(tmp_path: Path, pool_with_a_bad_record: Path) -> None:
    from harness.import_run import import_files
    from records.pools import read_trajectories

    pool = pool_with_a_bad_record
    ids = [t.id for t in _pool()[0]]
    reporter = Recording()
    hf = run_export_pool(PoolExportOptions([pool], tmp_path / "hf.jsonl", "hf"), reporter)
    assert hf.exported == 3 and reporter.advanced == 3 and reporter.ended == 1 and not hf.complete
    assert len(hf.rejected) == 1 and hf.rejected[0].startswith(f"{pool}:4: id:")
    rows = [json.loads(line) for line in (tmp_path / "hf.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ids and all(r["messages"][0]["role"] == "system" for r in rows)

    atif = run_export_pool(PoolExportOptions([pool, pool], tmp_path / "atif", "atif"))
    assert atif.exported == 6 and len(atif.rejected) == 2  # a pool named twice is read twice; the files are the same three
    assert sorted(p.name for p in (tmp_path / "atif").iterdir()) == sorted(f"{i}.trajectory.json" for i in ids)

    chat = run_export_pool(PoolExportOptions([pool], tmp_path / "chat.jsonl", "chat"))
    assert chat.exported == 3 and chat.refused == []
    back = import_files("chat", [tmp_path / "chat.jsonl"], tmp_path / "back.jsonl")
    assert back.imported == 3
    assert [len(t.messages) for t in read_trajectories(tmp_path / "back.jsonl")] == [len(t.messages) for t in _pool()[0]]

    # The text-only nebius rows cannot hold the two trajectories with tool calls: refused by id, never written in part.
    nebius = run_export_pool(PoolExportOptions([pool], tmp_path / "nebius.jsonl", "chat", "nebius-swe-agent"))
    assert nebius.exported == 1 and sorted(r.split(":")[0] for r in nebius.refused) == sorted(ids[:2])
    assert len((tmp_path / "nebius.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (lambda d: PoolExportOptions([d / "missing.jsonl"], d / "o.jsonl", "hf"), "missing.jsonl: no such pool file"),
        (lambda d: PoolExportOptions([], d / "o.jsonl", "hf"), "no pool to export"),
        (lambda d: PoolExportOptions([d / "pool.jsonl"], d / "o.jsonl", "hf", "swe-smith"), "only the chat export has presets"),
        (lambda d: PoolExportOptions([d / "pool.jsonl"], d / "o.jsonl", "chat", "swe-gymnasium"), "expected one of swe-gym, "),
        (lambda d: PoolExportOptions([d / "pool.jsonl"], d / "pool.jsonl", "atif"), "is not a folder"),
        (lambda d: PoolExportOptions([d / "pool.jsonl"], d, "chat"), "is a folder"),
        (lambda d: PoolExportOptions([d / "pool.jsonl"], d / "o.jsonl", "sharegpt"), "expected one of atif, hf, chat"),  # type: ignore[arg-type]
    ],
)
def test_unusable_pool_export_options_are_refused_before_anything_is_written(
    tmp_path: Path, pool_with_a_bad_record: Path, options, message: str
) -> None:  # noqa: ANN001
    before = sorted(tmp_path.iterdir())
    with pytest.raises(OpError, match=message):
        run_export_pool(options(tmp_path))
    assert sorted(tmp_path.iterdir()) == before


def test_export_cli_renders_the_summary_and_exits_by_what_was_rejected(tmp_path: Path, pool_with_a_bad_record: Path) -> None:
    runner = CliRunner()
    partial = runner.invoke(app, ["export", "hf", str(pool_with_a_bad_record), "-o", str(tmp_path / "hf.jsonl")])
    assert partial.exit_code == 1 and "exported 3 trajectories as hf" in partial.output and "1 records rejected" in partial.output
    missing = runner.invoke(app, ["export", "chat", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "c.jsonl")])
    assert missing.exit_code == 2 and "no such pool file" in missing.output


def test_hf_weights_normalise_per_trajectory_across_its_rows(tmp_path: Path, tok) -> None:  # noqa: ANN001
    """A per-turn compile gives a trajectory several rows: each row's tokens are weighted by the
    whole trajectory's supervised count, so every trajectory's weighted tokens sum to one (the
    trainer's formula 4), not one per row."""
    import datasets as hf

    trajectories, reviews = _pool()
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, trajectories)
    build_dataset(
        pool, {r.trajectory_id: r for r in reviews}, tok, "qwen3.6", CompileOptions(mode="ross", per_turn=True), tmp_path / "turns"
    )
    run_export_dataset(DatasetExportOptions(tmp_path / "turns", "hf", tmp_path / "hf"))
    rows = hf.load_from_disk(str(tmp_path / "hf" / "dataset")).to_list()
    by_trajectory: dict[str, list[dict]] = {}
    for row in rows:
        by_trajectory.setdefault(row["trajectory_id"], []).append(row)
    assert any(len(group) > 1 for group in by_trajectory.values())  # per-turn: several rows of one trajectory
    for group in by_trajectory.values():
        assert len({row["weight"] for row in group}) == 1
        assert sum(row["weight"] * sum(row["loss_mask"]) for row in group) == pytest.approx(1.0)
