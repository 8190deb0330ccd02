"""Applying Codex CLI's ``apply_patch`` patches (the format: ``harness.tools.patch_grammar``).

This module only computes changes: :func:`apply_patch` takes a ``read`` callback and
returns :class:`FileChange` records; it never touches a filesystem. The caller writes them.

Two semantics (``semantics=``; the tool set records which one an episode used, and runs
with different ones are never compared):

* ``codex`` (the default) is Codex's, as its scenario fixtures
  (``codex-rs/apply-patch/tests/fixtures/scenarios``) define it: ``*** Add File`` overwrites
  a file that exists, ``*** Move to`` overwrites its destination, and when an operation
  fails the operations before it stay applied (``PatchError.applied`` holds their changes
  for the caller to write; nothing after the failing one is applied). An updated file
  always ends with a newline unless it is empty.
* ``strict`` is relearn's earlier, safer reading: adding a file that exists and moving onto
  an existing file are errors, a failing patch changes nothing, and an updated file keeps
  the final-newline state it had.

Error texts are Codex's where Codex has one (``Failed to find expected lines in PATH:``,
``Failed to read file to update PATH: No such file or directory (os error 2)``, ...).

Behaviour common to both, and where it deliberately differs from Codex (the caller and the
model see these):

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
* Added files end with a newline unless they are empty. A pure rename keeps the content
  byte for byte.
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from harness.tools.patch_grammar import AddFile, Chunk, DeleteFile, PatchError, PatchOp, UpdateFile, parse_patch

Semantics = Literal["codex", "strict"]
SEMANTICS: tuple[str, ...] = ("codex", "strict")


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


def apply_patch(text: str, read: Callable[[str], str | None], *, semantics: Semantics = "codex") -> list[FileChange]:
    """Compute the file changes ``text`` makes. Pure: reads through ``read``, writes nothing.

    ``read(path)`` returns the file's current text, or None if it does not exist. Raises
    PatchError (and only PatchError, for any bad patch) when a part of the patch fails; with
    ``codex`` semantics its ``applied`` lists the changes of the operations before the
    failing one, which are to be written (Codex has written them by then).
    """
    if semantics not in SEMANTICS:
        raise ValueError(f"apply_patch semantics must be one of {SEMANTICS}, not {semantics!r}")
    ops = parse_patch(text)
    if not ops:
        raise PatchError("No files were modified.")
    state: dict[str, str | None] = {}  # what earlier operations in this patch left behind

    def current(path: str) -> str | None:
        if path not in state:
            state[path] = _read(read, path)
        return state[path]

    changes: list[FileChange] = []
    for op in ops:
        try:
            changes.append(_apply_op(op, current, state, semantics))
        except PatchError as exc:
            if semantics == "codex" and changes:
                exc.applied = list(changes)
                exc.message = exc.args[0] + "\n" + _partial_note(changes)
                exc.args = (exc.message,)
            raise
    return changes


def _apply_op(op: PatchOp, current: Callable[[str], str | None], state: dict[str, str | None], semantics: Semantics) -> FileChange:
    strict = semantics == "strict"
    where = f"(patch line {op.line})"
    if isinstance(op, AddFile):
        if strict and current(op.path) is not None:
            raise PatchError(
                f"cannot add {op.path} {where}: the file already exists. Use '*** Update File: {op.path}' to change it, or delete it first",
                line=op.line,
                path=op.path,
            )
        state[op.path] = op.content
        return FileChange(op.path, "add", None, op.content)
    if isinstance(op, DeleteFile):
        if current(op.path) is None:
            raise PatchError(f"Failed to delete file {op.path}", line=op.line, path=op.path)
        state[op.path] = None
        return FileChange(op.path, "delete", None, None)
    original = current(op.path)
    if original is None:
        raise PatchError(f"Failed to read file to update {op.path}: No such file or directory (os error 2)", line=op.line, path=op.path)
    new = _update(op, original, keep_final_newline_state=strict) if op.chunks else original
    if op.move_to is not None:
        if strict and current(op.move_to) is not None:
            raise PatchError(f"cannot move {op.path} to {op.move_to} {where}: {op.move_to} already exists", line=op.line, path=op.path)
        state[op.path] = None
        state[op.move_to] = new
    else:
        state[op.path] = new
    return FileChange(op.path, "update", op.move_to, new)


def _partial_note(applied: list[FileChange]) -> str:
    done = summary(applied).splitlines()[1:]
    return f"(applied before this error, and kept: {', '.join(done)}; nothing after it was applied)"


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


def _update(op: UpdateFile, original: str, *, keep_final_newline_state: bool) -> str:
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
    if new_lines and (ends_with_newline or not keep_final_newline_state):
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
                raise _context_error(op, chunk, header=header)
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
                raise _context_error(op, chunk)
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


def _context_error(op: UpdateFile, chunk: Chunk, header: str | None = None) -> PatchError:
    """Codex's texts: the ``@@`` line that was not found, or every old line of the hunk."""
    if header is not None:
        return PatchError(f"Failed to find context '{header}' in {op.path}", line=chunk.line, path=op.path)
    old = [text for kind, text in chunk.lines if kind != "+"]
    return PatchError(f"Failed to find expected lines in {op.path}:\n" + "\n".join(old), line=chunk.line, path=op.path)
