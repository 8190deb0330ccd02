"""``relearn envs build``: the task images (the base image first, when a mini task needs it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relearn.ops.containers import docker_client, load_task_list
from relearn.ops.envs._engine import _base_failed
from relearn.ops.reporting import SILENT, Reporter, stage
from relearn.verbs.envs import BuildOptions

if TYPE_CHECKING:
    import docker

    from envs.tasks import Task


@dataclass
class BuildSummary:
    images: list[tuple[str, str]]  # (instance id, image) built or found on the engine
    failures: list[str]  # "instance id: why"
    unreadable: list[str]  # task records that could not be read


def run_build(options: BuildOptions, reporter: Reporter = SILENT) -> BuildSummary:
    from envs.images import task_image

    chosen, unreadable = load_task_list(options.tasks, options.ids)
    client = docker_client()
    base = _base(client, chosen, reporter)
    images: list[tuple[str, str]] = []
    failures: list[str] = []
    with stage(reporter, "building task images", len(chosen)):
        for task in chosen:
            try:
                images.append((task.instance_id, task_image(client, task, base, leaky=options.leaky)))
            except (RuntimeError, ValueError) as exc:
                failures.append(f"{task.instance_id}: {exc}")
            reporter.advance()
    return BuildSummary(images, failures, unreadable)


def _base(client: docker.DockerClient, tasks: list[Task], reporter: Reporter) -> str | None:
    """The base image, built when a bundled mini task needs it."""
    from envs.images import base_if_needed

    try:
        return base_if_needed(client, tasks, log=reporter.note)
    except RuntimeError as exc:
        raise _base_failed(exc, reporter) from None
