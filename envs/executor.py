"""One executor for every fan-out stage: work units out, results back in the driver.

A stage (collect, verify, review) hands ``run_units`` its units and one function that
turns a unit into a record; the driver alone writes pools, verdicts and reviews from the
records that come back (append + fsync, resume by stable ids), so a worker never writes a
shared file. Two backends run the units:

- ``LocalBackend``: threads (or processes) in this process, the embedded default: no
  Ray, nothing to start.
- ``RayBackend``: tasks on a Ray cluster (``ray.init(address)``, ``auto`` joins a running
  one). A unit that holds containers asks for the custom resource ``docker`` (a node
  started with ``--resources '{"docker": N}'`` runs N such units at once on its engine, a
  node without one gets none); CPU work asks for CPUs, GPU work for GPUs.

Versions: every node must run the driver's relearn. ``RayBackend`` asks each alive node at
connect time (one tiny task per node) and refuses the cluster naming the node and both
versions; a node that joins later is checked again by each unit it runs.

Faults: Ray's own retries are off (``max_retries=0``), so the driver alone decides a
retry and a unit's record is written once. A node lost mid-unit surfaces as ``NodeLost``
(an infrastructure failure the stage retries elsewhere up to its limit); an exception the
unit raised surfaces as itself, unwrapped from Ray's envelope.

Admission: ``run_units`` starts a unit only while ``admit`` says yes and never keeps more
units in flight than the backend has slots (a Ray backend: the cluster's total of the
units' resource), so a spend cap checked at admission is overspent by at most one unit
per slot, however many nodes there are.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Generic, Protocol, TypeVar

import docker

U = TypeVar("U")
R = TypeVar("R")

DOCKER_RESOURCE = "docker"
CANCEL_WAIT_S = 15.0
NODE_RETRIES = 2  # a unit whose node died runs again this many times (stages without their own limit)


class NodeLost(RuntimeError):
    """The node (or worker process) running a unit died: an infrastructure failure."""


class ClusterError(RuntimeError):
    """The cluster cannot run these units (no node offers the resource, a node runs
    another relearn version, Ray is not installed)."""


@dataclass(frozen=True)
class Needs:
    """What one unit holds while it runs: containers on its node's engine, CPUs, GPUs."""

    docker: int = 0
    cpus: float = 0.0
    gpus: float = 0.0


def relearn_version() -> str:
    try:
        return version("relearn")
    except PackageNotFoundError:
        return "unknown"


def node_name() -> str:
    """This machine for messages: its host name, and the Ray node id inside a Ray worker
    (the nodes of a cluster on one machine share the host name)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        node = ray.get_runtime_context().get_node_id()
        if node:
            return f"{socket.gethostname()} (node {node[:12]})"
    return socket.gethostname()


class DockerHere:
    """The Docker engine of whichever node calls it: picklable, unlike a client, so a
    unit shipped to another node opens that node's engine (a local unit gets the
    driver's client instead, see ``LocalBackend.engine``)."""

    def __call__(self) -> docker.DockerClient:
        from envs.docker_backend import client_from_env

        return client_from_env()


class _Shared:
    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    def __call__(self) -> docker.DockerClient:
        return self.client


class Backend(Protocol):
    def slots(self) -> int: ...
    def submit(self, fn: Callable[[Any], Any], unit: Any) -> Any: ...
    def wait(self, handles: list[Any]) -> list[Any]: ...
    def result(self, handle: Any) -> tuple[Any, str]: ...
    def cancel(self, handles: list[Any]) -> None: ...
    def engine(self, client: docker.DockerClient | None) -> Callable[[], docker.DockerClient]: ...
    def close(self) -> None: ...


def _limit_threads(threads: int) -> None:
    """A process worker's native thread pools, so N workers do not each grab every core."""
    for name in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"


