"""Collection: tasks × attempts of one policy over a worker pool, into a pool of
verified trajectories.

Layout of an output folder::

    trajectories.jsonl        finished trajectories (appended, fsynced): the pool
    episodes/<id>.jsonl       each episode as it runs (see harness.recorder)
    episodes/<id>.partial-N.jsonl   what a killed run had recorded, kept when it restarts
    verify-logs/              full test logs of the verifications

Resumable by (task, policy, attempt): a rerun skips every id in trajectories.jsonl and
restarts the episodes a killed run left unfinished.

Two agents fill the same pool format: our own Codex-style loop (``harness.agent``, the
default) and the real Codex CLI in the container (``codex=CodexCliConfig(...)``, see
``harness.codex_cli``), whose episodes also keep ``episodes/<id>.codex/`` (the gateway's
record of every model call, the Codex rollout, Codex's ``--json`` output).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from envs import docker_backend
from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.executor import Backend, ClusterError, LocalBackend, run_units
from envs.images import image_name, node_image, task_image
from envs.tasks import Task
from envs.verify import Verdict, verify
from harness.agent import SCAFFOLD_VERSION, AgentConfig, now, run_episode
from harness.codex_cli.backend import run_codex_episode
from harness.codex_cli.config import AGENT as CODEX_AGENT
from harness.codex_cli.config import CodexCliConfig
from harness.codex_cli.network import sweep_networks
from harness.policies.base import Policy, PolicySpec
from harness.policies.make import make_policy
from harness.recorder import EpisodeRecorder
from records.pools import JsonlWriter, RecordError, read_trajectories_lenient
from records.trajectory import Outcome, Source, Trajectory
from records.trajectory import Policy as PolicyInfo


def trajectory_id(task_id: str, spec: PolicySpec, attempt: int, agent: str = "builtin") -> str:
    """Stable per (task, policy, attempt); episodes of another agent than our own loop
    say which, so that both can share a pool."""
    scaffold = "" if agent == "builtin" else f"{agent}:"
    raw = f"{task_id}:{scaffold}{spec.model}:{spec.checkpoint or '-'}:{attempt}"
    return re.sub(r"[^A-Za-z0-9_.:@+-]", "_", raw)


@dataclass
class CollectSummary:
    finished: list[Trajectory] = field(default_factory=list)
    skipped: int = 0  # already in the pool
    restarted: int = 0  # left unfinished by a killed run, run again
    capped: int = 0  # not started: the spend cap was reached
    errors: list[str] = field(default_factory=list)
    infra_errors: list[dict[str, object]] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)  # episodes finished by node
    retried: int = 0  # episodes run again after an infrastructure failure (a node lost)


@dataclass
class Job:
    task: Task
    attempt: int
    id: str
    image: str = ""


def _header(job: Job, spec: PolicySpec, config: AgentConfig, image: str, codex: CodexCliConfig | None = None) -> Trajectory:
    meta = {"image": image, "sampling": spec.sampling, "budget": config.budget.to_dict(), "tools": {"apply_patch": config.apply_patch}}
    if codex is not None:
        source = Source(format="codex", format_version=codex.install.version, meta={**meta, "agent": CODEX_AGENT})
    else:
        source = Source(format="relearn", format_version=SCAFFOLD_VERSION, meta=meta)
    return Trajectory(
        id=job.id,
        task_id=job.task.instance_id,
        policy=PolicyInfo(name=spec.model, checkpoint=spec.checkpoint, step=spec.step, provider=spec.kind),
        attempt=job.attempt,
        messages=[],
        started_at=now(),
        source=source,
    )


def _keep_partial(path: Path) -> None:
    """A killed run's recording is kept beside, never overwritten."""
    number = 0
    suffix = ".jsonl" if path.suffix == ".jsonl" else ""
    stem = path.stem if suffix else path.name
    while (target := path.with_name(f"{stem}.partial-{number}{suffix}")).exists():
        number += 1
    path.rename(target)


