"""A \\ E over the chat templates trl ships, checked against transformers' assistant mask.

Each family's ``_training`` template wraps assistant output in ``{% generation %}``, which
``return_assistant_tokens_mask`` turns into the mask TRL's ``assistant_only_loss`` trains.
relearn's A (located on its own, from the generation prompt through the end-of-turn marker)
must sit inside that mask on the very same ids; where they differ it is only by tokens the
model never generates (the newline after ``<|im_end|>``, what the generation prompt gave).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from relearn.masks.adapt import JOIN
from relearn.masks.compile import compile_one
from relearn.masks.template import RenderError, probe, render, template_input
from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template, with_chat_template
from relearn.masks.tokens import encode_render
from relearn.ops.masks import run_masks
from relearn.verbs.masks import MasksOptions
from tests.test_review_heuristic import PATCH, load_labelled, patch, shell, trajectory

KW = {"preserve_thinking": True}


@pytest.fixture(scope="module")
def qwen36():  # noqa: ANN201
    return load_tokenizer("qwen3.6")


@pytest.fixture(scope="module")
def labelled():  # noqa: ANN201
    # Four: with and without reasoning, one and several calls per turn (the sweep runs each
    # over every family, so the count sets the file's runtime).
    return [case.trajectory for case in load_labelled()][:4]


def _runs(ids: np.ndarray, where: np.ndarray) -> list[list[int]]:
    """The ids at ``where``, as runs of consecutive positions (decoded whole, so a marker BPE
    splits reads as itself)."""
    runs: list[list[int]] = []
    for position in np.flatnonzero(where):
        if runs and runs[-1][-1][0] == position - 1:
            runs[-1].append((position, int(ids[position])))
        else:
            runs.append([(position, int(ids[position]))])
    return [[token for _, token in run] for run in runs]


def _a_and_trl(tok, t):  # noqa: ANN001, ANN202
    shape = probe(tok, KW)
    rendered = render(t, tok, template_kwargs=KW, shape=shape)
    sample = compile_one(rendered, t, [], tok, t.id, exclude=False, recorded_ids=False)
    # Transformers renders the very messages relearn rendered (a turn the template refuses as
    # it is, adapted for both).
    conversation = template_input(t, shape=shape)
    out = tok.apply_chat_template(
        conversation.chat, tools=conversation.tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
        preserve_thinking=True,
    )  # fmt: skip
    return sample, np.array(out["input_ids"]), np.array(out["assistant_masks"], dtype=np.uint8)


FAMILIES = [
    "qwen3_training",
    "qwen3_6_training",
    "glm4moe_training",
    "deepseekv3_training",
    "nemotron_3_nano_training",
    "gptoss_training",
    "lfm2_v2_training",
    "qwen2_5_training",
]
# Markers a generation prompt gave (DeepSeek-V3's are plain text to the Qwen3.6 tokenizer, so
# they reach TRL's mask as the pieces BPE splits them into).
NEVER_GENERATED_BY = {"deepseekv3_training": {"<｜Assistant｜>", "<｜tool▁outputs▁end｜>"}, "gptoss_training": {"<|start|>assistant"}}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_is_the_trl_mask_on_the_same_ids_but_for_tokens_never_generated(family: str, qwen36, labelled) -> None:  # noqa: ANN001
    tok = with_chat_template(qwen36, resolve_chat_template(family))
    kept = 0
    for t in labelled:
        try:
            sample, ids, trl_mask = _a_and_trl(tok, t)
        except RenderError as exc:
            # Only gpt-oss refuses: its template writes one call per turn, so a turn's later
            # calls are not rendered and cannot be told apart.
            assert family == "gptoss_training" and "cannot be told apart" in str(exc), (family, str(exc))
            continue
        kept += 1
        assert np.array_equal(ids, sample.input_ids)
        a = sample.eligible_mask
        assert not ((a == 1) & (trl_mask == 0)).any(), family  # nothing supervised outside the assistant mask
        for run in _runs(ids, (a == 0) & (trl_mask == 1)):
            # Only markers (whole, or the pieces BPE splits a marker it does not know into),
            # whitespace, and the one given character a token straddling the turn's start
            # carries (``.<``: BPE joins a tool output's end to DeepSeek-V3's marker).
            left = tok.decode(run)
            for marker in NEVER_GENERATED_BY.get(family, set()):
                left = left.replace(marker, "")
            left = re.sub(r"<[^<>]*>|[<>]", "", left)
            assert len(left.strip()) <= 1, (family, tok.decode(run))
    assert kept >= 1


def test_a_defect_in_text_the_template_does_not_render_is_refused(qwen36, labelled) -> None:  # noqa: ANN001
    from records.review import Defect, Review
    from relearn.masks.compile import CompileOptions, Rejected, compile_trajectory

    # DeepSeek-V3 renders no reasoning: it is left out of A, and a defect in it has no place.
    tok = with_chat_template(qwen36, resolve_chat_template("deepseekv3_training"))
    t = next(t for t in labelled if any(m.reasoning_content and m.generated for m in t.messages))
    index = next(i for i, m in enumerate(t.messages) if m.reasoning_content and m.generated)
    quote = t.messages[index].reasoning_content[:5]  # type: ignore[index]
    review = Review(
        trajectory_id=t.id, decision="accept", defects=[Defect(message_index=index, field="reasoning_content", start=0, end=5, quote=quote)]
    )
    options = CompileOptions(mode="ross", template_kwargs={"preserve_thinking": True}, context="render")
    assert compile_trajectory(t, Review(trajectory_id=t.id, decision="accept", defects=[]), tok, options)
    with pytest.raises(Rejected, match="defect in text the template does not render"):
        compile_trajectory(t, review, tok, options)


@pytest.mark.parametrize(
    ("family", "opener"),
    [
        ("qwen3", "<tool_call>"),
        ("qwen3_6", "<tool_call>"),
        ("glm4moe_training", "<tool_call>"),
        ("lfm2_v2_training", "<|tool_call_start|>"),
        ("deepseekv3_training", "<｜tool▁calls▁begin｜>"),
        ("nemotron_3_nano_training", "<tool_call>"),
    ],
)
def test_each_call_is_one_region_holding_its_arguments_whatever_the_syntax(family: str, opener: str, qwen36, labelled) -> None:  # noqa: ANN001
    tok = with_chat_template(qwen36, resolve_chat_template(family))
    t = next(t for t in labelled if not any(m.reasoning_content for m in t.messages))
    rendered = render(t, tok, template_kwargs={"preserve_thinking": True})
    turn = next(turn for turn in rendered.turns if turn.calls)
    call = turn.calls[0]
    lo, hi = call.region
    assert rendered.text[lo:].startswith(opener)
    arguments = t.messages[turn.message_index].tool_calls[0].function.arguments  # type: ignore[index]
    # Every character of the arguments' JSON that is a key or value character shows inside the region.
    assert call.json_to_render and all(lo <= p < hi for p in call.json_to_render.values())
    for key, value in arguments.items():
        span = call.values.get(key)
        positions = call.escaped.get(key) or (list(range(span.start, span.start + span.kept)) if span else [])
        assert positions and all(lo <= p < hi for p in positions), key
        if isinstance(value, str) and span is not None:
            assert rendered.text[span.start : span.start + span.kept] == value


def test_the_chat_template_option_compiles_and_is_part_of_the_identity(tmp_path: Path, qwen36, labelled) -> None:  # noqa: ANN001
    from records.pools import write_atomic

    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, labelled)
    base = run_masks(MasksOptions(pool=pool, output=tmp_path / "a", mode="positive"), tokenizer=qwen36).stats
    glm = run_masks(
        MasksOptions(pool=pool, output=tmp_path / "b", mode="positive", chat_template="glm4moe_training"), tokenizer=qwen36
    ).stats
    assert glm["chat_template_sha256"] != base["chat_template_sha256"]
    assert glm["trajectories_out"] == base["trajectories_out"] or glm["rejected"] == base["rejected"]
    # The pipeline's tokenizer is left as it was: the option renders with a copy.
    assert "<|observation|>" not in (qwen36.chat_template or "")
    with pytest.raises(Exception, match="neither a file nor a chat template trl ships"):
        run_masks(MasksOptions(pool=pool, output=tmp_path / "c", mode="positive", chat_template="no-such-family"), tokenizer=qwen36)


def test_the_builtin_qwen3_compiles_tool_calling_trajectories(labelled) -> None:  # noqa: ANN001
    tok = load_tokenizer("qwen3")
    for t in labelled:
        rendered = render(t, tok, template_kwargs={"preserve_thinking": True})
        assert all(len(turn.calls) == len(t.messages[turn.message_index].tool_calls or []) for turn in rendered.turns)


def _covered(sample, encoded, lo: int, hi: int) -> bool:  # noqa: ANN001
    """Whether every character of ``[lo, hi)`` lies in a token of A."""
    inside = np.zeros(hi - lo, dtype=bool)
    for (start, end), eligible in zip(encoded.offsets, sample.eligible_mask, strict=True):
        if eligible and end > lo and start < hi:
            inside[max(start, lo) - lo : min(end, hi) - lo] = True
    return bool(inside.all())


def test_gptoss_is_given_a_calling_turn_with_text_and_reasoning_as_one_analysis_message(qwen36) -> None:  # noqa: ANN001
    tok = with_chat_template(qwen36, resolve_chat_template("gptoss_training"))
    step = shell("cat calc.py", output="def add(a, b):\n    return a - b\n", reasoning="The bug is in calc.py.")
    step[0]["content"] = "Let me read calc.py."
    # No final answer: the template keeps each calling turn's analysis (it drops them before one).
    t = trajectory(step, shell("ls", output="calc.py\n"), final=None)
    shape = probe(tok, KW)
    assert shape.merge_calling_text  # found by the shape: it raises on the turn as it is
    with pytest.raises(RenderError, match="Cannot pass both content and thinking"):
        render(t, tok, template_kwargs=KW, shape=replace(shape, merge_calling_text=False))
    rendered = render(t, tok, template_kwargs=KW, shape=shape)
    # Reasoning, then the text (harmony's analysis, then the preamble), then the call.
    analysis = "<|channel|>analysis<|message|>The bug is in calc.py." + JOIN + "Let me read calc.py.<|end|>"
    assert analysis + "<|start|>assistant to=functions.shell<|channel|>commentary json" in rendered.text
    turn = rendered.turns[0]
    assert set(turn.fields) == {"reasoning_content", "content"} and not turn.left_out and len(turn.calls) == 1
    sample, ids, trl_mask = _a_and_trl(tok, t)
    assert np.array_equal(ids, sample.input_ids)
    assert not ((sample.eligible_mask == 1) & (trl_mask == 0)).any()
    # Every character the model generated in the turn is supervised: both texts and the call.
    encoded = encode_render(tok, rendered, False)
    for span in turn.fields.values():
        assert _covered(sample, encoded, span.start, span.start + span.kept)
    # (through its ``<|call|>`` but for that marker's last ``>``, which this tokenizer, not knowing
    # the marker, joins with the tool message's ``<`` into one token straddling the turn's end).
    assert _covered(sample, encoded, turn.calls[0].region[0], turn.end - 1)
    # A template that renders the shape is given the messages unchanged.
    qwen = with_chat_template(qwen36, resolve_chat_template("qwen3_6_training"))
    qwen_shape = probe(qwen, KW)
    assert not qwen_shape.merge_calling_text
    assert template_input(t, shape=qwen_shape).chat == template_input(t).chat


def test_gptoss_a_call_without_arguments_after_text_is_in_a_header_and_all(qwen36) -> None:  # noqa: ANN001
    # OpenHands' ``finish`` takes no arguments: the turn is the text's analysis message, then
    # ``<|start|>assistant to=functions.finish...{}<|call|>``, which the model generates too.
    tok = with_chat_template(qwen36, resolve_chat_template("gptoss_training"))
    finish = {"id": "call_f", "type": "function", "function": {"name": "finish", "arguments": {}}}
    last = [{"role": "assistant", "generated": True, "content": "Done: the tests pass.", "tool_calls": [finish]}]
    t = trajectory(shell("ls", output="calc.py\n"), last, final=None)
    rendered = render(t, tok, template_kwargs=KW, shape=probe(tok, KW))
    turn = rendered.turns[-1]
    assert rendered.text[turn.start : turn.end].endswith(
        "<|end|><|start|>assistant to=functions.finish<|channel|>commentary json<|message|>{}<|call|>"
    )
    sample, ids, trl_mask = _a_and_trl(tok, t)
    assert np.array_equal(ids, sample.input_ids)
    a = sample.eligible_mask
    assert not ((a == 1) & (trl_mask == 0)).any()
    # A holds the call, its ``<|start|>assistant to=`` header and all ...
    header = rendered.text.rindex("<|start|>assistant to=functions.finish")
    assert _covered(sample, encode_render(tok, rendered, False), header, turn.end - 1)
    # ... and all TRL's mask has beyond A is each turn's given ``<|start|>assistant`` (or the
    # part of it after the ``><`` this tokenizer makes of a marker's end and the next one's start).
    for run in _runs(ids, (a == 0) & (trl_mask == 1)):
        assert "<|start|>assistant".endswith(tok.decode(run).lstrip("><")), tok.decode(run)


def test_diffusion_gemma_trains_the_tool_response_marker_its_model_stops_a_call_with(qwen36) -> None:  # noqa: ANN001
    # Gemma 4 ends a calling turn by generating ``<|tool_response>`` (id 50, one of the three
    # ids of DiffusionGemma's generation_config.json ``eos_token_id``); the tool's answer
    # follows it. TRL's ``_training`` template leaves it outside ``{% generation %}``; A keeps
    # it, as it keeps every template's stop, and that is the only difference.
    tok = with_chat_template(qwen36, resolve_chat_template("diffusion_gemma_training"))
    t = trajectory(patch(PATCH), final="Fixed.")
    shape = probe(tok, KW)
    assert "<|tool_response>" in shape.stops
    rendered = render(t, tok, template_kwargs=KW, shape=shape)
    turn = rendered.turns[0]
    assert rendered.text[turn.start : turn.end].endswith("<tool_call|><|tool_response>")
    sample, ids, trl_mask = _a_and_trl(tok, t)
    assert np.array_equal(ids, sample.input_ids)
    encoded = encode_render(tok, rendered, False)
    outside = (sample.eligible_mask == 1) & (trl_mask == 0)
    assert outside.any()
    marker = turn.end - len("<|tool_response>")
    assert all(start < turn.end and end > marker for start, end in encoded.offsets[outside]), tok.decode(ids[outside])


def _gemma_turn() -> list[dict]:
    """A calling turn with reasoning and text whose arguments are not in sorted key order and
    hold a list (DiffusionGemma writes keys sorted and strings between ``<|"|>`` marks)."""
    step = shell(["bash", "-lc", 'grep -n "def add" calc.py'], output="1:def add(a, b):\n", reasoning="Find add first.")
    call = step[0]["tool_calls"][0]["function"]
    call["arguments"] = {"workdir": "/testbed", "command": call["arguments"]["command"]}
    step[0]["content"] = "Let me find add."
    return step


def test_diffusion_gemma_lists_sorted_keys_and_the_text_before_the_call(qwen36) -> None:  # noqa: ANN001
    tok = with_chat_template(qwen36, resolve_chat_template("diffusion_gemma_training"))
    t = trajectory(_gemma_turn(), final="Fixed.")
    shape = probe(tok, KW)
    # Given as one message, the template writes the text after the tool's response, where its
    # model writes what it says after reading it; given as text then calls, before the call.
    assert shape.split_calling_text
    as_one = render(t, tok, template_kwargs=KW, shape=replace(shape, split_calling_text=False)).text
    assert as_one.index("Let me find add.") > as_one.index("<tool_response|>")
    rendered = render(t, tok, template_kwargs=KW, shape=shape)
    turn = rendered.turns[0]
    written = '<|channel>thought\nFind add first.\n<channel|>Let me find add.<|tool_call>call:shell{command:[<|"|>bash<|"|>,'
    assert rendered.text[turn.start :].startswith(written)
    assert rendered.text[turn.start : turn.end].endswith('<|"|>}<tool_call|><|tool_response>')
    assert set(turn.fields) == {"reasoning_content", "content"} and not turn.left_out
    # Every JSON character of each argument's value maps onto the character showing it, the
    # keys found in the template's (sorted) order though the call holds them otherwise.
    call, arguments = turn.calls[0], t.messages[2].tool_calls[0].function.arguments  # type: ignore[index]
    as_json = json.dumps(arguments, ensure_ascii=False)
    for needle in ("def add", "/testbed", "-lc"):
        at = as_json.index(needle)
        shown = [rendered.text[call.json_to_render[at + i]] for i in range(len(needle))]
        assert "".join(shown) == needle, (needle, shown)
    # An escape's two JSON characters (``\"``) both map onto the one quote the template shows.
    escape = as_json.index('\\"def')
    assert call.json_to_render[escape] == call.json_to_render[escape + 1]
    assert rendered.text[call.json_to_render[escape]] == '"'
    sample, ids, trl_mask = _a_and_trl(tok, t)
    assert np.array_equal(ids, sample.input_ids)
    encoded = encode_render(tok, rendered, False)
    # A holds the reasoning, the text and the call, in the order the model generated them.
    assert _covered(sample, encoded, turn.start, turn.end - len("<|tool_response>"))
    # Nothing of A outside TRL's mask but the stop after the call.
    marker = turn.end - len("<|tool_response>")
    outside = (sample.eligible_mask == 1) & (trl_mask == 0)
    assert all(start < turn.end and end > marker for start, end in encoded.offsets[outside]), tok.decode(ids[outside])
    # A template that writes a calling turn's text before its calls is given it unsplit.
    qwen = with_chat_template(qwen36, resolve_chat_template("qwen3_6_training"))
    assert not probe(qwen, KW).split_calling_text


def test_qwen3_5_nothink_a_reasoned_turn_follows_the_thinking_prompt(qwen36) -> None:  # noqa: ANN001
    # The NoThink template prompts with an empty think block; a turn that holds reasoning was
    # generated after its prompt with thinking on (``<think>\n``), which the render continues.
    tok = with_chat_template(qwen36, resolve_chat_template("qwen3_5_nothink_training"))
    t = trajectory(shell("ls", output="calc.py\n", reasoning="List the files."), shell("cat calc.py", output="x\n"), final="Done.")
    shape = probe(tok, KW)
    assert shape.generation_prompt.endswith("<think>\n\n</think>\n\n") and shape.thinking_prompt.endswith("<think>\n")
    rendered = render(t, tok, template_kwargs=KW, shape=shape)
    reasoned, plain = rendered.turns[0], rendered.turns[1]
    assert rendered.text[: reasoned.start].endswith("<|im_start|>assistant\n<think>\n")
    assert rendered.text[reasoned.start :].startswith("List the files.\n</think>")
    assert rendered.text[: plain.start].endswith("<think>\n\n</think>\n\n")
    sample, ids, trl_mask = _a_and_trl(tok, t)
    assert np.array_equal(ids, sample.input_ids)
    assert not ((sample.eligible_mask == 1) & (trl_mask == 0)).any()
    # Without the thinking prompt the reasoned turn is refused: it does not follow the prompt.
    with pytest.raises(RenderError, match="prefix"):
        render(t, tok, template_kwargs=KW, shape=replace(shape, thinking_prompt=None))


def test_deepseek_r1_distill_refuses_a_turn_whose_calls_it_does_not_write(qwen36) -> None:  # noqa: ANN001
    # Its template drops a message's calls when it has content (and fails on content none).
    tok = with_chat_template(qwen36, resolve_chat_template("deepseek_r1_distill_training"))
    t = trajectory(patch(PATCH, content="Patching calc.py."), final="Fixed.")
    with pytest.raises(RenderError, match="does not write this turn's tool calls"):
        render(t, tok, template_kwargs=KW, shape=probe(tok, KW))
