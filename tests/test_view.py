"""``relearn view``: the pool index (plain, zstd, saved and resumed), the rich rendering of
defect spans, ``--print`` in text, ANSI and HTML, and the Textual viewer driven by its
headless pilot."""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from rich.style import Style
from textual.widgets import Static
from typer.testing import CliRunner

from records import byte_offsets as offsets
from records.pool_index import PoolIndex, ReviewIndex
from records.pools import JsonlWriter, read_trajectories, write_atomic
from records.review import Defect, Review, field_text
from records.trajectory import Trajectory
from relearn.cli.main import app as cli_app
from relearn.view.app import ViewerApp
from relearn.view.catalog import Catalog, DatasetInfo, Filter
from relearn.view.marks import RenderOptions
from relearn.view.screen import TrajectoryView

PATCH_INPUT = "*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b\n*** End Patch\n"
LONG_OUTPUT = "\n".join(["Exit code: 0"] + [f"line {i}: needle-middle" if i == 30 else f"line {i}: calc.py ok" for i in range(60)])


def call(call_id: str, name: str, **arguments: object) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def trajectory_a() -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": "traj-a",
            "task_id": "calc-1",
            "policy": {"name": "ckpt", "checkpoint": "iter-10", "step": 10},
            "attempt": 0,
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix add() in calc.py."},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": "The bug is probably in parse(), or maybe in the tokenizer.",
                    "content": "Let me look at the file.",
                    "tool_calls": [call("c1", "shell", command=["bash", "-lc", "cat setup.py"], workdir="/repo")],
                },
                {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": LONG_OUTPUT, "metadata": {"exit_code": 0}},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": "It subtracts.",
                    "tool_calls": [call("c2", "apply_patch", input=PATCH_INPUT)],
                },
                {"role": "tool", "tool_call_id": "c2", "name": "apply_patch", "content": "Success."},
                {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
            ],
            "final_patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n",
            "exit_status": "submitted",
            "outcome": {
                "resolved": True,
                "reward": 1.0,
                "verdict": {
                    "tests": {"FAIL_TO_PASS": {"success": ["t1"], "failure": []}, "PASS_TO_PASS": {"success": ["t2", "t3"], "failure": []}}
                },
            },
        }
    )


def trajectory_b() -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": "traj-b",
            "task_id": "calc-1",
            "policy": {"name": "ckpt", "checkpoint": "iter-20", "step": 20},
            "attempt": 1,
            "messages": [
                {"role": "user", "content": "Fix add() in calc.py."},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "Running the tests.",
                    "tool_calls": [call("c1", "shell", command=["pytest"])],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "1 failed: needle-b"},
            ],
            "exit_status": "turns_exhausted",
            "outcome": {"resolved": False, "reward": 0.0},
        }
    )


def trajectory_c() -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": "traj-c",
            "task_id": "calc-2",
            "policy": {"name": "ckpt", "checkpoint": "iter-30", "step": 30},
            "messages": [
                {"role": "user", "content": "Fix sub()."},
                {"role": "assistant", "generated": True, "content": "I will guess: needle-c. Then fix it properly."},
            ],
            "exit_status": "submitted",
            "outcome": {"resolved": True},
        }
    )


def defect(t: Trajectory, index: int, field: str, quote: str, category: str, description: str = "") -> Defect:
    text = field_text(t.messages[index], field)
    assert text is not None and quote in text
    start = text.index(quote)
    return Defect(
        message_index=index, field=field, start=start, end=start + len(quote), quote=quote, category=category, description=description
    )


def reviews_for(a: Trajectory, c: Trajectory) -> list[Review]:
    patch_json = json.dumps(a.messages[4].tool_calls[0].function.arguments, ensure_ascii=False)  # type: ignore[index]
    escaped = "Begin Patch\\n*** Update"  # in the JSON text the newline is two characters
    assert escaped in patch_json
    defects_a = [
        defect(a, 2, "reasoning_content", "probably in parse()", "wrong_hypothesis", "the bug is in add()"),
        defect(a, 2, "reasoning_content", "parse(), or maybe", "redundant_exploration", "guessing twice"),
        defect(a, 2, "tool_calls[0].arguments", "cat setup.py", "corrected_mistake", "there is no setup.py"),
        defect(a, 4, "tool_calls[0].arguments.input", "+    return a + b", "other", "a key defect"),
        Defect(
            message_index=4,
            field="tool_calls[0].arguments",
            start=patch_json.index(escaped),
            end=patch_json.index(escaped) + len(escaped),
            quote=escaped,
            category="hallucination",
            description="spans an escaped newline",
        ),
    ]
    return [
        Review(
            trajectory_id=a.id,
            decision="accept",
            errors=[{"category": "wrong_hypothesis"}, {"category": "wrong_hypothesis"}, {"category": "other"}],
            defects=defects_a,
        ),
        Review(trajectory_id="traj-b", decision="reject", reason="not verified positive"),
        Review(
            trajectory_id=c.id,
            decision="accept",
            errors=[{"category": "corrected_mistake"}],
            defects=[defect(c, 1, "content", "I will guess: needle-c.", "corrected_mistake")],
        ),
    ]


# What --print must mark, in display order: the union of overlapping spans is one run,
# and a span over the JSON text of the arguments covers the characters it decodes to.
EXPECTED_RUNS = ["probably in parse(), or maybe", "cat setup.py", "Begin Patch\n*** Update", "+    return a + b", "I will guess: needle-c."]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    a, b, c = trajectory_a(), trajectory_b(), trajectory_c()
    pool = tmp_path / "pool.jsonl"
    with JsonlWriter(pool) as writer:
        writer.write(a)
        writer.write(b)
    with open(pool, "a", encoding="utf-8") as handle:
        handle.write('{"schema_version": "1.0", "messages": [\n')  # a torn record, line 3
    with JsonlWriter(pool) as writer:
        writer.write(c)
    reviews = tmp_path / "reviews.jsonl"
    write_atomic(reviews, [r.model_dump(mode="json") for r in reviews_for(a, c)])
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "stats.json").write_text(
        json.dumps(
            {
                "mode": "ross",
                "per_turn": False,
                "per_sample": [
                    {"sample_id": "traj-a", "tokens": 400, "eligible": 100, "excluded": 5, "ter": 0.05},
                    {"sample_id": "traj-c", "tokens": 50, "eligible": 20, "excluded": 10, "ter": 0.5},
                ],
                "excluded_by_category": {"wrong_hypothesis": 3, "corrected_mistake": 12},
            }
        )
    )
    return {"pool": pool, "reviews": reviews, "dataset": dataset}


def run(*args: str):  # noqa: ANN201
    return CliRunner().invoke(cli_app, list(args))


# ---------------------------------------------------------------- the index


