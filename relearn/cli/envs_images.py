"""``relearn envs load|check-image|build-swebench|fetch-wheels``: getting SWE-bench instance images onto
an engine without a registry, and checking that an image keeps the contract. Flags -> the
options of ``relearn.ops.envs`` -> its operation -> tables and an exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.envs import IdsArg
from relearn.cli.image_options import CpusArg, ImageMapArg, ImageTemplateArg, MemoryArg, PullArg, TasksArg
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, print_error, run_op, show_problems
from relearn.ops.containers import ContainerOptions
from relearn.ops.envs import (
    BuildSwebenchOptions,
    CheckImageOptions,
    FetchWheelsOptions,
    LoadOptions,
    SwebenchImage,
    SwebenchPlan,
    run_build_swebench,
    run_check_image,
    run_fetch_wheels,
    run_load,
)


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
    ] = LoadOptions.tasks,
    ids: IdsArg = None,
    image_map: ImageMapArg = ContainerOptions.image_map,
    image_template: ImageTemplateArg = ContainerOptions.image_template,
) -> None:
    """Load image tarballs into the engine (docker load), e.g. SWE-bench images saved on a machine with a registry."""
    containers = ContainerOptions(image_map=image_map, image_template=image_template)
    summary = run_op(run_load, LoadOptions(path, tasks, ids or [], containers))
    table = Table(title=f"relearn envs load {path}")
    for column in ("tarball", "images", "s"):
        table.add_column(column)
    for loaded in summary.loaded:
        table.add_row(loaded.archive, "\n".join(loaded.images), f"{loaded.seconds:.1f}")
    out.print(table)
    show_problems("not loaded", summary.failures)
    if tasks is not None:
        show_problems("unreadable tasks", summary.unreadable)
        show_problems("tasks whose image is still not on the engine", summary.missing)
        out.print(f"{summary.tasks - len(summary.missing)} of {summary.tasks} tasks have their image")
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.missing else EXIT_OK)


def check_image_command(
    image: Annotated[
        str | None,
        typer.Argument(metavar="IMAGE", help="The image to check (default: each selected task's own, after --image-map/--image-template)."),
    ] = CheckImageOptions.image,
    tasks: TasksArg = CheckImageOptions.tasks,
    ids: IdsArg = None,
    image_map: ImageMapArg = ContainerOptions.image_map,
    image_template: ImageTemplateArg = ContainerOptions.image_template,
    pull: PullArg = ContainerOptions.pull,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
) -> None:
    """Check an image against the contract a task needs, offline; list what is missing.

    Started without network: the repository at the work directory with the base commit in its history, the eval script's environment lines (`conda activate testbed`), the test command's interpreter and runner, the test files importing (docs/swebench.md, "The image contract"). Exits 1 when a check fails.
    """
    containers = ContainerOptions(image_map=image_map, image_template=image_template, pull=pull, cpus=cpus, memory=memory)
    summary = run_op(run_check_image, CheckImageOptions(image, tasks, ids or [], containers))
    show_problems("unreadable tasks", summary.unreadable)
    show_problems("images", summary.image_problems)
    for check in summary.checks:
        if check.report is None:
            print_error(f"{check.error}")
            continue
        table = Table(title=f"{check.instance_id}: {check.image}")
        for column in ("check", "result", "detail"):
            table.add_column(column)
        for line in check.report.checks:
            mark = "[green]ok[/green]" if line.ok else ("[red]MISSING[/red]" if line.required else "[yellow]warning[/yellow]")
            table.add_row(line.name, mark, line.detail)
        out.print(table)
        if check.ok:
            out.print(f"{check.instance_id}: {check.image} keeps the contract")
        else:
            out.print(f"{check.instance_id}: {check.image} does not keep the contract; missing:")
            for missing in check.report.missing():
                out.print(f"  - {missing}", markup=False, highlight=False)
    raise typer.Exit(EXIT_PARTIAL if summary.failed or summary.image_problems else EXIT_OK)


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
    ] = BuildSwebenchOptions.repo,
    wheels: Annotated[
        Path | None,
        typer.Option(
            "--wheels",
            exists=True,
            file_okay=False,
            help="A wheelhouse (pip download) that pip installs from, offline; without it pip uses PyPI during the build.",
        ),
    ] = BuildSwebenchOptions.wheels,
    python: Annotated[
        str | None,
        typer.Option("--python", help="Build with this Python version instead of the instance's (recorded in the image's labels)."),
    ] = BuildSwebenchOptions.python,
    python_image: Annotated[
        str | None,
        typer.Option(
            "--python-image", help="Build FROM this image (it must hold python<version>, git and bash) instead of a Debian suite."
        ),
    ] = BuildSwebenchOptions.python_image,
    image_map: ImageMapArg = ContainerOptions.image_map,
    image_template: ImageTemplateArg = ContainerOptions.image_template,
    force: Annotated[bool, typer.Option(help="Rebuild an image that is already on the engine.")] = BuildSwebenchOptions.force,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Check each built image against the contract (as `relearn envs check-image`).")
    ] = BuildSwebenchOptions.check,
    plan: Annotated[
        bool,
        typer.Option("--plan", help="Only print each instance's recipe and the `relearn envs fetch-wheels` that fills its wheelhouse."),
    ] = BuildSwebenchOptions.plan,
) -> None:
    """Build SWE-bench instance images offline: the repository at the base commit from a checkout, a Python venv filled by pip from a wheelhouse in place of conda, the instance's install steps, and the `conda activate testbed` entry point the eval scripts call.

    Named as the row's image column (so verify finds it) unless --image-map/--image-template say otherwise. Supported: the pure-Python repositories of SWE-bench Verified (docs/swebench.md); the others are refused with the reason.
    """
    containers = ContainerOptions(image_map=image_map, image_template=image_template, cpus=cpus, memory=memory)
    options = BuildSwebenchOptions(tasks, ids, repo, wheels, python, python_image, force, check, plan, containers)
    summary = run_op(run_build_swebench, options)
    show_problems("refused", summary.refused)
    for entry in summary.plans:
        _print_plan(entry)
    if summary.images:
        table = Table(title="relearn envs build-swebench")
        for column in ("instance", "image", "python", "recipe", "contract", "s"):
            table.add_column(column)
        for image in summary.images:
            table.add_row(image.instance_id, image.image, _python(image), image.recipe, _contract(image), _seconds(image))
        out.print(table)
    show_problems("failed", summary.failures)
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.refused else EXIT_OK)


def _python(image: SwebenchImage) -> str:
    if image.python is None:
        return ""
    return image.python if image.python == image.spec_python else f"{image.python} (spec: {image.spec_python})"


def _contract(image: SwebenchImage) -> str:
    if image.contract == "kept":
        return "[green]kept[/green]"
    if image.contract == "missing":
        return "[red]missing: " + "; ".join(image.missing) + "[/red]"
    if image.contract == "already on the engine":
        return "already on the engine (--force rebuilds)"
    return image.contract


def _seconds(image: SwebenchImage) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in image.seconds.items())


def _print_plan(plan: SwebenchPlan) -> None:
    spec = plan.spec
    out.print(f"[bold]{plan.instance_id}[/bold] ({spec.repo} {spec.version}; recipe from {spec.source})")
    out.print(
        f"  python {plan.python}" + (f" from Debian {plan.debian_suite}" if plan.debian_suite else " (no Debian suite: --python-image)")
    )
    for label, values in (
        ("requirements", plan.requirements),
        ("packages", spec.packages),
        ("pip packages", spec.pip_packages),
        ("pre-install", spec.pre_install),
        ("Debian packages", spec.apt_packages),
    ):
        if values:
            out.print(f"  {label}: {'; '.join(values)}", markup=False, highlight=False)
    out.print(f"  install: {spec.install}", markup=False, highlight=False)
    out.print("  fill its wheelhouse where PyPI answers (then build with --wheels, offline):", markup=False)
    out.print(f"    {plan.fetch}", markup=False, highlight=False, soft_wrap=True)


def fetch_wheels_command(
    tasks: Annotated[
        str, typer.Option("--tasks", "-t", help="SWE-bench rows (.parquet/.jsonl/.json), e.g. ../shared/samples/swebench_verified.parquet.")
    ],
    ids: Annotated[list[str], typer.Option("--id", "-i", help="Instances whose wheelhouse to fill (repeatable).")],
    wheels: Annotated[
        Path, typer.Option("--wheels", file_okay=False, help="The wheelhouse to fill (made when missing); instances may share one.")
    ],
    repo: Annotated[
        str | None,
        typer.Option("--repo", help="The instances' repository: a local git checkout or mirror holding the base commits, or a clone URL."),
    ] = FetchWheelsOptions.repo,
    python: Annotated[
        str | None, typer.Option("--python", help="Resolve for this Python version instead of the instance's (as build-swebench --python).")
    ] = FetchWheelsOptions.python,
    python_image: Annotated[
        str | None,
        typer.Option("--python-image", help="Run pip in this image (as build-swebench --python-image) instead of a Debian suite's."),
    ] = FetchWheelsOptions.python_image,
    era: Annotated[
        bool,
        typer.Option(
            "--era/--no-era",
            help="Take versions the spec leaves open as of the environment-setup commit's date (pip --uploaded-prior-to); --no-era takes the newest.",
        ),
    ] = FetchWheelsOptions.era,
) -> None:
    """Fill the wheelhouse that `relearn envs build-swebench --wheels` installs from offline, where PyPI answers.

    pip runs inside a container of the image's own base (the Debian suite with the instance's Python, or --python-image), so environment markers and wheel tags are the image's, and downloads what each install step of the build asks for, in the build's order: pip, setuptools and wheel; the repository's requirements file; the spec's packages and pins; the repository's own dependencies at the base commit, for the extras its install names; its build backend. Versions the spec leaves open are taken as of the environment-setup commit's date. Sdists are built into wheels there, those that compile C again with Debian's compiler; one that builds nowhere gives way to its project's newest wheel. The container reaches the index through this machine's proxy settings and certificates (PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE).

    The wheelhouse's relearn-wheelhouse.lock.json lists every file with its sha256 and, per instance, the Python pip ran on, the era, the build tools, how each step resolved and the sdists built or replaced (docs/swebench.md). Exits 1 when an instance failed or an sdist could not be made a wheel.
    """
    options = FetchWheelsOptions(tasks, ids, wheels, repo, python, python_image, era)
    summary = run_op(run_fetch_wheels, options)
    show_problems("refused", summary.refused)
    if summary.fetched:
        table = Table(title=f"relearn envs fetch-wheels -> {wheels}")
        for column in ("instance", "python", "era", "steps newer than the era", "wheels built from sdists", "s"):
            table.add_column(column)
        for result in summary.fetched:
            newer = [s["step"] for s in result.steps if s["result"] == "newer than the era"]
            built = ", ".join([*result.built, *(f"{name} (no build: the newest wheel instead)" for name in result.replaced)]) or "none"
            table.add_row(
                result.instance_id, result.python, result.era or "newest", ", ".join(newer) or "none", built, f"{result.seconds:.0f}"
            )
        out.print(table)
        out.print(f"the wheelhouse holds {summary.files} distributions (relearn-wheelhouse.lock.json)")
    show_problems("failed", summary.failures)
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.refused else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("load")(load_command)
    app.command("check-image")(check_image_command)
    app.command("build-swebench")(build_swebench_command)
    app.command("fetch-wheels")(fetch_wheels_command)
