"""The pipeline runner: stages skipped when current, redone with everything after them when
their output goes or their settings change; the pipeline file's errors name the field."""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from records.trajectory import Message, Trajectory
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
[review]
reviewer = "heuristic"
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
        (PIPELINE.replace("tiny =", "tinny ="), "train.tinny: no such field; did you mean `tiny`?"),
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


def test_a_pipeline_without_a_reviewer_stops_before_its_first_stage(tmp_path: Path) -> None:
    """The heuristic stand-in is asked for by name: a file that names no judge stops at once,
    with one line (exit 2), before anything is imported or collected; dry runs too."""
    from typer.testing import CliRunner

    from relearn.cli.main import app

    path = tmp_path / "p.toml"
    (tmp_path / "rollouts").mkdir()
    path.write_text(PIPELINE.replace('[review]\nreviewer = "heuristic"\n', ""))
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(app, ["run", str(path), *extra])
        assert result.exit_code == 2, result.output
        (line,) = [line for line in result.output.splitlines() if line.strip()]
        assert line.startswith("error: ") and "[review] names no reviewer: name judge1" in line and 'reviewer = "heuristic"' in line
    assert not (tmp_path / "work" / "pool").exists()
    path.write_text(PIPELINE.replace('reviewer = "heuristic"', 'reviewer = "heuristic"\njudge1 = "m"'))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and 'reviewer = "heuristic" calls no judge' in result.output


def test_a_second_run_on_a_work_folder_in_use_is_refused_at_once(tmp_path: Path) -> None:
    """Two runs would append one pool twice and move each other's outputs aside: the second
    is refused with one line naming the holder, and writes nothing; the lock goes with its
    holder (here released; a killed run's lock is the kernel's, so it goes with the process)."""
    from typer.testing import CliRunner

    from relearn.cli.main import app
    from relearn.pipeline.runner import workdir_lock

    path = tmp_path / "p.toml"
    path.write_text(PIPELINE)
    (tmp_path / "rollouts").mkdir()
    work = tmp_path / "work"
    with workdir_lock(work):
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        result = CliRunner().invoke(app, ["run", str(path)])
        assert result.exit_code == 2, result.output
        (line,) = [line for line in result.output.splitlines() if line.strip()]
        assert line.startswith(f"error: {work}: another relearn run is working in this folder (pid {os.getpid()} on ")
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        dry = CliRunner().invoke(app, ["run", str(path), "--dry-run"])  # reads stamps only: no lock needed
        assert dry.exit_code == 0, dry.output
    with workdir_lock(work):  # released by the first holder
        pass


E2E = """
workdir = "work"
tasks = "mini"

[pool.collect]
model = "historical-ckpt"
base_url = "{url}"
ids = ["mini__calc-1", "mini__textkit-1"]
workers = 2
image_map = "images.json"  # mini__textkit-1 in its leaky build: .git holds the fix

[review]
reviewer = "heuristic"

[masks]
variants = ["ross"]
ctx = 8192

[train]
tiny = "qwen3"
max_steps = 1
lr = 1e-3

[eval]
ids = ["mini__calc-1"]
max_turns = 1
max_new_tokens = 4
"""