def outcome_of(verdict: Verdict) -> Outcome:
    """What a trajectory keeps of its verdict (the full log stays in verify-logs/)."""
    summary: dict[str, Any] = {
        "tests": verdict.tests,
        "error": verdict.error,
        "image_digest": verdict.image_digest,
        "patch_applied": verdict.patch_applied,
    }
    for key in ("refused", "restored_files", "neutralized", "disagreements", "network_needed"):
        if getattr(verdict, key):
            summary[key] = getattr(verdict, key)
    return Outcome(
        reward=verdict.reward,
        resolved=verdict.resolved,
        verdict_ref=verdict.log_path,
        verdict=summary,
        suspicious=verdict.suspicious or None,
    )


def run_job(
    client: docker.DockerClient,
    job: Job,
    policy: Policy,
    spec: PolicySpec,
    config: AgentConfig,
    out: Path,
    *,
    limits: Limits = DEFAULT_LIMITS,
    verify_timeout_s: float = 1800.0,
    codex: CodexCliConfig | None = None,
) -> Trajectory:
    episode_path = out / "episodes" / f"{job.id}.jsonl"
    artifacts = out / "episodes" / f"{job.id}.codex"
    episode_path.parent.mkdir(parents=True, exist_ok=True)
    if episode_path.exists():
        _keep_partial(episode_path)
    if artifacts.exists():
        _keep_partial(artifacts)
    header = _header(job, spec, config, job.image, codex)
    recorder = EpisodeRecorder(episode_path, header)
    try:
        if codex is not None:
            trajectory = run_codex_episode(
                client, job.task, job.image, spec, config.budget, codex, header, recorder=recorder, artifacts=artifacts, limits=limits
            )
        else:
            with Container.start(client, job.image, limits=limits, workdir=job.task.workdir) as container:
                trajectory = run_episode(job.task, policy, container, config, header, recorder)
        verdict = verify(
            client, job.task, trajectory.final_patch, job.image, log_dir=out / "verify-logs", timeout_s=verify_timeout_s, limits=limits
        )
        trajectory.outcome = outcome_of(verdict)
        recorder.end(trajectory, {"budget": config.budget.to_dict()})
    finally:
        recorder.close()
    return trajectory


@dataclass(frozen=True)
class Episode:
    """One collect work unit's function: a job in, its verified trajectory out. Picklable
    for a remote backend (there ``policy`` is None and each node builds its own client
    from ``spec``; ``engine`` opens that node's Docker engine)."""

    engine: Callable[[], docker.DockerClient]
    policy: Policy | None
    spec: PolicySpec
    config: AgentConfig
    out: Path
    limits: Limits
    base_image: str | None
    codex: CodexCliConfig | None
    registry: str | None = None

    def __call__(self, job: Job) -> Trajectory:
        client = self.engine()
        # The image on the engine that runs the episode: built (or pulled from the registry)
        # there, once per node; here it is there already unless a registry was named.
        node_image(client, job.task, job.image, self.base_image, self.registry)
        return run_job(
            client, job, self.policy or make_policy(self.spec), self.spec, self.config, self.out, limits=self.limits, codex=self.codex
        )


