"""A \\ E over the chat templates trl ships, checked against transformers' assistant mask.

Each family's ``_training`` template wraps assistant output in ``{% generation %}``, which
``return_assistant_tokens_mask`` turns into the mask TRL's ``assistant_only_loss`` trains.
relearn's A (located on its own, from the generation prompt through the end-of-turn marker)
must sit inside that mask on the very same ids; where they differ it is only by tokens the
model never generates (the newline after ``<|im_end|>``, what the generation prompt gave).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from relearn.masks.compile import compile_one
from relearn.masks.template import RenderError, render, template_input
from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template, with_chat_template
from relearn.ops.masks import run_masks
from relearn.verbs.masks import MasksOptions
from tests.test_review_heuristic import load_labelled


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
    rendered = render(t, tok, template_kwargs={"preserve_thinking": True})
    sample = compile_one(rendered, t, [], tok, t.id, exclude=False, recorded_ids=False)
    conversation = template_input(t)
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
            # Only gpt-oss refuses, itself: a calling turn with both text and reasoning.
            assert family == "gptoss_training" and "Cannot pass both content and thinking" in str(exc), (family, str(exc))
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
