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
import re
from collections.abc import Callable
from itertools import accumulate
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


def learn_heads(render: Callable[[list[dict[str, Any]], bool], str]) -> tuple[str, str] | None:
    """What the template writes from a call's start to its function's name, for a turn's first
    call and for a later one (``<tool_call>\n<function=``, ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>``),
    learned once from a probe turn with text and two calls by the diff of ``call_starts``. A turn
    whose calls are found by these heads needs no renders of its own (``starts_by_heads``).
    None when the probe cannot be diffed or a head is empty."""
    probe = {
        "role": "assistant",
        "content": "Pr0beText",
        "tool_calls": [_probe_call(0, _HEAD_NAMES[0]), _probe_call(1, _HEAD_NAMES[1])],
    }
    found = call_starts(render, probe)
    if found is None:
        return None
    alone, starts = found
    heads = []
    for start, name in zip(starts, _HEAD_NAMES, strict=True):
        at = alone.find(name, start)
        head = alone[start:at].lstrip() if at >= 0 else ""
        if not head:
            return None
        heads.append(head)
    return heads[0], heads[1]


_HEAD_NAMES = ("pr0be_first", "pr0be_second")


def _probe_call(number: int, name: str) -> dict[str, Any]:
    return {"id": f"call_{number}", "type": "function", "function": {"name": name, "arguments": {"a": "Pr0beValue"}}}


def starts_by_heads(text: str, heads: tuple[str, str], names: list[str], start: int, end: int) -> list[int] | None:
    """Where each call starts in ``text[start:end]`` (a turn from the end of its text): its
    head and name found in order, each after the last. None when one is missing: the turn is
    then located by rendering it (``call_starts``). A head inside an earlier call's argument
    value is found there, but that call's value then straddles the next region and cannot be
    located in its own, so the caller's region check refuses it and falls back too."""
    found = []
    at = start
    for number, name in enumerate(names):
        mark = heads[0 if number == 0 else 1] + name
        at = text.find(mark, at, end)
        if at < 0:
            return None
        found.append(at)
        at += len(mark)
    return found


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
    widths = [1] * len(value)
    for escaped in _JSON_ESCAPED.finditer(value):
        widths[escaped.start()] = len(json.dumps(escaped.group(), ensure_ascii=False)) - 2
    return widths


# The characters ``json.dumps(..., ensure_ascii=False)`` escapes (its own ESCAPE pattern).
_JSON_ESCAPED = re.compile(r'[\x00-\x1f\\"]')


def _repr_widths(value: str) -> list[int] | None:
    shown = repr(value)
    quote = shown[0]
    widths = [2 if c in (quote, "\\") else len(repr(c)) - 2 for c in value]
    return widths if sum(widths) == len(shown) - 2 else None


def _positions(at: int, widths: list[int]) -> list[int]:
    """Where each character starts when each takes its width, the first at ``at``."""
    return list(accumulate(widths[:-1], initial=at)) if widths else []


# A form of a value as a template writes it, and how to get each character's offset in it
# (None: one for one). The offsets are computed only for the form that is found first.
Form = tuple[str, Callable[[], list[int]] | None]


def value_forms(value: Any) -> list[Form]:
    """The ways a template may write an argument value. For a string: raw, JSON-escaped
    (between quotes), a Python literal; for anything else its JSON (the defect offsets index
    ``json.dumps(value)``), then its Python literal as a whole."""
    if not isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        forms: list[Form] = [(text, None)]
        if repr(value) != text:
            forms.append((repr(value), lambda: [0] * len(text)))
        return forms
    forms = [(value, None)]
    escaped = json.dumps(value, ensure_ascii=False)
    if escaped[1:-1] != value:
        forms.append((escaped, lambda: _positions(1, json_widths(value))))
    shown = repr(value)
    if shown[1:-1] != value:
        widths = _repr_widths(value)
        if widths is not None:
            forms.append((shown, lambda: _positions(1, widths)))
    return forms