def test_pipeline_end_to_end_then_nothing_then_only_what_follows_a_deleted_output(
    tmp_path: Path, docker_client: Any, base_image: str
) -> None:
    """Real containers, grader, tokenizer, trainer and served model; the historical policy is scripted.
    One task runs in an image whose .git holds its fix: the audit stage, not asked for, flags it,
    and the masks leave its trajectory out and count it."""
    from envs.images import task_image
    from envs.tasks import load_tasks
    from eval.dataset import MINI_SUITE
    from harness.scripted.servers import ModelServer
    from harness.scripted.solutions import historical
    from relearn.masks.compile import FLAGGED_BY_AUDIT
    from relearn.pipeline.plan import run_pipeline

    tasks = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
    leaky = task_image(docker_client, tasks["mini__textkit-1"], base_image, leaky=True)
    (tmp_path / "images.json").write_text(json.dumps({"mini__textkit-1": leaky}))
    console = Console(file=io.StringIO(), width=200)

    def run(url: str) -> dict[str, str]:
        (tmp_path / "p.toml").write_text(E2E.format(url=url))
        results, _ = run_pipeline(load_pipeline(tmp_path / "p.toml"), console)
        return {r.name: r.status for r in results}

    with ModelServer("chat", historical(tasks)) as server:
        first = run(server.base_url)
    assert first == dict.fromkeys(
        ["pool", "verify", "review", "audit", "masks:ross", "upstream", "train:ross", "eval:upstream", "eval:ross", "report"], "ran"
    )
    work = tmp_path / "work"
    report = json.loads((work / "report" / "report.json").read_text())
    stages = report["stages"]
    assert stages["pool"]["trajectories"] == 2 and stages["pool"]["resolved"] == 2
    assert stages["review"]["decisions"] == {"accept": 2} and stages["review"]["defects"] > 0
    assert stages["audit"] == {"tasks_audited": 2, "exposed": 1, "not_audited": 0, "pool_tasks_not_in_tasks": 0}
    audit = stages["masks:ross"]["audit"]
    assert audit["applied"] and audit["file"] == str(work / "audit" / "audit.jsonl")
    assert (audit["tasks_flagged"], audit["trajectories_of_flagged_tasks"], audit["trajectories_left_out"]) == (1, 1, 1)
    assert 0 < stages["masks:ross"]["excluded_tokens"] and stages["masks:ross"]["trajectories_out"] == 1
    assert stages["masks:ross"]["rejected"] == {FLAGGED_BY_AUDIT: 1}
    assert f"rejected: {FLAGGED_BY_AUDIT} 1" in (work / "report" / "report.md").read_text()
    assert stages["train:ross"]["steps"] == 1 and (work / "train" / "ross" / "model" / "config.json").exists()
    assert [r["name"] for r in report["comparison"]["runs"]] == ["Upstream", "ROSS"]
    assert report["comparison"]["paired_instances"] == 1
    assert (work / "report" / "resolved.png").stat().st_size > 0 and (work / "report" / "train_loss.png").stat().st_size > 0
    # The ROSS row of the training table (the comparison table above has one too).
    ross = [line for line in (work / "report" / "report.md").read_text().splitlines() if line.startswith("| ROSS |")][-1]
    trained, action, minimal = (float(cell) for cell in [c.strip() for c in ross.split("|")][4:7])
    assert trained == action >= minimal > 0  # trained under the default action scope; both scopes shown

    # Another server, another URL: transport is not identity, so nothing is redone.
    with ModelServer("chat", historical(tasks)) as server:
        assert set(run(server.base_url).values()) == {"current"}
        import shutil

        shutil.rmtree(work / "datasets" / "ross")
        again = run(server.base_url)
    redone = {name for name, status in again.items() if status == "ran"}
    assert redone == {"masks:ross", "train:ross", "eval:ross", "report"}
    assert {name for name, status in again.items() if status == "current"} == {
        "pool", "verify", "review", "audit", "upstream", "eval:upstream"
    }  # fmt: skip

    # The file without its endpoint, as the demo writes it: every stage is current, so `relearn
    # run` needs none (only collecting would, and [pool.collect] is the verb's: no URL is the SDK's).
    from typer.testing import CliRunner

    from relearn.cli.main import app

    (tmp_path / "p.toml").write_text(E2E.replace('base_url = "{url}"\n', ""))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "p.toml")])
    assert result.exit_code == 0, result.output
    assert result.output.count("│ current │") == len(again), result.output  # the summary table: no stage ran


