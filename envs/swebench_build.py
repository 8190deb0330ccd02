"""An offline builder for SWE-bench instance images, without conda and without swebench's
per-task Dockerfile repository.

The image it makes keeps the contract the eval scripts rely on (``envs.contract``):

- ``/testbed``: the repository at the base commit, its history up to the base and nothing
  after it (fetched by commit from a local checkout or a clone URL: no tags, no remotes,
  no future commits for ``git log --all`` to find);
- ``/opt/miniconda3/bin/activate`` and a ``conda`` shell function, so that
  ``source /opt/miniconda3/bin/activate`` and ``conda activate testbed`` work; the
  ``testbed`` environment is a Python prefix of its own at ``/opt/miniconda3/envs/testbed``
  (as a conda environment is: its interpreter, standard library and packages, found from
  wherever the interpreter is started, links included), made by
  the instance's Python version and filled by pip from a wheelhouse (``--wheels``, filled
  by ``relearn envs fetch-wheels`` where PyPI answers: ``envs.wheelhouse``) instead of conda;
- the instance's install steps (``envs.swebench_specs``) already run, so nothing needs
  the network later. The wheelhouse stays in the image (``/opt/relearn/wheels``, pip's
  only index there), because the eval scripts reinstall the package before the tests.

The Python comes from a Debian suite built by debootstrap (3.9 bullseye, 3.11 bookworm,
3.13 trixie), or from an image the user names (``--python-image``).
"""

from __future__ import annotations

import hashlib
import json
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
BUILDER = "relearn build-swebench 2"
DISTRIBUTIONS = (".whl", ".tar.gz", ".zip", ".tar.bz2")  # what a wheelhouse holds that pip installs from
LOCK = "relearn-wheelhouse.lock.json"  # written by envs.wheelhouse beside the wheels
# The environment's own pip, setuptools and wheel, whatever the instance's era. pip is the newest
# the instance's Python gets (26.0.1 for 3.9, 26.3 for 3.11), the one envs.wheelhouse resolves
# the wheelhouse with (it has --uploaded-prior-to), recorded in the lock: another pip resolves
# pre-releases otherwise (pytest 6.2's `pluggy<1.0.0a1` took 1.0.0.dev0 in the fetch, and pip
# 24 and the era's pip 21 then found nothing). setuptools is of the time the official images
# were built (2024): an era's cannot make PEP 660 editable installs, and setuptools 82 no
# longer ships pkg_resources, which old setup.py files import.
BUILD_TOOLS = ("pip", "setuptools==69.5.1", "wheel==0.43.0")

# `conda` as a shell function, for the lines SWE-bench eval scripts run (`conda activate
# testbed`, `conda deactivate`); activation of an environment is PATH and VIRTUAL_ENV. Written to
# run under the scripts' `set -u`.
CONDA_SH = f"""# relearn's stand-in for conda's shell functions: no conda in this image; the environments
# are Python prefixes under {CONDA_ROOT}/envs filled with pip. Supports `conda activate NAME`,
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
        echo "# conda environments (relearn: Python prefixes filled with pip)"
        echo "base  $root"
        for d in "$root"/envs/*/; do [ -d "$d" ] && echo "$(basename "$d")  ${{d%/}}"; done ;;
    --version|-V) echo "conda 0.0 (relearn stand-in: environments are filled with pip)" ;;
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


def python_base(
    client: docker.DockerClient,
    spec: InstallSpec,
    python: str,
    python_image: str | None,
    log: Callable[[str], None],
    extra_packages: tuple[str, ...] = (),
) -> str:
    """The image the environment is built ``FROM``: the user's, or a Debian suite whose
    python3 is ``python`` (with the Debian packages the instance needs, and ``extra_packages``)."""
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
    packages = list(dict.fromkeys([*BASE_PACKAGES, *spec.apt_packages, *extra_packages]))
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
    checked out at it on branch ``main``, with the tags that point into that history (the
    official images keep them: setuptools-scm versions the package from the last one, and
    pytest's ``minversion`` check fails on a ``0.1.dev`` version), none after it."""
    if _git("-C", str(source), "cat-file", "-e", f"{base_commit}^{{commit}}", check=False).returncode != 0:
        raise BuildFailed(f"the base commit {base_commit} is not in {source} (fetch it there, or pass a full clone)")
    _git("init", "-q", "-b", "main", str(dest))
    _git("-C", str(dest), "fetch", "-q", "--no-tags", str(source.resolve()), base_commit)
    tags = _git("-C", str(source), "tag", "--merged", base_commit).stdout.split()
    if tags:
        _git("-C", str(dest), "fetch", "-q", "--no-tags", str(source.resolve()), *[f"refs/tags/{t}:refs/tags/{t}" for t in tags])
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


def locked_fetch(wheels: Path, instance_id: str) -> dict:
    """What the lock says this instance's fetch took (``tools``, ``fix_requirements``); empty
    without a lock."""
    path = wheels / LOCK
    if not path.exists():
        return {}
    fetches = json.loads(path.read_text()).get("fetches", [])
    return next((f for f in fetches if f.get("instance_id") == instance_id), {})


