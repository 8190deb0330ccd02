"""SWE-bench instance images as users get them: routed by an image map or template, pulled
from a registry, loaded from tarballs, built offline from a checkout and a wheelhouse, and
checked against the image contract; plus the verifier's limits and log cap.

The instance is a tiny local git repository shaped as a Verified row: base commit, a fix
committed after it (gold patch), a test patch, FAIL_TO_PASS / PASS_TO_PASS, and an eval
script made from a real Verified row's (psf/requests) by putting this repository's commit,
test file, test patch and test command in place. Its repo column says psf/requests, so the
builder takes requests' recipe (pytest from the wheelhouse, `pip install .`), with
`--python 3.11` so that it builds on the suite's own Debian base.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import docker
import pyarrow.parquet as pq
import pytest

from envs.audit import audit
from envs.docker_backend import Limits
from envs.image_choice import ImageChoice, check_template, instance_key, load_image_map, render_template
from envs.registry import PullError, PullProgress, pull_image, registry_of
from envs.swebench_build import python_base
from envs.swebench_specs import DEBIAN_PYTHON, Unsupported, install_spec
from envs.tasks import Task, load_tasks
from envs.verify import mini_eval_script, verify
from records.pools import RecordError
from relearn.verbs.containers import memory_mb
from tests.registry_server import Registry

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples"
VERIFIED = SAMPLES / "swebench_verified.parquet"
INSTANCE = "relearn__tinycalc-1"
ROW_IMAGE = f"swebench/sweb.eval.x86_64.{instance_key(INSTANCE)}:latest"
TEST_FILE = "tests/test_ops.py"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}  # fmt: skip

OPS_BASE = '''def clamp(x, low, high):
    """x, kept within [low, high]."""
    if x < low:
        return low
    return x


def mean(values):
    return sum(values) / len(values)
'''
OPS_FIXED = OPS_BASE.replace(
    "        return low\n    return x\n", "        return low\n    if x > high:\n        return high\n    return x\n"
)
OPS_WRONG = OPS_BASE.replace(
    "    if x < low:\n        return low\n    return x\n", "    return min(x, high)\n"
)  # fixes above, breaks below
TESTS_BASE = """from tinycalc.ops import clamp, mean


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_below():
    assert clamp(-3, 0, 10) == 0


def test_mean():
    assert mean([1, 2, 3]) == 2
"""
TESTS_FIXED = (
    TESTS_BASE
    + """

def test_clamp_above():
    assert clamp(42, 0, 10) == 10
"""
)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def shaped_like(real: dict, base: str, test_files: list[str], test_patch: str, test_command: str) -> str:
    """A real Verified eval script with this instance's base commit, test files, test patch
    and test command in place of its own; every other line is kept as it is."""
    lines, out, i = real["eval_script"].split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("git apply -v - <<'EOF_114329324912'"):
            out += [line, *test_patch.rstrip("\n").split("\n")]
            i += 1
            while lines[i] != "EOF_114329324912":
                i += 1
            out.append(lines[i])
        elif line.startswith(f"git checkout {real['base_commit']} "):
            out.append(f"git checkout {base} {' '.join(test_files)}")
        elif i and lines[i - 1] == ": '>>>>> Start Test Output'":
            out.append(test_command)
        else:
            out.append(line.replace(real["base_commit"], base))
        i += 1
    return "\n".join(out)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The repository (base commit, then the fix and a tag after it) and its Verified-shaped row."""
    return tiny_instance(tmp_path_factory.mktemp("tinycalc"), INSTANCE, ROW_IMAGE)