def test_verify_stage_grades_what_the_pool_left_ungraded(tmp_path: Path, base_image: str) -> None:
    """An imported trajectory carries a final patch but no verdict: the stage grades it in a
    fresh container; one without a known task is kept, counted as ungradable. A grade the
    source carried (``verdict.imported_from``) is graded again where it can be (here the
    source said unresolved of the gold patch) with ``[verify] again = true``, and kept, counted,
    where it cannot; without it, kept and counted as not re-verified."""
    from envs.tasks import load_tasks
    from eval.dataset import MINI_SUITE
    from records.trajectory import Message, Trajectory
    from relearn.pipeline.context import Context, pool_path, verified_path
    from relearn.pipeline.stages import verify

    gold = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}["mini__calc-1"].patch
    (tmp_path / "p.toml").write_text(PIPELINE + "[verify]\nagain = true\n")
    ctx = Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO()))
    pool_path(ctx).parent.mkdir(parents=True)
    messages = [Message(role="user", content="fix it")]
    imported = {"resolved": False, "verdict": {"imported_from": "nemo-gym", "re_verified": False}}
    pool = [
        Trajectory(id="a", task_id="mini__calc-1", messages=messages, final_patch=gold),
        Trajectory(id="b", task_id="nowhere", messages=messages, final_patch=gold),
        Trajectory.model_validate(
            {"id": "c", "task_id": "mini__calc-1", "messages": [m.model_dump() for m in messages], "final_patch": gold, "outcome": imported}
        ),
        Trajectory.model_validate(
            {"id": "d", "task_id": "nowhere", "messages": [m.model_dump() for m in messages], "final_patch": gold, "outcome": imported}
        ),
    ]
    pool_path(ctx).write_text("".join(t.model_dump_json() + "\n" for t in pool))
    counts = verify.run(ctx)
    assert counts == {
        "graded now": 2,
        "ungradable (no task or no final patch)": 1,
        "kept the imported grade (no task or no final patch)": 1,
        "resolved": 2,
        "unreadable": 0,
    }
    graded = {t["id"]: t.get("outcome") for t in map(json.loads, verified_path(ctx).read_text().splitlines())}
    assert graded["a"]["resolved"] is True and graded["a"]["verdict"]["patch_applied"] and graded["b"] is None
    assert graded["c"]["resolved"] is True and "imported_from" not in graded["c"]["verdict"]
    assert graded["d"] == imported

    # Without `again`, the imported grades stay as the source gave them.
    (tmp_path / "p.toml").write_text(PIPELINE)
    kept = Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO()))
    verified_path(kept).unlink()
    counts = verify.run(kept)
    assert counts["kept the imported grade, not re-verified ([verify] again = true grades it)"] == 2 and counts["graded now"] == 1
    graded = {t["id"]: t.get("outcome") for t in map(json.loads, verified_path(kept).read_text().splitlines())}
    assert graded["c"] == imported and graded["d"] == imported


# ---------------------------------------------------------------- held-out tasks, contrasts, analyze

FULL = """
workdir = "work"
[pool.import]
format = "codex"
paths = ["rollouts"]
[review]
reviewer = "heuristic"
[masks]
variants = ["positive", "ross-nomask", "ross"]
heldout_tasks = ["sub"]
[train]
tiny = "qwen3"
[analyze]
bootstrap = 200
[eval]
ids = ["mini__calc-1"]
"""


def full_context(tmp_path: Path, text: str = FULL):  # noqa: ANN201
    from relearn.pipeline.context import Context

    (tmp_path / "p.toml").write_text(text)
    (tmp_path / "rollouts").mkdir(exist_ok=True)  # the import's source: a plan checks that it exists
    return Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO()))


