"""Conformance suite for harness.tools.apply_patch (Codex's apply_patch format).

Most cases are data: initial files, patch text, and either the expected files or the
PatchError message fragments. Scenario names follow Codex's fixtures
(codex-rs/apply-patch/tests/fixtures/scenarios) where there is one.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from harness.tools.apply_patch import FileChange, apply_patch, summary
from harness.tools.patch_grammar import AddFile, DeleteFile, PatchError, UpdateFile, parse_patch
from harness.tools.patch_heredoc import ApplyPatchCommand, extract_heredoc, match_apply_patch_command


def P(*lines: str) -> str:
    """A patch: the lines between '*** Begin Patch' and '*** End Patch'."""
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


def write(files: dict[str, str], changes: list[FileChange]) -> dict[str, str]:
    """What a caller does with the changes: here, on a dict standing in for a filesystem."""
    out = dict(files)
    for change in changes:
        if change.kind == "delete":
            del out[change.path]
        elif change.move_to is not None:
            del out[change.path]
            out[change.move_to] = change.new_content
        else:
            out[change.path] = change.new_content
    return out


def run(files: dict[str, str], patch: str, semantics: str = "strict") -> dict[str, str]:
    """The conformance cases below pin relearn's strict reading; the Codex scenarios further
    down pin the default, Codex's own."""
    return write(files, apply_patch(patch, files.get, semantics=semantics))


@dataclass
class Fails:
    """Expected PatchError: every fragment appears in the message; ``line`` if given matches."""

    fragments: tuple[str, ...]
    line: int | None = None

    def __init__(self, *fragments: str, line: int | None = None) -> None:
        self.fragments = fragments
        self.line = line


def py(a: int = 1, b: int = 1) -> str:
    """Two classes with an identical method: only an @@ header tells them apart."""
    return f"class A:\n    def run(self):\n        return {a}\n\n\nclass B:\n    def run(self):\n        return {b}\n"


PY = py()

