"""Environment verbs: ``relearn envs build-base|build|audit|gc`` (and ``load``,
``check-image``, ``build-swebench`` from ``relearn.cli.envs_images``): flags -> the options of
``relearn.ops.envs`` -> its operation -> a table and an exit code. ``relearn verify`` is
``relearn.cli.verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.table import Table

from relearn.cli.cluster import RayArg
from relearn.cli.image_options import CpusArg, ImageMapArg, ImageTemplateArg, MemoryArg, PullArg, TasksArg
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, err, out, run_op, show_problems
from relearn.ops.containers import ContainerOptions
from relearn.ops.envs import (
    AuditOptions,
    BuildBaseOptions,
    BuildOptions,
    GcOptions,
    VerdictAuditOptions,
    run_audit,
    run_audit_verdicts,
    run_build,
    run_build_base,
    run_gc,
)

envs_app = typer.Typer(
    help="Task images and containers: build the offline base and task images, audit them, sweep orphans.", no_args_is_help=True
)
IdsArg = Annotated[list[str] | None, typer.Option("--id", help="Only these instance ids (repeatable).")]


@envs_app.command("build-base")
def build_base_command(force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = BuildBaseOptions.force) -> None:
    """Build the offline base image: debootstrap (minbase + python3, pytest, git, patch) and docker import.

    Cached by tag: the tag names the Debian suite and package list.
    """
    out.print(f"base image: {run_op(run_build_base, BuildBaseOptions(force)).image}")


@envs_app.command("build")
def build_command(
    tasks: TasksArg = BuildOptions.tasks,
    ids: IdsArg = None,
    leaky: Annotated[
        bool, typer.Option(help="Mini suite: also commit the fix into .git history (to exercise `envs audit`).")
    ] = BuildOptions.leaky,
) -> None:
    """Build the task images (the base image first, if a task needs it) and check that the others are on the engine."""
    summary = run_op(run_build, BuildOptions(tasks, ids or [], leaky))
    show_problems("unreadable tasks", summary.unreadable)
    show_problems("failed", summary.failures)
    table = Table(title="task images")
    table.add_column("task")
    table.add_column("image")
    for task, image in summary.images:
        table.add_row(task, image)
    out.print(table)
    raise typer.Exit(EXIT_PARTIAL if summary.failures else EXIT_OK)


VERDICT = {"exposed": "[red]EXPOSED[/red]", "clean": "[green]clean[/green]", "error": "[yellow]error[/yellow]"}


@envs_app.command("audit")
def audit_command(
    tasks: TasksArg = AuditOptions.tasks,
    ids: IdsArg = None,
    leaky: Annotated[bool, typer.Option(help="Mini suite: audit the deliberately leaky builds.")] = AuditOptions.leaky,
    verdicts: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Instead of images: list what the verifier refused, restored, neutralized, found contradictory or suspicious in these verdicts (`relearn verify -o`).",
        ),
    ] = None,
    image_map: ImageMapArg = ContainerOptions.image_map,
    image_template: ImageTemplateArg = ContainerOptions.image_template,
    pull: PullArg = ContainerOptions.pull,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            dir_okay=False,
            help="Append each task's audit to this JSON Lines file as it is made (instance_id, image, verdict, why; a task's latest line counts). `relearn masks --audit FILE` leaves the flagged tasks' trajectories out of the dataset.",
        ),
    ] = AuditOptions.output,
) -> None:
    """Flag task images whose .git exposes future commits or the fix itself. Exits 1 when any is flagged.

    With --verdicts FILE, the verdicts instead: every one the verifier did not simply grade (a refused patch, files put back to the base commit, an executable bit dropped, a report that contradicts the log, something suspicious). Exits 1 when any patch was refused, contradicted or suspicious.
    """
    if verdicts is not None:
        audit_verdicts(verdicts)
    containers = ContainerOptions(image_map=image_map, image_template=image_template, pull=pull, cpus=cpus, memory=memory)
    summary = run_op(run_audit, AuditOptions(tasks, ids or [], leaky, containers, output))
    show_problems("unreadable tasks", summary.unreadable)
    show_problems("images", summary.image_problems)
    table = Table(title="relearn envs audit")
    for column in ("task", "verdict", "why"):
        table.add_column(column)
    for audit in summary.audits:
        table.add_row(audit.instance_id, VERDICT[audit.verdict], audit.why)
    out.print(table)
    unavailable = f"; {summary.unavailable} not on this engine" if summary.unavailable else ""
    out.print(f"{summary.exposed} of {len(summary.audits)} task images expose their fix{unavailable}")
    if output is not None:
        out.print(f"audit: {output}", highlight=False)
    raise typer.Exit(EXIT_PARTIAL if summary.exposed or summary.unavailable else EXIT_OK)


def audit_verdicts(path: Path) -> NoReturn:
    summary = run_op(run_audit_verdicts, VerdictAuditOptions(path))
    table = Table(title=f"relearn envs audit --verdicts {path}")
    for column in ("task", "patch", "resolved", "what the verifier did"):
        table.add_column(column)
    for noted in summary.noted:
        resolved = "[green]yes[/green]" if noted.resolved else "[red]no[/red]"
        table.add_row(noted.instance_id, noted.patch_hash[:8], resolved, "\n".join(noted.notes))
    out.print(table)
    show_problems("unreadable verdicts", summary.unreadable)
    out.print(f"{summary.flagged} of {summary.verdicts} verdicts refused, contradicted or suspicious")
    raise typer.Exit(EXIT_PARTIAL if summary.flagged or summary.unreadable else EXIT_OK)


@envs_app.command("gc")
def gc_command(
    everything: Annotated[bool, typer.Option("--all", help="Remove every relearn container, not only orphans.")] = GcOptions.everything,
    ray: RayArg = GcOptions.ray,
) -> None:
    """Remove relearn's orphaned containers and codex-cli networks (found by label), e.g. after a crash.

    With --ray, sweep the engine of every node of the cluster (one pinned task per node), and say what each node removed or why it could not.
    """
    summary = run_op(run_gc, GcOptions(everything, ray))
    if ray is None:
        removed = summary.removed
        out.print(
            f"removed {len(removed)} container(s)"
            + (f": {', '.join(removed)}" if removed else "")
            + f" and {len(summary.networks)} network(s)"
        )
        raise typer.Exit(EXIT_OK)
    for node, names in summary.per_node.items():
        out.print(f"node {node[:12]}: removed {len(names)} container(s)" + (f": {', '.join(names)}" if names else ""))
    for node, why in summary.node_failures.items():
        err.print(f"node {node[:12]}: [red]could not sweep[/red]: {why}", highlight=False)
    raise typer.Exit(EXIT_PARTIAL if summary.node_failures else EXIT_OK)


def register(app: typer.Typer) -> None:
    from relearn.cli import envs_images

    envs_images.register(envs_app)
    app.add_typer(envs_app, name="envs")
