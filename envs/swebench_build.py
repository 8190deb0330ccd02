"""An offline builder for SWE-bench instance images, without conda and without swebench's
per-task Dockerfile repository.

The image it makes keeps the contract the eval scripts rely on (``envs.contract``):

- ``/testbed``: the repository at the base commit, its history up to the base and nothing
  after it (fetched by commit from a local checkout or a clone URL: no tags, no remotes,
  no future commits for ``git log --all`` to find);
- ``/opt/miniconda3/bin/activate`` and a ``conda`` shell function, so that
  ``source /opt/miniconda3/bin/activate`` and ``conda activate testbed`` work; the
  ``testbed`` environment is a Python venv at ``/opt/miniconda3/envs/testbed``, made by
  the instance's Python version and filled by pip from a wheelhouse (``--wheels``, made
  with ``pip download`` on a machine with PyPI) instead of conda;
- the instance's install steps (``envs.swebench_specs``) already run, so nothing needs
  the network later. The wheelhouse stays in the image (``/opt/relearn/wheels``, pip's
  only index there), because the eval scripts reinstall the package before the tests.

The Python comes from a Debian suite built by debootstrap (3.9 bullseye, 3.11 bookworm,
3.13 trixie), or from an image the user names (``--python-image``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker

from envs.images import BASE_PACKAGES, build_base
from envs.swebench_specs import DEBIAN_PYTHON, InstallSpec, Unsupported
from envs.tasks import Task

CONDA_ROOT = "/opt/miniconda3"
ENV_NAME = "testbed"
ENV_PREFIX = f"{CONDA_ROOT}/envs/{ENV_NAME}"
WHEELS = "/opt/relearn/wheels"
BUILDER = "relearn build-swebench 1"

# `conda` as a shell function, for the lines SWE-bench eval scripts run (`conda activate
# testbed`, `conda deactivate`); activation of a venv is PATH and VIRTUAL_ENV. Written to
# run under the scripts' `set -u`.
CONDA_SH = f"""# relearn's stand-in for conda's shell functions: no conda in this image; the environments
# are Python venvs under {CONDA_ROOT}/envs made with pip. Supports `conda activate NAME`,
# `conda deactivate`, and `conda run -n NAME CMD` (through {CONDA_ROOT}/bin/conda).
conda() {{
    case "${{1:-}}" in
        activate)
            local name="${{2:-base}}" prefix
            if [ "$name" = base ]; then prefix={CONDA_ROOT}; else prefix={CONDA_ROOT}/envs/$name; fi
            if [ "$name" != base ] && [ ! -x "$prefix/bin/python" ]; then
                echo "conda: no environment named $name ($prefix/bin/python is missing)" >&2
                return 1
            fi
            conda deactivate
            if [ "$name" != base ]; then
                export VIRTUAL_ENV="$prefix"
                export PATH="$prefix/bin:$PATH"
            fi
            export CONDA_DEFAULT_ENV="$name" CONDA_PREFIX="$prefix"
            hash -r 2>/dev/null || true
            ;;
        deactivate)
            if [ -n "${{VIRTUAL_ENV:-}}" ]; then
                PATH=$(printf '%s' "$PATH" | tr ':' '\\n' | grep -vxF "$VIRTUAL_ENV/bin" | paste -sd: -)
                export PATH
                unset VIRTUAL_ENV
            fi
            unset CONDA_DEFAULT_ENV CONDA_PREFIX
            hash -r 2>/dev/null || true
            ;;
        *) command {CONDA_ROOT}/bin/conda "$@" ;;
    esac
}}
case ":$PATH:" in *":{CONDA_ROOT}/bin:"*) ;; *) export PATH="{CONDA_ROOT}/bin:$PATH" ;; esac
"""
ACTIVATE = f""". {CONDA_ROOT}/etc/profile.d/conda.sh
conda activate "${{1:-base}}"
"""
CONDA_EXE = f"""#!/bin/bash
# relearn's stand-in for the conda executable (no conda in this image): `conda run -n NAME
# CMD...`, `conda env list`, `conda --version`. Activation is a shell function: source
# {CONDA_ROOT}/bin/activate first.
set -u
root={CONDA_ROOT}
case "${{1:-}}" in
    run)
        shift
        name=base
        while [ $# -gt 0 ]; do
            case "$1" in
                -n|--name) name=$2; shift 2 ;;
                --no-capture-output|--live-stream) shift ;;
                *) break ;;
            esac
        done
        if [ "$name" != base ]; then export VIRTUAL_ENV=$root/envs/$name PATH=$root/envs/$name/bin:$PATH; fi
        exec "$@" ;;
    env|info)
        echo "# conda environments (relearn: Python venvs)"
        echo "base  $root"
        for d in "$root"/envs/*/; do [ -d "$d" ] && echo "$(basename "$d")  ${{d%/}}"; done ;;
    --version|-V) echo "conda 0.0 (relearn stand-in: environments are pip venvs)" ;;
    activate|deactivate) echo "conda $1: source $root/bin/activate first" >&2; exit 1 ;;
    *) echo "conda ${{1:-}}: not available here (relearn stand-in: activate, deactivate, run, env list)" >&2; exit 1 ;;
esac
"""


class BuildFailed(RuntimeError):
    pass


@dataclass
class BuildResult:
    instance_id: str
    image: str
    spec: InstallSpec
    python: str
    base: str
    seconds: dict[str, float] = field(default_factory=dict)


def python_base(client: docker.DockerClient, spec: InstallSpec, python: str, python_image: str | None, log: Callable[[str], None]) -> str:
    """The image the environment is built ``FROM``: the user's, or a Debian suite whose
    python3 is ``python`` (with the Debian packages the instance needs)."""
    if python_image is not None:
        if spec.apt_packages:
            raise Unsupported(
                f"{spec.repo} {spec.version} needs the Debian packages {', '.join(spec.apt_packages)}, which cannot be installed offline "
                "into --python-image; leave --python-image out to build from a Debian suite"
            )
        return python_image
    suite = DEBIAN_PYTHON.get(python)
    if suite is None:
        ships = ", ".join(f"{v} ({s})" for v, s in DEBIAN_PYTHON.items())
        raise Unsupported(
            f"{spec.repo} {spec.version} needs Python {python}, which no Debian suite the builder can debootstrap ships ({ships}): "
            f"pass --python-image IMAGE (an image with python{python}, git and bash, e.g. a loaded python:{python}-slim with git), "
            "or --python VERSION to build with another version (recorded in the image's labels)"
        )
    packages = list(dict.fromkeys([*BASE_PACKAGES, *spec.apt_packages]))
    return build_base(client, packages=packages, suite=suite, log=log)


def source_repository(repo: str, workdir: Path, log: Callable[[str], None]) -> Path:
    """A local git repository to take commits from: ``repo`` itself, or a bare clone of a
    URL (online)."""
    path = Path(repo).expanduser()
    if path.exists():
        probe = subprocess.run(["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise BuildFailed(f"--repo {repo}: not a git repository ({probe.stderr.strip()})")
        return path
    if not re.match(r"^(https?|git|ssh|file)://|^[\w.-]+@[\w.-]+:", repo):
        raise BuildFailed(f"--repo {repo}: no such directory, and not a clone URL")
    target = workdir / "source.git"
    log(f"git clone --bare {repo} (online)")
    result = subprocess.run(["git", "clone", "--bare", "--no-tags", "-q", repo, str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildFailed(f"git clone {repo} failed: {result.stderr.strip()[-1000:]}")
    return target


def _git(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise BuildFailed(f"git {' '.join(args[:3])} failed: {result.stderr.strip()[-1000:]}")
    return result


def prepare_testbed(source: Path, base_commit: str, dest: Path) -> None:
    """``dest``: a fresh repository whose only history is ``base_commit`` and its ancestors,
    checked out at it on branch ``main``."""
    if _git("-C", str(source), "cat-file", "-e", f"{base_commit}^{{commit}}", check=False).returncode != 0:
        raise BuildFailed(f"the base commit {base_commit} is not in {source} (fetch it there, or pass a full clone)")
    _git("init", "-q", "-b", "main", str(dest))
    _git("-C", str(dest), "fetch", "-q", "--no-tags", str(source.resolve()), base_commit)
    _git("-C", str(dest), "reset", "-q", "--hard", base_commit)
    (dest / ".git" / "FETCH_HEAD").unlink(missing_ok=True)
    _git("-C", str(dest), "reflog", "expire", "--expire=now", "--all")


def requirements_text(source: Path, spec: InstallSpec, task: Task) -> str:
    """The repository's requirements file as swebench reads it: the first of the spec's
    paths that exists at the environment setup commit (else the base commit), with one
    level of ``-r`` includes inlined, without ``-e .``, comments and ``.[test``."""
    if not spec.requirements:
        return ""
    commits = [c for c in (task.environment_setup_commit, task.base_commit) if c]
    commit = next((c for c in commits if _git("-C", str(source), "cat-file", "-e", f"{c}^{{commit}}", check=False).returncode == 0), None)
    if commit is None:
        raise BuildFailed(f"neither the environment setup commit nor the base commit of {task.instance_id} is in {source}")

    def show(path: str) -> str | None:
        result = _git("-C", str(source), "show", f"{commit}:{path}", check=False)
        return result.stdout if result.returncode == 0 else None

    def kept(line: str) -> bool:
        return not any(line.strip().startswith(x) for x in ("-e .", "#", ".[test"))

    for path in spec.requirements:
        text = show(path)
        if text is None:
            continue
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        included: list[str] = []
        own: list[str] = []
        for line in text.split("\n"):
            if line.strip().startswith("-r"):
                extra = show(os.path.normpath(os.path.join(folder, line.strip()[2:].strip())))
                included += [x for x in (extra or "").split("\n") if kept(x)]
            elif kept(line):
                own.append(line)
        return "\n".join([*included, *own]).strip() + "\n"
    raise BuildFailed(f"{task.instance_id}: none of {', '.join(spec.requirements)} exists at {commit[:12]} in {source}")


def env_script(spec: InstallSpec, python: str, wheels: bool, requirements: bool) -> str:
    """Makes the ``testbed`` venv and installs what the spec names, in swebench's order:
    the requirements file, the (conda) packages, then the pinned pip packages."""
    pip = "python -m pip install --no-input --progress-bar off"
    lines = [
        "#!/bin/bash",
        "set -euxo pipefail",
        f'command -v python{python} >/dev/null || {{ echo "relearn: the base image has no python{python}" >&2; exit 1; }}',
        f"python{python} -m venv {ENV_PREFIX}",
    ]
    if wheels:
        # The wheelhouse is pip's only index in this environment, now and at eval time.
        lines.append(f"printf '[global]\\nno-index = true\\nfind-links = {WHEELS}\\n' > {ENV_PREFIX}/pip.conf")
    lines += [f"source {CONDA_ROOT}/bin/activate", f"conda activate {ENV_NAME}"]
    for tool in ("pip", "setuptools", "wheel"):
        if wheels:
            lines.append(f"if ls {WHEELS} | grep -qi '^{tool}-'; then {pip} --upgrade {tool}; fi")
        else:
            lines.append(f"{pip} --upgrade {tool}")
    if requirements:
        lines.append(f"{pip} -r /opt/relearn/requirements.txt")
    if spec.packages:
        lines.append(f"{pip} {' '.join(shlex.quote(p) for p in spec.packages)}")
    if spec.pip_packages:
        lines.append(f"{pip} {' '.join(shlex.quote(p) for p in spec.pip_packages)}")
    return "\n".join(lines) + "\n"


def install_script(spec: InstallSpec) -> str:
    lines = [
        "#!/bin/bash",
        "set -euxo pipefail",
        "command -v git >/dev/null || { echo 'relearn: the base image has no git' >&2; exit 1; }",
        "cd /testbed",
        "git config --global --add safe.directory /testbed",
        f"source {CONDA_ROOT}/bin/activate",
        f"conda activate {ENV_NAME}",
        *spec.pre_install,
        spec.install,
        "python -m pip freeze > /opt/relearn/pip-freeze.txt",
    ]
    return "\n".join(lines) + "\n"


def dockerfile(base: str, wheels: bool, labels: dict[str, str]) -> str:
    label_lines = " \\\n      ".join(f"{key}={_quote_label(value)}" for key, value in sorted(labels.items()))
    lines = [f"FROM {base}", f"COPY conda {CONDA_ROOT}"]
    if wheels:
        lines.append(f"COPY wheels {WHEELS}")
    lines += [
        "COPY relearn/env.sh relearn/requirements.txt /opt/relearn/",
        "RUN bash /opt/relearn/env.sh",
        "COPY relearn/install.sh /opt/relearn/",
        "COPY testbed /testbed",
        "RUN bash /opt/relearn/install.sh",
        "WORKDIR /testbed",
        # Agents' plain `python` is the task's, as in a shell that ran the activation.
        f"ENV VIRTUAL_ENV={ENV_PREFIX} CONDA_DEFAULT_ENV={ENV_NAME} CONDA_PREFIX={ENV_PREFIX} PATH={ENV_PREFIX}/bin:{CONDA_ROOT}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"RUN echo 'source {CONDA_ROOT}/etc/profile.d/conda.sh && conda activate {ENV_NAME}' >> /root/.bashrc",
        f"LABEL {label_lines}",
    ]
    return "\n".join(lines) + "\n"


def _quote_label(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def wheelhouse_digest(wheels: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(wheels.iterdir()):
        if path.is_file():
            digest.update(f"{path.name}\t{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def _copy_wheels(wheels: Path, target: Path) -> int:
    """Hard links where the file system allows (a wheelhouse can be gigabytes)."""
    target.mkdir(parents=True)
    count = 0
    for path in sorted(wheels.iterdir()):
        if path.is_file() and path.name.endswith((".whl", ".tar.gz", ".zip", ".tar.bz2")):
            try:
                os.link(path, target / path.name)
            except OSError:
                shutil.copy2(path, target / path.name)
            count += 1
    return count


def build_instance_image(
    client: docker.DockerClient,
    task: Task,
    spec: InstallSpec,
    *,
    source: Path,
    tag: str,
    wheels: Path | None = None,
    python: str | None = None,
    python_image: str | None = None,
    memory_mb: int | None = None,
    log: Callable[[str], None] = print,
) -> BuildResult:
    """Build ``task``'s image as ``tag`` from ``source`` at the base commit; returns what
    was built and how long each part took."""
    if not task.base_commit:
        raise Unsupported(f"{task.instance_id}: the row has no base_commit")
    chosen = python or spec.python
    result = BuildResult(task.instance_id, tag, spec, chosen, "")
    started = time.monotonic()
    result.base = python_base(client, spec, chosen, python_image, log)
    result.seconds["base image"] = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="relearn-swebench-") as tmp:
        context = Path(tmp)
        mark = time.monotonic()
        log(f"{task.instance_id}: the repository at {task.base_commit[:12]} (history up to it only)")
        prepare_testbed(source, task.base_commit, context / "testbed")
        result.seconds["repository"] = time.monotonic() - mark
        if wheels is not None:
            copied = _copy_wheels(wheels, context / "wheels")
            if not copied:
                raise BuildFailed(f"--wheels {wheels}: no wheels (or sdists) in it")
        (context / "conda" / "bin").mkdir(parents=True)
        (context / "conda" / "etc" / "profile.d").mkdir(parents=True)
        (context / "conda" / "envs").mkdir()
        (context / "conda" / "etc" / "profile.d" / "conda.sh").write_text(CONDA_SH)
        (context / "conda" / "bin" / "activate").write_text(ACTIVATE)
        (context / "conda" / "bin" / "conda").write_text(CONDA_EXE)
        (context / "conda" / "bin" / "conda").chmod(0o755)
        requirements = requirements_text(source, spec, task)
        (context / "relearn").mkdir()
        (context / "relearn" / "requirements.txt").write_text(requirements)
        (context / "relearn" / "env.sh").write_text(env_script(spec, chosen, wheels is not None, bool(requirements.strip())))
        (context / "relearn" / "install.sh").write_text(install_script(spec))
        labels = {
            "relearn.builder": BUILDER,
            "relearn.instance_id": task.instance_id,
            "relearn.repo": spec.repo,
            "relearn.version": spec.version,
            "relearn.base_commit": task.base_commit,
            "relearn.python": chosen,
            "relearn.python_spec": spec.python,
            "relearn.spec_source": spec.source,
            "relearn.base_image": result.base,
            "relearn.wheelhouse": wheelhouse_digest(wheels) if wheels is not None else "none (PyPI at build time)",
        }
        (context / "Dockerfile").write_text(dockerfile(result.base, wheels is not None, labels))
        mark = time.monotonic()
        log(f"{task.instance_id}: docker build -> {tag}" + (" (network off: pip reads only the wheelhouse)" if wheels is not None else ""))
        _docker_build(client, context, tag, offline=wheels is not None, memory_mb=memory_mb, log=log)
        result.seconds["image build"] = time.monotonic() - mark
    result.seconds["total"] = time.monotonic() - started
    return result


def _docker_build(
    client: docker.DockerClient, context: Path, tag: str, *, offline: bool, memory_mb: int | None, log: Callable[[str], None]
) -> None:
    lines: list[str] = []
    error = None
    limits = {"memory": memory_mb << 20, "memswap": memory_mb << 20} if memory_mb else None
    try:
        stream = client.api.build(
            path=str(context),
            tag=tag,
            rm=True,
            forcerm=True,
            network_mode="none" if offline else None,
            container_limits=limits,
            decode=True,
        )
        for chunk in stream:
            if "stream" in chunk:
                for line in str(chunk["stream"]).splitlines():
                    lines.append(line)
                    if line.startswith("Step "):
                        log(f"  {line[:160]}")
            if "error" in chunk:
                error = str(chunk.get("errorDetail", {}).get("message") or chunk["error"])
                break
    except docker.errors.APIError as exc:
        error = str(exc)
    if error is None:
        return
    tail = "\n".join(lines[-40:])
    missing = re.findall(r"No matching distribution found for (\S+)", tail)
    hint = ""
    if missing:
        hint = (
            f"\nthe wheelhouse lacks {', '.join(dict.fromkeys(missing))}: add it with `pip download -d WHEELS --only-binary=:all: "
            f"--python-version X.Y --platform manylinux2014_x86_64 {' '.join(dict.fromkeys(missing))}` on a machine with PyPI "
            "(`relearn envs build-swebench --plan` prints the whole command)"
        )
    raise BuildFailed(f"building {tag} failed: {error}\n{tail}{hint}")


def download_command(spec: InstallSpec, python: str, requirements: str) -> str:
    """The ``pip download`` that fills a wheelhouse for ``spec`` (run where PyPI answers)."""
    pinned = {re.split(r"[<>=!~\[; ]", p, maxsplit=1)[0].lower() for p in spec.pip_packages}
    unpinned = [p for p in ["pip", "setuptools", "wheel", *spec.packages] if p.lower() not in pinned]
    names = list(dict.fromkeys([*unpinned, *spec.pip_packages]))
    reqs = [line.strip() for line in requirements.splitlines() if line.strip() and not line.strip().startswith("-")]
    words = [
        "pip",
        "download",
        "-d",
        "WHEELS",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--platform",
        "manylinux2014_x86_64",
        "--implementation",
        "cp",
    ]
    return " ".join(words + [shlex.quote(n) for n in [*names, *reqs]])
