"""Environment verbs: ``relearn envs build-base|build|audit|gc`` (and ``load``,
``check-image``, ``build-swebench`` from ``relearn.cli.envs_images``) and ``relearn verify``."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envs import docker_backend
from envs.audit import audit
from envs.executor import Needs, RayBackend
from envs.images import base_if_needed, build_base, task_image
from envs.tasks import Task, load_tasks
from records.pools import iter_lines
from relearn.cli.cluster import NodesColumn, RayArg, RegistryArg, prepare_tasks, ray_backend, show_nodes
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

MINI_SUITE = Path(__file__).resolve().parents[2] / "envs" / "mini_tasks"

envs_app = typer.Typer(
    help="Task images and containers: build the offline base and task images, audit them, sweep orphans.", no_args_is_help=True
)


def _tasks_path(value: str) -> Path:
    return MINI_SUITE if value == "mini" else Path(value)


def load_task_list(tasks_arg: str, ids: list[str] | None) -> list[Task]:
    tasks, errors = load_tasks(_tasks_path(tasks_arg))
    show_problems("unreadable tasks", [str(e) for e in errors])
    if ids:
        missing = sorted(set(ids) - {t.instance_id for t in tasks})
        if missing:
            err.print(f"[red]error:[/red] no such task: {', '.join(missing)}")
            raise typer.Exit(EXIT_USAGE)
        tasks = [t for t in tasks if t.instance_id in ids]
    if not tasks:
        err.print(f"[red]error:[/red] no tasks in {tasks_arg}")
        raise typer.Exit(EXIT_USAGE)
    return tasks


def docker_client():  # noqa: ANN202
    try:
        return docker_backend.client_from_env()
    except RuntimeError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None


def terminate_cleanly() -> None:
    """SIGTERM unwinds like Ctrl-C, so every `with Container` removes its container."""

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@envs_app.command("build-base")
def build_base_command(force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = False) -> None:
    """Build the offline base image: debootstrap (minbase + python3, pytest, git, patch) and docker import.

    Cached by tag: the tag names the Debian suite and package list.
    """
    tag = build_base(docker_client(), force=force, log=lambda m: err.print(f"[dim]{m}[/dim]"))
    out.print(f"base image: {tag}")


TasksArg = Annotated[
    str, typer.Option("--tasks", "-t", help="Task file (.jsonl/.json/.parquet), task folder(s), or `mini` for the bundled suite.")
]
IdsArg = Annotated[list[str] | None, typer.Option("--id", help="Only these instance ids (repeatable).")]


@envs_app.command("build")
def build_command(
    tasks: TasksArg = "mini",
    ids: IdsArg = None,
    leaky: Annotated[bool, typer.Option(help="Mini suite: also commit the fix into .git history (to exercise `envs audit`).")] = False,
) -> None:
    """Build the task images (the base image first, if a task needs it) and check that the others are on the engine."""
    client = docker_client()
    chosen = load_task_list(tasks, ids)
    base = base_if_needed(client, chosen, log=lambda m: err.print(f"[dim]{m}[/dim]"))
    table = Table(title="task images")
    table.add_column("task")
    table.add_column("image")
    failures = []
    for task in chosen:
        try:
            image = task_image(client, task, base, leaky=leaky)
            table.add_row(task.instance_id, image)
        except (RuntimeError, ValueError) as exc:
            failures.append(f"{task.instance_id}: {exc}")
    show_problems("failed", failures)
    out.print(table)
    raise typer.Exit(EXIT_PARTIAL if failures else EXIT_OK)


@envs_app.command("audit")
def audit_command(
    tasks: TasksArg = "mini",
    ids: IdsArg = None,
    leaky: Annotated[bool, typer.Option(help="Mini suite: audit the deliberately leaky builds.")] = False,
    verdicts: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Instead of images: list what the verifier refused, restored, neutralized, found contradictory or suspicious in these verdicts (`relearn verify -o`).",
        ),
    ] = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = False,
    cpus: CpusArg = DEFAULT_CPUS,
    memory: MemoryArg = DEFAULT_MEMORY,
) -> None:
    """Flag task images whose .git exposes future commits or the fix itself. Exits 1 when any is flagged.

    With --verdicts FILE, the verdicts instead: every one the verifier did not simply grade (a refused patch, files put back to the base commit, an executable bit dropped, a report that contradicts the log, something suspicious). Exits 1 when any patch was refused, contradicted or suspicious.
    """
    if verdicts is not None:
        audit_verdicts(verdicts)
        return
    choice = image_choice(image_map, image_template)
    limits = limits_from(cpus, memory)
    client = docker_client()
    terminate_cleanly()
    prepared = prepare(client, load_task_list(tasks, ids), choice, pull=pull)
    chosen, base = prepared.tasks, prepared.base
    table = Table(title="relearn envs audit")
    for column in ("task", "verdict", "why"):
        table.add_column(column)
    flagged = unavailable = 0
    for task in chosen:
        try:
            image = task_image(client, task, base, leaky=leaky)
        except (RuntimeError, ValueError) as exc:
            table.add_row(task.instance_id, "[yellow]error[/yellow]", str(exc))
            unavailable += 1
            continue
        report = audit(client, task, image, limits=limits)
        flagged += report.flagged
        verdict = "[red]EXPOSED[/red]" if report.flagged else ("[yellow]error[/yellow]" if report.error else "[green]clean[/green]")
        table.add_row(task.instance_id, verdict, "; ".join(report.reasons()) or (report.error or ""))
    out.print(table)
    out.print(f"{flagged} of {len(chosen)} task images expose their fix" + (f"; {unavailable} not on this engine" if unavailable else ""))
    raise typer.Exit(EXIT_PARTIAL if flagged or unavailable else EXIT_OK)


def audit_verdicts(path: Path) -> None:
    from envs.verify import Verdict

    table = Table(title=f"relearn envs audit --verdicts {path}")
    for column in ("task", "patch", "resolved", "what the verifier did"):
        table.add_column(column)
    problems: list[str] = []
    flagged = total = 0
    for number, text in iter_lines(path):
        try:
            verdict = Verdict.model_validate_json(text)
        except ValueError as exc:
            problems.append(f"{path}:{number}: not a verdict: {str(exc).splitlines()[0]}")
            continue
        total += 1
        notes = [f"refused: {r}" for r in verdict.refused] + [f"restored: {f}" for f in verdict.restored_files]
        notes += [f"neutralized: {n}" for n in verdict.neutralized] + [f"disagreement: {d}" for d in verdict.disagreements]
        notes += [f"suspicious: {s}" for s in verdict.suspicious]
        if not notes:
            continue
        flagged += bool(verdict.refused or verdict.disagreements or verdict.suspicious)
        table.add_row(
            verdict.instance_id, verdict.patch_hash[:8], "[green]yes[/green]" if verdict.resolved else "[red]no[/red]", "\n".join(notes)
        )
    out.print(table)
    show_problems("unreadable verdicts", problems)
    out.print(f"{flagged} of {total} verdicts refused, contradicted or suspicious")
    raise typer.Exit(EXIT_PARTIAL if flagged or problems else EXIT_OK)


@envs_app.command("gc")
def gc_command(
    everything: Annotated[bool, typer.Option("--all", help="Remove every relearn container, not only orphans.")] = False, ray: RayArg = None
) -> None:
    """Remove relearn's orphaned containers and codex-cli networks (found by label), e.g. after a crash.

    With --ray, sweep the engine of every node of the cluster (one pinned task per node),
    and say what each node removed or why it could not.
    """
    from harness.codex_cli.network import sweep_networks

    backend = ray_backend(ray, Needs())
    if isinstance(backend, RayBackend):
        try:
            answers = backend.on_every_node(lambda: docker_backend.gc(docker_backend.client_from_env(), everything=everything))
        finally:
            backend.close()
        for node, answer in sorted(answers.items()):
            if isinstance(answer, BaseException):
                err.print(f"node {node[:12]}: [red]could not sweep[/red]: {answer}")
            else:
                out.print(f"node {node[:12]}: removed {len(answer)} container(s)" + (f": {', '.join(answer)}" if answer else ""))
        raise typer.Exit(EXIT_PARTIAL if any(isinstance(a, BaseException) for a in answers.values()) else EXIT_OK)
    client = docker_client()
    removed = docker_backend.gc(client, everything=everything)
    networks = sweep_networks(client, everything=everything)
    out.print(f"removed {len(removed)} container(s)" + (f": {', '.join(removed)}" if removed else "") + f" and {len(networks)} network(s)")


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
    tasks: TasksArg = "mini",
    output: Annotated[Path, typer.Option("-o", "--output", help="Verdicts JSONL (appended; finished pairs are skipped).")] = Path(
        "verdicts.jsonl"
    ),
    workers: Annotated[int, typer.Option(help="Containers at once.")] = 1,
    timeout: Annotated[float, typer.Option(help="Seconds for one test run.")] = 1800.0,
    log_dir: Annotated[Path | None, typer.Option(help="Keep each full test log here.")] = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = False,
    cpus: CpusArg = DEFAULT_CPUS,
    memory: MemoryArg = DEFAULT_MEMORY,
    ray: RayArg = None,
    registry: RegistryArg = None,
) -> None:
    """Grade patches in fresh containers with the tasks' tests (SWE-bench grading, Harbor reward files).

    Each task runs in the image --image-map or --image-template names, else the row's own
    (the mini suite's are built here). Resumable: a (task, patch) pair already in the output
    is not run again.
    """
    choice = image_choice(image_map, image_template)
    limits = limits_from(cpus, memory)
    client = docker_client()
    terminate_cleanly()
    task_list = load_task_list(tasks, None)
    from envs.batch import load_predictions, verify_batch  # swebench: seconds to import, only this verb needs it

    predictions, errors = load_predictions(patches)
    show_problems("unreadable predictions", [str(e) for e in errors])
    if not predictions:
        err.print(f"[red]error:[/red] no predictions in {patches}")
        raise typer.Exit(EXIT_USAGE)
    wanted = {p.instance_id for p in predictions}
    prepared = prepare_tasks(
        client, [t for t in task_list if t.instance_id in wanted], choice, pull=pull, need_base=False, registry=registry
    )
    routed = {t.instance_id: t for t in task_list} | {t.instance_id: t for t in prepared.tasks}
    nodes = NodesColumn()
    progress = Progress(
        TextColumn("[bold]verifying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), nodes, console=err, transient=True
    )
    with progress:
        bar = progress.add_task("verify", total=len(predictions))
        backend = ray_backend(ray, Needs(docker=1), nodes)
        try:
            summary = verify_batch(
                client,
                routed,
                predictions,
                output,
                workers=workers,
                timeout_s=timeout,
                log_dir=log_dir,
                limits=limits,
                base_image=prepared.base,
                on_done=lambda _v: progress.advance(bar),
                backend=backend,
                registry=registry,
            )
        finally:
            if backend is not None:
                backend.close()
    show_problems("errors", summary.errors)
    show_nodes(summary.per_node, "verdicts")
    show_problems("not gradable", [f"{v.instance_id} {v.patch_hash[:8]}: {v.error}" for v in summary.verdicts if v.error])
    table = Table(title=f"relearn verify -> {output}")
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
    resolved = sum(v.resolved for v in summary.verdicts)
    out.print(
        f"{len(summary.verdicts)} verified, {resolved} resolved, {summary.skipped} already verified (skipped), {len(summary.errors)} errors"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.errors or errors or prepared.problems else EXIT_OK)


def register(app: typer.Typer) -> None:
    from relearn.cli import envs_images

    envs_images.register(envs_app)
    app.add_typer(envs_app, name="envs")
    app.command("verify")(verify_command)
