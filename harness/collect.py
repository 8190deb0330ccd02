"""Collection: tasks × attempts of one policy over a worker pool, into a pool of
verified trajectories.

Layout of an output folder::

    trajectories.jsonl        finished trajectories (appended, fsynced): the pool
    episodes/<id>.jsonl       each episode as it runs (see harness.recorder)
    episodes/<id>.partial-N.jsonl   what a killed run had recorded, kept when it restarts
    verify-logs/              full test logs of the verifications

Resumable by (task, policy, attempt): a rerun skips every id in trajectories.jsonl and
restarts the episodes a killed run left unfinished.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from math import comb
from pathlib import Path

import docker

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.images import task_image
from envs.tasks import Task
from envs.verify import verify
from harness.agent import SCAFFOLD_VERSION, AgentConfig, now, run_episode
from harness.jsonl import JsonlWriter, existing_ids
from harness.policies import Policy, PolicySpec
from harness.recorder import EpisodeRecorder
from harness.trajectory import Outcome, Source, Trajectory
from harness.trajectory import Policy as PolicyInfo


def trajectory_id(task_id: str, spec: PolicySpec, attempt: int) -> str:
    raw = f"{task_id}:{spec.model}:{spec.checkpoint or '-'}:{attempt}"
    return re.sub(r"[^A-Za-z0-9_.:@+-]", "_", raw)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c successes (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts, have {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class CollectSummary:
    finished: list[Trajectory] = field(default_factory=list)
    skipped: int = 0
    restarted: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class Job:
    task: Task
    attempt: int
    id: str
    image: str = ""


def _header(job: Job, spec: PolicySpec, config: AgentConfig, image: str) -> Trajectory:
    return Trajectory(
        id=job.id,
        task_id=job.task.instance_id,
        policy=PolicyInfo(name=spec.model, checkpoint=spec.checkpoint, step=spec.step, provider=spec.kind),
        attempt=job.attempt,
        messages=[],
        started_at=now(),
        source=Source(
            format="relearn",
            format_version=SCAFFOLD_VERSION,
            meta={"image": image, "sampling": spec.sampling, "budget": config.budget.to_dict()},
        ),
    )


def _keep_partial(path: Path) -> None:
    """A killed run's recording is kept beside, never overwritten."""
    number = 0
    while (target := path.with_name(f"{path.stem}.partial-{number}.jsonl")).exists():
        number += 1
    path.rename(target)


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
) -> Trajectory:
    episode_path = out / "episodes" / f"{job.id}.jsonl"
    episode_path.parent.mkdir(parents=True, exist_ok=True)
    if episode_path.exists():
        _keep_partial(episode_path)
    header = _header(job, spec, config, job.image)
    recorder = EpisodeRecorder(episode_path, header)
    try:
        with Container.start(client, job.image, limits=limits, workdir=job.task.workdir) as container:
            trajectory = run_episode(job.task, policy, container, config, header, recorder)
        verdict = verify(client, job.task, trajectory.final_patch, job.image, log_dir=out / "verify-logs", timeout_s=verify_timeout_s)
        trajectory.outcome = Outcome(
            reward=verdict.reward,
            resolved=verdict.resolved,
            verdict_ref=verdict.log_path,
            verdict={"tests": verdict.tests, "error": verdict.error, "image_digest": verdict.image_digest, "patch_applied": verdict.patch_applied},
        )
        recorder.end(trajectory, {"budget": config.budget.to_dict()})
    finally:
        recorder.close()
    return trajectory


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
    on_done: Callable[[Trajectory | None], None] | None = None,
) -> CollectSummary:
    config = config or AgentConfig()
    out.mkdir(parents=True, exist_ok=True)
    pool_path = out / "trajectories.jsonl"
    done = existing_ids(pool_path)
    summary = CollectSummary()
    jobs: list[Job] = []
    for task in tasks:
        for attempt in range(attempts):
            job = Job(task, attempt, trajectory_id(task.instance_id, spec, attempt))
            if job.id in done:
                summary.skipped += 1
            else:
                summary.restarted += (out / "episodes" / f"{job.id}.jsonl").exists()
                jobs.append(job)
    images: dict[str, str] = {}
    for task in {job.task.instance_id: job.task for job in jobs}.values():
        try:
            images[task.instance_id] = task_image(client, task, base_image)
        except (RuntimeError, ValueError) as exc:
            summary.errors.append(f"{task.instance_id}: {exc}")
    runnable = [job for job in jobs if job.task.instance_id in images]
    for job in runnable:
        job.image = images[job.task.instance_id]
    with JsonlWriter(pool_path, fsync=True) as pool, ThreadPoolExecutor(max_workers=max(1, workers)) as executor:
        futures = {executor.submit(run_job, client, job, policy, spec, config, out, limits=limits): job for job in runnable}
        for future in as_completed(futures):
            job = futures[future]
            try:
                trajectory = future.result()
            except Exception as exc:  # one broken episode must not stop the collection
                summary.errors.append(f"{job.id}: {type(exc).__name__}: {exc}")
                if on_done:
                    on_done(None)
                continue
            pool.write(trajectory)
            summary.finished.append(trajectory)
            if on_done:
                on_done(trajectory)
    return summary


def pass_at_k_table(trajectories: list[Trajectory], ks: tuple[int, ...] = (1,)) -> dict[str, dict[str, float | int]]:
    """Per task: attempts, successes and unbiased pass@k for each k ≤ attempts."""
    by_task: dict[str, list[bool]] = {}
    for trajectory in trajectories:
        resolved = bool(trajectory.outcome and trajectory.outcome.resolved)
        by_task.setdefault(trajectory.task_id or "?", []).append(resolved)
    table: dict[str, dict[str, float | int]] = {}
    for task_id, results in sorted(by_task.items()):
        row: dict[str, float | int] = {"attempts": len(results), "resolved": sum(results)}
        for k in ks:
            if k <= len(results):
                row[f"pass@{k}"] = pass_at_k(len(results), sum(results), k)
        table[task_id] = row
    return table
