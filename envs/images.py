"""Images without a registry: a Debian base made by debootstrap and ``docker import``,
and task images built ``FROM`` it.

A mini-suite task image holds its repository at ``/testbed`` as a fresh git repository
with a single commit, the base. Upstream history is never copied in, so nothing in
``.git`` can reveal the fix. ``leaky=True`` builds the opposite on purpose (the fix
committed after the base, then the work tree reset to the base), which is what the
``.git`` audit must catch.

``prepare_images`` is what every verb that runs tasks calls first: it routes tasks to the
images the user named (``envs.image_choice``), pulls the missing ones when asked
(``envs.registry``), builds an OpenSWE row's image from its ``Dockerfile`` when neither the
engine nor a pull has it, and builds the base image only when a task is built from it.

An OpenSWE image is what OpenSWE's own build makes: its Dockerfile run on a build context
whose ``repo/`` is a full clone of the repository checked out at the base commit (so the
image holds the upstream history after it, ``end_commit`` included: ``envs.audit`` says so).
The clone comes from a mirror kept under the relearn cache (``$RELEARN_CACHE/repos/OWNER/
NAME.git``, made by ``git clone --mirror`` from GitHub the first time); offline, put a
mirror there, or name a local repository or clone URL in the row's ``repo``.

On a cluster, ``node_image`` makes a unit's image present on the node that runs it: built
there by the same code, or, with a registry of the user's (``--registry HOST[/NS]``),
pulled from it as ``HOST/NS/NAME:TAG`` and tagged ``NAME:TAG``; the driver then builds
nothing and only needs the images' names (``image_name``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.utils import parse_repository_tag

from envs.executor import node_name
from envs.image_choice import ImageChoice
from envs.registry import PullError, PullProgress, pull_image, registry_of
from envs.tasks import Task

BASE_REPOSITORY = "relearn/base"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What every task image needs: an interpreter, its test runner, git and patch (the last
# fallback of SWE-bench's patch application).
BASE_PACKAGES = ["python3", "python3-pip", "python3-pytest", "python3-venv", "git", "patch", "ca-certificates", "procps"]
MINI_REPOSITORY = "relearn/mini"
# Fixed identity and dates make the base commit's hash the same on every machine.
GIT_ENV = (
    "GIT_AUTHOR_NAME=relearn GIT_AUTHOR_EMAIL=relearn@localhost GIT_COMMITTER_NAME=relearn "
    "GIT_COMMITTER_EMAIL=relearn@localhost GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' "
    "GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'"
)


def base_tag(packages: list[str] = BASE_PACKAGES, suite: str = SUITE) -> str:
    """The base image's tag names its content, so a changed package list is a new image."""
    digest = hashlib.sha256(" ".join([suite, *sorted(packages)]).encode()).hexdigest()[:10]
    return f"{BASE_REPOSITORY}:{suite}-{digest}"


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_base(
    client: docker.DockerClient,
    *,
    packages: list[str] = BASE_PACKAGES,
    suite: str = SUITE,
    mirror: str = MIRROR,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> str:
    """Build (or reuse) the base image; returns its tag."""
    tag = base_tag(packages, suite)
    if not force and image_exists(client, tag):
        log(f"base image {tag} is already built")
        return tag
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed: apt-get install -y debootstrap (scripts/ensure-docker.sh does)")
    with tempfile.TemporaryDirectory(prefix="relearn-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap --variant=minbase {suite} with {', '.join(packages)} (a minute or two)")
        command = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs), mirror]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-3000:]
            raise RuntimeError(f"debootstrap failed (exit {result.returncode}):\n{tail}")
        # Package caches are dead weight in every container.
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        log(f"docker import -> {tag}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        client.api.import_image_from_stream(
            tar.stdout,
            repository=tag.split(":")[0],
            tag=tag.split(":")[1],
            changes=['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8", "ENV PYTHONDONTWRITEBYTECODE=1"],
        )
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap root failed")
    if not image_exists(client, tag):
        raise RuntimeError(f"docker import did not produce {tag}")
    return tag


def mini_image_tag(task: Task, leaky: bool = False) -> str:
    return f"{MINI_REPOSITORY}:{task.instance_id.replace('__', '_1776_').lower()}{'-leaky' if leaky else ''}"


def mini_dockerfile(base: str, leaky: bool) -> str:
    lines = [
        f"FROM {base}",
        "COPY repo /testbed",
        "WORKDIR /testbed",
        f"RUN git init -q -b main && git add -A && {GIT_ENV} git commit -q -m base && git config --global --add safe.directory /testbed",
    ]
    if leaky:
        # What a careless image build does: the upstream fix lands in history.
        lines += [
            "COPY gold.patch /tmp/gold.patch",
            f"RUN git apply /tmp/gold.patch && git add -A && {GIT_ENV} git commit -q -m 'fix' "
            "&& git branch upstream-main && git reset -q --hard HEAD~1 && rm /tmp/gold.patch",
        ]
    return "\n".join(lines) + "\n"


def build_mini_image(client: docker.DockerClient, task: Task, base: str, *, leaky: bool = False) -> str:
    """Build a mini-suite task's image (cached by Docker's layer cache); returns its tag."""
    if task.task_dir is None:
        raise ValueError(f"{task.instance_id} is not a bundled mini task")
    tag = mini_image_tag(task, leaky)
    with tempfile.TemporaryDirectory(prefix="relearn-ctx-") as tmp:
        context = Path(tmp)
        shutil.copytree(Path(task.task_dir) / "repo", context / "repo", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (context / "gold.patch").write_text(task.patch)
        (context / "Dockerfile").write_text(mini_dockerfile(base, leaky))
        try:
            client.images.build(path=str(context), tag=tag, rm=True, forcerm=True, network_mode="none")
        except docker.errors.BuildError as exc:
            log = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log)[-3000:]
            raise RuntimeError(f"building {tag} failed: {exc.msg}\n{log}") from None
    return tag


def build_harbor_image(client: docker.DockerClient, task: Task) -> str:
    """A Harbor task's image: its ``environment/Dockerfile``, or the image it names."""
    if task.task_dir is None:
        raise ValueError(f"{task.instance_id} has no task folder")
    environment = Path(task.task_dir) / "environment"
    if not (environment / "Dockerfile").is_file():
        if task.image is None:
            raise ValueError(f"{task.instance_id}: no environment/Dockerfile and no docker_image")
        return task.image
    tag = harbor_tag(task)
    try:
        client.images.build(path=str(environment), tag=tag, rm=True, forcerm=True)
    except docker.errors.BuildError as exc:
        raise RuntimeError(f"building {task.instance_id} failed: {exc.msg}") from None
    return tag


def harbor_tag(task: Task) -> str:
    return f"relearn/harbor:{hashlib.sha256(task.instance_id.encode()).hexdigest()[:16]}"


# A Dockerfile instruction that copies `repo` (or what is under it) from the build context.
COPIES_REPO = re.compile(r"^\s*(?:COPY|ADD)\s+(?:--\S+\s+)*\.?/?repo(?:/\S*)?\s", re.IGNORECASE | re.MULTILINE)
GITHUB = "https://github.com/{repo}.git"


def openswe_builds_here(task: Task) -> bool:
    """An OpenSWE row whose image, when the engine lacks it, is built from its Dockerfile (not
    one the user routed to an image of their own)."""
    return task.kind == "openswe" and bool(task.dockerfile) and task.image_source is None


def openswe_tag(task: Task) -> str:
    """The name an OpenSWE row's image has: its ``image_name``; a row with a Dockerfile and no
    name gets one from its content."""
    if task.image:
        return task.image
    digest = hashlib.sha256(f"{task.instance_id}\n{task.dockerfile or ''}".encode()).hexdigest()[:16]
    return f"relearn/openswe:{digest}"


def relearn_cache() -> Path:
    env = os.environ.get("RELEARN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "relearn"


def own_source(repo: str) -> str | None:
    """The row's ``repo`` as a clone source itself: a clone URL, or an absolute path to a local
    repository; None for ``OWNER/NAME``."""
    if re.match(r"^(https?|git|ssh|file)://|^[\w.-]+@[\w.-]+:", repo):
        return repo
    path = Path(repo).expanduser()
    return str(path) if path.is_absolute() and path.is_dir() else None


def repo_mirror(repo: str, log: Callable[[str], None] = print) -> str:
    """Where the clone of ``repo`` comes from: the row's ``repo`` itself when it is a clone
    source (``own_source``), else the cache's mirror of ``https://github.com/OWNER/NAME``
    (cloned once, with ``git clone --mirror``; online)."""
    own = own_source(repo)
    if own is not None:
        return own
    owner, _, name = repo.partition("/")
    if not re.fullmatch(r"[\w.-]+", owner) or not re.fullmatch(r"[\w.-]+", name) or {owner, name} & {".", ".."}:
        raise RuntimeError(f"repo {repo!r}: expected OWNER/NAME, an absolute path to a local repository, or a clone URL")
    mirror = relearn_cache() / "repos" / owner / f"{name}.git"
    if mirror.is_dir():
        return str(mirror)
    url = GITHUB.format(repo=repo)
    log(f"git clone --mirror {url} -> {mirror} (online; once per repository)")
    partial = mirror.with_name(mirror.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["git", "clone", "--mirror", "-q", url, str(partial)], capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(
            f"the Dockerfile copies repo/ from its build context and {url} could not be cloned ({result.stderr.strip()[-300:]}); "
            f"offline, put a mirror at {mirror} (git clone --mirror URL {mirror}) or name a local repository in the row's repo"
        )
    partial.rename(mirror)  # whole or absent: a clone cut short is never taken for a mirror
    return str(mirror)


def openswe_checkout(task: Task, dest: Path, log: Callable[[str], None] = print) -> None:
    """``dest``: a full clone checked out at the base commit, as OpenSWE's build context holds
    it (``git clone URL repo && git checkout BASE``); cloned from the cache's mirror, its
    ``origin`` still names GitHub, as there."""
    if not task.base_commit:
        raise RuntimeError(f"{task.instance_id}: the Dockerfile copies repo/ and the row has no base_commit to check out")
    source = repo_mirror(task.repo, log)
    has_base = ["git", "-C", source, "cat-file", "-e", f"{task.base_commit}^{{commit}}"]
    if own_source(task.repo) is None and subprocess.run(has_base, capture_output=True).returncode != 0:
        log(f"git fetch into {source}: it lacks {task.base_commit[:12]} (online)")  # a mirror older than the task
        subprocess.run(["git", "-C", source, "fetch", "-q", "--prune"], capture_output=True)
    steps = [
        ["git", "clone", "-q", source, str(dest)],
        ["git", "-C", str(dest), "-c", "advice.detachedHead=false", "checkout", "-q", task.base_commit],
    ]
    if own_source(task.repo) is None:
        steps.append(["git", "-C", str(dest), "remote", "set-url", "origin", GITHUB.format(repo=task.repo)])
    for command in steps:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{task.instance_id}: {' '.join(command[:5])} failed: {result.stderr.strip()[-500:]}")


def build_openswe_image(client: docker.DockerClient, task: Task, *, log: Callable[[str], None] = print) -> str:
    """An OpenSWE row's image from its Dockerfile, tagged with its ``image_name`` (so the next
    use finds it); returns the tag. The build may use the network (OpenSWE Dockerfiles install
    with pip and apt); its ``FROM`` image must be on the engine or pullable."""
    if not task.dockerfile:
        raise ValueError(f"{task.instance_id}: the row carries no Dockerfile")
    tag = openswe_tag(task)
    with tempfile.TemporaryDirectory(prefix="relearn-openswe-") as tmp:
        context = Path(tmp)
        (context / "Dockerfile").write_text(task.dockerfile)
        if COPIES_REPO.search(task.dockerfile):
            openswe_checkout(task, context / "repo", log)
        log(f"{task.instance_id}: image {tag} is not on this engine: building it from the row's Dockerfile")
        lines: list[str] = []
        try:
            for chunk in client.api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True):
                lines += str(chunk.get("stream", "")).splitlines()
                if "error" in chunk:
                    message = str((chunk.get("errorDetail") or {}).get("message") or chunk["error"])
                    tail = "\n".join(lines[-20:])
                    raise RuntimeError(f"building {tag} from {task.instance_id}'s Dockerfile failed: {message}\n{tail}")
        except docker.errors.APIError as exc:
            raise RuntimeError(f"building {tag} from {task.instance_id}'s Dockerfile failed: {exc.explanation or exc}") from None
    if not image_exists(client, tag):
        raise RuntimeError(f"building {task.instance_id}'s Dockerfile did not produce {tag}")
    return tag


def needs_base(tasks: list[Task]) -> bool:
    """Whether any task is built here ``FROM`` the base image (a bundled mini task the
    user did not route to an image of their own). Tasks that bring their own image, as
    SWE-bench rows do, never need it, so a run of them needs no debootstrap or mirror."""
    return any(task.kind != "harbor" and task.task_dir is not None and task.image_source is None for task in tasks)


def base_if_needed(client: docker.DockerClient, tasks: list[Task], *, log: Callable[[str], None] = print) -> str | None:
    return build_base(client, log=log) if needs_base(tasks) else None


def task_image(
    client: docker.DockerClient, task: Task, base: str | None = None, *, leaky: bool = False, log: Callable[[str], None] | None = None
) -> str:
    """The image a task runs in: the one the user routed it to, else the one it names if
    present, else one built here (mini suite, Harbor Dockerfiles, an OpenSWE row's Dockerfile)."""
    if task.image_source is not None:  # chosen by the user: used as named, never built
        return _present(client, task)
    if task.kind == "harbor":
        return build_harbor_image(client, task)
    if task.task_dir is not None:  # a bundled mini task
        return build_mini_image(client, task, base or base_tag(), leaky=leaky)
    if openswe_builds_here(task) and not image_exists(client, openswe_tag(task)):
        return build_openswe_image(client, task, log=log or (lambda _message: None))
    return _present(client, task)


def image_name(task: Task) -> str:
    """The name ``task_image`` gives a task's image, without building or looking for it:
    what the nodes get from a registry (``node_image``) while this machine builds nothing."""
    if task.image_source is None and task.task_dir is not None:
        if task.kind != "harbor":
            return mini_image_tag(task)
        if (Path(task.task_dir) / "environment" / "Dockerfile").is_file():
            return harbor_tag(task)
    if openswe_builds_here(task):
        return openswe_tag(task)
    if not task.image:
        raise RuntimeError(f"{task.instance_id}: the task names no image; give one with --image-map FILE or --image-template")
    return task.image


def registry_name(image: str, registry: str) -> str:
    """Where ``--registry HOST[/NS]`` keeps ``image``: ``HOST/NS/NAME:TAG``, NAME without
    a registry host of its own (``docker.io/swebench/x:v`` is ``HOST/NS/swebench/x:v``)."""
    first, _, rest = image.partition("/")
    own_host = bool(rest) and (registry_of(image) != "docker.io" or first == "docker.io")
    return f"{registry.strip('/')}/{rest if own_host else image}"


def _present(client: docker.DockerClient, task: Task) -> str:
    if task.image and image_exists(client, task.image):
        return task.image
    if not task.image:
        raise RuntimeError(f"{task.instance_id}: the task names no image; give one with --image-map FILE or --image-template")
    if task.kind == "openswe" and task.image_source is None:
        raise RuntimeError(
            f"{task.instance_id}: image {task.image} (the row's image_name) is not on this engine, and the row carries no "
            f"Dockerfile to build it from. Get it with --pull (from {registry_of(task.image)}), `relearn envs load DIR` "
            "(docker save tarballs), or point --image-map/--image-template at the name your registry or tarball uses"
        )
    source = task.image_source or "the dataset row's image column"
    raise RuntimeError(
        f"{task.instance_id}: image {task.image} (from {source}) is not on this engine. Get it with one of: "
        f"--pull (from {registry_of(task.image)}); `relearn envs load DIR` (docker save tarballs); "
        f"`relearn envs build-swebench -t TASKS --id {task.instance_id} --repo CHECKOUT --wheels DIR` (offline build); "
        "or point --image-map/--image-template at the name your registry or tarball uses"
    )


@dataclass
class Prepared:
    """Tasks routed to their images, the base image when one was needed, and what went
    wrong getting images (each names the task, the image and the registry's answer)."""

    tasks: list[Task]
    base: str | None
    problems: list[str] = field(default_factory=list)


def prepare_images(
    client: docker.DockerClient,
    tasks: list[Task],
    choice: ImageChoice | None = None,
    *,
    pull: bool = False,
    need_base: bool = False,
    base: str | None = None,
    log: Callable[[str], None] = print,
    on_pull_progress: Callable[[PullProgress], None] | None = None,
    registry: str | None = None,
) -> Prepared:
    """Route ``tasks`` by ``choice``, pull the images they name that are missing (with
    ``pull``), build an OpenSWE row's image from its Dockerfile when it is still missing, and
    build the base image only when a task (or the caller: ``need_base``, e.g. a relay
    container) needs it and ``base`` does not already name it. With ``registry``, the task
    images are neither pulled nor built here: whoever runs a unit pulls its image from
    there (``node_image``)."""
    routed = choice.route(tasks) if choice is not None else list(tasks)
    problems: list[str] = []
    pull_errors: dict[str, str] = {}
    if choice is not None and choice.mapping and not any(t.instance_id in choice.mapping for t in tasks):
        problems.append(f"the image map {choice.map_path} names none of the {len(tasks)} task(s) (e.g. {tasks[0].instance_id})")
    if pull and registry is None:
        wanted: dict[str, list[str]] = {}
        for task in routed:
            brings_own = task.image_source is not None or (task.task_dir is None and task.kind != "harbor")
            if brings_own and task.image:
                wanted.setdefault(task.image, []).append(task.instance_id)
        for image, ids in wanted.items():
            if image_exists(client, image):
                continue
            log(f"pulling {image} from {registry_of(image)}")
            try:
                pull_image(client, image, on_progress=on_pull_progress, log=log)
            except PullError as exc:
                pull_errors[image] = f"{', '.join(ids)}: {exc}"
    if registry is None:
        _build_openswe_images(client, routed, problems, log)
    problems += [error for image, error in pull_errors.items() if not image_exists(client, image)]
    if base is None and (need_base or (registry is None and needs_base(routed))):
        base = build_base(client, log=log)
    return Prepared(routed, base, problems)


def _build_openswe_images(client: docker.DockerClient, tasks: list[Task], problems: list[str], log: Callable[[str], None]) -> None:
    """Build each OpenSWE image still missing from its row's Dockerfile, once per image name."""
    seen: set[str] = set()
    for task in tasks:
        if not openswe_builds_here(task) or openswe_tag(task) in seen:
            continue
        seen.add(openswe_tag(task))
        if image_exists(client, openswe_tag(task)):
            continue
        try:
            build_openswe_image(client, task, log=log)
        except (RuntimeError, ValueError, docker.errors.DockerException) as exc:
            problems.append(f"{task.instance_id}: {exc}")


def node_image(client: docker.DockerClient, task: Task, image: str, base: str | None, registry: str | None = None) -> None:
    """Make ``image`` present on the engine of the node running a unit: pulled from
    ``registry`` when one is given, else built or loaded by envs.images as on the driver.
    The error names the node, the image and (for a pull) the registry's answer."""
    if image_exists(client, image):
        return
    if registry is not None:
        source = registry_name(image, registry)
        try:
            pull_image(client, source)
            repository, tag = parse_repository_tag(image)
            client.images.get(source).tag(repository, tag or "latest")
        except (PullError, docker.errors.DockerException) as exc:
            raise RuntimeError(f"{node_name()} could not get image {image} for {task.instance_id}: {exc}") from None
        return
    try:
        if base is not None and needs_base([task]) and not image_exists(client, base):
            build_base(client, log=lambda _message: None)
        built = task_image(client, task, base)
    except (RuntimeError, ValueError, docker.errors.DockerException) as exc:
        raise RuntimeError(f"{node_name()} could not get image {image} for {task.instance_id}: {exc}") from exc
    if built != image:
        raise RuntimeError(f"{node_name()} built {built} for {task.instance_id}, the driver {image}: the nodes' task files differ")
