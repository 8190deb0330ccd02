"""reviews.jsonl is written in the pool's order, whatever order the judges answer in: two runs
of one review with several workers, a run with one worker, and a run killed mid-way and
resumed all write the same bytes; the killed run loses no paid judge call (issue 47)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from envs.executor import LocalBackend, run_units
from harness.policies.base import PolicySpec
from harness.scripted.servers import ModelServer, ScriptedTurn
from records.pools import write_atomic
from records.trajectory import Trajectory
from review.in_order import InOrder
from review.judges import Judge
from review.run import review_pool

COUNT = 16
PRICE = {"price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0}


def rollout(number: int) -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": f"traj-{number:03d}",
            "task_id": f"task-{number}",
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"Fix add() in calc.py. TRAJ-{number:03d}."},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": "The bug must be in the parser. I will read it first.",
                    "content": "Reading the file.",
                    "tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": {"command": "cat parser.py"}}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "Exit code: 1\nOutput:\ncat: parser.py: No such file"},
                {"role": "assistant", "generated": True, "content": "Done."},
            ],
            # Every fifth one failed its tests: rejected without a call, so not every line waits on a judge.
            "outcome": {"resolved": number % 5 != 4, "reward": float(number % 5 != 4)},
            "final_patch": "diff --git a/calc.py b/calc.py\n",
        }
    )


def answer(body: dict[str, Any]) -> ScriptedTurn:
    """Both judges; how long each answer takes depends on the trajectory, so the workers
    finish them in another order than the pool's (the early ones are the slow ones)."""
    text = json.dumps(body)
    number = int(text.split("TRAJ-", 1)[1][:3])
    delay = 0.02 * ((COUNT - number) % 7)
    if "localize confirmed errors" in text:
        spans = [{"error": 0, "field": "reasoning_content", "quote": "The bug must be in the parser."}]
        return ScriptedTurn(content=json.dumps({"spans": spans}), input_tokens=500, output_tokens=50, delay_s=delay)
    error = {"step": 1, "category": "wrong_hypothesis", "description": f"blames the parser (TRAJ-{number:03d})", "evidence": "no parser.py"}
    verdict = {"decision": "accept", "reason": "solved", "errors": [error], "omissions": []}
    return ScriptedTurn(content=json.dumps(verdict), input_tokens=2000 + number, output_tokens=100, delay_s=delay)


def judges(server: ModelServer) -> tuple[Judge, Judge]:
    spec = PolicySpec(kind="chat", model="judge-model", base_url=server.base_url, backoff_base_s=0.001, **PRICE)  # type: ignore[arg-type]
    return Judge(spec, "judge1"), Judge(spec, "judge2")


def ids(path: Path) -> list[str]:
    return [json.loads(line)["trajectory_id"] for line in path.read_text().splitlines()]


def test_several_workers_write_the_pools_order_byte_for_byte(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(COUNT)])
    with ModelServer("chat", answer) as server:
        for name, workers in (("a", 4), ("b", 4), ("serial", 1)):
            (tmp_path / name).mkdir()
            summary, ledger = review_pool(pool, tmp_path / name / "reviews.jsonl", judges=judges(server), workers=workers)
            assert summary.reviewed == COUNT and ledger.calls == 2 * (COUNT - COUNT // 5)
    first = (tmp_path / "a/reviews.jsonl").read_bytes()
    assert ids(tmp_path / "a/reviews.jsonl") == [f"traj-{n:03d}" for n in range(COUNT)]
    assert (tmp_path / "b/reviews.jsonl").read_bytes() == first
    assert (tmp_path / "serial/reviews.jsonl").read_bytes() == first
    costs = [json.loads(line)["cost_usd"] for line in first.decode().splitlines()]
    assert all(c > 0 for n, c in enumerate(costs) if n % 5 != 4) and all(c == 0 for n, c in enumerate(costs) if n % 5 == 4)


def test_a_review_killed_mid_way_and_resumed_writes_a_lone_runs_bytes(relearn_bin: str, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(COUNT)])
    env = {**os.environ, "OPENAI_API_KEY": "local"}
    with ModelServer("chat", answer) as server:
        cli = [relearn_bin, "review", "pool", str(pool), "--judge1", "judge-model", "--backend", "chat", "--base-url", server.base_url]
        cli += ["--price-in", "3", "--price-out", "15", "--workers", "4", "-o"]
        lone = subprocess.run([*cli, str(tmp_path / "lone.jsonl")], env=env, capture_output=True, text=True, timeout=300)
        assert lone.returncode == 0, lone.stderr
        lone_calls = len(server.requests)

        killed = tmp_path / "killed.jsonl"
        first = subprocess.Popen([*cli, str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None and (not killed.exists() or len(killed.read_bytes().splitlines()) < 3):
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        written = ids(killed)
        assert 3 <= len(written) < COUNT and written == [f"traj-{n:03d}" for n in range(len(written))]
        paid = len((tmp_path / "killed.jsonl.calls.jsonl").read_text().splitlines())
        before = len(server.requests)
        resumed = subprocess.run([*cli, str(killed)], env=env, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        # Every answer the killed run had received (in its cache) is not asked for again.
        assert len(server.requests) - before == lone_calls - paid
    assert killed.read_bytes() == (tmp_path / "lone.jsonl").read_bytes()


def test_the_window_holds_about_the_work_in_flight_not_the_pool() -> None:
    """A first unit far slower than the rest: nothing new starts while the window is full,
    so the results waiting behind it stay few; they are handed back in order."""
    order: InOrder[int] = InOrder()
    written: list[int] = []
    most = 0

    def work(unit: int) -> int:
        time.sleep(0.4 if unit == 0 else 0.002)
        return unit

    def finished(unit: int, result: int) -> None:
        nonlocal most
        order.done(unit, lambda: written.append(result))
        most = max(most, order.waiting)

    units = list(range(200))
    backend = LocalBackend(4)
    try:
        run_units(backend, order.numbered(units), work, on_result=finished, on_error=lambda *_: False, hold=lambda: order.full(4))
    finally:
        backend.close()
    # Full at 4 waiting, nothing new starts; the 3 already running beside the slow one may
    # still finish and wait too: the bound is the window plus the work in flight, never the pool.
    assert written == units and most <= 4 + 3
