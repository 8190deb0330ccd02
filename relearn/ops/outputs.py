"""Outputs that cannot destroy data: what a verb may write over, checked before it writes.

A verb's output that already exists must be what that verb writes: a pool it appends to must be
a pool (JSON Lines of trajectories), a dataset folder must be one `relearn masks` wrote, and so
on. Anything else (a JSON document, a binary file, someone's folder) is refused with ``OpError``
naming it, before a byte is written. The checks read a few lines or a folder listing, never a
whole file. Whole files are written to a temporary file and renamed
(``records.pools.write_atomic``); pools, reviews and verdicts are appended and flushed, which is
how a rerun resumes.

Also here: the one wording of a run that matched nothing (an empty pool, reviews of another
pool), which the front-ends turn into a warning and exit 1.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import zstandard

from records.pools import is_zstd, loads, open_bytes_read
from relearn.ops.reporting import OpError, Reporter

# A line longer than this is not parsed: only its first character is looked at.
SNIFF_LINE_BYTES = 64 << 20
SNIFF_LINES = 5  # a torn or damaged line is skipped; the first readable of these decides


@dataclass(frozen=True)
class JsonlKind:
    """What the lines of one kind of JSON Lines file are: a JSON object with ``keys`` and
    without ``foreign`` (an export's rows carry no ``schema_version``: a line with one is a
    relearn record, e.g. a pool, that a rewrite must never replace)."""

    name: str  # in messages: "a pool of trajectories"
    keys: frozenset[str]
    foreign: frozenset[str] = frozenset()


RELEARN_RECORD = frozenset({"schema_version"})  # every trajectory, review and verdict line has it
POOL = JsonlKind("a pool of trajectories", frozenset({"messages"}))
REVIEWS = JsonlKind("a reviews file", frozenset({"trajectory_id", "decision"}))
VERDICTS = JsonlKind("a verdicts file", frozenset({"instance_id", "patch_hash", "resolved"}))
HF_ROWS = JsonlKind("an hf export (rows of id, messages)", frozenset({"id", "messages"}), RELEARN_RECORD)
CHAT_ROWS = JsonlKind("a chat export (JSON Lines of rows)", frozenset(), RELEARN_RECORD)
SPANS = JsonlKind("a spans export (rows of sample_id, token_spans)", frozenset({"sample_id", "token_spans"}), RELEARN_RECORD)

NEW_FILE_HINT = "give a new file name or remove it"
NEW_FOLDER_HINT = "give a new or empty folder"


def prepare_parent(path: Path, reporter: Reporter) -> None:
    """Create the folder an output file goes into, and say so (a mistyped folder is then seen)."""
    parent = path.parent
    if parent.is_dir():
        return
    if parent.exists():
        raise OpError(f"{parent}: not a folder, so {path} cannot be written there")
    parent.mkdir(parents=True)
    reporter.note(f"created the folder {parent}")


def check_jsonl_output(path: Path, kind: JsonlKind, *, flag: str = "-o") -> None:
    """Refuse ``path`` unless it does not exist yet, is empty, or is JSON Lines of ``kind``
    (the first readable line of its first few is a JSON object with the kind's keys)."""
    if not path.exists():
        return
    if path.is_dir():
        raise OpError(f"{flag} {path}: is a folder, not {kind.name}; {NEW_FILE_HINT}")
    if not path.is_file():
        raise OpError(f"{flag} {path}: is not a regular file; {NEW_FILE_HINT}")
    problem = _jsonl_problem(path, kind)
    if problem is not None:
        raise OpError(f"{flag} {path}: exists and is not {kind.name} ({problem}); {NEW_FILE_HINT}")


def _jsonl_problem(path: Path, kind: JsonlKind) -> str | None:
    """Why ``path`` is not JSON Lines of ``kind``, or None when it is (or is empty)."""
    try:
        with open_bytes_read(path) as handle:
            head = handle.read(8192)
            if not head.strip():
                return None
            if b"\0" in head:
                return "binary data"
            rest = handle.readline(SNIFF_LINE_BYTES)
            data = head + rest
            lines = [line for line in data.split(b"\n") if line.strip()]
            # More lines when the first few fit in what was read; a long line is read whole above.
            while len(lines) < SNIFF_LINES:
                more = handle.readline(SNIFF_LINE_BYTES)
                if not more:
                    break
                if more.strip():
                    lines.append(more)
    except zstandard.ZstdError as exc:
        return f"not a zstd stream: {exc}"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    seen = 0
    for line in lines[:SNIFF_LINES]:
        seen += 1
        try:
            record = loads(line)
        except ValueError:  # (JSONDecodeError, UnicodeDecodeError)
            continue  # a torn or damaged line: the next one decides
        if not isinstance(record, dict):
            return f"line {seen} is a JSON {type(record).__name__}, not an object"
        missing = sorted(kind.keys - record.keys())
        if missing:
            return f"line {seen} has no {', '.join(missing)}"
        if kind.foreign & record.keys():
            return f"line {seen} is a relearn record ({', '.join(sorted(kind.foreign & record.keys()))})"
        return None
    if len(lines) == 1 and lines[0].lstrip().startswith(b"{") and not data.endswith(b"\n") and not is_zstd(path):
        return None  # one record cut by a crash mid-write: the append goes on after it
    try:
        (head + rest).decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    try:
        loads(data)  # parses only when ``data`` is the whole file
    except ValueError:
        return "its first lines are not JSON"
    return "a JSON document, not JSON Lines"


KNOWN_INPUTS = (POOL, REVIEWS, VERDICTS)


def check_jsonl_input(path: Path, kind: JsonlKind, *, flag: str) -> None:
    """Refuse an input that is plainly another of relearn's files (a reviews file given as the
    pool, a pool as the reviews: swapped arguments) before anything is written. Only its first
    readable record is looked at; a file that is merely damaged is left to the reader, which
    locates and counts each bad line."""
    record = _first_record(path)
    if record is None or kind.keys <= record.keys():
        return
    other = next((known for known in KNOWN_INPUTS if known is not kind and known.keys <= record.keys()), None)
    if other is not None:
        raise OpError(f"{flag} {path}: is {other.name}, not {kind.name}; check the order of the arguments")


def _first_record(path: Path) -> dict[str, object] | None:
    """The first of a file's first lines that is a JSON object (None: none is, or it cannot be read)."""
    if not path.is_file():
        return None
    try:
        with open_bytes_read(path) as handle:
            for _ in range(SNIFF_LINES):
                line = handle.readline(SNIFF_LINE_BYTES)
                if not line:
                    break
                try:
                    record = loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    return record
    except (zstandard.ZstdError, OSError):
        return None
    return None


def check_not_an_input(output: Path, inputs: list[Path], *, flag: str = "-o") -> None:
    """An output that is also one of the files read: it would be read while it is written."""
    if output.is_file() and any(path.is_file() and path.samefile(output) for path in inputs):
        raise OpError(f"{flag} {output}: is also one of the inputs; give another file")


def check_dataset_dir(path: Path, *, flag: str = "-o") -> None:
    """Refuse ``path`` unless it does not exist, is an empty folder, or is a dataset folder
    `relearn masks` wrote (its stats.json, or the shards of an interrupted run). Shards a
    dataset folder holds past the pool's end are deleted by the compile: never someone's files."""
    if not path.exists():
        return
    if not path.is_dir():
        raise OpError(f"{flag} {path}: is a file, not a dataset folder; {NEW_FOLDER_HINT}")
    names = {p.name for p in path.iterdir()}
    if not names or _masks_stats(path / "stats.json"):
        return
    if names and all(n.startswith("shard-") or n.startswith(".") for n in names):
        if any(n.endswith(".stats.json") for n in names) or any(_is_shard(path / n) for n in sorted(names) if n.endswith(".parquet")):
            return  # an interrupted run: its finished shards, no stats.json yet
    raise OpError(f"{flag} {path}: a folder `relearn masks` did not write (no dataset stats.json); {NEW_FOLDER_HINT}")


def _is_shard(path: Path) -> bool:
    """A Parquet file with a dataset shard's columns: a run stopped between its first shard and
    that shard's stats.json left only this."""
    import pyarrow.parquet as pq

    try:
        return {"sample_id", "input_ids", "loss_mask"} <= set(pq.read_schema(path).names)
    except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
        return False


def _masks_stats(path: Path) -> bool:
    data = _json_document(path)
    return isinstance(data, dict) and {"mode", "shards", "trajectories_in"} <= data.keys()


def _json_document(path: Path) -> object:
    """A whole JSON file, or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def check_export_dir(path: Path, *, overwrite: bool, flag: str = "-o") -> None:
    """``relearn export dataset``: an existing output is replaced whole, so it must be one
    that command wrote (its relearn-export.json), and only with ``overwrite``."""
    if not path.exists():
        return
    if not path.is_dir():
        raise OpError(f"{flag} {path}: is a file, not an export folder; {NEW_FOLDER_HINT}")
    if not (path / "relearn-export.json").is_file() and any(path.iterdir()):
        raise OpError(
            f"{flag} {path}: a folder `relearn export dataset` did not write (no relearn-export.json), never replaced; {NEW_FOLDER_HINT}"
        )
    if not overwrite:
        raise OpError(f"{flag} {path}: exists; pass --overwrite to replace it")


def check_run_dir(path: Path, markers: tuple[str, ...], verb: str, *, flag: str = "--out") -> None:
    """A run folder a verb creates or resumes (train, collect, eval, analyze): new, empty, or
    holding one of the files that verb writes there (``markers``), so it never writes its
    checkpoints, pool or reports among someone else's files."""
    if not path.exists():
        return
    if not path.is_dir():
        raise OpError(f"{flag} {path}: is a file, not a run folder; {NEW_FOLDER_HINT}")
    if any((path / marker).exists() for marker in markers) or not any(path.iterdir()):
        return
    raise OpError(f"{flag} {path}: a folder `{verb}` did not write (no {' or '.join(markers)}); {NEW_FOLDER_HINT}")


def check_atif_dir(path: Path, *, flag: str = "-o") -> None:
    """``relearn export atif``: a folder of ``<id>.trajectory.json`` files, or a new or empty one."""
    if not path.exists():
        return
    if not path.is_dir():
        raise OpError(f"{flag} {path}: exists and is not a folder (the ATIF export writes one file per trajectory into a folder)")
    foreign = sorted(p.name for p in path.iterdir() if not p.name.endswith(".trajectory.json") and not p.name.startswith("."))
    if foreign:
        raise OpError(f"{flag} {path}: holds files that are not ATIF trajectories (e.g. {foreign[0]}); {NEW_FOLDER_HINT}")


def check_parquet_output(path: Path, *, flag: str = "-o") -> None:
    """An existing file replaced by a Parquet file must be one (its magic bytes)."""
    if not path.exists():
        return
    if not path.is_file():
        raise OpError(f"{flag} {path}: is not a file; {NEW_FILE_HINT}")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic and magic != b"PAR1":
        raise OpError(f"{flag} {path}: exists and is not a Parquet file; {NEW_FILE_HINT}")


def check_json_output(path: Path, keys: frozenset[str], what: str, *, flag: str) -> None:
    """An existing JSON document replaced whole must be one this verb wrote (these keys)."""
    if not path.exists():
        return
    if not path.is_file():
        raise OpError(f"{flag} {path}: is not a file; {NEW_FILE_HINT}")
    data = _json_document(path)
    if not (isinstance(data, dict) and keys <= data.keys()):
        raise OpError(f"{flag} {path}: exists and is not {what}; {NEW_FILE_HINT}")


# ---------------------------------------------------------------- runs that matched nothing


def empty_pool(path: Path) -> str:
    return f"the pool {path} is empty: nothing to do"


def reviews_of_another_pool(reviews: Path, pool: Path | str, count: int) -> str:
    return f"none of the {count} reviews in {reviews} is of a trajectory in {pool}: are they another pool's reviews?"


def dataset_of_another_pool(dataset: Path, pool: Path | str, count: int) -> str:
    return f"none of the {count} trajectories of the dataset {dataset} is in {pool}: is it another pool's dataset?"


@contextmanager
def flocked(path: Path, busy: Callable[[str], str], *, folder: bool = False) -> Iterator[None]:
    """Hold the kernel's ``flock`` on ``path`` (a file, made if it is new, or a ``folder``) while
    the block runs, or raise ``OpError(busy(holder))`` at once. A process that is killed leaves
    no lock behind, and no file appears for it; a folder on a network file system may not
    honour it."""
    try:
        if folder:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OpError(busy(lock_holder(fd))) from None
        yield
    finally:
        os.close(fd)


def output_lock(output: Path, *, folder: bool = False) -> AbstractContextManager[None]:
    """One writer at a time for an output that is appended to (a pool, a reviews file) or
    written in parts (a dataset ``folder``): two imports into one pool would each append what
    the other had not yet written. The lock is on the output itself (made here if it is new:
    the command writes it next), so no file appears beside it."""
    return flocked(
        output, lambda holder: f"{output}: another relearn command is writing it ({holder}); wait for it to end or stop it", folder=folder
    )


def lock_holder(fd: int) -> str:
    """Who holds the flock on ``fd``'s file, as /proc/locks tells it (Linux), in words."""
    info = os.fstat(fd)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
                    return f"pid {fields[4]} on {socket.gethostname()}"
    except OSError:
        pass
    return "another process"