CASES = [
    # ---------------------------------------------------------------- add / delete
    pytest.param({}, P("*** Add File: bar.md", "+This is a new file"), {"bar.md": "This is a new file\n"}, id="001_add_file"),
    pytest.param({}, P("*** Add File: a/b/c.txt", "+x", "+", "+y"), {"a/b/c.txt": "x\n\ny\n"}, id="add_nested_with_empty_line"),
    pytest.param({}, P("*** Add File: empty.txt"), {"empty.txt": ""}, id="add_empty_file"),
    pytest.param({}, P("*** Add File: u.txt", "+你好，世界 🌍", "+naïve café"), {"u.txt": "你好，世界 🌍\nnaïve café\n"}, id="add_unicode"),
    pytest.param(
        {"obsolete.txt": "bye\n", "keep.txt": "stay\n"},
        P("*** Delete File: obsolete.txt"),
        {"keep.txt": "stay\n"},
        id="020_delete_file",
    ),
    pytest.param(
        {"delete.txt": "d\n", "modify.txt": "line1\nline2\n"},
        P(
            "*** Add File: nested/new.txt",
            "+created",
            "*** Delete File: delete.txt",
            "*** Update File: modify.txt",
            "@@",
            "-line2",
            "+changed",
        ),
        {"modify.txt": "line1\nchanged\n", "nested/new.txt": "created\n"},
        id="002_multiple_operations",
    ),
    # ---------------------------------------------------------------- update
    pytest.param(
        {"f.txt": "foo\nbar\n"}, P("*** Update File: f.txt", "@@", " foo", "-bar", "+baz"), {"f.txt": "foo\nbaz\n"}, id="update_single_hunk"
    ),
    pytest.param(
        {"multi.txt": "line1\nline2\nline3\nline4\n"},
        P("*** Update File: multi.txt", "@@", "-line2", "+changed2", "@@", "-line4", "+changed4"),
        {"multi.txt": "line1\nchanged2\nline3\nchanged4\n"},
        id="003_multiple_chunks",
    ),
    pytest.param(
        {"f.txt": "a\nb\nc\n"},
        P("*** Update File: f.txt", " a", "-b", "+B"),
        {"f.txt": "a\nB\nc\n"},
        id="first_hunk_without_@@",
    ),
    pytest.param(
        {"lines.txt": "line1\nline2\nline3\n"},
        P("*** Update File: lines.txt", "@@", " line1", "-line2", " line3"),
        {"lines.txt": "line1\nline3\n"},
        id="021_deletion_only",
    ),
    pytest.param(
        {"f.txt": "a\nb\n"},
        P("*** Update File: f.txt", "@@", " a", "+x", "+y", " b"),
        {"f.txt": "a\nx\ny\nb\n"},
        id="insertion_between_context",
    ),
    pytest.param(
        {"f.txt": "a\n\nb\n"},
        P("*** Update File: f.txt", "@@", " a", "", "-b", "+c"),
        {"f.txt": "a\n\nc\n"},
        id="empty_line_is_empty_context",
    ),
    pytest.param(
        {"f.txt": "a\nb\n"},
        P("*** Update File: f.txt", "@@", " a", "-b", "+c", ""),
        {"f.txt": "a\nc\n"},
        id="trailing_blank_hunk_line_retried_without_it",
    ),
    # ---------------------------------------------------------------- move
    pytest.param(
        {"old/name.txt": "old content\n", "old/other.txt": "unrelated\n"},
        P("*** Update File: old/name.txt", "*** Move to: renamed/dir/name.txt", "@@", "-old content", "+new content"),
        {"old/other.txt": "unrelated\n", "renamed/dir/name.txt": "new content\n"},
        id="004_move_with_edit",
    ),
    pytest.param(
        {"a.txt": "no newline", "b.txt": "x\n"},
        P("*** Update File: a.txt", "*** Move to: c/a.txt"),
        {"c/a.txt": "no newline", "b.txt": "x\n"},
        id="pure_rename_keeps_bytes",
    ),
    pytest.param(
        {"a.txt": "x\n"},
        P("*** Update File: a.txt", "*** Move to: b.txt", "@@", "-x", "+y", "*** Add File: a.txt", "+again"),
        {"a.txt": "again\n", "b.txt": "y\n"},
        id="move_then_add_at_old_path",
    ),
    # ---------------------------------------------------------------- positioning
    pytest.param(
        {"m.py": PY},
        P("*** Update File: m.py", "@@ class B:", "@@     def run(self):", "-        return 1", "+        return 2"),
        {"m.py": py(b=2)},
        id="stacked_headers_pick_second_block",
    ),
    pytest.param(
        {"m.py": PY},
        P("*** Update File: m.py", "@@ class A:", "     def run(self):", "-        return 1", "+        return 0"),
        {"m.py": py(a=0)},
        id="header_picks_first_block",
    ),
    pytest.param(
        {"m.py": PY},
        P(
            "*** Update File: m.py",
            "@@ class A:",
            "-        return 1",
            "+        return 10",
            "@@ class B:",
            "-        return 1",
            "+        return 20",
        ),
        {"m.py": py(10, 20)},
        id="headers_in_two_hunks",
    ),
    pytest.param(
        {"m.py": PY},
        P("*** Update File: m.py", "@@ -6,3 +6,3 @@ class B:", "-        return 1", "+        return 2"),
        {"m.py": py(b=2)},
        id="unified_range_header_tolerated",
    ),
    pytest.param(
        {"tail.txt": "end\nmiddle\nend\n"},
        P("*** Update File: tail.txt", "@@", "-end", "+END", "*** End of File"),
        {"tail.txt": "end\nmiddle\nEND\n"},
        id="022_end_of_file_anchors_at_end",
    ),
    pytest.param(
        {"f.txt": "a\nb\n"},
        P("*** Update File: f.txt", "@@", " b", "+c", "*** End of File"),
        {"f.txt": "a\nb\nc\n"},
        id="end_of_file_append",
    ),
    pytest.param(
        {"input.txt": "line1\nline2\n"},
        P("*** Update File: input.txt", "@@", "+added line 1", "+added line 2"),
        {"input.txt": "line1\nline2\nadded line 1\nadded line 2\n"},
        id="016_pure_addition_appends_at_end",
    ),
    pytest.param(
        {"m.py": "import os\n\ndef f():\n    pass\n"},
        P("*** Update File: m.py", "@@ import os", "+import sys"),
        {"m.py": "import os\nimport sys\n\ndef f():\n    pass\n"},
        id="pure_addition_under_header_goes_after_it",
    ),
    pytest.param({"e.txt": ""}, P("*** Update File: e.txt", "@@", "+first"), {"e.txt": "first\n"}, id="update_empty_file"),
    # ---------------------------------------------------------------- tolerant matching
    pytest.param(
        {"f.py": "x = 1   \ny = 2\t\n"},
        P("*** Update File: f.py", "@@", " x = 1", "-y = 2", "+y = 3"),
        {"f.py": "x = 1   \ny = 3\n"},
        id="trailing_whitespace_ignored_context_kept",
    ),
    pytest.param(
        {"f.py": "def f():\n\tif x:\n\t\treturn 1\n"},
        P("*** Update File: f.py", "@@", "     if x:", "-        return 1", "+\t\treturn 2"),
        {"f.py": "def f():\n\tif x:\n\t\treturn 2\n"},
        id="tabs_vs_spaces_leading_whitespace_ignored",
    ),
    pytest.param(
        {"f.py": "a\n  b\nb\n"},
        P("*** Update File: f.py", "@@", "-b", "+B"),
        {"f.py": "a\n  b\nB\n"},
        id="exact_match_preferred_over_fuzzy_earlier",
    ),
    pytest.param(
        {"doc.txt": "It’s “quoted” — here\nnext\n"},
        P("*** Update File: doc.txt", "@@", ' It\'s "quoted" - here', "-next", "+NEXT"),
        {"doc.txt": "It’s “quoted” — here\nNEXT\n"},
        id="unicode_punctuation_fallback_keeps_file_text",
    ),
    pytest.param(
        {"doc.txt": "a\u00a0b\nc–d\n"},
        P("*** Update File: doc.txt", "@@", "-a b", "-c-d", "+ab", "+cd"),
        {"doc.txt": "ab\ncd\n"},
        id="nbsp_and_en_dash_fallback",
    ),
    pytest.param(
        {"foo.txt": "héllo 世界\n😀 emoji\n"},
        P("*** Update File: foo.txt", "@@", "-héllo 世界", "+こんにちは 世界", " 😀 emoji"),
        {"foo.txt": "こんにちは 世界\n😀 emoji\n"},
        id="019_unicode_content",
    ),
    # ---------------------------------------------------------------- line endings
    pytest.param(
        {"w.txt": "one\r\ntwo\r\nthree\r\n"},
        P("*** Update File: w.txt", "@@", " one", "-two", "+TWO", "+2.5"),
        {"w.txt": "one\r\nTWO\r\n2.5\r\nthree\r\n"},
        id="crlf_file_stays_crlf",
    ),
    pytest.param(
        {"w.txt": "one\r\ntwo"},
        P("*** Update File: w.txt", "@@", "-two", "+2"),
        {"w.txt": "one\r\n2"},
        id="crlf_without_final_newline",
    ),
    pytest.param(
        {"f.txt": "a\nb\n"},
        P("*** Update File: f.txt", "@@", " a", "-b", "+c").replace("\n", "\r\n"),
        {"f.txt": "a\nc\n"},
        id="crlf_patch_text_on_lf_file",
    ),
    pytest.param(
        {"mixed.txt": "a\r\nb\nc\n"},
        P("*** Update File: mixed.txt", "@@", " b", "-c", "+C"),
        {"mixed.txt": "a\r\nb\nC\n"},
        id="mixed_endings_untouched_lines_kept",
    ),
    pytest.param(
        {"f.txt": "a\nb\nc"},
        P("*** Update File: f.txt", "@@", "-a", "+A", " b"),
        {"f.txt": "A\nb\nc"},
        id="no_final_newline_kept_edit_middle",
    ),
    pytest.param(
        {"no_newline.txt": "no newline at end"},
        P("*** Update File: no_newline.txt", "@@", "-no newline at end", "+first line", "+second line"),
        {"no_newline.txt": "first line\nsecond line"},
        id="014_no_final_newline_kept_edit_last_line",
    ),
    pytest.param(
        {"f.txt": "a\nb\n"},
        P("*** Update File: f.txt", "@@", " a", "-b", "*** End of File"),
        {"f.txt": "a\n"},
        id="final_newline_kept_when_last_line_removed",
    ),
    pytest.param({"f.txt": "a\nb\n"}, P("*** Update File: f.txt", "@@", "-a", "-b"), {"f.txt": ""}, id="all_lines_removed"),
    pytest.param(
        {"b.txt": "\ufeffkey=1\nother=2\n"},
        P("*** Update File: b.txt", "@@", "-key=1", "+key=2"),
        {"b.txt": "\ufeffkey=2\nother=2\n"},
        id="utf8_bom_kept",
    ),
    # ---------------------------------------------------------------- envelope leniency
    pytest.param(
        {"file.txt": "one\n"},
        " *** Begin Patch\n*** Update File: file.txt\n@@\n-one\n+two\n*** End Patch \n",
        {"file.txt": "two\n"},
        id="018_padded_envelope_markers",
    ),
    pytest.param(
        {"file.txt": "one\n"},
        "*** Begin Patch \n*** Update File: file.txt\n@@\n-one\n+two\n *** End Patch\n",
        {"file.txt": "two\n"},
        id="020_padded_marker_lines",
    ),
    pytest.param(
        {"foo.txt": "old\n"},
        "*** Begin Patch\n  *** Update File: foo.txt\n@@\n-old\n+new\n*** End Patch\n",
        {"foo.txt": "new\n"},
        id="017_padded_file_header",
    ),
    pytest.param({}, "\n\n*** Begin Patch\n*** Add File: a\n+x\n*** End Patch", {"a": "x\n"}, id="leading_blank_lines_no_final_lf"),
    pytest.param(
        {"a.txt": "x\n"},
        P("*** Environment ID: prod-env", "*** Update File: a.txt", "@@", "-x", "+y"),
        {"a.txt": "y\n"},
        id="environment_id_ignored",
    ),
    pytest.param(
        {"a.txt": "x\n"},
        P("*** Update File: a.txt", "@@", "-x", "+y", "", "", "*** Add File: b.txt", "+b", "", "*** Delete File: a.txt"),
        {"b.txt": "b\n"},
        id="blank_lines_between_operations",
    ),
    pytest.param({}, "<<'EOF'\n" + P("*** Add File: h.txt", "+hi") + "EOF\n", {"h.txt": "hi\n"}, id="heredoc_wrapped_patch_text"),
    pytest.param(
        {},
        "apply_patch <<'EOF'\n" + P("*** Add File: h.txt", "+hi") + "EOF\n",
        {"h.txt": "hi\n"},
        id="full_heredoc_command_as_patch_text",
    ),
    # ---------------------------------------------------------------- operations see earlier ones
    pytest.param(
        {},
        P("*** Add File: n.txt", "+one", "*** Update File: n.txt", "@@", "-one", "+two"),
        {"n.txt": "two\n"},
        id="add_then_update_same_file",
    ),
    pytest.param({"d.txt": "old\n"}, P("*** Delete File: d.txt", "*** Add File: d.txt", "+new"), {"d.txt": "new\n"}, id="delete_then_add"),
    pytest.param({}, P("*** Add File: ./src//m.py", "+pass"), {"src/m.py": "pass\n"}, id="path_normalised"),
    # ---------------------------------------------------------------- envelope errors
    pytest.param({}, "", Fails("Invalid patch: The first line of the patch must be '*** Begin Patch'", line=1), id="err_empty"),
    pytest.param({}, "  \n\n", Fails("The first line of the patch must be", line=1), id="err_whitespace_only"),
    pytest.param(
        {}, "*** Begin Patch", Fails("Invalid patch: The last line of the patch must be '*** End Patch'", line=1), id="err_begin_alone"
    ),
    pytest.param(
        {}, "hello world\n", Fails("Invalid patch: The first line of the patch must be '*** Begin Patch'", line=1), id="err_no_begin"
    ),
    pytest.param(
        {},
        "*** Begin Patch\n*** Add File: a\n+x\n",
        Fails("last line of the patch must be '*** End Patch'", line=3),
        id="err_missing_end_patch",
    ),
    pytest.param(
        {}, P("*** Add File: a", "+x") + "thanks!\n", Fails("The last line of the patch must be", line=5), id="err_text_after_end_patch"
    ),
    pytest.param({}, P(), Fails("No files were modified."), id="005_rejects_empty_patch"),
    pytest.param(
        {},
        P("*** Add File: a", "+x", "*** End Patch", "*** Add File: b", "+y"),
        Fails("'*** End Patch' before the end", line=4),
        id="err_end_patch_in_middle",
    ),
    pytest.param(
        {"foo.txt": "x\n"},
        P("*** Frobnicate File: foo.txt"),
        Fails(
            "Invalid patch hunk on line 2: '*** Frobnicate File: foo.txt' is not a valid hunk header. Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'",
            line=2,
        ),
        id="013_unknown_marker",
    ),
    pytest.param(
        {"a.txt": "x\n"},
        P("*** Add File: b.txt", "+y", "*** Environment ID: late"),
        Fails("Environment ID", line=4),
        id="err_environment_id_late",
    ),
    pytest.param({}, P("*** Move to: b.txt"), Fails("must come right after", line=2), id="err_stray_move_to"),
    # ---------------------------------------------------------------- hunk syntax errors
    pytest.param(
        {"a.py": "x = 1\n"},
        P("*** Update File: a.py", "@@", "-x = 1", "y = 2"),
        Fails(
            "Invalid patch hunk on line 5: Unexpected line found in update hunk: 'y = 2'. Every line should start with ' ' (context line), '+' (added line), or '-' (removed line)",
            line=5,
        ),
        id="err_bad_hunk_line_prefix",
    ),
    pytest.param(
        {"a.py": "x = 1\n"},
        P("*** Update File: a.py", "x = 1"),
        Fails("Unexpected line found in update hunk: 'x = 1'", line=3),
        id="err_bad_first_hunk_line",
    ),
    pytest.param(
        {"foo.txt": "x\n"},
        P("*** Update File: foo.txt"),
        Fails("Invalid patch hunk on line 2: Update file hunk for path 'foo.txt' is empty", line=2),
        id="008_rejects_empty_update",
    ),
    pytest.param(
        {"foo.txt": "x\n"},
        P("*** Update File: foo.txt", "@@ x"),
        Fails("Invalid patch hunk on line 3: Update hunk does not contain any lines", line=3),
        id="err_header_without_lines",
    ),
    pytest.param(
        {"f.txt": "x\n"},
        P("*** Update File: f.txt", "@@", "*** End of File"),
        Fails("Update hunk does not contain any lines", line=4),
        id="err_eof_without_lines",
    ),
    pytest.param(
        {"f.txt": "x\n"},
        P("*** Update File: f.txt", "@@", "-x", "+y", "*** End of File", " z"),
        Fails("after '*** End of File'", line=7),
        id="err_lines_after_eof_marker",
    ),
    pytest.param({}, P("*** Add File: a.txt", "+x", "y"), Fails("must start with '+'", "'y'", line=4), id="err_add_line_without_plus"),
    pytest.param({}, P("*** Add File: a.txt", "+x", "", "+z"), Fails("blank line inside", line=4), id="err_blank_line_in_add"),
    pytest.param({}, P("*** Delete File: a.txt", "-x"), Fails("'-x' is not a valid hunk header", line=3), id="err_lines_after_delete"),
    # ---------------------------------------------------------------- paths
    pytest.param({}, P("*** Add File: /etc/passwd", "+x"), Fails("absolute path '/etc/passwd'", line=2), id="err_absolute_path"),
    pytest.param({}, P("*** Add File: C:\\x.txt", "+x"), Fails("absolute path", line=2), id="err_windows_absolute_path"),
    pytest.param({}, P("*** Add File: ../outside.txt", "+x"), Fails("escapes the working directory", line=2), id="err_dotdot_escape"),
    pytest.param(
        {"a/b.txt": "x\n"}, P("*** Delete File: a/../../b.txt"), Fails("escapes the working directory"), id="err_nested_dotdot_escape"
    ),
    pytest.param({}, P("*** Add File: ~/x.txt", "+x"), Fails("starts with '~'"), id="err_home_path"),
    pytest.param({}, P("*** Add File: ", "+x"), Fails("needs a path", line=2), id="err_missing_path"),
    pytest.param(
        {"a.txt": "x\n"},
        P("*** Update File: a.txt", "*** Move to: /tmp/a.txt", "@@", "-x", "+y"),
        Fails("absolute path", line=3),
        id="err_move_to_absolute",
    ),
    # ---------------------------------------------------------------- file-state errors
    pytest.param(
        {"duplicate.txt": "old\n"},
        P("*** Add File: duplicate.txt", "+new"),
        Fails("cannot add duplicate.txt", "already exists", "*** Update File: duplicate.txt"),
        id="011_add_existing_file",
    ),
    pytest.param(
        {"foo.txt": "x\n"}, P("*** Delete File: missing.txt"), Fails("Failed to delete file missing.txt"), id="007_delete_missing"
    ),
    pytest.param(
        {"foo.txt": "x\n"},
        P("*** Update File: missing.txt", "@@", "-x", "+y"),
        Fails("Failed to read file to update missing.txt: No such file or directory (os error 2)", line=2),
        id="009_update_missing",
    ),
    pytest.param(
        {"a.txt": "x\n"},
        P("*** Delete File: a.txt", "*** Update File: a.txt", "@@", "-x", "+y"),
        Fails("Failed to read file to update a.txt"),
        id="err_update_after_delete",
    ),
    pytest.param(
        {"old/name.txt": "from\n", "renamed/dir/name.txt": "existing\n"},
        P("*** Update File: old/name.txt", "*** Move to: renamed/dir/name.txt", "@@", "-from", "+new"),
        Fails("cannot move old/name.txt to renamed/dir/name.txt", "already exists"),
        id="010_move_onto_existing",
    ),
    pytest.param(
        {"modify.txt": "line1\nline2\n"},
        P("*** Update File: modify.txt", "@@", "-missing", "+changed"),
        Fails("Failed to find expected lines in modify.txt:\nmissing", line=3),
        id="006_missing_context",
    ),
    pytest.param(
        {"src/app.py": "def f():\n    a = 1\n    b = 2\n    return a + b\n"},
        P("*** Update File: src/app.py", "@@ def f():", "     a = 1", "-    b = 3", "+    b = 4", "     return a + b"),
        Fails("Failed to find expected lines in src/app.py:\n    a = 1\n    b = 3\n    return a + b"),
        id="err_context_mismatch_quotes_all_old_lines",
    ),
    pytest.param(
        {"m.py": PY},
        P("*** Update File: m.py", "@@ class C:", "-        return 1", "+        return 2"),
        Fails("Failed to find context 'class C:' in m.py", line=3),
        id="err_header_not_found",
    ),
    pytest.param(
        {"f.txt": "a\nb\nc\nd\n"},
        P("*** Update File: f.txt", "@@", "-c", "+C", "@@", "-a", "+A"),
        Fails("Failed to find expected lines in f.txt:\na"),
        id="err_hunks_out_of_order",
    ),
    pytest.param(
        {"f.txt": "end\nmiddle\n"},
        P("*** Update File: f.txt", "@@", "-end", "+END", "*** End of File"),
        Fails("Failed to find expected lines in f.txt:\nend"),
        id="err_eof_anchor_not_at_end",
    ),
    pytest.param(
        {"a.txt": "x\n", "b.txt": "y\n"},
        P("*** Update File: a.txt", "@@", "-x", "+X", "*** Update File: b.txt", "@@", "-nope", "+Y"),
        Fails("Failed to find expected lines in b.txt:\nnope", line=7),
        id="015_second_file_fails_whole_patch_fails",
    ),
]


