"""``relearn view``: the pool index (plain, zstd, saved and resumed), the rich rendering of
defect spans, ``--print`` in text, ANSI and HTML, and the Textual viewer driven by its
headless pilot."""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.style import Style
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
    view = TrajectoryView(a, reviews_for(a, trajectory_c())[0])
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
    assert "--defect-scope action excludes all of tool call 0" in joined  # the legend says what the mask takes

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
    view = TrajectoryView(a, reviews_for(a, trajectory_c())[0])
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


def test_print_text_marks_exactly_the_defect_characters(files: dict[str, Path]) -> None:
    result = run("view", str(files["pool"]), "--reviews", str(files["reviews"]), "--print", "--limit", "10", "--full", "--width", "200")
    assert result.exit_code == 1, result.output  # the torn record is listed
    assert f"{files['pool']}:3: invalid JSON" in result.stderr
    runs = re.findall(r"\[-(.*?)-\]", result.stdout, flags=re.S)
    assert runs == EXPECTED_RUNS
    # In 80 columns lines wrap, and the same characters are marked.
    narrow = run("view", str(files["pool"]), "--reviews", str(files["reviews"]), "--print", "--limit", "10", "--width", "80")
    narrow_runs = re.findall(r"\[-(.*?)-\]", narrow.stdout, flags=re.S)
    assert [re.sub(r"\s", "", r) for r in narrow_runs] == [re.sub(r"\s", "", r) for r in EXPECTED_RUNS]
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
    assert "{#1 wrong_hypothesis, #2 redundant_exploration}" in result.stdout
    assert "needle-middle" in result.stdout  # --full
    assert "trajectory 2/4 · traj-b" in result.stdout and "would not enter: not verified positive" in result.stdout


def test_print_ansi_and_html_strike_exactly_the_defect_characters(files: dict[str, Path]) -> None:
    ansi = run("view", str(files["pool"]), "-r", str(files["reviews"]), "--print", "--format", "ansi", "--limit", "10", "--width", "200")
    assert ansi.exit_code == 1
    assert struck_runs_ansi(ansi.stdout) == EXPECTED_RUNS
    assert "[-" not in ansi.stdout

    page = run("view", str(files["pool"]), "-r", str(files["reviews"]), "--print", "--format", "html", "--limit", "10", "--width", "200")
    assert page.stdout.startswith("<!DOCTYPE html>")
    struck = [html.unescape(m) for m in re.findall(r'<span style="[^"]*line-through[^"]*">(.*?)</span>', page.stdout, flags=re.S)]
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
    assert none.exit_code == 0 and "no trajectory" in none.stderr


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


def screen_chars(app: ViewerApp) -> list[tuple[str, Style]]:
    """What the step widget shows, character by character, line after line."""
    from textual.geometry import Region

    widget = app.query_one("#step")
    out: list[tuple[str, Style]] = []
    for strip in widget.render_lines(Region(0, 0, widget.size.width, widget.size.height)):
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
            assert re.sub(r"\s", "", struck) == re.sub(r"\s", "", "probably in parse(), or maybe" + "cat setup.py")
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
            assert "next trajectory" in "".join(c for c, _ in screen_chars(app))
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
