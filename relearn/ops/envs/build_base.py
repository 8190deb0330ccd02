"""``relearn envs build-base``: the offline base image."""

from __future__ import annotations

from dataclasses import dataclass

from relearn.ops.containers import docker_client
from relearn.ops.envs._engine import _base_failed
from relearn.ops.reporting import SILENT, Reporter
from relearn.options import option


@dataclass
class BuildBaseOptions:
    """Build the offline base image: debootstrap (minbase + python3, pytest, git, patch) and docker import.

    Cached by tag: the tag names the Debian suite and package list.
    """

    force: bool = option(False, "Rebuild even if the image exists.")


@dataclass
class BuildBaseSummary:
    image: str


def run_build_base(options: BuildBaseOptions, reporter: Reporter = SILENT) -> BuildBaseSummary:
    from envs.images import build_base

    client = docker_client()
    try:
        return BuildBaseSummary(build_base(client, force=options.force, log=reporter.note))
    except RuntimeError as exc:
        raise _base_failed(exc, reporter) from None
