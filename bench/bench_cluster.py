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
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from envs.docker_backend import client_from_env  # noqa: E402
from envs.executor import DOCKER_RESOURCE, LocalBackend, Needs, RayBackend, run_units  # noqa: E402
from envs.images import build_base, task_image  # noqa: E402
from envs.tasks import load_tasks  # noqa: E402
from harness.collect import collect  # noqa: E402
from harness.policies.base import PolicySpec  # noqa: E402
from harness.policies.make import make_policy  # noqa: E402
from tests.model_servers import ModelServer  # noqa: E402
from tests.scripted import solver  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--attempts", type=int, default=2)
    args = parser.parse_args()
    client = client_from_env()
    base = build_base(client, log=lambda _m: None)
    tasks = load_tasks(MINI_SUITE)[0]
    for task in tasks:
        task_image(client, task, base)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        first = cluster.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 1})
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        local = LocalBackend(4)
        try:
            local_ms = per_unit_ms(local, args.units)
        finally:
            local.close()
        ray_ms = per_unit_ms(RayBackend(cluster.address, Needs(cpus=0.25)), args.units)
        print(f"per-unit overhead on trivial units ({args.units}): local threads {local_ms:.3f} ms, Ray {ray_ms:.2f} ms")
        n = len(tasks) * args.attempts
        print(f"\nmini suite x {args.attempts} attempts ({n} episodes), episodes per minute:")
        for workers in (1, 2):
            backend = LocalBackend(workers)
            try:
                print(f"  local backend, {workers} worker(s):  {episodes_per_minute(client, tasks, base, backend, args.attempts):6.1f}")
            finally:
                backend.close()
        print(f"  Ray, 1 worker node:             {episodes_per_minute(client, tasks, base, RayBackend(cluster.address, Needs(docker=1)), args.attempts):6.1f}")
        cluster.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 1})
        assert first is not None
        print(f"  Ray, 2 worker nodes:            {episodes_per_minute(client, tasks, base, RayBackend(cluster.address, Needs(docker=1)), args.attempts):6.1f}")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
