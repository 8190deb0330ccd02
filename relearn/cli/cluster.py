"""The option every fan-out verb shares: ``--ray ADDRESS`` runs its work units on a Ray
cluster instead of this machine (envs.executor), and the per-node summary it prints."""

from __future__ import annotations

from typing import Annotated

import typer

from envs.executor import Backend, ClusterError, Needs, RayBackend
from relearn.cli.output import EXIT_USAGE, err

RayArg = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="Run the work units on a Ray cluster: auto joins the cluster `ray start` runs on this machine, HOST:PORT (or ray://HOST:PORT) a remote head, local starts a throwaway one here. "
        "Container work asks each node for the custom resource docker (start a node with --resources '{\"docker\": N}' to run N containers at once on its engine). "
        "Only this process writes the output files. Without --ray, everything runs here (--workers).",
    ),
]


def ray_backend(address: str | None, needs: Needs) -> Backend | None:
    """None without --ray; else the cluster's backend, or a usage error that says why not."""
    if address is None:
        return None
    try:
        return RayBackend(None if address == "local" else address, needs)
    except (ClusterError, ConnectionError, RuntimeError, ValueError) as exc:
        err.print(f"[red]error:[/red] --ray {address}: {exc}")
        raise typer.Exit(EXIT_USAGE) from None


def show_nodes(per_node: dict[str, int], what: str) -> None:
    """Units finished by node, when they ran on a cluster."""
    if per_node and set(per_node) != {"local"}:
        err.print(f"{what} by node: " + ", ".join(f"{node[:12]} {count}" for node, count in sorted(per_node.items())))
