"""The agent loop: one policy, one task, one container, one fixed budget.

system prompt + task → call the policy → run its tool calls in the container → append
the results → again, until the policy answers without a tool call (it submits) or the
budget says stop. Every message is recorded the moment it exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import docker

from envs.docker_backend import Container
from envs.tasks import Task
from harness.budget import Budget, Ledger
from harness.policies.base import ContextOverflow, Policy, PolicyError
from harness.recorder import EpisodeRecorder
from harness.tools.apply_patch import Semantics
from harness.tools.toolbox import Toolbox
from records.trajectory import ExitStatus, Message, Source, Trajectory, Usage

SCAFFOLD_VERSION = "relearn-codex-1"
SYSTEM_PROMPT = """You are a coding agent working in a software repository at {workdir}.
You can run shell commands with the `shell` tool and edit files with the `apply_patch` tool.
Investigate the repository, make the smallest correct change that resolves the task, and check it by running the relevant tests.
When you are done, reply with a short summary of the change and do not call any tool."""


@dataclass
class AgentConfig:
    budget: Budget = field(default_factory=Budget)
    system_prompt: str = SYSTEM_PROMPT
    tool_output_tokens: int = 10000
    command_timeout_ms: int = 120_000
    apply_patch: Semantics = "codex"  # the apply_patch tool's semantics (harness.tools.apply_patch)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_prompt(task: Task) -> str:
    return f"<task>\n{task.problem_statement.strip()}\n</task>\n\nThe repository is checked out at {task.workdir}."


def run_episode(
    task: Task,
    policy: Policy,
    container: Container,
    config: AgentConfig,
    header: Trajectory,
    recorder: EpisodeRecorder | None = None,
) -> Trajectory:
    """Run one episode; returns the trajectory with exit status and final patch (not
    yet verified: grading happens in a fresh container, see envs.verify)."""
    toolbox = Toolbox(
        container, task.workdir, config.tool_output_tokens, config.command_timeout_ms, apply_patch_semantics=config.apply_patch
    )
    trajectory = header.model_copy(deep=True)
    trajectory.started_at = trajectory.started_at or now()
    trajectory.tools = toolbox.schemas()

    def add(message: Message) -> None:
        trajectory.messages.append(message)
        if recorder is not None:
            recorder.message(message)

    if not trajectory.messages:
        add(Message(role="system", content=config.system_prompt.format(workdir=task.workdir), timestamp=now()))
        add(Message(role="user", content=task_prompt(task), timestamp=now()))
    base_commit = task.base_commit or container.sh("git rev-parse HEAD", workdir=task.workdir).stdout.strip()
    ledger = Ledger(config.budget)
    status: ExitStatus | None = None
    while status is None:
        status = ledger.exhausted()
        if status is not None:
            break
        try:
            turn = policy.complete(trajectory.messages, toolbox.schemas())
        except ContextOverflow:
            status = ExitStatus.context_overflow
            break
        except PolicyError as exc:
            _note(trajectory, policy_error=str(exc))
            status = ExitStatus.policy_error
            break
        ledger.charge(turn.message.usage)
        add(turn.message)
        if not turn.message.tool_calls:
            status = ExitStatus.submitted
            break
        try:
            for call in turn.message.tool_calls:
                result = toolbox.run(call)
                add(
                    Message(
                        role="tool",
                        tool_call_id=call.id,
                        name=call.function.name,
                        content=result.output,
                        metadata=result.metadata,
                        duration_ms=round(result.duration_ms, 3),
                        timestamp=now(),
                    )
                )
                ledger.format_errors = ledger.format_errors + 1 if result.format_error else 0
        except (docker.errors.DockerException, RuntimeError) as exc:
            _note(trajectory, env_error=str(exc))
            status = ExitStatus.env_error
    trajectory.exit_status = status
    try:
        trajectory.final_patch = container.diff(base_commit, repo=task.workdir)
    except (docker.errors.DockerException, RuntimeError) as exc:
        trajectory.final_patch = None
        _note(trajectory, final_patch_error=str(exc))
    trajectory.usage = _total_usage(trajectory.messages, ledger)
    trajectory.finished_at = now()
    _note(trajectory, ledger=ledger.to_dict(), budget=config.budget.to_dict())
    return trajectory


def _note(trajectory: Trajectory, **values: object) -> None:
    """Facts about the run (errors, what the budget spent) go under source.meta."""
    if trajectory.source is None:
        trajectory.source = Source(format="relearn", format_version=SCAFFOLD_VERSION)
    trajectory.source.meta = {**(trajectory.source.meta or {}), **values}


def _total_usage(messages: list[Message], ledger: Ledger) -> Usage:
    usage = Usage(input_tokens=0, output_tokens=0, cost_usd=0.0, api_calls=ledger.turns)
    for message in messages:
        if message.usage is None:
            continue
        usage.input_tokens = (usage.input_tokens or 0) + (message.usage.input_tokens or 0)
        usage.output_tokens = (usage.output_tokens or 0) + (message.usage.output_tokens or 0)
        usage.cost_usd = (usage.cost_usd or 0.0) + (message.usage.cost_usd or 0.0)
    usage.total_tokens = (usage.input_tokens or 0) + (usage.output_tokens or 0)
    return usage
