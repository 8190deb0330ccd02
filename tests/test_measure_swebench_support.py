"""scripts/measure_swebench_support.py (issue 50's recall sweep): the seeded draw over the real
Verified rows, and the table's "not right" cell read from a row alone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pyarrow.parquet as pq
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "measure_swebench_support.py"
MIRRORED = {
    "django/django",
    "sympy/sympy",
    "sphinx-doc/sphinx",
    "psf/requests",
    "pylint-dev/pylint",
    "pytest-dev/pytest",
    "pallets/flask",
    "mwaskom/seaborn",
}


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("measure_swebench_support", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rows(samples: Path) -> list[dict]:
    return pq.read_table(samples / "swebench_verified.parquet").to_pylist()


def test_the_seed_2026_draw_covers_every_repository_and_only_versions_that_build(script: ModuleType, rows: list[dict]) -> None:
    drawn, left_out = script.sample(rows, MIRRORED, 40, 2026)
    by_id = {r["instance_id"]: r for r in rows}
    assert len(drawn) == len(set(drawn)) == 40
    assert {by_id[i]["repo"] for i in drawn} == MIRRORED  # at least one each
    assert not {f"{by_id[i]['repo']} {by_id[i]['version']}" for i in drawn} & set(left_out)
    assert "django/django 3.2" in left_out and "needs --python-image" in left_out["django/django 3.2"]
    # The repositories take turns, so a sweep stopped early has covered all of them.
    assert {by_id[i]["repo"] for i in drawn[: len(MIRRORED)]} == MIRRORED
    # The draw recorded in the sweep's sample.json (2026-12-06) starts so; the seed makes it stable.
    assert drawn[:3] == ["django__django-16032", "sympy__sympy-12419", "sphinx-doc__sphinx-10673"]


def test_adding_a_mirror_changes_no_other_repositorys_instances(script: ModuleType, rows: list[dict]) -> None:
    fewer = set(MIRRORED) - {"mwaskom/seaborn"}
    by_id = {r["instance_id"]: r for r in rows}
    django = lambda ids: [i for i in ids if by_id[i]["repo"] == "django/django"]  # noqa: E731
    first, second = django(script.sample(rows, fewer, 40, 2026)[0]), django(script.sample(rows, MIRRORED, 40, 2026)[0])
    # The share may change by one; the instances drawn in order do not.
    assert first[: min(len(first), len(second))] == second[: min(len(first), len(second))]


def _row(instance: str, repo: str, version: str, gold: dict, outcome: str = "graded wrong") -> dict:
    empty = {"resolved": False, "FAIL_TO_PASS": [0, 1], "PASS_TO_PASS": [1, 0], "official": "unresolved"}
    return {
        "instance_id": instance,
        "repo": repo,
        "version": version,
        "outcome": outcome,
        "graded": {"gold": gold, "empty": empty, "wrong": dict(empty)},
    }


def test_the_table_says_why_a_row_is_not_right_from_the_row_alone(script: ModuleType) -> None:
    # psf__requests-2317's row: httpbin.org unreachable with the network off, every patch unresolved.
    requests = _row(
        "psf__requests-2317",
        "psf/requests",
        "2.4",
        {"resolved": False, "FAIL_TO_PASS": [0, 8], "PASS_TO_PASS": [81, 52], "error": None, "disagreements": [], "official": "unresolved"},
    )
    # pylint-dev__pylint-4661's first row: a collection error, no report and no swebench grade.
    pylint = _row(
        "pylint-dev__pylint-4661",
        "pylint-dev/pylint",
        "2.10",
        {"resolved": False, "error": "pytest ended with a usage error (exit status 4) and wrote no report"},
    )
    leaky = _row("x__y-1", "x/y", "1.0", {"resolved": True, "FAIL_TO_PASS": [1, 0], "PASS_TO_PASS": [1, 0], "official": "resolved"})
    leaky["graded"]["empty"]["resolved"] = True
    right = _row(
        "x__y-2", "x/y", "1.0", {"resolved": True, "FAIL_TO_PASS": [1, 0], "PASS_TO_PASS": [1, 0], "official": "resolved"}, "graded right"
    )
    lines = script.table([requests, pylint, leaky, right]).splitlines()
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert cells["`psf/requests`"][-1] == (
        "psf__requests-2317 (2.4): gold unresolved (FAIL_TO_PASS 0/8, PASS_TO_PASS 81/133); swebench's grade of the same output: unresolved"
    )
    assert cells["`psf/requests`"][-2] == "3 of 3 patches"
    assert (
        cells["`pylint-dev/pylint`"][-1]
        == "pylint-dev__pylint-4661 (2.10): gold unresolved (pytest ended with a usage error (exit status 4) and wrote no report)"
    )
    assert cells["`x/y`"][1:4] == ["2", "2", "1"]  # built, gold resolved, graded right
    assert cells["`x/y`"][-1] == "x__y-1 (1.0): empty patch resolved"
