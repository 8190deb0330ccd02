"""Harness costs with a scripted policy served over HTTP (the real OpenAI SDK path).

    python bench/bench_harness.py [--steps 30] [--tasks 3] [--attempts 2]

1. Overhead per step, excluding model and command time: one episode of ``--steps``
   `true` commands; per step, wall time minus the model call's time and the command's
   time is what the harness itself costs (recording with fsync, tool dispatch, output
   formatting, budget checks).
2. Collection throughput on the mini suite with 1 vs 2 workers (each episode: start a
   container, 2 model calls, 1 command, final diff, verification in a fresh container).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from envs.docker_backend import Container, client_from_env
from envs.images import build_base, task_image
from envs.tasks import load_tasks
from harness.agent import AgentConfig, run_episode
from harness.budget import Budget
from harness.collect import collect
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from harness.recorder import EpisodeRecorder
from harness.scripted.servers import ModelServer, ScriptedTurn
from harness.tools.output import default_encoding
from records.trajectory import Source, Trajectory

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"


def steps_script(steps: int):  # noqa: ANN201
    def answer(request: dict) -> ScriptedTurn:
        done = sum(1 for m in request.get("messages", []) if m.get("role") == "tool")
        if done >= steps:
            return ScriptedTurn(content="Done.")
        return ScriptedTurn(tool_calls=[("shell", {"command": ["true"]})])

    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=2)
    args = parser.parse_args()
    client = client_from_env()
    base = build_base(client, log=lambda _m: None)
    tasks = load_tasks(MINI_SUITE)[0][: args.tasks]
    task = tasks[0]
    image = task_image(client, task, base)

    started = time.perf_counter()
    default_encoding()  # once per process; not a per-step cost
    print(f"token counter (tiktoken over the Qwen3.6 ranks) loaded once in {time.perf_counter() - started:.2f} s")
    with ModelServer("chat", steps_script(args.steps)) as server, tempfile.TemporaryDirectory() as tmp:
        spec = PolicySpec(kind="chat", model="scripted", base_url=server.base_url)
        header = Trajectory(id="bench", task_id=task.instance_id, messages=[], source=Source(format="relearn"))
        with Container.start(client, image, workdir=task.workdir) as container:
            recorder = EpisodeRecorder(Path(tmp) / "e.jsonl", header)
            started = time.perf_counter()
            trajectory = run_episode(
                task, make_policy(spec), container, AgentConfig(budget=Budget(max_turns=args.steps + 5)), header, recorder
            )
            wall = time.perf_counter() - started
            recorder.close()
    model_s = sum((m.duration_ms or 0) for m in trajectory.messages if m.role == "assistant") / 1000
    tool_s = sum((m.metadata or {}).get("duration_seconds", 0) for m in trajectory.messages if m.role == "tool")
    steps = sum(1 for m in trajectory.messages if m.role == "assistant")
    overhead = (wall - model_s - tool_s) / steps
    print(f"episode: {steps} model calls, {wall:.2f} s wall; model {model_s:.2f} s, commands {tool_s:.2f} s")
    print(f"harness overhead per step (excluding model and command time): {overhead * 1000:.1f} ms")
    print(
        f"  (a step's command `true` costs {tool_s / max(steps - 1, 1) * 1000:.1f} ms in the container; the model call {model_s / steps * 1000:.1f} ms on loopback)"
    )

    print(f"\ncollection: {len(tasks)} tasks x {args.attempts} attempts, scripted policy (1 command, then an answer), verified")
    rates = {}
    for workers in (1, 2):
        with ModelServer("chat", steps_script(1)) as server, tempfile.TemporaryDirectory() as tmp:
            spec = PolicySpec(kind="chat", model="scripted", base_url=server.base_url)
            started = time.perf_counter()
            summary = collect(client, tasks, make_policy(spec), spec, Path(tmp), attempts=args.attempts, workers=workers, base_image=base)
            elapsed = time.perf_counter() - started
        assert not summary.errors, summary.errors
        rates[workers] = len(summary.finished) / elapsed
        print(f"  {workers} worker(s): {elapsed:6.1f} s, {rates[workers] * 60:5.1f} episodes/min")
    print(f"  speed-up with 2 workers: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
