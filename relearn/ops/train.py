"""``relearn train`` and the pipeline's train stages: masked SFT on the shards of ``relearn masks``.

The options are ``relearn.train.options.TrainOptions``, the only place the trainer's defaults
are written; ``relearn train`` builds it from its flags and the pipeline from ``[train]``.
The trainer draws its own progress (step, loss, supervised tokens per second, ETA) on the
console it is given, because under ``torchrun`` only rank 0 draws it; it is silent without one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from relearn.ops.outputs import check_run_dir
from relearn.ops.reporting import OpError
from relearn.train.options import TrainOptions, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from relearn.train.loop import Summary as TrainSummary

__all__ = ["TrainOptions", "run_train"]


def run_train(options: TrainOptions, *, console: Console | None = None) -> TrainSummary:
    """Run (or resume) a training run into ``options.out``. Raises ``OpError`` for options or
    data the trainer refuses (nothing was trained); the summary says whether a signal stopped it."""
    from rich.console import Console

    from relearn.train.checkpoints import CHECKPOINTS, METRICS, MODEL_DIR, RUN_FILE
    from relearn.train.loop import train  # torch and transformers: imported only to train

    check_run_dir(options.out, (RUN_FILE, CHECKPOINTS, METRICS, MODEL_DIR), "relearn train")
    if console is None:
        options = replace(options, progress=False)
    try:
        return train(options, console=console or Console(quiet=True))
    except UsageError as exc:
        raise OpError(str(exc)) from None