def tiny_instance(
    root: Path,
    instance: str,
    image: str,
    dependencies: tuple[str, ...] = (),
    base_tag: str | None = None,
    fix_dependencies: tuple[str, ...] = (),
) -> dict[str, object]:
    """A tiny repository under ``root`` (its own ``dependencies``; ``base_tag`` on the base
    commit), the fix and a tag after the base, and its row, written to ``root/rows.jsonl``.
    ``fix_dependencies``: requirements the fix adds to pyproject.toml and imports, as
    pylint-dev__pylint-4661's gold patch adds `appdirs`."""
    repo = root / "repo"
    (repo / "tinycalc").mkdir(parents=True)
    (repo / "tests").mkdir()

    def pyproject(requirements: tuple[str, ...]) -> str:
        requires = f"dependencies = {json.dumps(list(requirements))}\n" if requirements else ""
        return (
            '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "tinycalc"\nversion = "0.1.0"\n{requires}\n[tool.setuptools]\npackages = ["tinycalc"]\n'
        )

    (repo / "pyproject.toml").write_text(pyproject(dependencies))
    (repo / ".gitignore").write_text("*.egg-info/\nbuild/\n__pycache__/\n")
    (repo / "tinycalc" / "__init__.py").write_text("")
    (repo / "tinycalc" / "ops.py").write_text(OPS_BASE)
    (repo / TEST_FILE).write_text(TESTS_BASE)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "base", cwd=repo)
    if base_tag:
        git("tag", base_tag, cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    imports = "".join(f"import {r.split('=')[0].split('<')[0].split('>')[0]}  # noqa: F401\n" for r in fix_dependencies)
    (repo / "tinycalc" / "ops.py").write_text(imports + OPS_FIXED)
    (repo / TEST_FILE).write_text(TESTS_FIXED)
    if fix_dependencies:
        (repo / "pyproject.toml").write_text(pyproject(dependencies + fix_dependencies))
    git("commit", "-qam", "clamp from above too", cwd=repo)
    git("tag", "v0.2", cwd=repo)
    gold = git("diff", base, "HEAD", "--", "tinycalc", *(["pyproject.toml"] if fix_dependencies else []), cwd=repo)
    test_patch = git("diff", base, "HEAD", "--", "tests", cwd=repo)
    wrong = git_diff_of(repo, base, {"tinycalc/ops.py": OPS_WRONG})
    real = next(r for r in pq.read_table(VERIFIED).to_pylist() if r["instance_id"] == "psf__requests-1142")
    row = {
        "repo": "psf/requests", "instance_id": instance, "base_commit": base, "patch": gold, "test_patch": test_patch,
        "problem_statement": "clamp() lets values above the upper bound through", "hints_text": "", "created_at": "2026-01-01T00:00:00Z",
        "version": "2.0", "FAIL_TO_PASS": json.dumps([f"{TEST_FILE}::test_clamp_above"]),
        "PASS_TO_PASS": json.dumps([f"{TEST_FILE}::test_clamp_inside", f"{TEST_FILE}::test_clamp_below", f"{TEST_FILE}::test_mean"]),
        "environment_setup_commit": base, "difficulty": "<15 min fix",
        "eval_script": shaped_like(real, base, [TEST_FILE], test_patch, f"pytest -rA {TEST_FILE}"),
        "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail", "image": image,
    }  # fmt: skip
    rows = root / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    return {"repo": repo, "base": base, "row": row, "rows": rows, "gold": gold, "wrong": wrong, "real": real}


def git_diff_of(repo: Path, base: str, files: dict[str, str]) -> str:
    """The diff from ``base`` to ``files`` written over it, in a scratch work tree."""
    scratch = repo.parent / f"scratch-{hashlib.sha256(repr(files).encode()).hexdigest()[:8]}"
    if not scratch.exists():
        git("worktree", "add", "-q", "--detach", str(scratch), base, cwd=repo)
    for path, text in files.items():
        (scratch / path).write_text(text)
    return git("diff", cwd=scratch)


def cli(relearn_bin: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    # Session fixtures run before the suite's autouse width setting: set it here.
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "250"}
    return subprocess.run([relearn_bin, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def built(relearn_bin: str, docker_client: docker.DockerClient, base_image: str, tiny: dict, wheelhouse: Path) -> str:
    """The instance's image, built offline by `relearn envs build-swebench` (Docker's layer
    cache makes a rebuild in a later session cheap)."""
    client = docker_client
    try:
        previous = client.images.get(ROW_IMAGE).id
    except docker.errors.ImageNotFound:
        previous = None
    result = cli(
        relearn_bin,
        "envs",
        "build-swebench",
        "-t",
        str(tiny["rows"]),
        "-i",
        INSTANCE,
        "--repo",
        str(tiny["repo"]),
        "--wheels",
        str(wheelhouse),
        "--python",
        "3.11",
        "--force",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept" in result.stdout and "3.11 (spec: 3.9)" in " ".join(result.stdout.split())
    if previous and previous != client.images.get(ROW_IMAGE).id:  # an earlier session's build, now untagged
        try:
            client.images.remove(previous)
        except docker.errors.APIError:
            pass
    return ROW_IMAGE


# --- without Docker -----------------------------------------------------------------------------


def test_the_eval_script_is_a_real_verified_one_with_this_instance_in_place(tiny: dict) -> None:
    from swebench.harness.utils import make_test_spec

    real, row = tiny["real"], tiny["row"]
    ours, theirs = row["eval_script"].split("\n"), real["eval_script"].split("\n")
    assert ours[:13] == [line.replace(real["base_commit"], tiny["base"]) for line in theirs[:13]]  # activation, resets, the reinstall
    assert "python -m pip install ." in ours and f"pytest -rA {TEST_FILE}" in ours
    spec = make_test_spec(row)  # swebench reads it as it reads its own rows
    assert spec.FAIL_TO_PASS == [f"{TEST_FILE}::test_clamp_above"] and any("Test Exit Code" in line for line in spec.eval_script_list)


def test_image_maps_in_every_format_and_their_errors(tmp_path: Path) -> None:
    as_json = tmp_path / "map.json"
    as_json.write_text(json.dumps({"a__b-1": "registry.example.com:5000/swe/a:1", "c__d-2": "mirror/c:latest"}))
    as_jsonl = tmp_path / "map.jsonl"
    as_jsonl.write_text(json.dumps({"instance_id": "a__b-1", "image": "x/y:1"}) + "\n")
    as_text = tmp_path / "map.txt"
    as_text.write_text("# instance image\na__b-1  x/y:1   # our mirror\n\nc__d-2 x/z\n")
    assert load_image_map(as_json) == {"a__b-1": "registry.example.com:5000/swe/a:1", "c__d-2": "mirror/c:latest"}
    assert load_image_map(as_jsonl) == {"a__b-1": "x/y:1"}
    assert load_image_map(as_text) == {"a__b-1": "x/y:1", "c__d-2": "x/z"}
    bad = tmp_path / "bad.txt"
    cases = {
        "a__b-1 x/y extra\n": "bad.txt:1: expected `INSTANCE_ID IMAGE`, got 3 field(s)",
        "a__b-1 x/y\na__b-1 x/other\n": "bad.txt:2: a__b-1: mapped twice",
        "ok x/y\nb Not/Lower\n": "bad.txt:2: image: 'Not/Lower' is not a Docker image name",
        '{"instance_id": "a"}\n': "bad.txt:1: image: missing or not a string",
        '{\n  "a": "x/y",\n  "b": \n}\n': "bad.txt:4: invalid JSON",
        "": "the image map names no image",
    }
    for text, expected in cases.items():
        bad.write_text(text)
        with pytest.raises(RecordError) as caught:
            load_image_map(bad)
        assert expected in str(caught.value), (text, str(caught.value))


def test_templates_name_images_as_swebench_does_and_refuse_unknown_fields() -> None:
    task = Task(
        instance_id="sympy__sympy-24562",
        problem_statement="x",
        repo="sympy/sympy",
        version="1.12",
        FAIL_TO_PASS=["t"],
        image="swebench/sweb.eval.x86_64.sympy_1776_sympy-24562:v2",
    )
    name = render_template("registry.example.com/ns/sweb.eval.{arch}.{instance_key}:{tag}", task, arch="x86_64")
    assert name == "registry.example.com/ns/sweb.eval.x86_64.sympy_1776_sympy-24562:v2"  # the row's tag carried over
    assert render_template("mirror/{repo_key}:{version}", task) == "mirror/sympy__sympy:1.12"
    with pytest.raises(ValueError, match=r"unknown placeholder \{instance\}; it knows \{arch\}"):
        check_template("ns/{instance}:latest")
    with pytest.raises(ValueError, match="is not a Docker image name"):
        render_template("NS/{instance_id}", task)
    # A map entry wins over the template, the template over the row; where it came from is kept.
    choice = ImageChoice({"sympy__sympy-24562": "mine/sympy:1"}, "map.txt", None, "t/{instance_key}")
    other = task.model_copy(update={"instance_id": "sympy__sympy-1"})
    routed = choice.route([task, other])
    assert [(t.image, t.image_source) for t in routed] == [
        ("mine/sympy:1", "--image-map map.txt"),
        ("t/sympy_1776_sympy-1", "--image-template t/{instance_key}"),
    ]
    assert ImageChoice().route([task]) == [task] and task.image_source is None


def test_recipes_for_verified_say_which_python_and_refuse_with_reasons() -> None:
    tasks = {t.instance_id: t for t in load_tasks(VERIFIED)[0]}
    sympy = install_spec(tasks["sympy__sympy-24562"])
    assert (sympy.python, sympy.install, sympy.pip_packages) == (
        "3.9",
        "python -m pip install -e .",
        ("mpmath==1.3.0", "flake8-comprehensions"),
    )
    assert DEBIAN_PYTHON[sympy.python] == "bullseye"
    with pytest.raises(Unsupported, match="compiles C extensions"):
        install_spec(tasks["astropy__astropy-12907"])
    django = install_spec(tasks["django__django-11099"])  # Django 3.0: Python 3.6, which no Debian suite ships
    assert django.python == "3.6" and django.requirements == ("tests/requirements/py3.txt",) and "locales" in django.apt_packages
    with pytest.raises(Unsupported, match=r"needs Python 3\.6.*--python-image"):
        python_base(None, django, "3.6", None, print)  # type: ignore[arg-type]
    with pytest.raises(Unsupported, match="Debian packages locales"):
        python_base(None, django, "3.6", "python:3.6-slim", print)  # type: ignore[arg-type]
    # What the README states about the 500 Verified instances.
    counts = {"debian": 0, "other python": 0, "refused": 0}
    for task in tasks.values():
        try:
            counts["debian" if install_spec(task).python in DEBIAN_PYTHON else "other python"] += 1
        except Unsupported:
            counts["refused"] += 1
    assert counts == {"debian": 241, "other python": 149, "refused": 110}


def test_sizes_and_registries() -> None:
    assert [memory_mb(v) for v in ("4g", "4096m", "4096", "2GiB", "1.5g")] == [4096, 4096, 4096, 2048, 1536]
    for bad in ("lots", "10k"):
        with pytest.raises(ValueError):
            memory_mb(bad)
    assert registry_of("swebench/sweb.eval.x86_64.a:latest") == "docker.io"
    assert registry_of("registry.example.com/ns/a:1") == "registry.example.com"
    assert registry_of("localhost:5000/a") == "localhost:5000" and registry_of("ubuntu") == "docker.io"


def test_the_run_manifest_records_images_and_limits(tmp_path: Path) -> None:
    from eval.run import RunConfig, differences, make_manifest
    from harness.policies.base import PolicySpec

    tasks = load_tasks(VERIFIED)[0][:2]
    choice = ImageChoice(template="mirror/{instance_key}:{tag}")
    config = RunConfig(dataset=str(VERIFIED), spec=PolicySpec(kind="chat", model="m"), images=choice, limits=Limits(cpus=4, memory_mb=8192))
    manifest = make_manifest(config, choice.route(tasks))
    environment = manifest["environment"]
    assert environment["image_template"] == "mirror/{instance_key}:{tag}" and environment["limits"]["memory_mb"] == 8192
    assert environment["images"] == {t.instance_id: f"mirror/{instance_key(t.instance_id)}:latest" for t in tasks}
    other = make_manifest(config, tasks)  # the rows' own images
    assert differences(manifest["environment"], other["environment"], ("images",))


# --- with Docker ---------------------------------------------------------------------------------


def test_built_image_grades_gold_resolved_and_empty_and_wrong_not(relearn_bin: str, built: str, tiny: dict, tmp_path: Path) -> None:
    predictions = tmp_path / "preds.jsonl"
    rows = [
        {"instance_id": INSTANCE, "model_name_or_path": name, "model_patch": patch}
        for name, patch in (("gold", tiny["gold"]), ("empty", ""), ("wrong", tiny["wrong"]))
    ]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    verdicts = tmp_path / "verdicts.jsonl"
    result = cli(
        relearn_bin,
        "verify",
        "-t",
        str(tiny["rows"]),
        "-p",
        str(predictions),
        "-o",
        str(verdicts),
        "--cpus",
        "2",
        "--memory",
        "3g",
        "--workers",
        "2",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "base image" not in result.stderr  # the task brings its image: no debootstrap, no Debian mirror
    by_model = {v["model_name_or_path"]: v for v in map(json.loads, verdicts.read_text().splitlines())}
    assert by_model["gold"]["resolved"] and by_model["gold"]["tests"]["FAIL_TO_PASS"]["success"] == [f"{TEST_FILE}::test_clamp_above"]
    assert by_model["gold"]["report"] == "junit" and by_model["gold"]["image"] == ROW_IMAGE
    assert not by_model["empty"]["resolved"] and by_model["empty"]["tests"]["FAIL_TO_PASS"]["failure"] == [f"{TEST_FILE}::test_clamp_above"]
    wrong = by_model["wrong"]
    assert (
        not wrong["resolved"]
        and wrong["tests"]["FAIL_TO_PASS"]["success"]
        and wrong["tests"]["PASS_TO_PASS"]["failure"] == [f"{TEST_FILE}::test_clamp_below"]
    )
    assert {v["limits"]["cpus"] for v in by_model.values()} == {2.0} and {v["limits"]["memory_mb"] for v in by_model.values()} == {3072}


def test_the_built_image_keeps_the_contract_and_a_broken_one_is_named(
    relearn_bin: str, docker_client: docker.DockerClient, built: str, tiny: dict
) -> None:
    good = cli(relearn_bin, "envs", "check-image", "-t", str(tiny["rows"]))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "keeps the contract" in good.stdout and "the test runner (pytest)" in good.stdout and "test files import" in good.stdout
    broken = "relearn-test/broken:tinycalc"
    dockerfile = (
        f"FROM {built}\n"
        "RUN rm /opt/miniconda3/bin/activate && rm -rf /testbed/.git && git init -q /testbed && git -C /testbed add -A "
        "&& git -C /testbed -c user.name=x -c user.email=x@x commit -qm other\n"
    )
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=broken, rm=True, forcerm=True, network_mode="none")
    try:
        bad = cli(relearn_bin, "envs", "check-image", "-t", str(tiny["rows"]), "--id", INSTANCE, broken)
        text = " ".join(bad.stdout.split())
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "does not keep the contract; missing:" in text
        assert f"base commit: {tiny['base'][:12]} is not in the repository's history" in text
        assert "environment: source /opt/miniconda3/bin/activate: fails" in text and "No such file or directory" in text
        no_pytest = "relearn-test/broken:nopytest"
        # Without the environment's pytest, Debian's /usr/bin/pytest answers: it starts, but
        # under the system Python, where the task's package is not installed.
        unpytest = f"FROM {built}\nRUN rm -r /opt/miniconda3/envs/testbed/bin/pytest /opt/miniconda3/envs/testbed/lib/python3.11/site-packages/_pytest\n"
        docker_client.images.build(fileobj=io.BytesIO(unpytest.encode()), tag=no_pytest, rm=True, forcerm=True, network_mode="none")
        runner = " ".join(cli(relearn_bin, "envs", "check-image", "-t", str(tiny["rows"]), no_pytest).stdout.split())
        assert "pytest is /usr/bin/pytest, outside the activated environment /opt/miniconda3/envs/testbed" in runner
        assert "test files import: pytest cannot collect them offline" in runner and "does not keep the contract" in runner
    finally:
        for tag in (broken, "relearn-test/broken:nopytest"):
            try:
                docker_client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_the_built_image_holds_no_history_after_the_base(docker_client: docker.DockerClient, built: str, tiny: dict) -> None:
    task = load_tasks(tiny["rows"])[0][0]
    report = audit(docker_client, task, built)
    assert not report.flagged and report.error is None, report.reasons()  # the source repository has the fix and a tag after the base
    labels = docker_client.images.get(built).labels
    assert labels["relearn.base_commit"] == tiny["base"] and labels["relearn.python"] == "3.11" and labels["relearn.python_spec"] == "3.9"
    assert labels["relearn.spec_source"] == "relearn table"


def test_an_image_map_or_a_template_routes_a_task_to_a_retagged_image(
    relearn_bin: str, docker_client: docker.DockerClient, built: str, tiny: dict, tmp_path: Path
) -> None:
    row = dict(tiny["row"], image="swebench/sweb.eval.x86_64.relearn_1776_not-pulled:latest")  # the row names an image this engine lacks
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text(json.dumps({"instance_id": INSTANCE, "model_name_or_path": "gold", "model_patch": tiny["gold"]}) + "\n")
    mapped, templated = "relearn-test/mirror:tinycalc", f"localhost:5999/team/sweb.eval.x86_64.{instance_key(INSTANCE)}:v1"
    image = docker_client.images.get(built)
    image.tag(mapped)
    image.tag(templated)
    try:
        missing = cli(relearn_bin, "verify", "-t", str(rows), "-p", str(predictions), "-o", str(tmp_path / "none.jsonl"))
        text = " ".join(missing.stderr.split())
        assert (
            missing.returncode == 1
            and "is not on this engine" in text
            and "--pull (from docker.io)" in text
            and "relearn envs load DIR" in text
        )
        image_map = tmp_path / "images.txt"
        image_map.write_text(f"{INSTANCE} {mapped}\n")
        for name, options in (
            (mapped, ["--image-map", str(image_map)]),
            (templated, ["--image-template", "localhost:5999/team/sweb.eval.{arch}.{instance_key}:v1"]),
        ):
            verdicts = tmp_path / f"{name.replace('/', '_').replace(':', '_')}.jsonl"
            result = cli(relearn_bin, "verify", "-t", str(rows), "-p", str(predictions), "-o", str(verdicts), *options)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "base image" not in result.stderr
            (verdict,) = map(json.loads, verdicts.read_text().splitlines())
            assert verdict["resolved"] and verdict["image"] == name and verdict["image_digest"] == image.id
    finally:
        for tag in (mapped, templated):
            docker_client.images.remove(tag)


@pytest.fixture
def tiny_image(docker_client: docker.DockerClient) -> str:
    """A one-file image (4 MB of noise, so a pull has progress to report), made by docker import."""
    payload = os.urandom(4 << 20)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("noise.bin")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    tag = f"relearn-test/pullme:{os.getpid()}"
    docker_client.api.import_image_from_data(buffer.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    yield tag
    try:
        docker_client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass


def test_pull_reports_progress_retries_what_may_pass_and_names_the_registry_answer(
    docker_client: docker.DockerClient, tiny_image: str
) -> None:
    with Registry() as registry:
        registry.add_image(docker_client, tiny_image, "team/sweb.eval.x86_64.tiny", "v1")
        registry.chunk_delay_s = 0.02
        source_id = docker_client.images.get(tiny_image).id
        docker_client.images.remove(tiny_image, force=True)  # else the engine has the image and downloads nothing
        name = f"{registry.host}/team/sweb.eval.x86_64.tiny:v1"
        seen: list[PullProgress] = []
        messages: list[str] = []
        registry.fail_manifests = 2  # the engine's HEAD and its GET fallback both get a 500: this pull fails, the next try works
        try:
            image_id = pull_image(
                docker_client,
                name,
                backoff_s=0.1,
                log=messages.append,
                on_progress=lambda p: seen.append(PullProgress(p.image, dict(p.layers), p.status)),
            )
            assert image_id == source_id
            assert len(messages) == 1 and "try 2 of 4" in messages[0] and "500" in messages[0], messages
            assert any(p.total >= 4 << 20 for p in seen), [p.status for p in seen]
            assert seen[-1].current == seen[-1].total
        finally:
            docker_client.images.remove(name)
        before = registry.manifest_requests
        with pytest.raises(PullError) as caught:
            pull_image(docker_client, f"{registry.host}/team/absent:v1", backoff_s=0.1, log=messages.append)
        message = str(caught.value)
        assert (
            f"pulling {registry.host}/team/absent:v1 from {registry.host} failed: the registry answered:" in message
            and "manifest unknown" in message
        )
        assert registry.manifest_requests - before <= 2 and len(messages) == 1  # not retried (the engine itself asks twice)
    with pytest.raises(PullError, match=r"failed after 2 tries: .*(connection refused|dial tcp)"):
        pull_image(docker_client, f"{registry.host}/team/sweb.eval.x86_64.tiny:v1", tries=2, backoff_s=0.1)  # the registry is gone


def test_envs_load_restores_images_from_tarballs(
    relearn_bin: str, docker_client: docker.DockerClient, tiny_image: str, tmp_path: Path
) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    saved = b"".join(docker_client.images.get(tiny_image).save(named=True))
    (folder / "pullme.tar.gz").write_bytes(gzip.compress(saved, compresslevel=1))
    (folder / "notes.md").write_text("not an image")
    docker_client.images.remove(tiny_image, force=True)
    result = cli(relearn_bin, "envs", "load", str(folder))
    assert result.returncode == 0, result.stdout + result.stderr
    assert tiny_image in result.stdout and docker_client.images.get(tiny_image)
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = cli(relearn_bin, "envs", "load", str(empty))
    assert nothing.returncode == 2 and "no image tarballs" in nothing.stderr


def test_the_log_keeps_the_test_section_whole(
    docker_client: docker.DockerClient, images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup may be cut (counted in the verdict); the test command's output never is:
    past its cap the run is not graded rather than graded on a log with a hole in it."""
    import envs.verify as verifier

    task = next(t for t in load_tasks(ROOT / "envs" / "mini_tasks")[0] if t.instance_id == "mini__calc-1")
    script = mini_eval_script(task, "HEAD").replace("git status\n", "git status\nhead -c 300000 /dev/zero | tr '\\0' 's'; echo\n")
    noisy = task.model_copy(update={"eval_script": script})
    monkeypatch.setattr(verifier, "LOG_CAP", 64 << 10)
    verdict = verify(docker_client, noisy, task.patch, images[task.instance_id])
    assert verdict.resolved, (verdict.error, verdict.log_tail[-800:])
    assert verdict.log_omitted_bytes["setup"] >= 300000 - (64 << 10) and "tests" not in verdict.log_omitted_bytes
    monkeypatch.setattr(verifier, "TEST_LOG_CAP", 256)  # smaller than pytest's own report of these tests
    cut = verify(docker_client, noisy, task.patch, images[task.instance_id])
    assert not cut.resolved and cut.log_omitted_bytes["tests"] > 0 and "not graded" in cut.error
