"""Importing single-turn RL rollouts from row dumps (column flags, verl and OpenRLHF layouts, chat records)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness.import_run import import_files
from harness.importers.single_turn import SingleTurnImporter, options_for, split_response
from records.pools import read_trajectories_lenient
from records.trajectory import Trajectory


def _import(path: Path, out: Path, **options: object) -> tuple[list[Trajectory], object]:
    summary = import_files("single-turn", [path], out, importer=SingleTurnImporter(options_for(**options)))  # type: ignore[arg-type]
    return list(read_trajectories_lenient(out, [])), summary


def test_rows_with_named_columns_become_one_prompt_and_one_generated_response(tmp_path: Path) -> None:
    rows = [
        {
            "question": "1+1?",
            "completion": "<think>\n1 and 1 make 2.\n</think>\n\nThe answer is $\\boxed{2}$.",
            "score": 1,
            "iteration": 3,
            "problem": "p1",
            "token_ids": [1, 2, 3],
            "data_source": "gsm8k",
        },
        {"question": "1+1?", "completion": "I think it is 2.</think>\n\n$\\boxed{2}$", "score": 0.0, "iteration": 3, "problem": "p1"},
        {"question": "2+2?", "completion": "4", "score": "high", "iteration": 3, "problem": "p2"},
        {"question": "3+3?", "completion": "6", "score": 1.0, "iteration": 4},
    ]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool, summary = _import(
        path, tmp_path / "pool.jsonl", prompt="question", response="completion", reward="score", step="iteration", task_id="problem"
    )
    assert len(pool) == 3 and len(summary.rejected) == 1  # type: ignore[attr-defined]
    bad = summary.rejected[0]  # type: ignore[attr-defined]
    assert bad.line == 3 and bad.field == "score" and "number" in bad.message
    first, second, third = pool
    assert [m.role for m in first.messages] == ["user", "assistant"] and first.messages[1].generated and not first.messages[0].generated
    assert first.messages[1].reasoning_content == "1 and 1 make 2." and first.messages[1].content == "The answer is $\\boxed{2}$."
    assert first.messages[1].token_ids == [1, 2, 3]
    assert first.policy.step == 3 and first.task_id == "p1" and (first.attempt, second.attempt) == (0, 1)
    assert first.outcome.reward == 1.0 and first.outcome.verdict["imported_from"] == "single-turn"
    assert first.source.meta == {"columns": {"data_source": "gsm8k"}}
    # A response whose <think> was in the generation prompt: text up to </think> is the reasoning.
    assert second.messages[1].reasoning_content == "I think it is 2." and second.messages[1].content == "$\\boxed{2}$"
    assert third.task_id.startswith("prompt-") and third.policy.step == 4
    # A rerun imports nothing twice.
    _pool, again = _import(
        path, tmp_path / "pool.jsonl", prompt="question", response="completion", reward="score", step="iteration", task_id="problem"
    )
    assert again.imported == 0 and again.skipped_existing == 3  # type: ignore[attr-defined]


def test_verl_and_openrlhf_presets(tmp_path: Path) -> None:
    verl_dir = tmp_path / "verl"
    verl_dir.mkdir()
    line = {
        "input": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
        "output": "<think>\n2+3=5\n</think>\n\n\\boxed{5}",
        "score": 1.0,
        "gts": "5",
    }
    (verl_dir / "7.jsonl").write_text(json.dumps(line) + "\n")
    pool, _ = _import(verl_dir / "7.jsonl", tmp_path / "verl.jsonl", preset="verl")
    (t,) = pool
    assert [m.role for m in t.messages] == ["system", "user", "assistant"] and t.messages[1].content == "What is 2+3?"
    assert t.policy.step == 7 and t.outcome.reward == 1.0 and t.source.meta == {"columns": {"gts": "5"}}
    table = pa.table({"prompt": ["Name a colour."], "output": ["Blue."], "reward": [0.5], "global_step": [12]})
    pq.write_table(table, tmp_path / "samples.parquet")
    pool, _ = _import(tmp_path / "samples.parquet", tmp_path / "orlhf.jsonl", preset="openrlhf")
    (t,) = pool
    assert t.messages[-1].content == "Blue." and t.policy.step == 12 and t.outcome.reward == 0.5


def test_no_thinking_form_keeps_the_whole_response_as_visible_text() -> None:
    assert split_response("<think>\nwork\n</think>\n\nanswer") == ("work", "answer")
    assert split_response("<think>\nwork\n</think>\n\nanswer", split_thinking=False) == (None, "work\n\nanswer")
    assert split_response("just an answer") == (None, "just an answer")


def test_chat_records_with_one_assistant_turn_are_graded_as_single_turn_rollouts(tmp_path: Path) -> None:
    from envs.single_turn.tasks import MINI_TASKS, load_tasks
    from envs.single_turn.verify import grade
    from harness.importers import chat

    row = {
        "instance_id": "math-m02",
        "messages": [
            {"role": "user", "content": "Solve for x: 2x + 6 = 14."},
            {"role": "assistant", "reasoning_content": "2x = 8.", "content": "$\\boxed{4}$"},
        ],
    }
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(row) + "\n")
    import_files("chat", [path], tmp_path / "pool.jsonl", importer=chat.ChatImporter(chat.options_for()))
    (trajectory,) = read_trajectories_lenient(tmp_path / "pool.jsonl", [])
    tasks, _ = load_tasks(MINI_TASKS)
    outcome = grade(trajectory, tasks[trajectory.task_id or ""])
    assert outcome.resolved and outcome.verdict["kind"] == "math" and outcome.verdict["extracted"] == "4"
