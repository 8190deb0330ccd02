"""The runner guard, the verifier's side: isolate the test runner and watch it from outside the
repository.

The test command is rewritten (``place``) so that

- every runner starts with the work directory off the head of ``sys.path``: ``python -m
  pytest`` and the script runners (Django's ``runtests.py``, SymPy's ``bin/test``) go through
  ``launch.py``, a launcher the verifier writes to ``/tmp/relearn/guard`` (Python before 3.11
  has no ``-P``); the ``pytest`` console script never had it there;
- a guard (``relearn_guard``) loads before any repository code: as a pytest plugin (``-p
  relearn_guard``, ahead of conftest files and entry-point plugins), or from the launcher. It
  records the identity of the runner's test-call machinery at load, around every test and at
  the end, every plugin and test-call or report hook registered after it (with the file it comes
  from), and modules of the work directory that stand in front of installed ones; it writes a
  JSON report to a path with a nonce, outside the repository.

``judge`` reads that report back into the verdict: a replaced piece of machinery, or a plugin,
hook or shadowing module from a file the patch wrote, is suspicious, with the evidence; a
report missing, garbled or unfinished where the guard was placed is a disagreement (nothing
vouches for the run: not resolved). The repository's own hooks are never flagged: only what a
patch-written file registers, and what changes during the run (pytest's own repository, whose
patched runner is loaded before the guard, is the guard's baseline).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GUARD_DIR = "/tmp/relearn/guard"
LAUNCHER = f"{GUARD_DIR}/launch.py"
SITE_HOOK = f"{GUARD_DIR}/site_hook.py"
PTH = f"{GUARD_DIR}/relearn_guard.pth"
PLUGIN = "relearn_guard"
# Runners whose tests run in a child interpreter the runner starts itself (SymPy's bin/test,
# for hash randomization): the child loads the guard from the .pth file.
RERUNS_IN_CHILD = frozenset({"sympy"})
SOURCES = Path(__file__).resolve().parent / "guard"
PYTHON_WORD = r"(?:\S*/)?python[0-9.]*"
PYTEST_SCRIPT = re.compile(r"(^|[\s;&|(])(pytest|py\.test)(?=\s|$)")
PYTEST_MODULE = re.compile(rf"(^|[\s;&|(])({PYTHON_WORD}(?:\s+-\S+)*?)\s+-m\s+pytest(?=\s|$)")
SCRIPTS = {"sympy": re.compile(r"(^|[\s;&|(])((?:\./)?bin/test)(?=\s|$)"), "unittest": re.compile(r"(^|[\s;&|(])(\S*runtests\.py)(?=\s|$)")}
PYTHON_BEFORE = re.compile(rf"(^|[\s;&|(]){PYTHON_WORD}(?:\s+-\S+)*\s+$")


@dataclass
class Placement:
    """Where the guard went: its report's path, or why it was not placed."""

    report_path: str | None = None
    framework: str = ""
    note: str = ""
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)


def guard_files(pytest_report: str = "") -> dict[str, tuple[bytes, int]]:
    """The guard's sources, as they go into the container, and the ``.pth`` line that runs
    ``site_hook.py`` at interpreter start (``pytest_report``: the report path of a pytest that
    tox starts, baked in because tox does not pass the variable on)."""
    files = {f"{GUARD_DIR}/{name}": ((SOURCES / name).read_bytes(), 0o644) for name in ("launch.py", "relearn_guard.py", "site_hook.py")}
    files[PTH] = (pth_line(pytest_report).encode(), 0o644)
    return files


def pth_line(pytest_report: str) -> str:
    """One ``.pth`` line (site runs lines that start with ``import``): a cheap test, then the
    hook, its file closed (``-X dev``, Sphinx's, would print a ResourceWarning otherwise)."""
    names = {"__name__": "relearn_guard_site", "__file__": SITE_HOOK, "PYTEST_REPORT": pytest_report}
    return (
        f'import os, sys; ("{PLUGIN}" in sys.argv or "RELEARN_GUARD_CHILD" in os.environ) and os.path.isfile("{SITE_HOOK}") '
        f'and (lambda f: [exec(compile(f.read(), f.name, "exec"), dict({names!r})), f.close()])(open("{SITE_HOOK}"))\n'
    )


# Copies the .pth file into every site-packages folder of the interpreters the command can
# start (``python``, ``python3``: tox's own and the one its commands name, the one SymPy's
# ``#!/usr/bin/env python`` finds), run isolated (``-I``) so nothing of the work directory
# takes part. A failure leaves the report missing, which is not resolved.
INSTALL_PTH = (
    "for relearn_python in python python3; do command -v $relearn_python >/dev/null 2>&1 && $relearn_python -I -c "
    "'import os, shutil, site, sysconfig; "
    'found = list(getattr(site, "getsitepackages", lambda: [])()) + [sysconfig.get_paths()["purelib"]]; '
    f'[shutil.copy("{PTH}", d) for d in dict.fromkeys(os.path.realpath(p) for p in found) if os.path.isdir(d)]'
    "' >/dev/null 2>&1; done; true"
)


