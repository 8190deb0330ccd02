"""``relearn envs load|check-image|build-swebench``: getting SWE-bench instance images onto
an engine without a registry, and checking that an image keeps the contract."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from envs.image_choice import instance_key, machine_arch
from envs.images import image_exists
from envs.registry import image_archives, load_archive
from envs.swebench_build import BuildFailed, build_instance_image, download_command, requirements_text, source_repository
from envs.swebench_specs import DEBIAN_PYTHON, InstallSpec, Unsupported, install_spec
from envs.tasks import Task
from relearn.cli.envs import IdsArg, TasksArg, docker_client, load_task_list, terminate_cleanly
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


def load_command(
    path: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            exists=True,
            help="A folder of image tarballs (docker save: .tar, .tar.gz, .tgz, .tar.xz, .tar.zst), or one tarball.",
        ),
    ],
    tasks: Annotated[
        str | None,
        typer.Option("--tasks", "-t", help="Then say which of these tasks have their image (after --image-map/--image-template)."),
    ] = None,
    ids: IdsArg = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
) -> None:
    """Load image tarballs into the engine (docker load), e.g. SWE-bench images saved on a machine with a registry."""
    choice = image_choice(image_map, image_template)
    client = docker_client()
    try:
        archives = image_archives(path)
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    if not archives:
        err.print(
            f"[red]error:[/red] no image tarballs in {path} (looked for {', '.join(('.tar', '.tar.gz', '.tgz', '.tar.xz', '.tar.zst'))})"
        )
        raise typer.Exit(EXIT_USAGE)
    table = Table(title=f"relearn envs load {path}")
    for column in ("tarball", "images", "s"):
        table.add_column(column)
    failures: list[str] = []
    for archive in archives:
        started = time.monotonic()
        err.print(f"[dim]docker load < {archive.name}[/dim]")
        try:
            names = load_archive(client, archive)
        except Exception as exc:  # the engine's answer to a bad tarball, a full disk: name the file, go on
            failures.append(f"{archive}: {exc}")
            continue
        table.add_row(archive.name, "\n".join(names), f"{time.monotonic() - started:.1f}")
    out.print(table)
    show_problems("not loaded", failures)
    missing: list[str] = []
    if tasks is not None:
        routed = choice.route(load_task_list(tasks, ids))
        for task in routed:
            if task.image and not image_exists(client, task.image):
                missing.append(f"{task.instance_id}: {task.image}")
        show_problems("tasks whose image is still not on the engine", missing)
        out.print(f"{len(routed) - len(missing)} of {len(routed)} tasks have their image")
    raise typer.Exit(EXIT_PARTIAL if failures or missing else EXIT_OK)


def check_image_command(
    image: Annotated[
        str | None,
        typer.Argument(
            metavar="[IMAGE]", help="The image to check (default: each selected task's own, after --image-map/--image-template)."
        ),
    ] = None,
    tasks: TasksArg = "mini",
    ids: IdsArg = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = False,
    cpus: CpusArg = DEFAULT_CPUS,
    memory: MemoryArg = DEFAULT_MEMORY,
) -> None:
    """Check an image against the contract a task needs, offline; list what is missing.

    Started without network: the repository at the work directory with the base commit in its history, the eval script's environment lines (`conda activate testbed`), the test command's interpreter and runner, the test files importing (README, "The image contract"). Exits 1 when a check fails.
    """
    from envs.contract import check_image
    from envs.images import task_image
    from envs.verify import mini_eval_script

    choice = image_choice(image_map, image_template)
    limits = limits_from(cpus, memory)
    chosen = load_task_list(tasks, ids)
    if image is not None and len(chosen) != 1:
        err.print(f"[red]error:[/red] IMAGE is checked against one task: pick it with --id ({len(chosen)} selected)")
        raise typer.Exit(EXIT_USAGE)
    client = docker_client()
    terminate_cleanly()
    if image is not None:
        chosen = [chosen[0].model_copy(update={"image": image, "image_source": "the command line"})]
    prepared = prepare(client, chosen, choice, pull=pull)
    failed = 0
    for task in prepared.tasks:
        try:
            name = task_image(client, task, prepared.base)
        except (RuntimeError, ValueError) as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            failed += 1
            continue
        script = task.eval_script or mini_eval_script(task, task.base_commit or "HEAD")
        report = check_image(client, task, name, script, limits=limits)
        table = Table(title=f"{task.instance_id}: {name}")
        for column in ("check", "result", "detail"):
            table.add_column(column)
        for check in report.checks:
            mark = "[green]ok[/green]" if check.ok else ("[red]MISSING[/red]" if check.required else "[yellow]warning[/yellow]")
            table.add_row(check.name, mark, check.detail)
        out.print(table)
        if report.ok:
            out.print(f"{task.instance_id}: {name} keeps the contract")
        else:
            failed += 1
            out.print(f"{task.instance_id}: {name} does not keep the contract; missing:")
            for line in report.missing():
                out.print(f"  - {line}", markup=False, highlight=False)
    raise typer.Exit(EXIT_PARTIAL if failed or prepared.problems else EXIT_OK)


def build_swebench_command(
    tasks: Annotated[
        str, typer.Option("--tasks", "-t", help="SWE-bench rows (.parquet/.jsonl/.json), e.g. ../shared/samples/swebench_verified.parquet.")
    ],
    ids: Annotated[list[str], typer.Option("--id", "-i", help="Instances to build (repeatable).")],
    repo: Annotated[
        str | None,
        typer.Option(
            "--repo", help="The instances' repository: a local git checkout or mirror holding the base commits, or a clone URL (online)."
        ),
    ] = None,
    wheels: Annotated[
        Path | None,
        typer.Option(
            "--wheels",
            exists=True,
            file_okay=False,
            help="A wheelhouse (pip download) that pip installs from, offline; without it pip uses PyPI during the build.",
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option("--python", help="Build with this Python version instead of the instance's (recorded in the image's labels)."),
    ] = None,
    python_image: Annotated[
        str | None,
        typer.Option(
            "--python-image", help="Build FROM this image (it must hold python<version>, git and bash) instead of a Debian suite."
        ),
    ] = None,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    force: Annotated[bool, typer.Option(help="Rebuild an image that is already on the engine.")] = False,
    cpus: CpusArg = DEFAULT_CPUS,
    memory: MemoryArg = DEFAULT_MEMORY,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Check each built image against the contract (as `relearn envs check-image`).")
    ] = True,
    plan: Annotated[
        bool, typer.Option("--plan", help="Only print each instance's recipe and the `pip download` that fills a wheelhouse for it.")
    ] = False,
) -> None:
    """Build SWE-bench instance images offline: the repository at the base commit from a checkout, a Python venv filled by pip from a wheelhouse in place of conda, the instance's install steps, and the `conda activate testbed` entry point the eval scripts call.

    Named as the row's image column (so verify finds it) unless --image-map/--image-template say otherwise. Supported: the pure-Python repositories of SWE-bench Verified (README); the others are refused with the reason.
    """
    from envs.contract import check_image

    choice = image_choice(image_map, image_template)
    limits = limits_from(cpus, memory)
    chosen = choice.route(load_task_list(tasks, ids))
    repos = sorted({t.repo for t in chosen})
    if len(repos) > 1:
        err.print(
            f"[red]error:[/red] --repo is one repository, and these instances come from {', '.join(repos)}: build each repository's apart"
        )
        raise typer.Exit(EXIT_USAGE)
    if repo is None:
        err.print(f"[red]error:[/red] give --repo: a checkout of {repos[0]} (or its clone URL when online)")
        raise typer.Exit(EXIT_USAGE)
    refused: list[str] = []
    specs = {}
    for task in chosen:
        try:
            specs[task.instance_id] = install_spec(task)
        except Unsupported as exc:
            refused.append(f"{task.instance_id}: {exc}")
    show_problems("refused", refused)
    if not specs:
        raise typer.Exit(EXIT_PARTIAL)
    with tempfile.TemporaryDirectory(prefix="relearn-src-") as tmp:
        try:
            source = source_repository(repo, Path(tmp), log=lambda m: err.print(f"[dim]{m}[/dim]"))
        except BuildFailed as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(EXIT_USAGE) from None
        if plan:
            for task in chosen:
                if task.instance_id in specs:
                    _print_plan(task, specs[task.instance_id], python, source)
            raise typer.Exit(EXIT_PARTIAL if refused else EXIT_OK)
        client = docker_client()
        terminate_cleanly()
        table = Table(title="relearn envs build-swebench")
        for column in ("instance", "image", "python", "recipe", "contract", "s"):
            table.add_column(column)
        failures: list[str] = []
        for task in chosen:
            spec = specs.get(task.instance_id)
            if spec is None:
                continue
            tag = task.image or f"sweb.eval.{machine_arch()}.{instance_key(task.instance_id)}:latest"
            if image_exists(client, tag) and not force:
                table.add_row(task.instance_id, tag, "", spec.source, "already on the engine (--force rebuilds)", "")
                continue
            try:
                built = build_instance_image(
                    client, task, spec, source=source, tag=tag, wheels=wheels, python=python, python_image=python_image, memory_mb=limits.memory_mb,
                    log=lambda m: err.print(f"[dim]{m}[/dim]", highlight=False),
                )  # fmt: skip
            except (BuildFailed, Unsupported) as exc:
                failures.append(f"{task.instance_id}: {exc}")
                continue
            verdict = "not checked"
            if check:
                started = time.monotonic()
                report = check_image(client, task, tag, task.eval_script or "", limits=limits)
                built.seconds["contract check"] = time.monotonic() - started
                verdict = "[green]kept[/green]" if report.ok else "[red]missing: " + "; ".join(report.missing()) + "[/red]"
                if not report.ok:
                    failures.append(f"{task.instance_id}: the built image does not keep the contract: {'; '.join(report.missing())}")
            timing = ", ".join(f"{k} {v:.0f}" for k, v in built.seconds.items())
            python_note = built.python if built.python == spec.python else f"{built.python} (spec: {spec.python})"
            table.add_row(task.instance_id, tag, python_note, spec.source, verdict, timing)
    out.print(table)
    show_problems("failed", failures)
    raise typer.Exit(EXIT_PARTIAL if failures or refused else EXIT_OK)


def _print_plan(task: Task, spec: InstallSpec, python: str | None, source: Path) -> None:
    version = python or spec.python
    requirements = requirements_text(source, spec, task)
    out.print(f"[bold]{task.instance_id}[/bold] ({spec.repo} {spec.version}; recipe from {spec.source})")
    out.print(
        f"  python {version}"
        + (f" from Debian {DEBIAN_PYTHON[version]}" if version in DEBIAN_PYTHON else " (no Debian suite: --python-image)")
    )
    for label, values in (
        ("requirements", requirements.strip().splitlines()),
        ("packages", spec.packages),
        ("pip packages", spec.pip_packages),
        ("pre-install", spec.pre_install),
        ("Debian packages", spec.apt_packages),
    ):
        if values:
            out.print(f"  {label}: {'; '.join(values)}", markup=False, highlight=False)
    out.print(f"  install: {spec.install}", markup=False, highlight=False)
    out.print("  fill a wheelhouse (where PyPI answers), plus the repository's own dependencies at the base commit:", markup=False)
    out.print(f"    {download_command(spec, version, requirements)}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("load")(load_command)
    app.command("check-image")(check_image_command)
    app.command("build-swebench")(build_swebench_command)
