"""The option every fan-out verb shares: ``--ray ADDRESS`` runs its work units on a Ray
cluster instead of this machine (envs.executor), the per-node counts its progress bar
shows as units finish, and the per-node summary it prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import ProgressColumn, Task
from rich.text import Text

from envs.executor import Backend, ClusterError, Needs, RayBackend
from relearn.cli.output import EXIT_USAGE, err, show_problems

if TYPE_CHECKING:
    import docker

    from envs.image_choice import ImageChoice
    from envs.images import Prepared
    from envs.tasks import Task

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


class NodesColumn(ProgressColumn):
    """Units finished so far by node, while a stage runs on a cluster (empty otherwise)."""

    def __init__(self) -> None:
        super().__init__()
        self.backend: RayBackend | None = None

    def per_node(self) -> dict[str, int]:
        return self.backend.per_node if self.backend is not None else {}

    def render(self, task: Task) -> Text:
        return Text(nodes_text(self.per_node()), style="dim")


def nodes_text(per_node: dict[str, int]) -> str:
    return ", ".join(f"node {node[:8]}: {count}" for node, count in sorted(per_node.items()))


def ray_backend(address: str | None, needs: Needs, nodes: NodesColumn | None = None) -> Backend | None:
    """None without --ray; else the cluster's backend (whose counts ``nodes`` shows), or a
    usage error that says why not."""
    if address is None:
        return None
    try:
        backend = RayBackend(None if address == "local" else address, needs)
    except (ClusterError, ConnectionError, RuntimeError, ValueError) as exc:
        err.print(f"[red]error:[/red] --ray {address}: {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    if nodes is not None:
        nodes.backend = backend
    return backend


def show_nodes(per_node: dict[str, int], what: str) -> None:
    """Units finished by node, when they ran on a cluster."""
    if per_node and set(per_node) != {"local"}:
        err.print(f"{what} by node: " + ", ".join(f"{node[:12]} {count}" for node, count in sorted(per_node.items())))


def prepare_tasks(
    client: docker.DockerClient, tasks: list[Task], choice: ImageChoice, *, pull: bool, need_base: bool, registry: str | None
) -> Prepared:
    """A verb's images before its units run: without ``registry``, routed, pulled (--pull)
    and the base built here when a task needs it (relearn.cli.image_options.prepare); with
    one, only routed: whoever runs a unit pulls its image from the registry."""
    from envs.images import prepare_images
    from relearn.cli.image_options import prepare

    if registry is None:
        return prepare(client, tasks, choice, pull=pull, need_base=need_base)
    prepared = prepare_images(
        client, tasks, choice, need_base=need_base, log=lambda m: err.print(f"[dim]{m}[/dim]", highlight=False), registry=registry
    )
    show_problems("images", prepared.problems)
    return prepared
