"""A lazy index over one JSON Lines file (plain or zstd): where each record is, plus a
small summary of it, so that nothing is parsed twice and a 100k pool opens at its first
record. ``records.pool_index`` says what is summarised for pools and reviews.

An index fills in a background thread (``start``) or in the caller's (``build``);
records are usable as soon as they are found, in file order. A finished index is saved
as ``.<file>.view-index.jsonl`` beside the file (or, where that folder is not writable,
in ``$RELEARN_CACHE/view``), keyed by the file's size and modification time; a file that
only grew since (records appended: same file, same first 64 KiB, same last indexed
record) is indexed from where the saved index stopped, anything else afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from records.byte_offsets import Checkpoint, DamagedFile, NeedsCopy, Ref, is_zstd, read_ref, scan_copy, scan_frames, scan_plain
from records.pools import RecordError

INDEX_VERSION = 2
HEAD_BYTES = 1 << 16  # checked, with the last indexed record, before a saved index is extended


def cache_root() -> Path:
    env = os.environ.get("RELEARN_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "relearn") / "view"


S = TypeVar("S")


class _Stopped(Exception):
    """Raised in the index thread once its owner called ``stop``."""


@dataclass(slots=True)
class Entry(Generic[S]):
    ref: Ref
    summary: S


class RecordIndex(Generic[S]):
    """Byte offsets and summaries of the records of one JSONL file (plain or zstd)."""

    kind: ClassVar[str] = "records"
    summary_type: ClassVar[type]

    def __init__(self, path: str | Path, *, cache: bool = True) -> None:
        self.path = Path(path)
        self.cache = cache
        self.entries: list[Entry[S]] = []
        self.errors: list[RecordError] = []  # bad records and a damaged file, located
        self.damaged = False
        self.mode = "frames" if is_zstd(self.path) else "plain"
        self.copy: Path | None = None  # plain copy of a zstd file with big frames
        self.loaded_from_cache = 0  # entries that came from a saved index
        self.ready = threading.Event()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self._checkpoint = Checkpoint()
        self._names = [f.name for f in fields(self.summary_type)]

    # -- what a subclass provides -------------------------------------------------
    def summarize(self, ref: Ref, data: bytes) -> S | None:
        raise NotImplementedError

    def added(self, position: int, entry: Entry[S]) -> None:
        """Hook: a new entry at ``position``."""

    # -- building ---------------------------------------------------------------
    def start(self) -> RecordIndex[S]:
        """Index in a background thread; entries appear as they are found."""
        self._thread = threading.Thread(target=self._run, name=f"index {self.path.name}", daemon=True)
        self._thread.start()
        return self

    def build(self) -> RecordIndex[S]:
        """Index in this thread, to the end of the file."""
        self._run()
        if self._failure is not None:
            raise self._failure
        return self

    def wait(self, count: int = 1, timeout: float | None = None) -> bool:
        """Until ``count`` entries exist or the index is finished; True if they exist."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.entries) >= count or self.ready.is_set(), timeout=timeout)
        return len(self.entries) >= count

    def stop(self) -> None:
        """End a background index early (its owner is done) and wait for its thread. A
        daemon thread still parsing when the interpreter exits aborts the process ("FATAL:
        exception not rethrown": pydantic-core's Rust frames do not survive the thread's
        forced unwind), so whoever ``start``s an index stops it before exiting. What was
        indexed stays usable; nothing is saved."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def join(self, timeout: float | None = None) -> None:
        self.ready.wait(timeout)
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            complete = self._load_cache() if self.cache else False
            if not complete:
                self._scan()
                if self.cache:
                    self._save_cache()
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            self._failure = exc
        finally:
            self.ready.set()
            with self._changed:
                self._changed.notify_all()

    def _append(self, ref: Ref, data: bytes) -> None:
        if self._stopping.is_set():
            raise _Stopped
        summary = self.summarize(ref, data)
        if summary is None:
            return
        entry = Entry(ref, summary)
        self.entries.append(entry)
        self.added(len(self.entries) - 1, entry)
        with self._changed:
            self._changed.notify_all()

    def _scan(self) -> None:
        progress = [self._checkpoint]
        try:
            with open(self.path, "rb") as handle:
                if self.mode == "plain":
                    for ref, data in scan_plain(handle, self._checkpoint, progress):
                        self._append(ref, data)
                elif self.mode == "frames":
                    try:
                        for ref, data in scan_frames(handle, self._checkpoint, progress):
                            self._append(ref, data)
                    except NeedsCopy:
                        self._restart_as_copy(handle, progress)
                else:  # a saved copy that must be redone: the file changed
                    self._restart_as_copy(handle, progress)
        except DamagedFile as exc:
            self.damaged = True
            self.errors.append(RecordError(str(self.path), None, None, f"damaged zstd file {exc}; records after it are not read"))
        self._checkpoint = progress[0]

    def _restart_as_copy(self, handle: Any, progress: list[Checkpoint]) -> None:
        # The frames cannot be entered in the middle: decompress once into a plain copy.
        self.entries.clear()
        self.errors.clear()
        self._reset()
        self.mode = "copy"
        self.copy = self._copy_path()
        self.copy.parent.mkdir(parents=True, exist_ok=True)
        handle.seek(0)
        progress[0] = Checkpoint()
        with open(self.copy, "wb") as copy:
            for ref, data in scan_copy(handle, copy, progress):
                self._append(ref, data)

    def _copy_path(self) -> Path:
        stat = self.path.stat()
        key = hashlib.sha256(f"{self.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        return cache_root() / f"{key}-{self.path.name.removesuffix('.zst')}"

    # -- reading ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        # An index is a handle, not a collection: `if index` must not depend on progress.
        return True

    def read(self, position: int) -> bytes:
        ref = self.entries[position].ref
        if self.mode == "copy":
            assert self.copy is not None
            return read_ref(self.copy, ref, frames=False)
        return read_ref(self.path, ref, frames=self.mode == "frames")

    # -- the saved index ----------------------------------------------------------
    def cache_paths(self) -> list[Path]:
        beside = self.path.with_name(f".{self.path.name}.view-index.jsonl")
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:16]
        return [beside, cache_root() / f"{digest}-{self.path.name}.view-index.jsonl"]

    def _row(self, summary: S) -> list[Any]:
        return [getattr(summary, name) for name in self._names]

    def _load_cache(self) -> bool:
        """Take a saved index; True when it covers the whole file as it is now.

        The saved index is JSON Lines (a header, then one entry per line) and is read as
        a stream, so the first entries are usable before the rest is read."""
        for path in self.cache_paths():
            try:
                handle = open(path, encoding="utf-8")
            except OSError:
                continue
            with handle:
                try:
                    saved = json.loads(handle.readline())
                except ValueError:
                    continue
                if (
                    not isinstance(saved, dict)
                    or saved.get("version") != INDEX_VERSION
                    or saved.get("kind") != self.kind
                    or saved.get("fields") != self._names
                ):
                    continue
                usable = self._usable(saved)
                if usable is None:
                    continue
                self.mode = saved["mode"]
                self.copy = Path(saved["copy"]) if saved.get("copy") else None
                self._checkpoint = Checkpoint(*saved["checkpoint"])
                try:
                    for text in handle:
                        row = json.loads(text)
                        entry = Entry(Ref(*row[:4]), self.summary_type(*row[4:]))
                        self.entries.append(entry)
                        self.added(len(self.entries) - 1, entry)
                        self._restore_error(entry)
                        if len(self.entries) % 256 == 1:
                            with self._changed:
                                self._changed.notify_all()
                except (ValueError, TypeError):
                    # A damaged saved index: forget it and index the file afresh.
                    self.entries.clear()
                    self.errors.clear()
                    self._checkpoint = Checkpoint()
                    self.mode = "frames" if is_zstd(self.path) else "plain"
                    self.copy = None
                    self._reset()
                    return False
                if len(self.entries) != saved["entries"]:
                    self.entries.clear()
                    self.errors.clear()
                    self._checkpoint = Checkpoint()
                    self._reset()
                    return False
            self.loaded_from_cache = len(self.entries)
            with self._changed:
                self._changed.notify_all()
            return usable
        return False

    def _reset(self) -> None:
        """Hook: forget what ``added`` recorded."""

    def _restore_error(self, entry: Entry[S]) -> None:
        """Hook: turn a saved bad record back into a located error."""

    def _usable(self, saved: dict[str, Any]) -> bool | None:
        """None: index afresh; True: complete as saved; False: resume from its checkpoint."""
        stat = self.path.stat()
        same = stat.st_size == saved["size"] and stat.st_mtime_ns == saved["mtime_ns"]
        if saved["mode"] == "copy":
            # A copy stands for the whole file as it was: reuse it only if nothing changed.
            copy = Path(saved["copy"]) if saved.get("copy") else None
            if not same or not saved["complete"] or copy is None or not copy.is_file() or copy.stat().st_size != saved["checkpoint"][0]:
                return None
            return True
        if same:
            return bool(saved["complete"])
        # Pools are appended to; anything else (a replaced file, a shorter one, a changed
        # head or last indexed record) is indexed afresh.
        if stat.st_ino != saved["inode"] or stat.st_size < saved["size"] or not saved.get("last"):
            return None
        try:
            data = read_ref(self.path, Ref(*saved["last"]), frames=saved["mode"] == "frames")
            head = _head_crc(self.path, min(HEAD_BYTES, saved["size"]))
        except Exception:  # noqa: BLE001 - any failure means: index afresh
            return None
        return False if zlib.crc32(data) == saved["last_crc"] and head == saved["head_crc"] else None

    def _save_cache(self) -> None:
        # Only what lies before the checkpoint is final; a torn last line is redone next time.
        final = [e for e in self.entries if e.ref.line <= self._checkpoint.line]
        if not final:
            return
        try:
            crc = zlib.crc32(self.read(len(final) - 1))
        except Exception:  # noqa: BLE001 - the file changed under us; do not save
            return
        stat = self.path.stat()
        complete = not self.damaged and (self.mode == "copy" or self._checkpoint.offset == stat.st_size)
        last = final[-1].ref
        header = {
            "version": INDEX_VERSION,
            "kind": self.kind,
            "path": str(self.path.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "complete": complete,
            "mode": self.mode,
            "copy": str(self.copy) if self.copy else None,
            "checkpoint": [self._checkpoint.offset, self._checkpoint.line],
            "last": [last.line, last.offset, last.skip, last.length],
            "last_crc": crc,
            "head_crc": _head_crc(self.path, min(HEAD_BYTES, stat.st_size)),
            "inode": stat.st_ino,
            "entries": len(final),
            "fields": self._names,
        }
        dump = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        lines = [dump(header)]
        lines += [dump([e.ref.line, e.ref.offset, e.ref.skip, e.ref.length, *self._row(e.summary)]) for e in final]
        text = "\n".join(lines) + "\n"
        for path in self.cache_paths():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)
                return
            except OSError:
                continue


def _head_crc(path: Path, size: int) -> int:
    with open(path, "rb") as handle:
        return zlib.crc32(handle.read(size))
