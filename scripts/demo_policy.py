"""Serve a scripted policy over the OpenAI Chat Completions protocol for the demo.

    python scripts/demo_policy.py URL_FILE

It stands in for an earlier RL checkpoint whose successful trajectories hold planted
mistakes, redundant exploration and repeated test runs (tests/scripted.py: historical).
Writes its base URL to URL_FILE and serves until killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs.tasks import load_tasks  # noqa: E402
from tests.model_servers import ModelServer  # noqa: E402
from tests.scripted import historical  # noqa: E402

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"


def main() -> None:
    tasks = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
    with ModelServer("chat", historical(tasks)) as server:
        Path(sys.argv[1]).write_text(server.base_url)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