@pytest.mark.parametrize(("files", "patch", "expected"), CASES)
def test_conformance(files: dict[str, str], patch: str, expected: dict[str, str] | Fails) -> None:
    before = dict(files)
    if isinstance(expected, Fails):
        with pytest.raises(PatchError) as info:
            run(files, patch)
        message = str(info.value)
        for fragment in expected.fragments:
            assert fragment in message, f"{fragment!r} not in error:\n{message}"
        if expected.line is not None:
            assert info.value.line == expected.line, message
    else:
        assert run(files, patch) == expected
    assert files == before  # apply_patch never writes


# ---------------------------------------------------------------------------- Codex's scenarios

# One test per scenario of Codex's own fixture set (codex-rs/apply-patch/tests/fixtures/scenarios),
# written from the behaviour each one pins: the final tree, and what the tool prints (Codex's
# texts, as its tool.rs asserts them). These run with the default, Codex's semantics.
SCENARIOS = [
    ("001_add_file", {}, P("*** Add File: bar.md", "+This is a new file"), {"bar.md": "This is a new file\n"}, "A bar.md"),
    (
        "002_multiple_operations",
        {"delete.txt": "obsolete\n", "modify.txt": "line1\nline2\n"},
        P(
            "*** Add File: nested/new.txt",
            "+created",
            "*** Delete File: delete.txt",
            "*** Update File: modify.txt",
            "@@",
            "-line2",
            "+changed",
        ),
        {"modify.txt": "line1\nchanged\n", "nested/new.txt": "created\n"},
        "A nested/new.txt\nM modify.txt\nD delete.txt",
    ),
    (
        "003_multiple_chunks",
        {"multi.txt": "line1\nline2\nline3\nline4\n"},
        P("*** Update File: multi.txt", "@@", "-line2", "+changed2", "@@", "-line4", "+changed4"),
        {"multi.txt": "line1\nchanged2\nline3\nchanged4\n"},
        "M multi.txt",
    ),
    (
        "004_move_to_new_directory",
        {"old/name.txt": "old content\n", "old/other.txt": "unrelated file\n"},
        P("*** Update File: old/name.txt", "*** Move to: renamed/dir/name.txt", "@@", "-old content", "+new content"),
        {"old/other.txt": "unrelated file\n", "renamed/dir/name.txt": "new content\n"},
        "M renamed/dir/name.txt",
    ),
    ("005_rejects_empty_patch", {"foo.txt": "stable\n"}, P(), {"foo.txt": "stable\n"}, Fails("No files were modified.")),
    (
        "006_rejects_missing_context",
        {"modify.txt": "line1\nline2\n"},
        P("*** Update File: modify.txt", "@@", "-missing", "+changed"),
        {"modify.txt": "line1\nline2\n"},
        Fails("Failed to find expected lines in modify.txt:\nmissing"),
    ),
    (
        "007_rejects_missing_file_delete",
        {"foo.txt": "stable\n"},
        P("*** Delete File: missing.txt"),
        {"foo.txt": "stable\n"},
        Fails("Failed to delete file missing.txt"),
    ),
    (
        "008_rejects_empty_update_hunk",
        {"foo.txt": "stable\n"},
        P("*** Update File: foo.txt"),
        {"foo.txt": "stable\n"},
        Fails("Invalid patch hunk on line 2: Update file hunk for path 'foo.txt' is empty"),
    ),
    (
        "009_requires_existing_file_for_update",
        {"foo.txt": "stable\n"},
        P("*** Update File: missing.txt", "@@", "-old", "+new"),
        {"foo.txt": "stable\n"},
        Fails("Failed to read file to update missing.txt: No such file or directory (os error 2)"),
    ),
    (
        "010_move_overwrites_existing_destination",
        {"old/name.txt": "from\n", "old/other.txt": "unrelated file\n", "renamed/dir/name.txt": "existing\n"},
        P("*** Update File: old/name.txt", "*** Move to: renamed/dir/name.txt", "@@", "-from", "+new"),
        {"old/other.txt": "unrelated file\n", "renamed/dir/name.txt": "new\n"},
        "M renamed/dir/name.txt",
    ),
    (
        "011_add_overwrites_existing_file",
        {"duplicate.txt": "old content\n"},
        P("*** Add File: duplicate.txt", "+new content"),
        {"duplicate.txt": "new content\n"},
        "A duplicate.txt",
    ),
    (
        "012_delete_directory_fails",
        {"dir/foo.txt": "stable\n"},
        P("*** Delete File: dir"),
        {"dir/foo.txt": "stable\n"},
        Fails("Failed to delete file dir"),
    ),
    (
        "013_rejects_invalid_hunk_header",
        {"foo.txt": "stable\n"},
        P("*** Frobnicate File: foo"),
        {"foo.txt": "stable\n"},
        Fails(
            "Invalid patch hunk on line 2: '*** Frobnicate File: foo' is not a valid hunk header. Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"
        ),
    ),
    (
        "014_update_file_appends_trailing_newline",
        {"no_newline.txt": "no newline at end"},
        P("*** Update File: no_newline.txt", "@@", "-no newline at end", "+first line", "+second line"),
        {"no_newline.txt": "first line\nsecond line\n"},
        "M no_newline.txt",
    ),
    (
        "015_failure_after_partial_success_leaves_changes",
        {},
        P("*** Add File: created.txt", "+hello", "*** Update File: missing.txt", "@@", "-old", "+new"),
        {"created.txt": "hello\n"},
        Fails("Failed to read file to update missing.txt: No such file or directory (os error 2)", "kept: A created.txt"),
    ),
    (
        "016_pure_addition_update_chunk",
        {"input.txt": "line1\nline2\n"},
        P("*** Update File: input.txt", "@@", "+added line 1", "+added line 2"),
        {"input.txt": "line1\nline2\nadded line 1\nadded line 2\n"},
        "M input.txt",
    ),
    (
        "017_whitespace_padded_hunk_header",
        {"foo.txt": "old\n"},
        P("  *** Update File: foo.txt", "@@", "-old", "+new"),
        {"foo.txt": "new\n"},
        "M foo.txt",
    ),
    (
        "018_whitespace_padded_patch_markers",
        {"file.txt": "one\n"},
        " *** Begin Patch\n*** Update File: file.txt\n@@\n-one\n+two\n*** End Patch \n",
        {"file.txt": "two\n"},
        "M file.txt",
    ),
    (
        "019_unicode_simple",
        {"foo.txt": "line1\nnaïve café\nline3\n"},
        P("*** Update File: foo.txt", "@@", " line1", "-naïve café", "+naïve café ✅"),
        {"foo.txt": "line1\nnaïve café ✅\nline3\n"},
        "M foo.txt",
    ),
    (
        "020_delete_file_success",
        {"keep.txt": "keep\n", "obsolete.txt": "obsolete\n"},
        P("*** Delete File: obsolete.txt"),
        {"keep.txt": "keep\n"},
        "D obsolete.txt",
    ),
    (
        "020_whitespace_padded_patch_marker_lines",
        {"file.txt": "one\n"},
        "*** Begin Patch \n*** Update File: file.txt\n@@\n-one\n+two\n *** End Patch\n",
        {"file.txt": "two\n"},
        "M file.txt",
    ),
    (
        "021_update_file_deletion_only",
        {"lines.txt": "line1\nline2\nline3\n"},
        P("*** Update File: lines.txt", "@@", " line1", "-line2", " line3"),
        {"lines.txt": "line1\nline3\n"},
        "M lines.txt",
    ),
    (
        "022_update_file_end_of_file_marker",
        {"tail.txt": "first\nsecond\n"},
        P("*** Update File: tail.txt", "@@", " first", "-second", "+second updated", "*** End of File"),
        {"tail.txt": "first\nsecond updated\n"},
        "M tail.txt",
    ),
]


