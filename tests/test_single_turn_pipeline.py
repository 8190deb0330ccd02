"""`relearn run` on a single-turn pool: import -> verify -> keep review (scripted judges over HTTP)
-> masks (Positive-Rollout SFT and ROSS = A ∩ K) -> train (tiny model) -> report; then the window statistics."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from envs.single_turn.tasks import MINI_ROLLOUTS
from relearn.pipeline.config import PipelineError, load_pipeline

PIPELINE = """\
workdir = "work"

[pool.single_turn]
tasks = "mini"
paths = ["rollouts.jsonl"]
thinking = true   # the suite's rollouts are thinking-form samples, and the scripted judges answer for that form

[review]
judge1 = "keep-judge"
judge2 = "auditor"
backend = "chat"
base_url = "{url}"

[masks]
variants = ["positive", "ross"]

[train]
tiny = "qwen3"
epochs = 1
max_steps = 1
"""
# Early (steps 1-20) and late (81-100) rollouts of four tasks: a clean solution, a corrected
# mistake, repeated answer emission, a right answer by wrong reasoning, a program that prints
# the shown example, and an IF response that breaks its constraint.
TASKS = {"math-m01", "math-m02", "math-m03", "code-c01", "if-i01"}


def test_single_turn_pipeline_end_to_end(tmp_path: Path, base_image: str, relearn_bin: str) -> None:
    from harness.scripted.servers import ModelServer
    from harness.scripted.single_turn_judges import judges
    from relearn.pipeline.plan import run_pipeline

    rows = [line for line in MINI_ROLLOUTS.read_text().splitlines() if json.loads(line)["task_id"] in TASKS]
    (tmp_path / "rollouts.jsonl").write_text("\n".join(rows) + "\n")
    console = Console(file=io.StringIO(), width=200)
    with ModelServer("chat", judges) as server:
        (tmp_path / "p.toml").write_text(PIPELINE.format(url=server.base_url))
        results, _ = run_pipeline(load_pipeline(tmp_path / "p.toml"), console)
        assert {r.name: r.status for r in results} == dict.fromkeys(
            ["pool", "verify", "review", "masks:positive", "masks:ross", "contrasts", "upstream", "train:positive", "train:ross", "report"],
            "ran",
        )
        calls = len(server.requests)
        again, _ = run_pipeline(load_pipeline(tmp_path / "p.toml"), console)
        assert {r.status for r in again} == {"current"} and len(server.requests) == calls
    work = tmp_path / "work"
    stages = json.loads((work / "report" / "report.json").read_text())["stages"]
    assert stages["pool"]["trajectories"] == 10
    # The code hack (prints the example) fails a hidden test; the IF response with commas fails its constraint.
    assert stages["verify"]["positive"] == 8 and stages["verify"]["code failed"] == 1 and stages["verify"]["if failed"] == 1
    assert stages["review"]["decisions"] == {"accept": 7, "reject: not verified positive": 2, "reject: no_clean_solution": 1}
    assert stages["review"]["protocols"]["full_supervision"] == 1
    assert (stages["masks:positive"]["trajectories_out"], stages["masks:ross"]["trajectories_out"]) == (8, 7)
    assert stages["masks:positive"]["excluded_tokens"] == 0 < stages["masks:ross"]["excluded_tokens"]
    assert stages["contrasts"]["relation"] == "ross ⊆ positive (positive holds 1 more)"
    assert stages["train:ross"]["steps"] == 1 and (work / "train" / "ross" / "model" / "config.json").exists()

    # TER and primary categories per step window, pooled and token-weighted.
    out = tmp_path / "stats.json"
    done = subprocess.run(
        [relearn_bin, "stats", str(work / "verified.jsonl"), "-r", str(work / "reviews.jsonl"), "-d", str(work / "datasets" / "ross"),
         "--by-step-window", "1-20,81-100", "--json", str(out), "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "primary category per step window" in done.stdout
    groups = {g["group"]: g for g in json.loads(out.read_text())["ter"]["groups"]}
    early, late = groups["steps 1–20"], groups["steps 81–100"]
    assert early["ter_token_weighted"] > late["ter_token_weighted"] >= 0
    assert early["ter_token_weighted"] == pytest.approx(early["excluded"] / early["eligible"])
    assert set(early["primary_category"]) == {"corrected_mistake", "redundant_exploration"} and sum(
        early["primary_share"].values()
    ) == pytest.approx(1.0)
    assert (tmp_path / "plots" / "primary_by_window.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[pool.single_turn]\ntasks = "mini"\n[review]\n', "single-turn review needs judge1"),
        ('[pool.single_turn]\ncolumns = {{ promt = "q" }}\n[review]\njudge1 = "j"\n', "columns: unknown promt"),
        ('[pool.single_turn]\ntasks = "mine.jsonl"\n[review]\njudge1 = "j"\n', "paths: name the rollout files"),
        ('[pool.single_turn]\n[pool.import]\nformat = "codex"\npaths = ["x"]\n[review]\njudge1 = "j"\n', "exactly one of"),
        ('[pool.single_turn]\n[review]\njudge1 = "j"\n[train]\ntiny = "qwen3"\n[eval]\n', "no evaluation stage"),
    ],
)
def test_single_turn_pipeline_file_errors_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text('workdir = "w"\n' + text.replace("{{", "{").replace("}}", "}"))
    with pytest.raises(PipelineError, match=message):
        load_pipeline(path)


def test_step_windows_parse_refuse_overlaps_and_group_steps_outside_them() -> None:
    from relearn.stats.compute import _group_key, parse_step_windows

    assert parse_step_windows("1-20, 81-100") == [(1, 20), (81, 100)]
    for bad, message in (("1-20,15-30", "overlap"), ("20-1", "not FIRST-LAST"), ("early", "not FIRST-LAST")):
        with pytest.raises(ValueError, match=message):
            parse_step_windows(bad)

    class Summary:
        def __init__(self, step: int | None) -> None:
            self.step = step

    class Row:
        def __init__(self, step: int | None) -> None:
            self.summary = Summary(step)

    key = _group_key("step", [], 2, None, [(1, 20), (81, 100)])
    assert [key(Row(s)) for s in (1, 20, 50, 81, None)] == [(1, 20), (1, 20), None, (81, 100), None]  # type: ignore[arg-type]
