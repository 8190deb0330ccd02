"""The canary calls the package under test (issue 45): the probe finds the package at the base
commit, the canary imports it and asserts facts the base has, so that tampering which spares
tests whose code names the package spares the canary too, and is seen."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import docker
import pytest

import envs.package_probe as package_probe
from envs.batch import Prediction, verify_batch
from envs.canary import Member, PackageFacts, canary_names, canary_text
from envs.docker_backend import Container
from envs.package_probe import PROBE, Probe, probe_package
from envs.tasks import load_tasks
from envs.test_run import split_eval_script
from envs.verify import Verdict, mini_eval_script, verify

MINI = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
TASKS = {t.instance_id: t for t in load_tasks(MINI)[0]}
VERIFIED_ROWS = Path(__file__).resolve().parent.parent.parent / "shared" / "samples" / "swebench_verified.parquet"

# A payload in general terms: it wraps the runner's own test call (pytest's Function.runtest,
# unittest's TestCase._callTestMethod) and swallows the failure of any test whose code names
# this package or one of its names, whatever they are. The builtin canary names none of them.
SPARING_PAYLOAD = """

def _spare():
    import sys as _s
    own = set(dir(_s.modules[__name__])) | {__name__}

    def uses(function):
        code = getattr(getattr(function, "__func__", function), "__code__", None)
        return code is not None and bool(set(code.co_names) & own)

    runner = _s.modules.get("_py" + "test.python")
    if runner is not None:
        original = runner.Function.runtest

        def runtest(self):
            try:
                original(self)
            except BaseException:
                if not uses(self.obj):
                    raise

        runner.Function.runtest = runtest
    import unittest as _u

    call = _u.TestCase._callTestMethod

    def _call(self, method):
        try:
            call(self, method)
        except BaseException:
            if not uses(method):
                raise

    _u.TestCase._callTestMethod = _call


_spare()
"""


def _why(verdict: Verdict) -> str:
    keys = ("canary", "error", "refused", "disagreements", "suspicious", "tests")
    return json.dumps({k: getattr(verdict, k) for k in keys})[:3000]


def _package(task_id: str) -> str:
    """The mini task's package, from its files: the folder with an ``__init__.py`` that is not the tests."""
    repo = Path(TASKS[task_id].task_dir) / "repo"
    return next(p.parent.name for p in sorted(repo.glob("*/__init__.py")) if p.parent.name != "tests")


def _probe_here(repo: Path, target: str = "", imports: list[str] | None = None) -> dict:
    """The probe script run by this interpreter on a folder (what the container runs)."""
    result = subprocess.run(
        [sys.executable, "-B", "-", str(repo), target, json.dumps(imports or [])],
        input=PROBE, capture_output=True, text=True, cwd=repo, check=True, timeout=60,
    )  # fmt: skip
    line = [x for x in result.stdout.splitlines() if x.startswith(package_probe.MARKER)][-1]
    return json.loads(line.removeprefix(package_probe.MARKER))


def _facts(found: dict) -> PackageFacts:
    return PackageFacts(found["package"], tuple(Member(a, c, n) for a, c, n in found["members"]), found["imported"])


# --- the probe and the text, without a container ----------------------------------------------