def codex_tool(files: dict[str, str], patch: str) -> tuple[dict[str, str], str]:
    """What the tool does with a patch under Codex's semantics: the tree after it, and its output."""

    def read(path: str) -> str | None:
        if any(p.startswith(path + "/") for p in files):  # a folder: no file to read, as on disk
            return None
        return files.get(path)

    try:
        changes = apply_patch(patch, read)
    except PatchError as exc:
        return write(files, exc.applied), str(exc)
    return write(files, changes), summary(changes)


@pytest.mark.parametrize(("name", "files", "patch", "expected", "output"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_codex_scenario(name: str, files: dict[str, str], patch: str, expected: dict[str, str], output: str | Fails) -> None:
    tree, printed = codex_tool(files, patch)
    assert tree == expected
    if isinstance(output, Fails):
        assert all(fragment in printed for fragment in output.fragments), printed
        assert printed.startswith(output.fragments[0])
    else:
        assert printed == "Success. Updated the following files:\n" + output + "\n"


def test_the_scenario_set_is_codexs() -> None:
    assert len(SCENARIOS) == 23 and len({s[0] for s in SCENARIOS}) == 23


@pytest.mark.parametrize(
    "name",
    ["010_move_overwrites_existing_destination", "011_add_overwrites_existing_file", "015_failure_after_partial_success_leaves_changes"],
)
def test_strict_semantics_keeps_its_three_refusals(name: str) -> None:
    _name, files, patch, _expected, _output = next(s for s in SCENARIOS if s[0] == name)
    with pytest.raises(PatchError) as info:
        apply_patch(patch, files.get, semantics="strict")
    assert info.value.applied == []  # strict: a failing patch changes nothing
    assert name != "015_failure_after_partial_success_leaves_changes" or "kept" not in str(info.value)


# ---------------------------------------------------------------------------- API details


def test_parse_patch_structure() -> None:
    ops = parse_patch(
        P(
            "*** Add File: path/add.py",
            "+abc",
            "*** Delete File: path/delete.py",
            "*** Update File: path/update.py",
            "*** Move to: path/update2.py",
            "@@ class A:",
            "@@ def f():",
            "-    pass",
            "+    return 123",
            "@@",
            " tail",
            "+more",
            "*** End of File",
        )
    )
    assert ops[0] == AddFile("path/add.py", "abc\n", 2)
    assert ops[1] == DeleteFile("path/delete.py", 4)
    update = ops[2]
    assert isinstance(update, UpdateFile)
    assert (update.path, update.move_to, update.line) == ("path/update.py", "path/update2.py", 5)
    first, second = update.chunks
    assert first.headers == ("class A:", "def f():") and first.line == 7 and not first.end_of_file
    assert first.lines == (("-", "    pass"), ("+", "    return 123"))
    assert second.headers == () and second.end_of_file and second.lines == ((" ", "tail"), ("+", "more"))


def test_summary_format() -> None:
    changes = [
        FileChange("m.txt", "update", None, "x\n"),
        FileChange("gone.txt", "delete"),
        FileChange("new.txt", "add", None, "n\n"),
        FileChange("old.txt", "update", "moved/new_name.txt", "y\n"),
    ]
    assert summary(changes) == "Success. Updated the following files:\nA new.txt\nM m.txt\nM moved/new_name.txt\nD gone.txt\n"


def test_summary_from_apply() -> None:
    files = {"a.txt": "a\n", "b.txt": "b\n"}
    patch = P("*** Delete File: a.txt", "*** Add File: c.txt", "+c", "*** Update File: b.txt", "@@", "-b", "+B")
    changes = apply_patch(patch, files.get)
    assert [(c.path, c.kind) for c in changes] == [("a.txt", "delete"), ("c.txt", "add"), ("b.txt", "update")]
    assert summary(changes) == "Success. Updated the following files:\nA c.txt\nM b.txt\nD a.txt\n"


def test_read_called_with_normalised_paths_and_errors_wrapped() -> None:
    seen: list[str] = []

    def read(path: str) -> str | None:
        seen.append(path)
        raise OSError("permission denied")

    with pytest.raises(PatchError, match="cannot read a/b.txt as text: permission denied"):
        apply_patch(P("*** Delete File: ./a//b.txt"), read)
    assert seen == ["a/b.txt"]


def test_error_line_numbers_count_from_the_begin_patch_line() -> None:
    """As Codex counts them: inside a heredoc or after blank lines, '*** Begin Patch' is line 1."""
    for text in (
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a.txt\nbogus\n*** End Patch\nEOF",
        "\n\n*** Begin Patch\n*** Update File: a.txt\nbogus\n*** End Patch\n",
    ):
        with pytest.raises(PatchError) as info:
            parse_patch(text)
        assert info.value.line == 3 and str(info.value).startswith(
            "Invalid patch hunk on line 3: Unexpected line found in update hunk: 'bogus'"
        )


# ---------------------------------------------------------------------------- heredoc form

BODY = "*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch"


@pytest.mark.parametrize(
    "command",
    [
        f"apply_patch <<'EOF'\n{BODY}\nEOF",
        f"apply_patch <<'EOF'\n{BODY}\nEOF\n",
        f"apply_patch <<EOF\n{BODY}\nEOF\n",
        f'apply_patch <<"PATCH"\n{BODY}\nPATCH\n',
        f"applypatch <<'PATCH'\n{BODY}\nPATCH",
        f"apply_patch << 'EOF'\n{BODY}\nEOF\n\n",
        f"\n  apply_patch <<'EOF'  \n{BODY}\nEOF",
        f"apply_patch <<'EOF'\n{BODY}\nEOF\n".replace("\n", "\r\n"),
        "apply_patch <<-'EOF'\n\t" + BODY.replace("\n", "\n\t") + "\n\tEOF\n",
        f"apply_patch <<'EOF'\n{BODY}\n",  # no terminator: bash reads to the end
    ],
    ids=[
        "quoted",
        "quoted_lf",
        "bare",
        "double_quoted_PATCH",
        "applypatch",
        "space_after_<<",
        "leading_ws",
        "crlf",
        "dash_tabs",
        "unterminated",
    ],
)
def test_extract_heredoc(command: str) -> None:
    patch = extract_heredoc(command)
    assert patch is not None
    assert patch.replace("\r", "") == BODY
    assert run({}, patch) == {"foo": "hi\n"}


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "",
        "apply_patch",
        f"cat <<'EOF'\n{BODY}\nEOF",
        f"apply_patch <<'EOF' && echo done\n{BODY}\nEOF",
        f"apply_patch <<'EOF'\n{BODY}\nEOF\necho done",
        f"echo hi; apply_patch <<'EOF'\n{BODY}\nEOF",
        f"apply_patch foo <<'EOF'\n{BODY}\nEOF",
        f"cd src && apply_patch <<'EOF'\n{BODY}\nEOF",  # needs the workdir: see match_apply_patch_command
        f"<<'EOF'\n{BODY}\nEOF",
    ],
)
def test_extract_heredoc_rejects(command: str) -> None:
    assert extract_heredoc(command) is None