class LocalBackend:
    """``workers`` threads in this process (``processes=True``: worker processes, for
    CPU-bound units whose function and records pickle)."""

    def __init__(self, workers: int = 1, *, processes: bool = False, threads_per_process: int = 1) -> None:
        self.workers = max(1, workers)
        self._pool: Executor = (
            # spawn, not fork: the driver already runs the tokenizer's and Docker's threads
            ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_limit_threads,
                initargs=(threads_per_process,),
            )
            if processes
            else ThreadPoolExecutor(max_workers=self.workers)
        )

    def slots(self) -> int:
        return self.workers

    def submit(self, fn: Callable[[Any], Any], unit: Any) -> Future[Any]:
        return self._pool.submit(fn, unit)

    def wait(self, handles: list[Future[Any]]) -> list[Future[Any]]:
        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        return list(done)

    def result(self, handle: Future[Any]) -> tuple[Any, str]:
        return handle.result(), "local"

    def cancel(self, handles: list[Future[Any]]) -> None:
        for handle in handles:
            handle.cancel()

    def engine(self, client: docker.DockerClient | None) -> Callable[[], docker.DockerClient]:
        return _Shared(client) if client is not None else DockerHere()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _on_node(fn: Callable[[Any], Any], unit: Any, driver_version: str) -> tuple[Any, str]:
    """What a Ray task runs: the unit, and the node that ran it (for per-node counts)."""
    import ray

    mine = relearn_version()
    if mine != driver_version:
        raise ClusterError(f"{node_name()} runs relearn {mine}, the driver {driver_version}: install the same version on every node")
    return fn(unit), ray.get_runtime_context().get_node_id()


def _nothing() -> None:
    """The connect-time check's task: ``_on_node`` compares the versions before it."""


