"""The container options as typer options, for the verbs not yet derived from their options
dataclass (relearn envs): the declarations of ``ReplayOptions``, whose options are exactly the
tasks and ``relearn.ops.containers.ContainerOptions``. And, for `relearn run`, SIGTERM as Ctrl-C
for the whole process."""

from __future__ import annotations

import signal

from relearn.cli.declared import parameter
from relearn.ops.collect import ReplayOptions
from relearn.options import options_of

_ARGS = {option.name: parameter(option).annotation for option in options_of(ReplayOptions)}
ImageMapArg, ImageTemplateArg, PullArg = _ARGS["image_map"], _ARGS["image_template"], _ARGS["pull"]
CpusArg, MemoryArg, TasksArg = _ARGS["cpus"], _ARGS["memory"], _ARGS["tasks"]


def terminate_cleanly() -> None:
    """For the whole process: SIGTERM unwinds like Ctrl-C, so every `with Container` removes its container."""

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
