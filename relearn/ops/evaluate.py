"""``relearn eval run`` and the pipeline's eval stages: one policy on the selected instances under
a fixed budget, each graded in a fresh container, then the run's report (``eval.report``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.executor import Needs
from relearn.ops.collect import AgentOptions
from relearn.ops.containers import ContainerOptions, container_session, node_counts
from relearn.ops.outputs import check_run_dir
from relearn.ops.reporting import SILENT, OpError, Reporter, stage

if TYPE_CHECKING:
    from harness.collect import CollectSummary


@dataclass
class EvalOptions:
    out: Path  # the run folder: created, or resumed when it holds the same run
    model: str
    dataset: str = "mini"  # mini, a local .parquet/.jsonl/.json, or a Hugging Face dataset name
    agent: AgentOptions = field(default_factory=AgentOptions)
    base_url: str | None = None
    api_key_env: str | None = None
    checkpoint: str | None = None
    ids: list[str] | None = None
    repos: list[str] | None = None
    difficulties: list[str] | None = None
    slice: str | None = None  # start:stop over the selected instances
    temperature: float | None = None
    max_output_tokens: int | None = None
    seed: int | None = None
    workers: int = 1
    max_turns: int | None = 50
    max_tokens: int | None = None
    max_seconds: float | None = None
    max_cost: float | None = None  # USD per instance
    spend_cap: float | None = None  # USD for the run: no instance starts once it is spent
    price_in: float = 0.0
    price_out: float = 0.0
    containers: ContainerOptions = field(default_factory=ContainerOptions)


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
    from harness.budget import Budget
    from harness.policies.base import PolicySpec

    if options.workers < 1:
        raise OpError(f"--workers {options.workers}: at least 1")
    check_run_dir(options.out, ("manifest.json",), "relearn eval run")
    protocol, codex = options.agent.resolve()
    sampling = {k: v for k, v in (("temperature", options.temperature), ("max_tokens", options.max_output_tokens)) if v is not None}
    spec = PolicySpec(
        kind=protocol,  # type: ignore[arg-type]
        model=options.model, base_url=options.base_url, api_key_env=options.api_key_env, sampling=sampling,
        price_in_per_mtok=options.price_in, price_out_per_mtok=options.price_out, checkpoint=options.checkpoint,
        request_token_ids=options.agent.request_token_ids(),
    )  # fmt: skip
    c = options.containers
    config = RunConfig(
        dataset=options.dataset, spec=spec,
        budget=Budget(max_turns=options.max_turns, max_tokens=options.max_tokens, max_seconds=options.max_seconds, max_cost_usd=options.max_cost),
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
