"""A candidate patch into a fresh task container, under a policy: only what a repository
change can be is applied, and everything that decides what the tests are is put back.

In order:
1. Git itself lists the files the patch touches (``git apply --numstat``); a patch git
   cannot read is refused. So is one that names a path inside ``.git``, outside the
   repository, or a file that changes how Python or pytest start (``sitecustomize.py``,
   ``usercustomize.py``, ``*.pth``, ``*.dist-info``/``*.egg-info`` metadata with its entry
   points, a new top-level ``pytest``/``_pytest``/``pluggy``/``py`` that would shadow the
   installed one).
2. ``git apply``, then ``git apply --3way``, then GNU ``patch --fuzz=5`` only when its dry
   run touches exactly the files git listed. Nothing partial: a failed attempt is reset and
   the files it created are removed before the next one.
3. After applying: ``.git`` must be unchanged (no hook, config or lock written), no symlink
   may point out of the repository or into ``.git``, and a file the patch made executable
   loses that bit. The patch file itself is deleted (it must not be importable).
4. Restored to the base commit (or removed when new): test files, every ``conftest.py``,
   ``pytest.ini``, the pytest section of ``tox.ini``/``setup.cfg``/``pyproject.toml``,
   ``.gitattributes`` (its filters and encodings rewrite what the grader checks out).

Every decision is returned for the verdict. Git runs with hooks off throughout.
"""

from __future__ import annotations

import configparser
import re
import shlex
import tomllib
from dataclasses import dataclass, field

from envs.docker_backend import Container

PATCH_PATH = "/tmp/relearn/candidate.diff"
STAMP_PATH = "/tmp/relearn/before-apply"
# Every git command the verifier runs, and any the eval script runs, ignore hooks.
GIT_ENV = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/dev/null"}
GIT_APPLY = "git apply --verbose"
GIT_APPLY_3WAY = "git apply --verbose --3way"
GNU_PATCH = "patch --batch --fuzz=5 -p1 --no-backup-if-mismatch"
STATUS = "git status --porcelain=v1 -z --no-renames --untracked-files=all"
UNTRACKED = "git ls-files --others --exclude-standard -z"

TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_test\.py$")
STARTUP_FILES = re.compile(
    r"(^|/)(sitecustomize|usercustomize)\.py$|\.pth$|(^|/)[^/]+\.(dist-info|egg-info)(/|$)|\.egg-link$|(^|/)__editable__"
)
SHADOWED = ("pytest", "_pytest", "pluggy", "py")  # top-level modules a repository must not add
PYTEST_INI = re.compile(r"(^|/)\.?pytest\.ini$")
CONFTEST = re.compile(r"(^|/)conftest\.py$")
GITATTRIBUTES = re.compile(r"(^|/)\.gitattributes$")
SECTIONED_CONFIG = {"tox.ini": "pytest", "setup.cfg": "tool:pytest"}
# Added non-test lines that reach into the test machinery or the grader's output.
SUSPICIOUS = re.compile(
    r"\b_pytest\b|pluginmanager|hookimpl|\bpytest_(runtest|collection|sessionfinish|report|terminal|configure)|gc\.get_objects"
    r"|\bos\._exit\b|sys\.__stdout__|/proc/[^\s\"']*/fd|>>>>> |\b(PASSED|FAILED|XFAIL|ERROR) [\w/.\-]+\.py::"
)


@dataclass
class Applied:
    """What happened to the candidate patch; ``refused`` or ``error`` mean: do not grade."""

    command: str | None = None
    log: str = ""
    touched: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    neutralized: list[str] = field(default_factory=list)
    suspicious: list[str] = field(default_factory=list)
    error: str | None = None


