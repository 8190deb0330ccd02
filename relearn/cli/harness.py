"""Harness verbs: ``relearn collect`` and ``relearn replay``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.cluster import RayArg, RegistryArg, show_nodes
from relearn.cli.image_options import CpusArg, ImageMapArg, ImageTemplateArg, MemoryArg, PullArg, TasksArg
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, run_op, show_problems
from relearn.ops.collect import AgentOptions, CollectOptions, ReplayOptions, run_collect, run_replay
from relearn.ops.containers import ContainerOptions

ApplyPatchArg = Annotated[
    str,
    typer.Option(
        "--apply-patch",
        help="The builtin tool set's apply_patch semantics: codex (Codex's own: an added file or a move overwrites what is there, and a failing operation keeps the ones before it) or strict (refuse those overwrites, and change nothing when any operation fails). Recorded with every episode; runs that differ are not compared.",
    ),
]
AgentArg = Annotated[
    str,
    typer.Option(
        "--agent",
        help="builtin: our Codex-style loop | codex-cli: the real Codex CLI in the container, talking to the endpoint through the relearn gateway (needs a Responses endpoint).",
    ),
]
ReasoningEffortArg = Annotated[str | None, typer.Option(help="codex-cli: model_reasoning_effort (low | medium | high | xhigh).")]


TokenIdsArg = Annotated[
    bool | None,
    typer.Option(
        "--token-ids/--no-token-ids",
        help="Ask the server for the sampled token ids (vLLM: return_token_ids for chat, enable_response_messages for responses), which relearn masks trains on. Default: asked by the builtin agent, not by codex-cli. --no-token-ids for servers that refuse fields they do not know, such as api.openai.com.",
    ),
]


def _agent(agent: str, policy: str | None, apply_patch: str, reasoning_effort: str | None, token_ids: bool | None) -> AgentOptions:
    return AgentOptions(agent=agent, policy=policy, apply_patch=apply_patch, reasoning_effort=reasoning_effort, token_ids=token_ids)


def collect_command(
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder: trajectories.jsonl, episodes/, verify-logs/.")],
    model: Annotated[str, typer.Option(help="Model name the endpoint serves.")],
    tasks: TasksArg = CollectOptions.tasks,
    agent: AgentArg = AgentOptions.agent,
    apply_patch: ApplyPatchArg = AgentOptions.apply_patch,
    policy: Annotated[
        str | None,
        typer.Option(
            help="Endpoint protocol: chat (OpenAI-compatible, vLLM/SGLang; the builtin default) | responses (codex-cli's only one) | anthropic."
        ),
    ] = None,
    reasoning_effort: ReasoningEffortArg = AgentOptions.reasoning_effort,
    token_ids: TokenIdsArg = AgentOptions.token_ids,
    base_url: Annotated[str | None, typer.Option(help="Endpoint URL, e.g. http://localhost:8000/v1.")] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="Environment variable holding the API key (default: OPENAI_API_KEY, or ANTHROPIC_API_KEY for anthropic)."),
    ] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint the endpoint serves (stamped on every trajectory).")] = None,
    step: Annotated[int | None, typer.Option(help="Training step of that checkpoint.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    max_output_tokens: Annotated[int | None, typer.Option(help="Per-call output token limit.")] = None,
    attempts: Annotated[int, typer.Option(min=1, help="Attempts per task.")] = CollectOptions.attempts,
    workers: Annotated[int, typer.Option(min=1, help="Episodes at once.")] = CollectOptions.workers,
    max_turns: Annotated[int | None, typer.Option(help="Budget: model calls per episode.")] = CollectOptions.max_turns,
    max_tokens: Annotated[int | None, typer.Option(help="Budget: input+output tokens per episode.")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="Budget: wall-clock seconds per episode.")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Budget: USD per episode.")] = None,
    price_in: Annotated[float, typer.Option(help="USD per million input tokens.")] = CollectOptions.price_in,
    price_out: Annotated[float, typer.Option(help="USD per million output tokens.")] = CollectOptions.price_out,
    ids: Annotated[list[str] | None, typer.Option("--id", help="Only these tasks (repeatable).")] = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = ContainerOptions.pull,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
    ray: RayArg = None,
    registry: RegistryArg = None,
) -> None:
    """Run a policy on tasks × attempts in containers, verify each episode, and write a pool.

    Resumable by (task, policy, attempt): rerun the same command after a crash and only
    the unfinished episodes run.

    With --ray, each episode is a Ray task on a node offering the docker resource (its
    image is built or loaded there, once per node, or pulled from --registry); a node lost
    mid-episode is retried on another, and only this process writes the pool.
    """
    options = CollectOptions(
        out=out_dir, model=model, tasks=tasks, ids=ids, agent=_agent(agent, policy, apply_patch, reasoning_effort, token_ids), base_url=base_url,
        api_key_env=api_key_env, checkpoint=checkpoint, step=step, temperature=temperature, max_output_tokens=max_output_tokens,
        attempts=attempts, workers=workers, max_turns=max_turns, max_tokens=max_tokens, max_seconds=max_seconds, max_cost=max_cost,
        price_in=price_in, price_out=price_out, containers=ContainerOptions(image_map, image_template, pull, cpus, memory, ray, registry),
    )  # fmt: skip
    summary = run_op(run_collect, options)
    show_problems("unreadable tasks", summary.task_problems)
    show_problems("images", summary.image_problems)
    show_problems("errors", summary.collect.errors)
    show_problems("unreadable records", summary.unreadable)
    show_nodes(summary.collect.per_node, "episodes")
    table = Table(title=f"relearn collect -> {summary.pool}")
    table.add_column("task", no_wrap=True)
    for column in ("attempts", "resolved", *(f"pass@{k}" for k in summary.ks)):
        table.add_column(column, justify="right")
    for task_id, row in summary.pass_at_k.items():
        table.add_row(task_id, str(row["attempts"]), str(row["resolved"]), *(f"{row[f'pass@{k}']:.3f}" for k in summary.ks))
    out.print(table)
    out.print(
        f"{len(summary.collect.finished)} episodes run now, {summary.collect.skipped} already done, {summary.collect.restarted} restarted after a crash; "
        f"exit statuses: {', '.join(f'{k} {v}' for k, v in sorted(summary.exit_status.items()))}"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def replay_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", exists=True, dir_okay=False, help="Pool of trajectories.")],
    tasks: TasksArg = ReplayOptions.tasks,
    ids: Annotated[list[str] | None, typer.Option("--id", help="Only these trajectory ids (repeatable).")] = None,
    verify_patch: Annotated[bool, typer.Option("--verify/--no-verify", help="Verify the replayed final patch.")] = ReplayOptions.verify,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = ContainerOptions.pull,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
) -> None:
    """Re-execute recorded tool calls in fresh containers; report the first divergence and verify the final patch.

    Exits 1 when any trajectory does not reproduce.
    """
    options = ReplayOptions(pool, tasks, ids, verify_patch, ContainerOptions(image_map, image_template, pull, cpus, memory))
    summary = run_op(run_replay, options)
    show_problems("unreadable records", summary.unreadable)
    show_problems("unreadable tasks", summary.task_problems)
    show_problems("images", summary.image_problems)
    table = Table(title=f"relearn replay {pool}")
    table.add_column("trajectory", no_wrap=True)
    for column in ("calls", "exact", "normalised", "first divergence", "patch", "resolved"):
        table.add_column(column)
    for row in summary.rows:
        report = row.report
        if report is None:
            table.add_row(row.trajectory_id, "", "", "", row.problem or "", "")
            continue
        divergence = f"message {report.divergence.message_index} ({report.divergence.tool})" if report.divergence else "none"
        patch = {True: "same", False: "differs", None: "not recorded"}[report.patch_matches]
        verdict = "" if report.verdict is None else ("yes" if report.verdict.resolved else "no")
        table.add_row(row.trajectory_id, str(report.calls), str(report.exact), str(report.normalised), divergence, patch, verdict)
    out.print(table)
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.unreadable else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_command)
    app.command("replay")(replay_command)
