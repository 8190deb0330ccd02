"""The stages on a real Ray cluster on this machine: a head and two worker nodes (Ray's
``cluster_utils.Cluster``, real raylets and worker processes) sharing this machine's Docker
engine, each node with its own ``docker`` resource. Collect and verify through Ray must
write what the local run writes; a node killed mid-episode loses nothing and duplicates
nothing; a spend cap holds across nodes to within one in-flight episode per slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import docker
import pytest
import ray
from ray.cluster_utils import Cluster

from envs.batch import Prediction, verify_batch
from envs.docker_backend import LABEL_OWNER, LABEL_PID, OWNER
from envs.executor import DOCKER_RESOURCE, ClusterError, LocalBackend, Needs, NodeLost, RayBackend, run_units
from envs.tasks import load_tasks
from harness.collect import collect
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from records.pools import read_trajectories
from records.trajectory import Trajectory
from review.judges import Judge
from review.run import review_pool
from tests.model_servers import ModelServer, ScriptedTurn
from tests.scripted import solver

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
TASKS = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
SOLVES = {"mini__calc-1", "mini__pager-1", "mini__textkit-1", "mini__ledger-1"}
FEW = [TASKS[i] for i in ("mini__calc-1", "mini__pager-1", "mini__appconf-1", "mini__httpkit-1", "mini__tabular-1")]


@pytest.fixture(scope="module")
def cluster():  # noqa: ANN201
    """Head (no docker: it gets no container work) and two workers with one container each."""
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [made.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 1}) for _ in range(2)]
    ray.init(address=made.address, include_dashboard=False, log_to_driver=False)
    yield made, workers
    ray.shutdown()
    made.shutdown()


def spec_of(server: ModelServer) -> PolicySpec:
    return PolicySpec(kind="chat", model="scripted", base_url=server.base_url, price_in_per_mtok=10.0, price_out_per_mtok=30.0)


def essentials(trajectory: Trajectory) -> tuple:
    """What must not depend on where an episode ran (timestamps and durations do)."""
    outcome = trajectory.outcome
    return (
        trajectory.id,
        trajectory.exit_status,
        trajectory.final_patch,
        [(m.role, m.content) for m in trajectory.messages],
        outcome.resolved if outcome else None,
        outcome.reward if outcome else None,
        outcome.verdict.get("tests") if outcome and outcome.verdict else None,
        trajectory.usage.cost_usd if trajectory.usage else None,
    )


def pool_of(path: Path) -> dict[str, tuple]:
    rows = [essentials(t) for t in read_trajectories(path / "trajectories.jsonl")]
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)), "a trajectory was written twice"
    return {row[0]: row for row in rows}


@pytest.fixture(scope="module")
def local_run(docker_client: docker.DockerClient, base_image: str, images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini suite × 2 attempts on the local backend: what the cluster must reproduce."""
    out = tmp_path_factory.mktemp("local")
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        spec = spec_of(server)
        summary = collect(docker_client, list(TASKS.values()), make_policy(spec), spec, out, attempts=2, workers=2, base_image=base_image)
    assert not summary.errors and len(summary.finished) == 2 * len(TASKS)
    return out


def test_collect_and_verify_on_ray_equal_the_local_run(cluster, docker_client: docker.DockerClient, base_image: str, local_run: Path, tmp_path: Path) -> None:  # noqa: ANN001
    made, workers = cluster
    backend = RayBackend(made.address, Needs(docker=1))
    assert backend.slots() == 2  # one container per worker node; the head offers none
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        spec = spec_of(server)
        summary = collect(docker_client, list(TASKS.values()), make_policy(spec), spec, tmp_path / "ray", attempts=2, base_image=base_image, backend=backend)
    assert not summary.errors
    assert pool_of(tmp_path / "ray") == pool_of(local_run)
    # Both worker nodes ran episodes, and the head (no docker resource) none.
    assert set(summary.per_node) == {w.node_id for w in workers} and sum(summary.per_node.values()) == 2 * len(TASKS)
    resolved = {t.task_id for t in read_trajectories(tmp_path / "ray" / "trajectories.jsonl") if t.outcome and t.outcome.resolved}
    assert resolved == SOLVES

    # verify through Ray: the verdicts the local collection recorded, one per (instance, patch).
    local = [t for t in read_trajectories(local_run / "trajectories.jsonl") if t.attempt == 0]
    predictions = [Prediction(t.task_id or "", t.final_patch, "scripted") for t in local]
    there = verify_batch(docker_client, TASKS, predictions, tmp_path / "there.jsonl", base_image=base_image, backend=backend)
    assert not there.errors and sum(there.per_node.values()) == len(TASKS)
    recorded = {t.task_id: (t.outcome.resolved, t.outcome.verdict["tests"]) for t in local if t.outcome and t.outcome.verdict}
    assert {v.instance_id: (v.resolved, v.tests) for v in there.verdicts} == recorded and len(recorded) == len(TASKS)
    assert not ours(docker_client)


