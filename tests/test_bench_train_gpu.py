"""The prepared GPU check (``bench/bench_train_gpu.py``, ``scripts/gpu_check.sh``), on CPU: its
arguments, the shape it sizes to each card against ``relearn train --plan``, its FLOPs count, a
tiny run through the same worker and table, and the runner's message when no wheels were carried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_train_gpu as bench  # noqa: E402

from relearn.train.plan import CAPACITIES, estimate, shape_of  # noqa: E402


def test_arguments() -> None:
    args = bench.parse([])
    assert (args.tokens, args.kernels, args.layers, args.device, args.tiny) == (65_536, "both", None, "cuda", False)
    smoke = bench.parse(["--cpu-smoke"])
    assert (smoke.tokens, smoke.layers, smoke.experts, smoke.device, smoke.tiny) == (320, 2, 4, "cpu", True)
    for bad in (["--layers", "4"], ["--share", "0"], ["--steps", "0"], ["--kernels", "triton"]):
        with pytest.raises(SystemExit):
            bench.parse(bad)


def test_shape_fits_each_card_by_the_plan_and_flops_add_up() -> None:
    sizes = {}
    for card, capacity in CAPACITIES.items():
        layers, experts = bench.fit_shape(capacity, 65_536, 0.5)
        shape = shape_of(bench.shape_config(layers, experts), card, "test")
        for mode in bench.MODES:
            assert estimate(shape, bench.setting(65_536, mode, 0.5, "cuda")).peak <= bench.FIT_SHARE * capacity
        sizes[card] = shape.parameters
        assert shape.hybrid and shape.layer_kinds.count("full") * 4 == layers  # Qwen3.6's 3 : 1
    assert sizes["141 GB (H200)"] > sizes["80 GB (H100)"]  # the bigger card gets the bigger model
    config = bench.shape_config(4, 16)
    work = bench.flops(config, 1000, 400)
    assert work["attention"] == 6 * 1000**2 * 16 * 256 * 1
    assert work["head"] == 6 * 400 * 2048 * 248_320
    # Active: all but the non-routed share of the experts; the embedding is not a matmul.
    assert 0 < work["active_parameters"] < work["parameters"] - 2 * 248_320 * 2048
    assert work["total"] == pytest.approx(sum(work[k] for k in ("matmul", "head", "attention", "delta rule")))


def test_cpu_smoke_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The tiny shape through the real worker process: the reference row has a step time and a
    falling loss; the fast row says why it did not run (no CUDA here)."""
    out = tmp_path / "gpu.json"
    assert bench.main(["--cpu-smoke", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "meas/plan" in text and "not run: the fast kernels are not usable here" in text
    result = json.loads(out.read_text())
    ref, fast = result["results"]
    assert ref["mode"] == "reference" and ref["kernels_used"] == [] and ref["tokens"] == 320 and ref["step_seconds"] > 0
    assert ref["losses"][-1] < ref["losses"][0]  # it trained (lr 1e-5, three steps)
    assert "skipped" in fast and result["peak_bf16"] is None


def test_runner_without_wheels_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WHEELS": str(tmp_path / "none"), "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the fast kernels cannot be installed here, the reference path only" in done.stderr
    assert "gpu_check: fla not importable" in done.stdout and "plan (reference kernels)" in done.stdout