def test_plan_sets_the_heldout_tasks_apart_checks_contrasts_before_training_and_analyzes_after(tmp_path: Path) -> None:
    from relearn.pipeline.plan import plan

    stages = {s.name: s for s in plan(full_context(tmp_path), dict)}
    assert list(stages) == [
        "pool", "verify", "review", "holdout", "masks:positive", "masks:ross-nomask", "masks:ross", "contrasts",
        "upstream", "train:positive", "train:ross-nomask", "train:ross", "analyze",
        "eval:upstream", "eval:positive", "eval:ross-nomask", "eval:ross", "report",
    ]  # fmt: skip
    assert all(stages[f"masks:{v}"].needs == ("holdout", "review") for v in ("positive", "ross-nomask", "ross"))
    assert stages["contrasts"].needs == ("masks:positive", "masks:ross-nomask", "masks:ross")
    assert "contrasts" not in stages["train:ross"].needs  # retraining one variant does not follow the others' masks
    assert set(stages["analyze"].needs) == {"holdout", "review", "upstream", "train:positive", "train:ross-nomask", "train:ross"}
    # Held-out tasks and analysis are opt-in: a file without them plans what it planned before.
    bare = {
        s.name: s
        for s in plan(
            full_context(tmp_path, FULL.replace('heldout_tasks = ["sub"]\n', "").replace("[analyze]\nbootstrap = 200\n", "")), dict
        )
    }
    assert "holdout" not in bare and "analyze" not in bare and bare["masks:ross"].needs == ("verify", "review")
    with pytest.raises(PipelineError, match=r"\[analyze\] .* needs \[train\]"):
        full_context(tmp_path, PIPELINE.replace('[train]\ntiny = "qwen3"\n', "[analyze]\n"))


def test_the_audit_stage_is_planned_where_the_pipeline_has_the_tasks_images_and_says_why_not_elsewhere(tmp_path: Path) -> None:
    """Collected on the mini suite, or imported and graded against the tasks the file names: an
    audit stage before the masks, which then need it; `--dry-run` lists it. Off (`audit =
    false`), the user's own file, an imported pool whose file names no tasks, [cluster]: none,
    and the masks say why. A file that gains no audit stage keeps its masks stamps."""
    from envs.audit import AUDIT_VERSION
    from relearn.pipeline.plan import plan
    from relearn.pipeline.stages import audit, masks

    def planned(text: str) -> tuple[Any, dict[str, Stage]]:
        ctx = full_context(tmp_path, text)
        return ctx, {s.name: s for s in plan(ctx, dict)}

    collected = E2E.format(url="http://127.0.0.1:9/v1").replace('image_map = "images.json"', 'image_template = "mine:{instance_key}"')
    ctx, stages = planned(collected)
    names = list(stages)
    assert names[names.index("review") + 1 : names.index("masks:ross") + 1] == ["audit", "masks:ross"]
    assert stages["audit"].needs == ("pool",) and stages["masks:ross"].needs == ("verify", "review", "audit")
    assert stages["audit"].settings == {
        "tasks": "mini", "ids": ["mini__calc-1", "mini__textkit-1"], "images": {"image_map": None, "image_template": "mine:{instance_key}"},
        "version": AUDIT_VERSION,
    }  # fmt: skip
    assert stages["audit"].outputs == [tmp_path / "work" / "audit" / "audit.jsonl"]
    dry = run_stages(list(stages.values()), ctx.workdir, Console(file=io.StringIO()), dry_run=True)
    assert ("audit", "would run", "not run before") in [(r.name, r.status, r.error) for r in dry]
    _, imported = planned(FULL.replace('workdir = "work"\n', 'workdir = "work"\ntasks = "mini"\n'))
    assert imported["masks:ross"].needs == ("holdout", "review", "audit") and imported["audit"].settings["ids"] is None

    # No audit stage: the masks need none, say why, and keep the settings they had before it existed.
    bare_ctx, bare = planned(FULL)
    assert "audit" not in bare and "audit" not in bare["masks:ross"].settings and masks.unaudited(bare_ctx) == audit.NO_TASKS
    off_ctx, off = planned(collected.replace("[masks]\n", "[masks]\naudit = false\n"))
    assert "audit" not in off and off["masks:ross"].needs == ("verify", "review") and masks.unaudited(off_ctx) == audit.TURNED_OFF
    assert off["masks:ross"].fingerprint() != stages["masks:ross"].fingerprint()  # turning it off compiles again
    assert masks.audit_file(off_ctx) is None
    cluster_ctx, on_cluster = planned(collected + '[cluster]\naddress = "auto"\n')
    assert "audit" not in on_cluster and masks.unaudited(cluster_ctx) == audit.ON_CLUSTER
    (tmp_path / "mine.jsonl").write_text(json.dumps({"instance_id": "mini__calc-1", "verdict": "exposed"}) + "\n")
    own_ctx, own = planned(collected.replace("[masks]\n", '[masks]\naudit = "mine.jsonl"\n'))
    assert "audit" not in own and own["masks:ross"].needs == ("verify", "review") and masks.audit_file(own_ctx) == tmp_path / "mine.jsonl"
    assert len(own["masks:ross"].settings["audit"]) == 64  # what the file says, not where it is


