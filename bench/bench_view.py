"""Time to the first trajectory on screen in ``relearn view``, on a pool of 100k trajectories.

    python bench/bench_view.py [--trajectories 100000] [--keep DIR]

Generates a pool of SWE-style trajectories (task, rounds of reasoning, text, a shell or
apply_patch call and its output, final patch, verdict) with one Review per trajectory,
in a temporary folder, plain and zstd (one frame per record, as the pool writer
writes). Measures, after imports:

- ours, cold: open the pool with no saved index and run the real viewer (Textual,
  headless, 80x24) until the first trajectory, with its review, is on screen;
- ours, warm: the same once the background index has been saved beside the pool;
- the same cold open on the zstd pool;
- baseline: what a load-everything viewer does before it can show anything: parse the
  whole pool (``records.pools.read_trajectories``), then render the first trajectory.

Also prints the background index build time and the time to import the viewer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from records.pool_index import PoolIndex, ReviewIndex
from records.pools import JsonlWriter, read_trajectories
from relearn.view.app import ViewerApp
from relearn.view.catalog import Catalog
from relearn.view.marks import RenderOptions
from relearn.view.screen import TrajectoryView

WORDS = "the a function returns value when test fails because index off by one list parse token file path error we should check".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_pool(folder: Path, count: int, seed: int = 0) -> tuple[Path, Path, Path]:
    """A plain pool, the same pool in zstd, and reviews with one defect each."""
    rng = random.Random(seed)
    # A few dozen distinct bodies, reused with new ids, tasks and steps: generating 100k
    # distinct texts would take longer than everything measured.
    bodies = []
    for b in range(40):
        messages: list[dict] = [
            {"role": "system", "content": "You are a coding agent working in /testbed.", "generated": False},
            {"role": "user", "content": f"Task {b}: " + sentence(rng, 60), "generated": False},
        ]
        for turn in range(5):
            call_id = f"call_{turn}"
            command = f"grep -rn '{rng.choice(WORDS)}' pkg/ | head -{rng.randint(5, 50)}"
            messages.append(
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": sentence(rng, rng.randint(20, 60)),
                    "content": sentence(rng, rng.randint(5, 15)),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "shell", "arguments": {"command": ["bash", "-lc", command]}},
                        }
                    ],
                }
            )
            output = "\n".join(
                f"pkg/mod{rng.randint(0, 9)}.py:{rng.randint(1, 500)}: {sentence(rng, 8)}" for _ in range(rng.randint(3, 12))
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": "shell",
                    "content": output,
                    "generated": False,
                    "metadata": {"exit_code": 0},
                }
            )
        messages.append({"role": "assistant", "generated": True, "content": "Done: " + sentence(rng, 20)})
        bodies.append(messages)
    pool, zst, reviews = folder / "pool.jsonl", folder / "pool.jsonl.zst", folder / "reviews.jsonl"
    patch = "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x - 1\n+    return x + 1\n"
    with open(pool, "w", encoding="utf-8") as plain, JsonlWriter(zst) as compressed, open(reviews, "w", encoding="utf-8") as review_file:
        for i in range(count):
            messages = bodies[i % len(bodies)]
            resolved = rng.random() < 0.6
            record = {
                "schema_version": "1.0",
                "id": f"bench-{i:06d}",
                "task_id": f"task-{i % 500}",
                "policy": {"name": "bench-policy", "checkpoint": f"iter-{i // 1000}", "step": i // 1000},
                "attempt": i // 500,
                "messages": messages,
                "final_patch": patch,
                "exit_status": "submitted",
                "outcome": {
                    "reward": 1.0 if resolved else 0.0,
                    "resolved": resolved,
                    "verdict": {
                        "tests": {
                            "FAIL_TO_PASS": {"success": ["t1"], "failure": []},
                            "PASS_TO_PASS": {"success": ["t2", "t3"], "failure": []},
                        }
                    },
                },
            }
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
            plain.write(line + "\n")
            compressed.write(record)
            command = json.dumps(messages[2]["tool_calls"][0]["function"]["arguments"], ensure_ascii=False)
            quote = "grep"
            review = {
                "schema_version": "1.0",
                "trajectory_id": record["id"],
                "decision": "accept" if resolved else "reject",
                "reason": None if resolved else "not verified positive",
                "errors": [{"step": 1, "category": "redundant_exploration", "description": "searched twice"}],
                "defects": [
                    {
                        "message_index": 2,
                        "field": "tool_calls[0].arguments",
                        "start": command.index(quote),
                        "end": command.index(quote) + len(quote),
                        "quote": quote,
                        "category": "redundant_exploration",
                        "description": "searched twice",
                    }
                ],
            }
            review_file.write(json.dumps(review, separators=(",", ":")) + "\n")
    return pool, zst, reviews


async def first_on_screen(pool: Path, reviews: Path, *, cache: bool) -> tuple[float, ViewerApp, Catalog]:
    """Seconds from opening the pool to the first trajectory on screen in the real viewer."""
    started = time.perf_counter()
    catalog = Catalog(PoolIndex(pool, cache=cache).start(), ReviewIndex(reviews, cache=cache).start())
    app = ViewerApp(catalog)
    async with app.run_test(size=(80, 24)) as pilot:
        while app.first_shown is None:
            await pilot.pause(0.005)
            if not app.is_running or time.perf_counter() - started > 120:
                raise RuntimeError(
                    f"nothing on screen after {time.perf_counter() - started:.0f} s: {len(catalog.pool):,} indexed, failure {catalog.pool._failure!r}, errors {catalog.pool.errors[:3]}"
                )
        elapsed = app.first_shown - started
        assert app.view is not None and app.view.review is not None, "the first trajectory shows without its review"
    return elapsed, app, catalog


def finish(catalog: Catalog) -> float:
    """Let the background indexes finish (they would compete with what is measured next)."""
    started = time.perf_counter()
    catalog.pool.join()
    if catalog.reviews is not None:
        catalog.reviews.join()
    return time.perf_counter() - started


def baseline(pool: Path, reviews: Path) -> float:
    started = time.perf_counter()
    trajectories = list(read_trajectories(pool))
    review_map = {}
    with open(reviews, encoding="utf-8") as handle:
        for line in handle:
            data = json.loads(line)
            review_map[data["trajectory_id"]] = data
    from records.review import Review

    first = trajectories[0]
    view = TrajectoryView(first, Review.model_validate(review_map[first.id]), total=len(trajectories))
    from rich.console import Console

    Console(file=open("/dev/null", "w"), width=80).print(view.header(), view.step(1, RenderOptions()))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="generate into this folder and keep it")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-view-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        pool, zst, reviews = make_pool(folder, args.trajectories)
        print(
            f"pool: {args.trajectories:,} trajectories, {pool.stat().st_size / 1e6:,.0f} MB plain, {zst.stat().st_size / 1e6:,.0f} MB zstd; "
            f"reviews {reviews.stat().st_size / 1e6:,.0f} MB (generated in {time.perf_counter() - t:.1f} s)"
        )
        importing = subprocess.run(
            [sys.executable, "-c", "import time; t = time.perf_counter(); import relearn.view.app; print(time.perf_counter() - t)"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        print(f"import of the viewer (relearn.view.app, Textual): {float(importing.stdout):.2f} s, once per process")

        tiny = folder / "tiny"
        tiny.mkdir()
        tiny_pool, _, tiny_reviews = make_pool(tiny, 3)
        startup, _, catalog = asyncio.run(first_on_screen(tiny_pool, tiny_reviews, cache=False))
        finish(catalog)
        print(f"first start of a Textual app in a process (3-trajectory pool, not counted below): {startup:.2f} s")

        cold, app, catalog = asyncio.run(first_on_screen(pool, reviews, cache=True))
        print(f"ours, cold (no saved index): first trajectory on screen in {cold:.3f} s")
        indexed = finish(catalog) + cold
        print(f"  the background index of {len(catalog.pool):,} trajectories and their reviews was saved {indexed:.1f} s after opening")
        warm, _, catalog = asyncio.run(first_on_screen(pool, reviews, cache=True))
        print(f"ours, warm (saved index): first trajectory on screen in {warm:.3f} s")
        print(f"  the saved index was read {finish(catalog) + warm:.1f} s after opening")
        zst_cold, _, catalog = asyncio.run(first_on_screen(zst, reviews, cache=False))
        print(f"ours, zstd pool, cold: first trajectory on screen in {zst_cold:.3f} s")
        print(f"  its background index finished {finish(catalog) + zst_cold:.1f} s after opening")
        base = baseline(pool, reviews)
        print(f"baseline (parse the whole pool, then render): {base:.2f} s")
        print(f"ratio: cold open is {base / cold:,.0f}x faster than the baseline (warm: {base / warm:,.0f}x)")
        verdict = "under" if max(cold, warm, zst_cold) < 2.0 else "NOT under"
        print(f"first trajectory on screen {verdict} 2 s on {args.trajectories:,} trajectories")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
