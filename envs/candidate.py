"""A candidate patch into a fresh task container, under a policy: only what a repository
change can be is applied, and everything that decides what the tests are is put back.

In order:
1. Git itself lists the files the patch touches (``git apply --numstat -z``); a patch git
   cannot read is refused. So is one that names a path inside ``.git``, outside the
   repository, a file that changes how Python or pytest start (``sitecustomize.py``,
   ``usercustomize.py``, ``*.pth``, ``*.dist-info``/``*.egg-info`` metadata with its entry
   points), compiled code Python would load without its source (``*.pyc``/``*.pyo``,
   anything under ``__pycache__/``, extension modules), binary content written where
   Python loads source, or a new top-level module that shadows the test machinery or the
   standard library (``pytest``, ``pluggy``, ``inspect.py``...). The diff is read against the
   allowlist of what a patch may write (``envs.allowlist``: no symlink, no binary content
   or archive, no non-UTF-8 encoding declaration, no odd line separator in Python source,
   no module named ``conftest``/``sitecustomize``/``usercustomize``).
2. ``git apply``, then ``git apply --3way``, then GNU ``patch --fuzz=5`` only when its dry
   run touches exactly the files git listed. Nothing partial: a failed attempt is reset and
   the files it created are removed before the next one.
3. After applying: ``.git`` must be unchanged (no hook, config or lock written), no symlink
   may point out of the repository or into ``.git``, no symlink may stand where the tests
   or their configuration are read, and a file the patch made executable loses that bit.
   The patch file itself is deleted (it must not be importable). Every file it wrote is
   checked against the allowlist again, on the bytes the tree holds: no symlink at all,
   regular UTF-8 text, Python source as above; a new importable name at the top of the
   repository or of ``src/`` that the base commit lacks is marked suspicious.
4. Put back by bytes to the base commit (or removed when new), whenever git records that the
   patch changed them: test files, every file pytest, tox or the task's runner read their
   configuration or plugins from, wherever they are (``conftest.py``, ``pytest.ini``,
   ``.pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``, ``runtests.py``, the
   files the test command names), ``.gitattributes``, and a new package marker
   (``__init__.py``) at the root or in a folder above the tests, which would make the
   restored ``conftest.py`` part of a package whose ``__init__`` runs first. Whether the
   pytest section changed is parsed only to say so (suspicious), never to decide.
5. Every Python file the patch writes is read back and scanned on its syntax tree
   (``envs.code_scan``), and so is every other text file it writes that parses as Python
   (``runpy`` and ``exec`` run any file); what it finds marks the verdict suspicious.

Every git query is NUL-separated; a check that fails refuses the patch with its reason
rather than grading it unchecked. Every decision is returned for the verdict. Git runs with
hooks off throughout.
"""

from __future__ import annotations

import configparser
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field

import docker
import requests

from envs.allowlist import content_problems, diff_problems, new_top_level
from envs.allowlist import path_problem as by_name_problem
from envs.code_scan import scan_source, scan_text
from envs.docker_backend import Container
from envs.frameworks import REGISTRY

PATCH_PATH = "/tmp/relearn/candidate.diff"
STAMP_PATH = "/tmp/relearn/before-apply"
SCAN_DIR = "/tmp/relearn/scan"
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
# Code Python loads without reading any source: an unchecked-hash .pyc under __pycache__
# is used even beside its .py, a sourceless .pyc in place of a missing one.
COMPILED = re.compile(r"(^|/)__pycache__(/|$)|\.py[co]$|\.(so|pyd|dylib)$|\.so\.[0-9.]+$")
PYTHON_SOURCE = re.compile(r"\.pyw?$")
# Top-level names a repository must not add: the test machinery (each framework's, from
# ``envs.frameworks``), and the standard library, which the work directory on sys.path
# (``python -m pytest``, rootdir conftest insertion) would shadow for the runner itself.
SHADOWED = REGISTRY.shadowed | frozenset(sys.stdlib_module_names)
# Files whose bytes decide which tests run and how, wherever they are in the tree: every
# framework's configuration, and how git reads the tree.
CONFIG_NAMES = REGISTRY.config_files | {".gitattributes"}
ALWAYS_SUSPICIOUS = REGISTRY.always_suspicious
CONFTEST = re.compile(r"(^|/)conftest\.py$")
# Shared configuration files -> the key paths of the frameworks' sections in them.
SECTIONED_CONFIG = REGISTRY.config_sections
# Added non-test lines that reach into the test machinery or the grader's output.
SUSPICIOUS = re.compile(
    r"\b_pytest\b|pluginmanager|hookimpl|\bpytest_(runtest|collection|sessionfinish|report|terminal|configure)|gc\.get_objects"
    r"|\bos\._exit\b|sys\.__stdout__|/proc/[^\s\"']*/fd|>>>>> |\b(PASSED|FAILED|XFAIL|ERROR) [\w/.\-]+\.py::"
)
SCAN_CAP = 4 << 20  # a written Python file larger than this is marked, not parsed
SUSPICIOUS_CAP = 50  # findings kept in a verdict: enough for a reviewer, bounded for the pool
INFRASTRUCTURE = (docker.errors.DockerException, requests.exceptions.RequestException)


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


