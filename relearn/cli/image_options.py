"""The options every verb that runs tasks in containers shares: which image a task uses
(``--image-map``, ``--image-template``, ``--pull``) and the containers' limits
(``--cpus``, ``--memory``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from envs.docker_backend import DEFAULT_LIMITS, Limits
from envs.image_choice import TEMPLATE_FIELDS, ImageChoice
from records.pools import RecordError
from relearn.cli.output import EXIT_USAGE, err, show_problems

if TYPE_CHECKING:
    import docker

    from envs.images import Prepared
    from envs.tasks import Task

ImageMapArg = Annotated[
    Path | None,
    typer.Option(
        "--image-map",
        exists=True,
        dir_okay=False,
        help="Instance id -> image: a JSON object, JSONL rows {instance_id, image}, or lines `INSTANCE_ID IMAGE`. Wins over --image-template and the row's image column.",
    ),
]
ImageTemplateArg = Annotated[
    str | None,
    typer.Option(
        "--image-template",
        help="Image name for every task the map does not name, e.g. 'registry.example.com/swe/sweb.eval.{arch}.{instance_key}:{tag}'. Placeholders: "
        + "; ".join("{" + name + "} " + what for name, what in TEMPLATE_FIELDS.items()),
    ),
]
PullArg = Annotated[
    bool,
    typer.Option(
        "--pull",
        help="Pull images that are not on the engine from their registry (progress, retries; errors name the image and the registry's answer).",
    ),
]
CpusArg = Annotated[float, typer.Option("--cpus", min=0.1, help="CPUs per container (recorded in each verdict).")]
MemoryArg = Annotated[str, typer.Option("--memory", help="Memory per container, e.g. 4g, 4096m, or MiB (recorded in each verdict).")]
DEFAULT_CPUS = DEFAULT_LIMITS.cpus
DEFAULT_MEMORY = f"{DEFAULT_LIMITS.memory_mb // 1024}g"


def image_choice(image_map: Path | None, template: str | None) -> ImageChoice:
    try:
        return ImageChoice.from_options(image_map, template)
    except (RecordError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None


def memory_mb(value: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", value.lower())
    if not match:
        raise ValueError(f"--memory {value!r}: expected a size such as 4g, 4096m or 4096 (MiB)")
    number, unit = float(match.group(1)), match.group(2) or "m"
    mb = number * {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]
    if mb < 64:
        raise ValueError(f"--memory {value!r}: at least 64 MiB")
    return int(mb)


def limits_from(cpus: float, memory: str, base: Limits = DEFAULT_LIMITS) -> Limits:
    try:
        return Limits(cpus=cpus, memory_mb=memory_mb(memory), pids=base.pids, network=base.network)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None


def prepare(client: docker.DockerClient, tasks: list[Task], choice: ImageChoice, *, pull: bool, need_base: bool = False) -> Prepared:
    """Route the tasks to their images, pull what is missing (with ``--pull``, a progress
    bar per image), build the base image only when a task needs it; shows what failed."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from envs.images import prepare_images

    progress = Progress(
        TextColumn("[bold]pulling[/bold] {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    )
    bars: dict[str, object] = {}

    def on_progress(state) -> None:  # noqa: ANN001
        if state.image not in bars:
            bars[state.image] = progress.add_task(state.image, total=None)
        progress.update(bars[state.image], total=state.total or None, completed=state.current)  # type: ignore[arg-type]

    try:
        with progress:
            prepared = prepare_images(
                client,
                tasks,
                choice,
                pull=pull,
                need_base=need_base,
                log=lambda m: err.print(f"[dim]{m}[/dim]", highlight=False),
                on_pull_progress=on_progress,
            )
    except (RuntimeError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    show_problems("images", prepared.problems)
    return prepared
