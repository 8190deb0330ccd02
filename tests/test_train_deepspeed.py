"""DeepSpeed ZeRO-2 and ZeRO-3 over 2 gloo processes on CPU match the single-process run.

``torchrun --standalone --nproc_per_node 2 -m relearn.cli.train ... --zero N`` with
``DS_ACCELERATOR=cpu``. Each rank trains on 1 trajectory per step; the single-process
reference trains on the same 2 trajectories per step, so losses must agree up to float
summation order. The first DeepSpeed use JIT-compiles a shared-memory comm op (30-50 s),
cached in TORCH_EXTENSIONS_DIR (a persistent folder under the user's cache), so reruns are fast.
No skips: if DeepSpeed cannot run here, these tests fail and say why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relearn.train.checkpoints import read_metrics
from relearn.train.deepspeed_config import deepspeed_config, extensions_dir
from relearn.train.loop import train
from relearn.train.options import TrainOptions
from tests.test_train import random_rows, write_dataset

pytestmark = pytest.mark.slow  # torchrun starts two DeepSpeed processes per test

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).parent / "torchrun"
COMMON = ["--tiny", "qwen3", "--epochs", "1", "--lr", "2e-3", "--warmup", "1", "--chunk", "4", "--ctx", "64", "--no-progress"]
REL_TOL = 1e-3


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 6 trajectories of different lengths and supervised counts: the two ranks make different
    # numbers of LM-head chunk calls, which ZeRO-3 must survive (see relearn.train.loss.chunked_nll).
    return write_dataset(tmp_path_factory.mktemp("ds") / "data", random_rows(6, seed=21, lengths=(16, 48)))


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    out = tmp_path_factory.mktemp("single") / "run"
    opts = TrainOptions(
        dataset=data, out=out, tiny="qwen3", epochs=1, lr=2e-3, warmup=1, chunk=4, ctx=64, batch_trajectories=2, progress=False
    )
    train(opts)
    losses = [m["loss"] for m in read_metrics(out)]
    assert len(losses) == 3
    return losses


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
        "PYTHONPATH": str(ROOT),
        "NO_COLOR": "1",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "-m", "relearn.cli.train", *args]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, f"torchrun failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    return result


def assert_close(losses: list[float], reference: list[float]) -> None:
    assert len(losses) == len(reference)
    for ours, ref in zip(losses, reference, strict=True):
        assert abs(ours - ref) / abs(ref) < REL_TOL, (losses, reference)


def test_config_from_flags() -> None:
    config = deepspeed_config(stage=3, rows_per_micro=1, grad_accum=4, world=2, bf16=True, offload=True, clip=1.0)
    assert config["train_batch_size"] == 8 and config["gradient_accumulation_steps"] == 4
    assert config["zero_allow_untested_optimizer"] is True and config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert "offload_param" not in deepspeed_config(stage=2, rows_per_micro=1, grad_accum=1, world=1, offload=True)["zero_optimization"]
    with pytest.raises(ValueError):
        deepspeed_config(stage=0, rows_per_micro=1, grad_accum=1, world=1, offload=True)


def test_zero2_two_ranks_match_single_process(data: Path, reference: list[float], tmp_path: Path) -> None:
    out = tmp_path / "z2"
    result = torchrun(str(data), "--out", str(out), *COMMON, "--zero", "2")
    assert "ZeRO-2" in result.stderr and "world 2" in result.stderr
    assert_close([m["loss"] for m in read_metrics(out)], reference)


def test_zero3_two_ranks_match_single_process_and_resume(data: Path, reference: list[float], tmp_path: Path) -> None:
    out = tmp_path / "z3"
    # Stop after step 2 (a ZeRO-3 checkpoint with per-rank partitions), then resume to the end.
    torchrun(str(data), "--out", str(out), *COMMON, "--zero", "3", "--max-steps", "2")
    assert [m["step"] for m in read_metrics(out)] == [1, 2]
    result = torchrun(str(data), "--out", str(out), *COMMON, "--zero", "3")
    assert "resumed from" in result.stderr
    assert_close([m["loss"] for m in read_metrics(out)], reference)
    # The ZeRO-3 partitions were gathered into a whole Hugging Face model.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert model.lm_head.weight.shape == (248_320, 64)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_ulysses_sequence_parallel_two_ranks_match_single_process(data: Path, reference: list[float], tmp_path: Path) -> None:
    """--sp 2: both ranks work on the same trajectory, half of its tokens each (Ulysses all-to-all
    around attention). Rank 1's half cannot be right unless it attended to rank 0's half."""
    out = tmp_path / "sp2"
    # One data-parallel group of 2 sequence-parallel ranks: 2 micro-batches make the reference's 2 rows.
    result = torchrun(str(data), "--out", str(out), *COMMON, "--zero", "3", "--sp", "2", "--grad-accum", "2")
    assert "sequence parallel 2" in " ".join(result.stderr.split())
    assert_close([m["loss"] for m in read_metrics(out)], reference)


def test_a_build_lock_left_by_a_killed_build_is_cleared_and_a_live_one_kept(tmp_path: Path) -> None:
    """A JIT build killed part way leaves its lock, and torch waits on it forever: every later
    DeepSpeed run would hang at start (seen after a timed-out test)."""
    import time

    from relearn.train.deepspeed_config import STALE_BUILD_LOCK_S, clear_stale_build_locks

    stale, live = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    for lock in (stale, live):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - STALE_BUILD_LOCK_S - 60
    os.utime(stale, (old, old))
    assert clear_stale_build_locks(tmp_path) == [stale]
    assert not stale.exists() and live.exists()
    assert clear_stale_build_locks(tmp_path / "missing") == []