@dataclass
class Entry:
    """A touched path as the container holds it after applying."""

    path: str
    kind: str  # F regular file, L symlink, D folder, N absent, O anything else
    target: str = ""  # a symlink's resolved target
    executable: bool = False


def apply_candidate(
    container: Container, patch: str | bytes, base_commit: str, protected: set[str], *, runner_files: frozenset[str] = frozenset()
) -> Applied:
    """Apply ``patch`` in the container's work directory; ``protected`` are the task's own
    test files (always restored), ``runner_files`` the files the test command names (its
    runner script, restored like configuration). A check that fails refuses the patch."""
    out = Applied()
    try:
        _apply(container, patch, base_commit, protected, runner_files, out)
    except INFRASTRUCTURE:
        raise  # the engine, not the patch: the batch retries or reports it
    except Exception as exc:  # noqa: BLE001 - any failing check refuses this one patch, with its reason
        out.refused.append(f"a check of the patch failed ({type(exc).__name__}: {str(exc)[:300]}): refused rather than graded unchecked")
    return out


def _apply(
    container: Container, patch: str | bytes, base_commit: str, protected: set[str], runner_files: frozenset[str], out: Applied
) -> None:
    data = patch if isinstance(patch, bytes) else patch.encode("utf-8")
    container.put_file(PATCH_PATH, data if data.endswith(b"\n") else data + b"\n")
    base = shlex.quote(base_commit)
    before = _queries(container, {
        "numstat": f"git apply --numstat -z {PATCH_PATH}", "root": f"git ls-tree -z --name-only {base}",
        "src": f"git ls-tree -z --name-only {base}:src", "status": STATUS, "untracked": UNTRACKED, "stamp": f"touch {STAMP_PATH}",
    })  # fmt: skip
    if before["numstat"][0] != 0:
        out.refused.append(f"git cannot read the patch: {_first_line(before['numstat'][2])}")
        return
    records = _numstat(before["numstat"][1])
    paths = list(dict.fromkeys(p for _binary, p in records))
    out.refused += [f"{path}: {problem}" for path in paths if (problem := path_problem(path))]
    out.refused += [
        f"{path}: binary content where Python loads source" for binary, path in records if binary and PYTHON_SOURCE.search(path)
    ]
    root_names, src_names = set(before["root"][1].split("\0")), set(before["src"][1].split("\0"))
    out.refused += [f"{path}: {problem}" for path in paths if (problem := shadow_problem(path, root_names, src_names))]
    text = patch if isinstance(patch, str) else patch.decode("utf-8", errors="surrogateescape")
    # Symlinks are left to the tree's check, which says where each one points.
    out.refused += diff_problems(text, frozenset(_decides_tests(paths, protected, runner_files)), symlinks=False)
    if out.refused:
        return
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
        "git": f"find .git -type f -newer {STAMP_PATH} -not -path '.git/objects/*' -not -path '.git/logs/*' -not -name index -not -name ORIG_HEAD -print0; "
        "if test -e .git/index.lock; then printf '.git/index.lock\\0'; fi",
        "status": STATUS,
    })  # fmt: skip
    if out.command is None:
        out.error = "the patch does not apply (git apply, git apply --3way and GNU patch all refused it)"
        return
    changed_git = [p for p in after["git"][1].split("\0") if p]
    if changed_git:
        out.refused.append(f"the patch changed .git ({', '.join(sorted(set(changed_git))[:5])})")
        return
    status_before, status_after = _status(before["status"][1]), _status(after["status"][1])
    out.touched = sorted(set(paths) | {p for p, state in status_after.items() if status_before.get(p) != state})
    decides = _decides_tests(out.touched, protected, runner_files)
    entries, contents = _inspect(container, out.touched, base_commit, out.touched)
    _check_links_and_modes(container, out, base_commit, entries, decides)
    _check_contents(out, entries, contents, decides)
    if out.refused:
        return
    _restore(container, out, base_commit, decides, contents)
    _scan(out, entries, contents)
    out.suspicious += suspicious_lines(patch if isinstance(patch, str) else patch.decode("utf-8", errors="replace"))