def test_index_reads_each_record_where_it_is_plain_and_zstd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEARN_CACHE", str(tmp_path / "cache"))
    records = [trajectory_a(), trajectory_b(), trajectory_c()] * 5
    plain, framed, whole = tmp_path / "p.jsonl", tmp_path / "f.jsonl.zst", tmp_path / "w.jsonl.zst"
    for path in (plain, framed):
        with JsonlWriter(path) as writer:
            for t in records:
                writer.write(t)
    write_atomic(whole, records)  # one zstd frame for the whole file
    expected = [t.to_dict() for t in read_trajectories(plain)]
    for path, mode in ((plain, "plain"), (framed, "frames"), (whole, "frames")):
        index = PoolIndex(path, cache=False).build()
        assert index.mode == mode and len(index) == len(records)
        assert [index.load(i).to_dict() for i in range(len(index))] == expected
        assert [e.ref.line for e in index.entries] == list(range(1, len(records) + 1))

    # A frame too big to enter in the middle: decompressed once into a plain copy.
    monkeypatch.setattr(offsets, "FRAME_LIMIT", 2000)
    index = PoolIndex(whole, cache=True).build()
    assert index.mode == "copy" and index.copy is not None and index.copy.parent == tmp_path / "cache" / "view"
    assert [index.load(i).to_dict() for i in range(len(index))] == expected
    again = PoolIndex(whole, cache=True).build()
    assert again.mode == "copy" and again.loaded_from_cache == len(records)
    assert [again.load(i).to_dict() for i in (0, 7, 14)] == [expected[0], expected[7], expected[14]]


def test_zstd_frames_found_by_their_headers() -> None:
    import zstandard

    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    data = b"".join(compressor.compress(f"{i}\n".encode() * (i + 1)) for i in range(20))
    frames = []
    pos = 0
    while pos < len(data):
        found = offsets.frame_size(data, pos)
        assert found is not None
        frames.append(zstandard.ZstdDecompressor().decompress(data[pos : pos + found[0]]))
        pos += found[0]
    assert frames == [f"{i}\n".encode() * (i + 1) for i in range(20)]
    assert offsets.frame_size(data[:-3], len(data) - len(compressor.compress(b"19\n" * 20))) is None  # cut short
    with pytest.raises(offsets.DamagedFile):
        offsets.frame_size(b"not zstd at all", 0)


def test_saved_index_is_reused_resumed_after_appends_and_redone_after_rewrites(files: dict[str, Path]) -> None:
    pool = files["pool"]
    first = PoolIndex(pool).build()
    assert len(first) == 4 and first.loaded_from_cache == 0
    (error,) = first.errors
    assert str(error).startswith(f"{pool}:3: invalid JSON") and "truncated" in str(error)
    assert first.entries[2].summary.error is not None and first.entries[3].summary.id == "traj-c"
    saved = pool.with_name(".pool.jsonl.view-index.jsonl")
    assert saved.is_file()

    second = PoolIndex(pool).build()
    assert second.loaded_from_cache == 4 and [str(e) for e in second.errors] == [str(error)]
    assert [e.summary for e in second.entries] == [e.summary for e in first.entries]

    with JsonlWriter(pool) as writer:  # the pool grows: only the new record is read
        writer.write(Trajectory.model_validate({"id": "traj-d", "messages": [{"role": "user", "content": "more"}]}))
    third = PoolIndex(pool).build()
    assert third.loaded_from_cache == 4 and len(third) == 5 and third.entries[4].summary.id == "traj-d"
    assert third.load(4).id == "traj-d"

    text = pool.read_text()  # rewritten in place: indexed afresh
    pool.write_text(text.replace("traj-a", "traj-A"))
    fourth = PoolIndex(pool).build()
    assert fourth.loaded_from_cache == 0 and fourth.entries[0].summary.id == "traj-A"


def test_reviews_found_before_their_index_is_built(files: dict[str, Path]) -> None:
    reviews = ReviewIndex(files["reviews"], cache=False)
    found = reviews.review("traj-c")  # not started: the file is searched for the id
    assert found is not None and found.defects[0].quote == "I will guess: needle-c."
    assert reviews.review("traj-zz") is None
    reviews.build()
    summary = reviews.summary("traj-a")
    assert summary is not None and summary.primary == "wrong_hypothesis" and summary.defects == 5
    # Overlapping spans count once: "probably in parse(), or maybe" is 29 characters.
    assert summary.chars_by_category["wrong_hypothesis"] == len("probably in parse()")
    assert summary.defect_chars == 29 + len("cat setup.py") + len("+    return a + b") + len("Begin Patch\\n*** Update")


def test_filters(files: dict[str, Path]) -> None:
    catalog = Catalog(
        PoolIndex(files["pool"], cache=False).build(),
        ReviewIndex(files["reviews"], cache=False).build(),
        DatasetInfo.load(files["dataset"]),
    )

    def ids(text: str) -> list[str | None]:
        flt = Filter.parse(text)
        return [catalog.summary(p).id for p in range(len(catalog.pool)) if catalog.matches(p, flt)]

    assert ids("") == ["traj-a", "traj-b", None, "traj-c"]  # the unreadable record stays in place
    assert ids("resolved") == ["traj-a", "traj-c"]
    assert ids("unresolved decision=reject") == ["traj-b"]
    assert ids("category=corrected_mistake") == ["traj-a", "traj-c"]
    assert ids("category=none") == ["traj-b"]
    assert ids("primary=wrong_hypothesis") == ["traj-a"]
    assert ids("ter=0.04..0.06") == ["traj-a"]
    assert ids("ter>40%") == ["traj-c"]
    assert ids("exit=turns_exhausted") == ["traj-b"]
    assert ids("step=15..30 task=calc-2") == ["traj-c"]
    assert ids("error") == [None]
    for bad, words in (
        ("color=red", "unknown key .color."),
        ("ter~3", "not understood"),
        ("decision=maybe", "accept, reject or none"),
        ("category=typo", "unknown category typo"),
        ("ter=abc", "not a number"),
    ):
        with pytest.raises(ValueError, match=words):
            Filter.parse(bad)


# ---------------------------------------------------------------- rendering


def styled_chars(renderable: object, width: int = 200) -> list[tuple[str, Style]]:
    console = Console(width=width, force_terminal=True, color_system="truecolor", no_color=False)
    out: list[tuple[str, Style]] = []
    for segment in console.render(renderable):
        for char in segment.text:
            out.append((char, segment.style or Style()))
    return out


def find(chars: list[tuple[str, Style]], text: str, start: int = 0) -> range:
    joined = "".join(c for c, _ in chars)
    at = joined.index(text, start)
    return range(at, at + len(text))