def rewrite(command: str, framework: str) -> str | None:
    """The test command run under the launcher and the guard, or None when it is not a form
    this knows (tox starts pytest in an environment of its own, whose variables it filters)."""
    if framework == "pytest":
        module = PYTEST_MODULE.search(command)
        if module:
            start, end = module.span(0)
            call = f"{module.group(1)}{module.group(2)} {LAUNCHER} pytest -m pytest -p {PLUGIN}"
            return command[:start] + call + command[end:]
        script = PYTEST_SCRIPT.search(command)
        if script:
            start = script.start(2)
            path = f"PYTHONPATH={GUARD_DIR}${{PYTHONPATH:+:$PYTHONPATH}} "
            return command[:start] + path + script.group(2) + f" -p {PLUGIN}" + command[script.end(2) :]
        return None
    pattern = SCRIPTS.get(framework)
    found = pattern.search(command) if pattern else None
    if found is None:
        return None
    start, script = found.start(2), found.group(2)
    if PYTHON_BEFORE.search(command[:start]):
        return command[:start] + f"{LAUNCHER} {framework} " + command[start:]
    # Run directly, the script's own interpreter line says what runs it, as the kernel would.
    quoted = shlex.quote(script)
    interpreter = f"$(sed -n '1s/^#!//p' {quoted} | tr -d '\\r' | grep . || echo python3)"
    return command[:start] + f"{interpreter} {LAUNCHER} {framework} " + command[start:]


def place_guard(lines: list[str], main: int, framework: str | None, direct: bool) -> tuple[int, Placement]:
    """Rewrite the test command ``lines[main]`` to run under the guard; returns where the
    command now is and the placement."""
    if framework is None:
        return main, Placement(note="no runner the guard knows")
    report = f"/tmp/relearn-guard-{secrets.token_hex(8)}/report.json"
    if not direct:
        # tox runs pytest with the environment filtered by passenv: the plugin is named after
        # tox's `--` (which _instrument has added for the report) and loads from the .pth file,
        # the report path baked in.
        if framework != "pytest" or " -- " not in f" {lines[main]} ":
            return main, Placement(framework=framework, note="not placed: the test command is not in a form the guard knows")
        lines[main] = f"{lines[main]} -p {PLUGIN}"
        lines.insert(main, INSTALL_PTH)
        return main + 1, Placement(report_path=report, framework=framework, files=guard_files(report))
    command = rewrite(lines[main], framework)
    if command is None:
        return main, Placement(framework=framework, note="not placed: the test command is not in a form the guard knows")
    lines[main] = command
    lines.insert(main, f"export RELEARN_GUARD_REPORT={report}")
    if framework in RERUNS_IN_CHILD:
        lines.insert(main, INSTALL_PTH)
        main += 1
    return main + 1, Placement(report_path=report, framework=framework, files=guard_files())


# --- reading the report back ------------------------------------------------------------------


def judge(report: bytes | None, report_path: str, verdict: Any) -> None:
    """Mark ``verdict`` with what the guard's report shows (see the module's docstring)."""
    written = set(verdict.touched_files) - set(verdict.restored_files)
    where = f"the runner guard's report ({report_path})"
    if report is None:
        verdict.disagreements.append(
            f"{where} is missing: the guard loads before any repository code and writes it at its start, so the test process "
            "did not run it or something removed it; the run was not watched"
        )
        return
    try:
        data = json.loads(report)
    except ValueError as exc:
        verdict.disagreements.append(f"{where} is garbled ({type(exc).__name__}: {str(exc)[:200]}): the run was not watched")
        return
    _judge(data, where, written, verdict)


def _judge(data: Any, where: str, written: set[str], verdict: Any, label: str = "runner guard") -> None:
    """One process's report; a runner's child's report, folded into its parent's, in turn."""
    try:
        if not isinstance(data, dict) or data.get("guard") != 1:
            raise ValueError("not a guard report")
        changes, hooks = list(data["changes"]), list(data["hooks"])
        plugins, shadows = list(data.get("plugins", [])), list(data.get("shadows", []))
    except (ValueError, KeyError, TypeError) as exc:
        verdict.disagreements.append(f"{where} is garbled ({type(exc).__name__}: {str(exc)[:200]}): the run was not watched")
        return
    if not data.get("finished"):
        verdict.disagreements.append(
            f"{where} was not finished: the test process ended without the runner's end (os._exit, a crash, a kill); the run was not watched to its end"
        )
    for change in changes:
        verdict.suspicious.append(
            f"{label}: {change.get('what')} was replaced during the run ({change.get('how')}, seen {change.get('when')}): "
            f"{change.get('old')} -> {change.get('new')} defined at {change.get('new_file') or '?'}"
        )
    for hook in hooks:
        path = str(hook.get("file", "")).rsplit(":", 1)[0]
        if path in written or not path or path.startswith("<"):
            origin = "a file the patch wrote" if path in written else "code with no file"
            verdict.suspicious.append(
                f"{label}: {hook.get('function')} implements {hook.get('hook')}{' as a wrapper' if hook.get('wrapper') else ''}, "
                f"registered after the guard (plugin {hook.get('plugin')!r}) from {path or '?'}, {origin}"
            )
    for plugin in plugins:
        if plugin.get("file") in written:
            verdict.suspicious.append(
                f"{label}: plugin {plugin.get('name')!r} registered during the run from {plugin.get('file')}, a file the patch wrote"
            )
    for shadow in shadows:
        if shadow.get("file") in written or _package_file(str(shadow.get("file", ""))) in written:
            verdict.suspicious.append(
                f"{label}: module {shadow.get('module')!r} was imported from {shadow.get('file')}, a file the patch wrote, "
                f"in front of {shadow.get('other')}"
            )
    for child in data.get("children") or []:
        command = " ".join(str(word) for word in child.get("command") or [])[:300]
        about = f"{where}, child process {child.get('n')} of the runner (pid {child.get('pid')}: {command})"
        if child.get("report") is not None:
            _judge(child["report"], about, written, verdict, f"runner guard, in the runner's child process {child.get('n')}")
        elif child.get("required"):
            verdict.disagreements.append(
                f"{about}: the runner started an interpreter that wrote no guard report ({child.get('unread') or 'none'}): "
                "the tests it ran were not watched"
            )


def _package_file(path: str) -> str:
    return path.rsplit("/", 1)[0] + "/__init__.py" if "/" in path else path
