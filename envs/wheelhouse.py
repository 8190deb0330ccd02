"""Filling a SWE-bench instance's wheelhouse where PyPI answers, so that its image then builds
offline (``envs.swebench_build``).

``pip download`` run on the user's machine resolves for the wrong interpreter: environment
markers are evaluated for the Python that runs pip, whatever ``--python-version`` says
(``exceptiongroup; python_version < "3.11"`` is dropped when pip runs on 3.11 for a 3.9
image). So pip runs inside a container of the image's own base (the same Debian suite or
``--python-image``), with its network, and downloads what each install step of the build will
ask for, step by step in the build's order, each resolved as the build resolves it:

1. pip, setuptools and wheel (``BUILD_TOOLS``: the newest pip for that Python, the one this
   fetch resolves with, or the last that falls back to ``setup.py develop`` where the build
   backend is a setuptools without editable installs; setuptools and wheel pinned), which the
   build installs first;
2. the repository's requirements file (as swebench writes it: ``-r`` includes inlined);
3. the spec's packages, then its pinned pip packages: installed after the requirements, the
   pins win at build time as they do in swebench's installer, so both versions are kept;
4. the repository's own dependencies at the base commit, after the spec's pre-install lines
   (which rewrite pins in ``setup.py``), for the extras its install names, listed from the
   metadata pip builds for it; then the build backend its ``pyproject.toml`` asks for.

Where the spec leaves a version open, the instance's era decides: ``--uploaded-prior-to`` the
environment-setup commit's date, or the instance's Python's release where that is later (an
exact pin newer than that date is fetched as it is, and a step that cannot resolve within the
era is taken newest, the lock says which and why). Packages PyPI has only as sdists are built into wheels in the same
container; one that cannot build there (a compiler it lacks) is named with the reason. What
the wheelhouse holds is written to ``relearn-wheelhouse.lock.json`` beside the wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import docker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from envs.docker_backend import LABEL_HOST, LABEL_OWNER, LABEL_PID, LABEL_RUN, OWNER
from envs.swebench_build import BUILD_TOOLS, DISTRIBUTIONS, LOCK, BuildFailed, prepare_testbed, python_base, requirements_text
from envs.swebench_specs import InstallSpec
from envs.tasks import Task

# Where pip in the fetch container finds the host's certificates (a TLS-intercepting proxy's CA).
CA_IN_CONTAINER = "/etc/relearn-ca.crt"
PASSED_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")


@dataclass
class Step:
    what: str  # said in the lock and the log
    args: list[str]  # pip download arguments (requirements or -r FILE)
    era: bool = True  # bounded by --uploaded-prior-to
    exact: list[str] = field(default_factory=list)  # `name==version` pins fetched first, whatever their date
    only_if: str = ""  # a file the step's requirements are in, which may be empty: then nothing is fetched


@dataclass
class FetchResult:
    instance_id: str
    python: str  # the interpreter pip ran on, as it reports itself
    era: str | None
    steps: list[dict[str, str]] = field(default_factory=list)  # {"step", "result"}
    tools: list[str] = field(default_factory=list)  # pip, setuptools and wheel as `name==version`
    built: list[str] = field(default_factory=list)  # sdists built into wheels
    replaced: list[str] = field(default_factory=list)  # sdists that built nowhere, replaced by the project's newest wheel
    unbuilt: list[str] = field(default_factory=list)  # "file: why", sdists left as they are
    fix_requirements: list[str] = field(default_factory=list)  # what the row's own fix adds to the repository's requirements
    files: int = 0
    seconds: float = 0.0


def install_target(spec: InstallSpec) -> str:
    """What the repository's own install names: ``.``, ``.[test]``, ``.[dev]``."""
    match = re.search(r"pip install(?:\s+-\S+)*\s+(?:-e\s+)?(\.(?:\[[^\]]*\])?)(?:\s|$)", spec.install)
    return match.group(1) if match else "."


