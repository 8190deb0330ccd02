"""The stages on a real Ray cluster on this machine: a head and two worker nodes (Ray's
``cluster_utils.Cluster``, real raylets and worker processes) sharing this machine's Docker
engine, each node with its own ``docker`` resource. Collect and verify through Ray must
write what the local run writes; a node killed mid-episode loses nothing and duplicates
nothing; a spend cap holds across nodes to within one in-flight episode per slot."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import pytest
import ray
from ray.cluster_utils import Cluster

from envs.batch import Prediction, verify_batch
from envs.docker_backend import LABEL_OWNER, LABEL_PID, OWNER
from envs.executor import DOCKER_RESOURCE, ClusterError, DockerHere, LocalBackend, Needs, NodeLost, RayBackend, relearn_version, run_units
from envs.images import harbor_tag, node_image, registry_name
from envs.tasks import Task, load_tasks
from harness.collect import collect
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from harness.scripted.servers import ModelServer, ScriptedTurn
from harness.scripted.solutions import solver
from records.pools import read_trajectories
from records.trajectory import Trajectory
from review.judges import Judge
from review.run import review_pool
from tests.registry_server import Registry

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
def local_run(
    docker_client: docker.DockerClient, base_image: str, images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The mini suite × 2 attempts on the local backend: what the cluster must reproduce."""
    out = tmp_path_factory.mktemp("local")
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        spec = spec_of(server)
        summary = collect(docker_client, list(TASKS.values()), make_policy(spec), spec, out, attempts=2, workers=2, base_image=base_image)
    assert not summary.errors and len(summary.finished) == 2 * len(TASKS)
    unresolved = {
        t.id: t.outcome.verdict if t.outcome else None
        for t in read_trajectories(out / "trajectories.jsonl")
        if t.task_id in SOLVES and not (t.outcome and t.outcome.resolved)
    }
    assert not unresolved, f"the gold fix was graded unresolved: {unresolved}"
    return out


def test_collect_and_verify_on_ray_equal_the_local_run(
    cluster, docker_client: docker.DockerClient, base_image: str, local_run: Path, tmp_path: Path
) -> None:  # noqa: ANN001
    made, workers = cluster
    backend = RayBackend(made.address, Needs(docker=1))
    assert backend.slots() == 2  # one container per worker node; the head offers none
    with ModelServer("chat", solver(TASKS, SOLVES)) as server:
        spec = spec_of(server)
        summary = collect(
            docker_client,
            list(TASKS.values()),
            make_policy(spec),
            spec,
            tmp_path / "ray",
            attempts=2,
            base_image=base_image,
            backend=backend,
        )
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


def test_a_node_lost_mid_episode_is_retried_elsewhere(
    cluster, docker_client: docker.DockerClient, base_image: str, local_run: Path, tmp_path: Path
) -> None:  # noqa: ANN001
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
        summary = collect(
            docker_client,
            FEW,
            make_policy(spec),
            spec,
            tmp_path / "ray",
            attempts=2,
            base_image=base_image,
            backend=backend,
            infra_retries=2,
        )
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
        summary = collect(
            docker_client,
            list(TASKS.values()),
            make_policy(spec),
            spec,
            tmp_path / "cap",
            attempts=2,
            base_image=base_image,
            backend=backend,
            spend_cap_usd=cap,
        )
    costs = [t.usage.cost_usd or 0.0 for t in summary.finished if t.usage]
    spent, biggest = sum(costs), max(costs)
    # The cap stopped the run, and the overshoot is at most one in-flight episode per slot.
    assert summary.capped > 0 and spent >= cap
    assert spent <= cap + slots * biggest, f"spent {spent:.6f} > cap {cap:.6f} + {slots} x {biggest:.6f}"
    print(
        f"spend cap {cap:.6f}: spent {spent:.6f} over {len(costs)} episodes, bound cap + {slots} x {biggest:.6f} = {cap + slots * biggest:.6f}"
    )


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
    if where == "ray":
        # The live progress fields show the backend's counts by node as units finish.
        from relearn.ops.containers import node_counts

        assert node_counts(backend) == {f"node {node[:8]}:": count for node, count in run.per_node.items()}
        assert node_counts(None) == {}


