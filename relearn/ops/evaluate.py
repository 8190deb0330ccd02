"""``relearn eval run`` and the pipeline's eval stages: one policy on the selected instances under
a fixed budget, each graded in a fresh container, then the run's report (``eval.report``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.executor import Needs
from relearn.ops.collect import episode_budget, policy_spec, resolve_agent
from relearn.ops.containers import container_limits, container_session, image_choice, node_counts
from relearn.ops.outputs import check_run_dir
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.evaluate import CompareOptions, EvalOptions, ReportOptions

if TYPE_CHECKING:
    from harness.collect import CollectSummary


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
    protocol, codex = resolve_agent(options.agent)
    spec = policy_spec(options.endpoint, options.model, protocol, options.agent)
    c = options.containers
    config = RunConfig(
        dataset=options.dataset, spec=spec, budget=episode_budget(options.budget),
        selection=Selection(tuple(options.ids or ()), tuple(options.repos or ()), tuple(options.difficulties or ()), options.slice),
        seed=options.seed, workers=options.workers, spend_cap_usd=options.spend_cap, codex=codex, apply_patch=options.agent.apply_patch,  # type: ignore[arg-type]
        images=image_choice(c), pull=c.pull, limits=container_limits(c), registry=c.registry,
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