def test_masks_without_an_audit_say_why_in_the_summary_and_the_report(tmp_path: Path, tok: Any) -> None:
    from records.review import Review
    from relearn.pipeline.context import reviews_path
    from relearn.pipeline.plan import plan
    from relearn.pipeline.stages import audit, report

    ctx = full_context(tmp_path, PIPELINE.replace('[train]\ntiny = "qwen3"\n', "").replace('["ross"]', '["positive"]'))
    ctx._tokenizer = tok  # the session's: loaded once
    pool = verified_pool(ctx)
    reviews_path(ctx).write_text("".join(Review(trajectory_id=t.id, decision="accept").model_dump_json() + "\n" for t in pool))
    planned: list[Stage] = []
    planned.extend(plan(ctx, lambda: report.run(ctx, planned)))
    stages = [s for s in planned if s.name in ("masks:positive", "report")]
    assert [(r.name, r.status) for r in run_stages(stages, ctx.workdir, ctx.console)] == [("masks:positive", "ran"), ("report", "ran")]
    note = f"no audit applied: {audit.NO_TASKS}"
    assert read_stamp(ctx.workdir, "masks:positive")["counts"]["audit"] == {"applied": False, "note": note}
    assert f"audit: applied no, note {note}" in (ctx.workdir / "report" / "report.md").read_text()


def verified_pool(ctx: Any) -> list[Trajectory]:
    from relearn.pipeline.context import verified_path

    def one(task: str, n: int) -> Trajectory:
        messages = [
            Message(role="system", content="You are a coding agent."),
            Message(role="user", content=f"Fix {task}() in calc.py."),
            Message(
                role="assistant",
                generated=True,
                reasoning_content=f"Probably in {task}(), attempt {n}.",
                content="Let me look at the file.",
            ),
            Message(role="user", content="Go on."),
            Message(role="assistant", generated=True, content=f"Fixed {task}(): it is correct now."),
        ]
        return Trajectory(id=f"{task}-{n}", task_id=task, messages=messages, outcome={"resolved": True, "reward": 1.0})

    pool = [one("add", 0), one("sub", 0), one("mul", 0), one("sub", 1)]
    verified_path(ctx).parent.mkdir(parents=True, exist_ok=True)
    verified_path(ctx).write_text("".join(t.model_dump_json() + "\n" for t in pool) + '{"messages": [\n')  # and a torn record
    return pool


def test_holdout_stage_copies_records_verbatim_and_refuses_an_unknown_task(tmp_path: Path) -> None:
    from relearn.pipeline.context import heldout_pool_path, training_pool_path, verified_path
    from relearn.pipeline.stages import holdout

    ctx = full_context(tmp_path)
    verified_pool(ctx)
    assert holdout.run(ctx) == {"train": 3, "heldout": 2, "heldout_tasks": 1}
    lines = verified_path(ctx).read_text().splitlines()
    assert heldout_pool_path(ctx).read_text().splitlines() == [lines[1], lines[3]]
    assert training_pool_path(ctx).read_text().splitlines() == [lines[0], lines[2], lines[4]]  # the torn one too: masks reject and count it

    typo = full_context(tmp_path, FULL.replace('["sub"]', '["sub", "dvi"]'))
    with pytest.raises(ValueError, match=r"heldout_tasks: no trajectory of dvi in .*verified.jsonl \(its tasks: add, mul, sub\)"):
        holdout.run(typo)
    everything = full_context(tmp_path, FULL.replace('["sub"]', '["sub", "add", "mul"]'))
    with pytest.raises(ValueError, match="holds out every trajectory"):
        holdout.run(everything)


