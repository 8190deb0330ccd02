"""``relearn envs fetch-wheels``: the wheelhouse ``relearn envs build-swebench --wheels`` installs from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from relearn.ops.containers import ContainerOptions, docker_client
from relearn.ops.envs._engine import _here_only
from relearn.ops.envs._swebench import _source, _swebench_specs
from relearn.ops.envs.build_swebench import BuildSwebenchOptions
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.options import option, same_as

if TYPE_CHECKING:
    from envs.wheelhouse import FetchResult


@dataclass
class FetchWheelsOptions:
    """Fill the wheelhouse that `relearn envs build-swebench --wheels` installs from offline, where PyPI answers.

    pip runs inside a container of the image's own base (the Debian suite with the instance's Python, or --python-image), so
    environment markers and wheel tags are the image's, and downloads what each install step of the build asks for, in the
    build's order: pip, setuptools and wheel; the repository's requirements file; the spec's packages and pins; the repository's
    own dependencies at the base commit, for the extras its install names; its build backend. Versions the spec leaves open are
    taken as of the environment-setup commit's date. Sdists are built into wheels there, those that compile C again with Debian's
    compiler; one that builds nowhere gives way to its project's newest wheel. The container reaches the index through this
    machine's proxy settings and certificates (PIP_CERT, REQUESTS_CA_BUNDLE or SSL_CERT_FILE).

    The wheelhouse's relearn-wheelhouse.lock.json lists every file with its sha256 and, per instance, the Python pip ran on, the
    era, the build tools, how each step resolved and the sdists built or replaced (docs/swebench.md). Exits 1 when an instance
    failed or an sdist could not be made a wheel.
    """

    tasks: str = same_as(BuildSwebenchOptions, "tasks")
    ids: list[str] = option(help="Instances whose wheelhouse to fill (repeatable).", flags=("--id", "-i"), metavar="ID")
    wheels: Path = option(help="The wheelhouse to fill (made when missing); instances may share one.", metavar="DIR")
    repo: str | None = same_as(BuildSwebenchOptions, "repo")
    python: str | None = option(
        None, "Resolve for this Python version instead of the instance's (as build-swebench --python).", metavar="VERSION"
    )
    python_image: str | None = option(
        None, "Run pip in this image (as build-swebench --python-image) instead of a Debian suite's.", metavar="IMAGE"
    )
    era: bool = option(
        True,
        "Take versions the spec leaves open as of the environment-setup commit's date (pip --uploaded-prior-to); --no-era takes the newest.",
    )
    # The verb runs on this machine's engine with its defaults: it takes no image or limit options.
    containers: ContainerOptions = field(default_factory=ContainerOptions)


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
