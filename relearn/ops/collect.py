"""Running a policy on tasks in containers (``relearn collect``, the pipeline's ``[pool.collect]``)
and re-executing recorded tool calls (``relearn replay``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.executor import ClusterError, Needs
from records.pools import RecordError, read_trajectories_lenient
from relearn.ops.containers import container_limits, container_session, load_task_list, node_counts
from relearn.ops.outputs import POOL, check_jsonl_output, check_run_dir
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.collect import AGENTS, AgentOptions, BudgetOptions, CollectOptions, EndpointOptions, ReplayOptions

if TYPE_CHECKING:
    from harness.budget import Budget
    from harness.codex_cli.config import CodexCliConfig
    from harness.collect import CollectSummary
    from harness.policies.base import PolicySpec
    from harness.replay import ReplayReport

PASS_AT = (1, 2, 5, 10)


def resolve_agent(agent: AgentOptions) -> tuple[str, CodexCliConfig | None]:
    """(endpoint protocol, Codex config or None); OpError naming the option that does not fit."""
    from harness.codex_cli.config import CodexCliConfig
    from harness.codex_cli.install import InstallError, installed
    from harness.tools.apply_patch import SEMANTICS

    if agent.apply_patch not in SEMANTICS:
        raise OpError(f"--apply-patch must be one of {', '.join(SEMANTICS)}, not {agent.apply_patch!r}")
    if agent.agent not in AGENTS:
        raise OpError(f"--agent must be one of {', '.join(AGENTS)}, not {agent.agent!r}")
    if agent.agent == "builtin":
        return agent.policy or "chat", None
    if agent.policy not in (None, "responses"):
        raise OpError(f"--agent codex-cli speaks the Responses API: use --policy responses (got --policy {agent.policy})")
    try:
        config = CodexCliConfig(install=installed(), reasoning_effort=agent.reasoning_effort, request_token_ids=agent.request_token_ids())
        return "responses", config
    except (InstallError, ValueError) as exc:
        raise OpError(str(exc)) from None


def policy_spec(endpoint: EndpointOptions, model: str, protocol: str, agent: AgentOptions, step: int | None = None) -> PolicySpec:
    """The policy client's spec: ``protocol`` as ``resolve_agent`` chose it, ``step`` the checkpoint's training step."""
    from harness.policies.base import PolicySpec

    e = endpoint
    sampling = {k: v for k, v in (("temperature", e.temperature), ("max_tokens", e.max_output_tokens)) if v is not None}
    return PolicySpec(
        kind=protocol,  # type: ignore[arg-type]
        model=model, base_url=e.base_url, api_key_env=e.api_key_env, sampling=sampling, price_in_per_mtok=e.price_in,
        price_out_per_mtok=e.price_out, checkpoint=e.checkpoint, step=step, request_token_ids=agent.request_token_ids(),
    )  # fmt: skip


def episode_budget(budget: BudgetOptions) -> Budget:
    from harness.budget import Budget

    b = budget
    return Budget(max_turns=b.max_turns, max_tokens=b.max_tokens, max_seconds=b.max_seconds, max_cost_usd=b.max_cost)


@dataclass
class CollectRunSummary:
    pool: Path
    collect: CollectSummary
    trajectories: int  # in the pool now (earlier runs' too)
    resolved: int
    exit_status: dict[str, int]
    pass_at_k: dict[str, dict[str, float | int]]  # task -> attempts, resolved, pass@k for k in ``ks``
    ks: tuple[int, ...]
    task_problems: list[str]
    image_problems: list[str]
    unreadable: list[str]  # pool lines that are not trajectories

    @property
    def partial(self) -> bool:
        return bool(self.collect.errors)


def run_collect(options: CollectOptions, reporter: Reporter = SILENT) -> CollectRunSummary:
    """Every (task, attempt) not yet in the pool, each verified after its episode. Resumable
    by (task, policy, attempt)."""
    # The SDKs and swebench take seconds to import: only the verb that runs loads them.
    from harness.agent import AgentConfig
    from harness.collect import collect
    from harness.policies.make import make_policy

    check_run_dir(options.out, ("trajectories.jsonl", "episodes", "verify-logs", "infra_errors.jsonl"), "relearn collect")
    check_jsonl_output(options.out / "trajectories.jsonl", POOL, flag="--out")
    protocol, codex = resolve_agent(options.agent)
    spec = policy_spec(options.endpoint, options.model, protocol, options.agent, options.step)
    config = AgentConfig(budget=episode_budget(options.budget), apply_patch=options.agent.apply_patch)  # type: ignore[arg-type]
    with container_session(options.containers, reporter) as session:
        chosen, task_problems = load_task_list(options.tasks, options.ids)
        # The base image only when a task is built from it, or as the codex-cli relay.
        prepared = session.prepare(chosen, need_base=codex is not None)
        resolved = 0

        def done(trajectory: Any) -> None:
            nonlocal resolved
            resolved += bool(trajectory and trajectory.outcome and trajectory.outcome.resolved)
            reporter.advance(resolved=resolved, **node_counts(backend))

        with session.backend(Needs(docker=1)) as backend, stage(reporter, "collecting", len(prepared.tasks) * options.attempts):
            try:
                summary = collect(
                    session.client, prepared.tasks, make_policy(spec), spec, options.out, attempts=options.attempts, workers=options.workers,
                    config=config, limits=container_limits(options.containers), base_image=prepared.base, on_done=done, codex=codex, backend=backend,
                    registry=options.containers.registry,
                )  # fmt: skip
            except ClusterError as exc:
                raise OpError(str(exc)) from None
    return _summarize(options, summary, task_problems, prepared.problems)


def _summarize(options: CollectOptions, summary: CollectSummary, task_problems: list[str], image_problems: list[str]) -> CollectRunSummary:
    """The pool's counts in one pass (it is read as a stream, never held)."""
    from records.passk import pass_at_k_table

    pool = options.out / "trajectories.jsonl"
    errors: list[RecordError] = []
    statuses: Counter[str] = Counter()
    counted = {"trajectories": 0, "resolved": 0}

    def stream() -> Any:
        for trajectory in read_trajectories_lenient(pool, errors):
            counted["trajectories"] += 1
            counted["resolved"] += bool(trajectory.outcome and trajectory.outcome.resolved)
            statuses[trajectory.exit_status.value] += 1
            yield trajectory

    ks = tuple(k for k in PASS_AT if k <= options.attempts)
    table = pass_at_k_table(stream(), ks)
    return CollectRunSummary(
        pool, summary, counted["trajectories"], counted["resolved"], dict(statuses), table, ks, task_problems, image_problems,
        [str(e) for e in errors],
    )  # fmt: skip


