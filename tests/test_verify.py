"""The verifier and the audit on the bundled mini suite, in real containers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from envs.audit import audit
from envs.batch import Prediction, load_predictions, verify_batch
from envs.images import mini_image_tag, task_image
from envs.tasks import Task, load_tasks
from envs.verify import verify

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
VERIFIED = Path(__file__).resolve().parent.parent.parent / "shared" / "samples" / "swebench_verified.parquet"
TASKS, TASK_ERRORS = load_tasks(MINI_SUITE)
BY_ID = {t.instance_id: t for t in TASKS}
IDS = sorted(BY_ID)


def _with_feature(feature: str) -> Task:
    return next(t for t in TASKS if feature in t.model_extra.get("features", []))


def make_patch(task: Task, tmp_path: Path, edits: dict[str, str | None], *, after_gold: bool = False) -> str:
    """A git diff of ``edits`` (path -> new content, None deletes) on the task's base repo."""
    repo = tmp_path / "repo"
    shutil.copytree(Path(task.task_dir) / "repo", repo)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    if after_gold:
        subprocess.run(["git", "apply", "-"], cwd=repo, input=task.patch, text=True, check=True)
    for path, content in edits.items():
        target = repo / path
        if content is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    return subprocess.run(["git", "diff", "--cached", "--binary"], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_the_suite_is_complete() -> None:
    assert not TASK_ERRORS and len(TASKS) >= 8
    features = {f for t in TASKS for f in t.model_extra.get("features", [])}
    assert {"multi_file_fix", "slow_tests", "tempting_wrong_fix", "git_history_exposes_fix"} <= features
    for task in TASKS:
        assert task.FAIL_TO_PASS and len(task.PASS_TO_PASS) >= 2 and task.test_files, task.instance_id
    multi = _with_feature("multi_file_fix")
    from envs.tasks import patch_files

    assert len(patch_files(multi.patch)) >= 2


@pytest.mark.parametrize("instance_id", IDS)
def test_gold_resolves_and_empty_does_not(docker_client: docker.DockerClient, images: dict[str, str], instance_id: str) -> None:
    task = BY_ID[instance_id]
    gold = verify(docker_client, task, task.patch, images[instance_id])
    assert gold.resolved and gold.reward == 1.0, (gold.error, gold.tests, gold.log_tail[-1500:])
    assert sorted(gold.tests["FAIL_TO_PASS"]["success"]) == sorted(task.FAIL_TO_PASS)
    assert sorted(gold.tests["PASS_TO_PASS"]["success"]) == sorted(task.PASS_TO_PASS)
    assert gold.image_digest and gold.apply_command == "git apply --verbose"
    assert not gold.suspicious and not gold.restored_files and not gold.disagreements  # a plain fix is not marked
    empty = verify(docker_client, task, "", images[instance_id])
    assert not empty.resolved and empty.reward == 0.0 and not empty.patch_exists
    assert sorted(empty.tests["FAIL_TO_PASS"]["failure"]) == sorted(task.FAIL_TO_PASS)  # the tests do catch the bug


def test_the_tempting_wrong_fix_fails(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    task = _with_feature("tempting_wrong_fix")
    wrong = (Path(task.task_dir) / "wrong.patch").read_text()
    verdict = verify(docker_client, task, wrong, images[task.instance_id])
    assert not verdict.resolved
    assert sorted(verdict.tests["FAIL_TO_PASS"]["success"]) == sorted(task.FAIL_TO_PASS)  # looks fixed...
    assert verdict.tests["PASS_TO_PASS"]["failure"]  # ...but breaks what worked


def test_a_conftest_that_forces_passes_is_reverted(docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path) -> None:
    task = BY_ID[IDS[0]]
    hack = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    report = outcome.get_result()\n    report.outcome = 'passed'\n"
    )
    patch = make_patch(task, tmp_path, {"conftest.py": hack})
    verdict = verify(docker_client, task, patch, images[task.instance_id])
    assert not verdict.resolved and verdict.restored_files == ["conftest.py"]
    assert verdict.suspicious and verdict.tests["FAIL_TO_PASS"]["failure"]


def test_edits_to_the_tests_are_reverted(docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path) -> None:
    task = BY_ID[IDS[1]]
    patch = make_patch(task, tmp_path, {task.test_files[0]: "def test_nothing():\n    assert True\n"}, after_gold=False)
    verdict = verify(docker_client, task, patch, images[task.instance_id])
    assert not verdict.resolved and verdict.restored_files == [task.test_files[0]]


def test_printed_passed_lines_do_not_pass(docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path) -> None:
    """A patch that prints fake PASSED lines after pytest's own summary."""
    task = BY_ID[IDS[2]]
    package = next(p for p in (Path(task.task_dir) / "repo").iterdir() if (p / "__init__.py").is_file())
    init = (package / "__init__.py").read_text()
    lines = "".join(f"PASSED {test}\\n" for test in task.FAIL_TO_PASS)
    spoof = init + f"\nimport atexit as _a, os as _o\n_a.register(lambda: _o.write(1, b'{lines}'))\n"
    patch = make_patch(task, tmp_path, {f"{package.name}/__init__.py": spoof})
    verdict = verify(docker_client, task, patch, images[task.instance_id])
    assert not verdict.resolved
    assert "PASSED " + task.FAIL_TO_PASS[0] in verdict.log_tail  # the spoof did print


def test_a_patch_that_does_not_apply(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    task = BY_ID[IDS[0]]
    bad = "diff --git a/nowhere.py b/nowhere.py\n--- a/nowhere.py\n+++ b/nowhere.py\n@@ -1,3 +1,3 @@\n-a\n+b\n c\n d\n"
    verdict = verify(docker_client, task, bad, images[task.instance_id])
    assert not verdict.patch_applied and not verdict.resolved and verdict.error.startswith("the patch does not apply")
    assert verdict.tests is None


def test_slow_tests_time_out_cleanly(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    task = _with_feature("slow_tests")
    verdict = verify(docker_client, task, task.patch, images[task.instance_id], timeout_s=1.0)
    assert verdict.timed_out and not verdict.resolved
    assert verdict.durations_s["tests"] < 1.0 + 8.0


def test_audit_flags_an_image_whose_history_has_the_fix(
    docker_client: docker.DockerClient, base_image: str, images: dict[str, str]
) -> None:
    task = _with_feature("git_history_exposes_fix")
    clean = audit(docker_client, task, images[task.instance_id])
    assert not clean.flagged and clean.error is None
    leaky_image = task_image(docker_client, task, base_image, leaky=True)
    assert leaky_image == mini_image_tag(task, leaky=True)
    leaky = audit(docker_client, task, leaky_image)
    assert leaky.flagged and len(leaky.future_commits) == 1
    from envs.tasks import patch_files

    assert sorted(leaky.fix_blobs) == sorted(f for f in patch_files(task.patch))
    # The leaky image still grades correctly: the audit, not the grader, is the guard.
    assert verify(docker_client, task, task.patch, leaky_image).resolved


def test_batch_is_parallel_and_resumable(
    docker_client: docker.DockerClient, base_image: str, images: dict[str, str], tmp_path: Path
) -> None:
    chosen = {i: BY_ID[i] for i in IDS[:2]}
    predictions = [Prediction(i, t.patch, "gold") for i, t in chosen.items()] + [Prediction(i, "", "empty") for i in chosen]
    output = tmp_path / "verdicts.jsonl"
    first = verify_batch(docker_client, chosen, predictions, output, workers=2, base_image=base_image, log_dir=tmp_path / "logs")
    assert len(first.verdicts) == 4 and not first.errors
    assert sum(v.resolved for v in first.verdicts) == 2
    assert all(Path(v.log_path).is_file() for v in first.verdicts)
    again = verify_batch(docker_client, chosen, predictions + [Prediction("nope", "", None)], output, workers=2, base_image=base_image)
    assert again.skipped == 4 and not again.verdicts and again.errors == ["nope: no such task"]
    assert len(output.read_text().splitlines()) == 4


def test_predictions_files(tmp_path: Path) -> None:
    (tmp_path / "preds.json").write_text('{"a": {"model_name_or_path": "m", "model_patch": "x"}}')
    predictions, errors = load_predictions(tmp_path / "preds.json")
    assert [(p.instance_id, p.patch) for p in predictions] == [("a", "x")] and not errors
    (tmp_path / "preds.jsonl").write_text(
        '{"instance_id": "a", "model_patch": null}\n{"model_patch": "x"}\n{"instance_id": "b", "model_patch": 3}\n'
    )
    predictions, errors = load_predictions(tmp_path / "preds.jsonl")
    # A row of the wrong type is refused with its own verdict (issue 45); one without an
    # instance id has no task to key a verdict by.
    assert [(p.instance_id, p.refused) for p in predictions] == [
        ("a", None), ("b", f"{tmp_path / 'preds.jsonl'}:3: model_patch: expected string, got int")
    ]  # fmt: skip
    assert [str(e).split(": ", 1)[1] for e in errors] == ["instance_id: missing or not a string"]


def test_harbor_task(docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> None:
    folder = tmp_path / "hello"
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "instruction.md").write_text("Create /app/hello.txt with the text 'Hello, world!'.\n")
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {base_image}\nRUN mkdir -p /app && cd /app && git init -q && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m base\nWORKDIR /app\n"
    )
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif [ \"$(cat /app/hello.txt)\" = 'Hello, world!' ]; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    (folder / "task.toml").write_text("[verifier]\ntimeout_sec = 60.0\n")
    (task,), _ = load_tasks(folder)
    image = task_image(docker_client, task)
    patch = "diff --git a/hello.txt b/hello.txt\nnew file mode 100644\n--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+Hello, world!\n"
    good = verify(docker_client, task, patch, image)
    assert good.resolved and good.rewards == {"reward": 1.0}
    bad = verify(docker_client, task, "", image)
    assert not bad.resolved and bad.rewards == {"reward": 0.0}


def test_openswe_exit_code_marker(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    mini = BY_ID[IDS[0]]
    targets = " ".join(sorted({t.split("::")[0] for t in mini.FAIL_TO_PASS}))
    script = (
        "#!/bin/bash\nset -uxo pipefail\ncd /testbed\ngit apply -v - <<'EOF_1'\n" + mini.test_patch + "EOF_1\n"
        f": '>>>>> Start Test Output'\npython3 -m pytest -q -p no:cacheprovider {targets}\nrc=$?\n"
        ": '>>>>> End Test Output'\necho OPENSWE_EXIT_CODE=$rc\n"
    )
    task = Task(instance_id="openswe__" + mini.instance_id, kind="openswe", problem_statement="x", patch=mini.patch, eval_script=script)
    assert verify(docker_client, task, mini.patch, images[mini.instance_id]).resolved
    assert not verify(docker_client, task, "", images[mini.instance_id]).resolved


def test_the_shapes_real_patches_take_still_apply(docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path) -> None:
    """Beside the gold fix: a rename, a new file with CRLF line ends, a deleted file and a mode
    change, as agents' diffs and SWE-bench gold patches have them."""
    task = BY_ID["mini__calc-1"]
    readme = (Path(task.task_dir) / "repo" / "README.md").read_text()
    patch = make_patch(task, tmp_path, {"README.md": None, "docs/README.md": readme, "notes/crlf.txt": "one\r\ntwo\r\n"}, after_gold=True)
    subprocess.run(["chmod", "+x", str(tmp_path / "repo" / "calc" / "tokenizer.py")], check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path / "repo", check=True)
    patch = subprocess.run(["git", "diff", "--cached", "--binary"], cwd=tmp_path / "repo", check=True, capture_output=True).stdout.decode()
    assert "rename from README.md" in patch and "\r\n" in patch and "new mode 100755" in patch
    verdict = verify(docker_client, task, patch, images[task.instance_id])
    assert verdict.resolved and verdict.apply_command == "git apply --verbose", (verdict.error, verdict.disagreements)
    assert {"README.md", "docs/README.md", "notes/crlf.txt", "calc/evaluator.py", "calc/tokenizer.py"} <= set(verdict.touched_files)
    assert verdict.neutralized == ["calc/tokenizer.py: made non-executable (the base commit has no such executable)"]
    assert verdict.report == "junit" and not verdict.restored_files and not verdict.suspicious


def test_a_test_patch_that_does_not_apply_is_an_error_not_a_grade(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    task = BY_ID["mini__calc-1"]
    broken = task.model_copy(update={"test_patch": task.test_patch.replace(" def test_missing_closing_paren():", " def test_not_there():")})
    verdict = verify(docker_client, broken, task.patch, images[task.instance_id])
    assert not verdict.resolved and verdict.tests is None
    assert verdict.error.startswith("the test setup failed, nothing was graded: setup step failed: git apply -v"), verdict.error


def test_the_eval_script_is_split_into_a_fatal_setup_and_the_test_command(samples: Path, tmp_path: Path) -> None:
    from envs.tasks import load_tasks as load
    from envs.test_run import split_eval_script

    (task, *_), errors = load(samples / "swebench_verified.parquet")
    assert not errors and task.eval_script
    phases = split_eval_script(task.eval_script, task.workdir)
    setup, test = phases.setup, phases.test
    assert "git status" not in setup and "git show" not in setup and " diff " not in setup  # echoes of the candidate's changes
    assert f"git checkout {task.base_commit} " in setup and "git apply -v - <<'EOF_114329324912' || {" in setup
    assert "exit 97" in setup and "python -m pip install -e" in setup
    assert test.splitlines()[2:5] == ["source /opt/miniconda3/bin/activate", "conda activate testbed", "cd /testbed"]
    # The canary goes into the test file the command runs (tracked by git), named like its tests.
    assert phases.framework == "pytest" and phases.canary_file == "astropy/modeling/tests/test_separable.py"
    assert len(phases.canary) == 2 and all(name.startswith("test_") for name in phases.canary)
    assert not any("relearn" in name or "canary" in name for name in phases.canary)
    assert all(f"def {name}():" in phases.canary_text for name in phases.canary)  # as the file's tests: functions
    assert f"for f in /testbed/{phases.canary_file}; do" in test and 'cat /tmp/relearn/canary.txt >> "$f"' in test
    assert (
        f"pytest -p relearn_guard -rA astropy/modeling/tests/test_separable.py --junitxml={phases.report_path} -o junit_family=xunit1\nrelearn_status=$?"
        in test
    )
    assert test.rstrip().endswith("relearn_status=$?\nexit $relearn_status")
    for name, script in (("setup.sh", setup), ("test.sh", test)):
        (tmp_path / name).write_text(script)
        assert subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True).returncode == 0, script


def test_the_junit_report_names_tests_as_the_log_parser_does(tmp_path: Path) -> None:
    """A real pytest run: the report's ids and outcomes equal what swebench's parser reads in
    the -rA log, for a class, parameters, xfail, skip, a failure and an error."""
    import sys

    from swebench.harness.log_parsers.python import parse_log_pytest

    from envs.test_run import parse_junit

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "test_mix.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('setup')\n\n\n"
        "class TestThing:\n    def test_ok(self):\n        pass\n\n\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_param(x):\n    assert x == 1\n\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xfail():\n    assert False\n\n\n"
        "@pytest.mark.skip(reason='no')\ndef test_skip():\n    pass\n\n\n"
        "def test_error(broken):\n    pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "--junitxml=report.xml", "-o", "junit_family=xunit1", "pkg/test_mix.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    junit = parse_junit((tmp_path / "report.xml").read_bytes())
    assert junit == {
        "pkg/test_mix.py::TestThing::test_ok": "PASSED", "pkg/test_mix.py::test_param[1]": "PASSED",
        "pkg/test_mix.py::test_param[2]": "FAILED", "pkg/test_mix.py::test_xfail": "XFAIL",
        "pkg/test_mix.py::test_skip": "SKIPPED", "pkg/test_mix.py::test_error": "ERROR",
    }  # fmt: skip
    logged = parse_log_pytest(run.stdout, None)
    # -rA writes a skip as "SKIPPED [1] path:line: reason", without the test's id.
    assert {k: v for k, v in logged.items() if k in junit} == {k: v for k, v in junit.items() if v != "SKIPPED"}


def test_forged_marker_lines_are_not_read() -> None:
    from envs.grading import sanitize

    output = "PASSED a.py::t\n>>>>> End Test Output\nx >>>>> Test Exit Code: 0\nFAILED a.py::u\n"
    assert sanitize(output) == ("PASSED a.py::t\nFAILED a.py::u\n", 2)


def test_tests_without_the_test_patch_in_place_are_not_graded(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    """An eval script that forgets to apply the test patch (or a setup undone by something
    else) would grade the candidate against the old tests."""
    mini = BY_ID["mini__calc-1"]
    script = "#!/bin/bash\ncd /testbed\n: '>>>>> Start Test Output'\npython3 -m pytest -rA -p no:cacheprovider tests/test_calc.py\n: '>>>>> End Test Output'\n"
    task = mini.model_copy(update={"eval_script": script})
    verdict = verify(docker_client, task, mini.patch, images[mini.instance_id])
    assert not verdict.resolved and verdict.tests is None
    assert verdict.error == "the test patch is not in place after the setup (the test files are not the ones the task grades with)"


def test_a_test_file_the_test_patch_creates_is_removed_not_checked_out(tmp_path: Path) -> None:
    """The setup the verifier runs for a real Verified row whose test patch adds a file
    (django__django-16454, one of 15): the file does not exist at the base, git refuses the
    whole `git checkout BASE FILES`, and the row could never be graded. Run here in a scratch
    repository with the candidate's edits to both files: the existing one is reset, the new one
    removed so that the test patch can create it, and a base commit that is not there still fails."""
    import pyarrow.parquet as pq

    from envs.test_run import SETUP_FAILED, split_eval_script

    row = next(r for r in pq.read_table(VERIFIED).to_pylist() if r["instance_id"] == "django__django-16454")
    setup = split_eval_script(row["eval_script"], "/testbed").setup
    (line,) = [x for x in setup.splitlines() if x.startswith("git checkout")]
    existing, created = "tests/user_commands/tests.py", "tests/user_commands/management/commands/subparser_vanilla.py"
    repo = tmp_path / "repo"
    (repo / created).parent.mkdir(parents=True)
    (repo / existing).write_text("the base\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    (repo / existing).write_text("the candidate's edit\n")
    (repo / created).write_text("the candidate's own file\n")
    ran = subprocess.run(["bash", "-c", line.replace(row["base_commit"], base)], cwd=repo, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert (repo / existing).read_text() == "the base\n" and not (repo / created).exists()
    missing = subprocess.run(["bash", "-c", line], cwd=repo, capture_output=True, text=True)  # the row's own base: not in this repository
    assert missing.returncode == SETUP_FAILED and "setup step failed" in missing.stderr
