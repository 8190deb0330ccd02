"""What `relearn eval run`, `eval report` and `eval compare` accept (the pipeline's ``[eval]``); the
work is ``relearn.ops.evaluate``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relearn.options import nested, option
from relearn.verbs.collect import AgentOptions, BudgetOptions, EndpointOptions
from relearn.verbs.containers import ContainerOptions

# The pipeline evaluates the models it serves itself, on this machine, at no cost.
SERVED = "the pipeline serves the model it evaluates: it names it, its endpoint and its output limit ([eval].max_new_tokens), at no price"


@dataclass
class EvalOptions:
    """Run one policy on the selected instances under a fixed budget; grade each in a fresh container.

    Writes manifest.json, trajectories, predictions.jsonl (SWE-bench format), per-instance reports and report.md/json. Resumable: rerun the same command to finish a killed run.
    """

    out: Path = option(
        help="Run folder (created, or resumed when it holds the same run).", flags=("--out",), metavar="DIR",
        front="cli", why="the pipeline names each model's run folder",
    )  # fmt: skip
    model: str = option(help="Model name the endpoint serves.", metavar="NAME", front="cli", why=SERVED)
    dataset: str = option(
        "mini", "`mini`, a local .parquet/.jsonl/.json (e.g. ../shared/samples/swebench_verified.parquet), or a Hugging Face dataset name.",
        metavar="DATASET",
    )  # fmt: skip
    agent: AgentOptions = nested(AgentOptions)
    endpoint: EndpointOptions = nested(EndpointOptions)
    ids: list[str] | None = option(None, "Only these instances (repeatable).", flags=("--id",), metavar="ID")
    repos: list[str] | None = option(None, "Only these repositories (repeatable).", flags=("--repo",), metavar="REPO")
    difficulties: list[str] | None = option(None, "Only these difficulty labels (repeatable).", flags=("--difficulty",), metavar="LABEL")
    slice: str | None = option(None, "start:stop over the selected instances.", metavar="START:STOP")
    seed: int | None = option(None, "Sampling seed, sent to the endpoint and recorded.")
    workers: int = option(1, "Instances at once.", ge=1)
    budget: BudgetOptions = nested(BudgetOptions)
    spend_cap: float | None = option(None, "Stop starting instances once the run has spent this many USD.", gt=0)
    containers: ContainerOptions = nested(ContainerOptions)


@dataclass
class ReportOptions:
    """Write report.json and report.md for a run and print the summary."""

    run_dir: Path = option(help="A run folder.", argument=True, metavar="RUN")


@dataclass
class CompareOptions:
    """Put runs side by side with paired statistics; refuses runs whose scaffold, budget or instances differ."""

    runs: list[Path] = option(help="Run folders; the first is the baseline.", argument=True, metavar="RUN")
    output: Path = option(Path("compare"), "Folder for compare.md, compare.json and compare.png.", flags=("-o", "--output"), metavar="DIR")
    names: list[str] | None = option(
        None, "Display names, one per run (e.g. Upstream, Positive SFT, ROSS).", flags=("--name",), metavar="NAME"
    )
