"""Where each record of a JSON Lines file starts, so one record can be read without
reading the ones before it: the index under ``relearn view`` and ``relearn stats``.

Plain files are indexed by byte offset. zstd files are indexed by frame: the pool
writer (``records.pools.JsonlWriter``) ends a frame at every record, so a record is read
by seeking to its frame and decompressing a few kilobytes. Frame boundaries are found
by walking the frame and block headers (RFC 8878), which costs no decompression.
A file with large frames that hold many records (``write_atomic`` writes one frame
for the whole file, as does the ``zstd`` command) cannot be entered in the middle, so
it is decompressed once, as it is scanned, into a plain copy in the cache folder and
indexed there (``NeedsCopy`` tells the caller to do that).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import zstandard

CHUNK = 4 << 20
# Frames up to this size (compressed or not) are entered directly; a bigger frame
# means the file was compressed in one go, and a plain copy is made instead.
FRAME_LIMIT = 8 << 20
ZSTD_MAGIC = 0xFD2FB528


@dataclass(frozen=True, slots=True)
class Ref:
    """One record: its 1-based line number (as errors name it) and where its bytes are."""

    line: int
    offset: int  # plain: byte offset of the line; zstd: offset of the frame the line starts in
    skip: int  # zstd: decompressed bytes from that frame's start to the line; 0 for plain
    length: int  # bytes of the line, newline excluded


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a scan can resume after the file grows: past the last complete line (and,
    for zstd, past the last frame that ended on a line boundary)."""

    offset: int = 0
    line: int = 0


class NeedsCopy(Exception):
    """The zstd file has a frame too big to enter in the middle."""


class DamagedFile(Exception):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"at byte {offset}: {message}")
        self.offset = offset


def is_zstd(path: str | Path) -> bool:
    return str(path).endswith(".zst")


def _lines(
    data: bytes, base: int, line: int, *, final: bool, start_ref: Callable[[int], tuple[int, int]]
) -> tuple[list[tuple[Ref, bytes]], int, int]:
    """Split ``data`` (which starts at stream position ``base``) into complete lines.

    Returns the non-blank lines, how many bytes were consumed (through the last newline,
    or everything when ``final``) and the last line number. ``start_ref`` turns a stream
    position into the (offset, skip) a Ref stores.
    """
    out: list[tuple[Ref, bytes]] = []
    pos = 0
    while True:
        newline = data.find(b"\n", pos)
        if newline < 0:
            if final and pos < len(data):
                line += 1
                text = data[pos:]
                if text.strip():
                    offset, skip = start_ref(base + pos)
                    out.append((Ref(line, offset, skip, len(text)), text))
                pos = len(data)
            return out, pos, line
        line += 1
        text = data[pos:newline]
        if text.strip():
            offset, skip = start_ref(base + pos)
            out.append((Ref(line, offset, skip, len(text)), text))
        pos = newline + 1


def _scan_chunks(chunks: Iterator[bytes], start: Checkpoint, progress: list[Checkpoint]) -> Iterator[tuple[Ref, bytes]]:
    """Lines of a byte stream that arrives in ``chunks`` from ``start``; ``progress[0]``
    follows the last complete line so the caller can persist it."""
    base, line, carry = start.offset, start.line, b""
    for chunk in itertools.chain(chunks, [b""]):  # the empty chunk flushes a last line without a newline
        data = carry + chunk
        found, used, line = _lines(data, base, line, final=not chunk, start_ref=lambda p: (p, 0))
        if chunk:
            progress[0] = Checkpoint(base + used, line)
        yield from found
        base += used
        carry = data[used:]


def _read_chunks(read: Callable[[int], bytes]) -> Iterator[bytes]:
    while chunk := read(CHUNK):
        yield chunk


def scan_plain(handle: IO[bytes], start: Checkpoint, progress: list[Checkpoint]) -> Iterator[tuple[Ref, bytes]]:
    """Lines of a plain byte stream from ``start``."""
    handle.seek(start.offset)
    return _scan_chunks(_read_chunks(handle.read), start, progress)


