"""``relearn verify``: flags -> ``relearn.ops.verify.run_verify`` -> the verdicts table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.cluster import RayArg, RegistryArg, show_nodes
from relearn.cli.image_options import CpusArg, ImageMapArg, ImageTemplateArg, MemoryArg, PullArg, TasksArg
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, run_op, show_problems
from relearn.ops.containers import ContainerOptions
from relearn.ops.verify import VerifyOptions, VerifySummary, run_verify


def verify_command(
    patches: Annotated[
        Path,
        typer.Option(
            "--patches",
            "-p",
            exists=True,
            dir_okay=False,
            help="Predictions: JSONL/JSON rows of instance_id, model_patch (SWE-bench format).",
        ),
    ],
    tasks: TasksArg = VerifyOptions.tasks,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Verdicts JSONL (appended; finished pairs are skipped).")
    ] = VerifyOptions.output,
    workers: Annotated[int, typer.Option(min=1, help="Containers at once.")] = VerifyOptions.workers,
    timeout: Annotated[float, typer.Option(help="Seconds for one test run.")] = VerifyOptions.timeout,
    log_dir: Annotated[Path | None, typer.Option(help="Keep each full test log here.")] = None,
    image_map: ImageMapArg = ContainerOptions.image_map,
    image_template: ImageTemplateArg = ContainerOptions.image_template,
    pull: PullArg = ContainerOptions.pull,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
    ray: RayArg = ContainerOptions.ray,
    registry: RegistryArg = ContainerOptions.registry,
) -> None:
    """Grade patches in fresh containers with the tasks' tests (SWE-bench grading, Harbor reward files).

    Each task runs in the image --image-map or --image-template names, else the row's own (the mini suite's are built here). Resumable: a (task, patch) pair already in the output is not run again.
    """
    containers = ContainerOptions(image_map, image_template, pull, cpus, memory, ray, registry)
    options = VerifyOptions(patches, tasks, output, workers, timeout, log_dir, containers)
    summary = run_op(run_verify, options)
    render(summary)
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def render(summary: VerifySummary) -> None:
    show_problems("unreadable", summary.unreadable)
    show_problems("images", summary.image_problems)
    show_problems("errors", summary.errors)
    show_nodes(summary.per_node, "verdicts")
    show_problems("not gradable", [f"{v.instance_id} {v.patch_hash[:8]}: {v.error}" for v in summary.verdicts if v.error])
    table = Table(title=f"relearn verify -> {summary.output}")
    table.add_column("task", no_wrap=True)
    for column in ("patch", "resolved", "F2P", "P2P", "restored", "why not", "s"):
        table.add_column(column)
    for v in sorted(summary.verdicts, key=lambda v: v.instance_id):
        tests = v.tests or {}
        f2p, p2p = tests.get("FAIL_TO_PASS", {}), tests.get("PASS_TO_PASS", {})
        table.add_row(
            v.instance_id,
            v.patch_hash[:8] if v.patch_exists else "empty",
            "[green]yes[/green]" if v.resolved else "[red]no[/red]",
            f"{len(f2p.get('success', []))}/{len(f2p.get('success', [])) + len(f2p.get('failure', []))}",
            f"{len(p2p.get('success', []))}/{len(p2p.get('success', [])) + len(p2p.get('failure', []))}",
            ", ".join(v.restored_files),
            (v.error or "; ".join(v.disagreements))[:80] if not v.resolved else ("suspicious" if v.suspicious else ""),
            f"{v.durations_s.get('total', 0):.1f}",
        )
    out.print(table)
    out.print(
        f"{len(summary.verdicts)} verified, {summary.resolved} resolved, {summary.skipped} already verified (skipped), {len(summary.errors)} errors"
    )


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_command)
