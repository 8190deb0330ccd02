"""Images without a registry: a Debian base made by debootstrap and ``docker import``,
and task images built ``FROM`` it.

A mini-suite task image holds its repository at ``/testbed`` as a fresh git repository
with a single commit, the base. Upstream history is never copied in, so nothing in
``.git`` can reveal the fix. ``leaky=True`` builds the opposite on purpose (the fix
committed after the base, then the work tree reset to the base), which is what the
``.git`` audit must catch.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker

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
        f"RUN git init -q -b main && git add -A && {GIT_ENV} git commit -q -m base "
        "&& git config --global --add safe.directory /testbed",
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
    tag = f"relearn/harbor:{hashlib.sha256(task.instance_id.encode()).hexdigest()[:16]}"
    try:
        client.images.build(path=str(environment), tag=tag, rm=True, forcerm=True)
    except docker.errors.BuildError as exc:
        raise RuntimeError(f"building {task.instance_id} failed: {exc.msg}") from None
    return tag


def task_image(client: docker.DockerClient, task: Task, base: str | None = None, *, leaky: bool = False) -> str:
    """The image a task runs in: the one it names if present, else built here."""
    if task.kind == "harbor":
        return build_harbor_image(client, task)
    if task.task_dir is not None:  # a bundled mini task
        return build_mini_image(client, task, base or base_tag(), leaky=leaky)
    if task.image and image_exists(client, task.image):
        return task.image
    raise RuntimeError(
        f"{task.instance_id}: image {task.image!r} is not on this engine and no registry can be reached; "
        "pull or build it first (docker load, or swebench's image builder)"
    )