def _runs_under(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` descends from ``ancestor`` (a raylet: its workers do)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def owned(client: docker.DockerClient) -> dict[str, int]:
    """Every relearn container on the engine, by name, with its owner's pid (one list call,
    no inspection: containers come and go while it runs)."""
    rows = client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={OWNER}"})
    return {row["Names"][0].lstrip("/"): int(row["Labels"].get(LABEL_PID, "0")) for row in rows}


def ours(client: docker.DockerClient) -> list[str]:
    """The relearn containers this test session's processes (the cluster's workers
    included) started: others may be running tests on the same engine."""
    return [name for name, pid in owned(client).items() if _runs_under(pid, os.getpid())]


def test_a_node_lost_mid_episode_is_retried_elsewhere(cluster, docker_client: docker.DockerClient, base_image: str, local_run: Path, tmp_path: Path) -> None:  # noqa: ANN001
    made, _workers = cluster
    victim = made.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 2})
    raylet = victim.all_processes["raylet"][0].process.pid
    slow = solver(TASKS, SOLVES)

    def answer(request: dict) -> ScriptedTurn:
        turn = slow(request)
        turn.delay_s = 0.5  # episodes long enough to be caught mid-way
        return turn

    backend = RayBackend(made.address, Needs(docker=1))
    assert backend.slots() == 4
    killed: list[str] = []

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            mine = [name for name, pid in owned(docker_client).items() if _runs_under(pid, raylet)]
            if mine:
                killed.extend(mine)
                made.remove_node(victim, allow_graceful=False)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_busy)
    with ModelServer("chat", answer) as server:
        spec = spec_of(server)
        killer.start()
        summary = collect(docker_client, FEW, make_policy(spec), spec, tmp_path / "ray", attempts=2, base_image=base_image, backend=backend, infra_retries=2)
        killer.join()
    assert killed, "the victim node never ran an episode"
    assert summary.retried >= 1 and not summary.infra_errors and not summary.errors
    assert sum(summary.per_node.values()) == 2 * len(FEW)
    # Every unit once, and the pool equals the uninterrupted run's.
    few = {t.instance_id for t in FEW}
    assert pool_of(tmp_path / "ray") == {i: row for i, row in pool_of(local_run).items() if i.split(":")[0] in few}
    # The killed node's containers had no owner left: the driver swept them.
    assert not set(owned(docker_client)) & set(killed) and not ours(docker_client)


def test_a_spend_cap_holds_across_nodes(cluster, docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> None:  # noqa: ANN001
    made, _workers = cluster
    backend = RayBackend(made.address, Needs(docker=1))
    slots = backend.slots()
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        spec = spec_of(server)
        one = 2 * (100 * 10.0 + 20 * 30.0) / 1e6  # a solving episode: two calls of the script's usage
        cap = 3.5 * one
        summary = collect(docker_client, list(TASKS.values()), make_policy(spec), spec, tmp_path / "cap", attempts=2, base_image=base_image, backend=backend, spend_cap_usd=cap)
    costs = [t.usage.cost_usd or 0.0 for t in summary.finished if t.usage]
    spent, biggest = sum(costs), max(costs)
    # The cap stopped the run, and the overshoot is at most one in-flight episode per slot.
    assert summary.capped > 0 and spent >= cap
    assert spent <= cap + slots * biggest, f"spent {spent:.6f} > cap {cap:.6f} + {slots} x {biggest:.6f}"
    print(f"spend cap {cap:.6f}: spent {spent:.6f} over {len(costs)} episodes, bound cap + {slots} x {biggest:.6f} = {cap + slots * biggest:.6f}")


def _square(value: int) -> int:
    if value < 0:
        raise ValueError(f"negative: {value}")
    return value * value


@pytest.mark.parametrize("where", ["local", "ray"])
def test_run_units_returns_records_and_unit_errors(cluster, where: str) -> None:  # noqa: ANN001
    backend = LocalBackend(2) if where == "local" else RayBackend(cluster[0].address, Needs(cpus=0.5))
    results: dict[int, int] = {}
    errors: list[tuple[int, str, int]] = []

    def failed(unit: int, exc: BaseException, tries: int) -> bool:
        assert not isinstance(exc, NodeLost)
        errors.append((unit, str(exc), tries))
        return tries < 2  # run again once

    run = run_units(backend, [3, -1, 4], _square, on_result=lambda u, r: results.__setitem__(u, r), on_error=failed)
    if where == "local":
        backend.close()
    assert results == {3: 9, 4: 16}
    assert errors == [(-1, "negative: -1", 1), (-1, "negative: -1", 2)]  # the unit's own exception, unwrapped
    assert sum(run.per_node.values()) == 2 and not run.not_started



def stateless_judges(request: dict) -> ScriptedTurn:
    """Both judges for the collected pool, answering from the request alone (several nodes
    call at once): judge 1 accepts with one confirmed error at step 1, judge 2 quotes it."""
    text = json.dumps(request)
    if "localize confirmed errors" in text:
        return ScriptedTurn(content=json.dumps({"spans": [{"error": 0, "field": "content", "quote": "Applying the fix."}]}), input_tokens=500, output_tokens=50)
    answer = {"decision": "accept", "reason": "solved", "errors": [{"step": 1, "category": "other", "description": "announces before checking", "evidence": "no test run first"}]}
    return ScriptedTurn(content=json.dumps(answer), input_tokens=2000, output_tokens=100)


def test_review_on_ray_equals_the_local_review(cluster, local_run: Path, tmp_path: Path) -> None:  # noqa: ANN001
    pool = local_run / "trajectories.jsonl"
    backend = RayBackend(cluster[0].address, Needs(cpus=0.5))
    outputs = {}
    with ModelServer("chat", stateless_judges) as server:
        spec = PolicySpec(kind="chat", model="judge-model", base_url=server.base_url, backoff_base_s=0.001, price_in_per_mtok=3.0, price_out_per_mtok=15.0)
        for where in ("here", "ray"):
            output = tmp_path / f"{where}.reviews.jsonl"
            summary, ledger = review_pool(pool, output, judges=(Judge(spec, "judge1"), Judge(spec, "judge2")), workers=2, backend=backend if where == "ray" else None)
            assert not summary.errors
            outputs[where] = (output, summary, ledger)
    (here, _here_summary, here_ledger), (there, there_summary, there_ledger) = outputs["here"], outputs["ray"]
    rows = {where: {r["trajectory_id"]: r for r in map(json.loads, path.read_text().splitlines())} for where, (path, _s, _l) in outputs.items()}
    # The two attempts of a task are the same text, so they ask the judges the same requests:
    # which review pays and which reads the cache depends on timing (here too, with two
    # threads), so costs are compared as totals, everything else as is.
    def verdicts(where: str) -> dict:
        return {i: {k: v for k, v in r.items() if k != "cost_usd"} for i, r in rows[where].items()}

    assert verdicts("ray") == verdicts("here") and len(rows["here"]) == 2 * len(TASKS)
    accepted = [r for r in rows["here"].values() if r["decision"] == "accept"]
    assert len(accepted) == 2 * len(SOLVES) and all(r["defects"] for r in accepted)
    # One ledger: what the nodes paid was reported back and counted once, review by review.
    for where, ledger in (("here", here_ledger), ("ray", there_ledger)):
        assert abs(ledger.spent_usd - sum(r["cost_usd"] for r in rows[where].values())) < 1e-9
    assert here_ledger.calls > 0 and there_ledger.calls >= here_ledger.calls
    # The driver wrote the nodes' judge answers to the call cache: the same entries.
    def cache_keys(path: Path) -> set[str]:
        return {json.loads(line)["key"] for line in path.with_name(path.name + ".calls.jsonl").read_text().splitlines()}

    assert cache_keys(there) == cache_keys(here)
    assert sum(there_summary.per_node.values()) == 2 * len(TASKS)


def test_masks_on_ray_write_the_local_shard_bytes(cluster, tok, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from relearn.masks.compile import MaskOptions
    from relearn.masks.shards import build_dataset, load_reviews
    from tests.test_masks_workers import files
    from tests.test_outputs_unchanged import masks_pool

    monkeypatch.chdir(tmp_path)
    pool, reviews_path = (p.relative_to(tmp_path) for p in masks_pool(tmp_path))
    reviews = load_reviews(reviews_path, [])
    options = MaskOptions(mode="ross")
    here, _ = build_dataset(pool, reviews, tok, "qwen3.6", options, Path("here"), shard_size=2)
    there, _ = build_dataset(pool, reviews, tok, "qwen3.6", options, Path("there"), shard_size=2, backend=RayBackend(cluster[0].address, Needs(cpus=0.5)))
    assert there == here and len(files(Path("here"))) > 3 and files(Path("there")) == files(Path("here"))


def test_sigterm_of_the_driver_cancels_remote_episodes_and_a_rerun_resumes(cluster, docker_client: docker.DockerClient, images: dict[str, str], relearn_bin: str, tmp_path: Path) -> None:  # noqa: ANN001
    made, _workers = cluster
    few = ["mini__calc-1", "mini__pager-1", "mini__textkit-1"]
    slow = solver(TASKS, SOLVES)

    def answer(request: dict) -> ScriptedTurn:
        turn = slow(request)
        turn.delay_s = 1.0
        return turn

    def command(server: ModelServer) -> list[str]:
        ids = [arg for i in few for arg in ("--id", i)]
        return [relearn_bin, "collect", "--out", str(tmp_path / "run"), "--model", "scripted", "--base-url", server.base_url, *ids, "--ray", made.address]

    env = {**os.environ, "OPENAI_API_KEY": "test"}
    with ModelServer("chat", answer) as server:
        driver = subprocess.Popen(command(server), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not ours(docker_client) and time.monotonic() < deadline:
            time.sleep(0.1)
        started = set(ours(docker_client))
        assert started, "no episode started"
        driver.send_signal(signal.SIGTERM)
        _out, err = driver.communicate(timeout=120)
        assert driver.returncode != 0, err
        # The remote units were cancelled and their containers removed.
        assert not set(owned(docker_client)) & started and not ours(docker_client)
        rerun = subprocess.run(command(server), env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "episodes by node" in rerun.stderr
    pool = pool_of(tmp_path / "run")
    assert sorted(i.split(":")[0] for i in pool) == sorted(few)


def test_a_worker_of_another_relearn_version_is_refused(cluster) -> None:  # noqa: ANN001
    backend = RayBackend(cluster[0].address, Needs(cpus=0.5))
    backend._version = "0.0.0-elsewhere"  # noqa: SLF001 - the driver's side of the check, as another install would say
    errors: list[BaseException] = []
    run_units(backend, [1], _square, on_result=lambda _u, _r: None, on_error=lambda _u, exc, _t: errors.append(exc) or False)
    assert len(errors) == 1 and isinstance(errors[0], ClusterError)
    assert "runs relearn" in str(errors[0]) and "the driver 0.0.0-elsewhere" in str(errors[0])
    # Units no node can run are refused up front, naming what is missing.
    with pytest.raises(ClusterError, match="no node of the cluster offers GPU=1"):
        RayBackend(cluster[0].address, Needs(gpus=1))


def test_gc_sweeps_every_node_and_the_pipeline_file_names_the_cluster(cluster, relearn_bin: str, tmp_path: Path) -> None:  # noqa: ANN001
    made, _workers = cluster
    swept = subprocess.run([relearn_bin, "envs", "gc", "--ray", made.address], capture_output=True, text=True, timeout=120)
    assert swept.returncode == 0, swept.stderr
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    assert sorted(line.split(":")[0].split()[1] for line in swept.stdout.splitlines() if line.startswith("node ")) == sorted(n[:12] for n in alive)

    from relearn.pipeline.config import load_pipeline
    from relearn.pipeline.stages import Context

    (tmp_path / "p.toml").write_text(f'workdir = "w"\n[pool.import]\nformat = "codex"\npaths = ["x"]\n[cluster]\naddress = "{made.address}"\n')
    config = load_pipeline(tmp_path / "p.toml")
    assert config.cluster is not None and config.cluster.address == made.address
    backend = Context(config, console=None).backend(Needs(docker=1))  # type: ignore[arg-type]
    assert isinstance(backend, RayBackend) and backend.slots() == 2