def env_script(spec: InstallSpec, python: str, wheels: bool, requirements: bool, tools: list[str] | None = None) -> str:
    """Makes the ``testbed`` environment and installs what the spec names, in swebench's order:
    the requirements file, the (conda) packages, then the pinned pip packages."""
    pip = "python -m pip install --no-input --progress-bar off"
    lines = [
        "#!/bin/bash",
        "set -euxo pipefail",
        f'command -v python{python} >/dev/null || {{ echo "relearn: the base image has no python{python}" >&2; exit 1; }}',
        # Made as a venv (pip comes with it), then turned into a prefix of its own, as a conda
        # environment is: tox-current-env starts the tests through its own link to this
        # interpreter, and a venv started from another folder is no venv (Python looks for
        # pyvenv.cfg beside the path it was started by), so the system Python with Debian's
        # pytest ran instead. With its standard library beside the copied binary, Python finds
        # this prefix from the binary's real location. Debian's Python reads packages from
        # dist-packages and installs into local/: both lead to site-packages.
        f"python{python} -m venv --copies {ENV_PREFIX}",
        f"stdlib=$(python{python} -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])')",
        f'cp -a "$stdlib/." {ENV_PREFIX}/lib/python{python}/',
        f"rm -f {ENV_PREFIX}/lib/python{python}/EXTERNALLY-MANAGED {ENV_PREFIX}/pyvenv.cfg",
        f"[ -e {ENV_PREFIX}/lib/python{python}/dist-packages ] || ln -s site-packages {ENV_PREFIX}/lib/python{python}/dist-packages",
        f"ln -s . {ENV_PREFIX}/local",
        f'[ "$({ENV_PREFIX}/bin/python -c \'import sys; print(sys.prefix)\')" = {ENV_PREFIX} ] || {{ echo "relearn: {ENV_PREFIX} is not a prefix of its own" >&2; exit 1; }}',
        # Editable installs put /testbed itself on sys.path (a .pth line), as the official
        # images' `setup.py develop` does; setuptools' PEP 660 finder hook does not for some
        # layouts (pylint). The wheelhouse is pip's only index, now and at eval time.
        "printf '%s\\n' " + " ".join(shlex.quote(line) for line in pip_conf(wheels)) + f" > {ENV_PREFIX}/pip.conf",
    ]
    lines += [f"source {CONDA_ROOT}/bin/activate", f"conda activate {ENV_NAME}"]
    if tools:  # the versions the fetch took for this instance, not the newest another step brought
        lines.append(f"{pip} --upgrade {' '.join(shlex.quote(t) for t in tools)}")
    for tool in () if tools else ("pip", "setuptools", "wheel"):
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


def pip_conf(wheels: bool) -> list[str]:
    lines = ["[install]", "config-settings = editable_mode=compat"]
    if wheels:
        lines += ["[global]", "no-index = true", f"find-links = {WHEELS}"]
    return lines


def install_script(spec: InstallSpec, fix_requirements: list[str] | None = None) -> str:
    """Installs the repository as the spec says, then what the row's own fix adds to its
    requirements (``envs.wheelhouse.FIX_REQUIREMENTS``): the official harness reinstalls the
    fixed package with the network on, and here the network is off at grading time."""
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
        *(
            [f"python -m pip install --no-input --progress-bar off {' '.join(map(shlex.quote, fix_requirements))}"]
            if fix_requirements
            else []
        ),
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
        if path.is_file() and path.name.endswith(DISTRIBUTIONS):
            digest.update(f"{path.name}\t{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def _copy_wheels(wheels: Path, target: Path) -> int:
    """Hard links where the file system allows (a wheelhouse can be gigabytes)."""
    target.mkdir(parents=True)
    count = 0
    for path in sorted(wheels.iterdir()):
        if path.is_file() and path.name.endswith(DISTRIBUTIONS):
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
        locked = locked_fetch(wheels, task.instance_id) if wheels is not None else {}
        tools = list(locked.get("tools") or [])
        (context / "relearn" / "env.sh").write_text(env_script(spec, chosen, wheels is not None, bool(requirements.strip()), tools))
        (context / "relearn" / "install.sh").write_text(install_script(spec, list(locked.get("fix_requirements") or [])))
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
    raise BuildFailed(f"building {tag} failed: {error}\n{tail}{build_hint(tail)}")


def build_hint(log: str) -> str:
    """What to do about a failed build, for each way it fails offline; names every package."""
    missing = list(dict.fromkeys(re.findall(r"No matching distribution found for ([^\s;]+)", log)))
    fetch = "relearn envs fetch-wheels --tasks TASKS --id INSTANCE --repo REPO --wheels WHEELS"
    if missing:
        quoted = " ".join(shlex.quote(m) for m in missing)
        return (
            f"\nthe wheelhouse lacks {', '.join(missing)}: fill it for this instance with `{fetch}` where PyPI answers "
            f"(`relearn envs build-swebench --plan` prints it filled in), or add them by hand: `pip download -d WHEELS {quoted}` "
            "run by the image's own Python"
        )
    if re.search(r"ResolutionImpossible|conflicting dependencies|Cannot install .* because these package versions have conflicting", log):
        return "\nthe versions in the wheelhouse conflict for this step (the lines above name them): refill it with relearn envs fetch-wheels, which resolves each install step as the build runs it"
    if re.search(
        r"command '\S*(gcc|cc|g\+\+)' failed|error: command '\S*gcc'|unable to execute '\S*gcc'|No such file or directory: '\S*gcc'", log
    ):
        return (
            "\na package is compiled from source and the base image has no compiler: the wheelhouse holds its sdist, not a wheel. "
            "relearn envs fetch-wheels builds sdists into wheels (with Debian's compiler where they need one) and names those it cannot build"
        )
    sdist = re.findall(r"Processing \S*?/([^/\s]+\.(?:tar\.gz|zip))", log)
    if sdist:
        return f"\n{', '.join(dict.fromkeys(sdist))} is an sdist that failed to build offline: relearn envs fetch-wheels builds sdists into wheels while online"
    return ""