def stateless_judges(request: dict) -> ScriptedTurn:
    """Both judges for the collected pool, answering from the request alone (several nodes
    call at once): judge 1 accepts with one confirmed error at step 1, judge 2 quotes it."""
    text = json.dumps(request)
    if "localize confirmed errors" in text:
        return ScriptedTurn(
            content=json.dumps({"spans": [{"error": 0, "field": "content", "quote": "Applying the fix."}]}),
            input_tokens=500,
            output_tokens=50,
        )
    answer = {
        "decision": "accept",
        "reason": "solved",
        "errors": [{"step": 1, "category": "other", "description": "announces before checking", "evidence": "no test run first"}],
    }
    return ScriptedTurn(content=json.dumps(answer), input_tokens=2000, output_tokens=100)


def test_review_on_ray_equals_the_local_review(cluster, local_run: Path, tmp_path: Path) -> None:  # noqa: ANN001
    pool = local_run / "trajectories.jsonl"
    backend = RayBackend(cluster[0].address, Needs(cpus=0.5))
    outputs = {}
    with ModelServer("chat", stateless_judges) as server:
        spec = PolicySpec(
            kind="chat", model="judge-model", base_url=server.base_url, backoff_base_s=0.001, price_in_per_mtok=3.0, price_out_per_mtok=15.0
        )
        for where in ("here", "ray"):
            output = tmp_path / f"{where}.reviews.jsonl"
            summary, ledger = review_pool(
                pool, output, judges=(Judge(spec, "judge1"), Judge(spec, "judge2")), workers=2, backend=backend if where == "ray" else None
            )
            assert not summary.errors
            outputs[where] = (output, summary, ledger)
    (here, _here_summary, here_ledger), (there, there_summary, there_ledger) = outputs["here"], outputs["ray"]
    rows = {
        where: {r["trajectory_id"]: r for r in map(json.loads, path.read_text().splitlines())} for where, (path, _s, _l) in outputs.items()
    }

    # The two attempts of a task are the same text, so they ask the judges the same requests:
    # which review pays and which reads the cache depends on timing, but a review costs what
    # its answers cost whoever paid them, so the files are the same, costs included.
    assert rows["ray"] == rows["here"] and len(rows["here"]) == 2 * len(TASKS)
    assert here.read_bytes() == there.read_bytes()
    accepted = [r for r in rows["here"].values() if r["decision"] == "accept"]
    assert len(accepted) == 2 * len(SOLVES) and all(r["defects"] for r in accepted)
    # One ledger: what the nodes paid was reported back and counted once, call by call (its
    # tokens at the judge's prices), between the cache's answers (an answer two reviews
    # share, paid once) and the reviews' costs (each carries every answer it used).
    for where, ledger in (("here", here_ledger), ("ray", there_ledger)):
        assert abs(ledger.spent_usd - (ledger.input_tokens * 3.0 + ledger.output_tokens * 15.0) / 1e6) < 1e-9
        paid = [json.loads(line) for line in Path(f"{outputs[where][0]}.calls.jsonl").read_text().splitlines()]
        cached = sum(entry["cost_usd"] for entry in paid)
        assert cached - 1e-9 <= ledger.spent_usd <= sum(r["cost_usd"] for r in rows[where].values()) + 1e-9
    assert here_ledger.calls > 0 and there_ledger.calls >= here_ledger.calls

    # The driver wrote the nodes' judge answers to the call cache: the same entries.
    def cache_keys(path: Path) -> set[str]:
        return {json.loads(line)["key"] for line in path.with_name(path.name + ".calls.jsonl").read_text().splitlines()}

    assert cache_keys(there) == cache_keys(here)
    assert sum(there_summary.per_node.values()) == 2 * len(TASKS)


