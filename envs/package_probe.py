"""Finding the package under test at the base commit, for the canary (``envs.canary``).

Before the candidate patch goes in, the container holds the base code: a small
verifier-owned script runs there, in the task's environment (the eval script's ``source``,
``conda activate``, ``cd`` and ``export`` lines, as the test run has them: SWE-bench images
install the repository into that environment), finds the repository's top-level packages
(``NAME/__init__.py`` at the root, under ``src/`` or under ``lib/``), picks the one the
canary's test file imports most (else the only one), imports it and lists its public
functions and classes that the repository itself defines, with facts no fix changes: whether
each is a class, and its ``__name__``. The names the test file imports from the package come
first.

The result is cached per (image digest, work directory, environment lines, test file,
imports): in this process (a lock per key, so two workers that start together do not both
probe), and under the relearn cache (``$RELEARN_CACHE/package_probe/``) for an image named by
its digest, which no one can change, so that a batch grading many patches of one task, and
the next batch over the same images, probe once. Any failure (no package, an import error at the base, a
timeout) is a reason, and the canary then uses builtins only; the verdict says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from envs.canary import Member, PackageFacts
from envs.docker_backend import Container
from envs.images import relearn_cache

MARKER = "relearn-package-probe: "
PROBE_TIMEOUT_S = 120.0
MAX_MEMBERS = 40
IMPORT_LINE = re.compile(r"^\+[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import[ \t]+\(?([\w, \t]+)|import[ \t]+([\w., \t]+))", re.M)

# Runs in the task's Python (3.5 and later: no f-strings). argv: work directory, the test
# file (repository-relative, "" when none), JSON of the test patch's import lines. Prints one
# JSON line after MARKER: {"package", "members": [[attribute, is_class, name]], "imported"}
# or {"error"}. Writes no bytecode (python -B) and nothing in the repository.
PROBE = r"""
import importlib, json, os, re, sys, types, warnings
MARKER = __MARKER__
SKIP = {"test", "tests", "testing", "doc", "docs", "example", "examples", "benchmark", "benchmarks",
        "bench", "script", "scripts", "tools", "tool", "ci", "build", "dist", "conftest", "setup", "extern"}

def say(value):
    sys.stdout.write("\n" + MARKER + json.dumps(value) + "\n")
    sys.stdout.flush()

def imports(text):
    counts, members = {}, {}
    for m in re.finditer(r"^[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import[ \t]+\(?([\w, \t]+)|import[ \t]+([\w., \t]+))", text, re.M):
        if m.group(1):
            top = m.group(1).split(".")[0]
            counts[top] = counts.get(top, 0) + 1
            if "." not in m.group(1):
                for part in m.group(2).split(","):
                    word = part.split()[0] if part.split() else ""
                    if word.isidentifier():
                        members.setdefault(top, []).append(word)
        else:
            for part in m.group(3).split(","):
                top = part.split()[0].split(".")[0] if part.split() else ""
                if top:
                    counts[top] = counts.get(top, 0) + 1
    return counts, members

