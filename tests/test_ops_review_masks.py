"""The review, masks, train and analyze operations called directly (relearn.ops), the one shard
row (relearn.masks.rows), and one owner for every default they share with the pipeline file."""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from records.pools import write_atomic
from records.review import Review
from relearn.masks.rows import RowProblem, ShardRow, ShardWriter, iter_rows, read_trajectory_ids, supervised_targets
from relearn.ops.reporting import OpError
from tests.test_masks import BASE, defect, trajectory

RELEARN = Path(__file__).resolve().parent.parent / "relearn"


class Recorder:
    """A reporter that keeps what it was told."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self.advanced = 0.0
        self.notes: list[str] = []

    def begin(self, label: str, total: float | None = None) -> None:
        self.labels.append(label)

    def advance(self, amount: float = 1, **fields: object) -> None:
        self.advanced += amount

    def end(self) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


def _pool(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    good = trajectory(BASE)
    other = trajectory(BASE, task_id="other-task")
    rejected = trajectory(BASE, task_id="hacked")
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [good, other, rejected])
    reviews = tmp_path / "reviews.jsonl"
    lines = [
        Review(trajectory_id=good.id, decision="accept", defects=[defect(good, 2, "reasoning_content", "probably")]),
        Review(trajectory_id=other.id, decision="accept"),
        Review(trajectory_id=rejected.id, decision="accept"),
        Review(trajectory_id=rejected.id, decision="reject", reason="reward hacking"),  # the latest line wins
    ]
    reviews.write_text("".join(r.model_dump_json() + "\n" for r in lines))
    return pool, reviews, [good.id, other.id, rejected.id]


def test_masks_op_compiles_resumes_and_refuses_unusable_options(tmp_path: Path, tok) -> None:  # noqa: ANN001
    from relearn.ops.masks import run_masks
    from relearn.verbs.masks import MasksOptions

    pool, reviews, ids = _pool(tmp_path)
    options = MasksOptions(pool=pool, output=tmp_path / "ross", reviews=reviews, shard_size=2)
    seen = Recorder()
    summary = run_masks(options, seen, tokenizer=tok)
    stats = summary.stats
    assert (stats["trajectories_in"], stats["trajectories_out"], stats["shards"]) == (3, 2, 2)
    assert stats["rejected"] == {"review rejected": 1} and not summary.partial and summary.reused == 0
    assert seen.labels == ["compiling ross masks"] and seen.advanced == pool.stat().st_size  # progress in the pool's bytes
    assert stats["tokens"]["excluded"] > 0 and stats["tokens"]["supervised"] == stats["tokens"]["eligible"] - stats["tokens"]["excluded"]
    rows = [r for r in iter_rows(sorted((tmp_path / "ross").glob("shard-*.parquet")))]
    assert all(isinstance(r, ShardRow) for r in rows) and {r.trajectory_id for r in rows} == set(ids[:2])  # type: ignore[union-attr]
    assert sum(r.supervised for r in rows) == stats["tokens"]["supervised"]  # type: ignore[union-attr]
    assert run_masks(options, tokenizer=tok).reused == 2

    with pytest.raises(OpError, match="--mode ross-nomask needs --reviews"):
        run_masks(dataclasses.replace(options, mode="ross-nomask", reviews=None), tokenizer=tok)
    with pytest.raises(OpError, match="--defect-scope must be one of action, minimal"):
        run_masks(dataclasses.replace(options, defect_scope="wide"), tokenizer=tok)
    with pytest.raises(OpError, match="no such pool"):
        run_masks(dataclasses.replace(options, pool=tmp_path / "missing.jsonl"), tokenizer=tok)


def test_a_shard_row_is_written_and_read_back_by_the_one_reader_and_writer(tmp_path: Path) -> None:
    ids = np.array([5, 6, 7, 8], dtype=np.int32)
    first = ShardRow("s0", "t0", ids, np.array([1, 0, 1, 1], dtype=np.uint8), eligible=3, excluded=0, ter=0.0)
    second = ShardRow("s1", "t1", ids[:2], np.array([0, 1], dtype=np.uint8), eligible=2, excluded=1, ter=0.5)
    # One meaning of "supervised": token 0 is never predicted, even where its mask says 1.
    assert (first.supervised, second.supervised) == (2, 1) == (supervised_targets(first.loss_mask), supervised_targets(second.loss_mask))
    shard = tmp_path / "shard-00000.parquet"
    with ShardWriter(shard, "ross") as writer:
        writer.write([first, second])
    back = list(iter_rows([shard], batch_rows=1))
    assert [(r.sample_id, r.supervised, r.eligible, r.excluded, r.ter) for r in back] == [  # type: ignore[union-attr]
        ("s0", 2, 3, 0, 0.0),
        ("s1", 1, 2, 1, 0.5),
    ]
    assert np.array_equal(back[0].input_ids, ids) and back[1].loss_mask.tolist() == [0, 1]  # type: ignore[union-attr]
    import pyarrow.parquet as pq

    assert pq.read_table(shard, columns=["supervised"]).column("supervised").to_pylist() == [2, 1]
    assert read_trajectory_ids([shard]) == {"t0", "t1"}

    import pyarrow as pa

    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table(
            {"sample_id": ["x"], "trajectory_id": ["t"], "input_ids": [[1, 2, 3]], "loss_mask": pa.array([[0, 1]], pa.list_(pa.uint8()))}
        ),
        bad,
    )
    (problem,) = list(iter_rows([bad]))
    assert isinstance(problem, RowProblem) and str(problem) == "bad.parquet row 0 (x): input_ids has 3 tokens but loss_mask 2"


def test_review_op_reviews_with_the_heuristic_and_counts_the_latest_review_in_one_pass(tmp_path: Path) -> None:
    from relearn.ops.review import count_reviews, run_review
    from relearn.verbs.review import JudgeOptions, ReviewOptions

    pool, reviews, _ids = _pool(tmp_path)
    output = tmp_path / "out.jsonl"
    seen = Recorder()
    heuristic = JudgeOptions(reviewer="heuristic")  # asked for by name; never the default
    summary = run_review(ReviewOptions(pool, output, heuristic, workers=2), seen)
    assert summary.reviewer == "heuristic" and summary.run is not None and summary.run.reviewed == 3 and not summary.partial
    assert seen.labels == ["reviewing"] and seen.advanced == 3
    counts = count_reviews(output)
    assert counts.reviewed == 3 and counts.decisions == Counter(d.split(":")[0] for d in summary.run.decisions.elements())
    assert counts.defects == summary.run.defects
    again = run_review(ReviewOptions(pool, output, heuristic))
    assert again.run is not None and again.run.skipped == 3 and not again.run.reviewed  # resumed: nothing twice

    latest = count_reviews(reviews)  # four lines, three trajectories, the last line of one rejects it
    assert latest.reviewed == 3 and latest.decisions == {"accept": 2, "reject": 1} and latest.defects == 1
    with pytest.raises(OpError, match="--estimate prices the judges"):
        run_review(ReviewOptions(pool, output, heuristic, estimate=True))
    with pytest.raises(OpError, match=r"no reviewer: name the judges \(--judge1 MODEL.*--reviewer heuristic"):
        run_review(ReviewOptions(pool, output))  # neither judges nor the heuristic by name
    with pytest.raises(OpError, match="--reviewer heuristic calls no judge"):
        run_review(ReviewOptions(pool, output, JudgeOptions(judge1="m", reviewer="heuristic")))
    with pytest.raises(OpError, match="--batch and --ray do not go together"):
        run_review(ReviewOptions(pool, output, JudgeOptions(judge1="m"), batch=True, ray="auto"))


def test_train_and_analyze_ops_refuse_unusable_options_before_loading_anything(tmp_path: Path) -> None:
    from relearn.analyze.pools import NamedPool
    from relearn.ops.analyze import run_nll
    from relearn.ops.train import TrainOptions, run_train
    from relearn.verbs.analyze import NllOptions

    with pytest.raises(OpError, match="give exactly one of --init PATH or --tiny NAME"):
        run_train(TrainOptions(dataset=tmp_path, out=tmp_path / "run"))
    with pytest.raises(OpError, match="--tiny must be one of"):
        run_train(TrainOptions(dataset=tmp_path, out=tmp_path / "run", tiny="huge"))
    pool, _reviews, _ids = _pool(tmp_path)
    nll = NllOptions(pools=[NamedPool("p", pool)], out=tmp_path / "nll", tiny="qwen3")
    with pytest.raises(OpError, match="give exactly one of --model FOLDER or --tiny NAME"):
        run_nll(dataclasses.replace(nll, model=str(tmp_path)))
    with pytest.raises(OpError, match="--workers runs CPU processes"):
        run_nll(dataclasses.replace(nll, workers=2, device="cuda"))
    with pytest.raises(OpError, match="no such file"):
        run_nll(dataclasses.replace(nll, pools=[NamedPool("p", tmp_path / "none.jsonl")]))
    assert not (tmp_path / "nll").exists() and not (tmp_path / "run").exists()


def _literals(value: object) -> list[str]:
    """Where ``value`` is written as a literal in relearn/ (comments and help texts are not literals)."""
    found = []
    for path in sorted(RELEARN.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value:
                found.append(f"{path.relative_to(RELEARN.parent)}:{node.lineno}")
    return found


def test_the_context_length_is_written_once() -> None:
    found = _literals(65536)
    assert len(found) == 1 and found[0].startswith("relearn/masks/compile.py:"), found


def test_the_default_defect_scope_is_written_once() -> None:
    """In its choices and in ``ACTION_SCOPE``, which every default and comparison names."""
    found = _literals("action")
    assert len(found) == 2 and all(f.startswith("relearn/masks/scopes.py:") for f in found), found


def _defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_the_pipeline_file_says_every_option_of_the_verbs_with_their_defaults() -> None:
    """A field a verb has and the file cannot say is a bug; so is a default written twice."""
    from relearn.pipeline.config import AnalyzeConfig, MasksConfig, ReviewConfig, TrainConfig
    from relearn.train.options import TrainOptions
    from relearn.verbs.analyze import NllOptions
    from relearn.verbs.masks import MasksOptions
    from relearn.verbs.review import JudgeOptions, ReviewOptions

    def check(config: object, options: type, renamed: dict[str, str], elsewhere: set[str]) -> None:
        fields = type(config).model_fields  # type: ignore[attr-defined]
        for name, default in _defaults(options).items():
            if name in elsewhere:
                continue
            key = renamed.get(name, name)
            assert key in fields, f"{options.__name__}.{name}: the pipeline file cannot say it"
            assert getattr(config, key) == default, f"{options.__name__}.{name}: the pipeline's default differs"
        for name in elsewhere:  # said by another part of the file (or where it runs, not what it makes)
            assert name in {f.name for f in dataclasses.fields(options)}

    # pool/output/reviews: the work folder's; ray: [cluster]; no_thinking: [pool.single_turn].thinking;
    # audit: the file's is on by default (its own audit stage), the verb's a file or none
    check(MasksConfig(), MasksOptions, {}, {"pool", "output", "reviews", "ray", "no_thinking", "mode", "audit"})
    assert MasksConfig().audit is True and MasksOptions.audit is None
    check(ReviewConfig(), ReviewOptions, {"spend_cap": "spend_cap_usd"}, {"pool", "output", "judges", "ray"})
    check(ReviewConfig(), JudgeOptions, {"context": "judge_context"}, {"prices"})
    # dataset/out/tokenizer: the pipeline's; zero/offload/sp need a launcher; resume/progress: how it runs;
    # plan: `relearn run --dry-run` prints it
    check(
        TrainConfig(tiny="qwen3"),
        TrainOptions,
        {},
        {"dataset", "out", "tokenizer", "chat_template", "tiny", "zero", "offload", "sp", "resume", "progress", "plan"},
    )
    # the pools, model and tokenizer are the pipeline's; ctx, defect scope, context and thinking are [masks]'
    masks_side = {"ctx", "defect_scope", "context", "preserve_thinking", "tokenizer", "chat_template"}
    pipeline_side = {"pools", "out", "model", "tiny", "seed", "reviews", "positive_only", "ray", "chart", "progress"}
    check(AnalyzeConfig(), NllOptions, {}, masks_side | pipeline_side)
    assert MasksConfig().ctx == TrainConfig(tiny="qwen3").ctx == NllOptions.ctx == TrainOptions.ctx


def test_the_pipeline_analyze_options_are_those_the_masks_compiled_with(tmp_path: Path) -> None:
    from relearn.analyze.pools import NamedPool
    from relearn.pipeline.config import AnalyzeConfig, MasksConfig

    masks = MasksConfig(ctx=4096, defect_scope="minimal", preserve_thinking=False, tokenizer="qwen3.6", context="render")
    options = AnalyzeConfig(workers=3).nll_options([NamedPool("train", tmp_path)], tmp_path / "o", "m", tmp_path / "r", masks, ray=None)
    assert (options.ctx, options.defect_scope, options.preserve_thinking, options.tokenizer) == (4096, "minimal", False, "qwen3.6")
    assert options.context == "render"
    assert options.positive_only and options.workers == 3 and not options.chart and options.model == "m"


def test_a_pipeline_file_reaches_the_verbs_options(tmp_path: Path) -> None:
    """Fields written in PIPELINE.toml arrive in the options the operations run with."""
    from relearn.pipeline.config import load_pipeline

    path = tmp_path / "pipeline.toml"
    path.write_text(
        'workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n'
        '[review]\njudge1 = "m"\nbatch = true\nworkers = 2\nspend_cap_usd = 3.5\njudge_context = 5000\nprices = "p.toml"\n'
        '[masks]\nvariants = ["ross"]\nper_turn = true\npreserve_thinking = false\nworkers = 3\nctx = 2048\nprefix_check = "every"\n'
        '[train]\ntiny = "qwen3"\nepochs = 1\nlr = 2e-5\npack = true\nweight_decay = 0.1\nsave_every = 5\n'
        '[cluster]\naddress = "10.0.0.1:6379"\n'
    )
    config = load_pipeline(path)
    review = config.review.options(
        tmp_path / "v.jsonl", tmp_path / "r.jsonl", config.resolve(config.review.prices or ""), ray="10.0.0.1:6379"
    )
    assert (review.batch, review.workers, review.spend_cap, review.judges.judge1, review.judges.context) == (True, 2, 3.5, "m", 5000)
    assert review.judges.prices == tmp_path / "p.toml" and review.ray == "10.0.0.1:6379"
    masks = config.masks.options(tmp_path / "v.jsonl", tmp_path / "d", tmp_path / "r.jsonl", "ross", no_thinking=False, ray=None)
    assert (masks.per_turn, masks.preserve_thinking, masks.workers, masks.ctx, masks.prefix_check) == (True, False, 3, 2048, "every")
    assert masks.compile_options().template_kwargs == {"preserve_thinking": False}
    assert config.train is not None
    train = config.train.options(tmp_path / "d", tmp_path / "t", "upstream/", "qwen3.6")
    assert (train.epochs, train.lr, train.pack, train.weight_decay, train.save_every, train.init, train.tiny) == (
        1,
        2e-5,
        True,
        0.1,
        5,
        "upstream/",
        None,
    )