def test_masks_on_ray_write_the_local_shard_bytes(cluster, tok, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from relearn.masks.compile import CompileOptions
    from relearn.masks.shards import build_dataset, load_reviews
    from tests.test_masks_workers import files
    from tests.test_outputs_unchanged import masks_pool

    monkeypatch.chdir(tmp_path)
    pool, reviews_path = (p.relative_to(tmp_path) for p in masks_pool(tmp_path))
    reviews = load_reviews(reviews_path, [])
    options = CompileOptions(mode="ross")
    here, _ = build_dataset(pool, reviews, tok, "qwen3.6", options, Path("here"), shard_size=2)
    there, _ = build_dataset(
        pool, reviews, tok, "qwen3.6", options, Path("there"), shard_size=2, backend=RayBackend(cluster[0].address, Needs(cpus=0.5))
    )
    assert there == here and len(files(Path("here"))) > 3 and files(Path("there")) == files(Path("here"))


def by_node(stderr: str, what: str) -> dict[str, int]:
    """The summary line `WHAT by node: ID N, ID N` a verb prints after a cluster run."""
    (line,) = [line for line in stderr.splitlines() if line.startswith(f"{what} by node: ")]
    return {node: int(count) for node, count in (part.split() for part in line.removeprefix(f"{what} by node: ").split(", "))}


def test_nll_on_ray_and_on_worker_processes_equals_the_run_here(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    """`relearn analyze nll` three ways (here; --workers 2 processes; --ray): the same
    results file and score cache, with reviews (kept/excluded split), a trajectory too
    long for ctx, an unreadable line and trajectories repeated within and across pools."""
    from typer.testing import CliRunner

    from relearn.cli.main import app
    from tests.test_outputs_unchanged import masks_pool

    pool, reviews = masks_pool(tmp_path)
    lines = pool.read_text().splitlines()
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join([lines[1], '{"messages": [', lines[0], lines[1], lines[3]]) + "\n")

    def nll(where: str, *extra: str) -> tuple[dict, list[str], str]:
        out = tmp_path / where
        args = [
            "analyze",
            "nll",
            "-p",
            f"a={pool}",
            "-p",
            f"b={other}",
            "-r",
            str(reviews),
            "--tiny",
            "qwen3",
            "--ctx",
            "2000",
            "--bootstrap",
            "200",
            "--batch",
            "3",
            "-o",
            str(out),
            "--no-progress",
        ]
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 1, result.output  # done; other.jsonl holds a torn line and repeats
        return json.loads((out / "nll.json").read_text()), sorted((out / "nll-scores.jsonl").read_text().splitlines()), result.stderr

    started = time.monotonic()
    here, here_cache, _ = nll("here")
    t_here = time.monotonic() - started
    a, b = here["pools"]
    assert a["scored"] == 3 and a["skipped"] == {"longer than ctx": 3} and a["split"]["trajectories"] >= 1
    assert b["records"] == 4 and b["rejected"] == 2 and b["reused"] == 3  # the torn line, a repeat; three scored in pool a
    started = time.monotonic()
    processes, processes_cache, _ = nll("processes", "--workers", "2")
    t_processes = time.monotonic() - started
    started = time.monotonic()
    there, there_cache, stderr = nll("ray", "--ray", cluster[0].address)
    t_ray = time.monotonic() - started
    assert processes == here and processes_cache == here_cache
    assert there == here and there_cache == here_cache
    # Every batch of three came back once, counted by the node that scored it.
    assert sum(by_node(stderr, "NLL batches").values()) == len(here_cache) // 3 == 2
    # GPU units ask the cluster for GPUs (this machine needs none); worker processes are CPU's.
    for extra, message in (
        (["--ray", cluster[0].address, "--device", "cuda"], "no node of the cluster offers GPU=1"),
        (["--workers", "2", "--device", "cuda"], "--workers runs CPU processes"),
    ):
        refused = CliRunner().invoke(
            app, ["analyze", "nll", "-p", f"a={pool}", "--tiny", "qwen3", "-o", str(tmp_path / "refused"), "--no-progress", *extra]
        )
        assert refused.exit_code == 2 and message in " ".join((refused.stdout + refused.stderr).split()), refused.stderr
    print(f"nll: here {t_here:.1f} s, --workers 2 {t_processes:.1f} s, --ray {t_ray:.1f} s ({len(here_cache)} trajectories scored)")


def busy_under(raylet: int) -> bool:
    """Whether a worker process of that raylet is running a unit (Ray titles a worker by the
    task it runs: ``ray::_on_node``, ``ray::IDLE`` between tasks)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"ray::_on_node") and _runs_under(int(entry.name), raylet):
            return True
    return False


@contextmanager
def a_node_killed_when_busy(made: Cluster, victim: Any) -> Iterator[list[bool]]:  # noqa: ANN401 - Ray's node handle
    """Remove ``victim`` (SIGKILL of its processes) as soon as it runs a unit; the list says
    whether it happened. A victim that never got a unit is removed at the end."""
    raylet = victim.all_processes["raylet"][0].process.pid
    killed: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if busy_under(raylet):
                made.remove_node(victim, allow_graceful=False)
                killed.append(True)
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield killed
    finally:
        done.set()
        watcher.join()
        if not killed:
            made.remove_node(victim)


class CountingLosses:
    """A backend that counts the units it reported lost (the stages retry them silently)."""

    def __init__(self, inner: RayBackend) -> None:
        self.inner = inner
        self.lost = 0

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        return getattr(self.inner, name)

    def result(self, handle: Any) -> tuple[Any, str]:  # noqa: ANN401
        try:
            return self.inner.result(handle)
        except NodeLost:
            self.lost += 1
            raise


def test_a_node_lost_mid_review_or_mid_masks_loses_and_duplicates_nothing(
    cluster, local_run: Path, tok, tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    from relearn.masks.compile import CompileOptions
    from relearn.masks.shards import build_dataset, load_reviews
    from tests.test_masks_workers import files
    from tests.test_outputs_unchanged import masks_pool

    made, _workers = cluster

    def slow(request: dict) -> ScriptedTurn:
        turn = stateless_judges(request)
        turn.delay_s = 0.3  # judge calls long enough to be caught mid-review
        return turn

    pool = local_run / "trajectories.jsonl"
    rows = {}
    with ModelServer("chat", slow) as server:
        spec = PolicySpec(
            kind="chat", model="judge-model", base_url=server.base_url, backoff_base_s=0.001, price_in_per_mtok=3.0, price_out_per_mtok=15.0
        )
        judges = (Judge(spec, "judge1"), Judge(spec, "judge2"))
        here, _ = review_pool(pool, tmp_path / "here.reviews.jsonl", judges=judges, workers=2)
        # The units ask for the docker resource here only so that the victim, with half of
        # the cluster's slots, surely gets some of the first ones.
        victim = made.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 2})
        backend = CountingLosses(RayBackend(made.address, Needs(docker=1)))
        with a_node_killed_when_busy(made, victim) as killed:
            there, _ = review_pool(pool, tmp_path / "there.reviews.jsonl", judges=judges, workers=2, backend=backend)  # type: ignore[arg-type]
    assert killed and backend.lost >= 1, "the victim node never ran a review"
    assert not here.errors and not there.errors
    for where in ("here", "there"):
        lines = [json.loads(line) for line in (tmp_path / f"{where}.reviews.jsonl").read_text().splitlines()]
        rows[where] = {r["trajectory_id"]: {k: v for k, v in r.items() if k != "cost_usd"} for r in lines}
        assert len(rows[where]) == len(lines) == 2 * len(TASKS)  # each trajectory reviewed once
    assert rows["there"] == rows["here"]

    # masks: a shard lost with its node is compiled again elsewhere; the files are the bytes of a run here.
    monkeypatch.chdir(tmp_path)
    masks, reviews_path = (p.relative_to(tmp_path) for p in masks_pool(tmp_path))
    reviews = load_reviews(reviews_path, [])
    options = CompileOptions(mode="ross")
    local, _ = build_dataset(masks, reviews, tok, "qwen3.6", options, Path("shards-here"), shard_size=1)
    victim = made.add_node(num_cpus=1, resources={DOCKER_RESOURCE: 2})
    backend = CountingLosses(RayBackend(made.address, Needs(docker=1)))
    with a_node_killed_when_busy(made, victim) as killed:
        remote, _ = build_dataset(masks, reviews, tok, "qwen3.6", options, Path("shards-there"), shard_size=1, backend=backend)  # type: ignore[arg-type]
    assert killed and backend.lost >= 1, "the victim node never compiled a shard"
    assert remote == local and files(Path("shards-there")) == files(Path("shards-here"))


def tiny_image(client: docker.DockerClient, tag: str) -> str:
    """A one-file image made by docker import (no base, nothing to download)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        payload = os.urandom(1 << 16)
        info = tarfile.TarInfo("noise.bin")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=version)
    return client.images.get(tag).id