class RayBackend:
    """Units as Ray tasks on the cluster at ``address`` (``auto``: the running one; None:
    a throwaway cluster on this machine)."""

    def __init__(self, address: str | None, needs: Needs) -> None:
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - ray is a dependency
            raise ClusterError("--ray needs the ray package: pip install ray") from exc
        self._ray = ray
        self.needs = needs
        self._owns = not ray.is_initialized()
        if self._owns:
            # A throwaway cluster here runs as many containers at once as there are cores.
            here = {"resources": {DOCKER_RESOURCE: float(os.cpu_count() or 1)}} if address is None else {}
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False, **here)
        resources = {DOCKER_RESOURCE: float(needs.docker)} if needs.docker else {}
        # max_calls=0: a worker process serves unit after unit (Ray's default for a function
        # declared with GPUs is one, which would load an NLL unit's model again per batch).
        self._task = ray.remote(max_calls=0)(_on_node).options(num_cpus=needs.cpus, num_gpus=needs.gpus, resources=resources, max_retries=0)
        self._version = relearn_version()
        self._shipped: tuple[Callable[[Any], Any], Any] | None = None
        # Units finished by node so far, for live progress: rebound, never mutated, so a
        # progress thread reads a whole snapshot.
        self.per_node: dict[str, int] = {}
        if self.slots() == 0:
            self.close()
            raise ClusterError(
                f"no node of the cluster offers {self._need_text()}: start the nodes with e.g. ray start --resources '{{\"docker\": 4}}'"
            )
        self._check_versions()

    def _check_versions(self) -> None:
        """Refuse the cluster now if a node runs another relearn, not at its first unit."""
        refused = [str(answer) for answer in self.on_every_node(_nothing).values() if isinstance(answer, ClusterError)]
        if refused:
            self.close()
            raise ClusterError("; ".join(sorted(refused)))

    def _need_text(self) -> str:
        parts = [
            f"{DOCKER_RESOURCE}={self.needs.docker}" if self.needs.docker else "",
            f"CPU={self.needs.cpus}" if self.needs.cpus else "",
            f"GPU={self.needs.gpus}" if self.needs.gpus else "",
        ]
        return ", ".join(p for p in parts if p) or "any resource"

    def slots(self) -> int:
        """Units the alive nodes can run at once: the tightest of the units' resources."""
        total = self._ray.cluster_resources()
        fits = [
            int(total.get(key, 0.0) // amount)
            for key, amount in ((DOCKER_RESOURCE, self.needs.docker), ("CPU", self.needs.cpus), ("GPU", self.needs.gpus))
            if amount
        ]
        return min(fits) if fits else max(1, int(total.get("CPU", 1)))

    def submit(self, fn: Callable[[Any], Any], unit: Any) -> Any:
        # The function (with what it carries: judges, the call cache, a shard's reviews) goes
        # to the object store once; each task gets a reference Ray resolves on its node.
        if self._shipped is None or self._shipped[0] is not fn:
            self._shipped = (fn, self._ray.put(fn))
        return self._task.remote(self._shipped[1], unit, self._version)

    def wait(self, handles: list[Any]) -> list[Any]:
        done, _ = self._ray.wait(handles, num_returns=1)
        return list(done)

    def result(self, handle: Any) -> tuple[Any, str]:
        record, node = self._get(handle)
        self.per_node = {**self.per_node, node: self.per_node.get(node, 0) + 1}
        return record, node

    def _get(self, handle: Any) -> tuple[Any, str]:
        exceptions = self._ray.exceptions
        try:
            return self._ray.get(handle)
        except exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, ClusterError):
                raise cause from None
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        except (
            exceptions.NodeDiedError,
            exceptions.WorkerCrashedError,
            exceptions.ObjectLostError,
            exceptions.LocalRayletDiedError,
            exceptions.TaskCancelledError,
        ) as exc:
            raise NodeLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        except exceptions.RayError as exc:
            raise NodeLost(f"{type(exc).__name__}: {exc}") from exc

    def cancel(self, handles: list[Any]) -> None:
        """Kill the units' worker processes, and wait (a little) until Ray says they are
        gone, so that a sweep after this finds their containers ownerless."""
        for handle in handles:
            self._ray.cancel(handle, force=True)
        if handles:
            self._ray.wait(handles, num_returns=len(handles), timeout=CANCEL_WAIT_S)

    def engine(self, client: docker.DockerClient | None) -> Callable[[], docker.DockerClient]:
        return DockerHere()

    def on_every_node(self, fn: Callable[[], R]) -> dict[str, R | BaseException]:
        """``fn`` once on each alive node (pinned there), by node id: e.g. the container
        sweep of every node's engine. A node that failed maps to its exception."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n["NodeID"] for n in self._ray.nodes() if n.get("Alive")]
        task = self._ray.remote(_on_node)
        handles = {
            node: task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                lambda _unit: fn(), None, self._version
            )
            for node in nodes
        }
        answers: dict[str, R | BaseException] = {}
        for node, handle in handles.items():
            try:
                answers[node] = self._get(handle)[0]
            except Exception as exc:  # one node's failure is reported, the others still answer
                answers[node] = exc
        return answers

    def close(self) -> None:
        if self._owns:
            self._ray.shutdown()


_END = object()  # the end of a unit iterator


@dataclass
class UnitRun(Generic[U]):
    """What ``run_units`` left: the units it never started (``admit`` said no)."""

    not_started: list[U]
    per_node: dict[str, int]


def run_units(
    backend: Backend,
    units: Iterable[U],
    fn: Callable[[U], R],
    *,
    on_result: Callable[[U, R], None],
    on_error: Callable[[U, BaseException, int], bool],
    admit: Callable[[U], bool] | None = None,
    hold: Callable[[], bool] | None = None,
) -> UnitRun[U]:
    """Run ``fn`` over ``units`` on ``backend``, calling back in this (the driver's)
    thread: ``on_result(unit, record)``, or ``on_error(unit, exception, tries)`` which
    returns True to run the unit again (it goes to the back of the queue). ``admit`` is
    asked before each start; once it says no, nothing more starts. While ``hold`` says yes,
    nothing new starts until a unit in flight ends (a caller that writes results in the
    units' order holds back while its reorder window is full); with nothing in flight it is
    not asked, so it can never stall the run. On any exception here (Ctrl-C) the units in
    flight are cancelled before it propagates.

    ``units`` is read lazily, as slots free up: a stage can pass a generator over a pool of
    any size and hold only the units in flight (and those waiting for a retry)."""
    fresh = iter(units)
    retries: deque[tuple[U, int]] = deque()
    ahead: list[tuple[U, int]] = []  # the next unit, once taken from ``fresh`` (admit looks at it first)
    running: dict[Any, tuple[U, int]] = {}
    per_node: dict[str, int] = {}
    stopped = False

    def next_unit() -> tuple[U, int] | None:
        if not ahead:
            if retries:
                ahead.append(retries.popleft())
            else:
                unit = next(fresh, _END)
                if unit is _END:
                    return None
                ahead.append((unit, 0))  # type: ignore[arg-type]
        return ahead[0]

    try:
        while not stopped or running:
            while not stopped and len(running) < max(1, backend.slots()):
                if hold is not None and running and hold():
                    break
                waiting = next_unit()
                if waiting is None:
                    break
                if admit is not None and not admit(waiting[0]):
                    stopped = True
                    break
                unit, tries = ahead.pop()
                running[backend.submit(fn, unit)] = (unit, tries + 1)
            if not running:
                break
            for handle in backend.wait(list(running)):
                unit, tries = running.pop(handle)
                try:
                    record, node = backend.result(handle)
                except Exception as exc:  # the stage decides: retry, record apart, or stop
                    if on_error(unit, exc, tries):
                        retries.append((unit, tries))
                    continue
                per_node[node] = per_node.get(node, 0) + 1
                on_result(unit, record)
    except BaseException:
        backend.cancel(list(running))
        raise
    # Only a refusal by ``admit`` leaves units behind; they are counted, so listing them is fine.
    left = [unit for unit, _ in ahead] + [unit for unit, _ in retries] + (list(fresh) if stopped else [])
    return UnitRun(not_started=left, per_node=per_node)
