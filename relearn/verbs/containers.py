"""What every verb that runs tasks in containers accepts: which tasks, each one's image and limits, and the
machines that run them; the work (engine, images, Ray backend) is ``relearn.ops.containers``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.image_choice import TEMPLATE_FIELDS
from envs.limits import DEFAULT_LIMITS
from relearn.options import option

RAY_HELP = (
    "Run the work units on a Ray cluster: auto joins the cluster `ray start` runs on this machine, HOST:PORT (or ray://HOST:PORT) a remote head, local starts a throwaway one here. "
    "Container work asks each node for the custom resource docker (start a node with --resources '{\"docker\": N}' to run N containers at once on its engine). "
    "Only this process writes the output files. Without --ray, everything runs here (--workers)."
)
REGISTRY_HELP = (
    "Where a machine that lacks a task's image pulls it from, instead of building it: image NAME:TAG is pulled as HOST/NAMESPACE/NAME:TAG (a registry host in NAME is dropped) and tagged NAME:TAG there. "
    "Push the images there first (docker tag NAME:TAG HOST/NS/NAME:TAG; docker push HOST/NS/NAME:TAG). With --ray, every node pulls what it lacks; this machine builds nothing."
)
RAY_WHY = "the pipeline's [cluster] address"
REGISTRY_WHY = "the pipeline's [cluster].registry"
DEFAULT_MEMORY = f"{DEFAULT_LIMITS.memory_mb // 1024}g"


def memory_mb(value: str) -> int:
    """``4g``, ``4096m``, ``4096`` (MiB) -> MiB; at least 64."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", value.lower())
    if not match:
        raise ValueError(f"--memory {value!r}: expected a size such as 4g, 4096m or 4096 (MiB)")
    number, unit = float(match.group(1)), match.group(2) or "m"
    mb = number * {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]
    if mb < 64:
        raise ValueError(f"--memory {value!r}: at least 64 MiB")
    return int(mb)


@dataclass
class ContainerOptions:
    """Where a verb's tasks run: the image of each (``image_map`` wins over ``image_template``,
    which wins over the task's own), each container's limits, and the machines that run them."""

    image_map: Path | None = option(
        None, "Instance id -> image: a JSON object, JSONL rows {instance_id, image}, or lines `INSTANCE_ID IMAGE`. Wins over --image-template and the row's image column.",
        exists="file",
    )  # fmt: skip
    image_template: str | None = option(
        None, "Image name for every task the map does not name, e.g. a registry's address, a slash and `sweb.eval.{arch}.{instance_key}:{tag}`. Placeholders: "
        + "; ".join("{" + name + "} " + what for name, what in TEMPLATE_FIELDS.items()),
        metavar="TEMPLATE", min_length=1,  # an empty template names no image
    )  # fmt: skip
    pull: bool = option(
        False, "Pull images that are not on the engine from their registry (progress, retries; errors name the image and the registry's answer).",
        flag_only=True,
    )  # fmt: skip
    cpus: float = option(DEFAULT_LIMITS.cpus, "CPUs per container (recorded in each verdict).", gt=0)
    memory: str = option(DEFAULT_MEMORY, "Memory per container, e.g. 4g, 4096m, or MiB (recorded in each verdict).", metavar="SIZE")
    ray: str | None = option(None, RAY_HELP, metavar="ADDRESS", front="cli", why=RAY_WHY)
    registry: str | None = option(None, REGISTRY_HELP, metavar="HOST[/NAMESPACE]", front="cli", why=REGISTRY_WHY)


def tasks_option() -> Any:
    """A container verb's ``--tasks``; the pipeline runs its file's top-level ``tasks``."""
    return option(
        "mini", "Task file (.jsonl/.json/.parquet), task folder(s), or `mini` for the bundled suite.",
        flags=("--tasks", "-t"), metavar="TASKS", front="cli", why="the pipeline file's top-level tasks",
    )  # fmt: skip
