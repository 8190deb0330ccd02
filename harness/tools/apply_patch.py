"""Codex CLI's ``apply_patch`` patch format, in pure Python.

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

This module only computes changes: :func:`apply_patch` takes a ``read`` callback and
returns :class:`FileChange` records; it never touches a filesystem. The caller writes them.

Behaviour, and where it deliberately differs from Codex (the caller and the model see these):

* Matching follows Codex's ``seek_sequence``: a hunk's context and removed lines are
  searched for, in order, after the previous hunk; first exactly, then ignoring trailing
  whitespace, then ignoring leading and trailing whitespace, then with typographic
  punctuation (dashes, quotes, odd spaces) normalised to ASCII. Each ``@@ header`` moves
  the search to just after the first line matching the header (same fallbacks); stacked
  headers narrow step by step. ``*** End of File`` requires the match to end at the last
  line. If a hunk's last old line is empty and nothing matches, it is retried without it
  (Codex's tolerance for a stray blank line at the end of a hunk).
* Context lines keep the file's own text. Codex replaces the matched block with the
  patch's version of the context lines, so a whitespace- or punctuation-tolerant match
  would rewrite them; here only ``-`` and ``+`` lines change the file.
* A hunk with no context or removed lines (only ``+`` lines) is inserted right after its
  last ``@@ header`` line if it has one; without a header it is appended at the end of the
  file, as in Codex.
* Line endings: a file whose every newline is CRLF stays CRLF (added lines get CRLF too);
  any other file is treated as LF, and stray ``\\r`` characters stay part of their line.
  A UTF-8 BOM is kept. Patch text may itself use CRLF; that is stripped.
* Final newline: an updated file keeps the state it had. If it ended with a newline (or was
  empty) the result ends with one; if it did not, the result does not either, whatever the
  hunks change. The format has no way to add or drop only the final newline. (Recent
  Codex preserves it the same way; older Codex always appended one.) Added files end with
  a newline unless they are empty. A pure rename keeps the content byte for byte.
* Stricter than Codex, on purpose: adding a file that already exists and moving onto an
  existing file are errors (Codex overwrites). The whole patch is validated before any
  change is returned, so a failing patch changes nothing (Codex leaves earlier files
  written).
* More lenient than Codex, on purpose: blank lines between file operations are ignored; an
  ``*** Update File`` with ``*** Move to`` and no hunks is a pure rename; a unified-diff
  range header (``@@ -12,7 +12,8 @@ def foo``) is accepted, its numbers ignored and any
  text after it used as the header.
* Paths must be relative to the working directory and stay inside it: absolute paths,
  ``~`` and ``..`` escapes are rejected. Paths are normalised (``./a//b`` -> ``a/b``) and
  the normalised form is what :class:`FileChange` carries and ``read`` is called with.
* Operations apply in order and later ones see earlier ones (add then update the same file
  works). The returned list has one record per operation, in patch order; writing them in
  order gives the final state.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AddFile",
    "ApplyPatchCommand",
    "Chunk",
    "DeleteFile",
    "FileChange",
    "PatchError",
    "PatchOp",
    "UpdateFile",
    "apply_patch",
    "extract_heredoc",
    "match_apply_patch_command",
    "parse_patch",
    "summary",
]

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
_QUOTE_LIMIT = 200  # characters of one line quoted in an error message
_EXPECTED_LIMIT = 40  # lines of a hunk quoted in an error message
_NAME_MAX, _PATH_MAX = 255, 4096  # Linux limits, in bytes: longer paths cannot be written anyway


class PatchError(Exception):
    """A patch that cannot be parsed or applied. ``str(err)`` is written for the model to read.

    ``line`` is the 1-based line in the patch text and ``path`` the file concerned, when known.
    """

    def __init__(self, message: str, *, line: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.path = path


@dataclass(frozen=True)
class FileChange:
    """One file operation for the caller to perform.

    add: create ``path`` with ``new_content``. delete: remove ``path`` (``new_content`` is None).
    update: write ``new_content`` to ``move_to`` if set (then remove ``path``), else to ``path``.
    """

    path: str
    kind: Literal["add", "delete", "update"]
    move_to: str | None = None
    new_content: str | None = None


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


# --------------------------------------------------------------------------- parsing


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
        raise PatchError(f"the patch is empty; it must start with '{BEGIN_PATCH}' and end with '{END_PATCH}'")
    if lines[first].strip() != BEGIN_PATCH:
        wrapped = _split_heredoc(text, require_command=False)
        if wrapped is not None and wrapped.body.strip():
            body_lines = _split_lines(wrapped.body)
            return _parse_lines(body_lines, wrapped.body_line - 1)
        raise PatchError(
            f"the first line of the patch must be '{BEGIN_PATCH}', got {_quote(lines[first])} (patch line {first + 1})",
            line=first + 1,
        )
    return _parse_lines(lines, 0)


def _split_lines(text: str) -> list[str]:
    # Split on "\n" only (str.splitlines would also split on \f, \x1c, \u2028 ...), and drop
    # one "\r" per line: CRLF in the patch text is transport, not content.
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _parse_lines(lines: list[str], offset: int) -> list[PatchOp]:
    """Parse ``lines`` (patch line ``offset + i + 1`` is ``lines[i]``)."""
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    if not nonblank or lines[nonblank[0]].strip() != BEGIN_PATCH:
        where = nonblank[0] if nonblank else 0
        got = lines[where] if nonblank else ""
        raise PatchError(
            f"the first line of the patch must be '{BEGIN_PATCH}', got {_quote(got)} (patch line {offset + where + 1})",
            line=offset + where + 1,
        )
    first, last = nonblank[0], nonblank[-1]
    if last == first or lines[last].strip() != END_PATCH:
        earlier = any(line.strip() == END_PATCH for line in lines[first + 1 : last])
        raise PatchError(
            f"the last line of the patch must be '{END_PATCH}'; the patch ends at line {offset + last + 1} "
            f"with {_quote(lines[last])}. " + (f"Nothing may follow '{END_PATCH}'." if earlier else f"Is '{END_PATCH}' missing?"),
            line=offset + last + 1,
        )
    return _Parser(lines, first + 1, last, offset).parse()


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
        return PatchError(f"invalid patch at line {n}: {message}", line=n, path=path)

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
        return self.error(f"{_quote(raw)} is not a valid file operation header. Valid headers: {_VALID_HEADERS}")

    def path(self, raw: str, what: str) -> str:
        path = raw.strip()
        if not path:
            raise self.error(f"'{what}:' needs a path")
        if "\x00" in path:
            raise self.error(f"the path {_quote(path)} contains a NUL character", path=path)
        if path.startswith(("/", "\\")) or _WINDOWS_ABSOLUTE.match(path):
            raise self.error(f"absolute path {_quote(path)} is not allowed; use a path relative to the working directory", path=path)
        if path.startswith("~"):
            raise self.error(f"the path {_quote(path)} starts with '~'; use a path relative to the working directory", path=path)
        if path.endswith("/"):
            raise self.error(f"the path {_quote(path)} names a directory; apply_patch works on files", path=path)
        norm = posixpath.normpath(path)
        if norm == ".":
            raise self.error(f"the path {_quote(path)} does not name a file", path=path)
        if len(norm.encode("utf-8", "surrogatepass")) > _PATH_MAX or any(
            len(part.encode("utf-8", "surrogatepass")) > _NAME_MAX for part in norm.split("/")
        ):
            raise self.error(f"the path {_quote(path)} is too long for a file name", path=_clip(path))
        if norm == ".." or norm.startswith("../"):
            raise self.error(f"the path {_quote(path)} escapes the working directory ('..' is not allowed to leave it)", path=path)
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
                    f"{_quote(self.lines[self.i])} in '*** Add File: {path}': every line of an added file must start with '+'",
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
                    raise self.error(f"'{END_OF_FILE}' must follow the lines of a hunk (in '*** Update File: {path}')", path=path)
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
                    f"unexpected line {_quote(raw)} in the hunk for '{path}'. Every hunk line must start with "
                    "' ' (context), '+' (added) or '-' (removed); a hunk starts with '@@'",
                    path=path,
                )
            self.i += 1
        if chunk_start is not None:
            if not body:
                raise self.error(f"the '@@' hunk for '{path}' has no lines", i=chunk_start, path=path)
            flush(False)
        if not chunks and move_to is None:
            raise self.error(f"'*** Update File: {path}' has no hunks; nothing to change", i=start, path=path)
        return UpdateFile(path=path, move_to=move_to, chunks=tuple(chunks), line=self.lineno(start))


# --------------------------------------------------------------------------- applying


def apply_patch(text: str, read: Callable[[str], str | None]) -> list[FileChange]:
    """Compute the file changes ``text`` makes. Pure: reads through ``read``, writes nothing.

    ``read(path)`` returns the file's current text, or None if it does not exist. Raises
    PatchError (and only PatchError, for any bad patch) if any part of the patch fails, in
    which case nothing should be written.
    """
    ops = parse_patch(text)
    if not ops:
        raise PatchError("the patch contains no file operations; no files were modified")
    state: dict[str, str | None] = {}  # what earlier operations in this patch left behind

    def current(path: str) -> str | None:
        if path not in state:
            state[path] = _read(read, path)
        return state[path]

    changes: list[FileChange] = []
    for op in ops:
        where = f"(patch line {op.line})"
        if isinstance(op, AddFile):
            if current(op.path) is not None:
                raise PatchError(
                    f"cannot add {op.path} {where}: the file already exists. Use '*** Update File: {op.path}' to change it, "
                    "or delete it first",
                    line=op.line,
                    path=op.path,
                )
            state[op.path] = op.content
            changes.append(FileChange(op.path, "add", None, op.content))
        elif isinstance(op, DeleteFile):
            if current(op.path) is None:
                raise PatchError(f"cannot delete {op.path} {where}: the file does not exist", line=op.line, path=op.path)
            state[op.path] = None
            changes.append(FileChange(op.path, "delete", None, None))
        else:
            original = current(op.path)
            if original is None:
                raise PatchError(
                    f"cannot update {op.path} {where}: the file does not exist (use '*** Add File: {op.path}' to create it)",
                    line=op.line,
                    path=op.path,
                )
            new = _update(op, original) if op.chunks else original
            if op.move_to is not None:
                if current(op.move_to) is not None:
                    raise PatchError(
                        f"cannot move {op.path} to {op.move_to} {where}: {op.move_to} already exists",
                        line=op.line,
                        path=op.path,
                    )
                state[op.path] = None
                state[op.move_to] = new
            else:
                state[op.path] = new
            changes.append(FileChange(op.path, "update", op.move_to, new))
    return changes


def _read(read: Callable[[str], str | None], path: str) -> str | None:
    try:
        text = read(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PatchError(f"cannot read {path} as text: {exc}", path=path) from exc
    if text is not None and not isinstance(text, str):
        raise PatchError(f"cannot read {path} as text (got {type(text).__name__})", path=path)
    return text


def summary(changes: list[FileChange]) -> str:
    """Codex's success message: added, then modified (a move shows its destination), then deleted."""
    added = [c.path for c in changes if c.kind == "add"]
    modified = [c.move_to or c.path for c in changes if c.kind == "update"]
    deleted = [c.path for c in changes if c.kind == "delete"]
    lines = ["Success. Updated the following files:"]
    lines += [f"A {p}" for p in added] + [f"M {p}" for p in modified] + [f"D {p}" for p in deleted]
    return "\n".join(lines) + "\n"


