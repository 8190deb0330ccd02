"""What a patch may write: an allowlist, checked on the diff before applying it and on the tree
after, before any test runs (``envs.candidate`` calls both; every check here is pure).

A patch may write regular UTF-8 text files, and nothing that makes Python read a file other than
the way every other tool reads it:

- no symlink (new, or an existing one changed): a link makes one file's bytes stand for
  another's, so what the diff shows is not what Python imports;
- no binary content and no archive (``.zip``, ``.egg``, ``.whl``, ``.pyz``): Python imports
  from an archive put on ``sys.path``, and nothing in it can be read from the diff;
- no source encoding declaration (PEP 263, ``coding[:=]`` in the first two lines, which also
  matches editors' ``fileencoding=`` and ``-*- coding: -*-``) other than UTF-8 in a Python
  file, unless the base commit's file declares the same: ``utf-7``, ``unicode_escape`` and
  their kind make code out of what every UTF-8 reader sees as a comment;
- no line separator in Python source that Python and line-splitting tools disagree on:
  vertical tab, ``\\x1c``-``\\x1e``, NEL (``\\x85``), U+2028, U+2029 (``str.splitlines`` breaks
  there, Python's tokenizer does not), a lone CR (Python breaks there, ``git diff`` does not),
  and a form feed anywhere but in a line's leading whitespace. PEP 8 allows a form feed as a
  page break, and Python's tokenizer reads one at a line's start as indentation whitespace
  (it resets the column), so a leading form feed is kept: old code has such page breaks. The
  scan (``envs.code_scan``) numbers lines as the tokenizer does whatever a file holds; these
  separators are refused because no fix needs them and other readers (a reviewer's editor,
  ``difflib``) would misplace the lines;
- no new importable name at the top of the repository or of ``src/`` (a module ``NAME.py``
  or a package ``NAME/__init__.py`` the base commit lacks) without a mark: the unittest and
  Django-style runners and ``python -m`` put the work directory first on ``sys.path``, and
  pytest puts the root conftest's folder there, so a new top-level name shadows whatever
  installed module of that name the runner or the package imports. Such a name is marked
  suspicious, not refused (the verifier cannot list every module a runner imports; names of
  the test machinery and the standard library are refused, ``envs.candidate``), so that a
  patch refused or restored for another reason keeps that reason. Nor, anywhere, a module or
  package named ``conftest`` (other than ``conftest.py``, which is configuration),
  ``sitecustomize`` or ``usercustomize``: pytest imports a conftest by its name, and a package of that name wins
  over the file. A real fix adds its new module inside the package, which stays allowed.

A violation refuses the patch (its verdict is unresolved, with the reason), as round one and
two refuse what a patch may not write; only a new top-level name is marked instead. Files that
are put back by bytes (test files and the tests' configuration, ``envs.candidate``) are not
checked for content: what the patch wrote there never reaches the run; a symlink is refused
wherever it is.
"""

from __future__ import annotations

import codecs
import re

PYTHON_SOURCE = re.compile(r"\.pyw?$")
ARCHIVE = re.compile(r"\.(zip|egg|whl|pyz|pyzw)$", re.IGNORECASE)
# PEP 263, as the tokenizer reads it (on each of the first two lines).
CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
ODD_SEPARATORS = {
    "\x0b": "a vertical tab",
    "\x1c": "a file separator (\\x1c)",
    "\x1d": "a group separator (\\x1d)",
    "\x1e": "a record separator (\\x1e)",
    "\x85": "a next-line character (\\x85)",
    "\u2028": "a line separator (U+2028)",
    "\u2029": "a paragraph separator (U+2029)",
}
LONE_CR = re.compile(r"\r(?!\n)")
# A form feed after something other than leading whitespace on its line.
INNER_FORM_FEED = re.compile(r"[^ \t\x0c\r\n][^\r\n]*?\x0c")
# Names Python or pytest import by name alone, wherever their folder is on sys.path.
BY_NAME = frozenset({"conftest", "sitecustomize", "usercustomize"})


