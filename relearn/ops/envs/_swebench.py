"""What ``relearn envs build-swebench`` and ``fetch-wheels`` share: the chosen SWE-bench rows' install
recipes (``_swebench_specs``) and the checkout of their repository (``_source``)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from relearn.ops.containers import image_choice, load_task_list
from relearn.ops.reporting import OpError, Reporter
from relearn.verbs.containers import ContainerOptions

if TYPE_CHECKING:
    from envs.swebench_specs import InstallSpec
    from envs.tasks import Task


def _swebench_specs(
    tasks: str, ids: list[str], repo: str | None, containers: ContainerOptions, refused: list[str]
) -> tuple[list[Task], dict[str, InstallSpec]]:
    """The chosen rows (named as the images will be) and the install recipe of each one the
    offline builder supports; the others are added to ``refused`` with the reason."""
    from envs.swebench_specs import Unsupported, install_spec

    chosen, _unreadable = load_task_list(tasks, ids)
    chosen = image_choice(containers).route(chosen)
    repos = sorted({t.repo for t in chosen})
    if len(repos) > 1:
        raise OpError(f"--repo is one repository, and these instances come from {', '.join(repos)}: take each repository's apart")
    if repo is None:
        raise OpError(f"give --repo: a checkout of {repos[0]} (or its clone URL when online)")
    specs: dict[str, InstallSpec] = {}
    for task in chosen:
        try:
            specs[task.instance_id] = install_spec(task)
        except Unsupported as exc:
            refused.append(f"{task.instance_id}: {exc}")
    return chosen, specs


@contextmanager
def _source(repo: str, reporter: Reporter) -> Iterator[Path]:
    from envs.swebench_build import BuildFailed, source_repository

    with tempfile.TemporaryDirectory(prefix="relearn-src-") as tmp:
        try:
            source = source_repository(repo, Path(tmp), log=reporter.note)
        except BuildFailed as exc:
            raise OpError(str(exc)) from None
        yield source
