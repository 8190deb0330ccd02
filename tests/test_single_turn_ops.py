"""The single-turn operations called directly (``relearn.ops.single_turn``): what `relearn
single-turn import|verify|review` and a ``[pool.single_turn]`` pipeline both run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from envs.single_turn.tasks import MINI_ROLLOUTS
from harness.scripted.servers import ModelServer
from harness.scripted.single_turn_judges import judges
from records.pools import JsonlWriter, read_trajectories_lenient
from records.review import Review
from relearn.ops.reporting import OpError
from relearn.ops.single_turn import count_keep_reviews, run_single_turn_import, run_single_turn_review, run_single_turn_verify
from relearn.verbs.review import JudgeOptions
from relearn.verbs.single_turn import SingleTurnImportOptions, SingleTurnReviewOptions, SingleTurnVerifyOptions


class Recorder:
    """A reporter that keeps what it was told."""

    def __init__(self) -> None:
        self.begun: list[tuple[str, float | None]] = []
        self.advanced = 0.0
        self.notes: list[str] = []

    def begin(self, label: str, total: float | None = None) -> None:
        self.begun.append((label, total))

    def advance(self, amount: float = 1, **fields: Any) -> None:
        self.advanced += amount

    def end(self) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


def _rows(*tasks: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, MINI_ROLLOUTS.read_text().splitlines()) if r["task_id"] in tasks]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _imported(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    pool = tmp_path / "pool.jsonl"
    # The suite's rollouts were written in the thinking form, and its scripted judges answer for it.
    run_single_turn_import(SingleTurnImportOptions([_write(tmp_path / "rollouts.jsonl", rows)], pool, thinking=True))
    return pool


# ---- import ---------------------------------------------------------------------------------


def test_import_reads_a_folder_with_column_overrides_rejects_a_bad_row_and_resumes(tmp_path: Path) -> None:
    folder = tmp_path / "dumps" / "run1"
    folder.mkdir(parents=True)
    rows = [
        {"q": "1+1?", "a": "<think>\nadd\n</think>\n\n$\\boxed{2}$", "r": 1.0, "it": 3, "t": "math-x"},
        {"q": "2+2?", "a": "4", "r": "high", "it": 3, "t": "math-y"},  # an unreadable reward
        {"q": "3+3?", "a": "6", "r": 0.0, "it": 4, "t": "math-z"},
    ]
    _write(folder / "rows.jsonl", rows)
    (folder / "notes.txt").write_text("not a rollout file")
    options = SingleTurnImportOptions(
        [tmp_path / "dumps"],
        tmp_path / "out" / "pool.jsonl",
        columns={"prompt": "q", "response": "a", "reward": "r", "step": "it", "task_id": "t"},
        thinking=True,  # the thinking form (the default is no-thinking: tests/test_single_turn_defaults.py)
    )
    recorder = Recorder()
    summary = run_single_turn_import(options, recorder)
    assert (summary.files, summary.imported, len(summary.rejected)) == (1, 2, 1)
    assert summary.rejected[0].line == 2 and summary.rejected[0].field == "r"
    assert recorder.begun == [("importing 1 file(s)", (folder / "rows.jsonl").stat().st_size)] and recorder.advanced == recorder.begun[0][1]
    first, third = read_trajectories_lenient(options.output, [])
    assert first.task_id == "math-x" and first.messages[-1].reasoning_content == "add" and third.policy.step == 4
    again = run_single_turn_import(options)
    assert (again.imported, again.skipped_existing) == (0, 2)


def test_import_in_the_no_thinking_form_and_from_chat_records(tmp_path: Path) -> None:
    rows = _rows("math-m04")[:1]
    pool = tmp_path / "whole.jsonl"
    run_single_turn_import(SingleTurnImportOptions([_write(tmp_path / "r.jsonl", rows)], pool, thinking=False))
    (trajectory,) = read_trajectories_lenient(pool, [])
    assert trajectory.messages[-1].reasoning_content is None and trajectory.messages[-1].content.startswith("50 = 25 * 2")
    chat = {
        "instance_id": "math-m02",
        "messages": [{"role": "user", "content": "2x + 6 = 14?"}, {"role": "assistant", "content": "$\\boxed{4}$"}],
    }
    summary = run_single_turn_import(
        SingleTurnImportOptions([_write(tmp_path / "c.jsonl", [chat])], tmp_path / "chat.jsonl", format="chat")
    )
    (trajectory,) = read_trajectories_lenient(tmp_path / "chat.jsonl", [])
    assert summary.imported == 1 and trajectory.task_id == "math-m02" and trajectory.messages[-1].content == "$\\boxed{4}$"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "sharegpt"}, "unknown single-turn format 'sharegpt'; known: rows, verl, openrlhf, chat"),
        ({"columns": {"promt": "q"}}, "unknown column option\\(s\\) promt"),
        ({"format": "chat", "columns": {"prompt": "q"}}, "not chat"),
        ({"paths": [Path("/nonexistent/rollouts.jsonl")]}, "no such file or directory: /nonexistent/rollouts.jsonl"),
    ],
)
def test_import_refuses_unusable_options_before_writing(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    given: dict[str, Any] = {"paths": [_write(tmp_path / "r.jsonl", _rows("math-m04"))], "output": tmp_path / "pool.jsonl", **options}
    with pytest.raises(OpError, match=message):
        run_single_turn_import(SingleTurnImportOptions(**given))
    assert not given["output"].exists()


# ---- verify ---------------------------------------------------------------------------------


def test_verify_grades_counts_in_one_pass_and_lists_unknown_tasks(tmp_path: Path) -> None:
    rows = [*_rows("math-m04", "if-i01"), {"prompt": "?", "response": "42", "reward": 1.0, "step": 5, "task_id": "math-unknown"}]
    pool = _imported(tmp_path, rows)
    recorder = Recorder()
    summary = run_single_turn_verify(SingleTurnVerifyOptions(pool, tmp_path / "verified.jsonl"), recorder)
    assert summary.graded == {"math passed": 1, "math failed": 1, "if passed": 1, "if failed": 1, "ungradable": 1}
    assert summary.positive == 2 and summary.by_kind == {"math": 2, "if": 2} and summary.resumed == 0
    assert summary.ungradable == [f"{_id(pool, 5)}: no task 'math-unknown'"] and summary.partial
    assert summary.orphans == []  # no Code task: the engine was never opened
    assert recorder.begun == [("grading responses", 5)] and recorder.advanced == 5
    graded = {t.policy.step: t.outcome for t in read_trajectories_lenient(tmp_path / "verified.jsonl", [])}
    assert graded[84].resolved and graded[4].resolved is False and graded[5].verdict["imported_from"] == "single-turn"
    assert not (tmp_path / "verified.jsonl.partial").exists()


def _id(pool: Path, step: int) -> str:
    return next(t.id for t in read_trajectories_lenient(pool, []) if t.policy.step == step)


def test_verify_resumes_from_the_partial_file_without_grading_again(tmp_path: Path) -> None:
    pool = _imported(tmp_path, _rows("math-m04", "if-i01"))
    output = tmp_path / "verified.jsonl"
    # An interrupted run graded the first rollout; its (marked) verdict must be kept as it is.
    first = next(iter(read_trajectories_lenient(pool, [])))
    assert first.outcome is not None
    first.outcome = first.outcome.model_copy(update={"resolved": True, "verdict": {"kind": "math", "marker": "from the first run"}})
    with JsonlWriter(output.with_name("verified.jsonl.partial")) as writer:
        writer.write(first)
    recorder = Recorder()
    summary = run_single_turn_verify(SingleTurnVerifyOptions(pool, output), recorder)
    assert summary.resumed == 1 and sum(summary.graded.values()) == 3 and recorder.begun == [("grading responses", 3)]
    out = list(read_trajectories_lenient(output, []))
    assert [t.id for t in out].count(first.id) == 1 and len(out) == 4
    assert next(t for t in out if t.id == first.id).outcome.verdict["marker"] == "from the first run"
    assert summary.positive == sum(bool(t.outcome and t.outcome.resolved) for t in out)
    assert summary.by_kind == {"math": 2, "if": 2}


def test_verify_refuses_a_missing_pool_or_unusable_tasks(tmp_path: Path) -> None:
    pool = _imported(tmp_path, _rows("math-m04"))
    with pytest.raises(OpError, match="no such pool"):
        run_single_turn_verify(SingleTurnVerifyOptions(tmp_path / "none.jsonl", tmp_path / "v.jsonl"))
    with pytest.raises(OpError, match="no such tasks file"):
        run_single_turn_verify(SingleTurnVerifyOptions(pool, tmp_path / "v.jsonl", tasks=str(tmp_path / "tasks.jsonl")))
    (tmp_path / "tasks.jsonl").write_text('{"id": "b", "kind": "code", "prompt": "x"}\n')
    with pytest.raises(OpError, match=f"{tmp_path / 'tasks.jsonl'}: no task could be read .*tasks.jsonl:1"):
        run_single_turn_verify(SingleTurnVerifyOptions(pool, tmp_path / "v.jsonl", tasks=str(tmp_path / "tasks.jsonl")))
    assert not (tmp_path / "v.jsonl").exists()


# ---- review ---------------------------------------------------------------------------------


def test_review_counts_the_output_resumes_and_a_rerun_makes_no_call(tmp_path: Path) -> None:
    pool = _imported(tmp_path, _rows("math-m01", "math-m03", "if-i01"))
    verified = tmp_path / "verified.jsonl"
    run_single_turn_verify(SingleTurnVerifyOptions(pool, verified))
    output = tmp_path / "reviews.jsonl"
    with ModelServer("chat", judges) as server:
        options = SingleTurnReviewOptions(
            verified, output, JudgeOptions(judge1="keep-judge", backend="chat", base_url=server.base_url), workers=2
        )
        recorder = Recorder()
        summary = run_single_turn_review(options, recorder)
        calls = len(server.requests)
        again = run_single_turn_review(options, Recorder())
        assert len(server.requests) == calls
    assert recorder.begun == [("reviewing", 6)] and recorder.advanced == 6 and not summary.partial
    assert summary.ledger.calls == calls > 0 and again.ledger.calls == 0 and again.run.skipped == 6
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    expected: dict[str, int] = {}
    for line in lines:
        label = line["decision"] if line["decision"] == "accept" else f"reject: {line['reason'].split(':')[0]}"
        expected[label] = expected.get(label, 0) + 1
    counts = again.counts
    assert counts.reviewed == len(lines) == 6 and dict(counts.decisions) == expected == dict(summary.run.decisions)
    assert counts.protocols["full_supervision"] == sum(line.get("protocol") == "full_supervision" for line in lines) >= 1
    assert counts.keep_intervals == sum(len(line.get("keep", [])) for line in lines) > 0


def test_the_review_counts_take_the_latest_review_of_each_rollout(tmp_path: Path) -> None:
    path = tmp_path / "reviews.jsonl"
    reviews = [
        Review(trajectory_id="a", decision="reject", reason="judge_error: timed out"),
        Review(
            trajectory_id="a", decision="accept", protocol="keep_intervals", keep=[{"field": "content"}, {"field": "reasoning_content"}]
        ),
        Review(trajectory_id="b", decision="reject", reason="no_clean_solution: wrong"),
    ]
    path.write_text("".join(r.model_dump_json() + "\n" for r in reviews) + "not json\n")
    counts = count_keep_reviews(path)
    assert counts.reviewed == 2 and counts.decisions == {"accept": 1, "reject: no_clean_solution": 1}
    assert counts.protocols == {"keep_intervals": 1, "none": 1} and counts.keep_intervals == 2 and counts.unreadable == 1


def test_review_refuses_without_a_keep_judge_or_with_an_unknown_backend(tmp_path: Path) -> None:
    pool = _imported(tmp_path, _rows("math-m04"))
    with pytest.raises(OpError, match="needs a keep judge"):
        run_single_turn_review(SingleTurnReviewOptions(pool, tmp_path / "r.jsonl", JudgeOptions()))
    with pytest.raises(OpError, match="--backend must be"):
        run_single_turn_review(SingleTurnReviewOptions(pool, tmp_path / "r.jsonl", JudgeOptions(judge1="j", backend="grpc")))
    with pytest.raises(OpError, match="no such pool"):
        run_single_turn_review(SingleTurnReviewOptions(tmp_path / "none.jsonl", tmp_path / "r.jsonl", JudgeOptions(judge1="j")))
    assert not (tmp_path / "r.jsonl").exists()


# ---- the two front-ends build the same options -----------------------------------------------


PIPELINE = """\
workdir = "work"

