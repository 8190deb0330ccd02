"""``relearn envs``: the task images and the engine they run on.

One operation per verb: ``run_build_base``, ``run_build`` (the task images), ``run_audit``
(images whose .git exposes the fix) and ``run_audit_verdicts`` (what the verifier did beyond
grading), ``run_gc`` (orphaned containers, here or on every node of a cluster), ``run_load``
(image tarballs), ``run_check_image`` (the image contract) and ``run_build_swebench`` (SWE-bench
instance images built offline). Those that start containers do it through
``relearn.ops.containers``: the engine with last run's orphans swept, images routed by the
image map or template, the containers' limits, SIGTERM unwinding like Ctrl-C.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from records.pools import JsonlWriter
from relearn.ops.containers import ContainerOptions, container_session, docker_client, load_task_list, open_backend
from relearn.ops.outputs import RELEARN_RECORD, JsonlKind, check_jsonl_output
from relearn.ops.reporting import SILENT, OpError, Reporter, check_writable, stage

if TYPE_CHECKING:
    import docker

    from envs.contract import ContractReport
    from envs.docker_backend import Limits
    from envs.swebench_specs import InstallSpec
    from envs.tasks import Task
    from envs.wheelhouse import FetchResult


def _here_only(verb: str, containers: ContainerOptions) -> None:
    """These verbs run on this engine: a cluster address or registry would be silently ignored."""
    if containers.ray is not None or containers.registry is not None:
        raise OpError(f"relearn envs {verb} runs on this machine's engine; it takes no Ray address or registry")


# --- build-base, build ------------------------------------------------------------------------


@dataclass
class BuildBaseOptions:
    force: bool = False  # rebuild even when the tag is on the engine


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


def _base_failed(exc: RuntimeError, reporter: Reporter) -> OpError:
    """debootstrap missing or failing: the first line says what, the log's tail goes to the notes."""
    first, _, tail = str(exc).partition("\n")
    if tail:
        reporter.note(tail)
    return OpError(f"base image: {first}")


@dataclass
class BuildOptions:
    tasks: str = "mini"  # a task file or folder, or `mini` (the bundled suite)
    ids: list[str] = field(default_factory=list)  # only these instance ids; empty: every task
    leaky: bool = False  # mini suite: also commit the fix into .git history (to exercise the audit)


@dataclass
class BuildSummary:
    images: list[tuple[str, str]]  # (instance id, image) built or found on the engine
    failures: list[str]  # "instance id: why"
    unreadable: list[str]  # task records that could not be read


def run_build(options: BuildOptions, reporter: Reporter = SILENT) -> BuildSummary:
    from envs.images import task_image

    chosen, unreadable = load_task_list(options.tasks, options.ids)
    client = docker_client()
    base = _base(client, chosen, reporter)
    images: list[tuple[str, str]] = []
    failures: list[str] = []
    with stage(reporter, "building task images", len(chosen)):
        for task in chosen:
            try:
                images.append((task.instance_id, task_image(client, task, base, leaky=options.leaky)))
            except (RuntimeError, ValueError) as exc:
                failures.append(f"{task.instance_id}: {exc}")
            reporter.advance()
    return BuildSummary(images, failures, unreadable)


def _base(client: docker.DockerClient, tasks: list[Task], reporter: Reporter) -> str | None:
    """The base image, built when a bundled mini task needs it."""
    from envs.images import base_if_needed

    try:
        return base_if_needed(client, tasks, log=reporter.note)
    except RuntimeError as exc:
        raise _base_failed(exc, reporter) from None


# --- audit --------------------------------------------------------------------------------------


# What `relearn envs audit -o` appends to (envs.audit.AuditRecord lines; a verdicts file, whose
# lines have instance_id too, carries schema_version and is refused).
AUDIT_RECORDS = JsonlKind("an audit file of `relearn envs audit -o`", frozenset({"instance_id", "verdict"}), RELEARN_RECORD)


@dataclass
class AuditOptions:
    tasks: str = "mini"  # a task file or folder, or `mini` (the bundled suite)
    ids: list[str] = field(default_factory=list)
    leaky: bool = False  # mini suite: audit the deliberately leaky builds
    containers: ContainerOptions = field(default_factory=ContainerOptions)  # image map/template, pull, cpus, memory
    output: Path | None = None  # JSON Lines, one envs.audit.AuditRecord per task, appended as audited (`relearn masks --audit`)


@dataclass
class ImageAudit:
    instance_id: str
    image: str | None  # None: the image could not be had
    verdict: Literal["exposed", "clean", "error"]
    why: str


@dataclass
class AuditSummary:
    audits: list[ImageAudit]
    unreadable: list[str]  # task records that could not be read
    image_problems: list[str]  # what preparing the images (pulls) could not do

    @property
    def exposed(self) -> int:
        return sum(a.verdict == "exposed" for a in self.audits)

    @property
    def unavailable(self) -> int:
        return sum(a.image is None for a in self.audits)


