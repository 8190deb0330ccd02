"""Formula 4 of ROSS with the trajectory as the unit, whatever the samples it was compiled into.

Three trajectories in six samples: T split by a context reset into two independent samples
(a Codex compaction, an ATIF summarisation), P compiled ``--per-turn`` into three samples (each
the history so far with only its last turn supervised), and U whole. The expected loss is
computed by hand from full logits, sample by sample:

    L = 1/3 [ (S_T1 + S_T2) / (n_T1 + n_T2) + (S_P1 + S_P2 + S_P3) / (n_P1 + n_P2 + n_P3) + S_U / n_U ]

and the chunked loss must give it whether the samples share one micro-batch, are split over
micro-batches, ranks (each rank's slice of the step, as ``Layout.micro_rows`` gives it) or
steps (``lr = 0``, so that every step sees the same weights: the steps' losses weighted by
their fractions of trajectories add up to L, and the fractions to 3). The trainer runs on the
tiny random Qwen3 with the real 248,320-token vocabulary; the two-process run is in
``test_two_ranks_train_formula_4`` (torchrun, gloo, slow). A last test compiles a real
``--per-turn`` trajectory (Qwen3.6 template) and checks its loss against the same formula.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from relearn.masks.rows import SCHEMA, ShardRow
from relearn.train.checkpoints import read_metrics
from relearn.train.data import Layout, collate, load_samples, trajectory_totals
from relearn.train.deepspeed_config import extensions_dir
from relearn.train.loop import train
from relearn.train.loss import step_denominator
from relearn.train.model import RossLM, build_model
from relearn.train.options import TrainOptions

ROOT = Path(__file__).resolve().parent.parent
VOCAB_USED = 5000


def _turns(rng: np.random.Generator, lengths: list[int]) -> list[list[int]]:
    return [rng.integers(0, VOCAB_USED, n).tolist() for n in lengths]


def samples_of_three_trajectories() -> list[tuple[str, str, list[int], list[int]]]:
    """(sample_id, trajectory_id, input_ids, loss_mask) of T (a context reset), P (per-turn) and U."""
    rng = np.random.default_rng(36)
    out: list[tuple[str, str, list[int], list[int]]] = []
    # T: before the reset, a prompt then two supervised turns; after it, a summary then one turn.
    p0, a1, o1, a2 = _turns(rng, [8, 20, 6, 9])
    out.append(("T#0", "T", p0 + a1 + o1 + a2, [0] * 8 + [1] * 20 + [0] * 6 + [1] * 9))
    s0, a3 = _turns(rng, [10, 5])
    out.append(("T#1", "T", s0 + a3, [0] * 10 + [1] * 5))
    # P per turn: sample k is the history up to turn k, only turn k supervised (turns of 30, 12, 4).
    q0, b1, r1, b2, r2, b3 = _turns(rng, [7, 30, 5, 12, 6, 4])
    out.append(("P@1", "P", q0 + b1, [0] * 7 + [1] * 30))
    out.append(("P@2", "P", q0 + b1 + r1 + b2, [0] * 42 + [1] * 12))
    out.append(("P@3", "P", q0 + b1 + r1 + b2 + r2 + b3, [0] * 60 + [1] * 4))
    u0, c1 = _turns(rng, [6, 16])
    out.append(("U", "U", u0 + c1, [0] * 6 + [1] * 16))
    return out


def write_shard(path: Path, rows: list[tuple[str, str, list[int], list[int]]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    records = [
        {
            "sample_id": sid,
            "trajectory_id": tid,
            "input_ids": ids,
            "loss_mask": mask,
            "n_tokens": len(ids),
            "eligible": sum(mask),
            "excluded": 0,
            "supervised": sum(mask[1:]),
            "ter": 0.0,
            "mode": "ross",
        }  # fmt: skip
        for sid, tid, ids, mask in rows
    ]
    pq.write_table(pa.Table.from_pylist(records, schema=SCHEMA), path / "shard-00000.parquet")
    return path


def trainer_model() -> torch.nn.Module:
    """The model ``relearn train --tiny qwen3 --seed 0`` starts from (``loop._build``)."""
    torch.manual_seed(0)
    model = build_model(tiny="qwen3", seed=0, attn_implementation="sdpa", max_positions=262_144)
    model.train()  # no dropout in the tiny configs; train() as the trainer has it
    return model


def hand_loss(model: torch.nn.Module, rows: list[tuple[str, str, list[int], list[int]]]) -> tuple[float, float]:
    """(formula 4 over trajectories, the old per-sample mean), from full logits sample by sample."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    per_sample: list[float] = []
    with torch.no_grad():
        for _, tid, ids, mask in rows:
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits.float()[0]
            nll = -F.log_softmax(logits[:-1], -1).gather(-1, x[0, 1:, None])[:, 0].double()
            m = torch.tensor(mask[1:], dtype=torch.float64)
            sums[tid] = sums.get(tid, 0.0) + float((nll * m).sum())
            counts[tid] = counts.get(tid, 0) + int(m.sum())
            per_sample.append(float((nll * m).sum() / m.sum()))
    formula4 = sum(sums[t] / counts[t] for t in sums) / len(sums)
    return formula4, sum(per_sample) / len(per_sample)


