"""``relearn export``: pools as ATIF or chat JSON, compiled datasets for other trainers, and the
A \\ E spans themselves (the flags: ``relearn.verbs.export``; the work: ``relearn.ops.export``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, pairs, run_op, show_problems, show_warnings
from relearn.ops.export import run_export_dataset, run_export_masks, run_export_pool
from relearn.verbs.export import DatasetExportOptions, MasksExportOptions, PoolExportOptions, PoolFormat

export_app = typer.Typer(
    help="Export pools (Harbor ATIF, Hugging Face chat JSON, chat-message datasets) and compiled datasets (TRL, axolotl, verl, LLaMA-Factory, datasets; the A \\ E spans as JSONL).",
    no_args_is_help=True,
)

ATIF_DOC = "One Harbor ATIF v1.7 `<id>.trajectory.json` per trajectory (Harbor's viewer, `harbor analyze`, SkyRL)."
HF_DOC = "One `{id, messages, tools}` row per trajectory, ready for `tokenizer.apply_chat_template(messages, tools=tools)`."
CHAT_DOC = """One chat-message row per trajectory: OpenAI messages (tool-call arguments as JSON text), tools, id, task, resolved, reward, patch.

With --preset, the rows of SWE-Gym, SWE-smith, nebius SWE-agent-trajectories or SWE-rebench-openhands, so `relearn import chat --preset` reads them back to the same messages. A trajectory the preset cannot hold whole (tool calls in the text-only nebius rows) is refused and listed.
"""


def pool_export(format: PoolFormat) -> Callable[[PoolExportOptions], None]:
    def export(options: PoolExportOptions) -> None:
        summary = run_op(run_export_pool, replace(options, format=format))
        if format == "chat":
            show_problems("refused (the preset cannot hold them)", summary.refused)
        show_problems("rejected records", summary.rejected)
        shape = f"{format} ({summary.preset})" if summary.preset else format
        refused = f", {len(summary.refused)} refused" if format == "chat" else ""
        out.print(
            f"exported {summary.exported} trajectories as {shape} to {summary.output}; {len(summary.rejected)} records rejected{refused}"
        )
        raise typer.Exit(EXIT_OK if summary.complete and not show_warnings(summary.warnings) else EXIT_PARTIAL)

    return export


def dataset(options: DatasetExportOptions) -> None:
    summary = run_op(run_export_dataset, options)
    rows = [("rows", summary.rows), ("tokens", summary.tokens), ("supervised tokens", summary.supervised),
            ("left out (nothing supervised)", summary.skipped_unsupervised), ("files", ", ".join(summary.files))]  # fmt: skip
    out.print(pairs(f"relearn export dataset --for {summary.trainer} -> {summary.output}", rows))
    out.print(f"manifest: {summary.manifest}")
    raise typer.Exit(EXIT_PARTIAL if show_warnings(summary.warnings) else EXIT_OK)


def masks(options: MasksExportOptions) -> None:
    summary = run_op(run_export_masks, options)
    out.print(f"exported the A \\ E spans of {summary.samples} samples to {summary.output}")
    raise typer.Exit(EXIT_PARTIAL if show_warnings(summary.warnings) else EXIT_OK)


def register(app: typer.Typer) -> None:
    export_app.command("atif")(command(PoolExportOptions, pool_export("atif"), doc=ATIF_DOC, skip=("preset",)))
    export_app.command("hf")(command(PoolExportOptions, pool_export("hf"), doc=HF_DOC, skip=("preset",)))
    export_app.command("chat")(command(PoolExportOptions, pool_export("chat"), doc=CHAT_DOC))
    export_app.command("dataset")(command(DatasetExportOptions, dataset))
    export_app.command("masks")(command(MasksExportOptions, masks))
    app.add_typer(export_app, name="export")
