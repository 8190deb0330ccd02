"""``relearn analyze nll`` (compatibility) and ``relearn analyze passk`` (complementarity) over
pools named ``--pool NAME=PATH``. The flags are ``NllOptions``' and ``PasskOptions``' fields
(``relearn.verbs.analyze``); the tables are ``relearn.analyze.tables``'."""

from __future__ import annotations

import dataclasses
import inspect

import typer

from relearn.analyze.pools import NamedPool, PoolSpecError, parse_pools
from relearn.analyze.tables import nll_tables, passk_tables
from relearn.cli.declared import command, parameter
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, run_op, show_nodes, show_problems
from relearn.ops.analyze import run_nll, run_passk
from relearn.ops.reporting import SILENT, OpError, RichReporter
from relearn.options import options_of
from relearn.verbs.analyze import NllOptions, PasskOptions

HELP = "Compare pools of trajectories: compatibility with a model (nll) and complementarity of what they solve (passk)."


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
    group.command("nll")(command(NllOptions, nll, skip=["pools"], extra=[pool_flag(NllOptions)]))
    group.command("passk")(command(PasskOptions, passk, skip=["pools"], extra=[pool_flag(PasskOptions)]))
    app.add_typer(group, name="analyze")
