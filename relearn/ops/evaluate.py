"""``relearn eval run`` and the pipeline's eval stages: one policy on the selected instances under
a fixed budget, each graded in a fresh container, then the run's report (``eval.report``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.executor import Needs
from relearn.ops.collect import AgentOptions, BudgetOptions, EndpointOptions
from relearn.ops.containers import ContainerOptions, container_session, node_counts
from relearn.ops.outputs import check_run_dir
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.options import nested, option

if TYPE_CHECKING:
    from harness.collect import CollectSummary


# The pipeline evaluates the models it serves itself, on this machine, at no cost.
SERVED = "the pipeline serves the model it evaluates: it names it, its endpoint and its output limit ([eval].max_new_tokens), at no price"
# The endpoint's and the budget's options that [eval] leaves out, each for that reason.
SERVED_ENDPOINT = dict.fromkeys(("base_url", "api_key_env", "checkpoint", "max_output_tokens", "price_in", "price_out", "max_cost"), SERVED)


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


@dataclass
class EvalSummary:
    out: Path
    collect: CollectSummary
    selected: int
    report: dict[str, Any]  # eval.report.write_report's: resolved, graded, resolved_rate, CI, infra errors

    @property
    def partial(self) -> bool:
        return bool(self.collect.errors)


def run_evaluation(options: EvalOptions, reporter: Reporter = SILENT) -> EvalSummary:
    """Run (or resume) the evaluation, then write report.json and report.md."""
    # The SDKs and swebench take seconds to import: only the verb that runs loads them.
    from eval.dataset import Selection
    from eval.report import write_report
    from eval.run import ManifestMismatch, RunConfig, run_eval

    check_run_dir(options.out, ("manifest.json",), "relearn eval run")
    protocol, codex = options.agent.resolve()
    spec = options.endpoint.spec(options.model, protocol, options.agent)
    c = options.containers
    config = RunConfig(
        dataset=options.dataset, spec=spec, budget=options.budget.as_budget(),
        selection=Selection(tuple(options.ids or ()), tuple(options.repos or ()), tuple(options.difficulties or ()), options.slice),
        seed=options.seed, workers=options.workers, spend_cap_usd=options.spend_cap, codex=codex, apply_patch=options.agent.apply_patch,  # type: ignore[arg-type]
        images=c.choice(), pull=c.pull, limits=c.limits(), registry=c.registry,
    )  # fmt: skip
    resolved = 0

    def done(trajectory: Any) -> None:
        nonlocal resolved
        resolved += bool(trajectory and trajectory.outcome and trajectory.outcome.resolved)
        reporter.advance(resolved=resolved, **node_counts(backend))

    with container_session(c, reporter) as session, session.backend(Needs(docker=1)) as backend, stage(reporter, "evaluating"):
        try:
            summary, selected = run_eval(
                session.client, config, options.out, on_done=done, prepare=lambda tasks: session.prepare(tasks, need_base=codex is not None),
                backend=backend,
            )  # fmt: skip
        except (ManifestMismatch, ValueError, RuntimeError) as exc:  # ClusterError among them
            raise OpError(str(exc)) from None
    return EvalSummary(options.out, summary, selected, write_report(options.out))


def run_report(options: ReportOptions, reporter: Reporter = SILENT) -> dict[str, Any]:
    """Write a run folder's report.json and report.md (``eval.report``); the report back."""
    from eval.report import write_report

    try:
        return write_report(options.run_dir)
    except FileNotFoundError as exc:
        raise OpError(str(exc)) from None


def run_compare(options: CompareOptions, reporter: Reporter = SILENT) -> str:
    """Write compare.json, compare.md and compare.png of the runs side by side; the markdown back.
    OpError when their scaffold, budget or instances differ."""
    from eval.report import NotComparable, compare, compare_chart, compare_markdown

    labels = options.names or [path.name for path in options.runs]
    if len(labels) != len(options.runs):
        raise OpError("give one --name per run")
    try:
        result = compare(list(zip(labels, options.runs, strict=True)))
    except (NotComparable, FileNotFoundError) as exc:
        raise OpError(str(exc)) from None
    options.output.mkdir(parents=True, exist_ok=True)
    markdown = compare_markdown(result)
    (options.output / "compare.json").write_text(json.dumps(result, indent=1))
    (options.output / "compare.md").write_text(markdown)
    compare_chart(result, options.output / "compare.png")
    return markdown
