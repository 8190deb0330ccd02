"""``relearn envs load``: image tarballs into the engine (docker load)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from relearn.ops.containers import docker_client, image_choice, load_task_list
from relearn.ops.envs._engine import _here_only
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.envs import LoadOptions


@dataclass
class LoadedArchive:
    archive: str
    images: list[str]
    seconds: float


@dataclass
class LoadSummary:
    loaded: list[LoadedArchive]
    failures: list[str]  # "tarball: the engine's answer"
    tasks: int  # tasks checked (0 without options.tasks)
    missing: list[str]  # "instance id: image" still not on the engine
    unreadable: list[str]


def run_load(options: LoadOptions, reporter: Reporter = SILENT) -> LoadSummary:
    from envs.images import image_exists
    from envs.registry import ARCHIVE_SUFFIXES, image_archives, load_archive

    _here_only("load", options.containers)
    choice = image_choice(options.containers)
    try:
        archives = image_archives(options.path)
    except FileNotFoundError as exc:
        raise OpError(str(exc)) from None
    if not archives:
        raise OpError(f"no image tarballs in {options.path} (looked for {', '.join(ARCHIVE_SUFFIXES)})")
    chosen, unreadable = load_task_list(options.tasks, options.ids) if options.tasks is not None else ([], [])
    client = docker_client()
    loaded: list[LoadedArchive] = []
    failures: list[str] = []
    with stage(reporter, "docker load", len(archives)):
        for archive in archives:
            started = time.monotonic()
            reporter.note(f"docker load < {archive.name}")
            try:
                names = load_archive(client, archive)
            except Exception as exc:  # the engine's answer to a bad tarball, a full disk: name the file, go on
                failures.append(f"{archive}: {exc}")
            else:
                loaded.append(LoadedArchive(archive.name, names, time.monotonic() - started))
            reporter.advance()
    routed = choice.route(chosen)
    missing = [f"{t.instance_id}: {t.image}" for t in routed if t.image and not image_exists(client, t.image)]
    return LoadSummary(loaded, failures, len(routed), missing, unreadable)