@pytest.mark.parametrize(
    ("prefix", "workdir"),
    [("", None), ("cd src && ", "src"), ("cd 'my dir' && ", "my dir"), ('cd "a b" &&', "a b")],
)
def test_match_apply_patch_command_with_cd(prefix: str, workdir: str | None) -> None:
    assert match_apply_patch_command(f"{prefix}apply_patch <<'EOF'\n{BODY}\nEOF\n") == ApplyPatchCommand(BODY, workdir)


@pytest.mark.parametrize("prefix", ["cd a b && ", "cd a; ", "cd a || ", "cd a | ", "cd a && cd b && "])
def test_match_apply_patch_command_rejects_other_cd_forms(prefix: str) -> None:
    assert match_apply_patch_command(f"{prefix}apply_patch <<'EOF'\n{BODY}\nEOF") is None


# ---------------------------------------------------------------------------- robustness


GARBAGE = [
    None,
    b"*** Begin Patch",
    "\x00\x01\x02\xff\ufffd",
    "*** Begin Patch\n\x00\x00\x00\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.txt\n@@\n" + "-" + "x" * 1_000_000 + "\n*** End Patch",
    "*** Begin Patch\n*** Add File: " + "y" * 100_000 + "\n+x\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.txt\n*** Move to:\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.txt\n@@\n*** End Patch",
    "*** Begin Patch\n*** Update File:\n*** End Patch",
    "*** Begin Patch\n@@\n-x\n*** End Patch",
    "*** Begin Patch\n+x\n*** End Patch",
    "*** End Patch\n*** Begin Patch",
    "*** Begin Patch\n*** Add File: .\n+x\n*** End Patch",
    "*** Begin Patch\n*** Add File: a/\n+x\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.txt\n-\n-\n-\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.txt\n@@\n\n\n\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.txt\n@@ \x00\n-x\n*** End Patch",
    "<<'EOF'\nEOF",
    "<<'EOF'\n*** Begin Patch\nEOF",
    "apply_patch <<'EOF'\n\nEOF",
    "\r\r\r",
    "\u2028*** Begin Patch\u2028*** End Patch",
]


