"""``relearn demo``: the whole ROSS pipeline on this machine, from a fresh clone, in minutes.

Everything real except the two models, which cannot be had offline on 2 CPU cores:
  * the *historical checkpoint* is a scripted policy served over the OpenAI protocol
    (``harness.scripted.historical``): its successful trajectories hold a wrong hypothesis, a
    failed command, redundant listings, repeated test runs and a guessed edit it reverts;
  * the *model being relearned* is a tiny random Qwen3 with the real 248,320-token vocabulary,
    served for evaluation by ``relearn serve``'s server (the vLLM stand-in). It cannot solve a
    task, so the comparison at the end shows the machinery, not the paper's gains; the NLL of
    kept and excluded tokens (three of the eleven tasks held out) shows what the mask changes
    in what the model learns.
Docker containers, the swebench grader, the Qwen3.6 tokenizer and chat template, the heuristic
reviewer, the trainer and the evaluation harness are the production ones.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from relearn.pipeline.config import PipelineConfig, load_pipeline
from relearn.pipeline.context import Context
from relearn.pipeline.plan import run_pipeline
from relearn.pipeline.runner import StageResult

POLICY = "harness.scripted.historical"  # run as a module, so the demo needs no clone

# Four tasks for the evaluation keep the demo within its time on 2 cores; the historical pool
# covers all eleven, three of which no variant trains on (held out for the NLL analysis).
DEMO_TOML = """\
# The demo's pipeline: rerun `relearn run {path}` and nothing is redone;
# delete a stage's output (say datasets/ross/) and only it and what follows run again.
workdir = "."
tasks = "mini"

[pool.collect]               # base_url: the scripted historical checkpoint the demo starts
model = "historical-ckpt"
checkpoint = "iter-29"
step = 29
workers = 2
max_turns = 14

[review]
reviewer = "heuristic"       # the offline stand-in, asked for by name (a real pool names judge1 and judge2)

[masks]
tokenizer = "qwen3.6"
variants = ["positive", "ross-nomask", "ross"]
heldout_tasks = ["mini__retrying-1", "mini__tabular-1", "mini__vertools-1"]
ctx = 16384                  # the mini tasks' trajectories are short; [train] takes the same length

[train]                      # one pass over the 8 training trajectories: a step costs ~6 s on 2 cores (the 248,320-token LM head)
tiny = "qwen3"
epochs = 1
lr = 1e-3
warmup = 0

[analyze]                    # NLL of kept and excluded tokens, training pool and held-out, under all four models

[eval]
dataset = "mini"
ids = ["mini__calc-1", "mini__pager-1", "mini__textkit-1", "mini__ledger-1"]
max_turns = 3
max_new_tokens = 48
workers = 2
"""


def write_demo_pipeline(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pipeline.toml"
    text = DEMO_TOML.format(path=path)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


class ScriptedCheckpoint:
    """The scripted historical policy in its own process, for as long as the pool stage may need it."""

    def __init__(self, out: Path) -> None:
        self.url_file = out / ".policy.url"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        self.url_file.unlink(missing_ok=True)
        self.process = subprocess.Popen([sys.executable, "-m", POLICY, str(self.url_file)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.url_file.exists() and self.url_file.read_text().strip():
                return self.url_file.read_text().strip()
            if self.process.poll() is not None:
                raise RuntimeError(f"the scripted checkpoint ({POLICY}) exited with {self.process.returncode}")
            time.sleep(0.1)
        raise RuntimeError(f"the scripted checkpoint ({POLICY}) did not start within 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.url_file.unlink(missing_ok=True)


def run_demo(out: Path, console: Console) -> tuple[list[StageResult], Context, PipelineConfig]:
    config = load_pipeline(write_demo_pipeline(out))
    with ScriptedCheckpoint(out) as url:
        results, ctx = run_pipeline(config, console, pool_url=url)
    return results, ctx, config


def artifacts(w: Path) -> list[str]:
    """What the demo wrote and where to look inside, one line each."""
    return [
        "Artifacts:",
        f"  {w / 'pool/trajectories.jsonl'}   the historical pool (episodes/ as recorded, verify-logs/ of every grading)",
        f"  {w / 'reviews.jsonl'}   one Review per trajectory: decision, grounded defect spans",
        f"  {w / 'heldout'}/   train.jsonl (what every variant compiles) and heldout.jsonl (the held-out tasks' trajectories)",
        f"  {w / 'datasets'}/<variant>/   Parquet shards (input_ids, loss_mask) and stats.json (TER, excluded by category); contrasts.json, the trajectory sets side by side",
        f"  {w / 'train'}/<variant>/   metrics.jsonl, checkpoints/, model/ (Hugging Face weights)",
        f"  {w / 'analyze'}/   nll.md and nll.json: NLL of kept and excluded tokens under the start model and each variant",
        f"  {w / 'eval'}/<model>/   manifest.json, trajectories, predictions.jsonl, report.md",
        f"  {w / 'report/report.md'}   every stage's counts and the side-by-side comparison (report.json, resolved.png, train_loss.png)",
        "Look inside:",
        f"  relearn view {w / 'verified.jsonl'} --reviews {w / 'reviews.jsonl'} --dataset {w / 'datasets/ross'}",
        f"  relearn stats {w / 'verified.jsonl'} --reviews {w / 'reviews.jsonl'} --dataset {w / 'datasets/ross'}",
    ]