def frame_size(buffer: bytes, pos: int) -> tuple[int, bool] | None:
    """Compressed size of the zstd frame at ``pos`` and whether it is a skippable frame
    (no data), from its headers; None when ``buffer`` ends before the frame does."""
    end = len(buffer)
    if pos + 5 > end:
        return None
    magic = int.from_bytes(buffer[pos : pos + 4], "little")
    if 0x184D2A50 <= magic <= 0x184D2A5F:  # skippable frame: magic, size, payload
        if pos + 8 > end:
            return None
        size = 8 + int.from_bytes(buffer[pos + 4 : pos + 8], "little")
        return (size, True) if pos + size <= end else None
    if magic != ZSTD_MAGIC:
        raise DamagedFile(pos, "not a zstd frame")
    descriptor = buffer[pos + 4]
    single_segment = (descriptor >> 5) & 1
    content_size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    p = pos + 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3] + content_size_bytes
    while True:
        if p + 3 > end:
            return None
        block = int.from_bytes(buffer[p : p + 3], "little")
        kind, size = (block >> 1) & 3, block >> 3
        if kind == 3:
            raise DamagedFile(p, "reserved zstd block type")
        p += 3 + (1 if kind == 1 else size)  # an RLE block stores one byte
        if block & 1:
            break
    p += 4 if (descriptor >> 2) & 1 else 0  # content checksum
    return (p - pos, False) if p <= end else None


def scan_frames(handle: IO[bytes], start: Checkpoint, progress: list[Checkpoint]) -> Iterator[tuple[Ref, bytes]]:
    """Lines of a zstd file made of small frames, each Ref pointing at the frame its
    line starts in. Raises NeedsCopy at the first frame over FRAME_LIMIT."""
    handle.seek(start.offset)
    buffer, buffer_at, pos = b"", start.offset, 0  # buffer[0] is at file offset buffer_at
    line = start.line
    carry = b""  # decompressed bytes of a line whose end is in a later frame
    carry_ref = (start.offset, 0)  # where that line starts: (frame offset, skip)
    decompressor = zstandard.ZstdDecompressor()
    eof = False
    while True:
        found_frame = frame_size(buffer, pos)
        if found_frame is None:
            if len(buffer) - pos > FRAME_LIMIT + 64:
                raise NeedsCopy  # the frame did not end within the limit
            if eof:
                if pos < len(buffer):
                    raise DamagedFile(buffer_at + pos, "the last zstd frame is cut short")
                break
            chunk = handle.read(CHUNK)
            eof = not chunk
            buffer, buffer_at, pos = buffer[pos:] + chunk, buffer_at + pos, 0
            continue
        size, skippable = found_frame
        frame_at = buffer_at + pos
        frame = buffer[pos : pos + size]
        pos += size
        if skippable:
            continue
        try:
            data = decompressor.decompressobj().decompress(frame)
        except zstandard.ZstdError as exc:
            raise DamagedFile(frame_at, f"not a readable zstd frame: {exc}") from None
        if len(data) > FRAME_LIMIT and data.count(b"\n") > 1:
            raise NeedsCopy
        base = len(carry)

        def where(p: int, frame_at: int = frame_at, base: int = base, first: tuple[int, int] = carry_ref) -> tuple[int, int]:
            # Only the carried line starts before this frame; it is read from its own frame on.
            return first if p < base else (frame_at, p - base)

        combined = carry + data
        found, used, line = _lines(combined, 0, line, final=False, start_ref=where)
        yield from found
        carry_ref = where(used)
        carry = combined[used:]
        if not carry:
            progress[0] = Checkpoint(buffer_at + pos, line)
    if carry.strip():
        line += 1
        yield Ref(line, carry_ref[0], carry_ref[1], len(carry)), carry


def scan_copy(handle: IO[bytes], copy: IO[bytes], progress: list[Checkpoint]) -> Iterator[tuple[Ref, bytes]]:
    """Decompress a whole zstd file into ``copy`` while indexing the copy's lines."""
    reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True, closefd=False)

    def copied() -> Iterator[bytes]:
        while True:
            try:
                chunk = reader.read(CHUNK)
            except zstandard.ZstdError as exc:
                raise DamagedFile(handle.tell(), f"not a readable zstd stream: {exc}") from None
            if not chunk:
                return
            copy.write(chunk)
            copy.flush()  # a Ref is handed out only once its bytes can be read back
            yield chunk

    return _scan_chunks(copied(), Checkpoint(0, 0), progress)


def read_ref(path: Path, ref: Ref, *, frames: bool) -> bytes:
    """The bytes of one record."""
    with open(path, "rb") as raw:
        raw.seek(ref.offset)
        if not frames:
            return raw.read(ref.length)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        stream = io.BufferedReader(reader)  # type: ignore[arg-type]
        if ref.skip:
            stream.read(ref.skip)
        return stream.read(ref.length)
