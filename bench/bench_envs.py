"""Container backend costs, each beside the plain Docker CLI as the baseline.

    python bench/bench_envs.py [--execs 50] [--containers 10] [--tasks 4]

Prints: per-exec overhead of Container.exec against `docker exec <id> true` run through
the CLI; create+start+remove time against `docker run -d` + `docker rm -f`; and
verification throughput (gold patches of the bundled mini suite) with 1 and 2 workers.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from envs.batch import Prediction, verify_batch
from envs.docker_backend import Container, client_from_env
from envs.images import build_base, task_image
from envs.tasks import load_tasks

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"


def timed(action, repeat: int) -> list[float]:  # noqa: ANN001
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return samples


def row(name: str, ours: list[float], baseline: list[float]) -> None:
    a, b = statistics.median(ours), statistics.median(baseline)
    print(f"{name:34s}{a * 1000:10.1f}{b * 1000:12.1f}{a / b:9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--containers", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=4, help="mini tasks to verify (gold patches)")
    args = parser.parse_args()

    client = client_from_env()
    base = build_base(client, log=lambda _m: None)
    print(f"{'median, ms':34s}{'relearn':>10s}{'docker CLI':>12s}{'ratio':>10s}")

    with Container.start(client, base) as box:
        ours = timed(lambda: box.exec("true"), args.execs)
        cli = timed(lambda: subprocess.run(["docker", "exec", box.id, "true"], check=True, capture_output=True), args.execs)
    row("exec `true`", ours, cli)

    ours = timed(lambda: Container.start(client, base).remove(), args.containers)

    def cli_cycle() -> None:
        cid = subprocess.run(
            ["docker", "run", "-d", "--network", "none", base, "sleep", "infinity"], check=True, capture_output=True, text=True
        ).stdout.strip()
        subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True)

    row("create + start + remove", ours, timed(cli_cycle, args.containers))

    tasks, _errors = load_tasks(MINI_SUITE)
    chosen = tasks[: args.tasks]
    for task in chosen:
        task_image(client, task, base)
    predictions = [Prediction(t.instance_id, t.patch, "gold") for t in chosen]
    by_id = {t.instance_id: t for t in chosen}
    print(f"\nverification of {len(chosen)} gold patches (fresh container, patch, tests, grading each)")
    rates = {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            summary = verify_batch(client, by_id, predictions, Path(tmp) / "v.jsonl", workers=workers, base_image=base)
            elapsed = time.perf_counter() - start
        assert all(v.resolved for v in summary.verdicts) and not summary.errors, summary.errors
        rates[workers] = len(chosen) / elapsed
        print(f"  {workers} worker(s): {elapsed:6.1f} s, {rates[workers] * 60:6.1f} verifications/min")
    print(f"  speed-up with 2 workers: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