def test_overlapping_defects_and_a_defect_in_tool_call_arguments_are_struck_exactly() -> None:
    a = trajectory_a()
    view = TrajectoryView(a, reviews_for(a, trajectory_c())[0], scope="minimal")  # the quotes only
    chars = styled_chars(view.step(1, RenderOptions()))
    joined = "".join(c for c, _ in chars)

    overlap = find(chars, "parse()")
    only_first = find(chars, "probably in ")
    only_second = find(chars, ", or maybe")
    for i in overlap:
        assert chars[i][1].strike and chars[i][1].bold, chars[i]
    for i in [*only_first, *only_second]:
        assert chars[i][1].strike and not chars[i][1].bold, chars[i]
    for i in [*find(chars, "The bug is "), *find(chars, " in the tokenizer.")]:  # supervised, untouched
        style = chars[i][1]
        assert not style.strike and style.color is not None and style.color.name == "green", chars[i]
    assert chars[only_first[0] - 1][0] == " " and not chars[only_first[0] - 1][1].strike

    # The label follows the run, names both defects and is not struck.
    label = find(chars, "{#1 wrong_hypothesis, #2 redundant_exploration}")
    assert label[0] == only_second[-1] + 1 and not any(chars[i][1].strike for i in label) and chars[label[0]][1].reverse

    # In the tool-call arguments, exactly the command's characters.
    command = find(chars, "cat setup.py")
    assert all(chars[i][1].strike for i in command)
    before = find(chars, '["bash", "-lc", "')
    assert not any(chars[i][1].strike for i in before) and chars[before[-1] + 1][0] == "c"
    assert chars[command[-1] + 1][0] == "{" and not chars[command[-1] + len("{#3 corrected_mistake}") + 1][1].strike
    assert "#3 corrected_mistake tool_calls[0].arguments" in joined and "there is no setup.py" in joined
    assert "--defect-scope" not in joined  # what is struck is what is excluded: no footnote
    assert "message 2 · generated · partly excluded (minimal scope)" in joined

    # Context-only text is dim: the observation and nothing struck in it.
    for i in find(chars, "Exit code: 0"):
        assert chars[i][1].dim and not chars[i][1].strike


def test_long_observation_is_collapsed_and_expanded() -> None:
    a = trajectory_a()
    view = TrajectoryView(a, None)
    collapsed = styled_chars(view.step(1, RenderOptions()))
    text = "".join(c for c, _ in collapsed)
    assert "line 0: calc.py ok" in text and "line 59: calc.py ok" in text and "needle-middle" not in text
    marker = find(collapsed, "··· 45 lines hidden (o: show all) ···")
    assert all(collapsed[i][1].italic for i in marker)
    for i in find(collapsed, "line 0: calc.py ok"):
        assert collapsed[i][1].dim
    expanded = "".join(c for c, _ in styled_chars(view.step(1, RenderOptions(expand=True))))
    assert "line 30: needle-middle" in expanded and "hidden" not in expanded


def test_escaped_characters_in_argument_json_map_to_what_is_shown() -> None:
    a = trajectory_a()
    view = TrajectoryView(a, reviews_for(a, trajectory_c())[0], scope="minimal")
    chars = styled_chars(view.step(2, RenderOptions()))
    span = find(chars, "Begin Patch\n*** Update")
    assert all(chars[i][1].strike for i in span if chars[i][0] != "\n")
    assert not any(chars[i][1].strike for i in find(chars, "*** ")[:4])  # the "*** " before "Begin"
    key_span = find(chars, "+    return a + b")
    assert all(chars[i][1].strike for i in key_span)
    assert not any(chars[i][1].strike for i in find(chars, "-    return a - b"))


def test_header_and_selection() -> None:
    a = trajectory_a()
    review = reviews_for(a, trajectory_c())[0]
    console = Console(width=80, no_color=True)
    with console.capture() as captured:
        console.print(TrajectoryView(a, review, position=0, total=3).header())
    text = captured.get()
    for words in (
        "trajectory 1/3 · traj-a",
        "task calc-1",
        "ckpt @ iter-10 step 10",
        "✓ resolved",
        "FAIL_TO_PASS 1/1",
        "PASS_TO_PASS 2/2",
        "exit submitted",
        "review accept",
        "5 defects",
        "would enter the dataset (ross)",
    ):
        assert words in text, words
    rejected = TrajectoryView(a, Review(trajectory_id=a.id, decision="reject", reason="too many errors"))
    assert not rejected.selected and "review rejected (too many errors)" in rejected.selection_note().plain
    stale = Defect(message_index=2, field="content", start=0, end=3, quote="xyz")
    flagged = TrajectoryView(a, Review(trajectory_id=a.id, decision="accept", defects=[stale]))
    assert flagged.defects[0].problem is not None and "quote not at its offsets" in flagged.defects[0].problem


# ---------------------------------------------------------------- --print


def struck_runs_ansi(text: str) -> list[str]:
    """Runs of characters printed with SGR 9 (strike) on; a run ends at unstruck text
    other than a line end."""
    runs: list[str] = []
    strike = False
    current = ""
    for part in re.split(r"(\x1b\[[0-9;]*m)", text):
        if part.startswith("\x1b["):
            for code in part[2:-1].split(";") if part[2:-1] else ["0"]:
                if code == "9":
                    strike = True
                elif code in ("0", "29"):
                    strike = False
        elif strike or (current and part == "\n"):  # rich ends styles at each line end
            current += part
        elif part and current:
            runs.append(current)
            current = ""
    if current:
        runs.append(current)
    return runs


def without_legend(stdout: str) -> str:
    """The printed trajectories, the legend of the colours that ends the output taken off
    (checked to be there: one line)."""
    body, legend = stdout.rsplit("colours: ", 1)
    assert "supervised" in legend and "excluded" in legend and "{#n category}" in legend
    return body


def test_print_text_marks_exactly_the_defect_characters(files: dict[str, Path]) -> None:
    result = run(
        "view", str(files["pool"]), "--reviews", str(files["reviews"]), "--print", "--limit", "10", "--full", "--width", "200",
        "--defect-scope", "minimal",
    )  # fmt: skip
    assert result.exit_code == 1, result.output  # the torn record is listed
    assert f"{files['pool']}:3: invalid JSON" in result.stderr
    runs = re.findall(r"\[-(.*?)-\]", without_legend(result.stdout), flags=re.S)
    assert runs == EXPECTED_RUNS
    assert "excluded [-…-]" in result.stdout.splitlines()[-1]  # the legend, one line, last
    # In 80 columns lines wrap, and the same characters are marked.
    narrow = run(
        "view", str(files["pool"]), "--reviews", str(files["reviews"]), "--print", "--limit", "10", "--width", "80", "--defect-scope", "minimal"
    )  # fmt: skip
    narrow_runs = re.findall(r"\[-(.*?)-\]", without_legend(narrow.stdout), flags=re.S)
    assert [re.sub(r"\s", "", r) for r in narrow_runs] == [re.sub(r"\s", "", r) for r in EXPECTED_RUNS]
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
    assert "{#1 wrong_hypothesis, #2 redundant_exploration}" in result.stdout
    assert "needle-middle" in result.stdout  # --full
    assert "trajectory 2/4 · traj-b" in result.stdout and "would not enter: not verified positive" in result.stdout


