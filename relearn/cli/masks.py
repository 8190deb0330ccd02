"""``relearn masks``: compile a pool into token masks A \\ E and Parquet shards. The flags are
``MasksOptions``' fields (``relearn.verbs.masks``)."""

from __future__ import annotations

from typing import Any

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, pairs, print_error, show_nodes, show_problems, show_warnings
from relearn.ops.masks import SELECTED_OUT, rejection_lines, run_masks
from relearn.ops.reporting import OpError, RichReporter
from relearn.verbs.masks import MasksOptions


def masks(options: MasksOptions) -> None:
    try:
        summary = run_masks(options, RichReporter(err))
    except (OpError, RuntimeError) as exc:  # RuntimeError: a shard a worker could not compile
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE if isinstance(exc, OpError) else EXIT_PARTIAL) from None
    stats = summary.stats
    show_problems("unreadable reviews", summary.review_errors)
    show_nodes(summary.per_node, "shards")
    show_problems("rejected", rejection_lines(stats))
    show_problems("recorded ids not trained (the text was)", [f"{n['sample_id']}: {n['detail']}" for n in stats["targets"]["notes"]])
    out.print(pairs(f"relearn masks --mode {options.mode} -> {options.output}", summary_rows(stats, summary.reused)))
    out.print(f"statistics: {options.output / 'stats.json'}")
    warned = show_warnings(summary.warnings)
    raise typer.Exit(EXIT_PARTIAL if summary.partial or warned else EXIT_OK)


def summary_rows(stats: dict[str, Any], reused: int) -> list[tuple[str, Any]]:
    tokens, context = stats["tokens"], stats["context"]
    return [
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
        # TER under each defect scope, the trained one marked.
        *(
            (f"TER {scope} scope" + (" (trained)" if scope == stats["defect_scope"] else ""), f"{ter['ter_token_weighted']:.4f}")
            for scope, ter in stats["ter_by_scope"].items()
        ),
        # Accepted trajectories by the rule that decided their context (how many compiled per
        # turn under the context as sent), and samples by where their generated tokens came from.
        *(
            (f"context: {rule}", f"{n}" + (f" ({context['as_sent'][rule]} as sent)" if context["as_sent"].get(rule) else ""))
            for rule, n in context["by_rule"].items()
        ),
        *((f"generated tokens: {name.replace('_', ' ')}", n) for name, n in stats["targets"]["samples"].items()),
        ("audit", audit_line(stats["audit"])),
        # What the mode selected out is left out, not an error (exit 0); an input problem is rejected (exit 1).
        *((f"{'left out' if reason in SELECTED_OUT else 'rejected'}: {reason}", n) for reason, n in stats["rejected"].items()),
        *((f"excluded tokens: {category}", n) for category, n in stats["excluded_by_category"].items()),
    ]


def audit_line(audit: dict[str, Any]) -> str:
    if not audit["applied"]:
        return "none applied (--audit FILE from `relearn envs audit -o`)"
    flagged = f"{audit['tasks_flagged']} of {audit['tasks_audited']} tasks flagged"
    if audit["kept"]:
        return f"{flagged}; their {audit['trajectories_of_flagged_tasks']} trajectories kept (--keep-flagged)"
    return f"{flagged}; {audit['trajectories_left_out']} successes of them left out"


def register(app: typer.Typer) -> None:
    app.command("masks")(command(MasksOptions, masks))