def run_audit(options: AuditOptions, reporter: Reporter = SILENT) -> AuditSummary:
    from envs.audit import audit
    from envs.images import task_image

    _here_only("audit", options.containers)
    limits = options.containers.limits()
    chosen, unreadable = load_task_list(options.tasks, options.ids)
    audits: list[ImageAudit] = []
    if options.output is not None:
        check_jsonl_output(options.output, AUDIT_RECORDS, flag="--output")
        check_writable(options.output, "--output", appended=True)
    with container_session(options.containers, reporter) as session, _audit_writer(options.output) as write:
        prepared = session.prepare(chosen, need_base=False)  # builds the base when a mini task needs it
        with stage(reporter, "auditing task images", len(prepared.tasks)):
            for task in prepared.tasks:
                try:
                    image = task_image(session.client, task, prepared.base, leaky=options.leaky)
                except (RuntimeError, ValueError) as exc:
                    audits.append(ImageAudit(task.instance_id, None, "error", str(exc)))
                else:
                    report = audit(session.client, task, image, limits=limits)
                    verdict = "exposed" if report.flagged else ("error" if report.error else "clean")
                    audits.append(ImageAudit(task.instance_id, image, verdict, "; ".join(report.reasons()) or (report.error or "")))
                write(audits[-1])
                reporter.advance()
    return AuditSummary(audits, unreadable, prepared.problems)


@contextmanager
def _audit_writer(path: Path | None) -> Iterator[Callable[[ImageAudit], None]]:
    """Append each task's audit to ``path`` as it is made (nothing when None)."""
    if path is None:
        yield lambda _audit: None
        return
    with JsonlWriter(path) as writer:
        yield lambda audit: writer.write(asdict(audit))


@dataclass
class VerdictAuditOptions:
    verdicts: Path  # verdicts JSONL (`relearn verify -o`)


@dataclass
class VerdictNotes:
    instance_id: str
    patch_hash: str
    resolved: bool
    notes: list[str]  # "refused: ...", "restored: FILE", "neutralized: ...", "disagreement: ...", "suspicious: ..."
    flagged: bool  # refused, contradicted or suspicious (restored and neutralized alone are not)


@dataclass
class VerdictAuditSummary:
    noted: list[VerdictNotes]  # only the verdicts the verifier did something to
    verdicts: int  # read in all
    unreadable: list[str]  # "file:line: not a verdict: why"

    @property
    def flagged(self) -> int:
        return sum(n.flagged for n in self.noted)


def run_audit_verdicts(options: VerdictAuditOptions, reporter: Reporter = SILENT) -> VerdictAuditSummary:
    from envs.verify import Verdict
    from records.pools import iter_lines

    if not options.verdicts.is_file():
        raise OpError(f"{options.verdicts}: no such verdicts file")
    noted: list[VerdictNotes] = []
    unreadable: list[str] = []
    total = 0
    with stage(reporter, "reading verdicts"):
        for number, text in iter_lines(options.verdicts):
            reporter.advance()
            try:
                verdict = Verdict.model_validate_json(text)
            except ValueError as exc:
                unreadable.append(f"{options.verdicts}:{number}: not a verdict: {str(exc).splitlines()[0]}")
                continue
            total += 1
            notes = [f"refused: {r}" for r in verdict.refused] + [f"restored: {f}" for f in verdict.restored_files]
            notes += [f"neutralized: {n}" for n in verdict.neutralized] + [f"disagreement: {d}" for d in verdict.disagreements]
            notes += [f"suspicious: {s}" for s in verdict.suspicious]
            if notes:
                flagged = bool(verdict.refused or verdict.disagreements or verdict.suspicious)
                noted.append(VerdictNotes(verdict.instance_id, verdict.patch_hash, verdict.resolved, notes, flagged))
    return VerdictAuditSummary(noted, total, unreadable)


# --- gc -----------------------------------------------------------------------------------------


@dataclass
class GcOptions:
    everything: bool = False  # every relearn container, not only orphans
    ray: str | None = None  # a Ray address: sweep the engine of every node


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


# --- load ---------------------------------------------------------------------------------------


@dataclass
class LoadOptions:
    path: Path  # a folder of image tarballs (docker save), or one tarball
    tasks: str | None = None  # then say which of these tasks have their image
    ids: list[str] = field(default_factory=list)
    containers: ContainerOptions = field(default_factory=ContainerOptions)  # its image map/template route the tasks


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
    choice = options.containers.choice()
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


# --- check-image --------------------------------------------------------------------------------


