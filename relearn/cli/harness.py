"""Harness verbs: ``relearn collect`` and ``relearn replay``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envs import docker_backend
from envs.executor import ClusterError, Needs
from envs.images import task_image
from harness.budget import Budget
from harness.codex_cli.install import InstallError, installed
from records.pools import RecordError, read_trajectories_lenient
from relearn.cli.cluster import NodesColumn, RayArg, RegistryArg, prepare_tasks, ray_backend, show_nodes
from relearn.cli.envs import TasksArg, docker_client, load_task_list, terminate_cleanly
from relearn.cli.image_options import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY,
    CpusArg,
    ImageMapArg,
    ImageTemplateArg,
    MemoryArg,
    PullArg,
    image_choice,
    limits_from,
    prepare,
)
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems

if TYPE_CHECKING:
    from harness.codex_cli.config import CodexCliConfig

AGENTS = ("builtin", "codex-cli")
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


def check_apply_patch(semantics: str) -> None:
    from harness.tools.apply_patch import SEMANTICS

    if semantics not in SEMANTICS:
        err.print(f"[red]error:[/red] --apply-patch must be one of {', '.join(SEMANTICS)}, not {semantics!r}")
        raise typer.Exit(EXIT_USAGE)


def agent_options(agent: str, policy: str | None, reasoning_effort: str | None) -> tuple[str, CodexCliConfig | None]:
    """(endpoint protocol, Codex config or None) from the shared --agent options; exits
    with a usage error naming the option that does not fit."""
    from harness.codex_cli.config import CodexCliConfig

    if agent not in AGENTS:
        err.print(f"[red]error:[/red] --agent must be one of {', '.join(AGENTS)}, not {agent!r}")
        raise typer.Exit(EXIT_USAGE)
    if agent == "builtin":
        return policy or "chat", None
    if policy not in (None, "responses"):
        err.print(f"[red]error:[/red] --agent codex-cli speaks the Responses API: use --policy responses (got --policy {policy})")
        raise typer.Exit(EXIT_USAGE)
    try:
        return "responses", CodexCliConfig(install=installed(), reasoning_effort=reasoning_effort)
    except (InstallError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None


def collect_command(
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder: trajectories.jsonl, episodes/, verify-logs/.")],
    model: Annotated[str, typer.Option(help="Model name the endpoint serves.")],
    tasks: TasksArg = "mini",
    agent: AgentArg = "builtin",
    apply_patch: ApplyPatchArg = "codex",
    policy: Annotated[
        str | None,
        typer.Option(
            help="Endpoint protocol: chat (OpenAI-compatible, vLLM/SGLang; the builtin default) | responses (codex-cli's only one) | anthropic."
        ),
    ] = None,
    reasoning_effort: ReasoningEffortArg = "medium",
    base_url: Annotated[str | None, typer.Option(help="Endpoint URL, e.g. http://localhost:8000/v1.")] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="Environment variable holding the API key (default: OPENAI_API_KEY, or ANTHROPIC_API_KEY for anthropic)."),
    ] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint the endpoint serves (stamped on every trajectory).")] = None,
    step: Annotated[int | None, typer.Option(help="Training step of that checkpoint.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    max_output_tokens: Annotated[int | None, typer.Option(help="Per-call output token limit.")] = None,
    attempts: Annotated[int, typer.Option(help="Attempts per task.")] = 1,
    workers: Annotated[int, typer.Option(help="Episodes at once.")] = 1,
    max_turns: Annotated[int | None, typer.Option(help="Budget: model calls per episode.")] = 50,
    max_tokens: Annotated[int | None, typer.Option(help="Budget: input+output tokens per episode.")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="Budget: wall-clock seconds per episode.")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Budget: USD per episode.")] = None,
    price_in: Annotated[float, typer.Option(help="USD per million input tokens.")] = 0.0,
    price_out: Annotated[float, typer.Option(help="USD per million output tokens.")] = 0.0,
    ids: Annotated[list[str] | None, typer.Option("--id", help="Only these tasks (repeatable).")] = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = False,
    cpus: CpusArg = DEFAULT_CPUS,
    memory: MemoryArg = DEFAULT_MEMORY,
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
    # The SDKs and swebench take seconds to import: only the verb that runs loads them.
    from harness.agent import AgentConfig
    from harness.collect import collect
    from harness.policies.base import PolicySpec
    from harness.policies.make import make_policy
    from records.passk import pass_at_k_table

    policy, codex = agent_options(agent, policy, reasoning_effort)
    choice = image_choice(image_map, image_template)
    limits = limits_from(cpus, memory)
    client = docker_client()
    terminate_cleanly()
    # A run killed outright (SIGKILL, OOM) leaves its containers; sweep them first.
    orphans = docker_backend.gc(client)
    if orphans:
        err.print(f"[dim]removed {len(orphans)} orphaned container(s) of a killed run[/dim]")
    chosen = load_task_list(tasks, ids)
    sampling = {k: v for k, v in (("temperature", temperature), ("max_tokens", max_output_tokens)) if v is not None}
    spec = PolicySpec(
        kind=policy,  # type: ignore[arg-type]
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        sampling=sampling,
        price_in_per_mtok=price_in,
        price_out_per_mtok=price_out,
        checkpoint=checkpoint,
        step=step,
    )
    check_apply_patch(apply_patch)
    config = AgentConfig(
        budget=Budget(max_turns=max_turns, max_tokens=max_tokens, max_seconds=max_seconds, max_cost_usd=max_cost), apply_patch=apply_patch
    )  # type: ignore[arg-type]
    # The base image only when a task is built from it, or as the codex-cli relay.
    prepared = prepare_tasks(client, chosen, choice, pull=pull, need_base=codex is not None, registry=registry)
    chosen, base = prepared.tasks, prepared.base
    resolved = 0
    nodes = NodesColumn()
    progress = Progress(
        TextColumn("[bold]collecting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[resolved]} resolved"),
        TimeElapsedColumn(),
        nodes,
        console=err,
        transient=True,
    )
    with progress:
        bar = progress.add_task("collect", total=len(chosen) * attempts, resolved=0)

        def done(trajectory) -> None:  # noqa: ANN001
            nonlocal resolved
            resolved += bool(trajectory and trajectory.outcome and trajectory.outcome.resolved)
            progress.update(bar, advance=1, resolved=resolved)

        backend = ray_backend(ray, Needs(docker=1), nodes)
        try:
            summary = collect(
                client, chosen, make_policy(spec), spec, out_dir, attempts=attempts, workers=workers, config=config, limits=limits, base_image=base, on_done=done, codex=codex, backend=backend, registry=registry
            )  # fmt: skip
        except ClusterError as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(EXIT_USAGE) from None
        finally:
            if backend is not None:
                backend.close()
    show_problems("errors", summary.errors)
    show_nodes(summary.per_node, "episodes")
    errors: list[RecordError] = []
    everything = list(read_trajectories_lenient(out_dir / "trajectories.jsonl", errors))
    ks = tuple(k for k in (1, 2, 5, 10) if k <= attempts)
    table = Table(title=f"relearn collect -> {out_dir / 'trajectories.jsonl'}")
    table.add_column("task", no_wrap=True)
    for column in ("attempts", "resolved", *(f"pass@{k}" for k in ks)):
        table.add_column(column, justify="right")
    for task_id, row in pass_at_k_table(everything, ks).items():
        table.add_row(task_id, str(row["attempts"]), str(row["resolved"]), *(f"{row[f'pass@{k}']:.3f}" for k in ks))
    out.print(table)
    statuses: dict[str, int] = {}
    for trajectory in everything:
        statuses[trajectory.exit_status.value] = statuses.get(trajectory.exit_status.value, 0) + 1
    out.print(
        f"{len(summary.finished)} episodes run now, {summary.skipped} already done, {summary.restarted} restarted after a crash; "
        f"exit statuses: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.errors else EXIT_OK)


def replay_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", exists=True, dir_okay=False, help="Pool of trajectories.")],
    tasks: TasksArg = "mini",
    ids: Annotated[list[str] | None, typer.Option("--id", help="Only these trajectory ids (repeatable).")] = None,
    verify_patch: Annotated[bool, typer.Option("--verify/--no-verify", help="Verify the replayed final patch.")] = True,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = False,
    cpus: CpusArg = DEFAULT_CPUS,
    memory: MemoryArg = DEFAULT_MEMORY,
) -> None:
    """Re-execute recorded tool calls in fresh containers; report the first divergence and verify the final patch.

    Exits 1 when any trajectory does not reproduce.
    """
    from harness.replay import replay

    choice = image_choice(image_map, image_template)
    limits = limits_from(cpus, memory)
    client = docker_client()
    terminate_cleanly()
    all_tasks = load_task_list(tasks, None)
    errors: list[RecordError] = []
    trajectories = [t for t in read_trajectories_lenient(pool, errors) if not ids or t.id in ids]
    show_problems("unreadable records", [str(e) for e in errors])
    if not trajectories:
        err.print("[red]error:[/red] no trajectories to replay")
        raise typer.Exit(EXIT_USAGE)
    wanted = {t.task_id for t in trajectories}
    prepared = prepare(client, [t for t in all_tasks if t.instance_id in wanted], choice, pull=pull)
    by_id, base = {t.instance_id: t for t in prepared.tasks}, prepared.base
    table = Table(title=f"relearn replay {pool}")
    table.add_column("trajectory", no_wrap=True)
    for column in ("calls", "exact", "normalised", "first divergence", "patch", "resolved"):
        table.add_column(column)
    failures = 0
    for trajectory in trajectories:
        task = by_id.get(trajectory.task_id or "")
        if task is None:
            table.add_row(trajectory.id, "", "", "", f"no task {trajectory.task_id}", "")
            failures += 1
            continue
        try:
            image = task_image(client, task, base)
        except (RuntimeError, ValueError) as exc:
            table.add_row(trajectory.id, "", "", "", str(exc), "")
            failures += 1
            continue
        report = replay(client, trajectory, task, image, limits=limits, run_verifier=verify_patch)
        divergence = f"message {report.divergence.message_index} ({report.divergence.tool})" if report.divergence else "none"
        patch = {True: "same", False: "differs", None: "not recorded"}[report.patch_matches]
        verdict = "" if report.verdict is None else ("yes" if report.verdict.resolved else "no")
        table.add_row(trajectory.id, str(report.calls), str(report.exact), str(report.normalised), divergence, patch, verdict)
        failures += not report.reproduced
    out.print(table)
    raise typer.Exit(EXIT_PARTIAL if failures or errors else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_command)
    app.command("replay")(replay_command)