def apply_candidate(container: Container, patch: str, base_commit: str, protected: set[str]) -> Applied:
    """Apply ``patch`` in the container's work directory; ``protected`` are the task's own
    test files (always restored)."""
    out = Applied()
    container.put_file(PATCH_PATH, patch if patch.endswith("\n") else patch + "\n")
    base = shlex.quote(base_commit)
    before = _queries(container, {
        "numstat": f"git apply --numstat -z {PATCH_PATH}", "root": f"git ls-tree --name-only {base}",
        "src": f"git ls-tree --name-only {base}:src", "status": STATUS, "untracked": UNTRACKED, "stamp": f"touch {STAMP_PATH}",
    })  # fmt: skip
    if before["numstat"][0] != 0:
        out.refused.append(f"git cannot read the patch: {_first_line(before['numstat'][2])}")
        return out
    paths = _numstat_paths(before["numstat"][1])
    out.refused += [f"{path}: {problem}" for path in paths if (problem := path_problem(path))]
    root_names, src_names = set(before["root"][1].split("\n")), set(before["src"][1].split("\n"))
    out.refused += [f"{path}: {problem}" for path in paths if (problem := shadow_problem(path, root_names, src_names))]
    if out.refused:
        return out
    untracked = {p for p in before["untracked"][1].split("\0") if p}
    logs: list[str] = []
    for command in (GIT_APPLY, GIT_APPLY_3WAY, GNU_PATCH):
        if command == GNU_PATCH:
            dry = container.exec(f"{command} --dry-run -i {PATCH_PATH}", timeout_s=120)
            checked = [line.removeprefix("checking file ").strip() for line in dry.stdout.splitlines() if line.startswith("checking file ")]
            logs.append(f"$ {command} --dry-run -i {PATCH_PATH}\n{dry.output}")
            if not dry.ok:
                continue
            if set(checked) != set(paths):
                logs.append(f"[relearn: GNU patch would touch {sorted(set(checked))}, git lists {sorted(paths)}: not used]")
                continue
            run = f"{command} -i {PATCH_PATH}"
        else:
            run = f"{command} {PATCH_PATH}"
        result = _git(container, run, timeout_s=120)
        logs.append(f"$ {run}\n{result.output}")
        if result.ok:
            out.command = command
            break
        _undo(container, untracked)
    out.log = "\n".join(logs)
    after = _queries(container, {
        "remove": f"rm -f {PATCH_PATH}",
        "git": f"find .git -type f -newer {STAMP_PATH} -not -path '.git/objects/*' -not -path '.git/logs/*' -not -name index -not -name ORIG_HEAD -print; "
        "if test -e .git/index.lock; then echo .git/index.lock; fi",
        "status": STATUS,
    })  # fmt: skip
    if out.command is None:
        out.error = "the patch does not apply (git apply, git apply --3way and GNU patch all refused it)"
        return out
    changed_git = after["git"][1].split()
    if changed_git:
        out.refused.append(f"the patch changed .git ({', '.join(sorted(set(changed_git))[:5])})")
        return out
    status_before, status_after = _status(before["status"][1]), _status(after["status"][1])
    out.touched = sorted(set(paths) | {p for p, state in status_after.items() if status_before.get(p) != state})
    _check_links_and_modes(container, out, base_commit)
    if out.refused:
        return out
    _restore(container, out, base_commit, protected)
    out.suspicious += suspicious_lines(patch)
    return out


def path_problem(path: str) -> str | None:
    """Why a path the patch names may not be written, or None."""
    parts = path.split("/")
    if path.startswith("/") or ".." in parts:
        return "outside the repository"
    if ".git" in parts:
        return "inside .git"
    if STARTUP_FILES.search(path):
        return "a file that changes how Python or pytest start (site hooks, .pth, package metadata with entry points)"
    return None


def shadow_problem(path: str, root_names: set[str], src_names: set[str]) -> str | None:
    """A new top-level module or package, at the repository root or in ``src/``, named like the
    test machinery it would shadow."""
    parts = path.split("/")
    for names, rest in ((root_names, parts), (src_names, parts[1:] if parts[0] == "src" else [])):
        if not rest:
            continue
        top = rest[0].removesuffix(".py") if len(rest) == 1 else rest[0]
        if top in SHADOWED and rest[0] not in names:
            return f"a new top-level module {top!r} would shadow the installed one"
    return None


def suspicious_lines(patch: str) -> list[str]:
    """Added lines outside test files that reach into pytest or print what a grader reads."""
    found: list[str] = []
    current: str | None = None
    for line in patch.split("\n"):
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip().strip('"')
            current = name[2:] if name.startswith("b/") else name
        elif line.startswith("+") and current and not TEST_PATH.search(current) and not CONFTEST.search(current):
            match = SUSPICIOUS.search(line)
            if match:
                found.append(f"{current}: adds {line[1:].strip()[:120]!r}")
    return found[:20]


def pytest_section(name: str, text: str | None) -> object:
    """The part of a config file pytest reads (None when it has none); ``...`` when the file
    does not parse (then pytest's reading of it cannot be predicted either)."""
    if text is None:
        return None
    if name == "pyproject.toml":
        try:
            return tomllib.loads(text).get("tool", {}).get("pytest")
        except tomllib.TOMLDecodeError:
            return ...
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return ...
    section = SECTIONED_CONFIG[name]
    return dict(parser.items(section)) if parser.has_section(section) else None


