"""``relearn run PIPELINE.toml`` and ``relearn demo``: the whole pipeline from one file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from relearn.cli.help_layout import EXIT_CODES_STAGES
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, grid, out, print_error
from relearn.ops.containers import sigterm_as_interrupt
from relearn.pipeline.config import ClusterConfig, PipelineError, load_pipeline
from relearn.pipeline.runner import StageResult, counts_text
from relearn.verbs.containers import RAY_HELP

EXIT_FAILED = 3  # a stage failed: later stages did not run (rerun to resume)
if TYPE_CHECKING:
    from relearn.pipeline.context import Context

RayArg = Annotated[str | None, typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)]


def _is_path(text: str) -> bool:
    """A word a person may copy: a path (a slash among letters), which a table cell would fold."""
    return "/" in text and any(c.isalpha() for c in text) and not any(c.isspace() for c in text)


def _summary(results: list[StageResult], title: str) -> list[str]:
    """Print the table; print under it, whole, what a cell would fold (paths, and an error
    that names one): the cell says "below". Returns the lines printed under the table."""
    below: list[str] = []

    def under(line: str) -> None:
        if line not in below:
            below.append(line)

    rows = []
    for r in results:
        counts: dict[str, object] = {}
        for key, value in r.counts.items():
            if isinstance(value, Path | str) and _is_path(str(value)):
                under(f"{key}: {value}")
                value = "below"
            counts[key] = value
        cell = counts_text(counts)
        if not cell and r.error:
            cell = r.error
            if any(_is_path(word) for word in r.error.split()):
                under(f"{r.name} failed: {r.error}")
                cell = "below"
        status = {"failed": "[red]failed[/red]", "current": "[dim]current[/dim]"}.get(r.status, r.status)
        rows.append((r.name, status, f"{r.seconds:.1f}" if r.status == "ran" else "-", escape(cell)))
    # The title names the pipeline file or the demo's folder: over the table where it fits, else
    # a line of its own (never folded).
    table = grid(title, ("stage", "status", "seconds", "counts"), rows, overflow="fold")
    if len(title) <= out.width:
        table.min_width = len(title)  # a title wider than the table would be folded to its width
    else:
        table.title = None
        out.print(title, soft_wrap=True, highlight=False, markup=False)
    out.print(table)
    for line in below:
        out.print(line, soft_wrap=True, highlight=False, markup=False)  # copied whole, at any width
    return below


def _code(results: list[StageResult]) -> int:
    return EXIT_FAILED if any(r.status == "failed" for r in results) else EXIT_OK


def run_command(
    pipeline: Annotated[Path, typer.Argument(metavar="PIPELINE.toml", help="The pipeline file (every field is in docs/pipeline.md).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say which stages would run and why; run nothing.")] = False,
    ray: RayArg = None,
) -> None:
    """Run collect/import -> verify -> review -> masks -> train -> eval -> report from one file.

    With --ray ADDRESS (or a cluster table in the file, address = "auto" or HOST:PORT; --ray wins), collect, verify, review, masks and analyze run their units on that Ray cluster (eval runs its containers on this machine, where the model is served).

    Each stage runs only when its outputs are not current (stamps in WORKDIR/.pipeline/): rerunning a finished pipeline does nothing, deleting one stage's output redoes that stage and those after it, changing a stage's settings redoes it and what follows (its old outputs are moved to WORKDIR/.pipeline/stale/, never deleted). A stage that was interrupted resumes. One run at a time works in a work folder: a second one is refused at once with the holder's pid and host.
    """
    try:
        config = load_pipeline(pipeline)
    except PipelineError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    if ray is not None:
        config.cluster = ClusterConfig(address=ray, registry=config.cluster.registry if config.cluster is not None else None)
    from relearn.pipeline.plan import run_pipeline

    with sigterm_as_interrupt():  # every `with Container` removes its container
        results, ctx = run_pipeline(config, err, dry_run=dry_run)
    for note in ctx.notes:
        err.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
    below = _summary(results, f"relearn run {pipeline}")
    code = _code(results)
    if dry_run and config.train is not None:
        _train_plan(ctx)
    report = f"report: {config.workdir / 'report' / 'report.md'}"
    if code == EXIT_OK and not dry_run and report not in below:
        out.print(report, soft_wrap=True, highlight=False, markup=False)  # a path copied whole
    raise typer.Exit(EXIT_PARTIAL if code == EXIT_OK and ctx.notes else code)


def _train_plan(ctx: Context) -> None:
    """``--dry-run``: the memory the train stage will need (``relearn train --plan``), in one
    process on this machine's device, as the pipeline trains."""
    import torch

    from relearn.pipeline.context import upstream_dir
    from relearn.train.options import UsageError
    from relearn.train.plan import describe, plan_options, table_rows, verdict_lines

    train = ctx.config.train
    assert train is not None
    opts = train.options(Path("."), Path("."), str(upstream_dir(ctx)), ctx.config.masks.tokenizer)
    if train.tiny:
        opts = replace(opts, init=None, tiny=train.tiny)
    elif not (upstream_dir(ctx) / "config.json").exists():
        err.print(f"train plan: {upstream_dir(ctx)} has no config.json yet; no plan", highlight=False)
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        plan, _ = plan_options(opts, device=device, alternatives=False)
    except UsageError as exc:
        err.print(f"train plan: {exc}", highlight=False, markup=False)
        return
    out.print(grid(f"train plan (one process, {device}): {describe(plan)}", ("part", "size", "what"), table_rows(plan)), highlight=False)
    for line in verdict_lines(plan, {}):
        out.print(line, highlight=False, markup=False)


def demo_command(
    out_dir: Annotated[Path, typer.Option("--out", metavar="DIR", help="Work folder of the demo pipeline.")] = Path("runs/demo"),
) -> None:
    """The main job on this machine: images, a historical pool, verification, review, masks,
    training, the kept/excluded NLL analysis, evaluation and the report, from a fresh clone in
    about 4 minutes on 2 cores (under 3 once the base image is built).

    The historical checkpoint is a scripted policy with planted mistakes, redundant
    exploration and reverted edits; the model relearned is a tiny random Qwen3 with the real
    vocabulary. Rerunning it does no work; `relearn run runs/demo/pipeline.toml` is the same
    pipeline.
    """
    from relearn.pipeline.demo import artifacts, run_demo

    err.print("[bold]relearn demo[/bold]: the ROSS pipeline on the mini suite (scripted historical checkpoint, tiny Qwen3)")
    try:
        with sigterm_as_interrupt():
            results, ctx, config = run_demo(out_dir, err)
    except (FileNotFoundError, RuntimeError) as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    _summary(results, f"relearn demo -> {out_dir}")
    code = _code(results)
    if code != EXIT_OK:
        raise typer.Exit(code)
    out.print("\n".join(artifacts(config.workdir)), highlight=False, soft_wrap=True)  # paths and commands copied whole
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("run", epilog=EXIT_CODES_STAGES)(run_command)
    app.command("demo", epilog=EXIT_CODES_STAGES)(demo_command)
