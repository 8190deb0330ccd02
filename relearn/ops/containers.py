"""What every verb that runs tasks in containers shares (collect, replay, verify, eval run, and
the pipeline's stages that call them): which tasks, which image each runs in and with what
limits, the Docker engine with last run's orphans swept, the images made ready, and the Ray
backend opened and closed around the work.

    options = ContainerOptions(image_template="registry.example.com/swe/sweb.eval.{arch}.{instance_key}:{tag}", pull=True)
    with container_session(options, reporter) as session:
        prepared = session.prepare(tasks, need_base=False)
        with session.backend(Needs(docker=1)) as backend:
            ...
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.executor import Backend, ClusterError, LocalBackend, Needs, RayBackend
from envs.image_choice import ImageChoice
from envs.limits import DEFAULT_LIMITS, Limits
from records.pools import RecordError
from relearn.ops.reporting import SILENT, OpError, Reporter
from relearn.verbs.containers import ContainerOptions, memory_mb

if TYPE_CHECKING:
    import docker

    from envs.images import Prepared
    from envs.tasks import Task

MINI_SUITE = Path(__file__).resolve().parents[2] / "envs" / "mini_tasks"


def image_choice(options: ContainerOptions) -> ImageChoice:
    try:
        return ImageChoice.from_options(options.image_map, options.image_template)
    except (RecordError, ValueError) as exc:
        raise OpError(str(exc)) from None


def container_limits(options: ContainerOptions) -> Limits:
    try:
        return Limits(cpus=options.cpus, memory_mb=memory_mb(options.memory), pids=DEFAULT_LIMITS.pids, network=DEFAULT_LIMITS.network)
    except ValueError as exc:
        raise OpError(str(exc)) from None


def check_containers(options: ContainerOptions) -> None:
    """Every option usable, before any engine or cluster is touched."""
    image_choice(options)
    container_limits(options)


def tasks_source(value: str) -> Path:
    """``mini`` is the bundled suite; anything else a task file or folder (or a Hugging Face
    dataset name, which ``load_task_list`` fetches)."""
    return MINI_SUITE if value == "mini" else Path(value)


def load_task_list(source: str, ids: list[str] | None = None) -> tuple[list[Task], list[str]]:
    """The tasks of ``source`` (only ``ids`` when given) and the records that could not be
    read; OpError when an id is unknown or nothing is left."""
    from eval.dataset import load_dataset_tasks

    try:
        tasks, errors = load_dataset_tasks(str(tasks_source(source)))
    except ValueError as exc:  # not a file, and not a dataset the Hub has
        raise OpError(f"--tasks {source}: {exc}") from None
    if ids:
        missing = sorted(set(ids) - {t.instance_id for t in tasks})
        if missing:
            raise OpError(f"no such task in {source}: {', '.join(missing)}")
        tasks = [t for t in tasks if t.instance_id in ids]
    if not tasks:
        raise OpError(f"no tasks in {source}" + (f"; first problem: {errors[0]}" if errors else ""))
    return tasks, [str(e) for e in errors]


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the work runs, SIGTERM unwinds like Ctrl-C, so every ``with Container`` removes
    its container; the previous handler comes back after. Only the main thread can set one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def docker_client() -> docker.DockerClient:
    from envs.docker_backend import client_from_env

    try:
        return client_from_env()
    except RuntimeError as exc:
        raise OpError(str(exc)) from None


def sweep_orphans(client: docker.DockerClient, reporter: Reporter = SILENT) -> list[str]:
    """Remove the containers a killed run (SIGKILL, OOM) left on this engine."""
    from envs.docker_backend import gc

    removed = gc(client)
    if removed:
        reporter.note(f"removed {len(removed)} orphaned container(s) of a killed run")
    return removed


@contextmanager
def open_backend(address: str | None, needs: Needs) -> Iterator[Backend | None]:
    """None without an address (the work runs here), else the cluster's backend, closed after;
    OpError saying why the cluster cannot be used."""
    if address is None:
        yield None
        return
    try:
        backend = RayBackend(None if address == "local" else address, needs)
    except (ClusterError, ConnectionError, RuntimeError, ValueError) as exc:
        raise OpError(f"--ray {address}: {exc}") from None
    try:
        yield backend
    finally:
        backend.close()


@contextmanager
def process_backend(address: str | None, needs: Needs, workers: int, threads_per_process: int = 1) -> Iterator[Backend | None]:
    """``open_backend``'s cluster backend with an address; else ``workers`` local worker
    processes, or None for one (the work runs here); closed after."""
    with open_backend(address, needs) as backend:
        if backend is not None or workers == 1:
            yield backend
            return
        local = LocalBackend(workers, processes=True, threads_per_process=threads_per_process)
        try:
            yield local
        finally:
            local.close()


def node_counts(backend: Backend | None) -> dict[str, int]:
    """Units finished so far by node, for a progress bar's fields while the units run on a
    cluster (``RayBackend.per_node`` is rebound, never mutated: a snapshot); empty here."""
    per_node = getattr(backend, "per_node", None) or {}
    return {f"node {node[:8]}:": count for node, count in sorted(per_node.items())}


@dataclass
class ContainerSession:
    """The engine (orphans swept once) and the options, for one verb's run."""

    options: ContainerOptions
    client: Any
    reporter: Reporter = SILENT
    orphans: list[str] = field(default_factory=list)

    def prepare(self, tasks: list[Task], *, need_base: bool) -> Prepared:
        """A verb's images before its units run: ``tasks`` routed by the options' image choice;
        without a registry, what is missing pulled (``pull``, a progress bar per image) and the
        base built when a task (or ``need_base``: the codex-cli relay) needs it; with one, only
        routed: whoever runs a unit pulls its image from there. ``problems`` says what failed."""
        from envs.images import prepare_images

        o, reporter = self.options, self.reporter
        pulling: dict[str, int] = {}

        def on_pull(state: Any) -> None:
            if state.image not in pulling:
                reporter.begin(f"pulling {state.image}", state.total or None)
                pulling[state.image] = 0
            reporter.advance(state.current - pulling[state.image])
            pulling[state.image] = state.current

        try:
            return prepare_images(
                self.client, tasks, image_choice(o), pull=o.pull, need_base=need_base, log=reporter.note, on_pull_progress=on_pull,
                registry=o.registry,
            )  # fmt: skip
        except (RuntimeError, ValueError) as exc:
            raise OpError(str(exc)) from None
        finally:
            if pulling:
                reporter.end()

    def backend(self, needs: Needs) -> Any:
        """``open_backend`` for this run's ``ray`` address."""
        return open_backend(self.options.ray, needs)


@contextmanager
def container_session(options: ContainerOptions, reporter: Reporter = SILENT, *, sweep: bool = True) -> Iterator[ContainerSession]:
    """Check the options, open the engine, sweep last run's orphans (``sweep``), and make
    SIGTERM unwind cleanly while the verb runs."""
    check_containers(options)
    client = docker_client()
    with sigterm_as_interrupt():
        session = ContainerSession(options, client, reporter)
        if sweep:
            session.orphans = sweep_orphans(client, reporter)
        yield session