@pytest.fixture(scope="module")
def rows() -> list[tuple[str, str, list[int], list[int]]]:
    return samples_of_three_trajectories()


@pytest.fixture(scope="module")
def expected(rows: list[tuple[str, str, list[int], list[int]]]) -> tuple[float, float]:
    return hand_loss(trainer_model(), rows)


def test_loader_counts_each_trajectory_whole(rows: list[tuple[str, str, list[int], list[int]]], tmp_path: Path) -> None:
    samples, report = load_samples(write_shard(tmp_path / "d", rows), ctx=128)
    assert report.trajectories == 3 and len(samples) == 6
    by_id = dict(zip((s.sample_id for s in samples), trajectory_totals(samples), strict=True))
    assert {s.sample_id: s.supervised for s in samples} == {"T#0": 29, "T#1": 5, "P@1": 30, "P@2": 12, "P@3": 4, "U": 16}
    assert by_id == {"T#0": 34, "T#1": 34, "P@1": 46, "P@2": 46, "P@3": 46, "U": 16}
    # Each trajectory's fractions add up to one: an epoch weighs it once.
    assert abs(step_denominator([s.supervised for s in samples], "trajectory", trajectory_totals(samples)) - 3.0) < 1e-12
    assert step_denominator([s.supervised for s in samples], "trajectory") == 6.0  # each sample alone: six units


def test_micro_batches_and_ranks_add_up_to_formula_4(
    rows: list[tuple[str, str, list[int], list[int]]], expected: tuple[float, float]
) -> None:
    """The loss the trainer computes per micro-batch, for one step laid out several ways."""
    formula4, per_sample = expected
    assert abs(formula4 - per_sample) > 1e-3  # the old per-sample normalisation is a different number
    samples = [ShardRow(sid, tid, np.array(ids, dtype=np.int32), np.array(m, dtype=np.uint8)) for sid, tid, ids, m in rows]
    totals = trajectory_totals(samples)
    model = RossLM(trainer_model(), norm="trajectory", chunk=7)
    order = [3, 0, 5, 2, 1, 4]  # T and P spread over the micro-batches and ranks below
    denominator = step_denominator([s.supervised for s in samples], "trajectory", totals)
    for layout in (Layout(1, 1, 6), Layout(1, 6, 1), Layout(1, 3, 2), Layout(2, 3, 1), Layout(3, 1, 2)):
        step = [(i,) for i in order]
        total = 0.0
        with torch.no_grad():
            for rank in range(layout.world):
                for micro in layout.micro_rows(step, 0, rank):
                    b = collate(samples, micro, totals=totals)
                    total += model(
                        b.input_ids, b.loss_mask, segments=b.segments, n_segments=b.n_segments, docs=b.docs,
                        position_ids=b.position_ids, packed=b.packed, denominator=denominator,
                        segment_counts=torch.tensor(b.trajectory_supervised),
                    ).item()  # fmt: skip
        assert abs(total - formula4) < 1e-5, (layout, total, formula4)


def _train(data: Path, out: Path, **kw: int) -> list[dict]:  # type: ignore[type-arg]
    train(TrainOptions(dataset=data, out=out, tiny="qwen3", epochs=1, lr=0.0, warmup=0, chunk=8, ctx=128, progress=False, **kw))  # type: ignore[arg-type]
    return read_metrics(out)


