"""Peak memory of `relearn run` on a pool of N and of 4N generated SWE rollouts.

    python bench/bench_pipeline.py [--n 700] [--turns 20] [--keep DIR]

Each dataset is a chat-format JSON Lines file of resolved SWE rollouts (a system prompt, tool
schemas, an issue, then tens of assistant turns with shell and editor tool calls, their outputs,
some of them failing, a final patch: a few thousand tokens each). Each run is the pipeline of
one file: ``[pool.import]`` format chat, verify (the rows' own grades: no task of the mini suite
among them, nothing to grade in containers), the heuristic review, and the masks of two variants
(ross, positive), in a fresh process. The parent reads the child's peak resident memory from
``wait4`` (the largest of the child and what it waited for); the child records each stage's own peak
(the peak is reset before each stage, Linux's ``clear_refs``; it includes what earlier stages
left resident), and the stages whose peak grows with the pool are named.

Target (issue 33): the 4N run's peak at most 1.25x the N run's and under 2 GB, i.e. no stage
holds the pool, its reviews or its shards in memory.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

LIMIT_RATIO, LIMIT_BYTES = 1.25, 2e9

SYSTEM = (
    "You are a software engineering agent working in a checked-out repository at /testbed. "
    "Use the tools to read code, run commands and edit files; when the issue is fixed, finish. "
) * 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a bash command in the repository and return its output and exit code.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View a file, or replace an exact string in it with another.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "str_replace"]},
                    "path": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "finish", "description": "End the episode.", "parameters": {"type": "object", "properties": {}}},
    },
]
WORDS = (
    "value parser config request handler module return none default raise error index field cache token path "
    "result object list dict string test case fixture import function class method argument keyword option"
).split()


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _code(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        out.append(f"{i + 1:4d}    {'    ' * (i % 3)}{a}_{b} = self.{b}({a}, default={i})")
    return "\n".join(out)


def _call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def rollout(n: int, turns: int) -> dict[str, Any]:
    """One resolved SWE rollout as a chat row: about 4k tokens with ``turns`` tool calls."""
    rng = random.Random(n)
    module = f"pkg/{rng.choice(WORDS)}_{rng.choice(WORDS)}.py"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Issue #{n}: {_prose(rng, 120)}\n\nSteps to reproduce:\n{_code(rng, 6)}"},
    ]
    for turn in range(turns):
        call_id = f"call_{n}_{turn}"
        if turn % 3 == 1:
            call = _call(call_id, "str_replace_editor", command="view", path=module)
            output = _code(rng, rng.randint(8, 20))
        elif turn % 3 == 2:
            old, new = _code(rng, 2), _code(rng, 2)
            call = _call(call_id, "str_replace_editor", command="str_replace", path=module, old_str=old, new_str=new)
            output = f"The file {module} has been edited."
        else:
            failing = rng.random() < 0.2
            call = _call(call_id, "execute_bash", command=f"python -m pytest tests/test_{rng.choice(WORDS)}.py -q")
            output = (
                f"Traceback (most recent call last):\n{_code(rng, 5)}\nAttributeError: {_prose(rng, 8)}\n[exit code 1]"
                if failing
                else f"{'.' * rng.randint(5, 40)}\n{rng.randint(5, 40)} passed in 0.{rng.randint(10, 99)}s\n[exit code 0]"
            )
        messages.append({"role": "assistant", "content": _prose(rng, rng.randint(15, 45)), "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": call["function"]["name"], "content": output})
    messages.append({"role": "assistant", "content": "The tests pass; done.", "tool_calls": [_call(f"call_{n}_end", "finish")]})
    messages.append({"role": "tool", "tool_call_id": f"call_{n}_end", "name": "finish", "content": ""})
    patch = f"diff --git a/{module} b/{module}\n--- a/{module}\n+++ b/{module}\n@@ -1 +1 @@\n-x = 1\n+x = {n}\n"
    return {
        "id": f"run-{n}",
        "instance_id": f"benchorg__project-{n}",
        "messages": messages,
        "tools": TOOLS,
        "resolved": True,
        "patch": patch,
    }


def write_dataset(path: Path, count: int, turns: int) -> int:
    with open(path, "w", encoding="utf-8") as handle:
        for n in range(count):
            handle.write(json.dumps(rollout(n, turns)) + "\n")
    return path.stat().st_size


def write_pipeline(folder: Path, dataset: Path) -> Path:
    text = f"""workdir = "work"