[pool.single_turn]
tasks = "tasks/mine.jsonl"
paths = ["dumps"]
format = "openrlhf"
columns = {{ task_id = "problem", checkpoint = "ckpt" }}
thinking = false

[review]
judge1 = "keep-model"
judge2 = "audit-model"
backend = "chat"
base_url = "http://judge:1/v1"
judge2_base_url = "http://auditor:2/v1"
api_key_env = "JUDGE_KEY"
price_in = 1.5
prices = "prices.toml"
workers = 7
spend_cap_usd = 2.5
{extra}"""


def test_every_single_turn_option_is_sayable_in_the_pipeline_file(tmp_path: Path) -> None:
    from rich.console import Console

    from relearn.pipeline.config import load_pipeline
    from relearn.pipeline.context import Context
    from relearn.pipeline.stages.pool_single_turn import import_options
    from relearn.pipeline.stages.review_single_turn import review_options
    from relearn.pipeline.stages.verify_single_turn import verify_options

    (tmp_path / "p.toml").write_text(PIPELINE.format(extra=""))
    ctx = Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO()))
    imported = import_options(ctx, tmp_path / "pool.jsonl")
    assert imported == SingleTurnImportOptions(
        [tmp_path / "dumps"], tmp_path / "pool.jsonl", "openrlhf", {"task_id": "problem", "checkpoint": "ckpt"}, thinking=False
    )
    assert verify_options(ctx, Path("p"), Path("v")).tasks == str(tmp_path / "tasks" / "mine.jsonl")
    review = review_options(ctx, Path("v"), Path("r"))
    assert review == SingleTurnReviewOptions(
        Path("v"), Path("r"),
        JudgeOptions(judge1="keep-model", judge2="audit-model", backend="chat", base_url="http://judge:1/v1",
                     judge2_base_url="http://auditor:2/v1", api_key_env="JUDGE_KEY", price_in=1.5, prices=tmp_path / "prices.toml"),
        workers=7, spend_cap=2.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("batch = true\n", r"\[review\] batch: not used by the single-turn"),
        ("judge_context = 9000\nestimate = true\n", r"\[review\] estimate, judge_context: not used"),
        ("[verify]\nworkers = 8\n", r"\[verify\] workers: a single-turn pool is graded by its tasks' verifiers"),
    ],
)
def test_the_pipeline_file_refuses_fields_a_single_turn_pipeline_does_not_read(tmp_path: Path, extra: str, message: str) -> None:
    from relearn.pipeline.config import PipelineError, load_pipeline

    (tmp_path / "p.toml").write_text(PIPELINE.format(extra=extra))
    with pytest.raises(PipelineError, match=message):
        load_pipeline(tmp_path / "p.toml")
    (tmp_path / "p.toml").write_text('tasks = "mini"\n' + PIPELINE.format(extra=""))
    with pytest.raises(PipelineError, match=r"tasks: a single-turn pool names its tasks in \[pool.single_turn\]"):
        load_pipeline(tmp_path / "p.toml")
    (tmp_path / "p.toml").write_text(PIPELINE.format(extra="").replace('format = "openrlhf"', 'format = "sharegpt"'))
    with pytest.raises(PipelineError, match="pool.single_turn.format: Input should be 'rows', 'verl', 'openrlhf' or 'chat'"):
        load_pipeline(tmp_path / "p.toml")


def test_the_import_command_passes_its_flags_and_exits_2_on_unusable_input(tmp_path: Path) -> None:
    from relearn.cli.main import app

    rows = [{"q": "1+1?", "out": "<think>\nadd\n</think>\n\n$\\boxed{2}$", "score": 1.0, "n": 9, "ckpt": "iter-9"}]
    source = _write(tmp_path / "r.jsonl", rows)
    pool = tmp_path / "pool.jsonl"
    flags = ["--prompt", "q", "--response", "out", "--reward", "score", "--step", "n", "--checkpoint", "ckpt", "--no-thinking"]
    result = CliRunner().invoke(app, ["single-turn", "import", str(source), "-o", str(pool), *flags])
    assert result.exit_code == 0, result.output
    assert "rollouts imported" in result.output and "1" in result.output
    (trajectory,) = read_trajectories_lenient(pool, [])
    assert trajectory.policy.step == 9 and trajectory.policy.checkpoint == "iter-9"
    assert trajectory.messages[-1].reasoning_content is None and trajectory.messages[-1].content.startswith("add")
    bad = CliRunner().invoke(app, ["single-turn", "import", str(source), "-o", str(pool), "--preset", "sharegpt"])
    assert bad.exit_code == 2 and "'sharegpt' is not one of 'rows', 'verl', 'openrlhf', 'chat'" in " ".join(bad.output.split())


def test_the_formats_and_columns_are_the_importers() -> None:
    import dataclasses

    from harness.importers.single_turn import PRESETS, SingleTurnOptions
    from relearn.ops.single_turn import FORMATS
    from relearn.verbs.single_turn import COLUMNS

    assert set(FORMATS) == {*PRESETS, "chat"}
    assert set(COLUMNS) == {f.name for f in dataclasses.fields(SingleTurnOptions)} - {"preset", "split_thinking", "chat_prompt"}