def _image_on_node(job: tuple[Task, str, str | None]) -> str:
    """What a stage's unit does first on its node: make the task's image present there."""
    task, image, registry = job
    client = DockerHere()()
    node_image(client, task, image, None, registry)
    return client.images.get(image).id


def _raise(_unit: object, exc: BaseException, _tries: int) -> bool:
    raise exc


def test_a_node_lacking_an_image_pulls_it_from_the_registry_or_builds_it(
    cluster, docker_client: docker.DockerClient, tmp_path: Path
) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from relearn.cli.main import app

    # HOST/NS/NAME:TAG, NAME without a registry host of its own.
    for image, there in (
        ("swebench/x:v1", "swebench/x:v1"),
        ("docker.io/swebench/x:v1", "swebench/x:v1"),
        ("ghcr.io/a/b:2", "a/b:2"),
        ("ubuntu:22.04", "ubuntu:22.04"),
    ):
        assert registry_name(image, "reg.example:5000/team/") == f"reg.example:5000/team/{there}"
    backend = RayBackend(cluster[0].address, Needs(docker=1))
    mine = f"relearn-test/cluster-{os.getpid()}"
    pushed, absent = f"{mine}:pushed", f"{mine}:absent"
    harbor = tmp_path / "harbor"
    (harbor / "environment").mkdir(parents=True)
    (harbor / "environment" / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
    (harbor / "environment" / "payload").write_text("built on the node that runs the task\n")
    built = Task(instance_id=f"cluster-build-{os.getpid()}", kind="harbor", problem_statement="", task_dir=str(harbor))
    with Registry() as registry:
        where = f"{registry.host}/team"
        leftovers = [pushed, f"{where}/{pushed}", harbor_tag(built), f"{mine}:source"]
        try:
            source = tiny_image(docker_client, f"{mine}:source")
            registry.add_image(docker_client, f"{mine}:source", f"team/{mine}", "pushed")
            docker_client.images.remove(f"{mine}:source", force=True)  # no node has it now
            got: dict[str, str] = {}
            jobs = [
                (Task(instance_id="pushed", problem_statement="", image=pushed, image_source="test"), pushed, where),
                (built, harbor_tag(built), None),
            ]
            run_units(backend, jobs, _image_on_node, on_result=lambda job, image_id: got.__setitem__(job[1], image_id), on_error=_raise)
            # Pulled as HOST/NS/NAME:TAG and tagged NAME:TAG; the other built from its Dockerfile there.
            assert got[pushed] == source == docker_client.images.get(pushed).id
            assert docker_client.images.get(harbor_tag(built)).id == got[harbor_tag(built)]

            # An image the registry lacks: the stage records which node, which image, and the answer.
            task = Task(instance_id="mini__absent", problem_statement="", image=absent, image_source="test")
            summary = verify_batch(
                docker_client,
                {task.instance_id: task},
                [Prediction(task.instance_id, "", "m")],
                tmp_path / "v.jsonl",
                backend=backend,
                registry=where,
            )
            (error,) = summary.errors
            assert (
                "(node " in error
                and f"could not get image {absent} for mini__absent: pulling {where}/{absent} from {registry.host} failed: the registry answered:"
                in error
            )
            assert "manifest unknown" in error and not summary.verdicts

            # relearn collect --registry: this machine builds and pulls nothing; the episode's
            # node fails to get the image, and the run records why, apart from model failures.
            (tmp_path / "map.txt").write_text(f"mini__calc-1 {absent}\n")
            args = [
                "--out",
                str(tmp_path / "run"),
                "--model",
                "m",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--id",
                "mini__calc-1",
                "--image-map",
                str(tmp_path / "map.txt"),
            ]
            # In this process (Ray's workers are warm for it); the verb sets a SIGTERM handler.
            sigterm = signal.getsignal(signal.SIGTERM)
            try:
                run = CliRunner(env={"OPENAI_API_KEY": "test"}).invoke(
                    app, ["collect", *args, "--registry", where, "--ray", cluster[0].address]
                )
            finally:
                signal.signal(signal.SIGTERM, sigterm)
            assert run.exit_code == 1, run.stderr
            (failure,) = [json.loads(line) for line in (tmp_path / "run" / "infra_errors.jsonl").read_text().splitlines()]
            assert failure["task_id"] == "mini__calc-1" and failure["tries"] == 2
            assert (
                f"could not get image {absent} for mini__calc-1: pulling {where}/{absent} from {registry.host} failed" in failure["error"]
                and "(node " in failure["error"]
            )
        finally:
            for tag in leftovers:
                try:
                    docker_client.images.remove(tag, force=True)
                except docker.errors.ImageNotFound:
                    pass


def test_sigterm_of_the_driver_cancels_remote_episodes_and_a_rerun_resumes(
    cluster, docker_client: docker.DockerClient, images: dict[str, str], relearn_bin: str, tmp_path: Path
) -> None:  # noqa: ANN001
    made, _workers = cluster
    few = ["mini__calc-1", "mini__pager-1", "mini__textkit-1"]
    slow = solver(TASKS, SOLVES)

    def answer(request: dict) -> ScriptedTurn:
        turn = slow(request)
        turn.delay_s = 1.0
        return turn

    def command(server: ModelServer) -> list[str]:
        ids = [arg for i in few for arg in ("--id", i)]
        return [
            relearn_bin,
            "collect",
            "--out",
            str(tmp_path / "run"),
            "--model",
            "scripted",
            "--base-url",
            server.base_url,
            *ids,
            "--ray",
            made.address,
        ]

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


def test_a_worker_of_another_relearn_version_is_refused(cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    ours = relearn_version()
    # At connect: this process sees another install of relearn (its metadata first on the
    # path, as a second environment would give), the nodes their own: every node is named.
    other = tmp_path / "site" / "relearn-0.0.0.dist-info"
    other.mkdir(parents=True)
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: relearn\nVersion: 0.0.0\n")
    with monkeypatch.context() as patched:
        patched.syspath_prepend(str(other.parent))
        assert relearn_version() == "0.0.0"
        with pytest.raises(ClusterError) as refused:
            RayBackend(cluster[0].address, Needs(cpus=0.5))
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    for node in alive:
        assert f"(node {node[:12]}) runs relearn {ours}, the driver 0.0.0: install the same version on every node" in str(refused.value)
    # A node that joins later is still checked by each unit it runs.
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
    assert sorted(line.split(":")[0].split()[1] for line in swept.stdout.splitlines() if line.startswith("node ")) == sorted(
        n[:12] for n in alive
    )

    from relearn.pipeline.config import load_pipeline
    from relearn.pipeline.context import Context

    (tmp_path / "p.toml").write_text(
        f'workdir = "w"\n[pool.import]\nformat = "codex"\npaths = ["x"]\n[cluster]\naddress = "{made.address}"\nregistry = "reg.example:5000/team"\n'
    )
    config = load_pipeline(tmp_path / "p.toml")
    assert config.cluster is not None and config.cluster.address == made.address
    context = Context(config, console=None)  # type: ignore[arg-type]
    assert context.ray_address == made.address  # what every fan-out stage's options carry
    backend = RayBackend(context.ray_address, Needs(docker=1))
    assert backend.slots() == 2
    assert context.registry == "reg.example:5000/team"  # what the collect stage's nodes pull from


# ---------------------------------------------------------------- the pipeline on the cluster

CLUSTER_PIPELINE = """
workdir = "work-{where}"
tasks = "mini"
[pool.import]
format = "chat"
paths = ["rows.jsonl"]
[review]
reviewer = "heuristic"
[masks]
variants = ["ross"]
audit = false  # the local run would audit (the cluster run cannot): the same masks on both sides
"""


def test_the_pipeline_grades_an_imported_pool_through_ray_as_it_does_here(
    cluster, docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:  # noqa: ANN001
    """`relearn run` with [cluster]: the verify stage grades the imported patches as units on the
    worker nodes (the head offers no docker), review and masks run their units there too, and
    the verified pool, the reviews and the compiled shards equal, trajectory for trajectory and
    byte for byte, what the local run gives."""
    from rich.console import Console

    from relearn.pipeline.config import load_pipeline
    from relearn.pipeline.context import Context, dataset_dir, reviews_path, verified_path
    from relearn.pipeline.plan import plan
    from relearn.pipeline.runner import run_stages

    made, workers = cluster
    messages = [{"role": "user", "content": "Fix the bug."}, {"role": "assistant", "content": "Done."}]
    rows = [
        {"id": "gold-calc", "instance_id": "mini__calc-1", "patch": TASKS["mini__calc-1"].patch},
        {"id": "gold-pager", "instance_id": "mini__pager-1", "patch": TASKS["mini__pager-1"].patch},
        {"id": "wrong-calc", "instance_id": "mini__calc-1", "patch": TASKS["mini__pager-1"].patch},  # does not apply here
        {"id": "nowhere", "instance_id": "no__such-1", "patch": TASKS["mini__calc-1"].patch},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({**row, "messages": messages}) + "\n" for row in rows))

    def run(where: str, cluster_table: str) -> tuple[dict[str, Any], dict[str, tuple], set[str], dict[str, bytes]]:
        path = tmp_path / f"{where}.toml"
        path.write_text(CLUSTER_PIPELINE.format(where=where) + cluster_table)
        ctx = Context(load_pipeline(path), Console(file=io.StringIO()))
        names = ("pool", "verify", "review", "masks:ross")
        results = run_stages([s for s in plan(ctx, dict) if s.name in names], ctx.workdir, ctx.console)
        assert [(r.name, r.status, r.error) for r in results] == [(name, "ran", None) for name in names]
        outcomes = {
            t.id: (t.outcome.resolved, t.outcome.reward, t.outcome.verdict.get("tests"), t.outcome.verdict.get("patch_applied"))
            if t.outcome
            else None
            for t in read_trajectories(verified_path(ctx))
        }
        reviews = set(reviews_path(ctx).read_text().splitlines())  # written as units finish: compared as a set
        shards = {p.name: p.read_bytes() for p in sorted(dataset_dir(ctx, "ross").glob("shard-*.parquet"))}
        return results[1].counts, outcomes, reviews, shards

    here_counts, here, here_reviews, here_shards = run("here", "")
    there_counts, there, there_reviews, there_shards = run("there", f'[cluster]\naddress = "{made.address}"\n')
    assert there == here and len(here) == len(rows)
    assert there_reviews == here_reviews and len(here_reviews) == len(rows)
    assert there_shards == here_shards and here_shards  # the two gold fixes compile, byte for byte alike
    resolved = {t_id.removeprefix("chat-"): outcome[0] if outcome else None for t_id, outcome in here.items()}
    assert resolved == {"gold-calc": True, "gold-pager": True, "wrong-calc": False, "nowhere": None}
    assert here_counts["graded now"] == there_counts["graded now"] == 3 and there_counts["resolved"] == 2
    # Graded on the worker nodes, not here: every verdict came from a node offering docker.
    assert set(there_counts["graded by node"]) <= {w.node_id for w in workers} and sum(there_counts["graded by node"].values()) == 3
    assert "graded by node" not in here_counts
    assert not ours(docker_client)
