"""The options every fan-out verb shares: ``--ray ADDRESS`` runs its work units on a Ray
cluster instead of this machine (the operations open it: ``relearn.ops.containers.open_backend``),
``--registry`` where the nodes pull images from; and the per-node summary a verb prints."""

from __future__ import annotations

from typing import Annotated

import typer

from relearn.cli.output import err

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

RegistryArg = Annotated[
    str | None,
    typer.Option(
        "--registry",
        metavar="HOST[/NAMESPACE]",
        help="Where a machine that lacks a task's image pulls it from, instead of building it: image NAME:TAG is pulled as HOST/NAMESPACE/NAME:TAG (a registry host in NAME is dropped) and tagged NAME:TAG there. "
        "Push the images there first (docker tag NAME:TAG HOST/NS/NAME:TAG; docker push HOST/NS/NAME:TAG). With --ray, every node pulls what it lacks; this machine builds nothing.",
    ),
]


def show_nodes(per_node: dict[str, int], what: str) -> None:
    """Units finished by node, when they ran on a cluster."""
    if per_node and set(per_node) != {"local"}:
        err.print(f"{what} by node: " + ", ".join(f"{node[:12]} {count}" for node, count in sorted(per_node.items())))