# ---------------------------------------------------------------- replay


@dataclass
class ReplayRow:
    trajectory_id: str
    report: ReplayReport | None = None
    problem: str | None = None  # why it could not be replayed (no task, no image)

    @property
    def reproduced(self) -> bool:
        return self.report is not None and self.report.reproduced


@dataclass
class ReplaySummary:
    rows: list[ReplayRow]
    unreadable: list[str]
    task_problems: list[str]
    image_problems: list[str]

    @property
    def failures(self) -> int:
        return sum(not row.reproduced for row in self.rows)


def run_replay(options: ReplayOptions, reporter: Reporter = SILENT) -> ReplaySummary:
    """Re-execute each trajectory's recorded tool calls in a fresh container, in order; report
    the first divergence and (``verify``) grade the final patch."""
    from envs.images import task_image
    from harness.replay import replay

    wanted = set(options.ids or ())
    errors: list[RecordError] = []

    def chosen() -> Any:
        return (t for t in read_trajectories_lenient(options.pool, errors) if not wanted or t.id in wanted)

    task_ids = {t.task_id for t in chosen()}  # one pass for the images, one to replay: the pool is never held
    unreadable = [str(e) for e in errors]
    if not task_ids:
        raise OpError(f"no trajectories to replay in {options.pool}" + (f" with ids {', '.join(sorted(wanted))}" if wanted else ""))
    rows: list[ReplayRow] = []
    with container_session(options.containers, reporter, sweep=False) as session:
        all_tasks, task_problems = load_task_list(options.tasks)
        prepared = session.prepare([t for t in all_tasks if t.instance_id in task_ids], need_base=False)
        by_id = {t.instance_id: t for t in prepared.tasks}
        with stage(reporter, "replaying", None):
            for trajectory in chosen():
                task = by_id.get(trajectory.task_id or "")
                if task is None:
                    rows.append(ReplayRow(trajectory.id, problem=f"no task {trajectory.task_id}"))
                    continue
                try:
                    image = task_image(session.client, task, prepared.base)
                except (RuntimeError, ValueError) as exc:
                    rows.append(ReplayRow(trajectory.id, problem=str(exc)))
                    continue
                report = replay(
                    session.client, trajectory, task, image, limits=container_limits(options.containers), run_verifier=options.verify
                )
                rows.append(ReplayRow(trajectory.id, report))
                reporter.advance()
    return ReplaySummary(rows, unreadable, task_problems, prepared.problems)