def declared_encoding(lines: list[str]) -> str | None:
    """The encoding the first two lines declare (PEP 263), or None."""
    for line in lines[:2]:
        match = CODING.match(line)
        if match:
            return match.group(1)
        if line.strip() and not line.lstrip(" \t\f").startswith("#"):
            return None  # code on the first line: the second is not read for a declaration
    return None


def is_utf8(name: str) -> bool:
    """Whether a declared encoding is UTF-8 as Python's tokenizer normalises it (``utf8``,
    ``UTF_8``, Emacs' ``utf-8-unix``)."""
    lowered = name[:12].lower().replace("_", "-")
    if lowered == "utf-8" or lowered.startswith("utf-8-"):
        return True
    try:
        return codecs.lookup(name).name == "utf-8"
    except LookupError:
        return False


def separator_counts(text: str) -> dict[str, int]:
    """How many of each separator Python source may not gain the text holds."""
    counts = {what: text.count(char) for char, what in ODD_SEPARATORS.items()}
    counts["a lone carriage return (Python ends a line there, git does not)"] = len(LONE_CR.findall(text))
    counts["a form feed after the start of a line (PEP 8 allows one only as a line's leading whitespace)"] = len(
        INNER_FORM_FEED.findall(text)
    )
    return counts


def path_problem(path: str) -> str | None:
    """A name the patch may not write anywhere: a module or package named like something
    Python or pytest imports by name alone."""
    parts = path.split("/")
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        stem = PYTHON_SOURCE.sub("", part) if last else part
        if stem in BY_NAME and not (last and part == "conftest.py") and (not last or PYTHON_SOURCE.search(part)):
            kind = "module" if last else "package"
            return f"a {kind} named {stem!r}: Python or pytest imports it by that name alone (a conftest package wins over conftest.py)"
    return None


def new_top_level(path: str, base_has: bool) -> str | None:
    """A new importable name at the top of the repository or of ``src/``, or None."""
    if base_has:
        return None
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 1:
        parts = parts[1:]
    if len(parts) == 1 and PYTHON_SOURCE.search(parts[0]) and parts[0] not in ("setup.py", "conftest.py", "__init__.py"):
        name = PYTHON_SOURCE.sub("", parts[0])
    elif len(parts) == 2 and parts[1] == "__init__.py":
        name = parts[0]
    else:
        return None
    return (
        f"a new top-level module {name!r}: with the work directory first on sys.path it would shadow any installed "
        "module of that name (a fix adds its modules inside the package)"
    )


def content_problems(path: str, new: bytes, old: bytes | None, *, partial: bool = False) -> list[str]:
    """What is wrong with the bytes a patch wrote to ``path`` (``old``: the base commit's
    bytes, None when the file is new; ``partial``: ``new`` is the head of a longer file)."""
    problems: list[str] = []
    if ARCHIVE.search(path):
        problems.append("an archive (Python imports from an archive put on sys.path; the diff cannot show what it holds)")
    if PYTHON_SOURCE.search(path):
        return problems + _python_problems(new, old, partial=partial)
    if b"\0" in new or _text(new, partial=partial) is None:
        problems.append("not UTF-8 text (a patch may write UTF-8 text files only)")
    return problems


def _python_problems(new: bytes, old: bytes | None, *, partial: bool) -> list[str]:
    problems: list[str] = []
    head = new.split(b"\n", 2)[:2]
    declared = declared_encoding([line.decode("latin-1") for line in head])
    old_declared = declared_encoding([line.decode("latin-1") for line in old.split(b"\n", 2)[:2]]) if old is not None else None
    codec = "utf-8"
    if declared is not None and not is_utf8(declared):
        if old_declared is None or old_declared.lower() != declared.lower():
            return [f"declares its source encoding as {declared!r} (only UTF-8 is read the same way by Python, git and the scan)"]
        codec = declared  # the base commit's own declaration, kept
    text = _text(new, codec, partial=partial)
    if text is None or "\0" in text:
        return [f"not {'UTF-8' if codec == 'utf-8' else codec} text, written where Python loads source"]
    before = separator_counts(_text(old, codec) or "") if old is not None else {}
    for what, count in separator_counts(text).items():
        if count > before.get(what, 0):
            problems.append(f"Python source with {what}: lines split there by some readers and not by others")
    return problems


