"""The Ray backend's costs on this machine, against the local one.

    python bench/bench_cluster.py [--units 200] [--attempts 2]

1. Per-unit overhead on trivial units (a function returning its argument): the local
   thread backend vs the Ray backend on a local cluster (``ray.cluster_utils.Cluster``, a
   head and two worker nodes), both through ``envs.executor.run_units`` as every stage
   uses it: milliseconds per unit, wall time over units.
2. Episodes per minute for the mini suite × ``--attempts`` (scripted policy over HTTP,
   each episode: a container, two model calls, a diff, verification in a fresh container)
   with the Ray backend on 1 and on 2 worker nodes (one container at a time per node, all
   nodes on this machine's one Docker engine), and with the local backend, 1 and 2 workers.
   On one machine the nodes share its cores: the figure shows what Ray costs, not what a
   second machine gains.
3. ``relearn analyze nll`` scoring on CPU (``--nll N`` generated agentic trajectories of
   ~1,500 tokens, the tiny random Qwen3 with the real vocabulary): trajectories per second
   here (one process), with ``--workers 2`` processes and on the Ray cluster (batches of 4),
   each loading the model once per worker process (its load is in the figure), as ratios
   to the run here; the results of all three are checked equal.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

# The repository root, for bench.bench_masks: bench/ is not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from bench.bench_masks import make_trajectory  # noqa: E402
from envs.docker_backend import client_from_env  # noqa: E402
from envs.executor import DOCKER_RESOURCE, LocalBackend, Needs, RayBackend, run_units  # noqa: E402
from envs.images import build_base, task_image  # noqa: E402
from envs.tasks import load_tasks  # noqa: E402
from harness.collect import collect  # noqa: E402
from harness.policies.base import PolicySpec  # noqa: E402
from harness.policies.make import make_policy  # noqa: E402
from harness.scripted.servers import ModelServer  # noqa: E402
from harness.scripted.solutions import solver  # noqa: E402
from records.pools import write_atomic  # noqa: E402
from relearn.analyze.nll import SCORES_FILE, ModelSpec, Settings, folder_fingerprint, score_pools  # noqa: E402
from relearn.analyze.pools import NamedPool  # noqa: E402

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"


def identity(value: int) -> int:
    return value


def per_unit_ms(backend, units: int) -> float:  # noqa: ANN001
    run_units(backend, list(range(min(units, 20))), identity, on_result=lambda _u, _r: None, on_error=lambda *_: False)  # warm
    start = time.perf_counter()
    run_units(backend, list(range(units)), identity, on_result=lambda _u, _r: None, on_error=lambda *_: False)
    return (time.perf_counter() - start) / units * 1000


def episodes_per_minute(client, tasks, base: str, backend, attempts: int) -> float:  # noqa: ANN001
    with ModelServer("chat", solver({t.instance_id: t for t in tasks}, {t.instance_id for t in tasks[:4]})) as server:
        spec = PolicySpec(kind="chat", model="scripted", base_url=server.base_url)
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            summary = collect(client, tasks, make_policy(spec), spec, Path(out), attempts=attempts, base_image=base, backend=backend)
            seconds = time.perf_counter() - start
    assert not summary.errors, summary.errors[:3]
    return len(summary.finished) / seconds * 60


def nll_rates(address: str, count: int) -> None:
    """Trajectories scored per second here, by two worker processes and on the cluster."""
    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as tmp:
        pool = Path(tmp) / "pool.jsonl"
        write_atomic(pool, [make_trajectory(rng, 1500, seed) for seed in range(count)])
        settings = Settings(
            model="tiny:qwen3:seed=0",
            tokenizer="qwen3.6",
            dtype="float32",
            template_kwargs={"preserve_thinking": True},
            fingerprint=folder_fingerprint("qwen3.6"),
        )
        spec = ModelSpec(None, "qwen3", 0, "qwen3.6")
        caches, rates = [], {}
        for name, backend in (
            ("here", None),
            ("--workers 2", LocalBackend(2, processes=True)),
            ("Ray", RayBackend(address, Needs(cpus=1))),
        ):
            out = Path(tmp) / name.replace(" ", "")
            start = time.perf_counter()
            results = score_pools([NamedPool("p", pool)], settings, spec, out, backend=backend, batch=4)
            rates[name] = len(results[0].scores) / (time.perf_counter() - start)
            if backend is not None:
                backend.close()
            caches.append(sorted((out / SCORES_FILE).read_text().splitlines()))
        assert all(cache == caches[0] for cache in caches), "the scores differ between backends"
    print(f"\nanalyze nll on CPU, {count} trajectories of ~1,500 tokens (model load included), trajectories/s:")
    for name, rate in rates.items():
        print(f"  {name:12s} {rate:6.2f}  ({rate / rates['here']:.2f}x here)")


def episode_figures(cluster: Cluster, units: int, attempts: int) -> None:
    """Figures 1 and 2: per-unit overhead, then episodes per minute on 1 and 2 worker nodes."""
    client = client_from_env()
    base = build_base(client, log=lambda _m: None)
    tasks = load_tasks(MINI_SUITE)[0]
    for task in tasks:
        task_image(client, task, base)
    local = LocalBackend(4)
    try:
        local_ms = per_unit_ms(local, units)
    finally:
        local.close()
    ray_ms = per_unit_ms(RayBackend(cluster.address, Needs(cpus=0.25)), units)
    print(f"per-unit overhead on trivial units ({units}): local threads {local_ms:.3f} ms, Ray {ray_ms:.2f} ms")
    n = len(tasks) * attempts
    print(f"\nmini suite x {attempts} attempts ({n} episodes), episodes per minute:")
    for workers in (1, 2):
        backend = LocalBackend(workers)
        try:
            print(f"  local backend, {workers} worker(s):  {episodes_per_minute(client, tasks, base, backend, attempts):6.1f}")
        finally:
            backend.close()
    print(
        f"  Ray, 1 worker node:             {episodes_per_minute(client, tasks, base, RayBackend(cluster.address, Needs(docker=1)), attempts):6.1f}"
    )
    cluster.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 1})
    print(
        f"  Ray, 2 worker nodes:            {episodes_per_minute(client, tasks, base, RayBackend(cluster.address, Needs(docker=1)), attempts):6.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--nll", type=int, default=24, help="trajectories for the NLL figures (0: skip them)")
    parser.add_argument("--no-episodes", action="store_true", help="skip the overhead and episode figures (the NLL ones alone)")
    args = parser.parse_args()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 1})
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        if not args.no_episodes:
            episode_figures(cluster, args.units, args.attempts)
        if args.nll:
            nll_rates(cluster.address, args.nll)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
