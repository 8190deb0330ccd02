from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from envs.tasks import load_tasks, patch_files


def test_swebench_verified_parquet(samples: Path) -> None:
    tasks, errors = load_tasks(samples / "swebench_verified.parquet")
    assert len(tasks) == 500 and not errors
    by_id = {t.instance_id: t for t in tasks}
    flask = by_id["pallets__flask-5014"]
    assert flask.kind == "swebench" and flask.repo == "pallets/flask"
    assert isinstance(flask.FAIL_TO_PASS, list) and flask.FAIL_TO_PASS  # decoded from the JSON string
    assert flask.log_parser == "parse_log_flask" and flask.eval_type == "pass_and_fail"
    assert flask.image == "swebench/sweb.eval.x86_64.pallets_1776_flask-5014:latest"
    assert flask.test_files == patch_files(flask.test_patch) and flask.test_files
    assert {t.difficulty for t in tasks} == {"<15 min fix", "15 min - 1 hour", "1-4 hours", ">4 hours"}


def test_jsonl_and_json_give_the_same_tasks(samples: Path, tmp_path: Path) -> None:
    from_jsonl, errors = load_tasks(samples / "swebench_verified_2.jsonl")
    assert [t.instance_id for t in from_jsonl] == ["pallets__flask-5014", "sympy__sympy-19637"] and not errors
    rows = [json.loads(line) for line in (samples / "swebench_verified_2.jsonl").read_text().splitlines()]
    (tmp_path / "two.json").write_text(json.dumps(rows))
    from_json, _ = load_tasks(tmp_path / "two.json")
    assert [t.model_dump() for t in from_json] == [t.model_dump() for t in from_jsonl]


def test_bad_records_are_located_and_the_rest_load(samples: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (samples / "swebench_verified_2.jsonl").read_text().splitlines()]
    broken = dict(rows[0], FAIL_TO_PASS="[not json")
    no_statement = {k: v for k, v in rows[1].items() if k != "problem_statement"}
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (rows[0], broken, no_statement)) + "\n{truncated\n")
    tasks, errors = load_tasks(path)
    assert [t.instance_id for t in tasks] == ["pallets__flask-5014"]
    messages = [str(e) for e in errors]
    assert messages[0].startswith(f"{path}:2: FAIL_TO_PASS:") and "not a JSON list" in messages[0]
    assert messages[1].startswith(f"{path}:3: problem_statement: Field required")
    assert messages[2].startswith(f"{path}:4: invalid JSON")
    table = pa.table({"instance_id": ["x"], "problem_statement": ["p"], "FAIL_TO_PASS": ["[]"], "PASS_TO_PASS": ["[]"]})
    pq.write_table(table, tmp_path / "empty_tests.parquet")
    _tasks, errors = load_tasks(tmp_path / "empty_tests.parquet")
    assert "FAIL_TO_PASS: empty" in str(errors[0])


def test_openswe_record(tmp_path: Path) -> None:
    record = {
        "instance_id": "org__lib-1",
        "repo": "org/lib",
        "base_commit": "abc",
        "end_commit": "def",
        "problem_statement": "bug",
        "patch": "",
        "test_patch": "diff --git a/tests/test_x.py b/tests/test_x.py\n",
        "language": "python",
        "eval_script": "#!/bin/bash\npytest; echo OPENSWE_EXIT_CODE=$?\n",
    }
    (tmp_path / "openswe.jsonl").write_text(json.dumps(record) + "\n")
    (task,), errors = load_tasks(tmp_path / "openswe.jsonl")
    assert not errors and task.kind == "openswe" and task.test_files == ["tests/test_x.py"]


def test_harbor_task_folder(tmp_path: Path) -> None:
    folder = tmp_path / "hello-world"
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "instruction.md").write_text("Create hello.txt containing 'Hello, world!'.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM relearn/base\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 120.0\n[environment]\ncpus = 1\nmemory_mb = 1024\n')
    (task,), errors = load_tasks(folder)
    assert not errors
    assert task.kind == "harbor" and task.instance_id == "hello-world" and task.verifier_timeout_s == 120.0
    assert task.problem_statement.startswith("Create hello.txt") and task.memory_mb == 1024 and task.workdir == "/app"
    (folder / "task.toml").write_text("[verifier\n")
    _tasks, errors = load_tasks(folder)
    assert "task.toml: invalid TOML" in str(errors[0])
    (folder / "task.toml").unlink()
    (folder / "tests" / "test.sh").unlink()
    _tasks, errors = load_tasks(tmp_path)
    assert "tests/test.sh: missing" in str(errors[0])


def test_patch_files() -> None:
    patch = (
        "diff --git a/src/a.py b/src/a.py\n--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1 @@\n-x\n+y\n"
        "diff --git a/old.txt b/new.txt\nsimilarity index 100%\nrename from old.txt\nrename to new.txt\n"
        "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n"
    )
    assert patch_files(patch) == ["src/a.py", "old.txt", "new.txt", "gone.py"]
    assert patch_files("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == ["x.py"]