def collect(
    client: docker.DockerClient,
    tasks: list[Task],
    policy: Policy,
    spec: PolicySpec,
    out: Path,
    *,
    attempts: int = 1,
    workers: int = 1,
    config: AgentConfig | None = None,
    limits: Limits = DEFAULT_LIMITS,
    base_image: str | None = None,
    spend_cap_usd: float | None = None,
    infra_retries: int = 1,
    on_done: Callable[[Trajectory | None], None] | None = None,
    codex: CodexCliConfig | None = None,
    backend: Backend | None = None,
    registry: str | None = None,
) -> CollectSummary:
    """Run every (task, attempt) not yet in ``out``. Infrastructure failures (image
    missing, container or engine errors, a cluster node lost) are retried
    ``infra_retries`` times, then recorded in ``infra_errors.jsonl``, apart from model
    failures. With a spend cap, no new episode starts once the run (this session and
    earlier ones) has spent it.

    ``codex``: run the real Codex CLI as the agent instead of our own loop (``policy``
    is then unused: Codex talks to ``spec``'s Responses endpoint through the gateway).
    ``backend``: where the episodes run (default: ``workers`` threads here; see
    envs.executor for a Ray cluster). Only this process writes the pool. ``registry``
    (HOST[/NS]): whoever runs an episode pulls its image from there when it lacks it
    (envs.images.node_image); nothing is built here."""
    config = config or AgentConfig()
    agent = CODEX_AGENT if codex is not None else "builtin"
    local = backend is None or isinstance(backend, LocalBackend)
    if codex is not None and not local:
        raise ClusterError("--agent codex-cli runs on this machine only (its gateway listens here)")
    if codex is not None:
        sweep_networks(client)  # what a killed codex-cli run left
        if codex.relay_image is None and base_image is not None:
            codex = dataclasses.replace(codex, relay_image=base_image)
    out.mkdir(parents=True, exist_ok=True)
    pool_path = out / "trajectories.jsonl"
    errors: list[RecordError] = []
    previous = list(read_trajectories_lenient(pool_path, errors)) if pool_path.exists() else []
    done = {t.id for t in previous}
    spent = sum((t.usage.cost_usd or 0.0) for t in previous if t.usage)
    summary = CollectSummary()
    jobs: list[Job] = []
    for task in tasks:
        for attempt in range(attempts):
            job = Job(task, attempt, trajectory_id(task.instance_id, spec, attempt, agent))
            if job.id in done:
                summary.skipped += 1
            else:
                summary.restarted += (out / "episodes" / f"{job.id}.jsonl").exists()
                jobs.append(job)
    runner = backend or LocalBackend(workers)
    try:
        with JsonlWriter(out / "infra_errors.jsonl", fsync=True) as infra_log:

            def infra_failure(job: Job, error: str, tries: int) -> None:
                record = {"id": job.id, "task_id": job.task.instance_id, "attempt": job.attempt, "error": error, "tries": tries}
                infra_log.write(record)
                summary.infra_errors.append(record)
                summary.errors.append(f"{job.id}: {error}")
                if on_done:
                    on_done(None)

            images: dict[str, str] = {}
            for task in {job.task.instance_id: job.task for job in jobs}.values():
                try:
                    images[task.instance_id] = image_name(task) if registry is not None else task_image(client, task, base_image)
                except (RuntimeError, ValueError, docker.errors.DockerException) as exc:
                    for job in (j for j in jobs if j.task.instance_id == task.instance_id):
                        infra_failure(job, f"image: {exc}", 0)
            queue = [job for job in jobs if job.task.instance_id in images]
            for job in queue:
                job.image = images[job.task.instance_id]
            episode = Episode(runner.engine(client), policy if local else None, spec, config, out, limits, base_image, codex, registry)
            with JsonlWriter(pool_path, fsync=True) as pool:

                def admit(_job: Job) -> bool:
                    # Start episodes only while there is budget: the cap is checked before each start.
                    return spend_cap_usd is None or spent < spend_cap_usd

                def finished(_job: Job, trajectory: Trajectory) -> None:
                    nonlocal spent
                    spent += (trajectory.usage.cost_usd or 0.0) if trajectory.usage else 0.0
                    pool.write(trajectory)
                    summary.finished.append(trajectory)
                    if on_done:
                        on_done(trajectory)

                def failed(job: Job, exc: BaseException, tries: int) -> bool:
                    # An infrastructure failure: retry, then record it apart.
                    if tries <= infra_retries:
                        summary.retried += 1
                        return True
                    infra_failure(job, f"{type(exc).__name__}: {exc}", tries)
                    return False

                left = run_units(runner, queue, episode, on_result=finished, on_error=failed, admit=admit)
                summary.capped += len(left.not_started)
                summary.per_node = left.per_node
    finally:
        if backend is None:
            runner.close()
        elif not local:
            # A node lost mid-episode could not remove its containers: their owner is dead,
            # so the sweep of this engine takes them (`relearn envs gc --ray` sweeps every node).
            docker_backend.gc(client)
    return summary