def build_requires(source: Path, commit: str) -> list[str]:
    """The ``[build-system] requires`` of the repository's ``pyproject.toml`` at ``commit``;
    pip's own default for a project without one (setuptools and wheel)."""
    shown = subprocess.run(["git", "-C", str(source), "show", f"{commit}:pyproject.toml"], capture_output=True, text=True)
    default = ["setuptools>=40.8.0", "wheel"]
    if shown.returncode != 0:
        return default
    try:
        requires = tomllib.loads(shown.stdout).get("build-system", {}).get("requires")
    except tomllib.TOMLDecodeError as exc:
        raise BuildFailed(f"pyproject.toml at {commit[:12]}: {exc}") from None
    return [str(r) for r in requires] if isinstance(requires, list) else default


def commit_date(source: Path, commit: str) -> str | None:
    """The committer date of ``commit`` in UTC, as pip's ``--uploaded-prior-to`` reads it."""
    shown = subprocess.run(["git", "-C", str(source), "show", "-s", "--format=%ct", commit], capture_output=True, text=True)
    if shown.returncode != 0 or not shown.stdout.strip():
        return None
    return datetime.fromtimestamp(int(shown.stdout.strip()), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The first releases of each Python: an era before its interpreter was released would pick
# releases never made for it (requests 2.9's era, 2015, took pytest 2.8, which installs on 3.9
# but has no `pytest` command); the official images, built with that Python, never saw them.
PYTHON_RELEASED = {
    "3.9": "2020-10-05T00:00:00Z", "3.10": "2021-10-04T00:00:00Z", "3.11": "2022-10-24T00:00:00Z",
    "3.12": "2023-10-02T00:00:00Z", "3.13": "2024-10-07T00:00:00Z",
}  # fmt: skip


def era_of(commit: str | None, python: str) -> str | None:
    """The date open versions are taken as of: the environment-setup commit's, or the
    instance's Python's release where that is later."""
    released = PYTHON_RELEASED.get(python)
    if commit is None:
        return released
    return max(commit, released) if released else commit


# pip 25.3 dropped the fallback to `setup.py develop` for a build backend without PEP 660's
# `build_editable` hook, which setuptools has from 64 on: a repository whose pyproject.toml
# pins an older one (pylint 2.15's `setuptools~=62.6`) could no longer be installed editable
# ("missing the 'build_editable' hook"). Its build gets the last pip that falls back.
LEGACY_EDITABLE_PIP = "pip<25.3"
PEP660_SETUPTOOLS = Version("64")


def build_tools(build: list[str]) -> list[str]:
    """The pip, setuptools and wheel the build installs first, given the repository's build
    requirements: ``BUILD_TOOLS``, with a pip that still falls back to ``setup.py develop``
    where the backend is a setuptools older than PEP 660."""
    for line in build:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) == "setuptools" and _caps_below(requirement.specifier, PEP660_SETUPTOOLS):
            return [LEGACY_EDITABLE_PIP, *BUILD_TOOLS[1:]]
    return list(BUILD_TOOLS)


def _caps_below(specifier: SpecifierSet, version: Version) -> bool:
    """Whether ``specifier`` admits no release from ``version`` on: `~=62.6`, `<60`, `==63.*`
    do; `>=40.8.0`, `~=66.1`, `<=64` do not."""
    for clause in specifier:
        bound = Version(clause.version.removesuffix(".*"))
        if (clause.operator == "<" and bound <= version) or (clause.operator in ("<=", "==", "===", "~=") and bound < version):
            return True
    return False


def fetch_steps(spec: InstallSpec, requirements: bool, build: list[str], fix: bool = False) -> list[Step]:
    steps = [Step("build tools", build_tools(build), era=False)]
    if requirements:
        steps.append(Step("requirements file", ["-r", "/fetch/requirements.txt"]))
    if spec.packages:
        steps.append(Step("packages", list(spec.packages)))
    if spec.pip_packages:
        exact = [p for p in spec.pip_packages if re.fullmatch(r"[A-Za-z0-9._-]+(\[[^\]]*\])?==[^,;\s]+", p)]
        steps.append(Step("pinned pip packages", list(spec.pip_packages), exact=exact))
    steps.append(Step("the repository's dependencies", ["-r", "/fetch/repository-requirements.txt"]))
    steps.append(Step("the repository's build backend", build))
    if fix:
        steps.append(Step("what the row's fix adds", ["-r", FIX_REQUIREMENTS], only_if=FIX_REQUIREMENTS))
    return steps