def path_problem(path: str) -> str | None:
    """Why a path the patch names may not be written, or None."""
    parts = path.split("/")
    if path.startswith("/") or ".." in parts:
        return "outside the repository"
    if ".git" in parts:
        return "inside .git"
    if STARTUP_FILES.search(path):
        return "a file that changes how Python or pytest start (site hooks, .pth, package metadata with entry points)"
    if COMPILED.search(path):
        return "compiled code Python would load without its source (bytecode, __pycache__, an extension module)"
    return None


def shadow_problem(path: str, root_names: set[str], src_names: set[str]) -> str | None:
    """A new top-level module or package, at the repository root or in ``src/``, named like the
    test machinery or a standard-library module it would shadow."""
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


def framework_sections(name: str, text: str | None) -> object:
    """The parts of a shared config file the test frameworks read (``SECTIONED_CONFIG``: a
    tuple, one entry per framework's section, None where it has none); ``...`` when the file
    does not parse (then the framework's reading of it cannot be predicted either). Used only
    to say whether a restored file's sections changed, never to decide the restore."""
    if text is None:
        return None
    if name.endswith(".toml"):
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return ...
        return tuple(_toml_section(table, path) for path in SECTIONED_CONFIG[name])
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return ...
    return tuple(dict(parser.items(path[0])) if parser.has_section(path[0]) else None for path in SECTIONED_CONFIG[name])


def _toml_section(table: object, path: tuple[str, ...]) -> object:
    for key in path:
        table = table.get(key) if isinstance(table, dict) else None
    return table


def _decides_tests(touched: list[str], protected: set[str], runner_files: frozenset[str]) -> dict[str, str]:
    """Touched paths that decide which tests run and how -> "test", "config" or "marker" (a
    package marker in a folder at or above the tests, restored only when the patch adds it)."""
    above_tests = {""}
    for path in protected | runner_files:
        parts = path.split("/")[:-1]
        above_tests.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    decides: dict[str, str] = {}
    for path in touched:
        folder, _, name = path.rpartition("/")
        if path in protected or TEST_PATH.search(path):
            decides[path] = "test"
        elif name in CONFIG_NAMES or path in runner_files:
            decides[path] = "config"
        elif name == "__init__.py" and folder in above_tests:
            decides[path] = "marker"
    return decides


