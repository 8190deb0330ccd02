"""``relearn envs gc``: relearn's orphaned containers and codex-cli networks, here or on every
node of a cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from relearn.ops.containers import docker_client, open_backend
from relearn.ops.reporting import SILENT, Reporter
from relearn.verbs.envs import GcOptions


@dataclass
class GcSummary:
    removed: list[str]  # containers removed here (no Ray address)
    networks: list[str]  # codex-cli networks removed here
    per_node: dict[str, list[str]] = field(default_factory=dict)  # node id -> containers removed there
    node_failures: dict[str, str] = field(default_factory=dict)  # node id -> why it could not sweep


def run_gc(options: GcOptions, reporter: Reporter = SILENT) -> GcSummary:
    from envs import docker_backend
    from envs.executor import Needs, RayBackend

    if options.ray is None:
        from harness.codex_cli.network import sweep_networks

        client = docker_client()
        removed = docker_backend.gc(client, everything=options.everything)
        return GcSummary(removed, sweep_networks(client, everything=options.everything))
    everything = options.everything
    with open_backend(options.ray, Needs()) as backend:
        assert isinstance(backend, RayBackend)  # an address always opens the cluster's backend
        reporter.note("sweeping the engine of every node (one pinned task per node)")
        answers = backend.on_every_node(lambda: docker_backend.gc(docker_backend.client_from_env(), everything=everything))
    summary = GcSummary([], [])
    for node, answer in sorted(answers.items()):
        if isinstance(answer, BaseException):
            summary.node_failures[node] = str(answer)
        else:
            summary.per_node[node] = list(answer)
    return summary