def write_dataset(folder: Path, ids: list[str], rejections: dict[str, str] | None = None) -> None:
    """A dataset folder as `relearn masks` writes it, as far as the contrasts read it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"sample_id": ids, "trajectory_id": ids}), folder / "shard-00000.parquet")
    stats = {
        "trajectories_out": len(ids),
        "rejections": [{"trajectory_id": i, "reason": r, "detail": "message 2"} for i, r in (rejections or {}).items()],
    }
    (folder / "stats.json").write_text(json.dumps(stats))


def test_training_does_not_start_when_ross_and_ross_nomask_hold_different_trajectories(tmp_path: Path) -> None:
    from relearn.pipeline.context import contrasts_path, dataset_dir
    from relearn.pipeline.plan import plan
    from relearn.pipeline.report import contrasts_lines

    ctx = full_context(tmp_path)
    shared = [f"t{i}" for i in range(14)]
    write_dataset(dataset_dir(ctx, "positive"), [*shared, "only-positive", "odd", "dropped"])
    write_dataset(dataset_dir(ctx, "ross-nomask"), [*shared, "odd", "dropped"])
    write_dataset(
        dataset_dir(ctx, "ross"), [*shared, "extra"], rejections={"odd": "defect outside its field", "dropped": "quote not in the render"}
    )
    trained: list[str] = []

    def train_ross() -> dict[str, int]:
        trained.append("ross")
        (tmp_path / "trained").write_text("")
        return {}

    train = Stage("train:ross", "train", {}, [tmp_path / "trained"], train_ross)
    contrasts = next(s for s in plan(ctx, dict) if s.name == "contrasts")

    first = run_stages([contrasts, train], ctx.workdir, Console(file=io.StringIO()))
    assert [(r.name, r.status) for r in first] == [("contrasts", "failed")] and trained == []
    error = first[0].error or ""
    assert "ross (15 trajectories) and ross-nomask (16)" in error
    assert "1 only in ross: extra;" in error
    assert (
        "2 only in ross-nomask: dropped (ross: quote not in the render: message 2), odd (ross: defect outside its field: message 2)"
        in error
    )
    written = json.loads(contrasts_path(ctx).read_text())  # every id, also when it refuses
    assert written["only"]["ross-nomask not ross"] == ["dropped", "odd"] and written["only"]["ross not ross-nomask"] == ["extra"]
    assert len(written["ids"]["positive"]) == 17

    # Many differences: a few named, all counted.
    write_dataset(dataset_dir(ctx, "ross"), shared[:2])
    many = run_stages([contrasts, train], ctx.workdir, Console(file=io.StringIO()))
    assert (
        "14 only in ross-nomask: dropped, odd, t10, t11," in (many[0].error or "")
        and "and 4 more" in (many[0].error or "")
        and trained == []
    )

    write_dataset(dataset_dir(ctx, "ross"), [*shared, "odd", "dropped"])
    fixed = run_stages([contrasts, train], ctx.workdir, Console(file=io.StringIO()))
    assert [(r.name, r.status) for r in fixed] == [("contrasts", "ran"), ("train:ross", "ran")] and trained == ["ross"]
    assert fixed[0].counts == {
        "positive": 17,
        "ross-nomask": 16,
        "ross": 16,
        "relation": "ross = ross-nomask ⊆ positive (positive holds 1 more)",
    }
    summary = json.loads(contrasts_path(ctx).read_text())
    lines = "\n".join(contrasts_lines({**summary, "only": {pair: len(ids) for pair, ids in summary["only"].items()}}))
    assert "| ROSS (`ross`) | 16 |" in lines and "one and not the other: positive not ross: 1; positive not ross-nomask: 1." in lines


def test_analyze_stage_scores_kept_and_excluded_tokens_of_training_and_heldout_pools_per_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start model and each trained one on the training pool and the held-out one; a model
    that equals the start changes nothing (a paired Δ of exactly 0), and a rerun loads no model."""
    import shutil

    import torch

    from records.review import Defect, Review, field_text
    from relearn.pipeline.context import analyze_dir, reviews_path, train_dir, upstream_dir
    from relearn.pipeline.stages import analyze, holdout, upstream
    from relearn.train.model import build_model

    ctx = full_context(tmp_path, FULL.replace('["positive", "ross-nomask", "ross"]', '["ross-nomask", "ross"]'))
    pool = verified_pool(ctx)
    reviews = []
    for t in pool:
        text = field_text(t.messages[2], "reasoning_content") or ""
        defect = Defect(
            message_index=2, field="reasoning_content", start=0, end=len("Probably"), quote="Probably", category="wrong_hypothesis"
        )
        assert text.startswith("Probably")
        reviews.append(Review(trajectory_id=t.id, decision="reject" if t.id == "mul-0" else "accept", defects=[defect]))
    reviews_path(ctx).write_text("".join(r.model_dump_json() + "\n" for r in reviews))
    holdout.run(ctx)
    upstream.run(ctx)
    shutil.copytree(upstream_dir(ctx), train_dir(ctx, "ross-nomask") / "model")  # "trained" to exactly the start
    changed = build_model(init=str(upstream_dir(ctx)))
    with torch.no_grad():
        changed.get_output_embeddings().weight.mul_(3.0)  # sharper logits: another NLL everywhere
    changed.save_pretrained(train_dir(ctx, "ross") / "model")

    counts = analyze.run(ctx)
    assert counts["models"] == 3 and counts["train_trajectories"] == 2 and counts["heldout_trajectories"] == 2
    assert counts["train_split"] == 1 and counts["heldout_split"] == 2 and counts["not_split"] == {"review rejected": 1}
    result = json.loads((analyze_dir(ctx) / "nll.json").read_text())
    rows = {(r["model"], r["pool"]): r for r in result["rows"]}
    assert set(rows) == {(m, p) for m in ("upstream", "ross-nomask", "ross") for p in ("train", "heldout")}
    for pool_name in ("train", "heldout"):
        same = rows[("ross-nomask", pool_name)]["vs_first"]
        assert same["kept"]["delta"] == 0 and same["kept"]["ci95"] == [0, 0] and same["excluded"]["delta"] == 0
        assert rows[("ross", pool_name)]["vs_first"]["kept"]["delta"] != 0
        assert rows[("ross", pool_name)]["excluded"]["tokens"] > 0
    (masking,) = [p for p in result["pairs"] if p["pool"] == "heldout"]
    assert (masking["from"], masking["to"]) == ("ross-nomask", "ross")
    assert masking["kept"]["delta"] == pytest.approx(rows[("ross", "heldout")]["vs_first"]["kept"]["delta"])
    for model in ("upstream", "ross-nomask", "ross"):
        assert (analyze_dir(ctx) / model / "nll-scores.jsonl").is_file() and "## Kept" in (analyze_dir(ctx) / model / "nll.md").read_text()
    assert "| ROSS | heldout | 2 |" in (analyze_dir(ctx) / "nll.md").read_text()

    def no_model(**_kwargs: object) -> None:
        raise AssertionError("the rerun loaded a model")

    monkeypatch.setattr("relearn.train.model.build_model", no_model)
    again = analyze.run(ctx)
    assert again["reused"] == 3 * 4  # every trajectory of both pools, under each of the three models
    assert json.loads((analyze_dir(ctx) / "nll.json").read_text())["rows"] == result["rows"]