def _update(op: UpdateFile, original: str) -> str:
    bom = "\ufeff" if original.startswith("\ufeff") else ""
    text = original[len(bom) :]
    newlines = text.count("\n")
    crlf = newlines > 0 and text.count("\r\n") == newlines  # every newline is CRLF (Codex's test)
    if crlf:
        text = text.replace("\r\n", "\n")
    ends_with_newline = text.endswith("\n") or text == ""
    lines = text.split("\n")
    if text == "" or text.endswith("\n"):
        lines.pop()  # the empty string after the final newline (or of an empty file) is not a line
    new_lines = _apply_chunks(op, lines)
    out = "\n".join(new_lines)
    if new_lines and ends_with_newline:
        out += "\n"
    if crlf:
        out = out.replace("\n", "\r\n")
    return bom + out


def _apply_chunks(op: UpdateFile, lines: list[str]) -> list[str]:
    matcher = _Matcher(lines)
    out: list[str] = []
    copied = 0  # lines[:copied] are already in out (or removed)
    pos = 0  # where the next search starts: just past the previous hunk
    tail: list[str] = []  # header-less pure additions, appended after everything else
    for chunk in op.chunks:
        for header in chunk.headers:
            idx = matcher.seek([header], pos, eof=False)
            if idx is None:
                raise _context_error(op, chunk, matcher, pos, header=header)
            pos = idx + 1
        body = list(chunk.lines)
        old = [text for kind, text in body if kind != "+"]
        if not old and not (chunk.headers and not chunk.end_of_file):
            # Pure addition without a header: appended at the end of the file, as in Codex, and
            # (as there) it does not move the search position for the hunks after it.
            tail.extend(text for _, text in body)
            continue
        if not old:
            at = pos  # pure addition under a header: right after the header line
        else:
            found = matcher.seek(old, pos, eof=chunk.end_of_file)
            # Codex: an empty last old line often stands for the file's final newline; retry without it.
            while found is None and old and old[-1] == "":
                last = max(k for k, (kind, _) in enumerate(body) if kind != "+")
                del body[last]
                old.pop()
                found = matcher.seek(old, pos, eof=chunk.end_of_file) if old else None
            if found is None:
                raise _context_error(op, chunk, matcher, pos)
            at = found
        out.extend(lines[copied:at])
        cursor = at
        for kind, text in body:
            if kind == " ":
                out.append(lines[cursor])  # keep the file's own text for context lines
                cursor += 1
            elif kind == "-":
                cursor += 1
            else:
                out.append(text)
        copied = pos = cursor
    out.extend(lines[copied:])
    out.extend(tail)
    return out


