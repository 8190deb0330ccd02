"""Pool verbs: ``relearn import``, ``relearn validate`` (the flags: ``relearn.verbs.importing`` and
``relearn.verbs.validate``; the work: ``relearn.ops.importing`` and ``relearn.ops.validate``)."""

from __future__ import annotations

import typer

from harness.import_run import ROW_FORMATS
from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, pairs, run_op, show_problems, show_warnings
from relearn.ops.importing import run_import
from relearn.ops.validate import run_validate
from relearn.verbs.importing import ImportOptions
from relearn.verbs.validate import ValidateOptions


def import_pool(options: ImportOptions) -> None:
    summary = run_op(run_import, options)
    show_problems("warnings", summary.warnings)
    show_problems("rejected", [str(e) for e in summary.rejected])
    # Row formats reject a damaged row and read on; whole-file formats reject the file.
    rejected = "files or records rejected" if options.format in ROW_FORMATS else "files rejected"
    rows: list[tuple[str, object]] = [
        ("files read", summary.files), ("input size", f"{summary.input_bytes / 1e6:.2f} MB"), ("trajectories imported", summary.imported),
        ("messages imported", summary.messages), ("already in the pool (skipped)", summary.skipped_existing),
        (rejected, len(summary.rejected)), ("warnings", len(summary.warnings)),
        *((f"unknown {kind} (kept)", count) for kind, count in summary.unknown.most_common()),
        *((f"not imported: {why}", count) for why, count in summary.not_imported.most_common()),
    ]  # fmt: skip
    out.print(pairs(f"relearn import {options.format} -> {options.output}", rows))
    raise typer.Exit(EXIT_PARTIAL if summary.rejected else EXIT_OK)


def validate(options: ValidateOptions) -> None:
    summary = run_op(run_validate, options)
    show_problems("unreadable records", [str(e) for e in summary.unreadable])
    show_problems("problems", summary.problems)
    rows: list[tuple[str, object]] = [
        ("trajectories", summary.trajectories), ("unreadable records", len(summary.unreadable)),
        ("trajectories with problems", summary.with_problems), ("repeated trajectory ids", summary.repeated),
        *((f"from {name}", count) for name, count in summary.formats.most_common()),
        *((f"exit {name}", count) for name, count in summary.exit_status.most_common()),
    ]  # fmt: skip
    out.print(pairs("relearn validate", rows))
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_OK if summary.clean and not warned else EXIT_PARTIAL)


def register(app: typer.Typer) -> None:
    app.command("import")(command(ImportOptions, import_pool))
    app.command("validate")(command(ValidateOptions, validate))
