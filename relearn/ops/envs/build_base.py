"""``relearn envs build-base``: the offline base image."""

from __future__ import annotations

from dataclasses import dataclass

from relearn.ops.containers import docker_client
from relearn.ops.envs._engine import _base_failed
from relearn.ops.reporting import SILENT, Reporter
from relearn.verbs.envs import BuildBaseOptions


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
