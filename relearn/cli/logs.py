"""Where other packages' chatter goes: to a log file, never between relearn's own lines.

relearn's progress bars, tables and ``warning:`` lines are the terminal's. Python warnings and
other packages' log records (transformers, DeepSpeed, Ray, HTTP clients) are appended to one log
file; Hugging Face's progress bars (a model's "Writing model shards", a download) are off, and
transformers says only its errors unless ``TRANSFORMERS_VERBOSITY`` asks for more. Set up before
anything else is imported, so that what those packages read from the environment at import is
already set. ``RELEARN_LOG`` names the file; by default it is under ``$XDG_STATE_HOME``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def log_path() -> Path:
    if os.environ.get("RELEARN_LOG"):
        return Path(os.environ["RELEARN_LOG"]).expanduser()
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "relearn" / "relearn.log"


def route_third_party_output() -> Path:
    """Quiet the packages' own terminal output and send their log records to ``log_path()``
    (opened only when something is written). Returns the file."""
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    path = log_path()
    handler = _LazyFileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger -> the file
    return path


class _LazyFileHandler(logging.FileHandler):
    """A file handler that makes its folder when it first writes (most commands write nothing)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True, encoding="utf-8")

    def _open(self):  # noqa: ANN202 - logging's own signature
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)
        except OSError:  # opening the file is outside logging's own error handling
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's own name
        """A log that cannot be written (a read-only home) costs the log, never the command
        (logging's default prints a traceback on stderr)."""
