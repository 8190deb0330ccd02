"""The docs stay true to the tree: the pipeline field reference is current, and every relative
link in README.md and docs/*.md names a file (and, within the docs, a heading) that exists."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "pipeline_fields_doc.py"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipeline_fields_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, spaces to dashes."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    """`page:line: target` for each relative link whose file or heading does not exist."""
    problems = []
    in_code = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{page.name}:{number}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{page.name}:{number}: {target} (no such heading in {dest.name})")
    return problems


def test_pipeline_field_reference_is_current() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_pipeline_field_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch) -> None:
    script = load_script()
    page = tmp_path / "pipeline.md"
    stale = (ROOT / "docs" / "pipeline.md").read_text().replace("| `workdir` | Path | required |", "| `workdir` | Path | `'x'` |")
    page.write_text(stale)
    monkeypatch.setattr(script, "PAGE", page)
    assert script.main(["--check"]) == 1
    assert page.read_text() == stale  # --check never writes
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0


def test_every_relative_link_resolves() -> None:
    problems = [p for page in PAGES for p in broken_links(page)]
    assert problems == []


def test_link_check_finds_a_missing_file_and_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `relearn run` verb\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#the-relearn-run-verb) [ok](#page) [web](https://example.com/x)\n"
        "[gone](missing.md)\n"
        "```\n[in code](nowhere.md)\n```\n"
        "[bad anchor](other.md#no-such-heading) `[span](nowhere.md)`\n"
    )
    assert broken_links(page) == [
        "page.md:3: missing.md (no such file)",
        "page.md:7: other.md#no-such-heading (no such heading in other.md)",
    ]