def test_trainer_steps_give_formula_4(
    rows: list[tuple[str, str, list[int], list[int]]], expected: tuple[float, float], tmp_path: Path
) -> None:
    formula4, _ = expected
    data = write_shard(tmp_path / "data", rows)
    # One step: all six samples in one micro-batch, then one sample per micro-batch (accumulation).
    for name, kw in (("one", {"batch_trajectories": 6}), ("accum", {"grad_accum": 6})):
        metrics = _train(data, tmp_path / name, **kw)
        assert len(metrics) == 1 and abs(metrics[0]["trajectories"] - 3.0) < 1e-9
        assert abs(metrics[0]["loss"] - formula4) < 1e-5, (name, metrics[0]["loss"], formula4)
    # Three steps of two samples: trajectories fall across steps, each step counts its fractions.
    metrics = _train(data, tmp_path / "steps", batch_trajectories=2)
    assert len(metrics) == 3
    fractions = [m["trajectories"] for m in metrics]
    assert abs(sum(fractions) - 3.0) < 1e-9 and any(abs(f - round(f)) > 1e-6 for f in fractions)
    epoch = sum(m["loss"] * m["trajectories"] for m in metrics) / sum(fractions)
    assert abs(epoch - formula4) < 1e-5, (epoch, formula4)


@pytest.mark.slow  # torchrun starts two DeepSpeed processes
def test_two_ranks_train_formula_4(
    rows: list[tuple[str, str, list[int], list[int]]], expected: tuple[float, float], tmp_path: Path
) -> None:
    """Two gloo ranks, three micro-batches each: one step holding all six samples."""
    formula4, _ = expected
    data = write_shard(tmp_path / "data", rows)
    out = tmp_path / "ranks"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions_dir()), "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [
        str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "relearn.cli.train", str(data),
        "--out", str(out), "--tiny", "qwen3", "--epochs", "1", "--lr", "0", "--warmup", "0", "--chunk", "8", "--ctx", "128",
        "--grad-accum", "3", "--zero", "2", "--no-progress",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "world 2" in result.stderr and "6 samples of 3 trajectories" in " ".join(result.stderr.split())
    metrics = read_metrics(out)
    assert len(metrics) == 1 and abs(metrics[0]["trajectories"] - 3.0) < 1e-9
    assert abs(metrics[0]["loss"] - formula4) / formula4 < 1e-4, (metrics[0]["loss"], formula4)


def test_a_real_per_turn_compile_trains_as_one_trajectory(tok) -> None:  # noqa: ANN001
    """`--per-turn` through the real compiler and Qwen3.6 template: four samples of one
    trajectory, whose loss in one step is the trajectory's mean supervised NLL, not the mean of
    the four samples' means."""
    from relearn.masks.compile import CompileOptions, compile_trajectory
    from tests.test_masks import BASE, trajectory

    messages = [
        *BASE,
        {"role": "user", "content": "Now add a test."},
        {"role": "assistant", "generated": True, "reasoning_content": "Write it.", "content": "Added."},
    ]
    compiled = compile_trajectory(trajectory(messages), None, tok, CompileOptions(mode="positive", per_turn=True))
    assert len(compiled) == 4 and len({s.trajectory_id for s in compiled}) == 1
    samples = [ShardRow(s.sample_id, s.trajectory_id, s.input_ids, s.loss_mask) for s in compiled]
    totals = trajectory_totals(samples)
    assert totals == [sum(s.supervised for s in samples)] * 4 and len({s.supervised for s in samples}) > 1
    lm = trainer_model()
    rows = [(s.sample_id, s.trajectory_id, s.input_ids.tolist(), s.loss_mask.tolist()) for s in samples]
    formula4, per_sample = hand_loss(lm, rows)
    assert abs(formula4 - per_sample) > 1e-3
    batch = collate(samples, [(i,) for i in range(4)], totals=totals)
    with torch.no_grad():
        loss = RossLM(lm, chunk=16)(
            batch.input_ids, batch.loss_mask, segments=batch.segments, n_segments=batch.n_segments, docs=batch.docs,
            position_ids=batch.position_ids, packed=batch.packed, denominator=step_denominator([s.supervised for s in samples], "trajectory", totals),
            segment_counts=torch.tensor(batch.trajectory_supervised),
        ).item()  # fmt: skip
    assert abs(loss - formula4) < 1e-5, (loss, formula4)
