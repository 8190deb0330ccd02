"""Running a policy on tasks in containers (``relearn collect``, the pipeline's ``[pool.collect]``)
and re-executing recorded tool calls (``relearn replay``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.executor import ClusterError, Needs
from records.pools import RecordError, read_trajectories_lenient
from relearn.ops.containers import ContainerOptions, container_session, load_task_list, node_counts
from relearn.ops.outputs import POOL, check_jsonl_output, check_run_dir
from relearn.ops.reporting import SILENT, OpError, Reporter, stage

if TYPE_CHECKING:
    from harness.codex_cli.config import CodexCliConfig
    from harness.collect import CollectSummary
    from harness.replay import ReplayReport

AGENTS = ("builtin", "codex-cli")
PASS_AT = (1, 2, 5, 10)


@dataclass
class AgentOptions:
    """Who acts in the container: ``builtin`` (our Codex-style loop, any ``policy`` protocol)
    or ``codex-cli`` (the real Codex CLI, Responses API only), the builtin tool set's
    ``apply_patch`` semantics (codex | strict), codex-cli's ``reasoning_effort``, and whether the
    server is asked for the sampled token ids (vLLM's ``return_token_ids`` for chat,
    ``enable_response_messages`` for responses; servers that refuse unknown fields, such as
    api.openai.com, answer 400 to either)."""

    agent: str = "builtin"
    policy: str | None = None  # endpoint protocol: chat (the builtin default) | responses | anthropic
    apply_patch: str = "codex"
    reasoning_effort: str | None = "medium"
    token_ids: bool | None = None  # None: asked by the builtin agent, not by codex-cli

    def request_token_ids(self) -> bool:
        return self.token_ids if self.token_ids is not None else self.agent == "builtin"

    def resolve(self) -> tuple[str, CodexCliConfig | None]:
        """(endpoint protocol, Codex config or None); OpError naming the option that does not fit."""
        from harness.codex_cli.config import CodexCliConfig
        from harness.codex_cli.install import InstallError, installed
        from harness.tools.apply_patch import SEMANTICS

        if self.apply_patch not in SEMANTICS:
            raise OpError(f"--apply-patch must be one of {', '.join(SEMANTICS)}, not {self.apply_patch!r}")
        if self.agent not in AGENTS:
            raise OpError(f"--agent must be one of {', '.join(AGENTS)}, not {self.agent!r}")
        if self.agent == "builtin":
            return self.policy or "chat", None
        if self.policy not in (None, "responses"):
            raise OpError(f"--agent codex-cli speaks the Responses API: use --policy responses (got --policy {self.policy})")
        try:
            config = CodexCliConfig(install=installed(), reasoning_effort=self.reasoning_effort, request_token_ids=self.request_token_ids())
            return "responses", config
        except (InstallError, ValueError) as exc:
            raise OpError(str(exc)) from None


@dataclass
class CollectOptions:
    out: Path  # trajectories.jsonl, episodes/, verify-logs/
    model: str
    tasks: str = "mini"
    ids: list[str] | None = None
    agent: AgentOptions = field(default_factory=AgentOptions)
    base_url: str | None = None
    api_key_env: str | None = None
    checkpoint: str | None = None
    step: int | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None  # per model call
    attempts: int = 1
    workers: int = 1
    max_turns: int | None = 50
    max_tokens: int | None = None
    max_seconds: float | None = None
    max_cost: float | None = None  # USD per episode
    price_in: float = 0.0  # USD per million input tokens
    price_out: float = 0.0
    containers: ContainerOptions = field(default_factory=ContainerOptions)


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


def policy_spec(options: CollectOptions, protocol: str) -> Any:
    from harness.policies.base import PolicySpec

    sampling = {k: v for k, v in (("temperature", options.temperature), ("max_tokens", options.max_output_tokens)) if v is not None}
    return PolicySpec(
        kind=protocol,  # type: ignore[arg-type]
        model=options.model, base_url=options.base_url, api_key_env=options.api_key_env, sampling=sampling,
        price_in_per_mtok=options.price_in, price_out_per_mtok=options.price_out, checkpoint=options.checkpoint, step=options.step,
        request_token_ids=options.agent.request_token_ids(),
    )  # fmt: skip


def run_collect(options: CollectOptions, reporter: Reporter = SILENT) -> CollectRunSummary:
    """Every (task, attempt) not yet in the pool, each verified after its episode. Resumable
    by (task, policy, attempt)."""
    # The SDKs and swebench take seconds to import: only the verb that runs loads them.
    from harness.agent import AgentConfig
    from harness.budget import Budget
    from harness.collect import collect
    from harness.policies.make import make_policy

    if options.attempts < 1 or options.workers < 1:
        raise OpError("--attempts and --workers: at least 1")
    check_run_dir(options.out, ("trajectories.jsonl", "episodes", "verify-logs", "infra_errors.jsonl"), "relearn collect")
    check_jsonl_output(options.out / "trajectories.jsonl", POOL, flag="--out")
    protocol, codex = options.agent.resolve()
    spec = policy_spec(options, protocol)
    budget = Budget(
        max_turns=options.max_turns, max_tokens=options.max_tokens, max_seconds=options.max_seconds, max_cost_usd=options.max_cost
    )
    config = AgentConfig(budget=budget, apply_patch=options.agent.apply_patch)  # type: ignore[arg-type]
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
                    config=config, limits=options.containers.limits(), base_image=prepared.base, on_done=done, codex=codex, backend=backend,
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
class ReplayOptions:
    pool: Path
    tasks: str = "mini"
    ids: list[str] | None = None  # trajectory ids (default: every trajectory of the pool)
    verify: bool = True  # grade the replayed final patch
    containers: ContainerOptions = field(default_factory=ContainerOptions)


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
                report = replay(session.client, trajectory, task, image, limits=options.containers.limits(), run_verifier=options.verify)
                rows.append(ReplayRow(trajectory.id, report))
                reporter.advance()
    return ReplaySummary(rows, unreadable, task_problems, prepared.problems)
