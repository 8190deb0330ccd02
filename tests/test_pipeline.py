"""The pipeline runner: stages skipped when current, redone with everything after them when
their output goes or their settings change; the pipeline file's errors name the field."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from relearn.pipeline.config import PipelineError, load_pipeline
from relearn.pipeline.runner import Stage, read_stamp, run_stages


class Toy:
    """Three stages a -> b -> c, each writing one file from its input and its settings."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.calls: Counter[str] = Counter()
        self.settings = {"a": {"n": 1}, "b": {"n": 2}, "c": {"n": 3}}
        self.fail: set[str] = set()

    def out(self, name: str) -> Path:
        return self.workdir / f"{name}.txt"

    def stages(self) -> list[Stage]:
        def make(name: str, needs: tuple[str, ...]) -> Stage:
            def run() -> dict[str, int]:
                self.calls[name] += 1
                if name in self.fail:
                    raise RuntimeError(f"{name} broke")
                text = "".join(self.out(n).read_text() for n in needs) + f"{name}{self.settings[name]['n']};"
                self.out(name).write_text(text)
                return {"chars": len(text)}

            return Stage(name, f"make {name}", self.settings[name], [self.out(name)], run, needs)

        return [make("a", ()), make("b", ("a",)), make("c", ("a", "b"))]

    def run(self) -> list[str]:
        before = Counter(self.calls)
        results = run_stages(self.stages(), self.workdir, Console(file=io.StringIO()))
        assert [r.name for r in results if r.status == "failed"] == [n for n in "abc" if n in self.fail][:1]
        return [n for n in "abc" if self.calls[n] > before[n]]


def test_finished_pipeline_does_no_work(tmp_path: Path) -> None:
    toy = Toy(tmp_path)
    assert toy.run() == ["a", "b", "c"]
    assert toy.out("c").read_text() == "a1;a1;b2;c3;"
    assert toy.run() == []
    assert read_stamp(tmp_path, "c")["counts"] == {"chars": 12}


def test_deleting_an_output_redoes_that_stage_and_those_after_it(tmp_path: Path) -> None:
    toy = Toy(tmp_path)
    toy.run()
    toy.out("b").unlink()
    assert toy.run() == ["b", "c"]
    toy.out("c").unlink()
    assert toy.run() == ["c"]
    assert toy.run() == []


def test_dry_run_names_what_would_run_and_runs_nothing(tmp_path: Path) -> None:
    toy = Toy(tmp_path)
    toy.run()
    toy.out("b").unlink()
    results = run_stages(toy.stages(), tmp_path, Console(file=io.StringIO()), dry_run=True)
    assert [(r.name, r.status, r.error) for r in results] == [
        ("a", "current", None),
        ("b", "would run", f"output missing: {toy.out('b')}"),
        ("c", "would run", "b would be redone"),
    ]
    assert toy.calls == Counter({"a": 1, "b": 1, "c": 1}) and not toy.out("b").exists()


def test_changed_settings_redo_the_stage_and_keep_the_old_outputs(tmp_path: Path) -> None:
    toy = Toy(tmp_path)
    toy.run()
    toy.settings["b"] = {"n": 7}
    assert toy.run() == ["b", "c"]
    assert toy.out("c").read_text() == "a1;a1;b7;c3;"
    stale = list((tmp_path / ".pipeline" / "stale").glob("*/*.txt"))
    assert sorted(p.read_text() for p in stale) == ["a1;a1;b2;c3;", "a1;b2;"]  # moved aside, never deleted


def test_a_failed_stage_stops_the_run_and_resumes_later(tmp_path: Path) -> None:
    toy = Toy(tmp_path)
    toy.fail = {"b"}
    assert toy.run() == ["a", "b"]  # c never started
    assert read_stamp(tmp_path, "b") is None
    toy.fail = set()
    assert toy.run() == ["b", "c"]
    assert toy.run() == []


def test_a_stage_that_writes_nothing_fails(tmp_path: Path) -> None:
    stage = Stage("x", "nothing", {}, [tmp_path / "never.txt"], lambda: {})
    [result] = run_stages([stage], tmp_path, Console(file=io.StringIO()))
    assert result.status == "failed" and "never.txt" in (result.error or "")


PIPELINE = """
workdir = "work"
[pool.import]
format = "codex"
paths = ["rollouts"]
[masks]
variants = ["ross"]
[train]
tiny = "qwen3"
"""


