"""The options every verb that runs tasks in containers shares: which tasks (``--tasks``), which
image a task uses (``--image-map``, ``--image-template``, ``--pull``) and the containers' limits
(``--cpus``, ``--memory``), as typer options; their defaults and the work are
``relearn.ops.containers``'s. And, for `relearn run`, SIGTERM as Ctrl-C for the whole process."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from envs.image_choice import TEMPLATE_FIELDS

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
        help="Image name for every task the map does not name, e.g. a registry's address, a slash and `sweb.eval.{arch}.{instance_key}:{tag}`. Placeholders: "
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
TasksArg = Annotated[
    str, typer.Option("--tasks", "-t", help="Task file (.jsonl/.json/.parquet), task folder(s), or `mini` for the bundled suite.")
]


def terminate_cleanly() -> None:
    """For the whole process: SIGTERM unwinds like Ctrl-C, so every `with Container` removes its container."""

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