def test_print_ansi_and_html_strike_exactly_the_defect_characters(files: dict[str, Path]) -> None:
    minimal = ("--defect-scope", "minimal")
    ansi = run(
        "view", str(files["pool"]), "-r", str(files["reviews"]), "--print", "--format", "ansi", "--limit", "10", "--width", "200", *minimal
    )
    assert ansi.exit_code == 1
    assert struck_runs_ansi(without_legend(ansi.stdout)) == EXPECTED_RUNS
    assert "[-" not in ansi.stdout

    page = run(
        "view", str(files["pool"]), "-r", str(files["reviews"]), "--print", "--format", "html", "--limit", "10", "--width", "200", *minimal
    )
    assert page.stdout.startswith("<!DOCTYPE html>")
    struck = [
        html.unescape(m) for m in re.findall(r'<span style="[^"]*line-through[^"]*">(.*?)</span>', without_legend(page.stdout), flags=re.S)
    ]
    assert "".join(struck) == "".join(EXPECTED_RUNS).replace("\n", "")  # line ends lie between spans


def test_print_selects_by_id_number_step_and_filter_with_dataset_ter(files: dict[str, Path]) -> None:
    common = [str(files["pool"]), "-r", str(files["reviews"]), "-d", str(files["dataset"]), "--print", "--width", "120"]
    by_id = run("view", *common, "--id", "traj-c")
    assert by_id.exit_code == 0, by_id.output
    assert "trajectory 4" in by_id.stdout and "· traj-c" in by_id.stdout and "TER 50.0% (10/20 tokens)" in by_id.stdout
    assert "in the dataset (ross)" in by_id.stdout

    step = run("view", *common, "--number", "1", "--step", "3")
    assert step.exit_code == 0 and "step 3/4 · turn (message 6)" in step.stdout and "step 1/4" not in step.stdout
    last = run("view", *common, "-n", "1", "--step", "4")
    assert "final patch" in last.stdout and "+    return a + b" in last.stdout

    filtered = run("view", *common, "--unresolved", "--limit", "5")
    assert filtered.exit_code == 0 and "traj-b" in filtered.stdout and "traj-a" not in filtered.stdout
    assert "not in the dataset (ross)" in filtered.stdout
    by_ter = run("view", *common, "--ter", "4%..6%", "--limit", "5")
    assert "traj-a" in by_ter.stdout and "traj-c" not in by_ter.stdout and "TER 5.0% (5/100 tokens)" in by_ter.stdout
    searched = run("view", *common, "--search", "NEEDLE-B", "--limit", "5")
    assert "· traj-b" in searched.stdout and "· traj-a" not in searched.stdout and "· traj-c" not in searched.stdout
    none = run("view", *common, "--category", "unsafe_action")
    assert none.exit_code == 1 and "warning:" in none.stderr and "no trajectory matches the filter 'category=unsafe_action'" in none.stderr


def test_view_usage_errors_exit_2(files: dict[str, Path], tmp_path: Path) -> None:
    missing = run("view", str(tmp_path / "nope.jsonl"), "--print")
    assert missing.exit_code == 2 and "no such pool" in missing.stderr
    bad_filter = run("view", str(files["pool"]), "--print", "--filter", "decision=maybe")
    assert bad_filter.exit_code == 2 and "decision=maybe" in bad_filter.stderr
    no_stats = run("view", str(files["pool"]), "--print", "--dataset", str(tmp_path))
    assert no_stats.exit_code == 2 and "stats.json" in no_stats.stderr
    unknown = run("view", str(files["pool"]), "--print", "--id", "traj-zz")
    assert unknown.exit_code == 2 and "traj-zz" in unknown.stderr
    not_a_terminal = run("view", str(files["pool"]))
    assert not_a_terminal.exit_code == 2 and "--print" in not_a_terminal.stderr
    torn = run("view", str(files["pool"]), "--print", "-n", "3")
    assert torn.exit_code == 1 and f"{files['pool']}:3" in torn.stderr
    helped = run("view", "--help")
    assert helped.exit_code == 0 and "h/l step" in helped.stdout and "--print" in helped.stdout


# ---------------------------------------------------------------- the Textual viewer


def screen_chars(app: ViewerApp, selector: str = "#step") -> list[tuple[str, Style]]:
    """What a widget (the step, unless told) draws, character by character, line after line:
    every line of it, padding included, also those scrolled out of view."""
    from textual.geometry import Region

    widget = app.query_one(selector)
    # render_lines crops in the widget's own coordinates, which include its padding: its
    # outer size, not its content size (that crop cut the last column off every line).
    out: list[tuple[str, Style]] = []
    for strip in widget.render_lines(Region(0, 0, widget.outer_size.width, widget.outer_size.height)):
        for segment in strip:
            out += [(c, segment.style or Style()) for c in segment.text]
        out.append(("\n", Style()))
    return out


def status(app: ViewerApp) -> str:
    return str(app.query_one("#status").render())