def test_pipeline_file_paths_are_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE)
    config = load_pipeline(tmp_path / "p.toml")
    assert config.workdir == tmp_path / "work"
    assert config.resolve("rollouts") == tmp_path / "rollouts"
    assert config.variants == ["ross"] and config.train is not None and config.train.epochs == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (PIPELINE.replace("tiny =", "tinny ="), "train.tinny: Extra inputs are not permitted"),
        (PIPELINE + '[pool.collect]\nmodel = "m"\n', "pool: Value error, give exactly one of [pool.collect] or [pool.import]"),
        (PIPELINE.replace('["ross"]', '["rosss"]'), "masks.variants.0"),
        (PIPELINE.replace('tiny = "qwen3"', 'tiny = "qwen3"\ninit = "m"'), "exactly one of init"),
        ("workdir = [", "not valid TOML"),
    ],
)
def test_pipeline_file_errors_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PipelineError) as caught:
        load_pipeline(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_cli_refuses_a_bad_pipeline_file_with_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from relearn.cli.main import app

    path = tmp_path / "p.toml"
    path.write_text(PIPELINE.replace("format =", "fromat ="))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and "pool.import.fromat" in result.output
    path.write_text(json.dumps({}))  # valid TOML? no: JSON braces
    assert CliRunner().invoke(app, ["run", str(path)]).exit_code == 2


E2E = """
workdir = "work"
tasks = "mini"

[pool.collect]
model = "historical-ckpt"
base_url = "{url}"
ids = ["mini__calc-1", "mini__textkit-1"]
workers = 2

[masks]
variants = ["ross"]

[train]
tiny = "qwen3"
max_steps = 1
lr = 1e-3
ctx = 8192

[eval]
ids = ["mini__calc-1"]
max_turns = 1
max_new_tokens = 4
"""


def test_pipeline_end_to_end_then_nothing_then_only_what_follows_a_deleted_output(tmp_path: Path, base_image: str) -> None:
    """Real containers, grader, tokenizer, trainer and served model; the historical policy is scripted."""
    from envs.tasks import load_tasks
    from eval.dataset import MINI_SUITE
    from relearn.pipeline.stages import run_pipeline
    from tests.model_servers import ModelServer
    from tests.scripted import historical

    tasks = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
    console = Console(file=io.StringIO(), width=200)

    def run(url: str) -> dict[str, str]:
        (tmp_path / "p.toml").write_text(E2E.format(url=url))
        results, _ = run_pipeline(load_pipeline(tmp_path / "p.toml"), console)
        return {r.name: r.status for r in results}

    with ModelServer("chat", historical(tasks)) as server:
        first = run(server.base_url)
    assert first == dict.fromkeys(["pool", "verify", "review", "masks:ross", "upstream", "train:ross", "eval:upstream", "eval:ross", "report"], "ran")
    work = tmp_path / "work"
    report = json.loads((work / "report" / "report.json").read_text())
    stages = report["stages"]
    assert stages["pool"]["trajectories"] == 2 and stages["pool"]["resolved"] == 2
    assert stages["review"]["decisions"] == {"accept": 2} and stages["review"]["defects"] > 0
    assert 0 < stages["masks:ross"]["excluded_tokens"] and stages["masks:ross"]["trajectories_out"] == 2
    assert stages["train:ross"]["steps"] == 1 and (work / "train" / "ross" / "model" / "config.json").exists()
    assert [r["name"] for r in report["comparison"]["runs"]] == ["Upstream", "ROSS"]
    assert report["comparison"]["paired_instances"] == 1
    assert (work / "report" / "resolved.png").stat().st_size > 0 and (work / "report" / "train_loss.png").stat().st_size > 0
    assert "| ROSS |" in (work / "report" / "report.md").read_text()

    # Another server, another URL: transport is not identity, so nothing is redone.
    with ModelServer("chat", historical(tasks)) as server:
        assert set(run(server.base_url).values()) == {"current"}
        import shutil

        shutil.rmtree(work / "datasets" / "ross")
        again = run(server.base_url)
    redone = {name for name, status in again.items() if status == "ran"}
    assert redone == {"masks:ross", "train:ross", "eval:ross", "report"}
    assert {name for name, status in again.items() if status == "current"} == {"pool", "verify", "review", "upstream", "eval:upstream"}


def test_verify_stage_grades_what_the_pool_left_ungraded(tmp_path: Path, base_image: str) -> None:
    """An imported trajectory carries a final patch but no verdict: the stage grades it in a
    fresh container; one without a known task is kept, counted as ungradable."""
    from envs.tasks import load_tasks
    from eval.dataset import MINI_SUITE
    from records.trajectory import Message, Trajectory
    from relearn.pipeline.stages import Context, pool_path, verified_path, verify_stage

    gold = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}["mini__calc-1"].patch
    (tmp_path / "p.toml").write_text(PIPELINE)
    ctx = Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO()))
    pool_path(ctx).parent.mkdir(parents=True)
    messages = [Message(role="user", content="fix it")]
    pool = [Trajectory(id="a", task_id="mini__calc-1", messages=messages, final_patch=gold), Trajectory(id="b", task_id="nowhere", messages=messages, final_patch=gold)]
    pool_path(ctx).write_text("".join(t.model_dump_json() + "\n" for t in pool))
    counts = verify_stage(ctx)
    assert counts == {"graded now": 1, "ungradable (no task or no final patch)": 1, "resolved": 1, "unreadable": 0}
    graded = {t["id"]: t.get("outcome") for t in map(json.loads, verified_path(ctx).read_text().splitlines())}
    assert graded["a"]["resolved"] is True and graded["a"]["verdict"]["patch_applied"] and graded["b"] is None