[pool.import]
format = "chat"
paths = ["{dataset}"]
[review]
reviewer = "heuristic"
[masks]
variants = ["ross", "positive"]
"""
    (folder / "pipeline.toml").write_text(text)
    return folder / "pipeline.toml"


def _high_water_mark() -> float:
    """This process's peak resident memory since the last reset, in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(pipeline: Path, out: Path) -> None:
    """Run the pipeline as `relearn run` does, recording each stage's peak RSS."""
    from rich.console import Console

    from relearn.pipeline import plan
    from relearn.pipeline.config import load_pipeline

    peaks: dict[str, float] = {}
    plain = plan.run_stages

    def measured(stage_list: list[Any], *args: Any, **kwargs: Any) -> Any:
        def wrap(stage: Any) -> Any:
            def run() -> dict[str, Any]:
                Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again at what is resident now
                try:
                    return stage.run()
                finally:
                    peaks[stage.name] = _high_water_mark()

            return replace(stage, run=run)

        return plain([wrap(s) for s in stage_list], *args, **kwargs)

    plan.run_stages = measured  # the bench's own probe; the pipeline is otherwise the one `relearn run` runs
    results, _ctx = plan.run_pipeline(load_pipeline(pipeline), Console(file=io.StringIO()))
    failed = [f"{r.name}: {r.error}" for r in results if r.status == "failed"]
    counts = {r.name: r.counts for r in results}
    out.write_text(json.dumps({"peaks": peaks, "failed": failed, "counts": counts}, default=str))


def run_child(pipeline: Path) -> tuple[float, float, dict[str, Any]]:
    """(seconds, peak RSS in bytes of the child and what it waited for, what the child wrote)."""
    report = pipeline.with_name("child.json")
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, __file__, "--child", str(pipeline), str(report)])
    _pid, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"the pipeline process exited {process.returncode}")
    return seconds, usage.ru_maxrss * 1024, json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=700, help="rollouts in the smaller dataset (the larger has 4x)")
    parser.add_argument("--turns", type=int, default=20, help="tool calls per rollout")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary folder, removed)")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    root.mkdir(parents=True, exist_ok=True)
    figures: dict[int, float] = {}
    stage_peaks: dict[int, dict[str, float]] = {}
    try:
        for count in (args.n, 4 * args.n):
            folder = root / f"n{count}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            size = write_dataset(folder / "rollouts.jsonl", count, args.turns)
            seconds, peak, report = run_child(write_pipeline(folder, folder / "rollouts.jsonl"))
            if report["failed"]:
                raise SystemExit(f"{count} rollouts: a stage failed: {report['failed']}")
            pool_size = (folder / "work" / "pool" / "trajectories.jsonl").stat().st_size
            masks = report["counts"].get("masks:ross", {})
            print(
                f"{count:6d} rollouts: dataset {size / 1e6:6.1f} MB, pool {pool_size / 1e6:6.1f} MB, "
                f"{masks.get('samples', '?')} samples/variant, {masks.get('supervised_tokens', 0) / 1e6:.1f}M supervised tokens (ross); "
                f"{seconds:6.1f} s, peak RSS {peak / 1e6:6.0f} MB"
            )
            print("        peak RSS of each stage: " + ", ".join(f"{name} {p / 1e6:.0f}" for name, p in report["peaks"].items()) + " (MB)")
            figures[count] = peak
            stage_peaks[count] = report["peaks"]
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    small, large = figures[args.n], figures[4 * args.n]
    ratio = large / small
    growth = {name: peak / stage_peaks[args.n][name] for name, peak in stage_peaks[4 * args.n].items() if name in stage_peaks[args.n]}
    print("stage peaks 4N / N: " + ", ".join(f"{name} {g:.2f}x{' (grows)' if g > LIMIT_RATIO else ''}" for name, g in growth.items()))
    meets = ratio <= LIMIT_RATIO and large < LIMIT_BYTES
    print(
        f"peak RSS 4N / N = {ratio:.2f}x (target <= {LIMIT_RATIO}x and under {LIMIT_BYTES / 1e9:.0f} GB): {'meets' if meets else 'MISSES'} the target"
    )
    if not meets:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
