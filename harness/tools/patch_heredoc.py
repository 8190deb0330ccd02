"""The heredoc form of ``apply_patch``: ``[cd DIR &&] apply_patch <<'EOF' ... EOF`` inside a
shell command, which Codex intercepts and applies as a patch instead of running it."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ApplyPatchCommand:
    """A shell command that is an apply_patch heredoc invocation."""

    patch: str
    workdir: str | None  # from a leading ``cd <dir> &&``; None when absent


@dataclass(frozen=True)
class Heredoc:
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
    found = split_heredoc(command, require_command=True)
    return None if found is None else ApplyPatchCommand(found.body, found.workdir)


def extract_heredoc(command: str) -> str | None:
    """The patch text if ``command`` is ``apply_patch <<'EOF' ... EOF``, else None.

    A ``cd DIR && apply_patch <<...`` command returns None here (its paths are relative to
    DIR); use :func:`match_apply_patch_command` to handle that form too.
    """
    found = match_apply_patch_command(command)
    return found.patch if found is not None and found.workdir is None else None


def split_heredoc(command: str, *, require_command: bool) -> Heredoc | None:
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
    return Heredoc("\n".join(body).rstrip("\n"), workdir, first + 2)
