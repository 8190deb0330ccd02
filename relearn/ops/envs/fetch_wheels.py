"""``relearn envs fetch-wheels``: the wheelhouse ``relearn envs build-swebench --wheels`` installs from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relearn.ops.containers import docker_client
from relearn.ops.envs._engine import _here_only
from relearn.ops.envs._swebench import _source, _swebench_specs
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.envs import FetchWheelsOptions

if TYPE_CHECKING:
    from envs.wheelhouse import FetchResult


@dataclass
class FetchWheelsSummary:
    refused: list[str]
    fetched: list[FetchResult] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    files: int = 0  # distributions the wheelhouse holds at the end


def run_fetch_wheels(options: FetchWheelsOptions, reporter: Reporter = SILENT) -> FetchWheelsSummary:
    from envs.swebench_build import BuildFailed
    from envs.swebench_specs import Unsupported
    from envs.wheelhouse import fetch_wheels

    _here_only("fetch-wheels", options.containers)
    if not options.ids:
        raise OpError("name the instances whose wheels to fetch (--id, repeatable)")
    if options.wheels.exists() and not options.wheels.is_dir():
        raise OpError(f"--wheels {options.wheels}: not a folder")
    summary = FetchWheelsSummary(refused=[])
    chosen, specs = _swebench_specs(options.tasks, options.ids, options.repo, options.containers, summary.refused)
    wanted = [t for t in chosen if t.instance_id in specs]
    if not wanted:
        return summary
    with _source(options.repo or "", reporter) as source:
        client = docker_client()
        with stage(reporter, "filling the wheelhouse", len(wanted)):
            for task in wanted:
                try:
                    result = fetch_wheels(
                        client, task, specs[task.instance_id], source=source, wheels=options.wheels, python=options.python,
                        python_image=options.python_image, era=options.era, log=reporter.note,
                    )  # fmt: skip
                except (BuildFailed, Unsupported, RuntimeError) as exc:
                    summary.failures.append(f"{task.instance_id}: {exc}")
                else:
                    summary.fetched.append(result)
                    summary.files = result.files
                    summary.failures += [f"{task.instance_id}: {line}" for line in result.unbuilt]
                reporter.advance()
    return summary