# Codex's seek_sequence normalisation: typographic punctuation and odd spaces to ASCII.
_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys(["\u2010", "\u2011", "\u2012", "\u2013", "\u2014", "\u2015", "\u2212"], "-"),
        **dict.fromkeys(["\u2018", "\u2019", "\u201a", "\u201b"], "'"),
        **dict.fromkeys(["\u201c", "\u201d", "\u201e", "\u201f"], '"'),
        **dict.fromkeys(
            [
                "\u00a0",
                "\u2002",
                "\u2003",
                "\u2004",
                "\u2005",
                "\u2006",
                "\u2007",
                "\u2008",
                "\u2009",
                "\u200a",
                "\u202f",
                "\u205f",
                "\u3000",
            ],
            " ",
        ),
    }
)


def _normalise(line: str) -> str:
    return line.translate(_PUNCTUATION).strip()


# Decreasing strictness, as in Codex: exact, trailing whitespace, both ends, punctuation.
_LEVELS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip, _normalise)


class _Matcher:
    """seek_sequence over one file's lines, with per-level keys computed once."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self._keys: dict[int, list[str]] = {}

    def keys(self, level: int) -> list[str]:
        if level not in self._keys:
            self._keys[level] = [_LEVELS[level](line) for line in self.lines]
        return self._keys[level]

    def seek(self, pattern: list[str], start: int, eof: bool) -> int | None:
        """First index >= start where ``pattern`` matches; with ``eof`` only the last position counts."""
        n, m = len(self.lines), len(pattern)
        if m == 0:
            return start
        if m > n or start > n - m:
            return None
        candidates = range(n - m, n - m + 1) if eof else range(start, n - m + 1)
        for level, key in enumerate(_LEVELS):
            keys = self.keys(level)
            want = [key(p) for p in pattern]
            head = want[0]
            for i in candidates:
                if keys[i] == head and keys[i : i + m] == want:
                    return i
        return None


def _context_error(op: UpdateFile, chunk: Chunk, matcher: _Matcher, pos: int, header: str | None = None) -> PatchError:
    path = op.path
    if header is not None:
        message = f"failed to find the context line {_quote(header)} (from the '@@' of the hunk at patch line {chunk.line}) in {path}"
        if pos > 0:
            message += f" after line {pos}"
        earlier = matcher.seek([header], 0, eof=False)
        if earlier is not None and earlier < pos:
            message += f"; it occurs at line {earlier + 1}, before the previous hunk. Hunks must follow the file's order"
        return PatchError(message, line=chunk.line, path=path)
    old = [text for kind, text in chunk.lines if kind != "+"]
    shown = old[:_EXPECTED_LIMIT]
    quoted = "\n".join(_clip(line) for line in shown)
    if len(old) > len(shown):
        quoted += f"\n... ({len(old) - len(shown)} more lines)"
    where = "at the end of" if chunk.end_of_file else "in"
    message = f"Failed to find expected lines {where} {path} (hunk at patch line {chunk.line}):\n{quoted}"
    hint = _near_miss(matcher, old, pos, chunk.end_of_file)
    if hint:
        message += "\n" + hint
    return PatchError(message, line=chunk.line, path=path)


def _near_miss(matcher: _Matcher, old: list[str], pos: int, eof: bool) -> str:
    """A hint for the model: where the expected lines nearly match, or match out of order."""
    anywhere = matcher.seek(old, 0, eof=False)
    if anywhere is not None:
        if eof:
            return f"Those lines occur at line {anywhere + 1}, but '{END_OF_FILE}' requires them to end the file."
        return f"Those lines occur at line {anywhere + 1}, before the previous hunk's position (line {pos + 1}). Hunks must follow the file's order."
    keys = matcher.keys(3)
    want = [_normalise(line) for line in old]
    best_at, best_len = -1, 0
    for i in range(len(keys)):
        k = 0
        while k < len(want) and i + k < len(keys) and keys[i + k] == want[k]:
            k += 1
        if k > best_len:
            best_at, best_len = i, k
    if best_len == 0:
        return f"The first expected line, {_quote(old[0])}, does not occur in the file."
    if best_at + best_len >= len(keys):
        return f"The first {best_len} expected line(s) match at line {best_at + 1}, but the file ends there."
    return (
        f"The first {best_len} expected line(s) match at line {best_at + 1}; then the file has "
        f"{_quote(matcher.lines[best_at + best_len])} where the patch expects {_quote(old[best_len])}."
    )


def _clip(line: str) -> str:
    return line if len(line) <= _QUOTE_LIMIT else line[:_QUOTE_LIMIT] + f"... ({len(line)} chars)"


def _quote(line: str) -> str:
    return repr(_clip(line))


# --------------------------------------------------------------------------- heredoc form


@dataclass(frozen=True)
class ApplyPatchCommand:
    """A shell command that is an apply_patch heredoc invocation."""

    patch: str
    workdir: str | None  # from a leading ``cd <dir> &&``; None when absent


@dataclass(frozen=True)
class _Heredoc:
    body: str
    workdir: str | None
    body_line: int  # 1-based line of the command where the body starts


_HEREDOC_HEAD = re.compile(
    r"""^[ \t]*
    (?:cd[ \t]+(?P<cd>'[^'\n]*'|"[^"\n]*"|[^\s;&|<>'"()`$]+)[ \t]*&&[ \t]*)?
    (?P<cmd>(?:apply_patch|applypatch)[ \t]*)?
    <<(?P<dash>-?)[ \t]*
    (?:'(?P<sq>[^'\n]+)'|"(?P<dq>[^"\n]+)"|(?P<bare>[A-Za-z0-9_.\-]+))
    [ \t]*$""",
    re.VERBOSE,
)


def match_apply_patch_command(command: str) -> ApplyPatchCommand | None:
    """Recognise ``[cd DIR &&] apply_patch <<'EOF' ... EOF`` (or applypatch, <<EOF, <<"X", <<-X).

    The invocation must be the whole command: anything after the terminator line, or a
    second command on the first line, means it is not intercepted (as in Codex). A body
    with no terminator runs to the end of the command, as bash reads it. Unquoted
    delimiters are not expanded: the body is taken literally, as Codex does.
    """
    if not isinstance(command, str):
        return None
    found = _split_heredoc(command, require_command=True)
    return None if found is None else ApplyPatchCommand(found.body, found.workdir)


def extract_heredoc(command: str) -> str | None:
    """The patch text if ``command`` is ``apply_patch <<'EOF' ... EOF``, else None.

    A ``cd DIR && apply_patch <<...`` command returns None here (its paths are relative to
    DIR); use :func:`match_apply_patch_command` to handle that form too.
    """
    found = match_apply_patch_command(command)
    return found.patch if found is not None and found.workdir is None else None


def _split_heredoc(command: str, *, require_command: bool) -> _Heredoc | None:
    lines = command.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return None
    head = _HEREDOC_HEAD.match(lines[first].rstrip("\r"))
    if head is None or (require_command and head.group("cmd") is None):
        return None
    if head.group("cmd") is None and head.group("cd") is not None:
        return None
    delimiter = head.group("sq") or head.group("dq") or head.group("bare")
    body: list[str] = []
    rest: list[str] = []
    for j in range(first + 1, len(lines)):
        line = lines[j].rstrip("\r")
        candidate = line.lstrip("\t") if head.group("dash") else line
        if candidate.rstrip() == delimiter:
            rest = lines[j + 1 :]
            break
        body.append(candidate)
    if any(line.strip() for line in rest):
        return None  # more commands after the heredoc: not a plain apply_patch call
    workdir = head.group("cd")
    if workdir is not None and workdir[:1] in ("'", '"'):
        workdir = workdir[1:-1]
    return _Heredoc("\n".join(body).rstrip("\n"), workdir, first + 2)
