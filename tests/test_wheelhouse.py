"""`relearn envs fetch-wheels` fills the wheelhouse an offline SWE-bench build needs, resolved
by the image's own interpreter, and the build installs and grades from it alone.

The instance is test_swebench_images' tiny repository with two dependencies of its own, each
standing for a way the `pip download` line users ran by hand fell short: ``redis==5.0.1``
needs ``async-timeout`` only where ``python_full_version < "3.11.3"`` (true for the image's
Debian 3.11.2, false for the Python running these tests), and ``docopt==0.6.2`` exists on PyPI
only as an sdist. The repository has a tag at its base commit and one after it. pip in the
fetch container talks to PyPI through this machine's proxy and certificates, as a user's does.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shlex
import subprocess
from pathlib import Path

import docker
import pytest

from envs.swebench_build import BUILD_TOOLS, build_hint, pip_conf, prepare_testbed
from envs.swebench_specs import install_spec
from envs.tasks import load_tasks
from envs.wheelhouse import (
    LEGACY_EDITABLE_PIP,
    LOCK,
    FetchResult,
    Step,
    build_requires,
    build_tools,
    fetch_script,
    fetch_steps,
    install_target,
    tool_versions,
    write_lock,
)
from tests.test_swebench_images import cli, git, tiny_instance

INSTANCE = "relearn__tinyredis-1"
IMAGE = "swebench/sweb.eval.x86_64.relearn_1776_tinyredis-1:latest"


@pytest.fixture(scope="module")
def repo_row(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("tinyredis")
    # The fix adds a requirement of its own (appdirs, as pylint-dev__pylint-4661's gold does).
    return tiny_instance(
        root, INSTANCE, IMAGE, dependencies=("redis==5.0.1", "docopt==0.6.2"), base_tag="v0.1", fix_dependencies=("appdirs==1.4.4",)
    )


# --- without Docker -----------------------------------------------------------------------------


def test_the_testbed_keeps_the_tags_up_to_the_base_commit_and_none_after(repo_row: dict, tmp_path: Path) -> None:
    prepare_testbed(repo_row["repo"], repo_row["base"], tmp_path / "testbed")
    assert git("tag", cwd=tmp_path / "testbed").split() == ["v0.1"]
    assert git("describe", "--tags", cwd=tmp_path / "testbed").strip() == "v0.1"  # what setuptools-scm versions from
    assert git("rev-list", "--all", cwd=tmp_path / "testbed").split() == [repo_row["base"]]


def test_what_the_fetch_asks_pip_for_follows_the_recipe(repo_row: dict) -> None:
    task = load_tasks(repo_row["rows"])[0][0]
    spec = install_spec(task)
    assert install_target(spec) == "."
    assert build_requires(repo_row["repo"], repo_row["base"]) == ["setuptools>=61"]
    sphinx = spec.__class__("sphinx-doc/sphinx", "3.5", "3.9", "python -m pip install -e .[test]")
    assert install_target(sphinx) == ".[test]"
    seaborn = spec.__class__("mwaskom/seaborn", "0.12", "3.9", "pip install -v -e .[dev] --no-deps")
    assert install_target(seaborn) == ".[dev]"
    script = fetch_script(
        "3.9", [Step("pins", ["a==1", "b>=2; python_version < '3.11'"]), Step("tools", ["pip"], era=False)], "2023-01-02T03:04:05Z"
    )
    # Each open step is bounded by the era and taken newest only when that fails; quoted for the shell.
    assert "--uploaded-prior-to 2023-01-02T03:04:05Z --find-links /wheels a==1 'b>=2; python_version < '\"'\"'3.11'\"'\"''" in script
    assert "report 0 'newer than the era'" in script and "download --find-links /wheels pip >> /fetch/step1.log" in script
    assert "python3.9 -m venv /tmp/fetch" in script
    # With the row's fix applied beside the base: what it adds is listed, and fetched only if any.
    steps = fetch_steps(install_spec_like(), False, ["setuptools>=61"], fix=True)
    fixed = fetch_script("3.9", steps, None, ("sed -i s/a/b/ setup.py",), ".[test]", fixed=True)
    assert "--report /fetch/fixed.json '/fetch/fixed[test]' > /fetch/fixed.log" in fixed and "(cd /fetch/fixed && set -e" in fixed
    assert "grep -vxFf /fetch/repository-requirements.txt /fetch/fixed-requirements.txt > /fetch/fix-requirements.txt" in fixed
    last = len(steps) - 1
    assert steps[last].what == "what the row's fix adds"
    assert f"if [ ! -s /fetch/fix-requirements.txt ]; then report {last} 'nothing to fetch'; else" in fixed
    assert "/fetch/fixed" not in fetch_script("3.9", steps[:last], None)


def test_the_build_tools_are_read_from_the_fetch_log() -> None:
    log = "Saved /wheels/pip-24.0-py3-none-any.whl\nFile was already downloaded /wheels/setuptools-69.5.1-py3-none-any.whl\n"
    log += "Saved ./wheels/wheel-0.43.0-py3-none-any.whl\nSaved /wheels/pytest-8.0.0-py3-none-any.whl\n"
    assert tool_versions(log) == ["pip==24.0", "setuptools==69.5.1", "wheel==0.43.0"]


def test_a_setuptools_without_editable_installs_gets_a_pip_that_falls_back_to_develop() -> None:
    """pylint 2.15's pyproject.toml asks for `setuptools~=62.6`, which has no `build_editable`:
    pip 25.3 refuses its `pip install -e .`, and the build then failed. Its build tools take the
    last pip that falls back to `setup.py develop`; a setuptools that may be 64 or later, or
    another backend, keeps the newest pip."""
    assert fetch_steps(install_spec_like(), False, ["setuptools~=62.6", "wheel~=0.37.1"])[0].args == [LEGACY_EDITABLE_PIP, *BUILD_TOOLS[1:]]
    for legacy in (["setuptools<60"], ["setuptools==63.4.3", "wheel"], ["Setuptools ~= 58.0"]):
        assert build_tools(legacy)[0] == LEGACY_EDITABLE_PIP, legacy
    for legacy in (["setuptools==63.*"], ["setuptools<64"], ["setuptools~=63.4"]):
        assert build_tools(legacy)[0] == LEGACY_EDITABLE_PIP, legacy
    # pylint 3.0's `setuptools~=66.1` has the hook.
    for current in (["setuptools~=66.1", "wheel~=0.37.1"], ["setuptools>=40.8.0", "wheel"], ["setuptools<=64"], ["hatchling"], ["x ("]):
        assert build_tools(current) == list(BUILD_TOOLS), current


def install_spec_like():  # noqa: ANN201 - an InstallSpec with nothing to fetch but the tools
    from envs.swebench_specs import InstallSpec

    return InstallSpec("pylint-dev/pylint", "2.15", "3.9", "python -m pip install -e .")


def test_the_venv_config_makes_editable_installs_put_the_repository_on_the_path() -> None:
    assert pip_conf(False) == ["[install]", "config-settings = editable_mode=compat"]
    assert pip_conf(True)[2:] == ["[global]", "no-index = true", "find-links = /opt/relearn/wheels"]


def test_build_hints_can_be_pasted_and_name_every_package() -> None:
    log = "ERROR: No matching distribution found for exceptiongroup>=1;\nERROR: No matching distribution found for tomli>=1.0.0\n"
    hint = build_hint(log)
    assert "exceptiongroup>=1, tomli>=1.0.0" in hint
    pasted = re.search(r"`(pip download -d WHEELS [^`]+)`", hint).group(1)
    assert shlex.split(pasted) == ["pip", "download", "-d", "WHEELS", "exceptiongroup>=1", "tomli>=1.0.0"]  # `>=` is no redirect
    assert "relearn envs fetch-wheels --tasks TASKS --id INSTANCE" in hint
    compiler = build_hint("building 'pywatchman.bser' extension\nerror: command 'x86_64-linux-gnu-gcc' failed: No such file or directory")
    assert "no compiler" in compiler
    conflict = build_hint(
        "ERROR: Cannot install a==1 and b==2 because these package versions have conflicting dependencies.\nResolutionImpossible"
    )
    assert "conflict" in conflict
    sdist = build_hint("Processing /opt/relearn/wheels/docopt-0.6.2.tar.gz\n  error: subprocess-exited-with-error")
    assert "docopt-0.6.2.tar.gz is an sdist" in sdist
    assert build_hint("something else entirely") == ""


def test_the_lock_lists_every_distribution_with_its_hash_and_keeps_other_fetches(tmp_path: Path) -> None:
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"a wheel")
    (tmp_path / "notes.txt").write_text("not a distribution")
    write_lock(tmp_path, FetchResult("x__y-1", "3.11.2", "2024-01-01T00:00:00Z", [{"step": "tools", "result": "era"}]))
    (tmp_path / "b-2.0.tar.gz").write_bytes(b"an sdist")
    assert write_lock(tmp_path, FetchResult("x__y-2", "3.9.2", None)) == 2
    lock = json.loads((tmp_path / LOCK).read_text())
    assert [f["instance_id"] for f in lock["fetches"]] == ["x__y-1", "x__y-2"]
    assert lock["files"]["a-1.0-py3-none-any.whl"] == {"size": 7, "sha256": hashlib.sha256(b"a wheel").hexdigest()}
    assert set(lock["files"]) == {"a-1.0-py3-none-any.whl", "b-2.0.tar.gz"}


# --- with Docker and PyPI -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fetched(relearn_bin: str, base_image: str, repo_row: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = tmp_path_factory.mktemp("fetched") / "wheels"
    args = ["envs", "fetch-wheels", "-t", str(repo_row["rows"]), "-i", INSTANCE, "--repo", str(repo_row["repo"]), "--wheels", str(wheels)]
    result = cli(relearn_bin, *args, "--python", "3.11")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "docopt-0.6.2.tar.gz" in result.stdout and "the wheelhouse holds" in result.stdout
    return wheels


@pytest.mark.slow  # pip downloads from PyPI in a container; an image build
def test_the_wheelhouse_is_resolved_by_the_images_interpreter(fetched: Path) -> None:
    lock = json.loads((fetched / LOCK).read_text())
    (fetch,) = lock["fetches"]
    assert fetch["python"] == "3.11.2" and platform.python_version() != "3.11.2"  # bookworm's, not this machine's
    assert fetch["era"] == "2026-01-01T00:00:00Z"  # the environment-setup commit's date
    assert fetch["tools"][1:] == list(BUILD_TOOLS[1:]) and re.fullmatch(r"pip==\d+\.\S+", fetch["tools"][0])
    assert [s["step"] for s in fetch["steps"]] == [
        "build tools",
        "packages",
        "the repository's dependencies",
        "the repository's build backend",
        "what the row's fix adds",
    ]
    assert fetch["fix_requirements"] == ["appdirs==1.4.4"] and "appdirs-1.4.4-py2.py3-none-any.whl" in lock["files"]
    names = set(lock["files"])
    assert {n for n in names if n.startswith("redis-5.0.1-")} and {n for n in names if n.startswith("async_timeout-")}
    assert "docopt-0.6.2-py2.py3-none-any.whl" in names and not any(n.endswith(".tar.gz") for n in names)  # built into a wheel
    assert fetch["built"] == ["docopt-0.6.2.tar.gz"] and fetch["unbuilt"] == []
    assert {n.split("-")[0] for n in names} >= {"pip", "setuptools", "wheel", "pytest"}
    for name, entry in lock["files"].items():
        assert hashlib.sha256((fetched / name).read_bytes()).hexdigest() == entry["sha256"]


@pytest.mark.slow  # pip downloads from PyPI in a container; an image build
def test_the_fetched_wheelhouse_builds_offline_and_grades(
    relearn_bin: str, docker_client: docker.DockerClient, fetched: Path, repo_row: dict, tmp_path: Path
) -> None:
    build = ["envs", "build-swebench", "-t", str(repo_row["rows"]), "-i", INSTANCE, "--repo", str(repo_row["repo"])]
    result = cli(relearn_bin, *build, "--wheels", str(fetched), "--python", "3.11", "--force")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        predictions = tmp_path / "preds.jsonl"
        patches = (("gold", repo_row["gold"]), ("empty", ""), ("wrong", repo_row["wrong"]))
        predictions.write_text(
            "".join(json.dumps({"instance_id": INSTANCE, "model_name_or_path": n, "model_patch": p}) + "\n" for n, p in patches)
        )
        verdicts = tmp_path / "verdicts.jsonl"
        graded = cli(relearn_bin, "verify", "-t", str(repo_row["rows"]), "-p", str(predictions), "-o", str(verdicts), "--memory", "3g")
        assert graded.returncode == 0, graded.stdout + graded.stderr
        resolved = {v["model_name_or_path"]: v["resolved"] for v in map(json.loads, verdicts.read_text().splitlines())}
        assert resolved == {"gold": True, "empty": False, "wrong": False}

        def run(command: str) -> str:
            out = docker_client.containers.run(IMAGE, ["bash", "-lc", command], remove=True, network_disabled=True)
            return out.decode().strip()

        assert run("cd /testbed && git tag") == "v0.1"
        # What the fix adds is installed (gold resolved above needs it), the repository at its base.
        assert run("python -c 'import appdirs; print(appdirs.__version__)'") == "1.4.4"
        assert "appdirs" not in run("cd /testbed && cat pyproject.toml")
        tools = json.loads((fetched / LOCK).read_text())["fetches"][0]["tools"]
        assert run("python -m pip --version").startswith(f"pip {tools[0].split('==')[1]} from /opt/miniconda3/envs/testbed/")
        # Started through another link, as tox-current-env starts it, the interpreter keeps the venv.
        linked = run(
            "mkdir -p /tmp/tox/bin && ln -s /opt/miniconda3/envs/testbed/bin/python /tmp/tox/bin/python && /tmp/tox/bin/python -c 'import sys, redis; print(sys.prefix)'"
        )
        assert linked == "/opt/miniconda3/envs/testbed"
        # An editable install (offline, from the wheelhouse) puts /testbed itself on sys.path.
        editable = run(
            "cd /testbed && python -m pip install -q -e . >/dev/null 2>&1; cd / && python -c 'import sys, tinycalc; print(tinycalc.__file__, \"/testbed\" in sys.path)'"
        )
        assert editable == "/testbed/tinycalc/__init__.py True"
    finally:
        docker_client.images.remove(IMAGE, force=True)


@pytest.mark.slow  # pip downloads from PyPI in a container; an image build
def test_a_failed_build_leaves_no_image_under_the_name_and_names_what_is_missing(
    relearn_bin: str, docker_client: docker.DockerClient, base_image: str, wheelhouse: Path, repo_row: dict
) -> None:
    docker_client.images.get(base_image).tag(IMAGE)  # an earlier image under the official name
    build = ["envs", "build-swebench", "-t", str(repo_row["rows"]), "-i", INSTANCE, "--repo", str(repo_row["repo"])]
    result = cli(relearn_bin, *build, "--wheels", str(wheelhouse), "--python", "3.11", "--force")  # pytest, setuptools, wheel only
    assert result.returncode == 1, result.stdout + result.stderr
    text = " ".join((result.stdout + result.stderr).split())
    assert "the wheelhouse lacks" in text and ("redis==5.0.1" in text or "docopt==0.6.2" in text) and f"(image {IMAGE} removed)" in text
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(IMAGE)
    assert subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0


def test_the_plan_prints_the_fetch_that_fills_the_wheelhouse(relearn_bin: str, repo_row: dict, tmp_path: Path) -> None:
    args = ["envs", "build-swebench", "-t", str(repo_row["rows"]), "-i", INSTANCE, "--repo", str(repo_row["repo"]), "--plan"]
    result = cli(relearn_bin, *args, "--wheels", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    command = next(line.strip() for line in result.stdout.splitlines() if line.strip().startswith("relearn envs fetch-wheels"))
    assert shlex.split(command) == [
        "relearn", "envs", "fetch-wheels", "--tasks", str(repo_row["rows"]), "--id", INSTANCE, "--repo", str(repo_row["repo"]),
        "--wheels", str(tmp_path),
    ]  # fmt: skip


def test_an_sdist_that_builds_nowhere_gives_way_to_the_newest_wheel(tmp_path: Path) -> None:
    """The last resort of the fetch, run by bash as the container runs it, with a pip that
    has a wheel of pylibmc only."""
    from envs.wheelhouse import NEWER_WHEEL

    fetch, wheels = tmp_path / "fetch", tmp_path / "wheels"
    fetch.mkdir()
    wheels.mkdir()
    for name in ("pylibmc-1.6.1.tar.gz", "odd-name-0.1.tar.gz"):
        (wheels / name).write_text("an sdist")
    (fetch / "unbuilt.txt").write_text("pylibmc-1.6.1.tar.gz\nodd-name-0.1.tar.gz\n")
    pip = tmp_path / "pip"
    pip.write_text(
        f'#!/bin/bash\necho "$@" >> {tmp_path}/calls\ncase "$*" in *" pylibmc") touch {wheels}/pylibmc-1.6.3-cp39-cp39-manylinux2014_x86_64.whl;; *) exit 1;; esac\n'
    )
    pip.chmod(0o755)
    script = "\n".join(NEWER_WHEEL).replace("/fetch", str(fetch)).replace("/wheels", str(wheels))
    subprocess.run(["bash", "-c", f"pip={pip}\n{script}"], check=True)
    assert (fetch / "replaced.txt").read_text() == "pylibmc-1.6.1.tar.gz\n" and (
        fetch / "unbuilt.txt"
    ).read_text() == "odd-name-0.1.tar.gz\n"
    assert sorted(p.name for p in wheels.iterdir()) == ["odd-name-0.1.tar.gz", "pylibmc-1.6.3-cp39-cp39-manylinux2014_x86_64.whl"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"download --no-input --only-binary=:all: --no-deps -d {wheels} {p}" for p in ("pylibmc", "odd-name")]


def test_the_era_is_never_before_the_instances_python() -> None:
    from envs.wheelhouse import era_of

    assert era_of("2015-12-01T00:00:00Z", "3.9") == "2020-10-05T00:00:00Z"  # requests 2.9 on 3.9
    assert era_of("2023-07-17T18:26:37Z", "3.11") == "2023-07-17T18:26:37Z"  # django 5.0: its own date
    assert era_of(None, "3.11") == "2022-10-24T00:00:00Z" and era_of("2015-01-01T00:00:00Z", "3.5") == "2015-01-01T00:00:00Z"
