"""``relearn envs build-base|build|audit|gc|load|check-image|build-swebench|fetch-wheels``: task
images and containers. A verb's help and flags are its options dataclass in ``relearn.verbs.envs``;
here, its summary's tables and its exit code. ``relearn verify`` is ``relearn.cli.verify``."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from relearn.cli.declared import command, parameter
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, err, grid, out, print_error, run_op, show_problems
from relearn.ops.envs.audit import run_audit
from relearn.ops.envs.audit_verdicts import run_audit_verdicts
from relearn.ops.envs.build import run_build
from relearn.ops.envs.build_base import run_build_base
from relearn.ops.envs.build_swebench import SwebenchImage, SwebenchPlan, run_build_swebench
from relearn.ops.envs.check_image import run_check_image
from relearn.ops.envs.fetch_wheels import run_fetch_wheels
from relearn.ops.envs.gc import run_gc
from relearn.ops.envs.load import run_load
from relearn.options import options_of
from relearn.verbs import envs as verbs

envs_app = typer.Typer(
    help="Task images and containers: build the offline base and task images, audit them, sweep orphans.", no_args_is_help=True
)
VERDICT = {"exposed": "[red]EXPOSED[/red]", "clean": "[green]clean[/green]", "error": "[yellow]error[/yellow]"}
# The container options no envs verb takes: they run on this machine's engine (relearn.ops.envs._engine._here_only).
HERE = ("ray", "registry")


def build(options: verbs.BuildOptions) -> None:
    summary = run_op(run_build, options)
    show_problems("unreadable tasks", summary.unreadable)
    show_problems("failed", summary.failures)
    out.print(grid("task images", ("task", "image"), summary.images))
    raise typer.Exit(EXIT_PARTIAL if summary.failures else EXIT_OK)


def audit(options: verbs.AuditOptions, verdicts: Path | None) -> None:
    if verdicts is not None:
        audit_verdicts(verdicts)
    summary = run_op(run_audit, options)
    show_problems("unreadable tasks", summary.unreadable)
    show_problems("images", summary.image_problems)
    rows = [(a.instance_id, VERDICT[a.verdict], a.why) for a in summary.audits]
    out.print(grid("relearn envs audit", ("task", "verdict", "why"), rows))
    unavailable = f"; {summary.unavailable} not on this engine" if summary.unavailable else ""
    out.print(f"{summary.exposed} of {len(summary.audits)} task images expose their fix{unavailable}")
    if options.output is not None:
        out.print(f"audit: {options.output}", highlight=False)
    raise typer.Exit(EXIT_PARTIAL if summary.exposed or summary.unavailable else EXIT_OK)


def audit_verdicts(path: Path) -> NoReturn:
    summary = run_op(run_audit_verdicts, verbs.VerdictAuditOptions(path))
    rows = [
        (n.instance_id, n.patch_hash[:8], "[green]yes[/green]" if n.resolved else "[red]no[/red]", "\n".join(n.notes))
        for n in summary.noted
    ]
    out.print(grid(f"relearn envs audit --verdicts {path}", ("task", "patch", "resolved", "what the verifier did"), rows))
    show_problems("unreadable verdicts", summary.unreadable)
    out.print(f"{summary.flagged} of {summary.verdicts} verdicts refused, contradicted or suspicious")
    raise typer.Exit(EXIT_PARTIAL if summary.flagged or summary.unreadable else EXIT_OK)


def _optional(required: inspect.Parameter) -> inspect.Parameter:
    """Another verb's required option as an optional flag: ``audit --verdicts`` audits them instead."""
    plain, info = typing.get_args(required.annotation)
    return required.replace(default=None, annotation=Annotated[plain | None, info])


def gc(options: verbs.GcOptions) -> None:
    summary = run_op(run_gc, options)
    swept = summary.per_node if options.ray is not None else {"": summary.removed}  # "": this machine
    for node, names in swept.items():
        removed = f"removed {len(names)} container(s)" + (f": {', '.join(names)}" if names else "")
        out.print(f"node {node[:12]}: {removed}" if node else f"{removed} and {len(summary.networks)} network(s)")
    for node, why in summary.node_failures.items():
        err.print(f"node {node[:12]}: [red]could not sweep[/red]: {why}", highlight=False)
    raise typer.Exit(EXIT_PARTIAL if summary.node_failures else EXIT_OK)


def load(options: verbs.LoadOptions) -> None:
    summary = run_op(run_load, options)
    rows = [(a.archive, "\n".join(a.images), f"{a.seconds:.1f}") for a in summary.loaded]
    out.print(grid(f"relearn envs load {options.path}", ("tarball", "images", "s"), rows))
    show_problems("not loaded", summary.failures)
    if options.tasks is not None:
        show_problems("unreadable tasks", summary.unreadable)
        show_problems("tasks whose image is still not on the engine", summary.missing)
        out.print(f"{summary.tasks - len(summary.missing)} of {summary.tasks} tasks have their image")
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.missing else EXIT_OK)


