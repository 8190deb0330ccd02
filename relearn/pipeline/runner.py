"""Run stages in order, each only when its outputs are not current (make-style, with stamps).

A stage is current when its stamp (``WORKDIR/.pipeline/STAGE.json``) exists, the stamp's
fingerprint equals the hash of the stage's settings now, the stamp names the same runs of the
stages it needs as their own stamps do now, and every output it declares exists. So:

* rerunning a finished pipeline does nothing;
* deleting a stage's output redoes that stage, which gets a new run id, so every stage after
  it is stale and redone too, and nothing else;
* changing a stage's settings redoes it and what follows;
* a file a stage read that changed since (a grown import source, a hand-edited reviews file:
  its size or modification time, or for a folder the list of its files with theirs) redoes
  that stage and what follows, and the reason names the file.

A stage that stopped half-way (crash, Ctrl-C) has no stamp, and is run again on top of what it
left: every stage function resumes (collection by episode id, reviews by trajectory id, masks
by shard, training from its checkpoint, evaluation by instance). A stage that is stale because
its settings or inputs changed would resume *wrong* work, so its old outputs are first moved
to ``WORKDIR/.pipeline/stale/`` (never deleted: a training run may have cost GPU days).

One run at a time works in a work folder: a second ``relearn run`` on it is refused at once,
naming the holder (``workdir_lock``), since two runs would append the same pool and datasets
twice and move each other's outputs aside.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from records.pools import write_text_atomic
from relearn.ops.outputs import flocked
from relearn.ops.reporting import OpError, os_problem

STATE_DIR = ".pipeline"
LOCK_FILE = "lock"


@dataclass
class Stage:
    name: str
    describe: str  # what it does, one line for the progress log
    settings: dict[str, Any]  # everything that decides its outputs (not transport: URLs, keys)
    outputs: list[Path]  # must all exist for the stage to be current
    run: Callable[[], dict[str, Any]]  # does the work (resuming); returns counts for the report
    needs: tuple[str, ...] = ()
    # What a stale stage's rerun must not resume from: its whole work folder (checkpoints,
    # episodes, eval instances), not only the files that mark it finished. Default: outputs.
    workspace: list[Path] | None = None
    # Files or folders from outside the work folder that it reads (import sources, task files);
    # the outputs of the stages it needs are read too and need not be named.
    reads: list[Path] = field(default_factory=list)

    def fingerprint(self) -> str:
        # Unset options (None) do not count, so a new optional field does not make every
        # existing pipeline stale.
        return hashlib.sha256(json.dumps(_without_none(self.settings), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


@dataclass
class StageResult:
    name: str
    status: str  # "ran" | "current" | "failed"
    seconds: float = 0.0
    counts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    moved_aside: list[str] = field(default_factory=list)


def _stamp_path(workdir: Path, name: str) -> Path:
    return workdir / STATE_DIR / f"{name.replace(':', '-')}.json"


def read_stamp(workdir: Path, name: str) -> dict[str, Any] | None:
    path = _stamp_path(workdir, name)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def why_stale(stage: Stage, workdir: Path, reads: list[Path]) -> str | None:
    """None when the stage is current, else the reason it must run (``reads``: every path it
    reads, ``read_paths``)."""
    stamp = read_stamp(workdir, stage.name)
    if stamp is None:
        left = [path for path in (stage.workspace if stage.workspace is not None else stage.outputs) if path.exists()]
        return "resuming what an unfinished run left" if left else "not run before"
    if stamp.get("fingerprint") != stage.fingerprint():
        return "settings changed"
    for need in stage.needs:
        upstream = read_stamp(workdir, need)
        if upstream is None or stamp.get("inputs", {}).get(need) != upstream.get("run_id"):
            return f"{need} was redone"
    if "read" in stamp:  # (a stamp from before inputs were recorded is taken as it is)
        for path in reads:
            change = changed(stamp["read"].get(str(path)), signature(path))
            if change is not None:
                return f"{path} {change}"
    missing = [p for p in stage.outputs if not p.exists()]
    if missing:
        return f"output missing: {missing[0]}"
    return None


def read_paths(stage: Stage, stages: list[Stage]) -> list[Path]:
    """What ``stage`` reads: its own ``reads`` and the outputs of the stages it needs."""
    by_name = {other.name: other for other in stages}
    upstream = [path for need in stage.needs if need in by_name for path in by_name[need].outputs]
    return list(dict.fromkeys([*stage.reads, *upstream]))


def signature(path: Path) -> dict[str, Any] | None:
    """What a path is now, cheaply: a file's size and modification time; a folder's count and
    bytes of files, with a digest of each file's relative path, size and time (None: missing)."""
    try:
        if not path.is_dir():
            info = path.stat()
            return {"bytes": info.st_size, "mtime_ns": info.st_mtime_ns}
        digest, files, total = hashlib.sha256(), 0, 0
        for root, folders, names in os.walk(path):
            folders.sort()
            for name in sorted(names):
                info = os.stat(os.path.join(root, name))
                relative = os.path.relpath(os.path.join(root, name), path)
                digest.update(f"{relative}\0{info.st_size}\0{info.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
                files, total = files + 1, total + info.st_size
        return {"files": files, "bytes": total, "digest": digest.hexdigest()[:16]}
    except OSError:
        return None


def changed(before: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """How a path changed between two signatures, in words (None: it did not)."""
    if before == now:
        return None
    if now is None:
        return "is gone since this stage ran"
    if before is None:
        return "is new since this stage ran"
    if "files" in now and before.get("files") != now["files"]:
        return f"changed since this stage ran ({before.get('files', 0):,} files, now {now['files']:,})"
    if before.get("bytes") != now["bytes"]:
        return f"changed since this stage ran ({before.get('bytes', 0):,} bytes, now {now['bytes']:,})"
    return "was modified since this stage ran"


def _move_aside(stage: Stage, workdir: Path) -> list[str]:
    moved = []
    when = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    for output in stage.workspace if stage.workspace is not None else stage.outputs:
        if output.exists():
            target = workdir / STATE_DIR / "stale" / f"{stage.name.replace(':', '-')}.{when}" / output.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(output), str(target))
            moved.append(str(target))
    return moved


def value_text(value: Any) -> str:
    """A stage's count as a person reads it: no Python reprs (``exit_status submitted 12``,
    ``applied yes``), floats to four figures."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{key} {value_text(item)}" for key, item in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(value_text(item) for item in value) or "none"
    return str(value)


def counts_text(counts: dict[str, Any]) -> str:
    return "; ".join(f"{key} {value_text(value)}" for key, value in counts.items())


def stage_error(exc: Exception) -> str:
    """Why a stage failed, in one line without the exception's class where relearn worded it
    (a usage or input problem, a file-system error); an unforeseen one is named as a bug."""
    if isinstance(exc, OpError | RuntimeError | ValueError):
        return str(exc)
    if isinstance(exc, OSError):
        return os_problem(exc)
    return f"a bug in relearn ({type(exc).__name__}: {exc}); run again with --debug for the traceback and report it"


def workdir_lock(workdir: Path) -> AbstractContextManager[None]:
    """Hold ``workdir`` for this run, or raise ``OpError`` naming who holds it (``flocked``)."""
    (workdir / STATE_DIR).mkdir(parents=True, exist_ok=True)
    return flocked(
        workdir / STATE_DIR / LOCK_FILE,
        lambda holder: f"{workdir}: another relearn run is working in this folder ({holder}); wait for it to end or stop it",
    )


def run_stages(stages: list[Stage], workdir: Path, console: Console, *, dry_run: bool = False) -> list[StageResult]:
    """Run what is not current, in order; stop at the first stage that fails. A dry run reads
    the stamps only, so it takes no lock."""
    if workdir.exists() and not workdir.is_dir():
        raise OpError(f"{workdir}: the work folder is a file; give workdir a folder (new or one relearn run wrote)")
    with nullcontext() if dry_run else workdir_lock(workdir):
        return _run_stages(stages, workdir, console, dry_run=dry_run)


def _run_stages(stages: list[Stage], workdir: Path, console: Console, *, dry_run: bool) -> list[StageResult]:
    if not dry_run:  # a dry run writes nothing, not even the work folder
        (workdir / STATE_DIR).mkdir(parents=True, exist_ok=True)
    results: list[StageResult] = []
    would_run: set[str] = set()  # dry run: stages after one that would run would run too
    for number, stage in enumerate(stages, 1):
        reads = read_paths(stage, stages)
        # A dry run: a stage it needs would be redone, so what it reads would change anyway.
        redone = next((f"{need} would be redone" for need in stage.needs if need in would_run), None)
        reason = why_stale(stage, workdir, [] if redone else reads) or redone
        head = f"[bold]{number}/{len(stages)} {stage.name}[/bold]"
        if reason is None:
            stamp = read_stamp(workdir, stage.name) or {}
            console.print(f"{head}: current, skipped")
            results.append(StageResult(stage.name, "current", counts=stamp.get("counts", {})))
            continue
        console.print(f"{head}: {escape(stage.describe)} [dim]({escape(reason)})[/dim]")
        if dry_run:
            would_run.add(stage.name)
            results.append(StageResult(stage.name, "would run", error=reason))
            continue
        result = StageResult(stage.name, "ran")
        stamp_path = _stamp_path(workdir, stage.name)
        if stamp_path.exists():  # stale, not interrupted: its outputs belong to other settings or inputs
            result.moved_aside = _move_aside(stage, workdir)
            for path in result.moved_aside:
                console.print(f"  [dim]stale output moved to {escape(path)}[/dim]")
            stamp_path.unlink()
        started = time.monotonic()
        try:
            result.counts = stage.run()
        except Exception as exc:  # noqa: BLE001 - reported with the stage's name; later stages cannot run
            result.status, result.error = "failed", stage_error(exc)
            result.seconds = time.monotonic() - started
            results.append(result)
            console.print(f"  [red]failed:[/red] {escape(result.error or '')}", highlight=False)
            break
        result.seconds = time.monotonic() - started
        missing = [p for p in stage.outputs if not p.exists()]
        if missing:
            result.status, result.error = "failed", f"finished without writing {missing[0]}"
            results.append(result)
            console.print(f"  [red]failed:[/red] {escape(result.error or '')}", highlight=False)
            break
        stamp = {
            "stage": stage.name,
            "run_id": uuid.uuid4().hex,
            "fingerprint": stage.fingerprint(),
            "settings": stage.settings,
            "inputs": {need: (read_stamp(workdir, need) or {}).get("run_id") for need in stage.needs},
            "read": {str(path): signature(path) for path in reads},
            "counts": result.counts,
            "seconds": round(result.seconds, 2),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        write_text_atomic(stamp_path, json.dumps(stamp, indent=1, sort_keys=True, default=str))
        console.print(f"  done in {result.seconds:.1f} s: {escape(counts_text(result.counts))}", highlight=False)
        results.append(result)
    return results