def main():
    workdir, target, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    os.chdir(workdir)
    found = []
    for prefix in ("", "src", "lib"):
        folder = os.path.join(workdir, prefix)
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.isidentifier() and entry.lower() not in SKIP and os.path.isfile(os.path.join(folder, entry, "__init__.py")):
                if entry not in [f[0] for f in found]:
                    found.append((entry, prefix))
    if not found:
        return say({"error": "no package (NAME/__init__.py at the root, under src/ or lib/) in the repository"})
    text = ""
    if target:
        try:
            with open(os.path.join(workdir, target), "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            pass
    counts, members = imports(text + "\n" + "\n".join(extra))
    ranked = sorted((f for f in found if counts.get(f[0])), key=lambda f: -counts[f[0]])
    if ranked:
        name, prefix = ranked[0]
    elif len(found) == 1:
        name, prefix = found[0]
    else:
        return say({"error": "the test file imports none of the repository's packages (%s)" % ", ".join(f[0] for f in found)})
    if prefix:
        sys.path.insert(0, os.path.join(workdir, prefix))
    try:
        module = importlib.import_module(name)
    except BaseException as exc:
        return say({"error": "importing %s at the base commit failed (%s: %s)" % (name, type(exc).__name__, str(exc)[:200])})
    public = getattr(module, "__all__", None)
    if not isinstance(public, (list, tuple)) or not all(isinstance(n, str) for n in public):
        public = [n for n in dir(module) if not n.startswith("_")]
    owners = set(f[0] for f in found)
    wanted = [n for n in members.get(name, []) if not n.startswith("_")]
    out, imported = [], 0
    for attribute in list(dict.fromkeys(wanted + [n for n in public if not n.startswith("_")])):
        if len(out) >= __LIMIT__:
            break
        # Only what the module itself holds, read without a warning: a name its __getattr__
        # serves may warn (a deprecation), and a test run with warnings as errors would fail.
        if attribute not in vars(module):
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = getattr(module, attribute)
                label = getattr(value, "__name__", None)
            except BaseException:
                continue
        if caught:
            continue
        if not isinstance(value, (type, types.FunctionType)):
            continue
        owner = (getattr(value, "__module__", None) or "").split(".")[0]
        if owner not in owners or not isinstance(label, str) or not label.isidentifier():
            continue
        out.append([attribute, isinstance(value, type), label])
        imported += attribute in wanted
    if not out:
        return say({"error": "%s has no public function or class of its own at its top level" % name})
    say({"package": name, "members": out, "imported": imported})

try:
    main()
except BaseException as exc:
    say({"error": "the probe failed (%s: %s)" % (type(exc).__name__, str(exc)[:200])})
""".replace("__MARKER__", repr(MARKER)).replace("__LIMIT__", str(MAX_MEMBERS))


@dataclass(frozen=True)
class Probe:
    """The package canary's facts, or why there are none (``facts`` is None)."""

    facts: PackageFacts | None
    reason: str = ""
    probed: bool = False  # this call ran the probe (False: the cache answered)
    deterministic: bool = True  # the probe's own answer, which a rerun gives again (False: a timeout, no result)


PROBE_ID = hashlib.sha256(PROBE.encode()).hexdigest()[:16]  # a changed probe is a new key
_CACHE: dict[tuple[str, ...], Probe] = {}
_LOCKS: dict[tuple[str, ...], threading.Lock] = {}
_GUARD = threading.Lock()


def test_patch_imports(test_patch: str) -> list[str]:
    """The import lines the test patch adds (the test file may not exist at the base)."""
    return [m.group(0)[1:].strip() for m in IMPORT_LINE.finditer(test_patch)][:200]


def probe_package(
    container: Container, *, image_key: str, workdir: str, environment: list[str], target: str | None, test_patch: str
) -> Probe:
    """The package under test at the base commit (call before the candidate is applied), run after
    ``environment``, the eval script's environment lines (``Phases.environment``)."""
    hints = test_patch_imports(test_patch)
    key = (image_key, workdir, "\n".join(environment), target or "", json.dumps(hints))
    with _GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        cached = _CACHE.get(key) or _read_saved(key)
        if cached is not None:
            _CACHE[key] = cached
            return Probe(cached.facts, cached.reason, probed=False)
        result = _run(container, workdir, environment, target, hints)
        _CACHE[key] = result
        _save(key, result)
        return result


def _saved_path(key: tuple[str, ...]) -> Path | None:
    """Where a probe of an image named by its digest is kept (a tag can move: not kept)."""
    if not key[0].startswith("sha256:"):
        return None
    digest = hashlib.sha256(json.dumps([PROBE_ID, *key]).encode()).hexdigest()
    return relearn_cache() / "package_probe" / f"{digest}.json"


def _read_saved(key: tuple[str, ...]) -> Probe | None:
    path = _saved_path(key)
    if path is None or not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        facts = saved["facts"]
        if facts is None:
            return Probe(None, str(saved["reason"]))
        members = tuple(Member(str(a), bool(c), str(n)) for a, c, n in facts["members"])
        return Probe(PackageFacts(str(facts["package"]), members, int(facts["imported"])), str(saved["reason"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # probed again, and written anew


def _save(key: tuple[str, ...], probe: Probe) -> None:
    """Kept across processes (the next batch over the same images, the workers of a node):
    what the probe found, or the probe's own verdict that there is nothing (an import error at
    the base); never a timeout or an unreadable run, which may not recur."""
    path = _saved_path(key)
    if path is None or (probe.facts is None and not probe.deterministic):
        return
    facts = probe.facts
    record = {
        "facts": None
        if facts is None
        else {"package": facts.package, "members": [[m.attribute, m.is_class, m.name] for m in facts.members], "imported": facts.imported},
        "reason": probe.reason,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            handle.write(json.dumps(record))
        os.replace(handle.name, path)
    except OSError:
        pass  # a cache that cannot be written costs a probe next time, nothing else


def _run(container: Container, workdir: str, environment: list[str], target: str | None, hints: list[str]) -> Probe:
    python = 'relearn_py=$(command -v python3 || command -v python) && exec "$relearn_py" -B - '
    argv = " ".join(shlex.quote(a) for a in (workdir, target or "", json.dumps(hints)))
    command = "\n".join([*environment, f"cd {shlex.quote(workdir)}", python + argv])
    result = container.exec(["bash", "-c", command], timeout_s=PROBE_TIMEOUT_S, stdin=PROBE.encode(), output_cap=1 << 20)
    if result.timed_out:
        return Probe(None, f"the probe of the package under test timed out after {PROBE_TIMEOUT_S:.0f} s", probed=True, deterministic=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith(MARKER)]
    if not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return Probe(
            None,
            f"the probe of the package under test printed no result (exit status {result.exit_code}: {tail[0][:200]})",
            probed=True,
            deterministic=False,
        )
    try:
        found = json.loads(lines[-1].removeprefix(MARKER))
        if "error" in found:
            return Probe(None, str(found["error"]), probed=True)
        members = tuple(Member(str(a), bool(c), str(n)) for a, c, n in found["members"])
        return Probe(PackageFacts(str(found["package"]), members, int(found["imported"])), probed=True)
    except (ValueError, KeyError, TypeError) as exc:
        return Probe(None, f"the probe's result could not be read ({type(exc).__name__}: {exc})", probed=True, deterministic=False)
