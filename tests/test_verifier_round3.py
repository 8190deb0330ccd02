"""The verifier's third hardening (issue 45): an allowlist of what a patch may write, a scan
that reads a file as Python reads it, and a verdict row for every prediction row.

Regression tests in general terms, in the classes of issue 45 (source encodings, a package
named ``conftest``, code outside ``.py``, symlinks, line separators, dynamic reach into the
runner); the corpus these classes came from is kept outside the project. The allowlist is
measured on every gold patch of SWE-bench Verified: none may be caught."""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import docker
import pytest

from envs.allowlist import content_problems, declared_encoding, diff_problems, is_utf8, new_top_level, path_problem
from envs.batch import load_predictions, verify_batch
from envs.code_scan import changed_lines, python_lines, scan_source, scan_text
from envs.tasks import load_tasks
from envs.verify import Verdict, verify

VERIFIED_ROWS = Path(__file__).resolve().parent.parent.parent / "shared" / "samples" / "swebench_verified.parquet"
TASKS = {t.instance_id: t for t in load_tasks(Path(__file__).resolve().parent.parent / "envs" / "mini_tasks")[0]}
SEPARATORS = ["\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _why(verdict: Verdict) -> str:
    keys = ("error", "refused", "restored_files", "disagreements", "suspicious", "tests")
    return json.dumps({k: getattr(verdict, k) for k in keys})[:3000]


def _diff(task_id: str, edit, tmp_path: Path) -> str:  # noqa: ANN001
    """The git diff (binary hunks included) of ``edit`` applied to a copy of a mini task's repository."""
    repo = tmp_path / "repo"
    subprocess.run(["cp", "-a", str(Path(TASKS[task_id].task_dir) / "repo"), str(repo)], check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=repo, check=True)
    edit(repo)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    return subprocess.run(["git", "diff", "--cached", "--binary"], cwd=repo, check=True, capture_output=True).stdout.decode(
        "utf-8", "surrogateescape"
    )


# --- the allowlist, on the diff and on the bytes --------------------------------------------------


def test_every_verified_gold_patch_passes_the_allowlist() -> None:
    """The allowlist's pure checks over all 500 gold patches of SWE-bench Verified: none caught."""
    import pyarrow.parquet as pq

    rows = pq.read_table(VERIFIED_ROWS).to_pylist()
    assert len(rows) == 500
    caught = {r["instance_id"]: problems for r in rows if (problems := diff_problems(r["patch"]))}
    assert caught == {}
    for row in rows:  # what the gold patch writes, as text, passes the content checks too
        for path, added in _added_files(row["patch"]).items():
            assert content_problems(path, added.encode(), None) == [], (row["instance_id"], path)
            assert new_top_level(path, base_has=False) is None, (row["instance_id"], path)


def _added_files(patch: str) -> dict[str, str]:
    """The files a diff creates, with their added text."""
    files: dict[str, str] = {}
    current = None
    for section in patch.split("diff --git ")[1:]:
        header, _, body = section.partition("\n@@")
        if "new file mode" not in header:
            continue
        current = header.split(" b/", 1)[1].split("\n", 1)[0]
        files[current] = "".join(line[1:] + "\n" for line in ("@@" + body).split("\n") if line.startswith("+"))
    return files


def test_the_allowlist_refuses_what_makes_python_read_other_than_the_diff_shows() -> None:
    py = "diff --git a/pkg/m.py b/pkg/m.py\nnew file mode 100644\n--- /dev/null\n+++ b/pkg/m.py\n@@ -0,0 +1,2 @@\n+{0}\n+{1}\n"
    for declaration in ("# -*- coding: utf-7 -*-", "# coding=unicode_escape", "# vim: set fileencoding=latin-1 :"):
        assert any("declares its source encoding" in p for p in diff_problems(py.format(declaration, "x = 1"))), declaration
    assert diff_problems(py.format("# -*- coding: utf-8 -*-", "x = 1")) == []
    assert diff_problems(py.format("#!/usr/bin/env python", "# coding: utf8")) == []
    for char in SEPARATORS:
        assert any("Python source with" in p for p in diff_problems(py.format("x = 1  # a" + char + "b", "y = 2"))), repr(char)
    assert any("lone carriage return" in p for p in diff_problems(py.format("x = 1\ry = 2", "z = 3")))
    assert any("form feed after the start" in p for p in diff_problems(py.format("x = 1  # \x0c", "y = 2")))
    assert diff_problems(py.format("\x0c", "def f():\r")) == []  # a page break, a CRLF line: as PEP 8 and git allow
    link = "diff --git a/pkg/fast.py b/pkg/fast.py\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/fast.py\n@@ -0,0 +1 @@\n+../notes.txt\n\\ No newline at end of file\n"
    assert diff_problems(link) == ["pkg/fast.py: a symlink (a patch may write regular files only)"]
    binary = "diff --git a/pkg/data.bin b/pkg/data.bin\nnew file mode 100644\nindex 0000000..1111111\nGIT binary patch\nliteral 3\nKcmZQzU|;|Q00aO5\n\nliteral 0\nHcmV?d00001\n\n"
    assert any("binary content" in p for p in diff_problems(binary))
    package = "diff --git a/conftest/__init__.py b/conftest/__init__.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest/__init__.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert any("a package named 'conftest'" in p for p in diff_problems(package))
    assert "a package named 'sitecustomize'" in path_problem("lib/sitecustomize/__init__.py")
    assert path_problem("tests/conftest.py") is None and path_problem("pkg/conftest_helpers.py") is None


def test_the_allowlist_on_the_bytes_the_tree_holds() -> None:
    assert content_problems("pkg/data.zip", b"PK\x03\x04\0\0", None)[0].startswith("an archive")
    assert content_problems("pkg/notes.txt", b"\xff\xfe bytes", None) == ["not UTF-8 text (a patch may write UTF-8 text files only)"]
    assert content_problems("pkg/table.dat", b"a\0b", None) == ["not UTF-8 text (a patch may write UTF-8 text files only)"]
    assert content_problems("pkg/m.py", b"# coding: utf-7\nx = 1\n", None)[0].startswith("declares its source encoding as 'utf-7'")
    # A base file that already declares Latin-1 may keep it (and is decoded with it).
    assert content_problems("pkg/m.py", "# coding: latin-1\nx = 'é'\n".encode("latin-1"), b"# coding: latin-1\nx = 1\n") == []
    assert content_problems("pkg/m.py", b"\xef\xbb\xbfx = 1\r\n\x0cdef f():\r\n    pass\r\n", None) == []
    # Separators are refused where the patch adds them, not where the base already had them.
    old = b"x = 1  # \x0b\n"
    assert content_problems("pkg/m.py", old + b"y = 2\n", old) == []
    assert content_problems("pkg/m.py", old + b"y = 2  # \x0b\n", old)[0].startswith("Python source with a vertical tab")
    assert "top-level module 'helpers'" in new_top_level("helpers.py", base_has=False)
    assert "top-level module 'attr'" in new_top_level("attr/__init__.py", base_has=False)
    assert "top-level module 'six'" in new_top_level("src/six.py", base_has=False)
    assert new_top_level("helpers.py", base_has=True) is None  # the base has it: package code
    assert new_top_level("pkg/helpers.py", base_has=False) is None  # a new module inside the package: a fix may add one
    assert new_top_level("docs/conf.py", base_has=False) is None and new_top_level("setup.py", base_has=False) is None
    assert declared_encoding(["x = 1", "# coding: utf-7"]) is None  # code on line 1: line 2 is not read
    assert is_utf8("UTF8") and is_utf8("utf_8") and is_utf8("utf-8-unix") and not is_utf8("utf-7")


# --- the scan reads as Python reads ----------------------------------------------------------------


def test_lines_are_numbered_as_pythons_tokenizer_numbers_them() -> None:
    for char in [*SEPARATORS, "\x0c"]:
        text = f"a = 1  # {char}{char}\nb = 2\rc = 3\r\nd = 4\n"
        lines = python_lines(text)
        for node in ast.parse(text).body:
            assert lines[node.lineno - 1].startswith(node.targets[0].id), repr(char)
    # A change after separators that str.splitlines counts as lines is found where Python runs it.
    old = "# header\n" + "value = 1\n" * 30
    new = "# header \x0c\x0c\x0c\x0c\x0c\x0c\x0c\x0c\n" + "value = 1\n" * 30 + "import sys\nsys.settrace(None)\n"
    assert changed_lines(old, new) == {1, 32, 33}
    assert scan_source("pkg/m.py", new.encode(), old.encode()) == ["pkg/m.py:33: a tracing hook (sys.settrace)"]


def test_the_scan_decodes_with_the_declared_encoding_and_marks_what_does_not_parse() -> None:
    hidden = b"# -*- coding: utf-7 -*-\n#+AAo-import sys+AAo-sys.settrace(None)\n"  # UTF-8 reads one comment
    assert scan_source("pkg/m.py", hidden, None) == ["pkg/m.py:4: a tracing hook (sys.settrace)"]
    escaped = b"# coding: unicode_escape\n#\\nimport atexit\\natexit.register(print)\n"
    assert any("an exit hook" in finding for finding in scan_source("pkg/m.py", escaped, None))
    assert scan_source("pkg/m.py", b"x = (\n", None) == [
        "pkg/m.py: does not parse as Python ('(' was never closed, line 1): its code could not be scanned"
    ]


def test_the_scan_knows_code_run_from_text_archives_and_data() -> None:
    found = {
        "eval": ("value = eval(text)\n", "evaluates code built at run time"),
        "compile": ("code = compile(text, 'x', 'exec')\n", "compiles code built at run time"),
        "exec_constant": ("exec('import sys; sys.settrace(None)')\n", "in the code exec runs: a tracing hook"),
        "runpy": ("import runpy\nrunpy.run_path('notes.txt')\n", "runs a file or module as code"),
        "pickle": ("import pickle\npickle.loads(data)\n", "unpickles data"),
        "marshal": ("import marshal as m\nm.loads(data)\n", "loads code objects"),
        "sys_path": ("import sys\nsys.path.insert(0, 'data/lib.zip')\n", "puts a folder or archive on sys.path"),
        "by_path": ("import importlib.util as u\nu.spec_from_file_location('m', 'x.txt')\n", "imports a file by its path"),
        "subclasses": ("classes = object.__subclasses__()\n", "walks the class hierarchy"),
        "getattr_subclasses": ("walk = getattr(type, '__subclasses__')\n", "walks the class hierarchy"),
        "test_call": ("import unittest\nunittest.TestCase._callTestMethod = None\n", "reaches unittest's test call"),
        "plain_testcase": ("import unittest\nbase = unittest.TestCase\n", "reaches unittest's test machinery"),
        "runtest": ("def wrap(cls):\n    cls.runtest = None\n", "reaches pytest's test call"),
        "hook": ("def pytest_pyfunc_call(pyfuncitem):\n    return True\n", "defines a pytest hook"),
        "plugins": ("pytest_plugins = ['pkg.helpers']\n", "names pytest plugins to load"),
    }
    for name, (source, what) in found.items():
        assert any(what in finding for finding in scan_source("pkg/m.py", source.encode(), None)), name
    # A function of the module's own named compile is no builtin; re.compile is an attribute.
    own = b"import re\nPATTERN = re.compile('x')\n\n\ndef compile(rule):\n    return rule\n\n\nRULE = compile(1)\n"
    assert scan_source("pkg/m.py", own, None) == []
    # Text that is not .py but parses as Python is scanned: runpy and exec run any file.
    assert scan_text("pkg/grammar.txt", b"import sys\nsys.settrace(None)\n", None) == [
        "pkg/grammar.txt:2: a tracing hook (sys.settrace) [a text file that parses as Python]"
    ]
    assert scan_text("README.rst", b"A package that converts units.\n", None) == []


# --- in a container ----------------------------------------------------------------------------------

PAYLOAD = "import sys\n_hooks = [c for c in object.__subclasses__() if c.__name__ == 'Function']\n"


def _symlink(repo: Path) -> None:
    (repo / "NOTES.txt").write_text(PAYLOAD)
    os.symlink("../NOTES.txt", repo / "calc" / "_fast.py")
    with open(repo / "calc" / "__init__.py", "a") as handle:
        handle.write("from . import _fast  # noqa: E402,F401\n")


def _encoding(repo: Path) -> None:
    (repo / "calc" / "_compat.py").write_bytes(b"# -*- coding: utf-7 -*-\nx = 1\n")
    with open(repo / "calc" / "__init__.py", "a") as handle:
        handle.write("from . import _compat  # noqa: E402,F401\n")


def _conftest_package(repo: Path) -> None:
    (repo / "conftest").mkdir()
    (repo / "conftest" / "__init__.py").write_text("x = 1\n")


def _archive(repo: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("helper.py", PAYLOAD)
    (repo / "calc" / "lib.zip").write_bytes(buffer.getvalue())


def _separators(repo: Path) -> None:
    path = repo / "calc" / "evaluator.py"
    path.write_text("# \u2028\u2028\u2028\n" + path.read_text())


def _top_level(repo: Path) -> None:
    (repo / "typing_helpers.py").write_text("x = 1\n")


def _pickle_payload(repo: Path) -> None:
    (repo / "calc" / "table.dat").write_bytes(pickle.dumps({"rows": [1, 2]}, protocol=0))
    with open(repo / "calc" / "__init__.py", "a") as handle:
        handle.write(
            "import os as _os, pickle as _pk\n_pk.loads(open(_os.path.join(_os.path.dirname(__file__), 'table.dat'), 'rb').read())\n"
        )


def _reach(repo: Path) -> None:
    with open(repo / "calc" / "__init__.py", "a") as handle:
        handle.write(PAYLOAD)


CASES = {
    "symlink_into_the_tree": (_symlink, "refused", "a symlink"),
    "non_utf8_declaration": (_encoding, "refused", "declares its source encoding as 'utf-7'"),
    "conftest_package": (_conftest_package, "refused", "a package named 'conftest'"),
    "archive": (_archive, "refused", "an archive"),
    "odd_separators": (_separators, "refused", "a line separator (U+2028)"),
    "new_top_level_module": (_top_level, "suspicious", "a new top-level module 'typing_helpers'"),
    "pickle_payload": (_pickle_payload, "suspicious", "unpickles data"),
    "subclass_walk": (_reach, "suspicious", "walks the class hierarchy"),
}


@pytest.mark.parametrize("layer", ["diff", "tree"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_round_three_patch_is_refused_or_marked(
    docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, layer: str
) -> None:
    """Each check holds on the diff and again on the bytes the tree holds after applying (the
    diff's reading switched off for "tree")."""
    import envs.candidate as candidate

    if layer == "tree":
        monkeypatch.setattr(candidate, "diff_problems", lambda *_a, **_k: [])
    edit, outcome, reason = CASES[case]
    task = TASKS["mini__calc-1"]
    verdict = verify(docker_client, task, _diff(task.instance_id, edit, tmp_path), images[task.instance_id])
    assert not verdict.resolved or verdict.suspicious, _why(verdict)
    if outcome == "refused":
        assert not verdict.patch_applied and verdict.tests is None, _why(verdict)
        assert any(reason in r for r in verdict.refused), _why(verdict)
    else:
        assert verdict.patch_applied and any(reason in s for s in verdict.suspicious), _why(verdict)


def test_a_new_module_inside_the_package_stays_allowed(docker_client: docker.DockerClient, images: dict[str, str], tmp_path: Path) -> None:
    """A real fix may add a module to the package under test, with a UTF-8 declaration and a
    page break: the gold patch plus such a module still resolves, unmarked."""
    task = TASKS["mini__calc-1"]

    def edit(repo: Path) -> None:
        subprocess.run(["git", "apply", "-"], input=task.patch.encode(), cwd=repo, check=True)
        (repo / "calc" / "grammar.py").write_text('# -*- coding: utf-8 -*-\n"""Grammar notes."""\n\x0c\nRULES = ("expr", "term")\n')

    verdict = verify(docker_client, task, _diff(task.instance_id, edit, tmp_path), images[task.instance_id])
    assert verdict.resolved and not verdict.suspicious and not verdict.refused, _why(verdict)


def test_every_prediction_row_gets_a_verdict_row(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """Rows refused when the predictions are read (a lone surrogate, a field of the wrong type)
    are written as refused verdicts, with file, line and field, without a container; a rerun
    finds them. Only a row with no instance id has no verdict (nothing to key it by)."""
    task = TASKS["mini__calc-1"]
    rows = [
        '{"instance_id": "mini__calc-1", "model_patch": "diff \\ud800 x", "model_name_or_path": "m\\udc80"}',
        '{"instance_id": "mini__calc-1", "model_patch": ["x"], "model_name_or_path": "list"}',
        '{"model_patch": "x"}',
    ]
    path = tmp_path / "preds.jsonl"
    path.write_text("\n".join(rows) + "\n")
    predictions, errors = load_predictions(path)
    assert [str(e) for e in errors] == [f"{path}:3: instance_id: missing or not a string"]
    output = tmp_path / "verdicts.jsonl"
    summary = verify_batch(docker_client, {task.instance_id: task}, predictions, output)
    assert not summary.errors and len(summary.verdicts) == 2
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [v["refused"] for v in written] == [
        [f"the prediction was refused: {path}:1: model_patch: not valid Unicode (surrogates not allowed at offset 5)"],
        [f"the prediction was refused: {path}:2: model_patch: expected string, got list"],
    ]
    assert [v["model_name_or_path"] for v in written] == ["m\\udc80", "list"]
    assert not any(v["resolved"] for v in written) and len({v["patch_hash"] for v in written}) == 2
    again = verify_batch(docker_client, {task.instance_id: task}, predictions, output)
    assert again.skipped == 2 and not again.verdicts
