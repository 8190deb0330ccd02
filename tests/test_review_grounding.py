"""Quote grounding: exact, whitespace-normalised and strict fuzzy re-anchoring, fail closed."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from records.review import field_text
from records.trajectory import Trajectory
from review.grounding import GroundingResult, collapse, ground

REASONING = "The failure says parse() returns None for empty input.\nI think the bug is in tokenize(), not parse()."
CONTENT = "Let me   check\n    the tokenizer first.\nThen run the tests."
SCRIPT = 'grep -n "def tokenize" calc/tokenizer.py\nprintf \'%s\\n\' "done"'
PATCH = '*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b  # "fixed"\n*** End Patch\n'


def trajectory() -> Trajectory:
    return Trajectory.model_validate(
        {
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix add() in calc.py; the tokenizer is fine."},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": REASONING,
                    "content": CONTENT,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "shell", "arguments": {"command": ["bash", "-lc", SCRIPT], "workdir": "/repo"}}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "Exit code: 0\nWall time: 0.1 seconds\nOutput:\n3:def tokenize(text):\n"},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "Patching calc.py now.",
                    "tool_calls": [
                        {"id": "c2", "function": {"name": "apply_patch", "arguments": {"input": PATCH}}},
                        {"id": "c3", "function": {"name": "shell", "arguments": {"command": 'python -m pytest -q -k "add and not slow"'}}},
                    ],
                },
                {"role": "tool", "tool_call_id": "c2", "content": "Success. Updated the following files:\nM calc.py\n"},
                {"role": "tool", "tool_call_id": "c3", "content": "Exit code: 0\nWall time: 0.4 seconds\nOutput:\n1 passed\n"},
                {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
            ],
            "outcome": {"resolved": True},
        }
    )


def check(t: Trajectory, result: GroundingResult) -> str:
    """The grounded quote is always the exact source slice; returns it."""
    assert result.defect is not None, result.reason
    d = result.defect
    text = field_text(t.messages[d.message_index], d.field)
    assert text is not None and d.quote == text[d.start : d.end] and d.end > d.start
    return d.quote


def test_exact() -> None:
    t = trajectory()
    result = ground(t, 2, "reasoning_content", "I think the bug is in tokenize()", category="wrong_hypothesis", description="d")
    assert result.method == "exact" and check(t, result) == "I think the bug is in tokenize()"
    assert (
        result.defect.start == REASONING.index("I think")
        and result.defect.category == "wrong_hypothesis"
        and result.defect.description == "d"
    )


def test_twice_is_ambiguous_unless_context_decides() -> None:
    t = trajectory()
    assert REASONING.count("parse()") == 2
    result = ground(t, 2, "reasoning_content", "parse()")
    assert result.defect is None and result.method == "rejected" and result.reason == "ambiguous"
    second = ground(t, 2, "reasoning_content", "parse()", context_before="tokenize(), not ")
    assert check(t, second) == "parse()" and second.defect.start == REASONING.rindex("parse()")
    first = ground(t, 2, "reasoning_content", "parse()", context_after=" returns None")
    assert first.defect.start == REASONING.index("parse()")
    # Context that fits neither occurrence leaves it ambiguous: no guessing.
    assert ground(t, 2, "reasoning_content", "parse()", context_before="something else entirely").reason == "ambiguous"
    # A slightly misquoted context still picks the occurrence it clearly belongs to.
    near = ground(t, 2, "reasoning_content", "parse()", context_before="the bug is in tokenize(),  not")
    assert near.defect.start == REASONING.rindex("parse()")


def test_whitespace_changed_quote_maps_to_original_offsets() -> None:
    t = trajectory()
    result = ground(t, 2, "content", "Let me check the tokenizer\nfirst.")
    assert result.method == "whitespace"
    quote = check(t, result)
    assert quote == "Let me   check\n    the tokenizer first."
    assert (result.defect.start, result.defect.end) == (0, CONTENT.index("first.") + len("first."))
    inner = ground(t, 2, "content", "  check the   tokenizer  ")
    assert inner.method == "whitespace" and check(t, inner) == "check\n    the tokenizer"


def test_fuzzy_reanchor_and_threshold() -> None:
    t = trajectory()
    source = "I think the bug is in tokenize(), not parse()."
    assert len(source) >= 40
    typo = source.replace("bug", "bog").replace("tokenize()", "tokenise()")  # two characters changed
    result = ground(t, 2, "reasoning_content", typo)
    assert result.method == "fuzzy" and check(t, result) == source
    dropped = source.replace("the ", "")  # four characters missing: the span is the source's, not a window
    result = ground(t, 2, "reasoning_content", dropped)
    assert result.method == "fuzzy" and check(t, result) == source
    garbled = "I thonk the bog is in tokenise(), nat parsa()."  # six characters changed: 89 < 92
    rejected = ground(t, 2, "reasoning_content", garbled)
    assert rejected.defect is None and rejected.reason == "below threshold"
    assert check(t, ground(t, 2, "reasoning_content", garbled, fuzzy_threshold=85.0)) == source
    # Short quotes never re-anchor fuzzily.
    assert ground(t, 2, "reasoning_content", "tokenise()").reason == "not found"


def test_hallucinated_quote_is_rejected() -> None:
    t = trajectory()
    result = ground(t, 2, "auto", "We should rewrite the whole module from scratch using numpy arrays.")
    assert result.defect is None and result.method == "rejected" and result.reason == "not found"
    assert ground(t, 2, "content", "").reason == "empty quote"


def test_quote_spanning_two_messages_is_rejected() -> None:
    t = trajectory()
    spanning = "the tokenizer first.\nThen run the tests. Exit code: 0"  # end of message 2 content + tool output
    result = ground(t, 2, "content", spanning)
    assert result.defect is None and result.reason == "spans fields"
    across = "Then run the tests.\nPatching calc.py now."  # two assistant messages
    assert ground(t, 4, "auto", across).reason == "spans fields"
    # Text of another message (an off-by-one turn) is not taken from there.
    assert ground(t, 4, "content", "Fixed: add() returns a + b.").reason == "in another message"


def test_a_field_the_step_lacks_is_searched_for_in_the_whole_step() -> None:
    t = trajectory()
    # Judges name fields loosely: a call index past the last, a bare "arguments", a misspelt key.
    for named in ("tool_calls[5].arguments", "arguments", "tool_calls[0].arguments.missing", "tool_calls[0].arguments.cmd", "command"):
        result = ground(t, 2, named, "bash")
        assert result.defect.field == "tool_calls[0].arguments.command" and check(t, result) == "bash"
    # ... still unique or nothing: message 4 names calc.py in its text and in its patch.
    assert ground(t, 4, "tool_calls[7].arguments", "calc.py").reason == "ambiguous"
    assert ground(t, 2, "tool_calls[5].arguments", "rm -rf /").reason == "not found"


def test_quotes_of_argv_commands_in_every_form_judges_write() -> None:
    t = trajectory()
    argv = t.messages[2].tool_calls[0].function.arguments["command"]
    field = "tool_calls[0].arguments.command"
    as_json = json.dumps(argv, ensure_ascii=False)
    # Inside one element, as written in the JSON (escaped) and as the shell runs it (raw).
    assert check(t, ground(t, 2, field, 'grep -n \\"def tokenize\\" calc/tokenizer.py')) == 'grep -n \\"def tokenize\\" calc/tokenizer.py'
    raw = ground(t, 2, field, SCRIPT)
    assert check(t, raw) == json.dumps(SCRIPT, ensure_ascii=False)[1:-1] and as_json[raw.defect.start : raw.defect.end] == raw.defect.quote
    # The whole list, as JSON re-spaced or as the command line it runs.
    for quote in (json.dumps(argv, indent=2), shlex.join(argv), " ".join(argv)):
        whole = ground(t, 2, field, quote)
        assert whole.defect is not None and (whole.defect.start, whole.defect.end) == (0, len(as_json)), quote
    # The whole arguments object, pretty-printed as judge 1 read it, under the object's field or a key's.
    arguments = t.messages[2].tool_calls[0].function.arguments
    for named in ("tool_calls[0].arguments", field):
        result = ground(t, 2, named, json.dumps(arguments, ensure_ascii=False, indent=1))
        assert result.defect.field == "tool_calls[0].arguments" and check(t, result) == json.dumps(arguments, ensure_ascii=False)


def test_no_such_message() -> None:
    t = trajectory()
    assert ground(t, 99, "content", "x").reason == "no such message"
    assert ground(t, 1, "content", "Fix add()").reason == "not a generated assistant message"


def test_field_auto_detection() -> None:
    t = trajectory()
    in_reasoning = ground(t, 2, "auto", "returns None for empty input")
    assert in_reasoning.defect.field == "reasoning_content" and check(t, in_reasoning)
    in_patch = ground(t, 4, "", "+    return a + b")
    assert in_patch.defect.field == "tool_calls[0].arguments.input" and check(t, in_patch)
    in_argv = ground(t, 2, "auto", '\\"def tokenize\\"')  # an argv value's field text is its JSON
    assert in_argv.defect.field == "tool_calls[0].arguments.command" and check(t, in_argv)
    # The same text in two fields is ambiguous in auto mode.
    assert ground(t, 4, "auto", "calc.py").reason == "ambiguous"
    # A named field that lacks the quote falls back to a unique hit in another field.
    fallback = ground(t, 2, "content", "I think the bug is in tokenize()")
    assert fallback.defect.field == "reasoning_content" and check(t, fallback)


def test_tool_call_argument_fields_with_json_escaping() -> None:
    t = trajectory()
    arguments = t.messages[2].tool_calls[0].function.arguments
    as_json = json.dumps(arguments, ensure_ascii=False)
    # The judge read the JSON and quotes it escaped: offsets are into the JSON text.
    escaped = json.dumps(SCRIPT)[1:-1]
    result = ground(t, 2, "tool_calls[0].arguments", escaped)
    assert result.method == "exact" and check(t, result) == escaped
    assert as_json[result.defect.start : result.defect.end] == escaped
    # The judge quotes the raw text (real newlines and quotes): grounded to its escaped JSON form.
    raw = "tokenizer.py\nprintf '%s\\n' \"done\""
    result = ground(t, 2, "tool_calls[0].arguments", raw)
    assert check(t, result) == json.dumps(raw)[1:-1] and "\n" not in result.defect.quote
    # .KEY fields index the raw string value: newlines and quotes are themselves.
    result = ground(t, 4, "tool_calls[0].arguments.input", '-    return a - b\n+    return a + b  # "fixed"')
    assert result.method == "exact" and check(t, result) == '-    return a - b\n+    return a + b  # "fixed"'
    assert PATCH[result.defect.start : result.defect.end] == result.defect.quote
    # ... and a JSON-escaped quote of a raw value is decoded before searching.
    result = ground(t, 4, "tool_calls[0].arguments.input", '+    return a + b  # \\"fixed\\"\\n*** End Patch')
    assert check(t, result) == '+    return a + b  # "fixed"\n*** End Patch'
    result = ground(t, 4, "tool_calls[1].arguments.command", '-k "add and not slow"')
    assert check(t, result) == '-k "add and not slow"'


@pytest.mark.parametrize(
    ("index", "field", "quote"),
    [
        (2, "reasoning_content", "bug  is in\ttokenize()"),
        (2, "content", "Then run the tests."),
        (2, "tool_calls[0].arguments", '"-lc", "grep -n'),
        (4, "tool_calls[0].arguments.input", "*** Update File: calc.py\n-    return a - b"),
        (4, "auto", "Patching calc.py"),
        (2, "reasoning_content", "I think the bug is in tokenize, not parse()."),
    ],
)
def test_quote_is_always_the_source_slice(index: int, field: str, quote: str) -> None:
    t = trajectory()
    check(t, ground(t, index, field, quote))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_substring_grounds_to_its_own_slice(data: st.DataObject) -> None:
    t = trajectory()
    index, field = data.draw(
        st.sampled_from([(2, "reasoning_content"), (2, "content"), (4, "tool_calls[0].arguments.input"), (2, "tool_calls[0].arguments")])
    )
    text = field_text(t.messages[index], field)
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    quote = text[start:end]
    if not quote.strip():
        return
    result = ground(t, index, field, quote)
    if result.defect is None:
        assert result.reason == "ambiguous" and text.count(quote) > 1
        return
    check(t, result)
    assert result.method == "exact" and result.defect.quote == quote
    if text.count(quote) == 1:
        assert (result.defect.start, result.defect.end) == (start, end)
    # Re-spaced, the same text grounds to a span with the same words, or is refused.
    respaced = re.sub(r"\s+", lambda m: data.draw(st.sampled_from([" ", "  ", "\n", "\t "])), quote)
    again = ground(t, index, field, respaced)
    if again.defect is not None:
        assert collapse(check(t, again).strip())[0] == collapse(respaced.strip())[0]
    else:
        assert again.reason == "ambiguous"


def test_fuzzy_ambiguity_is_rejected_unless_context_decides() -> None:
    sentence = "Now I will run the whole test suite again."
    t = Trajectory.model_validate(
        {
            "messages": [
                {"role": "user", "content": "Fix it."},
                {"role": "assistant", "generated": True, "content": f"First pass. {sentence}\nSecond pass. {sentence}\nDone."},
            ]
        }
    )
    typo = sentence.replace("whole", "hole")
    assert ground(t, 1, "content", typo).reason == "ambiguous"
    result = ground(t, 1, "content", typo, context_before="Second pass.")
    assert result.method == "fuzzy" and check(t, result) == sentence
    assert result.defect.start == t.messages[1].content.rindex(sentence)
