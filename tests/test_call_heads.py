"""Call location by the template's learned call heads gives what rendering each turn gives.

``relearn masks`` finds each tool call by the text the template writes before a call's name
(learned once per template from a probe turn); only a turn where that fails is rendered alone
with its first k calls and diffed. The two must place every call, value and JSON character on
the same rendered characters for every template trl ships that writes tool calls, including a
turn whose argument holds the next call's head and name verbatim.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from relearn.masks import template
from relearn.masks.template import RenderError, probe, render
from relearn.masks.tokenizers import load_tokenizer, trl_chat_templates, with_chat_template
from tests.test_review_heuristic import load_labelled

# The families issue 48 names: each compiles some of these trajectories (the others may refuse
# them all for reasons of their own, e.g. DeepSeek-R1-Distill does not write a turn's calls).
NAMED_BY_THE_ISSUE = {
    "qwen3_training", "qwen3_6_training", "glm4moe_training", "deepseekv3_training", "gptoss_training",
    "nemotron_3_nano_training", "qwen2_5_training", "lfm2_v2_training",
}  # fmt: skip
# Every template trl ships that writes tool calls, its ``_training`` variant where it has one
# (the same calls, with generation markers).
_CALLING = {p.stem for p in Path(trl_chat_templates()).glob("*.jinja") if "tool_calls" in p.read_text()}
FAMILIES = sorted(f for f in _CALLING if f.endswith("_training") or f"{f}_training" not in _CALLING)


@pytest.fixture(scope="module")
def qwen36():  # noqa: ANN201
    return load_tokenizer("qwen3.6")


@pytest.fixture(scope="module")
def trajectories():  # noqa: ANN201
    with_reasoning = next(c.trajectory for c in load_labelled() if any(m.reasoning_content for m in c.trajectory.messages))
    several = _two_calls_a_turn(with_reasoning)
    return [with_reasoning, several, _head_inside_an_argument(several)]


def _two_calls_a_turn(t):  # noqa: ANN001, ANN202
    """``t`` with every calling turn making a second call (a copy of its first, another id)."""
    t = t.model_copy(deep=True)
    for message in t.messages:
        if message.tool_calls:
            again = message.tool_calls[0].model_copy(deep=True)
            again.id = f"{again.id}_again"
            message.tool_calls.append(again)
    return t


def _head_inside_an_argument(t):  # noqa: ANN001, ANN202
    """``several`` with its first multi-call turn's first call given a string argument that
    holds, verbatim, what Qwen3.6 writes before the next call's name (templates that write
    strings raw show it as is)."""
    t = t.model_copy(deep=True)
    message = next(m for m in t.messages if len(m.tool_calls or []) > 1)
    first, second = message.tool_calls[0], message.tool_calls[1]  # type: ignore[index]
    first.function.arguments["note"] = f"see\n<tool_call>\n<function={second.function.name}>\nabove"
    return t


def _both(tok, shape, t):  # noqa: ANN001, ANN202
    out = []
    for heads in (shape.call_heads, None):
        try:
            out.append(render(t, tok, template_kwargs={"preserve_thinking": True}, shape=dataclasses.replace(shape, call_heads=heads)))
        except RenderError as exc:
            out.append(str(exc))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_calls_found_by_heads_are_where_rendering_each_turn_puts_them(family: str, qwen36, trajectories) -> None:  # noqa: ANN001
    tok = with_chat_template(qwen36, (trl_chat_templates() / f"{family}.jinja").read_text())
    shape = probe(tok, {"preserve_thinking": True})
    compiled = 0
    for t in trajectories:
        by_heads, by_renders = _both(tok, shape, t)
        if isinstance(by_renders, str):
            assert isinstance(by_heads, str), (family, t.id, by_renders)
            continue
        assert not isinstance(by_heads, str), (family, t.id, by_heads)
        assert by_heads.turns == by_renders.turns, (family, t.id)
        compiled += 1
    assert compiled or family not in NAMED_BY_THE_ISSUE, family


@pytest.mark.parametrize(
    ("family", "first", "later"),
    [
        ("qwen3_6", "<tool_call>\n<function=", "<tool_call>\n<function="),
        ("qwen3", '<tool_call>\n{"name": "', '<tool_call>\n{"name": "'),
        (
            "deepseekv3_training",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
        ),
    ],
)
def test_the_heads_are_what_the_template_writes_before_a_call_name(family: str, first: str, later: str, qwen36) -> None:  # noqa: ANN001
    tok = with_chat_template(qwen36, (trl_chat_templates() / f"{family}.jinja").read_text())
    assert probe(tok, {}).call_heads == (first, later)


def test_a_trajectory_whose_calls_the_heads_find_is_rendered_once(qwen36, trajectories, monkeypatch) -> None:  # noqa: ANN001
    shape = probe(qwen36, {"preserve_thinking": True})
    renders = []
    real = template._render
    monkeypatch.setattr(template, "_render", lambda *a, **k: renders.append(1) or real(*a, **k))
    t = trajectories[1]
    rendered = render(t, qwen36, template_kwargs={"preserve_thinking": True}, shape=shape)
    assert sum(len(turn.calls) for turn in rendered.turns) > 2
    assert len(renders) == 1
    # The argument that holds the next call's head verbatim sends its turn to the renders.
    renders.clear()
    render(trajectories[2], qwen36, template_kwargs={"preserve_thinking": True}, shape=shape)
    assert len(renders) > 1


def test_a_value_in_a_syntax_of_its_own_is_found_by_its_leaves() -> None:
    # Gemma writes ``{b:[<|"|>x "y"<|"|>,2],a:null}`` for {"b": ["x \"y\"", 2], "a": None}:
    # no whole form matches, each leaf does, its keys bare and sorted.
    from relearn.masks import calls

    value = {"b": ['x "y"', 2], "a": None}
    text = 'k:{a:null,b:[<|"|>x "y"<|"|>,2]}'
    start, end, positions = calls.find_by_leaves(text, value, 2, len(text))  # type: ignore[misc]
    as_json = json.dumps(value, ensure_ascii=False)
    assert len(positions) == len(as_json)
    for needle in ("null", "2", "x "):
        at = as_json.index(needle)
        assert "".join(text[positions[at + i]] for i in range(len(needle))) == needle
    quote = as_json.index('\\"y')
    assert text[positions[quote]] == text[positions[quote + 1]] == '"'
    assert text[start:end] == 'a:null,b:[<|"|>x "y"<|"|>,2'
    # A leaf the text lacks: not found, never placed elsewhere.
    assert calls.find_by_leaves(text, {"b": ["z"]}, 2, len(text)) is None