# Run by the fetch venv's Python: the requirements a `pip install --dry-run --report` of the
# repository lists, markers evaluated by this interpreter for the extras the install names.
REQUIRES_PY = """import json, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

report, extras = json.load(open(sys.argv[1])), [e for e in sys.argv[2].split(",") if e]
for item in report["install"]:
    own = canonicalize_name(item["metadata"]["name"])
    for line in item["metadata"].get("requires_dist") or []:
        req = Requirement(line)
        if canonicalize_name(req.name) == own:
            continue
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ["", *extras]):
            print(req.name + ("[" + ",".join(sorted(req.extras)) + "]" if req.extras else "") + str(req.specifier))
"""


def repository_requirements_lines(target: str, tree: str = "src", name: str = "repository", on_failure: str = "exit 4") -> list[str]:
    """Lists the repository's own requirements (in ``/fetch/TREE``, into
    ``/fetch/NAME-requirements.txt``): its metadata built by the newest pip and backend (an
    era's setuptools can write versions today's pip refuses, as Sphinx 3.5's
    ``3.5.0.dev20210306.dev-20210306``), then resolved within the era like any other step."""
    extras = target[2:-1] if target.startswith(".[") else ""
    return [
        f"$pip install --no-input --dry-run --ignore-installed --no-deps --quiet --report /fetch/{name}.json "
        f"{shlex.quote(f'/fetch/{tree}' + target[1:])} > /fetch/{name}.log 2>&1 "
        f"&& /tmp/fetch/bin/python /fetch/requires.py /fetch/{name}.json {shlex.quote(extras)} > /fetch/{name}-requirements.txt "
        f"|| {{ echo 'relearn: the metadata of /fetch/{tree} could not be built (see {name}.log)' >&2; cat /fetch/{name}.log >&2; {on_failure}; }}"
    ]


# The row's own fix can add a requirement: pylint-dev__pylint-4661's gold patch adds `appdirs`
# to setup.cfg and imports it. The official harness's eval script reinstalls the package with
# the network on; here the network is off and the verifier puts setup.cfg back, so the image
# holds what the fix adds, installed after the repository (`envs.swebench_build.install_script`).
FIX_REQUIREMENTS = "/fetch/fix-requirements.txt"


def fix_requirements_lines(target: str, pre_install: tuple[str, ...]) -> list[str]:
    """Lists what the repository with the row's fix applied (``/fetch/fixed``) requires and
    the repository at its base does not. A fix whose metadata does not build adds nothing."""
    lines = []
    if pre_install:
        body = "\n".join(pre_install)
        lines.append(f"(cd /fetch/fixed && set -e\n{body}\n) >> /fetch/pre_install.log 2>&1")
    listed = repository_requirements_lines(target, "fixed", "fixed", on_failure=": > /fetch/fixed-requirements.txt")
    return [
        *lines,
        *listed,
        f"grep -vxFf /fetch/repository-requirements.txt /fetch/fixed-requirements.txt > {FIX_REQUIREMENTS} || true",
    ]


