from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from envs.docker_backend import client_from_env  # noqa: E402
from envs.images import build_base, task_image  # noqa: E402
from envs.tasks import load_tasks  # noqa: E402

MINI_SUITE = ROOT / "envs" / "mini_tasks"
WHEELS = ["pytest", "setuptools", "wheel"]  # the requests recipe installs pytest; `pip install .` needs setuptools


@pytest.fixture
def samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.fail(f"the shared samples folder is missing: {SAMPLES}")
    return SAMPLES


@pytest.fixture(scope="session")
def relearn_bin() -> str:
    """The installed console script, next to the interpreter running the tests."""
    path = Path(sys.executable).parent / "relearn"
    assert path.exists(), f"relearn is not installed in {path.parent}"
    return str(path)


@pytest.fixture(scope="session")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="session")
def tok(tokenizer_cache: Path):  # noqa: ANN201
    """The built-in qwen3.6 tokenizer, built once per session into a cache of its own (so a
    stale cache on the machine can never stand in for the build)."""
    from relearn.masks.tokenizers import load_tokenizer

    return load_tokenizer("qwen3.6", cache_dir=tokenizer_cache)


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", os.environ.get("TEST_COLUMNS", "200"))


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    # No skip: these tests are how the container stages are proven; without an engine
    # the suite must fail and say why (`make test` starts one).
    return client_from_env()


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> str:
    return build_base(docker_client, log=lambda _m: None)


@pytest.fixture(scope="session")
def images(docker_client: docker.DockerClient, base_image: str) -> dict[str, str]:
    """The mini suite's task images, by instance id (built once per engine)."""
    tasks, _errors = load_tasks(MINI_SUITE)
    return {t.instance_id: task_image(docker_client, t, base_image) for t in tasks}


# Pieces of the suite: a test is `docker` when it asks for the engine through these
# fixtures (directly or through another fixture), `ray` when its module starts a cluster;
# `slow` is marked by hand in the modules (pytestmark or per test).
DOCKER_FIXTURES = frozenset({"docker_client", "base_image", "images"})
RAY_MODULES = frozenset({"test_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if DOCKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)
        module = getattr(item, "module", None)
        if module is not None and module.__name__.rsplit(".", 1)[-1] in RAY_MODULES:
            item.add_marker(pytest.mark.ray)


def cached_wheels(name: str, packages: list[str], first: str) -> Path:
    """Wheels of ``packages`` for CPython 3.11 on manylinux, downloaded from PyPI once per machine
    into the relearn cache (``name``, keyed by the list) and reused by every session; ``first``:
    the file name prefix whose presence says the folder is complete."""
    key = hashlib.sha256(" ".join(["3.11", *packages]).encode()).hexdigest()[:12]
    folder = Path(os.environ.get("RELEARN_CACHE", Path.home() / ".cache" / "relearn")) / name / key
    if folder.is_dir() and any(folder.glob(f"{first}-*.whl")):
        return folder
    partial = folder.with_name(folder.name + ".partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "-d", str(partial), "--only-binary=:all:", "--python-version", "3.11"]
    command += ["--platform", "manylinux2014_x86_64", "--implementation", "cp", *packages]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.fail(f"could not download {' '.join(packages)} from PyPI into {name}: {result.stderr[-2000:]}")
    partial.rename(folder)
    return folder


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """pytest, setuptools and wheel for CPython 3.11, downloaded from PyPI once per machine
    (under the relearn cache) and reused by every session."""
    return cached_wheels("test-wheelhouse", WHEELS, "pytest")