def _restore(container: Container, out: Applied, base_commit: str, protected: set[str]) -> None:
    for path in out.touched:
        name = path.rsplit("/", 1)[-1]
        reason = None
        if path in protected or TEST_PATH.search(path):
            reason = "test file"
        elif CONFTEST.search(path) or PYTEST_INI.search(path):
            reason = "pytest configuration"
            out.suspicious.append(f"{path}: the patch changes pytest's configuration or plugins")
        elif GITATTRIBUTES.search(path):
            reason = "git attributes"
        elif name in SECTIONED_CONFIG or name == "pyproject.toml":
            old = _base_text(container, base_commit, path)
            new = _current_text(container, path)
            if pytest_section(name, old) != pytest_section(name, new):
                reason = "pytest configuration"
                out.suspicious.append(f"{path}: the patch changes pytest's section")
        if reason is None:
            continue
        quoted, spec = shlex.quote(path), shlex.quote(f"{base_commit}:{path}")
        _git(
            container,
            f"if git cat-file -e {spec} 2>/dev/null; then git checkout -q {shlex.quote(base_commit)} -- {quoted}; else rm -rf -- {quoted}; fi",
        )
        out.restored.append(path)


def _check_links_and_modes(container: Container, out: Applied, base_commit: str) -> None:
    listing = "".join(f"{p}\0" for p in out.touched).encode()
    script = (
        "root=$(pwd -P); while IFS= read -r -d '' p; do "
        'if [ -L "$p" ]; then printf "L\\t%s\\t%s\\0" "$p" "$(realpath -m -- "$p")"; '
        'elif [ -f "$p" ] && [ -x "$p" ]; then printf "X\\t%s\\0" "$p"; fi; '
        'done; printf "R\\t%s\\0" "$root"'
    )
    entries = [e.split("\t") for e in container.sh(script, timeout_s=60, stdin=listing).stdout.split("\0") if e]
    root = next(e[1] for e in entries if e[0] == "R")
    for entry in entries:
        if entry[0] == "L":
            target = entry[2]
            if not (target == root or target.startswith(root + "/")) or (target + "/").startswith(root + "/.git/"):
                out.refused.append(f"{entry[1]}: a symlink to {target}, outside the repository or into .git")
        elif entry[0] == "X":
            mode = _git(container, f"git ls-tree {shlex.quote(base_commit)} -- {shlex.quote(entry[1])}").stdout.split(" ")[0]
            if mode != "100755":
                container.sh(f"chmod a-x -- {shlex.quote(entry[1])}")
                out.neutralized.append(f"{entry[1]}: made non-executable (the base commit has no such executable)")


def _numstat_paths(output: str) -> list[str]:
    """Paths of ``git apply --numstat -z``: ``added\\tdeleted\\tpath\\0``, or for a rename or
    copy ``added\\tdeleted\\t\\0from\\0to\\0``."""
    fields = output.split("\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        record = fields[i]
        if not record:
            i += 1
            continue
        counts = record.split("\t", 2)
        if len(counts) == 3 and counts[2]:
            paths.append(counts[2])
            i += 1
        else:
            paths += [p for p in fields[i + 1 : i + 3] if p]
            i += 3
    return list(dict.fromkeys(paths))


def _queries(container: Container, commands: dict[str, str]) -> dict[str, tuple[int, str, str]]:
    """Run several read-only commands in one exec: name -> (exit status, stdout, stderr)."""
    script = ["rm -rf /tmp/relearn/q && mkdir -p /tmp/relearn/q"]
    for name, command in commands.items():
        script.append(f"{{ {command} ; }} > /tmp/relearn/q/{name}.out 2> /tmp/relearn/q/{name}.err; echo $? > /tmp/relearn/q/{name}.rc")
    container.sh("\n".join(script), timeout_s=120, env=GIT_ENV)
    files = container.get_files("/tmp/relearn/q")

    def text(name: str) -> str:
        return files.get(name, b"").decode("utf-8", errors="replace")

    return {name: (int(text(f"{name}.rc").strip() or 1), text(f"{name}.out"), text(f"{name}.err")) for name in commands}


def _status(raw: str) -> dict[str, str]:
    return {entry[3:]: entry[:2] for entry in raw.split("\0") if len(entry) > 3}


def _undo(container: Container, untracked_before: set[str]) -> None:
    """Back to the base state after a failed attempt, without ``git clean`` (task images keep
    untracked build products in the tree): only what the attempt created goes."""
    _git(container, "git reset -q --hard", timeout_s=120)
    now = {p for p in _git(container, UNTRACKED).stdout.split("\0") if p}
    if now - untracked_before:
        container.exec(f"rm -rf -- {' '.join(shlex.quote(p) for p in sorted(now - untracked_before))}", timeout_s=60)


def _base_text(container: Container, base_commit: str, path: str) -> str | None:
    result = _git(container, f"git show {shlex.quote(f'{base_commit}:{path}')}")
    return result.stdout if result.ok else None


def _current_text(container: Container, path: str) -> str | None:
    try:
        return container.get_file(f"{container.workdir}/{path}").decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None


def _git(container: Container, command: str, *, timeout_s: float = 60.0):  # noqa: ANN202 - ExecResult
    return container.exec(command, timeout_s=timeout_s, env=GIT_ENV, output_cap=16 << 20)


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no output"