def fetch_script(
    python: str, steps: list[Step], era: str | None, pre_install: tuple[str, ...] = (), target: str = ".", fixed: bool = False
) -> str:
    """The script the fetch container runs: a venv with the newest pip for this Python (the
    build's; it has ``--uploaded-prior-to``), the spec's pre-install lines in the repository
    (they rewrite its pins: sphinx's ``sed -i ... setup.py``), the repository's own
    requirements listed (and, with ``fixed``, what the row's fix adds to them), each step
    downloaded, sdists built into wheels, a report."""
    lines = [
        "#!/bin/bash",
        "set -uo pipefail",
        f'command -v python{python} >/dev/null || {{ echo "relearn: the base image has no python{python}" >&2; exit 3; }}',
        f"python{python} -m venv /tmp/fetch || exit 3",
        *UPGRADE_PIP,
        'download() { $pip download --no-input --progress-bar off -d /wheels "$@"; }',
        'report() { printf \'%s\\t%s\\n\' "$1" "$2" >> /fetch/report.tsv; }',
        "/tmp/fetch/bin/python -c 'import platform; print(platform.python_version())' > /fetch/python.txt",
    ]
    if pre_install:
        body = "\n".join(pre_install)
        lines.append(
            f"(cd /fetch/src && set -e\n{body}\n) > /fetch/pre_install.log 2>&1 || echo 'relearn: a pre-install line failed here (see pre_install.log)' >&2"
        )
    lines += repository_requirements_lines(target)
    if fixed:
        lines += fix_requirements_lines(target, pre_install)
    for number, step in enumerate(steps):
        words = " ".join(shlex.quote(a) for a in step.args)
        log = f"/fetch/step{number}.log"
        if step.only_if:
            lines.append(f"if [ ! -s {step.only_if} ]; then report {number} 'nothing to fetch'; else")
        if step.exact:
            # A pin newer than the era is the spec's word: fetched as it is, its dependencies
            # then resolved within the era against it.
            pins = " ".join(shlex.quote(a) for a in step.exact)
            lines.append(f"download --no-deps {pins} > {log} 2>&1 || {{ report {number} failed; exit 0; }}")
        # What earlier steps fetched counts, whatever its date (pip reads no upload time from a
        # folder): pytest 4.5 pins atomicwrites 1.4.1, the only release its author left, uploaded
        # after that era, and the repository's own `atomicwrites>=1.0` then found it there.
        words = f"--find-links /wheels {words}"
        if step.era and era:
            lines += [
                f"if download --uploaded-prior-to {era} {words} > /fetch/step{number}.era.log 2>&1; then report {number} era;",
                f"elif download {words} >> {log} 2>&1; then report {number} 'newer than the era';",
                f"else report {number} failed; fi",
            ]
        else:
            lines.append(f"if download {words} >> {log} 2>&1; then report {number} ok; else report {number} failed; fi")
        if step.only_if:
            lines.append("fi")
    return "\n".join([*lines, *wheel_lines()]) + "\n"


UPGRADE_PIP = [
    "pip=/tmp/fetch/bin/pip",
    '$pip install --no-input -q --upgrade pip || { echo "relearn: pip could not be upgraded from the index" >&2; exit 3; }',
]


def wheel_lines() -> list[str]:
    """Build every sdist in the wheelhouse into a wheel (then drop the sdist), naming those
    that do not build."""
    return [
        "shopt -s nullglob",
        "rm -f /fetch/unbuilt.txt",
        "for sdist in /wheels/*.tar.gz /wheels/*.zip /wheels/*.tar.bz2; do",
        '    name=$(basename "$sdist")',
        '    if $pip wheel --no-input --no-deps -w /wheels "$sdist" > "/fetch/wheel-$name.log" 2>&1; then',
        '        rm -f "$sdist"; printf "%s\\n" "$name" >> /fetch/built.txt',
        '    else printf "%s\\n" "$name" >> /fetch/unbuilt.txt; fi',
        "done",
    ]


# An sdist that builds nowhere (pylibmc 1.6.1 wants libmemcached's headers): the newest release
# of that project that has a wheel for this Python takes its place, and the lock says so.
NEWER_WHEEL = [
    "if [ -f /fetch/unbuilt.txt ]; then",
    "    mv /fetch/unbuilt.txt /fetch/unbuilt.first",
    "    while read -r name; do",
    "        project=$(printf '%s' \"$name\" | sed -E 's/-[^-]+\\.(tar\\.gz|zip|tar\\.bz2)$//')",
    '        if $pip download --no-input --only-binary=:all: --no-deps -d /wheels "$project" > "/fetch/newer-$name.log" 2>&1; then',
    '            rm -f "/wheels/$name"; printf "%s\\n" "$name" >> /fetch/replaced.txt',
    '        else printf "%s\\n" "$name" >> /fetch/unbuilt.txt; fi',
    "    done < /fetch/unbuilt.first",
    "fi",
]


# What building C extensions into wheels needs, for the sdists the plain base cannot build
# (Django's pywatchman): the wheels it makes are for the image's own Debian and Python.
COMPILER_PACKAGES = ("build-essential", "python3-dev")


