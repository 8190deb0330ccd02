"""``relearn verify``: ``VerifyOptions``' fields as flags -> ``relearn.ops.verify.run_verify`` -> the verdicts table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from relearn.cli.declared import command
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, grid, out, run_op, show_nodes, show_problems
from relearn.ops.verify import run_verify
from relearn.verbs.verify import VerifyOptions

if TYPE_CHECKING:
    from envs.verify import Verdict

DOC = """Grade patches in fresh containers with the tasks' tests (SWE-bench grading, Harbor reward files).

Each task runs in the image --image-map or --image-template names, else the row's own (the mini suite's are built here). Resumable: a (task, patch) pair already in the output is not run again.
"""


def passed(tests: dict[str, dict[str, list[str]]], kind: str) -> str:
    success, failure = (len(tests.get(kind, {}).get(result, [])) for result in ("success", "failure"))
    return f"{success}/{success + failure}"


def _network_note(verdict: Verdict) -> str:
    count = len(verdict.network_needed)
    return f"{count} failed test{'s' if count != 1 else ''} needed the network" if count else ""


def verify(options: VerifyOptions) -> None:
    summary = run_op(run_verify, options)
    for title, problems in (("unreadable", summary.unreadable), ("images", summary.image_problems), ("errors", summary.errors)):
        show_problems(title, problems)
    show_nodes(summary.per_node, "verdicts")
    show_problems("not gradable", [f"{v.instance_id} {v.patch_hash[:8]}: {v.error}" for v in summary.verdicts if v.error])
    rows = [
        [v.instance_id, v.patch_hash[:8] if v.patch_exists else "empty", "[green]yes[/green]" if v.resolved else "[red]no[/red]",
         passed(v.tests or {}, "FAIL_TO_PASS"), passed(v.tests or {}, "PASS_TO_PASS"), ", ".join(v.restored_files),
         (v.error or "; ".join(v.disagreements) or _network_note(v))[:80] if not v.resolved else ("suspicious" if v.suspicious else ""),
         f"{v.durations_s.get('total', 0):.1f}"]
        for v in sorted(summary.verdicts, key=lambda v: v.instance_id)
    ]  # fmt: skip
    out.print(grid(f"relearn verify -> {summary.output}", ["task", "patch", "resolved", "F2P", "P2P", "restored", "why not", "s"], rows))
    out.print(
        f"{len(summary.verdicts)} verified, {summary.resolved} resolved, {summary.skipped} already verified (skipped), {len(summary.errors)} errors"
        + (", graded with the network on" if summary.network else "")
    )
    if summary.network_needed:
        out.print(f"{summary.network_needed} graded unresolved with tests that needed the network: rerun with --network")
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("verify")(command(VerifyOptions, verify, doc=DOC))
