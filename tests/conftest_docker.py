"""Fixtures for tests that run on the real Docker engine (started by `make test`)."""

from __future__ import annotations

import docker
import pytest

from envs.docker_backend import client_from_env
from envs.images import build_base


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    # No skip: these tests are how the container stages are proven; without an engine
    # the suite must fail and say why.
    return client_from_env()


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> str:
    return build_base(docker_client, log=lambda _m: None)