def ca_bundle() -> Path | None:
    """The certificates pip on this machine trusts, for pip in the container."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return default if default.is_file() else None


def fetch_wheels(
    client: docker.DockerClient,
    task: Task,
    spec: InstallSpec,
    *,
    source: Path,
    wheels: Path,
    python: str | None = None,
    python_image: str | None = None,
    era: bool = True,
    log: Callable[[str], None] = print,
) -> FetchResult:
    """Download into ``wheels`` everything ``task``'s offline build installs; online."""
    if not task.base_commit:
        raise BuildFailed(f"{task.instance_id}: the row has no base_commit")
    started = time.monotonic()
    chosen = python or spec.python
    base = python_base(client, spec, chosen, python_image, log)
    date = era_of(commit_date(source, task.environment_setup_commit or task.base_commit), chosen) if era else None
    wheels.mkdir(parents=True, exist_ok=True)
    result = FetchResult(task.instance_id, chosen, date)
    with tempfile.TemporaryDirectory(prefix="relearn-fetch-") as tmp:
        work = Path(tmp)
        prepare_testbed(source, task.base_commit, work / "src")
        fixed = bool(task.patch) and _with_fix(source, task, work / "fixed", log)
        requirements = requirements_text(source, spec, task)
        (work / "requirements.txt").write_text(requirements)
        steps = fetch_steps(spec, bool(requirements.strip()), build_requires(source, task.base_commit), fixed)
        (work / "requires.py").write_text(REQUIRES_PY)
        (work / "fetch.sh").write_text(fetch_script(chosen, steps, date, spec.pre_install, install_target(spec), fixed))
        log(f"{task.instance_id}: pip download in {base} (python{chosen}), {len(steps)} steps" + (f", era {date}" if date else ""))
        exit_code, output = _run(client, base, work, wheels)
        report = _read_report(work)
        result.python = (work / "python.txt").read_text().strip() if (work / "python.txt").exists() else chosen
        if exit_code in (3, 4) or not report:
            raise BuildFailed(f"{task.instance_id}: the fetch container failed before downloading (exit {exit_code}):\n{output[-2000:]}")
        for number, step in enumerate(steps):
            outcome = report.get(number, "not run")
            entry = {"step": step.what, "result": outcome}
            if outcome == "newer than the era":
                entry["why"] = _first_error(_read(work / f"step{number}.era.log"))
            result.steps.append(entry)
            if outcome in ("failed", "not run"):
                tail = _read(work / f"step{number}.log")[-2500:]
                raise BuildFailed(f"{task.instance_id}: pip download of {step.what} failed:\n{tail}{download_hint(tail)}")
        result.tools = tool_versions(_read(work / "step0.era.log") + _read(work / "step0.log"))
        result.fix_requirements = _lines(work / "fix-requirements.txt")
        unbuilt = _lines(work / "unbuilt.txt")
        if unbuilt:
            # Again with Debian's compiler (not for --python-image: nothing can be added to it),
            # then, for what still does not build, the newest release that has a wheel.
            log(f"{task.instance_id}: {len(unbuilt)} sdists did not build into wheels ({', '.join(unbuilt)}): trying again with a compiler")
            again = python_image or python_base(client, spec, chosen, None, log, extra_packages=COMPILER_PACKAGES)
            script = [
                "#!/bin/bash",
                "set -uo pipefail",
                f"python{chosen} -m venv /tmp/fetch || exit 3",
                *UPGRADE_PIP,
                *wheel_lines(),
                *NEWER_WHEEL,
            ]
            (work / "wheels.sh").write_text("\n".join(script) + "\n")
            _run(client, again, work, wheels, script="/fetch/wheels.sh")
            result.replaced = _lines(work / "replaced.txt")
        result.built = _lines(work / "built.txt")
        for name in _lines(work / "unbuilt.txt"):
            result.unbuilt.append(f"{name}: {_build_failure(_read(work / f'wheel-{name}.log'))}")
    result.files = write_lock(wheels, result)
    result.seconds = time.monotonic() - started
    return result


def _run(client: docker.DockerClient, image: str, work: Path, wheels: Path, script: str = "/fetch/fetch.sh") -> tuple[int, str]:
    volumes = {str(work): {"bind": "/fetch", "mode": "rw"}, str(wheels.resolve()): {"bind": "/wheels", "mode": "rw"}}
    environment = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "120"}
    ca = ca_bundle()
    if ca is not None:
        volumes[str(ca.resolve())] = {"bind": CA_IN_CONTAINER, "mode": "ro"}
        environment["PIP_CERT"] = CA_IN_CONTAINER
    for name in PASSED_ENV:
        value = os.environ.get(name)
        if value and not value.startswith("file:"):
            environment[name] = value
    # Owned as every relearn container is, so that `relearn envs gc` sweeps one a killed fetch left.
    labels = {LABEL_OWNER: OWNER, LABEL_RUN: "fetch-wheels", LABEL_PID: str(os.getpid()), LABEL_HOST: socket.gethostname()}
    container = client.containers.run(image, ["bash", script], volumes=volumes, environment=environment, labels=labels, detach=True)
    try:
        status = container.wait()
        output = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    return int(status.get("StatusCode", 1)), output


