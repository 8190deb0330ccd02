"""``relearn envs build-swebench``: SWE-bench instance images built offline (or, with --plan,
each instance's recipe)."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from relearn.ops.containers import container_limits, container_session
from relearn.ops.envs._engine import _here_only
from relearn.ops.envs._swebench import _source, _swebench_specs
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.envs import BuildSwebenchOptions

if TYPE_CHECKING:
    import docker

    from envs.docker_backend import Limits
    from envs.swebench_specs import InstallSpec
    from envs.tasks import Task


@dataclass
class SwebenchPlan:
    instance_id: str
    spec: InstallSpec
    python: str  # the version it would be built with
    debian_suite: str | None  # the suite that has that Python; None: --python-image is needed
    requirements: list[str]  # the repository's requirement lines at the base commit
    fetch: str  # the `relearn envs fetch-wheels` that fills its wheelhouse


@dataclass
class SwebenchImage:
    instance_id: str
    image: str
    recipe: str  # where the install recipe comes from
    spec_python: str
    python: str | None = None  # what it was built with; None: not built (already on the engine)
    contract: Literal["kept", "missing", "not checked", "already on the engine"] = "not checked"
    missing: list[str] = field(default_factory=list)  # what the contract check found missing
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class BuildSwebenchSummary:
    refused: list[str]  # "instance id: why the offline builder cannot build it"
    plans: list[SwebenchPlan] = field(default_factory=list)  # with options.plan
    images: list[SwebenchImage] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # builds that failed, images that break the contract


def run_build_swebench(options: BuildSwebenchOptions, reporter: Reporter = SILENT) -> BuildSwebenchSummary:
    _here_only("build-swebench", options.containers)
    if not options.ids:
        raise OpError("name the instances to build (--id, repeatable)")
    summary = BuildSwebenchSummary(refused=[])
    chosen, specs = _swebench_specs(options.tasks, options.ids, options.repo, options.containers, summary.refused)
    if not specs:
        return summary
    buildable = [t for t in chosen if t.instance_id in specs]
    with _source(options.repo, reporter) as source:
        if options.plan:
            summary.plans = [_plan(task, specs[task.instance_id], options, source) for task in buildable]
            return summary
        limits = container_limits(options.containers)
        with container_session(options.containers, reporter) as session, stage(reporter, "building SWE-bench images", len(buildable)):
            for task in buildable:
                image = _build_one(session.client, task, specs[task.instance_id], source, options, limits, reporter, summary.failures)
                if image is not None:
                    summary.images.append(image)
                reporter.advance()
    return summary


def _build_one(
    client: docker.DockerClient, task: Task, spec: InstallSpec, source: Path, options: BuildSwebenchOptions, limits: Limits,
    reporter: Reporter, failures: list[str],
) -> SwebenchImage | None:  # fmt: skip
    """One instance's image (None when its build failed, added to ``failures``)."""
    from envs.contract import check_image
    from envs.image_choice import instance_key, machine_arch
    from envs.images import image_exists
    from envs.swebench_build import BuildFailed, build_instance_image
    from envs.swebench_specs import Unsupported

    tag = task.image or f"sweb.eval.{machine_arch()}.{instance_key(task.instance_id)}:latest"
    row = SwebenchImage(task.instance_id, tag, spec.source, spec.python)
    if image_exists(client, tag) and not options.force:
        row.contract = "already on the engine"
        return row
    try:
        built = build_instance_image(
            client, task, spec, source=source, tag=tag, wheels=options.wheels, python=options.python, python_image=options.python_image,
            memory_mb=limits.memory_mb, log=reporter.note,
        )  # fmt: skip
    except (BuildFailed, Unsupported) as exc:
        failures.append(f"{task.instance_id}: {exc}{_removed(client, tag)}")
        return None
    row.python, row.seconds = built.python, built.seconds
    if options.check:
        started = time.monotonic()
        report = check_image(client, task, tag, task.eval_script or "", limits=limits)
        row.seconds["contract check"] = time.monotonic() - started
        row.contract, row.missing = ("kept", []) if report.ok else ("missing", report.missing())
        if not report.ok:
            failures.append(
                f"{task.instance_id}: the built image does not keep the contract: {'; '.join(row.missing)}{_removed(client, tag)}"
            )
    return row


def _removed(client: docker.DockerClient, tag: str) -> str:
    """Take a failed build's image off its official name, so that nothing (verify, the next
    build's "already on the engine") takes it for a good one."""
    from envs.images import image_exists

    if not image_exists(client, tag):
        return ""
    client.images.remove(tag, force=True)
    return f" (image {tag} removed)"


def _plan(task: Task, spec: InstallSpec, options: BuildSwebenchOptions, source: Path) -> SwebenchPlan:
    from envs.swebench_build import requirements_text
    from envs.swebench_specs import DEBIAN_PYTHON

    version = options.python or spec.python
    requirements = requirements_text(source, spec, task)
    words = ["relearn", "envs", "fetch-wheels", "--tasks", options.tasks, "--id", task.instance_id, "--repo", options.repo or "REPO"]
    words += ["--wheels", str(options.wheels) if options.wheels else "WHEELS"]
    if options.python:
        words += ["--python", options.python]
    if options.python_image:
        words += ["--python-image", options.python_image]
    return SwebenchPlan(
        task.instance_id,
        spec,
        version,
        DEBIAN_PYTHON.get(version),
        requirements.strip().splitlines(),
        " ".join(shlex.quote(w) for w in words),
    )
