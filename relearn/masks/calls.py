"""Find each tool call of a rendered assistant turn, whatever syntax the chat template writes
calls in (JSON in ``<tool_call>`` tags, XML parameters, DeepSeek's call markers, harmony
recipients, LFM2's Python-like calls...), without one parser per family.

A call's region is found by rendering the turn alone (after a one-line user query, so that
no history changes it) with its first ``k`` calls for every ``k`` and diffing consecutive
renders: call ``k`` starts where the render with ``k + 1`` calls departs from the one with
``k``, and runs to where call ``k + 1`` starts (the turn's last call, through the end of the
turn). Whatever the template writes around the calls (an opening tag, a block that holds all
of them, a recipient header) thus falls inside the first call's region, as the decision to
call. The turn rendered alone must agree with the turn in the whole render up to the last
call, else the call cannot be placed and the trajectory is refused.

Inside a region each argument is found in order, its key first, then its value as the
template serialises it: raw text, JSON (a whole ``arguments`` object as ``json.dumps`` writes
it, or one value), or a Python literal. Every character of the value gets the rendered
position that shows it, so a defect's offsets into the value or into the arguments' JSON map
onto rendered characters even where the template escapes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_QUERY = {"role": "user", "content": "q"}


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: renders share long prefixes.
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def call_starts(render: Callable[[list[dict[str, Any]], bool], str], message: dict[str, Any]) -> tuple[str, list[int]] | None:
    """The turn of ``message`` rendered after a bare query, and where each of its calls starts
    in that turn's text; None when the template renders the turn in some way this cannot diff
    (the turn does not continue its generation prompt, or adding a call changes nothing)."""
    calls = message.get("tool_calls") or []
    prompt = render([_QUERY], True)
    renders = []
    for count in range(len(calls) + 1):
        variant = dict(message)
        if count:
            variant["tool_calls"] = calls[:count]
        else:
            variant.pop("tool_calls", None)
        renders.append(render([_QUERY, variant], False))
    # The turn starts after the generation prompt, or after what of it the turn keeps (a
    # prompt ending ``<think>\n`` before a turn written without it).
    at = min(_tag_start(prompt, common_prefix(prompt, full)) for full in renders)
    if at < len(render([_QUERY], False)):
        return None
    turns = [full[at:] for full in renders]
    starts = [_tag_start(turns[k], common_prefix(turns[k], turns[k + 1])) for k in range(len(calls))]
    if any(s >= len(turns[k + 1]) for k, s in enumerate(starts)) or starts != sorted(starts):
        return None
    return turns[-1], starts


def align(alone: str, offsets: list[int], turn: str) -> list[int | None] | None:
    """Where each call of ``alone`` (the turn rendered alone, its calls starting at ``offsets``)
    starts in ``turn`` (the same turn in its conversation, through its end-of-turn marker),
    relative to the turn's start. The two agree from the start (nothing before the calls
    differs), or over a common ending that holds every call but the first: the template
    writes what precedes the calls otherwise in a conversation (Qwen3 gives the last turn an
    empty think block; DeepSeek-V3 opens only a conversation's first calling turn with
    ``<｜Assistant｜><｜tool▁calls▁begin｜>``). The first call then starts where the turn's text
    before the calls ends (None here: the caller knows where that is). None when neither holds."""
    if common_prefix(alone, turn) > offsets[-1]:
        return list(offsets)
    # ``alone`` may run past the end-of-turn marker (the newline after ``<|im_end|>``).
    shared, length = max(
        (common_suffix(alone[: len(alone) - cut], turn), len(alone) - cut) for cut in range(min(_TAIL_REACH, len(alone)) + 1)
    )
    first = length - shared  # where the common ending starts in ``alone``
    if shared == 0 or any(s < first for s in offsets[1:]):
        return None
    into = len(turn) - shared - first
    return [None if s < first else s + into for s in offsets]


def common_suffix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[len(a) - i - step : len(a) - i] == b[len(b) - i - step : len(b) - i]:
        i += step
    while i < n and a[len(a) - 1 - i] == b[len(b) - 1 - i]:
        i += 1
    return i


_TAIL_REACH = 16


def _tag_start(text: str, at: int) -> int:
    """Where the two renders part, moved back to the start of a marker they share only the
    opening of (``<|im_end|>`` against ``<tool_call>`` share ``<``): an unclosed ``<`` shortly
    before, so that a call's region starts at its opening tag, not inside it."""
    opened = text.rfind("<", max(0, at - _TAG_REACH), at)
    return opened if opened >= 0 and ">" not in text[opened:at] else at


