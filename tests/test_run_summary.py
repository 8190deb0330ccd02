"""The run and demo summary table never folds a path a person may copy (issue 47): at any
width, piped or not, a path in a cell is printed whole under the table and the cell says
"below"; a pipeline path too long for the title gets a line of its own."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import relearn.cli.run as run_cli
from relearn.pipeline.runner import StageResult

WORK = "/tmp/a-rather-long-folder-name/cases/two-runs-one-workdir/work"
PIPELINE = "/tmp/a-rather-long-folder-name/cases/two-runs-one-workdir/p.toml"


def results() -> list[StageResult]:
    return [
        StageResult("masks:ross", "ran", 7.1, {"trajectories_in": 24, "audit": {"applied": False, "note": "no tasks named"}}),
        StageResult("upstream", "current", 0.0, {"model": f"{WORK}/upstream"}),
        StageResult("verify", "failed", 1.0, {}, error=f"{WORK}/tasks.jsonl:3: instance_id: missing"),
        StageResult("analyze", "failed", 1.0, {}, error="the model ran out of memory"),
        StageResult("report", "ran", 3.4, {"report": f"{WORK}/report/report.md"}),
    ]


@pytest.mark.parametrize("width", [30, 60, 80, 200])
def test_paths_are_printed_whole_under_the_table(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(run_cli, "out", Console(file=buffer, width=width, force_terminal=False))
    below = run_cli._summary(results(), f"relearn run {PIPELINE}")  # noqa: SLF001
    lines = buffer.getvalue().splitlines()
    assert below == [
        f"model: {WORK}/upstream",
        f"verify failed: {WORK}/tasks.jsonl:3: instance_id: missing",
        f"report: {WORK}/report/report.md",
    ]
    for line in below:
        assert line in lines  # one line, whole
    assert any(PIPELINE in line for line in lines)
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert all("/tmp/" not in line for line in table)  # no piece of a path is left in a cell
    if width >= 80:  # an error that names no path stays in its cell; the others say "below"
        assert any("the model ran out of memory" in line for line in table)
        assert sum("below" in line for line in table) == 3
