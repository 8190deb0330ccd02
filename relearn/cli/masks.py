"""``relearn masks``: compile a pool into token masks A \\ E and Parquet shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from relearn.cli.cluster import RayArg, show_nodes
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, show_problems, show_warnings
from relearn.ops.masks import MasksOptions, run_masks
from relearn.ops.reporting import OpError, RichReporter


def masks_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", exists=True, dir_okay=False, help="Pool of trajectories (.jsonl or .jsonl.zst).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Dataset folder: shard-*.parquet and stats.json.")],
    reviews: Annotated[
        Path | None, typer.Option("--reviews", "-r", exists=True, dir_okay=False, help="Review JSONL (needed for ross and ross-nomask).")
    ] = MasksOptions.reviews,
    tokenizer: Annotated[
        str, typer.Option(help="`qwen3.6` or `qwen3` (built in, offline) or a Hugging Face tokenizer folder.")
    ] = MasksOptions.tokenizer,
    mode: Annotated[
        str, typer.Option(help="ross (A \\ E, accepted) | positive (A, all verified-positive) | ross-nomask (A, accepted).")
    ] = MasksOptions.mode,
    ctx: Annotated[
        int, typer.Option(help="Longest sample in tokens; longer trajectories are dropped and counted, never cut.")
    ] = MasksOptions.ctx,
    prefix_check: Annotated[
        str, typer.Option(help="header (each turn opens with the generation prompt) | every (re-render each prefix) | off.")
    ] = MasksOptions.prefix_check,
    per_turn: Annotated[
        bool, typer.Option(help="One sample per generated turn, for templates that rewrite earlier turns.")
    ] = MasksOptions.per_turn,
    preserve_thinking: Annotated[
        bool, typer.Option(help="Keep reasoning on every turn (Qwen3.6's preserve_thinking).")
    ] = MasksOptions.preserve_thinking,
    no_thinking: Annotated[
        bool,
        typer.Option(
            "--no-thinking",
            help="Render in the template's no-thinking form (enable_thinking=False: its empty think block is part of the generation prompt), for single-turn rollouts imported with `relearn single-turn import --no-thinking`.",
        ),
    ] = MasksOptions.no_thinking,
    shard_size: Annotated[int, typer.Option(help="Trajectories of the pool per shard.")] = MasksOptions.shard_size,
    include_suspicious: Annotated[
        bool,
        typer.Option(
            help="Also take successes the verifier found suspicious (edited tests or pytest config, code reaching into pytest); by default they are rejected and counted."
        ),
    ] = MasksOptions.include_suspicious,
    workers: Annotated[
        int,
        typer.Option(
            help="Worker processes compiling shards at once (each shard is one work unit; the files are written by this process, in the same bytes). 1: compile here, one shard after another, in the least memory."
        ),
    ] = MasksOptions.workers,
    ray: RayArg = MasksOptions.ray,
    defect_scope: Annotated[
        str,
        typer.Option(
            help="action: a defect in a tool call excludes the whole call as the template renders it (tags, function name, every argument, and the end of turn after a turn's last call), since the error is the decision to call | minimal: only the quoted characters (the ablation)."
        ),
    ] = MasksOptions.defect_scope,
    audit: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Image audit records (`relearn envs audit -o FILE`): the trajectories of tasks whose images it flags (.git exposes the fix) are left out of every mode and counted, as the paper's training set left them out. Without it no audit is applied, and the summary says so.",
        ),
    ] = MasksOptions.audit,
    keep_flagged: Annotated[
        bool, typer.Option(help="Keep the trajectories of the tasks --audit flags (still counted in the summary).")
    ] = MasksOptions.keep_flagged,
    context: Annotated[
        str,
        typer.Option(
            help="as-sent: a trajectory whose render departs from what the model saw is compiled one sample per turn under the context as sent: its calls' recorded prompt ids where the pool has them and they disagree with the render, or the history without reasoning where the harness never sent reasoning back (observations as user turns, text-only agents); stats.json counts trajectories by the rule that decided | render: trust the template's render of the history."
        ),
    ] = MasksOptions.context,
    recorded_ids: Annotated[
        bool,
        typer.Option(
            help="Train each generated turn on the token ids the policy recorded for it (where every generated turn of a sample has them), not on its text tokenised again; ids that decode to other text than the turn are reported in stats.json and the text is trained."
        ),
    ] = MasksOptions.recorded_ids,
) -> None:
    """Compile token masks A \\ E over the real chat template, VALIDATE them, write Parquet shards.

    Each trajectory is rendered once; each rejected trajectory is counted with its reason. Resumable (finished shards with the same options are kept) and deterministic.

    ross and ross-nomask validate the same defects and so hold the same trajectories: the masking contrast is the same subset with and without the mask.
    """
    options = MasksOptions(
        pool=pool, output=output, reviews=reviews, tokenizer=tokenizer, mode=mode, ctx=ctx, prefix_check=prefix_check, per_turn=per_turn,
        preserve_thinking=preserve_thinking, no_thinking=no_thinking, shard_size=shard_size, include_suspicious=include_suspicious,
        defect_scope=defect_scope, workers=workers, ray=ray, audit=audit, keep_flagged=keep_flagged, context=context,
        recorded_ids=recorded_ids,
    )  # fmt: skip
    try:
        summary = run_masks(options, RichReporter(err))
    except OpError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    except RuntimeError as exc:  # a shard a worker could not compile
        print_error(str(exc))
        raise typer.Exit(EXIT_PARTIAL) from None
    stats, reused = summary.stats, summary.reused
    show_problems("unreadable reviews", summary.review_errors)
    show_nodes(summary.per_node, "shards")
    show_problems("rejected", [f"{r['trajectory_id']}: {r['reason']}: {r['detail']}" for r in stats["rejections"]])
    show_problems("recorded ids not trained (the text was)", [f"{n['sample_id']}: {n['detail']}" for n in stats["targets"]["notes"]])
    table = Table(title=f"relearn masks --mode {mode} -> {output}", show_header=False)
    tokens = stats["tokens"]
    for name, value in (
        ("trajectories in", stats["trajectories_in"]),
        ("trajectories out", stats["trajectories_out"]),
        ("samples", stats["samples"]),
        ("shards (reused)", f"{stats['shards']} ({reused})"),
        ("tokens", tokens["total"]),
        ("eligible (A)", tokens["eligible"]),
        ("excluded (A ∩ E)", tokens["excluded"]),
        ("supervised (A \\ E)", tokens["supervised"]),
        ("TER token-weighted", f"{stats['ter_token_weighted']:.4f}"),
        ("TER mean per sample", f"{stats['ter_mean']:.4f}"),
        *scope_rows(stats),
        *context_rows(stats),
        ("audit", audit_line(stats["audit"])),
    ):
        table.add_row(name, str(value))
    for reason, count in stats["rejected"].items():
        table.add_row(f"rejected: {reason}", str(count))
    for category, count in stats["excluded_by_category"].items():
        table.add_row(f"excluded tokens: {category}", str(count))
    out.print(table)
    out.print(f"statistics: {output / 'stats.json'}")
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_PARTIAL if summary.partial or warned else EXIT_OK)


def scope_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """TER token-weighted under each defect scope, the trained one marked."""
    return [
        (f"TER {scope} scope" + (" (trained)" if scope == stats["defect_scope"] else ""), f"{ter['ter_token_weighted']:.4f}")
        for scope, ter in stats["ter_by_scope"].items()
    ]


def context_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """Accepted trajectories by the rule that decided their context (how many compiled per turn
    under the context as sent), and samples by where their generated tokens came from."""
    context, targets = stats["context"], stats["targets"]
    rows = [
        (f"context: {rule}", f"{count}" + (f" ({context['as_sent'][rule]} as sent)" if context["as_sent"].get(rule) else ""))
        for rule, count in context["by_rule"].items()
    ]
    return rows + [(f"generated tokens: {name.replace('_', ' ')}", str(count)) for name, count in targets["samples"].items()]


def audit_line(audit: dict[str, Any]) -> str:
    if not audit["applied"]:
        return "none applied (--audit FILE from `relearn envs audit -o`)"
    flagged = f"{audit['tasks_flagged']} of {audit['tasks_audited']} tasks flagged"
    if audit["kept"]:
        return f"{flagged}; their {audit['trajectories_of_flagged_tasks']} trajectories kept (--keep-flagged)"
    return f"{flagged}; {audit['trajectories_left_out']} successes of them left out"


def register(app: typer.Typer) -> None:
    app.command("masks")(masks_command)