@pytest.mark.parametrize("text", GARBAGE, ids=[f"garbage{i}" for i in range(len(GARBAGE))])
def test_garbage_raises_only_patch_error(text: object) -> None:
    with pytest.raises(PatchError):
        apply_patch(text, {"a.txt": "x\n"}.get)  # type: ignore[arg-type]


def test_random_fragments_raise_only_patch_error() -> None:
    pieces = [
        "*** Begin Patch",
        "*** End Patch",
        "*** Add File: a.txt",
        "*** Add File: ../x",
        "*** Delete File: a.txt",
        "*** Update File: a.txt",
        "*** Update File: b.txt",
        "*** Move to: c.txt",
        "*** Move to: a.txt",
        "*** End of File",
        "*** Environment ID: e",
        "@@",
        "@@ x",
        "@@ -1,2 +1,2 @@",
        " x",
        "-x",
        "+x",
        "-",
        "+",
        " ",
        "",
        "x",
        "\t",
        "<<'EOF'",
        "EOF",
        "apply_patch <<EOF",
        "*",
        "***",
    ]
    rng = random.Random(1234)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        lines = [rng.choice(pieces) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.7:
            lines = ["*** Begin Patch", *lines, "*** End Patch"]
        files = {"a.txt": "x\ny\nx\n", "b.txt": ""}
        try:
            changes = apply_patch("\n".join(lines), files.get)
        except PatchError:
            outcomes["error"] += 1
        else:
            outcomes["ok"] += 1
            summary(changes)
            write(files, changes)
    assert outcomes["ok"] > 0 and outcomes["error"] > 0


# ---------------------------------------------------------------------------- property: difflib round trip


def to_patch(path: str, old: list[str], new: list[str], rng: random.Random) -> str:
    """A patch in this grammar from difflib's grouped opcodes (3 lines of context)."""
    out = ["*** Begin Patch", f"*** Update File: {path}"]
    for group in difflib.SequenceMatcher(None, old, new, autojunk=False).get_grouped_opcodes(3):
        out.append("@@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in old[i1:i2]]
            if tag in ("replace", "delete"):
                out += ["-" + line for line in old[i1:i2]]
            if tag in ("replace", "insert"):
                out += ["+" + line for line in new[j1:j2]]
        if group[-1][2] == len(old) and rng.random() < 0.5:
            out.append("*** End of File")
    out.append("*** End Patch")
    return "\n".join(out) + "\n"


def random_edit(lines: list[str], rng: random.Random, fresh: Callable[[], str]) -> list[str]:
    new = list(lines)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(["insert", "delete", "replace", "block"])
        at = rng.randint(0, len(new))
        if op == "insert" or not new:
            new[at:at] = [fresh() for _ in range(rng.randint(1, 3))]
        elif op == "delete":
            del new[min(at, len(new) - 1) : min(at, len(new) - 1) + rng.randint(1, 3)]
        elif op == "replace":
            new[min(at, len(new) - 1)] = fresh()
        else:
            new[at:at] = [fresh() for _ in range(rng.randint(3, 8))]
    return new


@pytest.mark.parametrize("seed", range(60))
def test_difflib_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    counter = iter(range(10**9))
    words = ["alpha", "beta", "gamma", "δέλτα", "东京", "🙂", "x = 1", "  return y", "\tif z:", "", "# note"]

    def fresh() -> str:
        # Mostly distinct lines (as in real code); a blank now and then. Identical blocks could
        # make a context-only hunk ambiguous, which no patch format without line numbers avoids.
        if rng.random() < 0.08:
            return ""
        return f"{rng.choice(words)} {next(counter)}"

    for _ in range(20):
        old = [fresh() for _ in range(rng.randint(0, 30))]
        new = random_edit(old, rng, fresh)
        if new == old:
            continue
        # (A last line that is empty, with no final newline, is the same text as a final newline.)
        final_newline = rng.random() < 0.8 or not old or old[-1] == ""
        # A file is CRLF only if it has a newline and all of them are CRLF; otherwise new lines get LF.
        eol = rng.choice(["\n", "\r\n"]) if len(old) > 1 or (old and final_newline) else "\n"
        original = eol.join(old) + (eol if final_newline and old else "")
        expected = eol.join(new) + (eol if final_newline and new else "")
        patch = to_patch("f.txt", old, new, rng)
        result = run({"f.txt": original}, patch)
        assert result == {"f.txt": expected}, patch