def test_viewer_navigation_filter_search_and_rendering(files: dict[str, Path]) -> None:
    async def drive() -> None:
        catalog = Catalog(PoolIndex(files["pool"], cache=False).start(), ReviewIndex(files["reviews"], cache=False).start())
        app = ViewerApp(catalog)
        async with app.run_test(size=(80, 40)) as pilot:
            await pilot.pause()
            catalog.pool.join()
            catalog.reviews.join()  # type: ignore[union-attr]
            await pilot.pause(0.3)  # a tick: the list and the header catch up with the index
            assert app.view is not None and app.view.trajectory.id == "traj-a" and app.step_number == 0
            assert "1/4" in status(app) and "step 0/4" in status(app)

            await pilot.press("l")
            assert app.step_number == 1
            chars = screen_chars(app)
            shown = "".join(c for c, _ in chars)
            struck = "".join(c for c, s in chars if s.strike)
            # 80 columns wrap lines: compare without whitespace.
            # Under the default action scope the call with the defect is struck whole: name, id, every argument.
            whole_call = 'probably in parse(), or maybe▸ call shell  c1\ncommand: ["bash", "-lc", "cat setup.py"]\nworkdir: /repo'
            assert re.sub(r"\s", "", struck) == re.sub(r"\s", "", whole_call)
            assert "message 2 · generated · partly excluded (action scope)" in shown
            assert all(s.bold for c, s in chars[shown.index("parse()") : shown.index("parse()") + 7])
            plain_at = shown.index("The bug is")
            context_at = shown.index("Exit code: 0")
            assert chars[plain_at][1].color != chars[context_at][1].color  # supervised and context differ
            assert "lines hidden" in shown and "needle-middle" not in shown

            await pilot.press("o")  # long observations whole
            assert "needle-middle" in "".join(c for c, _ in screen_chars(app))
            await pilot.press("o")

            await pilot.press("dollar_sign")
            assert app.step_number == 4 and "final patch" in "".join(c for c, _ in screen_chars(app))
            await pilot.press("0")
            assert app.step_number == 0
            await pilot.press("h")
            assert app.step_number == 0  # stays at the first step

            await pilot.press("L")
            assert app.view.trajectory.id == "traj-b" and app.step_number == 0
            await pilot.press("L")
            assert app.view is None and str(app.error).startswith(f"{files['pool']}:3: invalid JSON")  # the torn record, located
            assert "invalid JSON" in "".join(c for c, _ in screen_chars(app))
            await pilot.press("L", "L")
            assert app.view.trajectory.id == "traj-c" and app.cursor == 3
            await pilot.press("H", "H", "H", "H")
            assert app.view.trajectory.id == "traj-a" and app.cursor == 0

            # Filter: typed keys go to the prompt, not to the navigation.
            await pilot.press("f", *"category=corrected_mistake", "enter")
            assert [catalog.summary(p).id for p in app.matches] == ["traj-a", "traj-c"]
            assert "1/2 of 4" in status(app) and "filter: category=corrected_mistake" in status(app)
            await pilot.press("L")
            assert app.view.trajectory.id == "traj-c"
            await pilot.press("f", "ctrl+u", *"decision=maybe", "enter")
            assert "decision=maybe" in status(app) and len(app.matches) == 2  # refused, the old filter stays
            await pilot.press("f", "ctrl+u", *"resolved ter>0.5", "enter")
            assert [catalog.summary(p).id for p in app.matches] == ["traj-c"]
            await pilot.press("f", "ctrl+u", "enter")
            assert len(app.matches) == 4

            # Search: into a collapsed observation, across trajectories, and back.
            await pilot.press("slash", *"needle-b", "enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.view.trajectory.id == "traj-b" and app.step_number == 1
            await pilot.press("slash", "ctrl+u", *"needle", "enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.view.trajectory.id == "traj-c" and app.step_number == 1
            await pilot.press("n")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.view.trajectory.id == "traj-a" and app.step_number == 1  # wrapped round
            await pilot.press("N")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.view.trajectory.id == "traj-c"
            await pilot.press("slash", "ctrl+u", *"no such text", "enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert "not found" in status(app) and app.view.trajectory.id == "traj-c"

            await pilot.press("question_mark")
            helped = screen_chars(app)
            shown = "".join(c for c, _ in helped)
            assert "next trajectory" in shown
            # The legend of the colours, each word drawn in its own style.
            legend_at = shown.index("colours: ")
            supervised, context = (helped[shown.index(word, legend_at)][1] for word in ("supervised", "context only"))
            assert supervised.color != context.color and not supervised.strike
            assert helped[shown.index("excluded", legend_at)][1].strike
            await pilot.press("q")
        assert app.return_code == 0

    asyncio.run(drive())


def test_viewer_opens_filtered_and_at_a_search_hit(files: dict[str, Path]) -> None:
    async def drive() -> None:
        # Indexes still filling: the search waits for the first trajectory on screen.
        catalog = Catalog(
            PoolIndex(files["pool"], cache=False).start(),
            ReviewIndex(files["reviews"], cache=False).start(),
            DatasetInfo.load(files["dataset"]),
        )
        app = ViewerApp(catalog, flt=Filter.parse("resolved"), search="Success.")
        async with app.run_test(size=(80, 24)) as pilot:
            catalog.pool.join()
            await pilot.pause(0.5)
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.view is not None and app.view.trajectory.id == "traj-a" and app.step_number == 2
            header = str(app.query_one("#header").render())
            assert "TER 5.0%" in header and "in the dataset (ross)" in header
            await pilot.press("L", "L")
            assert app.view.trajectory.id == "traj-c" and app.cursor == 1

    asyncio.run(drive())


# ---------------------------------------------------------------- search hits, help, empty pools (issue 37)


def hits_pool(path: Path) -> Path:
    """Two trajectories: the first with 'alpha' three times in step 1 (the third 90 lines
    down), once in step 2 and 'gamma' once; the second with neither."""
    long_text = "alpha beta alpha\n" + "\n".join(f"filler {i}" for i in range(90)) + "\nthe end: ALPHA and gamma"
    first = Trajectory.model_validate(
        {
            "id": "hits-1",
            "messages": [
                {"role": "user", "content": "Find the letters."},
                {"role": "assistant", "generated": True, "content": long_text},
                {"role": "assistant", "generated": True, "content": "alpha again"},
            ],
        }
    )
    second = Trajectory.model_validate(
        {"id": "hits-2", "messages": [{"role": "user", "content": "Nothing here."}, {"role": "assistant", "content": "Done."}]}
    )
    with JsonlWriter(path) as writer:
        writer.write(first)
        writer.write(second)
    return path


def hit_styles(app: ViewerApp, word: str) -> list[Style]:
    """The style of the first character of each shown occurrence of ``word`` (any case)."""
    chars = screen_chars(app)
    shown = "".join(c for c, _ in chars).lower()
    return [chars[m.start()][1] for m in re.finditer(re.escape(word), shown)]


async def search_settled(app: ViewerApp, pilot, *keys: str) -> None:  # noqa: ANN001 - textual's Pilot
    await pilot.press(*keys)
    await app.workers.wait_for_complete()
    await pilot.pause()


def test_viewer_highlights_every_hit_the_current_one_distinct_and_says_when_it_wraps(tmp_path: Path) -> None:
    async def drive() -> None:
        catalog = Catalog(PoolIndex(hits_pool(tmp_path / "hits.jsonl"), cache=False).start())
        app = ViewerApp(catalog)
        async with app.run_test(size=(80, 24)) as pilot:
            catalog.pool.join()
            await pilot.pause(0.3)
            await search_settled(app, pilot, "slash", *"alpha", "enter")
            assert (app.cursor, app.step_number, app.hit, app.hit_count) == (0, 1, 0, 3)
            assert "/alpha 1/3 here" in status(app)
            # Every hit in the step marked, the current one (the first) in a style of its own.
            first, second, third = hit_styles(app, "alpha")
            assert first.bgcolor is not None and second.bgcolor is not None and first.bgcolor != second.bgcolor
            assert third.bgcolor == second.bgcolor
            shown = [s.bgcolor for c, s in screen_chars(app) if not c.isspace()]
            assert shown.count(first.bgcolor) == len("alpha") and shown.count(second.bgcolor) == 2 * len("alpha")
            assert app.query_one("#body").scroll_y == 0

            await search_settled(app, pilot, "n")
            assert (app.step_number, app.hit) == (1, 1) and "2/3 here" in status(app)
            assert [s.bgcolor for s in hit_styles(app, "alpha")] == [second.bgcolor, first.bgcolor, second.bgcolor]  # the current moved on
            await search_settled(app, pilot, "n")  # the third, 90 lines down: scrolled into view
            assert (app.step_number, app.hit) == (1, 2) and "3/3 here" in status(app)
            assert [s.bgcolor for s in hit_styles(app, "alpha")] == [second.bgcolor, second.bgcolor, first.bgcolor]
            body = app.query_one("#body")
            lines = "".join(c for c, _ in screen_chars(app)).split("\n")
            at = next(n for n, line in enumerate(lines) if "the end: ALPHA" in line)
            assert at > 80 and body.scroll_y <= at < body.scroll_y + body.size.height

            await search_settled(app, pilot, "n")  # the next step with a hit
            assert (app.cursor, app.step_number, app.hit_count) == (0, 2, 1) and app.message == ""
            await search_settled(app, pilot, "n")  # past the last hit: wraps to the first, and says so
            assert (app.cursor, app.step_number, app.hit) == (0, 1, 0)
            assert "no more matches for 'alpha': wrapped to the first" in status(app)
            await search_settled(app, pilot, "N")  # back past the first: to the last
            assert (app.cursor, app.step_number, app.hit) == (0, 2, 0)
            assert "no earlier match for 'alpha': wrapped to the last" in status(app)
            await search_settled(app, pilot, "N")  # coming back, a step's last hit first
            assert (app.step_number, app.hit) == (1, 2) and app.message == ""

            await search_settled(app, pilot, "slash", "ctrl+u", *"gamma", "enter")
            await search_settled(app, pilot, "n")
            assert (app.step_number, app.hit_count) == (1, 1) and "the only match for 'gamma'" in status(app)
            await search_settled(app, pilot, "slash", "ctrl+u", "enter")  # an empty search clears the highlights
            assert app.query_text == "" and not [s for _, s in screen_chars(app) if s.bgcolor == first.bgcolor]

    asyncio.run(drive())


def test_viewer_escape_closes_help_and_empty_pools_say_so(tmp_path: Path) -> None:
    async def drive() -> None:
        other = tmp_path / "other-reviews.jsonl"  # reviews of another pool
        write_atomic(other, [Review(trajectory_id="elsewhere", decision="accept").model_dump(mode="json")])
        catalog = Catalog(PoolIndex(hits_pool(tmp_path / "hits.jsonl"), cache=False).start(), ReviewIndex(other, cache=False).start())
        app = ViewerApp(catalog)
        async with app.run_test(size=(120, 24)) as pilot:
            catalog.pool.join()
            catalog.reviews.join()  # type: ignore[union-attr]
            await pilot.pause(0.3)
            assert "the reviews match no trajectory of this pool" in status(app)
            await pilot.press("question_mark")
            assert app.showing_help and "Esc or ? closes it" in "".join(c for c, _ in screen_chars(app))
            await pilot.press("escape")
            assert not app.showing_help and "step 0/3 · task" in "".join(c for c, _ in screen_chars(app))
            await pilot.press("f", *"resolved", "enter")
            await pilot.pause(0.3)
            assert "None of the 2 trajectories matches the filter 'resolved'" in " ".join("".join(c for c, _ in screen_chars(app)).split())
            assert "no match of 2" in status(app)

        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        catalog = Catalog(PoolIndex(empty, cache=False).start())
        app = ViewerApp(catalog)
        async with app.run_test(size=(80, 24)) as pilot:
            catalog.pool.join()
            await pilot.pause(0.3)
            assert "the pool is empty" in str(app.query_one("#header").render())
            assert squeezed(f"{empty} holds no trajectory") in squeezed("".join(c for c, _ in screen_chars(app)))
            assert status(app).startswith("empty pool") and "0/0" not in status(app)
            await pilot.press("n")
            assert "no search yet" in status(app)

    asyncio.run(drive())


def test_help_stays_open_when_the_reviews_finish_indexing_behind_it(files: dict[str, Path]) -> None:
    async def drive() -> None:
        reviews = ReviewIndex(files["reviews"], cache=False)  # not started: still indexing
        catalog = Catalog(PoolIndex(files["pool"], cache=False).start(), reviews)
        app = ViewerApp(catalog)
        async with app.run_test(size=(100, 30)) as pilot:
            catalog.pool.join()
            await pilot.pause(0.3)
            assert app.view is not None and "indexing reviews" in status(app)
            await pilot.press("question_mark")
            reviews.start().join()
            await pilot.pause(0.5)  # ticks that see the reviews ready
            assert app.showing_help and "Esc or ? closes it" in "".join(c for c, _ in screen_chars(app))
            await pilot.press("escape")
            assert not app.showing_help and "review accept" in str(app.query_one("#header").render())
            assert "indexing" not in status(app)

    asyncio.run(drive())


# Widths from a phone-sized terminal to a wide one, odd and even, so that words of every
# message end at every kind of place: inside a line, at its last column, one past it.
WIDTHS = (20, 27, 33, 41, 52, 64, 79, 80, 81, 97, 118, 141)


def squeezed(text: str) -> str:
    """The text without its whitespace: what is left when wrapping may break lines anywhere."""
    return "".join(text.split())


def assert_drawn_whole(app: ViewerApp, selector: str) -> str:
    """Every character a widget was given is drawn, in order, wherever the lines broke.
    Returns what it drew, squeezed. What it was given is its content drawn on a screen too
    wide to wrap anything; a rule's line, whose length is the screen's, is left out of both."""
    console = Console(width=2000, color_system=None)
    with console.capture() as capture:
        console.print(app.query_one(selector, Static).content)
    given = squeezed(capture.get()).replace("─", "")
    drawn = squeezed("".join(c for c, _ in screen_chars(app, selector))).replace("─", "")
    assert given and given in drawn, f"{selector} at width {app.size.width}: drew {drawn!r}, was given {given!r}"
    return drawn


def test_viewer_draws_every_character_of_the_empty_pool_message_at_every_width(tmp_path: Path) -> None:
    """The message names the pool's path, so where its words end depends on how long the path
    is: paths of twelve consecutive lengths, whatever the temporary folder's own length."""

    async def drive(empty: Path) -> None:
        catalog = Catalog(PoolIndex(empty, cache=False).start())
        app = ViewerApp(catalog)
        async with app.run_test(size=(WIDTHS[0], 40)) as pilot:
            catalog.pool.join()
            await pilot.pause(0.3)
            for width in WIDTHS:
                await pilot.resize_terminal(width, 40)
                await pilot.pause()
                assert squeezed(f"{empty} holds no trajectory. q quits.") in assert_drawn_whole(app, "#step")
                assert squeezed("the pool is empty") in assert_drawn_whole(app, "#header")
                assert squeezed("empty pool · ? help") in assert_drawn_whole(app, "#status")

    for extra in range(12):
        empty = tmp_path / ("d" * (1 + extra)) / "empty.jsonl"
        empty.parent.mkdir()
        empty.write_text("")
        asyncio.run(drive(empty))


@pytest.mark.slow
def test_viewer_draws_every_character_of_header_steps_help_and_status_at_every_width(tmp_path: Path) -> None:
    a = trajectory_a().model_copy(update={"id": "traj-a-" + "with-a-long-identifier-" * 4})
    c = trajectory_c()
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [t.model_dump(mode="json") for t in (a, c)])
    reviews = tmp_path / "reviews.jsonl"
    write_atomic(reviews, [r.model_dump(mode="json") for r in reviews_for(a, c)])
    other = tmp_path / "other-reviews.jsonl"  # reviews of another pool: the longest status
    write_atomic(other, [Review(trajectory_id="elsewhere", decision="accept").model_dump(mode="json")])

    async def drive(review_file: Path, *, every_step: bool) -> None:
        catalog = Catalog(PoolIndex(pool, cache=False).start(), ReviewIndex(review_file, cache=False).start())
        app = ViewerApp(catalog)
        async with app.run_test(size=(WIDTHS[0], 60)) as pilot:
            catalog.pool.join()
            catalog.reviews.join()  # type: ignore[union-attr]
            await pilot.pause(0.3)
            for width in WIDTHS:
                await pilot.resize_terminal(width, 60)
                await pilot.press("0")
                await pilot.pause()
                assert app.view is not None
                for step in range(len(app.view.steps) if every_step else 1):
                    assert app.step_number == step
                    for selector in ("#header", "#step", "#status"):
                        assert_drawn_whole(app, selector)
                    await pilot.press("l")
                if not every_step:
                    assert squeezed("the reviews match no trajectory of this pool") in assert_drawn_whole(app, "#status")
                    continue
                await pilot.press("question_mark")
                assert squeezed("Esc or ? closes it") in assert_drawn_whole(app, "#step")
                await pilot.press("escape")
            await pilot.press("f", *"task=nothing-like-it", "enter")
            await pilot.pause(0.3)
            for width in WIDTHS:
                await pilot.resize_terminal(width, 60)
                await pilot.pause()
                assert squeezed("None of the 2 trajectories matches the filter") in assert_drawn_whole(app, "#step")
                assert squeezed("no match of 2 · filter: task=nothing-like-it") in assert_drawn_whole(app, "#status")

    asyncio.run(drive(reviews, every_step=True))
    asyncio.run(drive(other, every_step=False))


def test_index_stops_early_and_its_thread_ends(tmp_path: Path) -> None:
    import time

    class PacedIndex(PoolIndex):
        """2 ms a record, so that the index is surely still running when it is stopped."""

        def summarize(self, ref, data):  # noqa: ANN001, ANN202
            time.sleep(0.002)
            return super().summarize(ref, data)

    pool = tmp_path / "big.jsonl"
    with JsonlWriter(pool) as writer:
        for number in range(3000):
            writer.write(Trajectory.model_validate({"id": f"t{number}", "messages": [{"role": "user", "content": "x" * 200}]}))
    index = PacedIndex(pool, cache=True).start()
    assert index.wait(10)
    began = time.perf_counter()
    index.stop()
    assert time.perf_counter() - began < 1.0
    assert index.ready.is_set() and index._thread is not None and not index._thread.is_alive()
    assert 10 <= len(index) < 3000 and not index.errors
    assert index.load(5).id == "t5"  # what was indexed stays usable
    assert not pool.with_name(".big.jsonl.view-index.jsonl").exists()  # a partial index is not saved


def test_print_step_out_of_range_empty_pool_and_reviews_of_another_pool(files: dict[str, Path], tmp_path: Path) -> None:
    step = run("view", str(files["pool"]), "--print", "-n", "1", "--step", "99")
    assert step.exit_code == 2 and step.stdout == ""
    assert step.stderr.strip().splitlines() == [
        f"error: {files['pool']}:1: trajectory traj-a: no step 99 (the trajectory has 5 steps, 0 to 4: 0 is the task, 4 the final patch)"
    ]
    # Some of the printed have the step: those are printed, the others listed, exit 1.
    some = run("view", str(files["pool"]), "--print", "--limit", "2", "--step", "3", "--width", "120")
    assert some.exit_code == 1 and "· traj-a" in some.stdout and "traj-b: no step 3" in some.stderr

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nothing = run("view", str(empty), "--print")
    assert nothing.exit_code == 1 and nothing.stderr.strip() == f"warning: {empty}: the pool is empty; nothing to show"

    other = tmp_path / "other-reviews.jsonl"
    write_atomic(other, [Review(trajectory_id="elsewhere", decision="accept").model_dump(mode="json")])
    foreign = run("view", str(files["pool"]), "-r", str(other), "--print", "--width", "120")
    assert foreign.exit_code == 1 and "· traj-a" in foreign.stdout
    assert f"warning: {other}: reviews none of the 4 trajectories of {files['pool']} (reviews of another pool?)" in " ".join(
        foreign.stderr.split()
    )


def test_print_into_a_pipe_closed_early_exits_0_quietly(tmp_path: Path, relearn_bin: str) -> None:
    import subprocess

    pool = tmp_path / "pool.jsonl"
    with JsonlWriter(pool) as writer:
        for number in range(300):
            t = trajectory_a()
            t.id = f"traj-{number}"
            writer.write(t)
    for fmt in ("text", "ansi"):
        # Far more than a pipe holds (64 KiB), and the index still filling when the reader goes.
        command = [relearn_bin, "view", str(pool), "--print", "--format", fmt, "--full", "--limit", "300", "--no-cache"]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
            assert process.stdout is not None and process.stderr is not None
            first = process.stdout.readline()
            process.stdout.close()  # `| head -1`
            stderr = process.stderr.read()
            assert process.wait(timeout=60) == 0, stderr
        assert b"traj-0" in first and stderr == b""


# ---------------------------------------------------------------- what the dataset excludes (issue 36)


def trajectory_calls_only() -> Trajectory:
    """A tool-calling turn with no text, and a text-protocol agent (mini-swe-agent): its action
    is the fenced block in its content."""
    return Trajectory.model_validate(
        {
            "id": "traj-calls",
            "task_id": "calc-3",
            "messages": [
                {"role": "user", "content": "Fix mul()."},
                {"role": "assistant", "generated": True, "tool_calls": [call("c1", "shell", command="cat setup.py", workdir="/repo")]},
                {"role": "tool", "tool_call_id": "c1", "content": "No such file"},
                {"role": "assistant", "generated": True, "content": "Done: mul() multiplies."},
            ],
            "exit_status": "submitted",
            "outcome": {"resolved": True},
        }
    )


def trajectory_text_protocol() -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": "traj-text",
            "task_id": "calc-4",
            "messages": [
                {"role": "system", "content": "Reply with one bash block."},
                {"role": "user", "content": "Fix div()."},
                {"role": "assistant", "generated": True, "content": "Let me look.\n\n```bash\ncat setup.py && ls\n```"},
                {"role": "user", "content": "<returncode>1</returncode>\nNo such file"},
                {"role": "assistant", "generated": True, "content": "Done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
            ],
            "exit_status": "submitted",
            "outcome": {"resolved": True},
        }
    )


def test_action_scope_strikes_the_whole_call_minimal_only_the_quote_and_headers_say_how_much() -> None:
    t = trajectory_calls_only()
    review = Review(trajectory_id=t.id, decision="accept", defects=[defect(t, 1, "tool_calls[0].arguments.command", "setup.py", "other")])
    for scope, struck_expected, share in (
        ("action", "▸ call shell  c1\ncommand: cat setup.py\nworkdir: /repo", "wholly"),
        ("minimal", "setup.py", "partly"),
    ):
        chars = styled_chars(TrajectoryView(t, review, scope=scope).document(RenderOptions()))
        joined = "".join(c for c, _ in chars)
        struck = "".join(c for c, s in chars if s.strike)
        assert re.sub(r"\s", "", struck) == re.sub(r"\s", "", struck_expected), scope
        assert f"message 1 · generated · {share} excluded ({scope} scope)" in joined
        assert "message 3 · generated · supervised" in joined  # the turn without a defect
        assert "--defect-scope" not in joined  # no footnote: what is struck is what is excluded

    text = trajectory_text_protocol()
    review = Review(trajectory_id=text.id, decision="accept", defects=[defect(text, 2, "content", "setup.py", "other")])
    for scope, struck_expected in (("action", "```bash\ncat setup.py && ls\n```"), ("minimal", "setup.py")):
        chars = styled_chars(TrajectoryView(text, review, scope=scope).document(RenderOptions()))
        struck = "".join(c for c, s in chars if s.strike)
        assert re.sub(r"\s", "", struck) == re.sub(r"\s", "", struck_expected), scope
        assert "message 2 · generated · partly excluded" in "".join(c for c, _ in chars)  # "Let me look." stays

    # A dataset compiled in a mode that does not mask strikes nothing and says why.
    view = TrajectoryView(t, review.model_copy(update={"trajectory_id": t.id, "defects": []}), scope=None, dataset_mode="positive")
    assert not any(s.strike for _, s in styled_chars(view.document()))
    flagged = TrajectoryView(
        t, Review(trajectory_id=t.id, decision="accept", defects=[defect(t, 1, "tool_calls[0].arguments.command", "setup.py", "other")]),
        scope=None, dataset_mode="positive",
    )  # fmt: skip
    chars = styled_chars(flagged.document())
    assert not any(s.strike for _, s in chars) and "not excluded: the dataset's mode is positive" in "".join(c for c, _ in chars)


def template_as_shown(text: str) -> str:
    """Excluded rendered text written as the viewer shows it, whitespace aside: a call's
    ``<function=NAME>`` as ``▸ call NAME``, each ``<parameter=KEY>`` as ``KEY:``, the other tags
    and the end of turn dropped."""
    text = re.sub(r"<function=([^>]+)>", r"▸ call \1", text)
    text = re.sub(r"<parameter=([^>]+)>", r"\1:", text)
    text = re.sub(r"</?(tool_call|function|parameter)>|<\|im_end\|>", "", text)
    return re.sub(r"\s", "", text)


def test_with_a_dataset_the_struck_text_is_the_datasets_excluded_tokens(tmp_path: Path, tok) -> None:  # noqa: ANN001
    from relearn.export.source import iter_samples, open_dataset
    from relearn.export.spans import token_runs
    from relearn.masks.compile import compile_trajectory
    from relearn.ops.masks import run_masks
    from relearn.verbs.masks import MasksOptions

    a, c, calls, text = trajectory_a(), trajectory_c(), trajectory_calls_only(), trajectory_text_protocol()
    reviews = [
        *reviews_for(a, c),
        Review(
            trajectory_id=calls.id, decision="accept", defects=[defect(calls, 1, "tool_calls[0].arguments.command", "setup.py", "other")]
        ),
        Review(trajectory_id=text.id, decision="accept", defects=[defect(text, 2, "content", "setup.py", "other")]),
    ]
    pool, reviews_path = tmp_path / "pool.jsonl", tmp_path / "reviews.jsonl"
    with JsonlWriter(pool) as writer:
        for t in (a, c, calls, text):
            writer.write(t)
    write_atomic(reviews_path, [r.model_dump(mode="json") for r in reviews])
    by_id = {r.trajectory_id: r for r in reviews}
    for scope in ("action", "minimal"):
        options = MasksOptions(pool=pool, output=tmp_path / scope, reviews=reviews_path, mode="ross", defect_scope=scope)
        summary = run_masks(options, tokenizer=tok)
        assert summary.stats["trajectories_out"] == 4, summary.stats["rejections"]
        rows = {row.sample_id: row for row in iter_samples(open_dataset(tmp_path / scope))}
        for t in (a, c, calls, text):
            # The excluded tokens (A minus the targets) of the dataset's samples, decoded run by run.
            excluded: list[str] = []
            for sample in compile_trajectory(t, by_id[t.id], tok, options.compile_options()):
                assert np.array_equal(sample.input_ids, rows[sample.sample_id].input_ids)  # the dataset's own tokens
                assert np.array_equal(sample.loss_mask, rows[sample.sample_id].loss_mask)
                runs = token_runs(((sample.eligible_mask == 1) & (sample.loss_mask == 0)).astype(np.uint8))
                excluded += [tok.decode(sample.input_ids[lo:hi].tolist()) for lo, hi in runs]
            printed = run("view", str(pool), "-r", str(reviews_path), "-d", str(tmp_path / scope), "--print", "--id", t.id, "--full")
            assert printed.exit_code == 0, printed.output
            struck = re.findall(r"\[-(.*?)-\]", without_legend(printed.stdout), flags=re.S)
            shown = [re.sub(r"\s", "", re.sub(r"(▸ call \S+)  \S+", r"\1", run_)) for run_ in struck]  # the call id is not rendered
            assert shown == [template_as_shown(run_) for run_ in excluded], (scope, t.id, struck, excluded)
        # The scope is the dataset's: asking for another is refused.
        other = "minimal" if scope == "action" else "action"
        refused = run("view", str(pool), "-d", str(tmp_path / scope), "--defect-scope", other, "--print")
        assert refused.exit_code == 2 and f"compiled under --defect-scope {scope}" in refused.stderr


def test_the_scope_struck_under_is_the_datasets_then_the_option(files: dict[str, Path]) -> None:
    pool = PoolIndex(files["pool"], cache=False)
    recorded = DatasetInfo(files["dataset"], {"mode": "ross", "defect_scope": "minimal"})
    unrecorded = DatasetInfo(files["dataset"], {"mode": "ross"})  # compiled before stats.json named it
    assert Catalog(pool, dataset=recorded, scope="action").defect_scope() == "minimal"
    assert Catalog(pool, dataset=unrecorded, scope="minimal").defect_scope() == "minimal"
    assert Catalog(pool, dataset=unrecorded).defect_scope() == "action"  # the masks default
    assert Catalog(pool, dataset=DatasetInfo(files["dataset"], {"mode": "positive", "defect_scope": "action"})).defect_scope() is None
    assert Catalog(pool, scope="minimal").defect_scope() == "minimal"
