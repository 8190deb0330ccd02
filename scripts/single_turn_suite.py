"""Run the single-turn pipeline on the shipped mini suite, with scripted judges, end to end.

    python scripts/single_turn_suite.py WORKDIR [--steps N]

Serves the scripted keep judge and auditor (harness/scripted/single_turn_judges.py) over the OpenAI Chat
Completions protocol on 127.0.0.1, writes WORKDIR/pipeline.toml (the suite's 80 rollouts, the
three contrasts, a tiny random Qwen3 trained N steps per variant), runs it (`relearn run`:
import -> verify -> review -> masks -> contrasts -> train -> report), then writes
`relearn stats --by-step-window 1-20,81-100` for the ROSS dataset to WORKDIR/stats/ (JSON and
PNGs). A rerun does no work: the server's URL is transport, not part of any stage's identity.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from harness.scripted.servers import ModelServer
from harness.scripted.single_turn_judges import judges
from relearn.pipeline.config import load_pipeline
from relearn.pipeline.plan import run_pipeline

PIPELINE = """\
# The shipped single-turn suite with scripted judges (scripts/single_turn_suite.py).
workdir = "."

[pool.single_turn]
tasks = "mini"
thinking = true   # the suite's rollouts were written in the thinking form (<think> blocks)

[review]
judge1 = "scripted-keep-judge"
judge2 = "scripted-auditor"
backend = "chat"
base_url = "{url}"

[masks]
variants = ["positive", "ross-nomask", "ross"]

[train]
tiny = "qwen3"
epochs = 1
max_steps = {steps}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--steps", type=int, default=2, help="training steps per variant")
    args = parser.parse_args()
    work: Path = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    console = Console()
    with ModelServer("chat", judges) as server:
        (work / "pipeline.toml").write_text(PIPELINE.format(url=server.base_url, steps=args.steps))
        results, _ = run_pipeline(load_pipeline(work / "pipeline.toml"), console)
    if any(r.status == "failed" for r in results):
        return 3
    stats = work / "stats"
    command = [str(Path(sys.executable).with_name("relearn"))]  # the venv's entry point, beside its python
    done = subprocess.run(
        [*command, "stats", str(work / "verified.jsonl"), "-r", str(work / "reviews.jsonl"), "-d", str(work / "datasets" / "ross"),
         "--by-step-window", "1-20,81-100", "--json", str(stats / "stats.json"), "--plots", str(stats)],
        check=False,
    )  # fmt: skip
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
