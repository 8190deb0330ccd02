"""Codex CLI's ``apply_patch`` patch format: the grammar and its parser, in pure Python.

The format (Codex's freeform tool, Lark grammar ``tool_apply_patch.lark``, parser
``codex-rs/apply-patch/src/parser.rs``)::

    *** Begin Patch
    *** Environment ID: <name>          (optional, ignored)
    *** Add File: path/new.py
    +line 1
    *** Delete File: path/old.py
    *** Update File: path/file.py
    *** Move to: path/renamed.py        (optional)
    @@ def foo():                       (optional header; several may be stacked)
     context line
    -removed line
    +added line
    *** End of File                     (optional: the hunk matches at the end of the file)
    *** End Patch

``parse_patch`` turns patch text into file operations, or a ``PatchError`` naming the patch
line; ``harness.tools.apply_patch`` applies them. Error texts are Codex's own where Codex has
one (``Invalid patch: ...``, ``Invalid patch hunk on line N: ...``), and lines are counted as
Codex counts them: the ``*** Begin Patch`` line is line 1.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from harness.tools.patch_heredoc import split_heredoc

BEGIN_PATCH = "*** Begin Patch"
END_PATCH = "*** End Patch"
END_OF_FILE = "*** End of File"
ENVIRONMENT_ID = "*** Environment ID:"
MOVE_TO = "*** Move to:"

_FILE_MARKER = re.compile(r"^\*\*\* (Add|Delete|Update) File:(.*)$")
# "@@ -12,7 +12,8 @@ tail": models sometimes copy unified-diff headers; the numbers mean nothing here.
_RANGE_HEADER = re.compile(r"^-\d+(?:,\d+)?\s+\+\d+(?:,\d+)?\s*@@(.*)$")
_WINDOWS_ABSOLUTE = re.compile(r"^[A-Za-z]:[\\/]")
_VALID_HEADERS = "'*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"
FIRST_LINE = f"Invalid patch: The first line of the patch must be '{BEGIN_PATCH}'"
LAST_LINE = f"Invalid patch: The last line of the patch must be '{END_PATCH}'"
QUOTE_LIMIT = 200  # characters of one line quoted in an error message
_NAME_MAX, _PATH_MAX = 255, 4096  # Linux limits, in bytes: longer paths cannot be written anyway


class PatchError(Exception):
    """A patch that cannot be parsed or applied. ``str(err)`` is written for the model to read.

    ``line`` is the patch line (the ``*** Begin Patch`` line is 1) and ``path`` the file
    concerned, when known. ``applied`` holds the changes of the operations before the one that
    failed, when the patch was applied with Codex's semantics (they are to be written).
    """

    def __init__(self, message: str, *, line: int | None = None, path: str | None = None, applied: list | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.path = path
        self.applied = applied or []


@dataclass(frozen=True)
class Chunk:
    """One ``@@`` hunk of an Update File. ``lines`` holds (' ' | '-' | '+', text) pairs."""

    headers: tuple[str, ...]
    lines: tuple[tuple[str, str], ...]
    end_of_file: bool
    line: int  # patch line where the hunk starts (its first @@ or first change line)


@dataclass(frozen=True)
class AddFile:
    path: str
    content: str
    line: int


@dataclass(frozen=True)
class DeleteFile:
    path: str
    line: int


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_to: str | None
    chunks: tuple[Chunk, ...]
    line: int


PatchOp = AddFile | DeleteFile | UpdateFile


def parse_patch(text: str) -> list[PatchOp]:
    """Parse patch text into file operations; raise PatchError naming the patch line.

    Also accepts the patch wrapped in a heredoc (``<<'EOF'`` ... ``EOF``, with or without a
    leading ``apply_patch``), as Codex's lenient mode does. Checks paths, not files.
    """
    if not isinstance(text, str):
        raise PatchError(f"the patch must be text, got {type(text).__name__}")
    lines = _split_lines(text)
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise PatchError(FIRST_LINE, line=1)
    if lines[first].strip() != BEGIN_PATCH:
        wrapped = split_heredoc(text, require_command=False)
        if wrapped is not None and wrapped.body.strip():
            return _parse_lines(_split_lines(wrapped.body))
        raise PatchError(FIRST_LINE, line=1)
    return _parse_lines(lines)


def _split_lines(text: str) -> list[str]:
    # Split on "\n" only (str.splitlines would also split on \f, \x1c, \u2028 ...), and drop
    # one "\r" per line: CRLF in the patch text is transport, not content.
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _parse_lines(lines: list[str]) -> list[PatchOp]:
    """Parse ``lines``; as in Codex, blank lines around the patch are trimmed and its
    ``*** Begin Patch`` line is line 1."""
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    if not nonblank or lines[nonblank[0]].strip() != BEGIN_PATCH:
        raise PatchError(FIRST_LINE, line=1)
    first, last = nonblank[0], nonblank[-1]
    if last == first or lines[last].strip() != END_PATCH:
        raise PatchError(LAST_LINE, line=last - first + 1)
    return _Parser(lines, first + 1, last, -first).parse()


class _Parser:
    """Line-by-line parser over lines[start:stop] (the text between the envelope lines)."""

    def __init__(self, lines: list[str], start: int, stop: int, offset: int) -> None:
        self.lines = lines
        self.i = start
        self.stop = stop
        self.offset = offset

    def lineno(self, i: int | None = None) -> int:
        return self.offset + (self.i if i is None else i) + 1

    def error(self, message: str, *, i: int | None = None, path: str | None = None) -> PatchError:
        n = self.lineno(i)
        return PatchError(f"Invalid patch hunk on line {n}: {message}", line=n, path=path)

    def parse(self) -> list[PatchOp]:
        ops: list[PatchOp] = []
        while self.i < self.stop:
            raw = self.lines[self.i]
            marker = raw.strip()
            if not marker:  # blank lines between operations (Codex rejects them; harmless)
                self.i += 1
                continue
            if marker.startswith(ENVIRONMENT_ID) and not ops:
                self.i += 1  # Newer Codex names the execution environment here; nothing to do.
                continue
            match = _FILE_MARKER.match(marker)
            if match is None:
                raise self._unknown_line(raw)
            kind, raw_path = match.group(1), match.group(2)
            path = self.path(raw_path, f"*** {kind} File")
            if kind == "Add":
                ops.append(self.add_file(path))
            elif kind == "Delete":
                ops.append(DeleteFile(path=path, line=self.lineno()))
                self.i += 1
            else:
                ops.append(self.update_file(path))
        return ops

    def _unknown_line(self, raw: str) -> PatchError:
        marker = raw.strip()
        if marker == END_PATCH:
            return self.error(f"'{END_PATCH}' before the end of the patch; a patch has exactly one, on its last line")
        if marker == BEGIN_PATCH:
            return self.error(f"a second '{BEGIN_PATCH}'; send one patch at a time")
        if marker.startswith(MOVE_TO):
            return self.error(f"'{MOVE_TO}' must come right after its '*** Update File:' line")
        if marker == END_OF_FILE:
            return self.error(f"'{END_OF_FILE}' must directly follow the lines of an update hunk")
        if marker.startswith(ENVIRONMENT_ID):
            return self.error(f"'{ENVIRONMENT_ID}' may only come right after '{BEGIN_PATCH}'")
        return self.error(f"'{marker}' is not a valid hunk header. Valid hunk headers: {_VALID_HEADERS}")

    def path(self, raw: str, what: str) -> str:
        path = raw.strip()
        if not path:
            raise self.error(f"'{what}:' needs a path")
        if "\x00" in path:
            raise self.error(f"the path {quote(path)} contains a NUL character", path=path)
        if path.startswith(("/", "\\")) or _WINDOWS_ABSOLUTE.match(path):
            raise self.error(f"absolute path {quote(path)} is not allowed; use a path relative to the working directory", path=path)
        if path.startswith("~"):
            raise self.error(f"the path {quote(path)} starts with '~'; use a path relative to the working directory", path=path)
        if path.endswith("/"):
            raise self.error(f"the path {quote(path)} names a directory; apply_patch works on files", path=path)
        norm = posixpath.normpath(path)
        if norm == ".":
            raise self.error(f"the path {quote(path)} does not name a file", path=path)
        if len(norm.encode("utf-8", "surrogatepass")) > _PATH_MAX or any(
            len(part.encode("utf-8", "surrogatepass")) > _NAME_MAX for part in norm.split("/")
        ):
            raise self.error(f"the path {quote(path)} is too long for a file name", path=clip(path))
        if norm == ".." or norm.startswith("../"):
            raise self.error(f"the path {quote(path)} escapes the working directory ('..' is not allowed to leave it)", path=path)
        return norm

    def add_file(self, path: str) -> AddFile:
        start = self.i
        self.i += 1
        content: list[str] = []
        while self.i < self.stop and self.lines[self.i].startswith("+"):
            content.append(self.lines[self.i][1:])
            self.i += 1
        if self.i < self.stop and not self.lines[self.i].lstrip().startswith("*"):
            # Anything else ends the file; a '+' line after it means the model forgot a '+'.
            j = self.i
            while j < self.stop and not self.lines[j].strip():
                j += 1
            if j > self.i and j < self.stop and self.lines[j].startswith("+"):
                raise self.error(
                    f"blank line inside the content of '*** Add File: {path}'; every line of an added file, "
                    "empty ones included, must start with '+'",
                    path=path,
                )
            if j == self.i:
                raise self.error(
                    f"{quote(self.lines[self.i])} in '*** Add File: {path}': every line of an added file must start with '+'",
                    path=path,
                )
        text = "\n".join(content) + "\n" if content else ""
        return AddFile(path=path, content=text, line=self.lineno(start))

    def update_file(self, path: str) -> UpdateFile:
        start = self.i
        self.i += 1
        move_to: str | None = None
        if self.i < self.stop and self.lines[self.i].strip().startswith(MOVE_TO):
            move_to = self.path(self.lines[self.i].strip()[len(MOVE_TO) :], "*** Move to")
            self.i += 1
            if move_to == path:
                move_to = None  # moving a file onto itself is a plain update
        chunks: list[Chunk] = []
        headers: list[str] = []
        body: list[tuple[str, str]] = []
        chunk_start: int | None = None
        after_eof = False

        def flush(end_of_file: bool) -> None:
            nonlocal headers, body, chunk_start
            assert chunk_start is not None
            chunks.append(Chunk(tuple(headers), tuple(body), end_of_file, self.lineno(chunk_start)))
            headers, body, chunk_start = [], [], None

        while self.i < self.stop:
            raw = self.lines[self.i]
            if raw.startswith("@@"):
                if body:
                    flush(False)
                header = raw[2:].strip()
                ranged = _RANGE_HEADER.match(header)
                if ranged is not None:
                    header = ranged.group(1).strip()
                if header:
                    headers.append(header)
                chunk_start = self.i if chunk_start is None else chunk_start
                after_eof = False
            elif raw.strip() == END_OF_FILE:
                if not body:
                    raise self.error("Update hunk does not contain any lines", path=path)
                flush(True)
                after_eof = True
            elif raw.startswith("*") or _FILE_MARKER.match(raw.strip()) or raw.strip() == END_PATCH:
                break  # the next file operation (even if indented), or an unknown marker for parse()
            elif chunk_start is None and not raw.strip():
                pass  # blank lines before a hunk starts (Codex skips them too)
            elif raw[:1] in ("", " ", "+", "-"):
                if after_eof:
                    raise self.error(f"hunk lines after '{END_OF_FILE}' need a new '@@' line first", path=path)
                if chunk_start is None:
                    chunk_start = self.i
                # A completely empty line is an empty context line (editors and models drop the space).
                body.append((raw[0], raw[1:]) if raw else (" ", ""))
            else:
                raise self.error(
                    f"Unexpected line found in update hunk: '{raw}'. Every line should start with ' ' (context line), "
                    "'+' (added line), or '-' (removed line)",
                    path=path,
                )
            self.i += 1
        if chunk_start is not None:
            if not body:
                raise self.error("Update hunk does not contain any lines", i=chunk_start, path=path)
            flush(False)
        if not chunks and move_to is None:
            raise self.error(f"Update file hunk for path '{path}' is empty", i=start, path=path)
        return UpdateFile(path=path, move_to=move_to, chunks=tuple(chunks), line=self.lineno(start))


def clip(line: str) -> str:
    return line if len(line) <= QUOTE_LIMIT else line[:QUOTE_LIMIT] + f"... ({len(line)} chars)"


def quote(line: str) -> str:
    return repr(clip(line))