def find_value(text: str, value: Any, start: int, end: int) -> tuple[int, int, list[int]] | None:
    """The earliest form of ``value`` in ``text[start:end]``: (where the form starts, where it
    ends, the rendered position of each character of the value). A list or an object written
    in none of the whole forms is found by its leaves (``find_by_leaves``)."""
    best: tuple[int, str, Callable[[], list[int]] | None] | None = None
    for form, offsets in value_forms(value):
        at = text.find(form, start, end)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, form, offsets)
    if best is None:
        return find_by_leaves(text, value, start, end) if isinstance(value, (list, dict)) and value else None
    at, form, offsets = best
    count = len(value) if isinstance(value, str) else len(form)
    positions = list(range(at, at + count)) if offsets is None else [at + o for o in offsets()]
    return at, at + len(form), positions


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
            pos = _map_string(out, value, shown, pos + 1) + 1
        else:
            out.update(zip(range(pos, pos + len(shown)), shown, strict=True))
            pos += len(shown)
    return out


def _map_string(out: dict[int, int], value: str, shown: list[int], pos: int) -> int:
    """Map the JSON characters of ``value`` (between its quotes, from ``pos``) onto ``shown``,
    each character's rendered position: runs JSON writes as themselves one for one, each
    escape's several characters all onto its one character. Returns the position after."""
    done = 0
    for escaped in _JSON_ESCAPED.finditer(value):
        run = escaped.start() - done
        out.update(zip(range(pos, pos + run), shown[done : escaped.start()], strict=True))
        pos += run
        width = len(json.dumps(escaped.group(), ensure_ascii=False)) - 2
        for j in range(width):
            out[pos + j] = shown[escaped.start()]
        pos += width
        done = escaped.end()
    run = len(value) - done
    out.update(zip(range(pos, pos + run), shown[done:], strict=True))
    return pos + run


def _leaves(value: Any, at: int, sort_keys: bool) -> list[tuple[int, str, Any]]:
    """The leaves of ``value`` as ``json.dumps(value, ensure_ascii=False)`` writes them from
    ``at``: (where the leaf's JSON starts, its JSON, the leaf: an object's key or a scalar),
    listed in the order a template writes them: the value's own, or with every object's keys
    sorted (Jinja's ``dictsort``)."""
    out: list[tuple[int, str, Any]] = []

    def walk(item: Any, pos: int) -> int:
        if isinstance(item, list):
            pos += 1
            for number, element in enumerate(item):
                pos = walk(element, pos + (2 if number else 0))
            return pos + 1
        if isinstance(item, dict):
            pos += 1
            entries = []
            for number, (key, element) in enumerate(item.items()):
                pos += 2 if number else 0
                key_json = json.dumps(key, ensure_ascii=False)
                entry = [(pos, key_json, key)]
                start = len(out)
                pos = walk(element, pos + len(key_json) + 2)
                entry += out[start:]
                del out[start:]
                entries.append((key, entry))
            for _key, entry in sorted(entries, key=lambda e: e[0]) if sort_keys else entries:
                out.extend(entry)
            return pos + 1
        shown = json.dumps(item, ensure_ascii=False)
        out.append((pos, shown, item))
        return pos + len(shown)

    walk(value, at)
    return out


def find_by_leaves(text: str, value: Any, start: int, end: int) -> tuple[int, int, list[int]] | None:
    """A list or object a template writes in a syntax of its own (Gemma's ``[<|"|>a<|"|>,1]``,
    its objects' keys bare and sorted): each leaf found in order after the last, a string as
    itself, anything else as its JSON, in the value's key order or else with keys sorted.
    Each JSON character of a leaf maps onto the character showing it (an escape's several
    onto its one); the brackets, quotes, commas and colons between leaves, which such a
    syntax writes otherwise, onto the last leaf character before them (the first leaf's
    for those that open the value). The value runs from its first leaf to the end of its last."""
    width = len(json.dumps(value, ensure_ascii=False))
    for sort_keys in (False, True):
        shown: list[int | None] = [None] * width
        at = start
        found = True
        for pos, leaf_json, leaf in _leaves(value, 0, sort_keys):
            raw = leaf if isinstance(leaf, str) else leaf_json
            hit = text.find(raw, at, end)
            if hit < 0 or (not raw and hit != at):
                found = False
                break
            if isinstance(leaf, str):
                row = pos + 1
                for char_at, char_width in zip(range(hit, hit + len(leaf)), json_widths(leaf), strict=True):
                    shown[row : row + char_width] = [char_at] * char_width
                    row += char_width
            else:
                shown[pos : pos + len(raw)] = range(hit, hit + len(raw))
            at = hit + len(raw)
        if not found:
            continue
        first = min((p for p in shown if p is not None), default=start)
        last = first
        positions = []
        for p in shown:
            last = last if p is None else p
            positions.append(last)
        return first, at, positions
    return None
