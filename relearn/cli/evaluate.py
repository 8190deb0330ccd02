"""``relearn eval run|report|compare``: SWE-bench-style evaluation under a fixed budget; the flags
are ``relearn.verbs.evaluate``'s options dataclasses' fields."""

from __future__ import annotations

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, run_op, show_nodes, show_problems
from relearn.ops.evaluate import run_compare, run_evaluation, run_report
from relearn.verbs.evaluate import CompareOptions, EvalOptions, ReportOptions


def run(options: EvalOptions) -> None:
    summary = run_op(run_evaluation, options)
    show_nodes(summary.collect.per_node, "instances")
    show_problems("infrastructure failures (kept apart from model failures)", summary.collect.errors)
    report, episodes = summary.report, summary.collect
    low, high = report["resolved_rate_ci95"]
    out.print(
        f"{summary.selected} instances: {episodes.skipped} already done, {len(episodes.finished)} run now, {episodes.capped} not started (spend cap), "
        f"{len(report['infra_errors'])} infrastructure failures\n"
        f"resolved {report['resolved']}/{report['graded']} = {report['resolved_rate']:.1%} (95% CI {low:.1%}–{high:.1%}); report: {options.out / 'report.md'}"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def report(options: ReportOptions) -> None:
    written = run_op(run_report, options)
    out.print((options.run_dir / "report.md").read_text(), markup=False, highlight=False)
    raise typer.Exit(EXIT_PARTIAL if written["unreadable_records"] else EXIT_OK)


def compare(options: CompareOptions) -> None:
    out.print(run_op(run_compare, options), markup=False, highlight=False)
    folder = options.output
    out.print(f"written: {folder / 'compare.md'}, {folder / 'compare.json'}, {folder / 'compare.png'}")


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Evaluate a policy on SWE-bench Verified (or the mini suite) under a fixed budget; report and compare runs.",
        no_args_is_help=True,
    )
    group.command("run")(command(EvalOptions, run))
    group.command("report")(command(ReportOptions, report))
    group.command("compare")(command(CompareOptions, compare))
    app.add_typer(group, name="eval")