def check_image(options: verbs.CheckImageOptions) -> None:
    summary = run_op(run_check_image, options)
    show_problems("unreadable tasks", summary.unreadable)
    show_problems("images", summary.image_problems)
    for check in summary.checks:
        if check.report is None:
            print_error(f"{check.error}")
            continue
        rows = [(c.name, _mark(c.ok, c.required), c.detail) for c in check.report.checks]
        out.print(grid(f"{check.instance_id}: {check.image}", ("check", "result", "detail"), rows))
        kept = "keeps the contract" if check.ok else "does not keep the contract; missing:"
        out.print(f"{check.instance_id}: {check.image} {kept}")
        for missing in [] if check.ok else check.report.missing():
            out.print(f"  - {missing}", markup=False, highlight=False)
    raise typer.Exit(EXIT_PARTIAL if summary.failed or summary.image_problems else EXIT_OK)


def _mark(ok: bool, required: bool) -> str:
    return "[green]ok[/green]" if ok else ("[red]MISSING[/red]" if required else "[yellow]warning[/yellow]")


def build_swebench(options: verbs.BuildSwebenchOptions) -> None:
    summary = run_op(run_build_swebench, options)
    show_problems("refused", summary.refused)
    for plan in summary.plans:
        _print_plan(plan)
    if summary.images:
        columns = ("instance", "image", "python", "recipe", "contract", "s")
        rows = [(i.instance_id, i.image, _python(i), i.recipe, _contract(i), _seconds(i)) for i in summary.images]
        out.print(grid("relearn envs build-swebench", columns, rows))
    show_problems("failed", summary.failures)
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.refused else EXIT_OK)


def _python(image: SwebenchImage) -> str:
    if image.python is None:
        return ""
    return image.python if image.python == image.spec_python else f"{image.python} (spec: {image.spec_python})"


def _contract(image: SwebenchImage) -> str:
    if image.contract == "missing":
        return "[red]missing: " + "; ".join(image.missing) + "[/red]"
    shown = {"kept": "[green]kept[/green]", "already on the engine": "already on the engine (--force rebuilds)"}
    return shown.get(image.contract, image.contract)


def _seconds(image: SwebenchImage) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in image.seconds.items())


def _print_plan(plan: SwebenchPlan) -> None:
    spec = plan.spec
    suite = f" from Debian {plan.debian_suite}" if plan.debian_suite else " (no Debian suite: --python-image)"
    out.print(f"[bold]{plan.instance_id}[/bold] ({spec.repo} {spec.version}; recipe from {spec.source})")
    out.print(f"  python {plan.python}{suite}")
    lists = {"requirements": plan.requirements, "packages": spec.packages, "pip packages": spec.pip_packages}
    lists |= {"pre-install": spec.pre_install, "Debian packages": spec.apt_packages, "install": [spec.install]}
    for label, values in lists.items():
        if values:
            out.print(f"  {label}: {'; '.join(values)}", markup=False, highlight=False)
    out.print("  fill its wheelhouse where PyPI answers (then build with --wheels, offline):", markup=False)
    out.print(f"    {plan.fetch}", markup=False, highlight=False, soft_wrap=True)


def fetch_wheels(options: verbs.FetchWheelsOptions) -> None:
    summary = run_op(run_fetch_wheels, options)
    show_problems("refused", summary.refused)
    if summary.fetched:
        columns = ("instance", "python", "era", "steps newer than the era", "wheels built from sdists", "s")
        rows = []
        for result in summary.fetched:
            newer = ", ".join(s["step"] for s in result.steps if s["result"] == "newer than the era") or "none"
            built = ", ".join([*result.built, *(f"{name} (no build: the newest wheel instead)" for name in result.replaced)]) or "none"
            rows.append((result.instance_id, result.python, result.era or "newest", newer, built, f"{result.seconds:.0f}"))
        out.print(grid(f"relearn envs fetch-wheels -> {options.wheels}", columns, rows))
        out.print(f"the wheelhouse holds {summary.files} distributions (relearn-wheelhouse.lock.json)")
    show_problems("failed", summary.failures)
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.refused else EXIT_OK)


envs_app.command("build-base")(
    command(verbs.BuildBaseOptions, lambda options: out.print(f"base image: {run_op(run_build_base, options).image}"))
)
envs_app.command("build")(command(verbs.BuildOptions, build))
envs_app.command("audit")(
    command(verbs.AuditOptions, audit, skip=HERE, extra=[_optional(parameter(options_of(verbs.VerdictAuditOptions)[0]))])
)
envs_app.command("gc")(command(verbs.GcOptions, gc))
envs_app.command("load")(command(verbs.LoadOptions, load, skip=(*HERE, "pull", "cpus", "memory")))
envs_app.command("check-image")(command(verbs.CheckImageOptions, check_image, skip=HERE))
envs_app.command("build-swebench")(command(verbs.BuildSwebenchOptions, build_swebench, skip=(*HERE, "pull")))
envs_app.command("fetch-wheels")(command(verbs.FetchWheelsOptions, fetch_wheels))


def register(app: typer.Typer) -> None:
    app.add_typer(envs_app, name="envs")
