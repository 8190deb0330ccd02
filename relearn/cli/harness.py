"""Harness verbs: ``relearn collect`` and ``relearn replay``; their flags are ``CollectOptions``'
and ``ReplayOptions``' fields (``relearn.verbs.collect``)."""

from __future__ import annotations

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, grid, out, run_op, show_nodes, show_problems
from relearn.ops.collect import ReplayRow, run_collect, run_replay
from relearn.verbs.collect import CollectOptions, ReplayOptions


def collect(options: CollectOptions) -> None:
    summary = run_op(run_collect, options)
    for title, problems in (("unreadable tasks", summary.task_problems), ("images", summary.image_problems),
                            ("errors", summary.collect.errors), ("unreadable records", summary.unreadable)):  # fmt: skip
        show_problems(title, problems)
    show_nodes(summary.collect.per_node, "episodes")
    ks = [f"pass@{k}" for k in summary.ks]
    rows = [[task, str(row["attempts"]), str(row["resolved"]), *(f"{row[k]:.3f}" for k in ks)] for task, row in summary.pass_at_k.items()]
    out.print(grid(f"relearn collect -> {summary.pool}", ["task", "attempts", "resolved", *ks], rows, justify="right"))
    episodes = summary.collect
    out.print(
        f"{len(episodes.finished)} episodes run now, {episodes.skipped} already done, {episodes.restarted} restarted after a crash; "
        f"exit statuses: {', '.join(f'{k} {v}' for k, v in sorted(summary.exit_status.items()))}"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def replay_row(row: ReplayRow) -> list[str]:
    report = row.report
    if report is None:
        return [row.trajectory_id, "", "", "", row.problem or "", ""]
    divergence = f"message {report.divergence.message_index} ({report.divergence.tool})" if report.divergence else "none"
    patch = {True: "same", False: "differs", None: "not recorded"}[report.patch_matches]
    verdict = "" if report.verdict is None else ("yes" if report.verdict.resolved else "no")
    return [row.trajectory_id, str(report.calls), str(report.exact), str(report.normalised), divergence, patch, verdict]


def replay(options: ReplayOptions) -> None:
    summary = run_op(run_replay, options)
    for title, problems in (("unreadable records", summary.unreadable), ("unreadable tasks", summary.task_problems),
                            ("images", summary.image_problems)):  # fmt: skip
        show_problems(title, problems)
    columns = ["trajectory", "calls", "exact", "normalised", "first divergence", "patch", "resolved"]
    out.print(grid(f"relearn replay {options.pool}", columns, [replay_row(row) for row in summary.rows]))
    raise typer.Exit(EXIT_PARTIAL if summary.failures or summary.unreadable else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("collect")(command(CollectOptions, collect))
    # Replay runs here, one trajectory after another: no cluster, and its images are made here.
    app.command("replay")(command(ReplayOptions, replay, skip=("ray", "registry")))