_TAG_REACH = 32


def json_widths(value: str) -> list[int]:
    """How many characters of ``json.dumps(value, ensure_ascii=False)`` (between its quotes)
    each character of ``value`` takes."""
    return [len(json.dumps(c, ensure_ascii=False)) - 2 for c in value]


def _repr_widths(value: str) -> list[int] | None:
    shown = repr(value)
    quote = shown[0]
    widths = [2 if c in (quote, "\\") else len(repr(c)) - 2 for c in value]
    return widths if sum(widths) == len(shown) - 2 else None


def _positions(at: int, widths: list[int]) -> list[int]:
    out = []
    for width in widths:
        out.append(at)
        at += width
    return out


def value_forms(value: Any) -> list[tuple[str, list[int] | None]]:
    """The ways a template may write an argument value, each with the rendered offset of every
    character of the value relative to the form's start (None: one for one). For a string:
    raw, JSON-escaped (between quotes), a Python literal; for anything else its JSON (the
    defect offsets index ``json.dumps(value)``), then its Python literal as a whole."""
    if not isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        forms: list[tuple[str, list[int] | None]] = [(text, None)]
        if repr(value) != text:
            forms.append((repr(value), [0] * len(text)))
        return forms
    forms = [(value, None)]
    escaped = json.dumps(value, ensure_ascii=False)
    if escaped[1:-1] != value:
        forms.append((escaped, [p + 1 for p in _positions(0, json_widths(value))]))
    widths = _repr_widths(value)
    if widths is not None and repr(value)[1:-1] != value:
        forms.append((repr(value), [p + 1 for p in _positions(0, widths)]))
    return forms


def find_value(text: str, value: Any, start: int, end: int) -> tuple[int, int, list[int]] | None:
    """The earliest form of ``value`` in ``text[start:end]``: (where the form starts, where it
    ends, the rendered position of each character of the value)."""
    best: tuple[int, int, list[int]] | None = None
    for form, offsets in value_forms(value):
        at = text.find(form, start, end)
        if at < 0 or (best is not None and at >= best[0]):
            continue
        count = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
        positions = list(range(at, at + count)) if offsets is None else [at + o for o in offsets]
        best = (at, at + len(form), positions)
    return best


def json_map_of(arguments: dict[str, Any], keys: dict[str, int], values: dict[str, list[int]]) -> dict[int, int]:
    """Map each character of ``json.dumps(arguments)`` to the rendered character showing it:
    a key's characters onto the key (``keys``: where each key is rendered), a value's onto the
    character of the value each JSON character writes (``values``: per character, as
    ``find_value`` gives); quotes, colons and commas map nowhere."""
    out: dict[int, int] = {}
    pos = 1  # after "{"
    for number, (key, value) in enumerate(arguments.items()):
        if number:
            pos += 2  # ", "
        key_json = json.dumps(key, ensure_ascii=False)
        if key in keys and key_json == f'"{key}"':
            out.update(zip(range(pos + 1, pos + 1 + len(key)), range(keys[key], keys[key] + len(key)), strict=True))
        pos += len(key_json) + 2  # ": "
        shown = values[key]
        if isinstance(value, str):
            pos += 1
            for char_at, width in zip(shown, json_widths(value), strict=True):
                for j in range(width):
                    out[pos + j] = char_at
                pos += width
            pos += 1
        else:
            out.update(zip(range(pos, pos + len(shown)), shown, strict=True))
            pos += len(shown)
    return out
