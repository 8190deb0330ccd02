"""The demo's historical checkpoint: the scripted policy served over the OpenAI Chat Completions
protocol until killed.

    python -m harness.scripted.historical URL_FILE

It stands in for an earlier RL checkpoint whose successful trajectories hold planted mistakes,
redundant exploration and repeated test runs (``harness.scripted.solutions.historical``); it
writes its base URL to URL_FILE once it listens. ``relearn demo`` starts it for its pool stage.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import envs
from envs.tasks import load_tasks
from harness.scripted.servers import ModelServer
from harness.scripted.solutions import historical

MINI_SUITE = Path(envs.__file__).resolve().parent / "mini_tasks"


def main(url_file: Path) -> None:
    tasks = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
    with ModelServer("chat", historical(tasks)) as server:
        url_file.write_text(server.base_url)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
