"""What several ``relearn envs`` verbs share about this machine's engine: ``_here_only`` (a
cluster address or registry refused) and ``_base_failed`` (a failed base-image build, worded)."""

from __future__ import annotations

from relearn.ops.reporting import OpError, Reporter
from relearn.verbs.containers import ContainerOptions


def _here_only(verb: str, containers: ContainerOptions) -> None:
    """These verbs run on this engine: a cluster address or registry would be silently ignored."""
    if containers.ray is not None or containers.registry is not None:
        raise OpError(f"relearn envs {verb} runs on this machine's engine; it takes no Ray address or registry")


def _base_failed(exc: RuntimeError, reporter: Reporter) -> OpError:
    """debootstrap missing or failing: the first line says what, the log's tail goes to the notes."""
    first, _, tail = str(exc).partition("\n")
    if tail:
        reporter.note(tail)
    return OpError(f"base image: {first}")
