"""Running a policy on tasks in containers (``relearn collect``, the pipeline's ``[pool.collect]``)
and re-executing recorded tool calls (``relearn replay``)."""

from __future__ import annotations

import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from envs.executor import ClusterError, Needs
from harness.tools.apply_patch import Semantics
from records.pools import RecordError, read_trajectories_lenient
from relearn.ops.containers import ContainerOptions, container_session, load_task_list, node_counts, tasks_option
from relearn.ops.outputs import POOL, check_jsonl_output, check_run_dir
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.options import nested, option

if TYPE_CHECKING:
    from harness.budget import Budget
    from harness.codex_cli.config import CodexCliConfig
    from harness.collect import CollectSummary
    from harness.policies.base import PolicySpec
    from harness.replay import ReplayReport

Agent = Literal["builtin", "codex-cli"]
AGENTS = typing.get_args(Agent)
PASS_AT = (1, 2, 5, 10)


@dataclass
class AgentOptions:
    """Who acts in the container, with which tools, and what it asks the endpoint for
    (``relearn collect`` and ``relearn eval run``)."""

    agent: Agent = option(
        "builtin",
        "builtin: our Codex-style loop | codex-cli: the real Codex CLI in the container, talking to the endpoint through the relearn gateway (needs a Responses endpoint).",
    )
    policy: Literal["chat", "responses", "anthropic"] | None = option(
        None,
        "Endpoint protocol: chat (OpenAI-compatible, vLLM/SGLang; the builtin default), responses (codex-cli's only one) or anthropic.",
    )
    apply_patch: Semantics = option(
        "codex",
        "The builtin tool set's apply_patch semantics: codex (Codex's own: an added file or a move overwrites what is there, and a failing operation keeps the ones before it) or strict (refuse those overwrites, and change nothing when any operation fails). Recorded with every episode; runs that differ are not compared.",
    )
    reasoning_effort: str | None = option("medium", "codex-cli: model_reasoning_effort (low | medium | high | xhigh).", metavar="LEVEL")
    token_ids: bool | None = option(
        None,
        "Ask the server for the sampled token ids (vLLM: return_token_ids for chat, enable_response_messages for responses), which relearn masks trains on. Default: asked by the builtin agent, not by codex-cli. --no-token-ids for servers that refuse fields they do not know, such as api.openai.com.",
    )

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
class EndpointOptions:
    """The policy's endpoint, what each call asks of it and what it costs (``relearn collect``
    and ``relearn eval run``; the pipeline's eval serves its model itself and takes only
    ``temperature`` of these)."""

    base_url: str | None = option(None, "Endpoint URL, e.g. http://localhost:8000/v1.", metavar="URL")
    api_key_env: str | None = option(
        None, "Environment variable holding the API key (default: OPENAI_API_KEY, or ANTHROPIC_API_KEY for anthropic).", metavar="NAME"
    )
    temperature: float | None = option(None, "Sampling temperature.")
    max_output_tokens: int | None = option(None, "Per-call output token limit.", ge=1)
    price_in: float = option(0.0, "USD per million input tokens.", ge=0)
    price_out: float = option(0.0, "USD per million output tokens.", ge=0)
    checkpoint: str | None = option(None, "Checkpoint the endpoint serves (stamped on every trajectory).", metavar="NAME")

    def spec(self, model: str, protocol: str, agent: AgentOptions, step: int | None = None) -> PolicySpec:
        """The policy client's spec: ``protocol`` as ``agent.resolve()`` chose it, ``step`` the checkpoint's training step."""
        from harness.policies.base import PolicySpec

        sampling = {k: v for k, v in (("temperature", self.temperature), ("max_tokens", self.max_output_tokens)) if v is not None}
        return PolicySpec(
            kind=protocol,  # type: ignore[arg-type]
            model=model, base_url=self.base_url, api_key_env=self.api_key_env, sampling=sampling, price_in_per_mtok=self.price_in,
            price_out_per_mtok=self.price_out, checkpoint=self.checkpoint, step=step, request_token_ids=agent.request_token_ids(),
        )  # fmt: skip


@dataclass
class BudgetOptions:
    """What one episode may spend (``harness.budget.Budget``); an eval instance is one episode."""

    max_turns: int | None = option(50, "Budget: model calls per episode.")
    max_tokens: int | None = option(None, "Budget: input+output tokens per episode.")
    max_seconds: float | None = option(None, "Budget: wall-clock seconds per episode.")
    max_cost: float | None = option(None, "Budget: USD per episode.", gt=0)

    def as_budget(self) -> Budget:
        from harness.budget import Budget

        return Budget(max_turns=self.max_turns, max_tokens=self.max_tokens, max_seconds=self.max_seconds, max_cost_usd=self.max_cost)


@dataclass
class CollectOptions:
    """Run a policy on tasks × attempts in containers, verify each episode, and write a pool.

    Resumable by (task, policy, attempt): rerun the same command after a crash and only the unfinished episodes run.

    With --ray, each episode is a Ray task on a node offering the docker resource (its image is built or loaded there, once per node, or pulled from --registry); a node lost mid-episode is retried on another, and only this process writes the pool.
    """

    out: Path = option(
        help="Output folder: trajectories.jsonl, episodes/, verify-logs/.", flags=("--out",), metavar="DIR",
        front="cli", why="the pipeline names its pool folder",
    )  # fmt: skip
    model: str = option(help="Model name the endpoint serves.", metavar="NAME")
    tasks: str = tasks_option()
    ids: list[str] | None = option(None, "Only these tasks (repeatable).", flags=("--id",), metavar="ID")
    agent: AgentOptions = nested(AgentOptions)
    endpoint: EndpointOptions = nested(EndpointOptions)
    step: int | None = option(None, "Training step of that checkpoint.")
    attempts: int = option(1, "Attempts per task.", ge=1)
    workers: int = option(1, "Episodes at once.", ge=1)
    budget: BudgetOptions = nested(BudgetOptions)
    containers: ContainerOptions = nested(ContainerOptions)


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
    protocol, codex = options.agent.resolve()
    spec = options.endpoint.spec(options.model, protocol, options.agent, options.step)
    config = AgentConfig(budget=options.budget.as_budget(), apply_patch=options.agent.apply_patch)  # type: ignore[arg-type]
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
    """Re-execute recorded tool calls in fresh containers; report the first divergence and verify the final patch.

    Exits 1 when any trajectory does not reproduce.
    """

    pool: Path = option(help="Pool of trajectories.", argument=True, metavar="POOL", exists="file")
    tasks: str = tasks_option()
    ids: list[str] | None = option(None, "Only these trajectory ids (repeatable).", flags=("--id",), metavar="ID")
    verify: bool = option(True, "Verify the replayed final patch.")
    containers: ContainerOptions = nested(ContainerOptions)


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