@dataclass
class CheckImageOptions:
    image: str | None = None  # check this image against the one selected task; None: each task's own
    tasks: str = "mini"  # a task file or folder, or `mini` (the bundled suite)
    ids: list[str] = field(default_factory=list)
    containers: ContainerOptions = field(default_factory=ContainerOptions)


@dataclass
class ImageCheck:
    instance_id: str
    image: str
    report: ContractReport | None  # None: the image could not be had (``error`` says why)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok


@dataclass
class CheckImageSummary:
    checks: list[ImageCheck]
    unreadable: list[str]
    image_problems: list[str]

    @property
    def failed(self) -> int:
        return sum(not c.ok for c in self.checks)


def run_check_image(options: CheckImageOptions, reporter: Reporter = SILENT) -> CheckImageSummary:
    from envs.contract import check_image
    from envs.images import task_image
    from envs.verify import mini_eval_script

    _here_only("check-image", options.containers)
    limits = options.containers.limits()
    chosen, unreadable = load_task_list(options.tasks, options.ids)
    if options.image is not None:
        if len(chosen) != 1:
            raise OpError(f"IMAGE is checked against one task: pick it with --id ({len(chosen)} selected)")
        chosen = [chosen[0].model_copy(update={"image": options.image, "image_source": "the command line"})]
    checks: list[ImageCheck] = []
    with container_session(options.containers, reporter) as session:
        prepared = session.prepare(chosen, need_base=False)
        with stage(reporter, "checking images", len(prepared.tasks)):
            for task in prepared.tasks:
                try:
                    name = task_image(session.client, task, prepared.base)
                except (RuntimeError, ValueError) as exc:
                    checks.append(ImageCheck(task.instance_id, task.image or "", None, str(exc)))
                    reporter.advance()
                    continue
                script = task.eval_script or mini_eval_script(task, task.base_commit or "HEAD")
                checks.append(ImageCheck(task.instance_id, name, check_image(session.client, task, name, script, limits=limits)))
                reporter.advance()
    return CheckImageSummary(checks, unreadable, prepared.problems)


# --- build-swebench -----------------------------------------------------------------------------


@dataclass
class BuildSwebenchOptions:
    tasks: str  # SWE-bench rows (.parquet/.jsonl/.json)
    ids: list[str]  # the instances to build
    repo: str | None = None  # a checkout or mirror holding the base commits, or a clone URL (online)
    wheels: Path | None = None  # a wheelhouse pip installs from, offline; None: PyPI during the build
    python: str | None = None  # build with this Python version instead of the instance's
    python_image: str | None = None  # build FROM this image instead of a Debian suite
    force: bool = False  # rebuild an image already on the engine
    check: bool = True  # check each built image against the contract
    plan: bool = False  # only say each instance's recipe and the `pip download` for its wheelhouse
    containers: ContainerOptions = field(default_factory=ContainerOptions)  # image map/template name the images; memory limits the build


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
    if options.wheels is not None and not options.wheels.is_dir():
        raise OpError(f"--wheels {options.wheels}: no such folder")
    summary = BuildSwebenchSummary(refused=[])
    chosen, specs = _swebench_specs(options.tasks, options.ids, options.repo, options.containers, summary.refused)
    if not specs:
        return summary
    buildable = [t for t in chosen if t.instance_id in specs]
    with _source(options.repo, reporter) as source:
        if options.plan:
            summary.plans = [_plan(task, specs[task.instance_id], options, source) for task in buildable]
            return summary
        limits = options.containers.limits()
        with container_session(options.containers, reporter) as session, stage(reporter, "building SWE-bench images", len(buildable)):
            for task in buildable:
                image = _build_one(session.client, task, specs[task.instance_id], source, options, limits, reporter, summary.failures)
                if image is not None:
                    summary.images.append(image)
                reporter.advance()
    return summary


def _swebench_specs(
    tasks: str, ids: list[str], repo: str | None, containers: ContainerOptions, refused: list[str]
) -> tuple[list[Task], dict[str, InstallSpec]]:
    """The chosen rows (named as the images will be) and the install recipe of each one the
    offline builder supports; the others are added to ``refused`` with the reason."""
    from envs.swebench_specs import Unsupported, install_spec

    chosen, _unreadable = load_task_list(tasks, ids)
    chosen = containers.choice().route(chosen)
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


# --- fetch-wheels -------------------------------------------------------------------------------


@dataclass
class FetchWheelsOptions:
    tasks: str  # SWE-bench rows (.parquet/.jsonl/.json)
    ids: list[str]  # the instances whose wheelhouse to fill
    wheels: Path  # the wheelhouse, made when missing; shared by instances is fine
    repo: str | None = None  # a checkout or mirror holding the base commits, or a clone URL
    python: str | None = None  # resolve for this Python version instead of the instance's
    python_image: str | None = None  # run pip in this image instead of a Debian suite's
    era: bool = True  # bound open versions by the environment-setup commit's date
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