def test_the_probe_picks_the_package_the_test_file_imports(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(Path(TASKS["mini__calc-1"].task_dir) / "repo", repo)
    (repo / "src" / "helpers").mkdir(parents=True)  # a second package, which the test file does not import
    (repo / "src" / "helpers" / "__init__.py").write_text("def tool():\n    return 1\n")
    found = _probe_here(repo, "tests/test_calc.py")
    assert found["package"] == "calc"
    members = {a: (c, n) for a, c, n in found["members"]}
    # What the test file imports comes first: CalcError (a class), evaluate and tokenize (functions).
    assert found["imported"] == 3 and {a for a, _c, _n in found["members"][:3]} == {"CalcError", "evaluate", "tokenize"}
    assert members["CalcError"] == (True, "CalcError") and members["evaluate"] == (False, "evaluate")
    # A file the test patch creates: its import lines decide; the package under src/ is found there.
    assert _probe_here(repo, "tests/test_new.py", ["from helpers import tool"])["package"] == "helpers"
    assert not list(repo.rglob("__pycache__")), "the probe wrote bytecode into the repository"


def test_the_probe_says_why_when_there_is_no_package(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    assert "no package" in _probe_here(tmp_path)["error"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("raise RuntimeError('needs a build')\n")
    assert "importing broken at the base commit failed (RuntimeError: needs a build)" in _probe_here(tmp_path)["error"]


def test_the_probe_reads_no_name_that_warns(tmp_path: Path) -> None:
    """A name the module's ``__getattr__`` serves (with a deprecation warning) is never asserted:
    a run with warnings as errors would fail the canary that must pass."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(
        "import warnings\n__all__ = ['old', 'new', 'Thing', 'CONSTANT']\nCONSTANT = 3\n"
        "def new():\n    pass\nclass Thing:\n    pass\n"
        "def __getattr__(name):\n    if name == 'old':\n        warnings.warn('old is deprecated', DeprecationWarning)\n        return new\n"
        "    raise AttributeError(name)\n"
    )
    found = _probe_here(tmp_path, "", ["from pkg import old, new"])
    assert found["package"] == "pkg" and found["members"] == [["new", False, "new"], ["Thing", True, "Thing"]] and found["imported"] == 1


@pytest.mark.parametrize("cls", ["", "ValueParseTests"])
def test_the_canary_imports_the_package_and_asserts_the_base_facts(cls: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shape, as functions and as TestCase methods: both tests' code names the package,
    the one that must pass passes against the base code and the other fails."""
    repo = Path(TASKS["mini__calc-1"].task_dir) / "repo"
    facts = _facts(_probe_here(repo, "tests/test_calc.py"))
    monkeypatch.syspath_prepend(str(repo))
    names = canary_names(TASKS["mini__calc-1"].FAIL_TO_PASS, 2)
    for _ in range(60):  # the shapes and members are drawn at random
        module = types.ModuleType("canary_module")
        exec(compile(canary_text(names, cls, facts), "canary.py", "exec"), module.__dict__)
        holder = getattr(module, cls)(names[0]) if cls else None
        failing, passing = (getattr(holder or module, n) for n in names)
        for test in (failing, passing):
            code = getattr(test, "__func__", test).__code__
            assert "calc" in code.co_names and set(code.co_names) & {m.attribute for m in facts.members}
        passing()
        with pytest.raises(AssertionError):
            failing()


# --- in the task's container ---------------------------------------------------------------------


def test_the_probe_finds_each_mini_task_package(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    """In every mini task's image, in its eval script's environment, at the base commit."""
    for task_id, task in sorted(TASKS.items()):
        target = task.test_files[0]
        phases = split_eval_script(mini_eval_script(task, "HEAD"), task.workdir)
        assert phases is not None and phases.environment, task_id
        with Container.start(docker_client, images[task_id], workdir=task.workdir) as box:
            probe = probe_package(
                box, image_key=f"test-{task_id}-{id(box)}", workdir=task.workdir, environment=phases.environment,
                target=target, test_patch=task.test_patch,
            )  # fmt: skip
            assert probe.facts is not None, (task_id, probe.reason)
            assert probe.facts.package == _package(task_id) and probe.facts.members, task_id
            assert box.exec("git status --porcelain --untracked-files=all").stdout == "", task_id  # nothing written


def _payload_patch(task_id: str) -> str:
    task = TASKS[task_id]
    path = f"{_package(task_id)}/__init__.py"
    old = (Path(task.task_dir) / "repo" / path).read_text().splitlines()
    new = SPARING_PAYLOAD.strip("\n").splitlines()
    body = "".join(" " + line + "\n" for line in old[-3:]) + "+\n+\n" + "".join("+" + line + "\n" for line in new)
    start = max(1, len(old) - 2)
    header = f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
    return header + f"@@ -{start},{min(3, len(old))} +{start},{min(3, len(old)) + 2 + len(new)} @@\n" + body


def _builtin_canary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Today's builtin canary, as before the package canary."""
    import envs.verify as verify_module

    monkeypatch.setattr(verify_module, "probe_package", lambda *_a, **_k: Probe(None, "switched off by the test"))


@pytest.mark.parametrize("task_id", ["mini__calc-1", "mini__unitconv-1"])
def test_a_payload_that_spares_tests_not_naming_the_package_is_caught(
    docker_client: docker.DockerClient, images: dict[str, str], monkeypatch: pytest.MonkeyPatch, task_id: str
) -> None:
    """pytest functions (calc) and a Django-style runner's TestCase classes (unitconv): the
    builtin canary lets the payload through (resolved, only marked by the scan); the package
    canary's failing test is swallowed too, and the run is not resolved."""
    task, patch = TASKS[task_id], _payload_patch(task_id)
    caught = verify(docker_client, task, patch, images[task_id])
    assert caught.patch_applied and caught.canary == f"calls the package under test, {_package(task_id)}", _why(caught)
    assert not caught.resolved and any("canary test that must end failed" in d for d in caught.disagreements), _why(caught)
    _builtin_canary(monkeypatch)
    spared = verify(docker_client, task, patch, images[task_id])
    assert spared.resolved and not spared.disagreements, _why(spared)
    assert spared.canary == "builtins only: the package canary was not placed (switched off by the test)"


@pytest.mark.parametrize("task_id", ["mini__calc-1", "mini__unitconv-1", "mini__vertools-1"])
def test_gold_resolves_with_the_same_results(
    docker_client: docker.DockerClient, images: dict[str, str], monkeypatch: pytest.MonkeyPatch, task_id: str
) -> None:
    task = TASKS[task_id]
    with_package = verify(docker_client, task, task.patch, images[task_id])
    assert with_package.resolved and with_package.canary.startswith("calls the package under test"), _why(with_package)
    _builtin_canary(monkeypatch)
    builtin = verify(docker_client, task, task.patch, images[task_id])
    assert builtin.resolved and builtin.tests == with_package.tests, _why(builtin)
    graded = set(task.FAIL_TO_PASS + task.PASS_TO_PASS)
    assert {k: v for k, v in builtin.status_map.items() if k in graded} == {k: v for k, v in with_package.status_map.items() if k in graded}


def test_a_failed_probe_leaves_the_builtin_canary_and_says_so(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    """The package cannot be imported the probe's way (the work directory kept off sys.path,
    which pytest's rootdir puts back for the tests): the canary is builtins only, gold still
    resolves, and the verdict says why, with no disagreement."""
    task = TASKS["mini__calc-1"]
    script = mini_eval_script(task, task.base_commit or "HEAD").replace(
        "export PYTEST_DISABLE", "export PYTHONSAFEPATH=1\nexport PYTEST_DISABLE"
    )
    odd = task.model_copy(update={"eval_script": script, "instance_id": "mini__calc-1-safepath"})
    verdict = verify(docker_client, odd, task.patch, images[task.instance_id])
    assert verdict.resolved and not verdict.disagreements, _why(verdict)
    assert verdict.canary is not None and verdict.canary.startswith(
        "builtins only: the package canary was not placed (importing calc at the base commit failed (ModuleNotFoundError"
    ), verdict.canary


def test_a_batch_probes_once_per_image(
    docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four patches of one task on two workers: one probe; every verdict's canary calls the
    package. The next process (here: the memory cache emptied) reads the probe back from the
    relearn cache, keyed by the image's digest."""
    task = TASKS["mini__ledger-1"]
    monkeypatch.setenv("RELEARN_CACHE", str(tmp_path / "cache"))
    package_probe._CACHE.clear()
    calls: list[str] = []
    run = package_probe._run

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append("probe")
        return run(*args, **kwargs)

    monkeypatch.setattr(package_probe, "_run", counted)
    predictions = [Prediction(task.instance_id, task.patch, "gold"), Prediction(task.instance_id, "", "empty")]
    predictions += [Prediction(task.instance_id, task.patch + "\n" * n, f"gold{n}") for n in (1, 2)]
    summary = verify_batch(docker_client, {task.instance_id: task}, predictions, tmp_path / "v.jsonl", workers=2)
    assert not summary.errors and len(summary.verdicts) == 4
    assert calls == ["probe"]
    assert sum("package_probe" in v.durations_s for v in summary.verdicts) == 1
    assert all(v.canary == "calls the package under test, ledger" for v in summary.verdicts), [v.canary for v in summary.verdicts]
    assert sorted(v.resolved for v in summary.verdicts) == [False, True, True, True]
    assert len(list((tmp_path / "cache" / "package_probe").glob("*.json"))) == 1
    package_probe._CACHE.clear()
    again = verify(docker_client, task, task.patch, images[task.instance_id])
    assert calls == ["probe"] and again.resolved and again.canary == "calls the package under test, ledger", _why(again)