def _text(data: bytes | None, codec: str = "utf-8", *, partial: bool = False) -> str | None:
    if data is None:
        return None
    try:
        if partial:  # the head of a longer file: a character cut at the end is no error
            return codecs.getincrementaldecoder("utf-8-sig" if is_utf8(codec) else codec)().decode(data, final=False)
        return data.decode("utf-8-sig" if is_utf8(codec) else codec)
    except (UnicodeDecodeError, LookupError):
        return None


# --- the diff, before applying ----------------------------------------------------------------

HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
SYMLINK_MODE = re.compile(r"(new file mode|new mode|old mode|deleted file mode|index [0-9a-f]+\.\.[0-9a-f]+) 120000\s*$")


def diff_problems(patch: str, restored: frozenset[str] = frozenset(), *, symlinks: bool = True) -> list[str]:
    """What the diff itself shows a patch may not write: symlinks (mode 120000, new or
    changed), binary content, archives, names imported by name alone, non-UTF-8 encoding
    declarations and odd line separators on the lines it adds to Python files. The tree after
    applying is checked again (``content_problems``): this reading is the early, pure one.
    ``restored``: paths put back by bytes, whose added lines are not read. ``symlinks=False``
    leaves links to the check of the tree, which says where each one points."""
    problems: list[str] = []
    path: str | None = None
    written: list[str] = []
    line_number = old_left = new_left = 0
    for raw in patch.split("\n"):
        if old_left > 0 or new_left > 0:  # inside a hunk, by its counts
            if raw.startswith("+"):
                if path is not None and path not in restored and PYTHON_SOURCE.search(path):
                    problems += [f"{path}: {p}" for p in _added_line_problems(raw[1:], line_number)]
                line_number, new_left = line_number + 1, new_left - 1
            elif raw.startswith("-"):
                old_left -= 1
            elif raw.startswith(" ") or raw == "":
                line_number, old_left, new_left = line_number + 1, old_left - 1, new_left - 1
            elif not raw.startswith("\\"):
                old_left = new_left = 0  # a malformed hunk: git refuses it anyway
            continue
        match = HUNK.match(raw)
        if match:
            old_left = int(match.group(1) or 1)
            line_number, new_left = int(match.group(2)), int(match.group(3) or 1)
            continue
        if raw.startswith("diff --git "):
            path = _git_path(raw)
            if path is not None:
                written.append(path)
        elif raw.startswith("+++ "):
            name = raw[4:].split("\t")[0].strip().strip('"')
            if name != "/dev/null":
                path = name[2:] if name.startswith("b/") else name
                written.append(path)
        elif raw.startswith(("rename to ", "copy to ")):
            path = raw.split(" to ", 1)[1]
            written.append(path)
        elif symlinks and SYMLINK_MODE.match(raw) and not raw.startswith("deleted") and path:
            problems.append(f"{path}: a symlink (a patch may write regular files only)")
        elif raw.startswith(("GIT binary patch", "Binary files ")) and path and path not in restored:
            problems.append(f"{path}: binary content (a patch may write UTF-8 text files only)")
    for name in dict.fromkeys(written):
        problem = path_problem(name)
        if problem:
            problems.append(f"{name}: {problem}")
        if ARCHIVE.search(name):
            problems.append(f"{name}: an archive (Python imports from an archive put on sys.path)")
    return list(dict.fromkeys(problems))


def _added_line_problems(line: str, number: int) -> list[str]:
    problems = []
    if number <= 2:
        declared = declared_encoding([line])
        if declared is not None and not is_utf8(declared):
            problems.append(f"declares its source encoding as {declared!r} (only UTF-8 is read the same way by Python, git and the scan)")
    body = line[:-1] if line.endswith("\r") else line
    for what, count in separator_counts(body).items():
        if count:
            problems.append(f"Python source with {what}: lines split there by some readers and not by others")
    return problems


def _git_path(header: str) -> str | None:
    rest = header[len("diff --git ") :]
    if rest.startswith('"'):
        return None  # quoted names: git's own reading (numstat) lists them
    half = rest.split(" b/", 1)
    return half[1] if len(half) == 2 else None
