from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.fail(f"the shared samples folder is missing: {SAMPLES}")
    return SAMPLES


@pytest.fixture
def relearn_bin() -> str:
    """The installed console script, next to the interpreter running the tests."""
    path = Path(sys.executable).parent / "relearn"
    assert path.exists(), f"relearn is not installed in {path.parent}"
    return str(path)


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", os.environ.get("TEST_COLUMNS", "200"))


pytest_plugins = ["tests.conftest_docker"]
