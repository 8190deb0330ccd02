"""Every ``relearn ... --help`` page, at 80 and 160 columns: nothing cut, paragraphs wrapped by
the terminal's width and not by hand, the exit codes on every page; ``relearn --version``."""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from relearn.cli.help_layout import wrap
from relearn.cli.main import app

WIDTHS = (80, 160)
SECTIONS = ("Arguments:", "Options:", "Commands:")


def pages(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """``command`` and every group and verb under it, with the words that reach each."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from pages(sub, [*path, name])


ROOT = typer.main.get_command(app)
PAGES = {" ".join(path) or "relearn": path for path, _ in pages(ROOT, [])}
COMMANDS = {" ".join(path) or "relearn": command for path, command in pages(ROOT, [])}


@functools.cache
def rendered(name: str, width: int) -> str:
    """The help page of ``name`` (a key of PAGES) at ``width`` columns."""
    result = CliRunner().invoke(app, [*PAGES[name], "--help"], terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output


def description(page: str) -> list[list[str]]:
    """The description's paragraphs (after the usage, before the first section), as lines."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Usage:"))
    while lines[start].strip():  # the usage may take several lines
        start += 1
    end = next((i for i, line in enumerate(lines) if line in SECTIONS), len(lines))
    paragraphs, current = [], []
    for line in [*lines[start:end], ""]:
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append(current)
            current = []
    return paragraphs


def whole(word: str, text: str) -> bool:
    """``word`` appears in ``text`` with no letter, digit, hyphen or underscore glued to it."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_the_walk_finds_every_group_and_verb() -> None:
    assert len(PAGES) >= 38
    for expected in ("relearn", "import", "export dataset", "envs build-swebench", "review pool", "single-turn verify", "run", "demo"):
        assert expected in PAGES, expected


@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_help_page_reads_at_80_and_160_columns(name: str) -> None:
    command = COMMANDS[name]
    context = typer.Context(command)
    for width in WIDTHS:
        page = rendered(name, width)
        assert "\u2026" not in page
        too_long = [line for line in page.splitlines() if len(line) > width]
        assert not too_long, (width, too_long)
        for param in command.params:
            if param.hidden:
                continue
            if param.param_type_name == "argument":
                assert (param.metavar or param.name).lower() in page.lower(), (width, param.name)
            else:
                for option in [*param.opts, *param.secondary_opts]:
                    assert whole(option, page), (width, option)
            for choice in param.shell_complete(context, ""):
                if choice.type == "plain":
                    assert whole(choice.value, page), (width, param.name, choice.value)
        for sub in getattr(command, "commands", {}):
            assert whole(sub, page), (width, sub)
        # The exit codes, 3 only where a stage can fail.
        codes = page[page.index("Exit codes:") :]
        for code in ("0", "1", "2"):
            assert re.search(rf"^ +{code}  \S", codes, re.MULTILINE), (width, code)
        assert bool(re.search(r"^ +3  \S", codes, re.MULTILINE)) == (name in ("relearn", "run", "demo")), width

        # Each paragraph of the description is all there, filled to the width: a line ends early
        # only where the next word would not fit (no hand-made breaks, no staircase).
        paragraphs = description(page)
        source = [" ".join(p.split()) for p in re.split(r"\n\s*\n", inspect.cleandoc(command.help or ""))]
        assert [" ".join(" ".join(p).split()) for p in paragraphs] == source, width
        for lines in paragraphs:
            for line, following in zip(lines, lines[1:], strict=False):
                assert len(line) + 1 + len(following.split()[0]) > width, (width, line, following)

    first_80, first_160 = description(rendered(name, 80))[0], description(rendered(name, 160))[0]
    if len(first_80) > 1:
        assert len(first_160) < len(first_80)


def test_the_first_paragraphs_widen_at_160_columns() -> None:
    """Not only in principle: the pages whose first paragraph does not fit a line at 80 columns."""
    lines = {name: [len(description(rendered(name, width))[0]) for width in WIDTHS] for name in PAGES}
    assert sum(1 for at_80, at_160 in lines.values() if at_80 > 1 and at_160 < at_80) >= 10


def test_the_installed_command_follows_the_terminal_width(relearn_bin: str) -> None:
    """COLUMNS, as a shell sets it, is the width: lines fill it and never pass it."""
    first: dict[int, list[str]] = {}
    for width in WIDTHS:
        env = {**os.environ, "COLUMNS": str(width)}
        result = subprocess.run([relearn_bin, "export", "dataset", "--help"], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= width
        assert max(len(line) for line in lines) > width - 20  # it fills the width, it is not capped at 80
        assert "\u2026" not in result.stdout and "sequence_len" in result.stdout
        first[width] = description(result.stdout)[0]
    assert len(first[160]) < len(first[80])


def test_version(relearn_bin: str) -> None:
    for flag in ("--version", "-V"):
        result = CliRunner().invoke(app, [flag])
        assert result.exit_code == 0 and result.output.strip() == f"relearn {version('relearn')}"
    installed = subprocess.run([relearn_bin, "--version"], capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0 and installed.stdout.strip() == f"relearn {version('relearn')}"


def test_export_dataset_warns_of_trainers_that_drop_or_cut_long_rows() -> None:
    page = " ".join(rendered("export dataset", 80).split())
    assert "axolotl drops every row longer than its `sequence_len`" in page
    assert "TRL cuts rows at `max_length`" in page


def test_wrap_never_breaks_a_word_or_a_hyphenated_name() -> None:
    text = "Use --no-overwrite with swe-rebench-openhands at registry.example.com/swe/sweb.eval.{arch}.{instance_key}:{tag} now."
    lines = wrap(text, 24).splitlines()
    assert "--no-overwrite" in " ".join(lines).split() and "swe-rebench-openhands" in " ".join(lines).split()
    assert "registry.example.com/swe/sweb.eval.{arch}.{instance_key}:{tag}" in lines  # alone, longer than the line
    assert all(len(line) <= 24 for line in lines if "registry" not in line)
    # A paragraph marked with \b keeps its lines; the others are refilled.
    assert wrap("one\ntwo\n\n\b\nkept\n  as written", 40, "  ") == "  one two\n\n  kept\n    as written"
