"""Mask compilation A \\ E with the real Qwen3.6 tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from records.review import Defect, Review
from records.trajectory import Trajectory
from relearn.masks.compile import CompileOptions, Rejected, _defect_render_span, compile_trajectory
from relearn.masks.template import render

SPECIAL = ("<|", "|>", "<think", "</think", "<tool", "</tool", "<function", "</function", "<parameter", "</parameter")


def trajectory(messages: list[dict], **extra: object) -> Trajectory:
    return Trajectory.model_validate({"messages": messages, "outcome": {"resolved": True, "reward": 1.0}, **extra})


def call(call_id: str, name: str, **arguments: object) -> dict:
    return {"id": call_id, "function": {"name": name, "arguments": arguments}}


BASE = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix add() in calc.py."},
    {
        "role": "assistant",
        "generated": True,
        "reasoning_content": "The bug is probably in parse().",
        "content": "  Let me look at the file.  ",
        "tool_calls": [call("c1", "shell", command=["bash", "-lc", "cat calc.py"], workdir="/repo")],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b):\n    return a - b\n"},
    {
        "role": "assistant",
        "generated": True,
        "reasoning_content": "It subtracts.",
        "tool_calls": [
            call(
                "c2",
                "apply_patch",
                input="*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b\n*** End Patch\n",
            )
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "Success."},
    {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
]


def defect(t: Trajectory, index: int, field: str, quote: str, occurrence: int = 0, category: str = "other") -> Defect:
    from records.review import field_text

    text = field_text(t.messages[index], field)
    assert text is not None
    start = -1
    for _ in range(occurrence + 1):
        start = text.index(quote, start + 1)
    return Defect(message_index=index, field=field, start=start, end=start + len(quote), quote=quote, category=category)


def supervised_text(tok, sample) -> str:  # noqa: ANN001
    ids = sample.input_ids.tolist()
    return tok.decode([i for i, m in zip(ids, sample.loss_mask.tolist(), strict=True) if m])


def compile_ross(t: Trajectory, defects: list[Defect], tok, **options: object):  # noqa: ANN001, ANN201
    review = Review(trajectory_id=t.id, decision="accept", defects=defects)
    (sample,) = compile_trajectory(t, review, tok, CompileOptions(**options))
    return sample


def test_a_covers_generated_turns_only(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    sample = compile_ross(t, [], tok)
    text = supervised_text(tok, sample)
    assert "The bug is probably in parse()." in text and "Let me look at the file." in text
    assert "<parameter=command>" in text and "Fixed: add() returns a + b.<|im_end|>" in text
    assert "You are a coding agent" not in text and "Fix add() in calc.py." not in text
    assert "return a - b\n" not in text.replace("-    return a - b", "")  # the tool output is context
    assert "<|im_start|>" not in text  # headers are never eligible
    assert sample.excluded == 0 and sample.supervised == sample.eligible


def test_defect_in_tool_call_arguments_minimal_scope(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    as_json = defect(t, 2, "tool_calls[0].arguments", "cat calc.py")
    as_key = defect(t, 4, "tool_calls[0].arguments.input", "+    return a + b")
    sample = compile_ross(t, [as_json, as_key], tok, defect_scope="minimal")
    text = supervised_text(tok, sample)
    assert "cat calc.py" not in text and "return a + b" not in text
    assert '"bash", "-lc", "' in text  # the rest of the same argument stays supervised
    assert "*** Begin Patch" in text and "*** End Patch" in text
    assert 0 < sample.excluded < 20


def test_action_scope_excludes_the_whole_call_and_nothing_around_it(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    as_json = defect(t, 2, "tool_calls[0].arguments", "cat calc.py")
    as_key = defect(t, 4, "tool_calls[0].arguments.input", "+    return a + b")
    sample = compile_ross(t, [as_json, as_key], tok)
    text = supervised_text(tok, sample)
    for wrapper in (
        "<tool_call>",
        "<function=",
        "<parameter=",
        "</parameter>",
        "</function>",
        "</tool_call>",
        "workdir",
        "/repo",
        '"bash"',
        "*** Begin Patch",
    ):
        assert wrapper not in text
    # The reasoning and text before each call and the final answer stay; the end of turn after
    # a call belongs to the decision to call, the final answer's does not.
    assert "The bug is probably in parse()." in text and "Let me look at the file." in text and "It subtracts." in text
    assert text.endswith("Fixed: add() returns a + b.<|im_end|>") and text.count("<|im_end|>") == 1
    rendered = render(t, tok)
    offsets = tok(rendered.text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for turn in rendered.turns[:2]:
        lo, hi = turn.calls[0].region
        assert rendered.text[lo:].startswith("<tool_call>") and rendered.text[:hi].endswith("</tool_call><|im_end|>")
        inside = [i for i, (a, b) in enumerate(offsets) if a < hi and b > lo]
        assert inside and not any(sample.loss_mask[i] for i in inside)
    minimal = compile_ross(t, [as_json, as_key], tok, defect_scope="minimal")
    assert sample.excluded > 3 * minimal.excluded


def test_action_scope_spares_a_neighbouring_call(tok) -> None:  # noqa: ANN001
    messages = [dict(m) for m in BASE]
    messages[2] = {
        **messages[2],
        "tool_calls": [call("c1", "shell", command=["bash", "-lc", "ls -R"]), call("c1b", "shell", command=["bash", "-lc", "cat calc.py"])],
    }
    messages.insert(3, {"role": "tool", "tool_call_id": "c1b", "content": "..."})
    messages[3], messages[4] = {"role": "tool", "tool_call_id": "c1", "content": "calc.py"}, messages[3]
    t = trajectory(messages)
    first = defect(t, 2, "tool_calls[0].arguments.command", "ls -R")
    text = supervised_text(tok, compile_ross(t, [first], tok))
    assert "ls -R" not in text and "cat calc.py" in text
    assert text.count("<tool_call>") == 2  # the second call of that turn, and the patch
    assert (
        '<function=shell>\n<parameter=command>\n["bash", "-lc", "cat calc.py"]\n</parameter>\n</function>\n</tool_call><|im_end|>' in text
    )


TEXT_PROTOCOL = [
    {"role": "system", "content": "Answer with one bash block."},
    {"role": "user", "content": "Fix add() in calc.py."},
    {"role": "assistant", "generated": True, "content": "THOUGHT: list the files.\n\n```bash\nls\n```"},
    {"role": "user", "content": "<returncode>0</returncode>\n<output>\ncalc.py\n</output>"},
    {"role": "assistant", "generated": True, "content": "THOUGHT: list them again to be sure.\n\n```bash\nls -R\n```"},
    {"role": "user", "content": "<returncode>0</returncode>\n<output>\ncalc.py\n</output>"},
    {"role": "assistant", "generated": True, "content": "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
]


def test_action_scope_excludes_a_text_protocol_action_block_whole(tok) -> None:  # noqa: ANN001
    t = trajectory(TEXT_PROTOCOL)
    repeat = defect(t, 4, "content", "ls -R")
    action = supervised_text(tok, compile_ross(t, [repeat], tok))
    minimal = supervised_text(tok, compile_ross(t, [repeat], tok, defect_scope="minimal"))
    assert "ls -R" not in action and "ls -R" not in minimal
    # The block and its end of turn go; the thought before it and the other turns' blocks stay.
    assert "THOUGHT: list them again to be sure." in action and action.count("```bash") == 2 and action.count("<|im_end|>") == 2
    assert minimal.count("```bash") == 3 and minimal.count("<|im_end|>") == 3
    # An agent with tool calls acts through them: a fenced block in its text is not an action.
    with_calls = trajectory([*BASE[:-1], {"role": "assistant", "generated": True, "content": "Run:\n```bash\npytest -q\n```"}])
    text = supervised_text(tok, compile_ross(with_calls, [defect(with_calls, 6, "content", "pytest -q")], tok))
    assert "```bash" in text and "pytest -q" not in text


def test_defects_at_the_edges_of_a_message(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    content = t.messages[2].content
    first = Defect(message_index=2, field="content", start=0, end=content.index("Let") + 3, quote=content[: content.index("Let") + 3])
    last = Defect(
        message_index=6, field="content", start=len("Fixed: add() returns a + b") - 1, end=len("Fixed: add() returns a + b."), quote="b."
    )
    sample = compile_ross(t, [first, last], tok)
    text = supervised_text(tok, sample)
    assert " me look at the file." in text and "Let me" not in text
    assert "Fixed: add() returns a +" in text and "a + b." not in text
    assert text.endswith("<|im_end|>")  # the end-of-turn token is its own token, untouched


def test_adjacent_and_overlapping_defects(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    reasoning = t.messages[2].reasoning_content
    a = Defect(message_index=2, field="reasoning_content", start=4, end=7, quote=reasoning[4:7])
    b = Defect(message_index=2, field="reasoning_content", start=7, end=10, quote=reasoning[7:10])
    c = Defect(message_index=2, field="reasoning_content", start=5, end=15, quote=reasoning[5:15], category="wrong_hypothesis")
    both = compile_ross(t, [a, b, c], tok)
    only_c = compile_ross(t, [c], tok)
    assert both.excluded >= only_c.excluded > 0
    assert "bug is" not in supervised_text(tok, both)
    assert both.excluded_by_category["wrong_hypothesis"] == only_c.excluded


def test_defect_in_reasoning(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    sample = compile_ross(t, [defect(t, 2, "reasoning_content", "probably in parse()", category="wrong_hypothesis")], tok)
    text = supervised_text(tok, sample)
    assert "The bug is" in text and "parse()" not in text
    assert sample.excluded_by_category == {"wrong_hypothesis": sample.excluded}
    assert sample.ter == pytest.approx(sample.excluded / sample.eligible)


def test_a_wrong_quote_rejects_the_trajectory(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    bad = Defect(message_index=2, field="reasoning_content", start=0, end=3, quote="XYZ")
    with pytest.raises(Rejected, match="quote not at its offsets"):
        compile_ross(t, [bad], tok)
    outside = Defect(message_index=3, field="content", start=0, end=3, quote="def")
    with pytest.raises(Rejected, match="not a generated turn"):
        compile_ross(t, [outside], tok)


def test_recorded_token_ids_are_checked(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    rendered = render(t, tok, template_kwargs={"preserve_thinking": True})
    last = rendered.turns[-1]
    generated = tok(rendered.text[last.start : last.end], add_special_tokens=False)["input_ids"]  # as the engine sampled it
    messages = [dict(m) for m in BASE]
    for turn in rendered.turns:
        messages[turn.message_index] = dict(
            messages[turn.message_index], token_ids=tok(rendered.text[turn.start : turn.end], add_special_tokens=False)["input_ids"]
        )
    assert compile_ross(trajectory(messages), [], tok).targets == "recorded"
    messages[6] = dict(messages[6], token_ids=generated[:-1])
    assert compile_ross(trajectory(messages), [], tok).targets == "recorded"  # without the stop token
    messages[6] = dict(messages[6], token_ids=[generated[0] + 1, *generated[1:]])
    sample = compile_ross(trajectory(messages), [], tok)  # reported, and the text trained
    assert sample.targets == "ids_disagree" and sample.targets_detail.startswith("message 6: ")


def test_a_template_that_rewrites_earlier_turns_is_refused(tok) -> None:  # noqa: ANN001
    messages = [
        *BASE,
        {"role": "user", "content": "Now add a test."},
        {"role": "assistant", "generated": True, "reasoning_content": "Write it.", "content": "Added."},
    ]
    t = trajectory(messages)
    # Without preserve_thinking, Qwen3.6 drops reasoning from turns before the last query: one
    # render of the whole trajectory is refused (when the template is trusted, --context render).
    with pytest.raises(Rejected, match="render: prefix.*message 2"):
        compile_ross(t, [], tok, template_kwargs={"preserve_thinking": False}, context="render")
    with pytest.raises(Rejected, match="render: prefix.*message 2"):
        compile_ross(t, [], tok, template_kwargs={"preserve_thinking": False}, prefix_check="every", context="render")
    # By default a second query (a user turn after a generated one) says the history was sent
    # without its reasoning: one sample per turn, under that history.
    as_sent = compile_trajectory(t, None, tok, CompileOptions(mode="positive", template_kwargs={"preserve_thinking": False}))
    assert [(s.sample_id.split("#")[1], s.context_rule, s.as_sent) for s in as_sent] == [
        (f"m{i}", "user_observations", True) for i in (2, 4, 6, 8)
    ]
    # Per-turn mode: one sample per generated turn, each with the history the model was given.
    review = Review(trajectory_id=t.id, decision="accept", defects=[defect(t, 2, "reasoning_content", "probably")])
    samples = compile_trajectory(t, review, tok, CompileOptions(template_kwargs={"preserve_thinking": False}, per_turn=True))
    assert [s.sample_id.split("#")[1] for s in samples] == ["m2", "m4", "m6", "m8"]
    assert samples[0].excluded > 0 and all(s.excluded == 0 for s in samples[1:])
    # With preserve_thinking (the default) the whole trajectory is one prefix-stable render.
    assert compile_ross(t, [], tok, prefix_check="every", context="render").supervised > 0


def test_modes_and_selection(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    d = defect(t, 2, "reasoning_content", "probably")
    accepted = Review(trajectory_id=t.id, decision="accept", defects=[d])
    rejected = Review(trajectory_id=t.id, decision="reject", reason="reward hacking")
    (ross,) = compile_trajectory(t, accepted, tok, CompileOptions(mode="ross"))
    (nomask,) = compile_trajectory(t, accepted, tok, CompileOptions(mode="ross-nomask"))
    (positive,) = compile_trajectory(t, rejected, tok, CompileOptions(mode="positive"))
    assert ross.excluded > 0 and nomask.excluded == 0 and positive.excluded == 0
    assert np.array_equal(nomask.loss_mask, positive.loss_mask) and np.array_equal(ross.input_ids, positive.input_ids)
    with pytest.raises(Rejected, match="review rejected"):
        compile_trajectory(t, rejected, tok, CompileOptions(mode="ross"))
    with pytest.raises(Rejected, match="no review"):
        compile_trajectory(t, None, tok, CompileOptions(mode="ross-nomask"))
    unverified = Trajectory.model_validate({"messages": BASE})
    with pytest.raises(Rejected, match="not verified positive"):
        compile_trajectory(unverified, None, tok, CompileOptions(mode="positive"))
    with pytest.raises(Rejected, match="longer than ctx"):
        compile_trajectory(t, accepted, tok, CompileOptions(ctx=50))


def test_ross_and_ross_nomask_reject_the_same_trajectories(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    moved = defect(t, 2, "content", "look at").model_copy(update={"start": 0, "end": 7})
    review = Review(trajectory_id=t.id, decision="accept", defects=[moved])
    for mode in ("ross", "ross-nomask"):
        with pytest.raises(Rejected, match="quote not at its offsets"):
            compile_trajectory(t, review, tok, CompileOptions(mode=mode))
    (positive,) = compile_trajectory(t, review, tok, CompileOptions(mode="positive"))  # no review needed, none read
    assert positive.excluded == 0


# ---- properties over generated trajectories ---------------------------------------------

WORDS = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Co", "Cn")),
    min_size=0,
    max_size=40,
).filter(lambda s: not any(marker in s for marker in SPECIAL))
EDGY = st.builds(
    lambda pre, body, post: pre + body + post, st.sampled_from(["", " ", "\n", "  \n\t"]), WORDS, st.sampled_from(["", " ", "\n\n", "\t "])
)
ARG_VALUE = st.one_of(
    EDGY,
    st.integers(-5, 10**6),
    st.lists(WORDS, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9), max_size=2),
    st.booleans(),
)
ARGUMENTS = st.dictionaries(st.sampled_from(["command", "path", "input", "flag", "n"]), ARG_VALUE, min_size=1, max_size=3)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    messages: list[dict] = [{"role": "system", "content": draw(EDGY)}, {"role": "user", "content": draw(WORDS.filter(lambda s: s.strip()))}]
    for round_ in range(draw(st.integers(1, 3))):
        message: dict = {"role": "assistant", "generated": True}
        if draw(st.booleans()):
            message["reasoning_content"] = draw(EDGY)
        message["content"] = draw(EDGY)
        calls = [
            call(f"c{round_}_{i}", draw(st.sampled_from(["shell", "edit"])), **draw(ARGUMENTS)) for i in range(draw(st.integers(0, 2)))
        ]
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": draw(EDGY)})
    messages.append({"role": "assistant", "generated": True, "content": draw(EDGY)})
    return trajectory(messages)


@st.composite
def with_defects(draw: st.DrawFn) -> tuple[Trajectory, list[Defect]]:
    from records.review import field_text

    t = draw(trajectories())
    candidates = []
    for index, message in enumerate(t.messages):
        if message.role != "assistant":
            continue
        fields = ["content", "reasoning_content"] + [f"tool_calls[{i}].arguments" for i in range(len(message.tool_calls or []))]
        for name in fields:
            text = field_text(message, name)
            if text:
                candidates.append((index, name, text))
    defects = []
    for _ in range(draw(st.integers(0, 4)) if candidates else 0):
        index, name, text = draw(st.sampled_from(candidates))
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, len(text)))
        defects.append(Defect(message_index=index, field=name, start=start, end=end, quote=text[start:end]))
    return t, defects


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=with_defects())
def test_mask_properties(tok, case: tuple[Trajectory, list[Defect]]) -> None:  # noqa: ANN001
    t, defects = case
    try:
        sample = compile_ross(t, defects, tok)
    except Rejected as exc:
        # The only refusal a well-formed trajectory may get: a template error the model
        # itself would have hit (e.g. no user query), never a mask failure.
        if exc.reason == "render: template":
            reject()
        raise
    event(f"tokens excluded: {'some' if sample.excluded else 'none'}")
    rendered = render(t, tok, template_kwargs={"preserve_thinking": True})
    text = rendered.text
    encoding = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert encoding["input_ids"] == sample.input_ids.tolist()  # the render re-tokenizes to input_ids
    assert tok.decode(sample.input_ids.tolist()) == text
    offsets = encoding["offset_mapping"]
    defect_chars = np.zeros(len(text) + 1, dtype=bool)
    for d in defects:
        span = _defect_render_span(rendered, t, d)
        if span:
            defect_chars[span[0] : span[1]] = True
    in_turn = np.zeros(len(text) + 1, dtype=bool)
    for turn in rendered.turns:
        in_turn[turn.start : turn.end] = True
    mask = sample.loss_mask.tolist()
    for (start, end), supervised in zip(offsets, mask, strict=True):
        if supervised:
            assert end > start and in_turn[start:end].all()  # every supervised token is eligible
            assert not defect_chars[start:end].any()  # and touches no defect character
    # Every turn character that no excluded token covers is supervised: masking removes
    # the defects (and the tokens they touch), nothing else.
    covered_by_excluded = np.zeros(len(text) + 1, dtype=bool)
    supervised_chars = np.zeros(len(text) + 1, dtype=bool)
    for (start, end), supervised in zip(offsets, mask, strict=True):
        (supervised_chars if supervised else covered_by_excluded)[start:end] = True
    for turn in rendered.turns:
        for position in range(turn.start, turn.end):
            if not covered_by_excluded[position]:
                assert supervised_chars[position], (position, text[max(0, position - 10) : position + 10])
    # Decoding each supervised run gives exactly that stretch of the render.
    ids = sample.input_ids.tolist()
    i = 0
    while i < len(mask):
        if not mask[i]:
            i += 1
            continue
        j = i
        while j < len(mask) and mask[j]:
            j += 1
        piece = tok.decode(ids[i:j])
        if "\ufffd" not in piece:  # a run may begin or end inside a multi-byte character
            assert piece == text[offsets[i][0] : offsets[j - 1][1]]
        i = j


def _rows(stdout: str) -> dict[str, str]:
    return {line.split("│")[1].strip(): line.split("│")[2].strip() for line in stdout.splitlines() if line.count("│") == 3}


@pytest.mark.slow
def test_cli_masks_is_deterministic_and_resumable(relearn_bin: str, tmp_path: Path, tok, tokenizer_cache: Path) -> None:  # noqa: ANN001
    import os
    import subprocess

    import pyarrow.parquet as pq

    from records.pools import write_atomic

    good = trajectory(BASE)
    unverified = Trajectory.model_validate({"messages": BASE, "task_id": "other"})
    rejected_one = trajectory(BASE, task_id="hacked")
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [good, unverified, rejected_one])
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text(
        json.dumps(
            Review(trajectory_id=good.id, decision="accept", defects=[defect(good, 2, "reasoning_content", "probably")]).model_dump()
        )
        + "\n"
        + json.dumps({"trajectory_id": rejected_one.id, "decision": "reject", "reason": "reward hacking"})
        + "\n"
    )

    def masks(out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [relearn_bin, "masks", str(pool), "-r", str(reviews), "-o", str(out), "--shard-size", "2"],
            capture_output=True,
            text=True,
            env={**os.environ, "RELEARN_CACHE": str(tokenizer_cache)},
            timeout=600,
        )

    first = masks(tmp_path / "a")
    assert first.returncode == 0, first.stderr
    rows = _rows(first.stdout)
    assert rows["trajectories out"] == "1" and rows["shards (reused)"] == "2 (0)"
    assert rows["left out: review rejected"] == "1" and int(rows["excluded (A ∩ E)"]) > 0
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert stats["trajectories_in"] == 3 and stats["trajectories_out"] == 1
    assert stats["rejected"] == {"not verified positive": 1, "review rejected": 1}
    assert stats["tokens"]["excluded"] > 0 and stats["excluded_by_category"] == {"other": stats["tokens"]["excluded"]}
    table = pq.read_table(tmp_path / "a" / "shard-00000.parquet")
    assert table.column("input_ids").type.value_type == "int32" and table.num_rows == 1
    second = masks(tmp_path / "b")
    for name in ("shard-00000.parquet", "shard-00001.parquet", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    again = masks(tmp_path / "a")
    assert again.returncode == 0 and second.returncode == 0
    assert _rows(again.stdout)["shards (reused)"] == "2 (2)"


@pytest.mark.slow
def test_cli_masks_never_reuses_shards_of_other_inputs(relearn_bin: str, tmp_path: Path, tok, tokenizer_cache: Path) -> None:  # noqa: ANN001
    """Into a folder that holds shards: a changed review rebuilds exactly its shard; a later
    unreadable review line rejects its trajectory (no fallback to the earlier review); a
    smaller pool leaves no shard of the bigger one behind."""
    import os
    import subprocess

    from records.pools import write_atomic

    first, second = trajectory(BASE), trajectory(BASE, task_id="second")
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [first, second])
    reviews = tmp_path / "reviews.jsonl"

    def write_reviews(*extra: str) -> None:
        lines = [
            json.dumps(
                Review(trajectory_id=first.id, decision="accept", defects=[defect(first, 2, "reasoning_content", "probably")]).model_dump()
            ),
            json.dumps(Review(trajectory_id=second.id, decision="accept").model_dump()),
            *extra,
        ]
        reviews.write_text("\n".join(lines) + "\n")

    def masks(*flags: str) -> subprocess.CompletedProcess[str]:
        command = [relearn_bin, "masks", str(pool), "-r", str(reviews), "-o", str(tmp_path / "d"), "--shard-size", "1", *flags]
        return subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "RELEARN_CACHE": str(tokenizer_cache)}, timeout=600
        )

    def shard(k: int) -> bytes:
        return (tmp_path / "d" / f"shard-0000{k}.parquet").read_bytes()

    write_reviews()
    assert masks().returncode == 0
    before = [shard(0), shard(1)]
    # The first trajectory's review now excludes nothing: its shard is rebuilt, the other kept.
    write_reviews(json.dumps(Review(trajectory_id=first.id, decision="accept").model_dump()))
    changed = masks()
    assert (
        changed.returncode == 0 and _rows(changed.stdout)["shards (reused)"] == "2 (1)" and _rows(changed.stdout)["excluded (A ∩ E)"] == "0"
    )
    assert shard(0) != before[0] and shard(1) == before[1]
    # A later line for the first trajectory that cannot be read: rejected, with its location.
    write_reviews('{"trajectory_id": "' + first.id + '", "decision": "acc')
    broken = masks()
    assert broken.returncode == 1 and _rows(broken.stdout)["trajectories out"] == "1"
    stats = json.loads((tmp_path / "d" / "stats.json").read_text())
    assert stats["rejected"] == {"unreadable review": 1}
    assert stats["rejections"][0]["trajectory_id"] == first.id and f"{reviews}:3: invalid JSON" in stats["rejections"][0]["detail"]
    # A pool of one: one shard, and the second one's shard is gone.
    write_atomic(pool, [second])
    write_reviews()
    assert masks().returncode == 0
    assert sorted(p.name for p in (tmp_path / "d").glob("shard-*.parquet")) == ["shard-00000.parquet"]


def test_a_turn_after_a_context_reset_is_rendered_after_the_reset_only(tok) -> None:  # noqa: ANN001
    """A compacted history (Codex's ``compacted``, ATIF's compaction step): the turn after the
    reset gets its own sample, holding the instructions and what came after the reset, and
    no token of what the model no longer saw; defects go with the sample of their message."""
    messages = [
        *BASE[:4],
        {"role": "user", "content": "Summary of the work so far: add() subtracts; fix it.", "generated": False},
        {"role": "assistant", "generated": True, "reasoning_content": "Fix it now, surely.", "content": "Patching.",
         "tool_calls": [call("c2", "apply_patch", input="*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b\n*** End Patch\n")]},
        {"role": "tool", "tool_call_id": "c2", "content": "Success."},
        {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
    ]  # fmt: skip
    t = trajectory(messages, context_resets=[{"message_index": 4, "reason": "compacted"}])
    review = Review(
        trajectory_id=t.id,
        decision="accept",
        defects=[defect(t, 2, "reasoning_content", "probably"), defect(t, 5, "reasoning_content", "surely")],
    )
    before, after = compile_trajectory(t, review, tok, CompileOptions())
    assert (before.sample_id, after.sample_id) == (t.id + "#r0", t.id + "#r1")
    first, second = tok.decode(before.input_ids.tolist()), tok.decode(after.input_ids.tolist())
    assert "return a - b\n" in first and "Summary of the work" not in first
    assert second.startswith("<|im_start|>system\nYou are a coding agent.")  # the instructions stay
    for pre_reset in ("Fix add() in calc.py.", "The bug is probably", "cat calc.py", "def add(a, b):\n    return a - b"):
        assert pre_reset not in second, pre_reset
    assert "Summary of the work so far" in second and "Fixed: add() returns a + b." in supervised_text(tok, after)
    assert before.excluded > 0 and after.excluded > 0  # each defect excluded in its own context
    assert "probably" not in supervised_text(tok, before) and "surely" not in supervised_text(tok, after)
    # Without the reset the same messages are one sequence, as before, where the template is
    # trusted (by default the summary, a user turn after a generated one, compiles per turn).
    (whole,) = compile_trajectory(
        trajectory(messages), review.model_copy(update={"trajectory_id": trajectory(messages).id}), tok, CompileOptions(context="render")
    )
    assert whole.sample_id == trajectory(messages).id and whole.eligible == before.eligible + after.eligible


# ---- the throughput paths give what the plain ones give -----------------------------------


def test_a_batch_tokenized_on_threads_compiles_as_one_trajectory_at_a_time(tok) -> None:  # noqa: ANN001
    """``compile_batch`` tokenizes each trajectory on a thread as soon as it is rendered and
    masks them as they come back: long ones first (so later ones finish first), rejected ones
    in between, a context reset giving two samples; the results in order, as one at a time."""
    import random

    from bench.bench_masks import make_trajectory, review_for
    from relearn.masks.compile import compile_batch

    rng = random.Random(11)
    items: list[tuple[Trajectory, Review | None]] = []
    for seed, tokens in enumerate((12000, 6000, 300, 3000, 200, 800)):
        t = make_trajectory(rng, tokens, seed)
        items.append((t, review_for(t, rng)))
        if seed == 1:
            bad = trajectory(BASE)
            items.append((bad, Review(trajectory_id=bad.id, decision="accept", defects=[defect(bad, 2, "content", "Let me")])))
            items[-1][1].defects[0].quote = "not here"  # type: ignore[union-attr]
        if seed == 3:
            items.append((trajectory(BASE, outcome={"resolved": False}), None))
            reset = trajectory([*BASE[:4], {"role": "user", "content": "Summary."}, *BASE[4:]], context_resets=[{"message_index": 4}])
            items.append((reset, Review(trajectory_id=reset.id, decision="accept")))
    options = CompileOptions(ctx=10**6)
    batch = compile_batch(items, tok, options)
    assert len(batch) == len(items)
    for (t, review), got in zip(items, batch, strict=True):
        try:
            alone = compile_trajectory(t, review, tok, options)
        except Rejected as exc:
            assert isinstance(got, Rejected) and (got.reason, got.detail) == (exc.reason, exc.detail)
            continue
        assert not isinstance(got, Rejected), got
        assert [s.sample_id for s in got] == [s.sample_id for s in alone]
        for a, b in zip(got, alone, strict=True):
            for name in ("input_ids", "loss_mask", "eligible_mask", "excluded_category"):
                assert np.array_equal(getattr(a, name), getattr(b, name)), name
            assert (a.eligible, a.excluded, a.supervised, a.excluded_by_category) == (
                b.eligible,
                b.excluded,
                b.supervised,
                b.excluded_by_category,
            )
    assert [type(g).__name__ for g in batch].count("Rejected") == 2
    assert [s.sample_id for s in batch[6]] == [items[6][0].id + "#r0", items[6][0].id + "#r1"]  # type: ignore[union-attr]


def test_the_tokenizer_fingerprint_is_kept_while_the_tokenizer_is_unchanged(tokenizer_cache: Path) -> None:
    """The fingerprint (a hash of the whole serialised tokenizer) is worked out once per
    tokenizer object, and again whenever what can change in place has changed."""
    import hashlib

    from relearn.masks.shards import tokenizer_fingerprint
    from relearn.masks.tokenizers import load_tokenizer

    tok = load_tokenizer("qwen3.6", cache_dir=tokenizer_cache)  # a copy of its own: this test changes it

    def fresh() -> str:
        return hashlib.sha256((tok.backend_tokenizer.to_str() + "\0" + (tok.chat_template or "")).encode()).hexdigest()

    first = tokenizer_fingerprint(tok)
    assert first == fresh() and tokenizer_fingerprint(tok) == first
    tok.add_tokens(["<relearn-new-token>"])
    assert tokenizer_fingerprint(tok) == fresh() != first
    tok.chat_template = (tok.chat_template or "") + "{# changed #}"
    with_template = tokenizer_fingerprint(tok)
    assert with_template == fresh()
    tok.backend_tokenizer.enable_truncation(1000)
    assert tokenizer_fingerprint(tok) == fresh() != with_template