def _read_report(work: Path) -> dict[int, str]:
    report: dict[int, str] = {}
    for line in _lines(work / "report.tsv"):
        number, _, outcome = line.partition("\t")
        report[int(number)] = outcome
    return report


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _first_error(log: str) -> str:
    """The line that says why pip gave up: its first error, or the last line of a traceback."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:") and line != "ERROR: Exception:"]
    return (errors[0] if errors else lines[-1] if lines else "")[:300]


def tool_versions(log: str) -> list[str]:
    """``pip==X``, ``setuptools==Y``, ``wheel==Z`` as the build-tools step fetched them, so
    that the build installs those and not whatever newer one another step brought."""
    found = dict(re.findall(r"/wheels/(pip|setuptools|wheel)-([^-/\s]+)-", log))
    return [f"{name}=={found[name]}" for name in ("pip", "setuptools", "wheel") if name in found]


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _build_failure(log: str) -> str:
    if re.search(r"\b(x86_64-linux-gnu-)?(gcc|g\+\+|cc)\b[^\n]*(failed|not found|No such file)|[Cc]ompiler", log):
        return "it compiles C code and no compiler could build it (find a version with a wheel, or --python-image with a compiler)"
    tail = [line for line in log.splitlines() if line.strip()][-3:]
    return " / ".join(tail)[-400:] or "pip wheel failed"


def _with_fix(source: Path, task: Task, dest: Path, log: Callable[[str], None]) -> bool:
    """``dest``: the testbed with the row's own fix applied; False when it does not apply."""
    prepare_testbed(source, task.base_commit or "", dest)
    applied = subprocess.run(
        ["git", "-C", str(dest), "apply", "--whitespace=nowarn", "-"], input=task.patch, capture_output=True, text=True
    )
    if applied.returncode != 0:
        log(f"{task.instance_id}: the row's fix does not apply at the base commit; what it adds to the requirements is not fetched")
    return applied.returncode == 0


def download_hint(log: str) -> str:
    """A line to act on for the ways a download fails: what is missing or conflicts, named."""
    missing = list(dict.fromkeys(re.findall(r"No matching distribution found for (\S+)", log)))
    if missing:
        return (
            f"\nno release of {', '.join(missing)} fits this Python and platform (or the pin names a version that does not exist); "
            "check the pin against PyPI, or build with --python VERSION"
        )
    if "ResolutionImpossible" in log or "conflicting dependencies" in log:
        return "\nthe requirements of this step conflict with each other (the lines above name them); the spec's pins are installed after the requirements file, so they need not resolve together"
    return ""


def write_lock(wheels: Path, result: FetchResult) -> int:
    """Rewrite the lock with every distribution the wheelhouse now holds, keeping the
    earlier fetches' entries; returns how many files it holds."""
    path = wheels / LOCK
    lock = json.loads(path.read_text()) if path.exists() else {"fetches": [], "files": {}}
    files: dict[str, str] = {}
    for item in sorted(wheels.iterdir()):
        if item.is_file() and item.name.endswith(DISTRIBUTIONS):
            known = lock.get("files", {}).get(item.name)
            files[item.name] = (
                known if known and known.get("size") == item.stat().st_size else {"size": item.stat().st_size, "sha256": _sha256(item)}
            )
    fetches = [f for f in lock.get("fetches", []) if f.get("instance_id") != result.instance_id]
    fetches.append(
        {
            "instance_id": result.instance_id,
            "python": result.python,
            "era": result.era,
            "tools": result.tools,
            "steps": result.steps,
            "built": result.built,
            "replaced": result.replaced,
            "unbuilt": result.unbuilt,
            "fix_requirements": result.fix_requirements,
        }
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fetches": fetches, "files": files}, indent=1) + "\n")
    tmp.replace(path)
    return len(files)


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
