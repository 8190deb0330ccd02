"""verl rollout dumps (``{rollout_data_dir}/{step}.jsonl``), built here as verl's
``_dump_generations`` writes them: ``input``, ``output``, ``gts``, ``score``, ``step`` and the
reward function's extra keys."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from harness.import_run import import_files
from harness.importers import verl
from records.pools import read_trajectories
from records.trajectory import is_verified_positive

# As verl decodes them (skip_special_tokens=True): the template's role markers are gone.
PROMPT = "system\nPlease reason step by step.\nuser\nWhat is 2 + 3?\nassistant\n"


def _rows(step: int) -> list[dict[str, Any]]:
    return [
        {
            "input": PROMPT,
            "output": "<think>\n2 + 3 = 5\n</think>\n\nThe answer is 5.",
            "gts": "5",
            "score": 1.0,
            "step": step,
            "acc": True,
            "pred": "5",
        },
        {"input": PROMPT, "output": "The answer is 6.", "gts": "5", "score": 0.0, "step": step, "acc": False, "pred": "6"},
        {
            "input": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n",
            "output": "7",
            "gts": "7",
            "score": 1.0,
            "step": step,
            "acc": True,
            "pred": "7",
        },
    ]


def _write(folder: Path, step: int, rows: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{step}.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_step_file_rows_become_single_turn_trajectories(tmp_path: Path) -> None:
    rows = _rows(40)
    path = _write(tmp_path / "rollouts", 40, rows)
    results = list(verl.read(path))
    assert [r.error for r in results] == [None, None, None]
    first, second, third = (r.trajectory for r in results)
    # One prompt message (the decoded template text, said so), one generated answer.
    assert [m.role for m in first.messages] == ["user", "assistant"] and first.messages[0].content == PROMPT
    assert first.messages[0].extra == {"rendered_prompt": True}
    assert [m.generated for m in first.messages] == [False, True]
    assert first.messages[1].reasoning_content == "\n2 + 3 = 5\n" and first.messages[1].content == "\n\nThe answer is 5."
    assert second.messages[1].content == "The answer is 6." and second.messages[1].reasoning_content is None
    # The step is the policy's; the samples of one prompt are one task, numbered by attempt.
    assert [t.policy.step for t in (first, second, third)] == [40, 40, 40]
    assert first.task_id == second.task_id != third.task_id and [first.attempt, second.attempt, third.attempt] == [0, 1, 0]
    # The score is an imported reward, with the reward function's extra keys beside it.
    assert [t.outcome.reward for t in (first, second, third)] == [1.0, 0.0, 1.0]
    assert first.outcome.verdict == {"imported_from": "verl", "re_verified": False, "source_fields": {"gts": "5", "acc": True, "pred": "5"}}
    assert is_verified_positive(first) and not is_verified_positive(second)
    assert first.source.meta == {"gts": "5", "score": 1.0, "step": 40, "acc": True, "pred": "5"}
    assert dict(results[0].diagnostics.unknown) == {"reward field 'acc'": 3, "reward field 'pred'": 3}
    # Template markers that survived split the prompt back into its messages.
    assert [(m.role, m.content) for m in third.messages] == [("system", "Be brief."), ("user", "Name a prime."), ("assistant", "7")]


def test_a_dump_folder_in_step_order_and_resumable(tmp_path: Path) -> None:
    folder = tmp_path / "rollouts"
    for step in (10, 2, 1):
        _write(folder, step, _rows(step))
    (folder / "notes.jsonl").write_text("{}\n")
    files = verl.discover(folder)
    assert [p.name for p in files] == ["1.jsonl", "2.jsonl", "10.jsonl"]
    pool = tmp_path / "pool.jsonl"
    summary = import_files("verl", files, pool)
    assert summary.imported == 9 and not summary.rejected
    assert sorted({t.policy.step for t in read_trajectories(pool)}) == [1, 2, 10]
    again = import_files("verl", files, pool)
    assert again.imported == 0 and again.skipped_existing == 9


def test_damaged_lines_are_located(tmp_path: Path) -> None:
    rows = _rows(3)
    lines = [
        json.dumps(rows[0]),
        json.dumps({"input": PROMPT, "score": 1.0, "step": 3}),
        json.dumps(rows[1] | {"score": "high"}),
        "[1, 2]",
        json.dumps(rows[2] | {"step": 4}),
    ]
    path = tmp_path / "3.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results = list(verl.read(path))
    errors = [str(r.error) for r in results if r.error is not None]
    assert errors == [
        f"{path}:2: output: missing",
        f"{path}:3: score: expected a number, got str",
        f"{path}:4: expected an object, got array",
    ]
    kept = [r.trajectory for r in results if r.trajectory is not None]
    assert [t.policy.step for t in kept] == [3, 4]
    assert any("step 4 in a file named for step 3" in w for w in results[0].diagnostics.warnings)


def test_cli_import_and_validate(relearn_bin: str, tmp_path: Path) -> None:
    folder = tmp_path / "rollouts"
    _write(folder, 5, _rows(5))
    pool = tmp_path / "pool.jsonl"
    result = subprocess.run([relearn_bin, "import", "verl", str(folder), "-o", str(pool)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert subprocess.run([relearn_bin, "validate", str(pool)], capture_output=True, text=True, timeout=120).returncode == 0
