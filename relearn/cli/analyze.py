"""``relearn analyze nll`` (compatibility) and ``relearn analyze passk`` (complementarity) over
pools named ``--pool NAME=PATH``. The flags are ``NllOptions``' and ``PasskOptions``' fields
(``relearn.ops.analyze``); the tables are ``relearn.analyze.tables``'."""

from __future__ import annotations

import dataclasses
import inspect

import typer

from relearn.analyze.pools import NamedPool, PoolSpecError, parse_pools
from relearn.analyze.tables import nll_tables, passk_tables
from relearn.cli.cluster import show_nodes
from relearn.cli.declared import command, parameter
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, run_op, show_problems
from relearn.ops.analyze import NllOptions, PasskOptions, run_nll, run_passk
from relearn.ops.reporting import SILENT, OpError, RichReporter
from relearn.options import options_of

HELP = "Compare pools of trajectories: compatibility with a model (nll) and complementarity of what they solve (passk)."
NLL_DOC = """Compatibility: token-level NLL of each pool's eligible tokens under one model.

Each trajectory is rendered over the chat template and scored on its eligible tokens A (generated assistant turns, as `relearn masks` finds them; defects are not removed), everything else staying as context. Per pool: NLL per token (token-weighted, 95% bootstrap CI), perplexity, the distribution of per-trajectory means (mean with CI, median, p10-p90) and the difference from the first pool. Lower means more compatible: historical rollouts of the same policy line, current-policy rollouts and an external teacher's can be compared side by side. Scores are cached in --out; a rerun is free.

With --reviews, each trajectory's eligible tokens are also split by the ROSS mask its latest review gives: kept (A \\ E, what ROSS trains on) and excluded (E), with the NLL of each, of each defect category's excluded tokens and of the excluded - kept gap (95% bootstrap over trajectories). A trajectory the review rejects, or that the mask compiler refuses, is scored but not split, and counted by reason; one whose latest review line is unreadable is listed too (never split by an earlier review). A changed review is split again; everything else comes from the cache.

With --workers N (CPU) or --ray ADDRESS, batches of trajectories are scored by worker processes or on a Ray cluster's nodes (--device cuda: each unit asks Ray for a GPU, and this machine needs none); each worker process loads the model once. Only this process writes the score cache and the results, which equal a run here.
"""
PASSK_DOC = """Complementarity: per-problem success rates, unbiased pass@k curves, problems solved by one pool only.

Success is the verifier's (resolved, or a positive reward); trajectories without a verifier result or a task_id are rejected and listed, never counted as failures. Over the problems all pools attempted: problems solved only by each pool, and by any; for each pair of pools, problems solved by both, only one, or neither.
"""


def pool_flag(cls: type) -> inspect.Parameter:
    """``--pool NAME=PATH`` as typed (typer knows no ``NamedPool``): the verb names the pools."""
    (pools,) = [o for o in options_of(cls) if o.name == "pools"]
    return parameter(dataclasses.replace(pools, type=list[str]))


def named_pools(specs: list[str]) -> list[NamedPool]:
    try:
        return parse_pools(specs)
    except PoolSpecError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None


def nll(options: NllOptions, pools: list[str]) -> None:
    options.pools = named_pools(pools)
    try:
        summary = run_nll(options, RichReporter(err) if options.progress else SILENT)
    except (OpError, RuntimeError) as exc:  # RuntimeError: a batch a worker could not score
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE if isinstance(exc, OpError) else EXIT_PARTIAL) from None
    show_nodes(summary.per_node, "NLL batches")
    show_problems("rejected", summary.rejected)
    show_problems("unreadable reviews", summary.review_problems)
    for shown in nll_tables(summary.result, split=options.reviews is not None):
        out.print(shown)
    out.print(f"written: {options.out / 'nll.md'}, {options.out / 'nll.json'}, {options.out / 'nll.png'}")
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def passk(options: PasskOptions, pools: list[str]) -> None:
    options.pools = named_pools(pools)
    summary = run_op(run_passk, options)
    show_problems("rejected", summary.rejected)
    for shown in passk_tables(summary.result):
        out.print(shown)
    out.print(f"written: {options.out / 'passk.md'}, {options.out / 'passk.json'}, {options.out / 'passk.png'}")
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help=HELP, no_args_is_help=True)
    group.command("nll")(command(NllOptions, nll, doc=NLL_DOC, skip=["pools"], extra=[pool_flag(NllOptions)]))
    group.command("passk")(command(PasskOptions, passk, doc=PASSK_DOC, skip=["pools"], extra=[pool_flag(PasskOptions)]))
    app.add_typer(group, name="analyze")
