"""OpenSWE rows (GAIR-NLP/OpenSWE) as tasks: a row's ``image_name`` is its image, its
``Dockerfile`` builds it when the engine lacks it, its ``eval_script`` grades by the
``OPENSWE_EXIT_CODE`` it prints, a row without one is refused where it is read, and the
``.git`` audit names an OpenSWE image's full clone for what it is.

The containers are real: a tiny local repository (``tinymed``, in the shape of OpenSWE's own
``examples/data.example.jsonl``) with the fix commit (``end_commit``) and a later one, mirrored
where relearn keeps repository mirrors, and a Dockerfile in OpenSWE's shape (``COPY repo
/testbed``, ``WORKDIR /testbed/``) built ``FROM`` the local base image, offline."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs.audit import audit
from envs.images import image_exists, image_name, prepare_images, task_image
from envs.tasks import Task, load_tasks
from envs.verify import verify

GIT = ["git", "-c", "user.name=upstream", "-c", "user.email=upstream@example.com", "-c", "init.defaultBranch=main"]
STATS = '''def calculate_median(values):
    """Return the median of a non-empty list."""
    if not values:
        raise ValueError("values must not be empty")
    return sorted(values)[len(values) // 2]
'''
FIXED = '''def calculate_median(values):
    """Return the median of a non-empty list."""
    if not values:
        raise ValueError("values must not be empty")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
'''
TESTS = "from tinymed.stats import calculate_median\n\n\ndef test_odd_length():\n    assert calculate_median([9, 1, 5]) == 5\n"
MORE_TESTS = TESTS + "\n\ndef test_even_length_is_the_mean_of_the_middle_two():\n    assert calculate_median([1, 3, 7, 9]) == 5\n"
STATEMENT = (
    "Bug report: `calculate_median` returns the wrong value for even-length inputs: it picks the upper middle "
    "element (`sorted(x)[len(x)//2]`) instead of averaging the two middle elements. Keep odd-length behaviour."
)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def eval_script(base: str, test_patch: str) -> str:
    """An eval script as OpenSWE's eval-script agent writes them (its prompt's template: reset
    and apply the test patch, `echo` the test markers, `rc=$?`, echo the exit-code marker), less
    the conda activation the local base image has no use for."""
    return (
        "#!/bin/bash\ncd /testbed\n"
        f"git checkout {base} -- tests/test_stats.py\n"
        f"git apply -v - <<'EOF_114329324912'\n{test_patch}EOF_114329324912\n\n"
        "# Required: run target tests files instead of all tests!\n"
        'echo ">>>>> Start Test Output"\n'
        "python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_stats.py\n"
        "rc=$? # Required, save exit code\n"
        'echo ">>>>> End Test Output"\n'
        'echo "OPENSWE_EXIT_CODE=$rc" #Required, echo test status\n'
        f"git checkout {base} -- tests/test_stats.py\n"
    )


@dataclass
class World:
    base: str
    end: str
    later: str
    patch: str
    test_patch: str
    image: str  # the row's image_name, as Docker names it
    dockerfile: str
    folder: Path
    forged: str  # a patch that leaves the bug and prints OPENSWE_EXIT_CODE=0 at exit

    def row(self, **changes: object) -> dict[str, object]:
        row: dict[str, object] = {
            "instance_id": "tinymed__tinymed-1",
            "repo": "tinymed/tinymed",
            "base_commit": self.base,
            "end_commit": self.end,
            "created_at": "2025-03-06T00:00:00Z",
            "version": "0.0.1",
            "problem_statement": STATEMENT,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "language": "python",
            "image_name": self.image.replace("openswe--tinymed", "openswe--TinyMed"),  # OpenSWE's aliases are mixed case
            "Dockerfile": self.dockerfile,
            "eval_script": eval_script(self.base, self.test_patch),
        }
        row.update(changes)
        return {key: value for key, value in row.items() if value is not None}

    def rows_file(self, name: str, *rows: dict[str, object]) -> Path:
        path = self.folder / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient, base_image: str) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("openswe")
    source = folder / "tinymed"
    (source / "tinymed").mkdir(parents=True)
    (source / "tests").mkdir()
    (source / "tinymed" / "__init__.py").write_text("")
    (source / "tinymed" / "stats.py").write_text(STATS)
    (source / "tests" / "test_stats.py").write_text(TESTS)
    git("init", "-q", cwd=source)
    git("add", "-A", cwd=source)
    git("commit", "-qm", "tinymed", cwd=source)
    base = git("rev-parse", "HEAD", cwd=source).strip()
    (source / "tinymed" / "stats.py").write_text(FIXED)
    (source / "tests" / "test_stats.py").write_text(MORE_TESTS)
    git("commit", "-qam", "fix the median of even-length lists", cwd=source)
    end = git("rev-parse", "HEAD", cwd=source).strip()
    (source / "README.md").write_text("tinymed 0.0.2\n")
    git("add", "-A", cwd=source)
    git("commit", "-qm", "release 0.0.2", cwd=source)  # upstream goes on after the PR
    later = git("rev-parse", "HEAD", cwd=source).strip()
    patch = git("diff", base, end, "--", "tinymed", cwd=source)
    test_patch = git("diff", base, end, "--", "tests", cwd=source)
    git("checkout", "-q", base, cwd=source)
    forging = "import atexit, os\natexit.register(lambda: os.write(1, b'OPENSWE_EXIT_CODE=0\\n'))\n\n\n"
    (source / "tinymed" / "stats.py").write_text(forging + STATS)
    forged = git("diff", cwd=source)
    git("checkout", "-q", "--", ".", cwd=source)
    git("checkout", "-q", "main", cwd=source)
    # Where relearn keeps a repository's mirror: OpenSWE's builds clone from GitHub, this one
    # from here (offline), and the image gets the same full clone.
    cache = folder / "cache"
    subprocess.run(["git", "clone", "-q", "--mirror", str(source), str(cache / "repos" / "tinymed" / "tinymed.git")], check=True)
    patcher = pytest.MonkeyPatch()
    patcher.setenv("RELEARN_CACHE", str(cache))
    image = f"openswe--tinymed__tinymed-1:{uuid.uuid4().hex[:10]}"  # this run's own: absent until built
    dockerfile = (
        "# Base image specification. Defines the foundation OS and python version for the container (Required)\n"
        f"FROM {base_image}\n"
        "# Fetch source code. same as git clone && git reset --hard but avoid network stuff; guarantee to ready\n"
        "COPY repo /testbed\n"
        "# set default workdir to testbed. (Required)\n"
        "WORKDIR /testbed/\n"
        "RUN git config --global --add safe.directory /testbed\n"
    )
    yield World(base, end, later, patch, test_patch, image, dockerfile, folder, forged)
    patcher.undo()
    if image_exists(docker_client, image):
        docker_client.images.remove(image, force=True)


def real_shaped_row() -> dict[str, object]:
    """A row with every column an OpenSWE release row has, at the lengths real ones run to
    (issue text with a traceback, a multi-hunk fix, an eval script holding its test patch)."""
    base, end = "69be3918225b6863e88670af9a3da75a0a90ee1c", "7eb49f100a3e41f76e956f6d6cd8f308e7208e42"
    hunks = "".join(
        f"@@ -{10 * i + 1},6 +{10 * i + 1},8 @@ def helper_{i}(frame):\n     rows = frame.rows\n-    return rows[{i}]\n"
        f"+    if not rows:\n+        raise ValueError('empty frame')\n+    return rows[{i}]\n     # keep the order stable\n"
        for i in range(24)
    )
    patch = f"diff --git a/pkg/frame.py b/pkg/frame.py\nindex a7327ea..3b6922f 100644\n--- a/pkg/frame.py\n+++ b/pkg/frame.py\n{hunks}"
    test_patch = (
        "diff --git a/tests/test_frame.py b/tests/test_frame.py\nindex 1111111..2222222 100644\n--- a/tests/test_frame.py\n"
        "+++ b/tests/test_frame.py\n"
        + "".join(
            f"@@ -{8 * i + 1},3 +{8 * i + 1},6 @@\n import pytest\n+def test_empty_{i}():\n+    with pytest.raises(ValueError):\n+        helper_{i}(Frame([]))\n"
            for i in range(20)
        )
    )
    traceback = "".join(
        f'  File "/usr/lib/python3.11/site-packages/pkg/frame.py", line {40 + i}, in helper_{i}\n    return rows[{i}]\n' for i in range(18)
    )
    statement = (
        "IndexError on an empty frame\n\n### Describe the bug\n\nEvery helper in `pkg.frame` indexes `frame.rows` without checking "
        "that the frame has rows, so an empty frame raises a bare IndexError from deep inside the library.\n\n"
        f"### Traceback\n\n```\nTraceback (most recent call last):\n{traceback}IndexError: list index out of range\n```\n\n"
        "### Expected behaviour\n\nA ValueError that says the frame is empty.\n"
    )
    dockerfile = (
        "FROM openswe-python-3.11\nCOPY repo /testbed\nWORKDIR /testbed/\n\nENV DEBIAN_FRONTEND=noninteractive\n"
        "RUN apt-get update && apt-get install -y -qq g++ libxml2-dev && rm -rf /var/lib/apt/lists/*\n"
        "RUN bash -lc 'pip install -r requirements-dev.txt'\nRUN bash -lc 'pip install -e .'\n"
        "RUN bash -lc 'pip install pytest pytest-xdist \"hypothesis<7\"'\n"
    )
    script = (
        "#!/bin/bash\n. /opt/conda/etc/profile.d/conda.sh\nconda activate testbed\ncd /testbed\n\n"
        f"git checkout {base} tests/test_frame.py\ngit apply -v --allow-empty - <<'EOF_114329324912'\n{test_patch}EOF_114329324912\n\n"
        'echo ">>>>> Start Test Output"\npytest --no-header -rA --tb=no -p no:cacheprovider -n4 tests/test_frame.py\nrc=$?\n'
        f'echo ">>>>> End Test Output"\necho "OPENSWE_EXIT_CODE=$rc"\ngit checkout {base} tests/test_frame.py\n'
    )
    return {
        "instance_id": "frameworks__pkg-1406",
        "repo": "frameworks/pkg",
        "base_commit": base,
        "end_commit": end,
        "created_at": "2024-11-20T09:14:05Z",
        "version": "2.3",
        "problem_statement": statement,
        "patch": patch,
        "test_patch": test_patch,
        "language": "python",
        "image_name": "openswe--Frameworks__pkg-1406",
        "Dockerfile": dockerfile,
        "eval_script": script,
        "license": "mit",
        "license_name": "MIT License",
        "FAIL_TO_PASS": "[]",
        "PASS_TO_PASS": "[]",
    }


def test_a_real_shaped_row_loads_and_rows_without_an_eval_script_are_refused(tmp_path: Path) -> None:
    row = real_shaped_row()
    assert len(str(row["problem_statement"])) > 1500 and len(str(row["patch"])) > 3000 and len(str(row["eval_script"])) > 2000
    no_lists = {k: v for k, v in row.items() if k not in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    refused = {**no_lists, "instance_id": "frameworks__pkg-1407", "eval_script": None}
    unmarked = {**no_lists, "instance_id": "frameworks__pkg-1408", "eval_script": "#!/bin/bash\npytest tests/test_frame.py\n"}
    path = tmp_path / "openswe_oss.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, refused, no_lists | {"instance_id": "frameworks__pkg-1409"}, unmarked)))
    tasks, errors = load_tasks(path)
    assert [t.instance_id for t in tasks] == ["frameworks__pkg-1406", "frameworks__pkg-1409"]  # the batch goes on
    assert [str(e).split(": ", 2)[:2] for e in errors] == [[f"{path}:2", "eval_script"], [f"{path}:4", "eval_script"]]
    assert "missing" in str(errors[0]) and "whole test suite" in str(errors[0]) and "OPENSWE_EXIT_CODE" in str(errors[1])
    task = tasks[0]
    assert task.kind == "openswe" and task.image == "openswe--frameworks__pkg-1406" and image_name(task) == task.image
    assert task.dockerfile == row["Dockerfile"] and task.end_commit == row["end_commit"] and task.eval_script == row["eval_script"]
    assert task.test_files == ["tests/test_frame.py"] and task.FAIL_TO_PASS == [] and task.model_extra["license_name"] == "MIT License"
    # The same rows as Hugging Face serves them converted (Parquet) load the same.
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "rows.parquet")
    (again,), _ = load_tasks(tmp_path / "rows.parquet")
    assert again.model_dump() == task.model_dump()


def test_a_row_without_an_eval_script_is_never_graded(docker_client: docker.DockerClient) -> None:
    task = Task(instance_id="x", kind="openswe", problem_statement="p", patch="", image="absent-image:never")
    verdict = verify(docker_client, task, "diff --git a/a b/a\n", "absent-image:never")
    assert not verdict.resolved and verdict.refused and "no eval script printing OPENSWE_EXIT_CODE" in (verdict.error or "")
    assert verdict.durations_s == {}  # no container: nothing ran in its place


def test_a_row_with_only_a_dockerfile_builds_and_grades(docker_client: docker.DockerClient, world: World) -> None:
    if image_exists(docker_client, world.image):
        docker_client.images.remove(world.image, force=True)
    (task,), errors = load_tasks(world.rows_file("built.jsonl", world.row()))
    assert not errors and task.image == world.image
    notes: list[str] = []
    prepared = prepare_images(docker_client, [task], log=notes.append)
    assert not prepared.problems and image_exists(docker_client, world.image)
    assert any("building it from the row's Dockerfile" in note and world.image in note for note in notes), notes
    notes.clear()
    prepare_images(docker_client, [task], log=notes.append)
    assert not notes and task_image(docker_client, task) == world.image  # the second use finds it
    gold = verify(docker_client, task, task.patch, world.image)
    assert gold.resolved and gold.reward == 1.0 and gold.patch_applied, (gold.error, gold.log_tail)
    assert "OPENSWE_EXIT_CODE=0" in gold.log_tail
    empty = verify(docker_client, task, "", world.image)
    assert not empty.resolved and "OPENSWE_EXIT_CODE=1" in empty.log_tail
    # A patch that fixes nothing and prints the marker itself as the tests' process exits (past
    # pytest's capture): the script's own line, printed after it, decides.
    lying = verify(docker_client, task, world.forged, world.image)
    assert lying.patch_applied and not lying.resolved and "OPENSWE_EXIT_CODE=0\n" in lying.log_tail


def test_the_audit_says_an_openswe_image_holds_future_commits(docker_client: docker.DockerClient, world: World) -> None:
    (task,), _ = load_tasks(world.rows_file("audit.jsonl", world.row()))
    report = audit(docker_client, task, task_image(docker_client, task))
    assert report.flagged and report.openswe and report.end_commit == world.end
    assert {world.end, world.later} <= set(report.future_commits)
    assert report.reasons()[0].startswith("an OpenSWE image: a full clone holding future commits") and world.end[:12] in report.reasons()[0]


@pytest.mark.slow
def test_a_row_with_its_image_collects_and_verifies_with_no_image_map(
    docker_client: docker.DockerClient, world: World, tmp_path: Path
) -> None:
    from harness.collect import collect
    from harness.policies.base import PolicySpec
    from harness.policies.make import make_policy
    from harness.scripted.servers import ModelServer
    from harness.scripted.solutions import solving_script

    rows = world.rows_file("collect.jsonl", world.row(), world.row(instance_id="tinymed__tinymed-2", eval_script=None))
    (task,), errors = load_tasks(rows)
    assert len(errors) == 1
    task_image(docker_client, task)  # present (built by the row's Dockerfile if this test runs alone)
    spec = PolicySpec(kind="chat", model="scripted")
    with ModelServer("chat", solving_script(task)) as server:
        spec.base_url = server.base_url
        summary = collect(docker_client, [task], make_policy(spec), spec, tmp_path / "run")
    (trajectory,) = summary.finished
    assert trajectory.outcome.resolved and not summary.infra_errors
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text(json.dumps({"instance_id": task.instance_id, "model_name_or_path": "m", "model_patch": task.patch}) + "\n")
    verdicts = tmp_path / "verdicts.jsonl"
    relearn = str(Path(sys.executable).parent / "relearn")
    result = subprocess.run(
        [relearn, "verify", "-t", str(rows), "-p", str(predictions), "-o", str(verdicts)], capture_output=True, text=True
    )
    output = result.stdout + result.stderr
    assert f"{rows}:2: eval_script: missing" in " ".join(output.split()), output  # counted as unreadable, not graded
    (verdict,) = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert verdict["resolved"] and verdict["image"] == world.image, output