def _inspect(
    container: Container, touched: list[str], base_commit: str, copy: list[str]
) -> tuple[dict[str, Entry], dict[str, tuple[bytes | None, bytes | None]]]:
    """Each touched path's kind (one exec, NUL-framed), and for ``copy`` its bytes now and at
    the base commit (None where there is no regular file), in one archive."""
    wanted = set(copy)
    listing = b"".join((b"C" if p in wanted else b"-") + p.encode("utf-8", "surrogateescape") + b"\0" for p in touched)
    script = (
        f"root=$(pwd -P); base={shlex.quote(base_commit)}; rm -rf {SCAN_DIR}; mkdir -p {SCAN_DIR}/new {SCAN_DIR}/base; i=0; "
        "while IFS= read -r -d '' rec; do flag=${rec:0:1}; p=${rec:1}; "
        'if [ -L "$p" ]; then printf "L\\0%s\\0%s\\0" "$p" "$(realpath -m -- "$p")"; '
        'elif [ -f "$p" ] && [ -x "$p" ]; then printf "X\\0%s\\0\\0" "$p"; '
        'elif [ -f "$p" ]; then printf "F\\0%s\\0\\0" "$p"; '
        'elif [ -d "$p" ]; then printf "D\\0%s\\0\\0" "$p"; '
        'elif [ -e "$p" ]; then printf "O\\0%s\\0\\0" "$p"; '
        'else printf "N\\0%s\\0\\0" "$p"; fi; '
        'if [ "$flag" = C ]; then '
        f'if [ -f "$p" ] && [ ! -L "$p" ]; then head -c {SCAN_CAP + 1} -- "$p" > {SCAN_DIR}/new/$i; fi; '
        f'git cat-file blob "$base:$p" > {SCAN_DIR}/base/$i 2>/dev/null || rm -f {SCAN_DIR}/base/$i; fi; '
        'i=$((i+1)); done; printf "R\\0%s\\0\\0" "$root"'
    )
    fields = container.sh(script, timeout_s=120, stdin=listing, env=GIT_ENV).stdout.split("\0")
    entries: dict[str, Entry] = {}
    root = ""
    for at in range(0, len(fields) - 2, 3):
        kind, path, target = fields[at : at + 3]
        if kind == "R":
            root = path
        elif kind in ("X", "F"):
            entries[path] = Entry(path, "F", executable=kind == "X")
        else:
            entries[path] = Entry(path, kind, target=target)
    if not root:
        raise RuntimeError("the inspection of the touched files printed no repository root")
    entries[""] = Entry("", "R", target=root)
    files = container.get_files(SCAN_DIR) if wanted else {}
    contents = {p: (files.get(f"new/{i}"), files.get(f"base/{i}")) for i, p in enumerate(touched) if p in wanted}
    return entries, contents


def _check_links_and_modes(
    container: Container, out: Applied, base_commit: str, entries: dict[str, Entry], decides: dict[str, str]
) -> None:
    root = entries[""].target
    for path in out.touched:
        entry = entries.get(path)
        if entry is None:
            raise RuntimeError(f"{path!r} is missing from the inspection of the touched files")
        if entry.kind == "L":
            target = entry.target
            if not (target == root or target.startswith(root + "/")) or (target + "/").startswith(root + "/.git/"):
                out.refused.append(f"{path}: a symlink to {target}, outside the repository or into .git")
            elif path in decides:
                out.refused.append(f"{path}: a symlink where the tests or their configuration are read")
            else:
                out.refused.append(
                    f"{path}: a symlink to {target} (a patch may write regular files only: a link shows the diff one file and Python another)"
                )
        elif entry.kind == "O":
            out.refused.append(f"{path}: not a regular file (a special file)")
    executable = [e.path for e in entries.values() if e.executable and e.path in out.touched]
    if not executable:
        return
    listing = _git(container, f"git ls-tree -z {shlex.quote(base_commit)} -- {' '.join(shlex.quote(p) for p in executable)}").stdout
    modes = {}
    for record in listing.split("\0"):
        meta, _, name = record.partition("\t")
        if name:
            modes[name] = meta.split(" ")[0]
    dropped = [p for p in executable if modes.get(p) != "100755"]
    if dropped:
        container.sh(f"chmod a-x -- {' '.join(shlex.quote(p) for p in dropped)}")
        out.neutralized += [f"{p}: made non-executable (the base commit has no such executable)" for p in dropped]


def _check_contents(
    out: Applied, entries: dict[str, Entry], contents: dict[str, tuple[bytes | None, bytes | None]], decides: dict[str, str]
) -> None:
    """The allowlist on the bytes the tree holds (``envs.allowlist``): every regular file the
    patch wrote that is not put back by bytes."""
    for path in out.touched:
        if path in decides or entries[path].kind != "F":
            continue
        new, old = contents.get(path, (None, None))
        if new is None:
            continue
        problems = content_problems(path, new[:SCAN_CAP], old, partial=len(new) > SCAN_CAP)
        if (problem := by_name_problem(path)) is not None:
            problems.append(problem)
        out.refused += [f"{path}: {problem}" for problem in problems]
        if (problem := new_top_level(path, base_has=old is not None)) is not None:
            out.suspicious.append(f"{path}: {problem}")  # marked: the runner's imports cannot all be listed


