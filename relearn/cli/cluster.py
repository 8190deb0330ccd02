"""What fan-out verbs share: ``--ray`` for those whose flags are still written by hand (the others
declare it with ``relearn.ops.containers.RAY_HELP``), and the per-node summary a verb prints."""

from __future__ import annotations

from typing import Annotated

import typer

from relearn.cli.output import err
from relearn.ops.containers import RAY_HELP

RayArg = Annotated[str | None, typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)]


def show_nodes(per_node: dict[str, int], what: str) -> None:
    """Units finished by node, when they ran on a cluster."""
    if per_node and set(per_node) != {"local"}:
        err.print(f"{what} by node: " + ", ".join(f"{node[:12]} {count}" for node, count in sorted(per_node.items())))