def _restore(
    container: Container, out: Applied, base_commit: str, decides: dict[str, str], contents: dict[str, tuple[bytes | None, bytes | None]]
) -> None:
    """Put back, by bytes, every touched file that decides the tests (one exec for all)."""
    chosen: list[str] = []
    for path, kind in decides.items():
        new, old = contents.get(path, (None, None))
        name = path.rpartition("/")[2]
        if kind == "marker":
            if old is not None:
                continue  # an existing package's __init__: package code, scanned like the rest
            out.suspicious.append(f"{path}: the patch adds a package marker above the tests (it would run before them on import)")
        elif kind == "config":
            if name in ALWAYS_SUSPICIOUS or name not in SECTIONED_CONFIG:
                if name != ".gitattributes":
                    out.suspicious.append(f"{path}: the patch changes the tests' configuration, plugins or runner")
            elif _section_changed(name, old, new):
                out.suspicious.append(
                    f"{path}: the patch changes a test framework's section (or a reading of it the framework may not share)"
                )
        chosen.append(path)
    if not chosen:
        return
    listing = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in chosen)
    script = (
        f"base={shlex.quote(base_commit)}; while IFS= read -r -d '' p; do rm -rf -- \"$p\" || exit 1; "
        'if git cat-file -e "$base:$p" 2>/dev/null; then git checkout -q "$base" -- "$p" || exit 1; fi; done'
    )
    container.sh(script, timeout_s=120, stdin=listing, env=GIT_ENV)
    out.restored += chosen


def _section_changed(name: str, old: bytes | None, new: bytes | None) -> bool:
    decode = lambda data: None if data is None else data.decode("utf-8", errors="replace")  # noqa: E731
    before, after = framework_sections(name, decode(old)), framework_sections(name, decode(new))
    return before is ... or after is ... or before != after or (new is not None and b"\r" in new)


def _scan(out: Applied, entries: dict[str, Entry], contents: dict[str, tuple[bytes | None, bytes | None]]) -> None:
    """The syntax-tree scan of every Python file the patch wrote and the restore kept, and of
    every other text file it wrote that parses as Python (``runpy``, ``exec`` run any file)."""
    for path in out.touched:
        if path in out.restored or entries[path].kind != "F":
            continue
        new, old = contents.get(path, (None, None))
        if new is None:
            continue
        python = bool(PYTHON_SOURCE.search(path))
        if len(new) > SCAN_CAP:
            if python:
                out.suspicious.append(f"{path}: over {SCAN_CAP >> 20} MiB of Python, too large to scan")
            continue
        out.suspicious += scan_source(path, new, old) if python else scan_text(path, new, old)
        if len(out.suspicious) >= SUSPICIOUS_CAP:
            out.suspicious = out.suspicious[:SUSPICIOUS_CAP] + ["(more findings not listed)"]
            return


def _numstat(output: str) -> list[tuple[bool, str]]:
    """(binary, path) of ``git apply --numstat -z``: ``added\\tdeleted\\tpath\\0``, or for a
    rename or copy ``added\\tdeleted\\t\\0from\\0to\\0``; a binary file counts ``-``."""
    fields = output.split("\0")
    records: list[tuple[bool, str]] = []
    i = 0
    while i < len(fields):
        record = fields[i]
        if not record:
            i += 1
            continue
        counts = record.split("\t", 2)
        binary = counts[0] == "-"
        if len(counts) == 3 and counts[2]:
            records.append((binary, counts[2]))
            i += 1
        else:
            records += [(binary, p) for p in fields[i + 1 : i + 3] if p]
            i += 3
    return records


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


def _git(container: Container, command: str, *, timeout_s: float = 60.0):  # noqa: ANN202 - ExecResult
    return container.exec(command, timeout_s=timeout_s, env=GIT_ENV, output_cap=16 << 20)


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no output"
