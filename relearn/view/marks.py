"""How a message is shown with its defects marked, shared by the viewer and ``relearn view --print``.

Three kinds of text are told apart at a glance, with and without colour:
supervised text (generated assistant text of a trajectory that enters the dataset:
green), context-only text (system, user and tool messages, text the policy did not
generate: dim) and excluded defect spans (struck through, red; bold where two defects
overlap), each followed by a label ``{#n category}`` and listed under its message with
the judge's description. With ``markers`` (plain text for pipes) excluded runs are
also written between ``[-`` and ``-]``, as ``git diff --word-diff=plain`` does.

What is struck is what ``relearn masks`` excludes under the defect scope in force
(``scoped_range``, from ``relearn.masks.scopes.defect_extent``): under ``action`` a defect in
a tool call strikes the whole call (its name line and every argument) and one in a
text-protocol agent's action its whole fenced block; under ``minimal`` exactly the
characters ``[start, end)`` of its field, where the field is shown as the chat template
renders it: reasoning, text, and each tool-call argument as ``key: value`` (string values
raw, others as JSON). A span over ``tool_calls[i].arguments`` (offsets into the arguments'
JSON text) is mapped through that layout and covers the shown characters from its first to
its last. ``colour_legend`` names the colours in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text

from records.review import FIELD, Defect, field_text
from records.trajectory import Message, Trajectory
from relearn.masks.scopes import defect_extent
from relearn.masks.template import map_json_value

STYLES: dict[str, Style] = {
    "supervised": Style(color="green"),
    "eligible": Style(),  # generated, but the trajectory does not enter the dataset
    "context": Style(dim=True),
    "excluded": Style(color="red", strike=True),
    "kept": Style(color="green", bold=True, underline=True),  # a keep interval (single-turn review)
    "outside_keep": Style(dim=True),  # single-turn response text outside every keep interval
    "overlap": Style(color="bright_red", strike=True, bold=True),
    "label": Style(color="red", bold=True, reverse=True),
    "name": Style(color="cyan", bold=True),
    "hidden": Style(color="yellow", italic=True),
    "warning": Style(color="yellow", bold=True),
    "good": Style(color="green", bold=True),
    "bad": Style(color="red", bold=True),
    "title": Style(bold=True),
}


@dataclass
class RenderOptions:
    markers: bool = False  # write [- -] around excluded runs (plain text output)
    expand: bool = False  # show long context messages whole
    max_lines: int = 24
    head_lines: int = 10
    tail_lines: int = 6
    max_chars: int = 4000
    hint: str = "o: show all"  # how to see what is hidden


@dataclass
class Numbered:
    number: int
    defect: Defect
    problem: str | None = None  # why it cannot be shown at its offsets


def check_defect(trajectory: Trajectory, defect: Defect) -> str | None:
    if not 0 <= defect.message_index < len(trajectory.messages):
        return f"message {defect.message_index} is outside the trajectory"
    text = field_text(trajectory.messages[defect.message_index], defect.field)
    if text is None or defect.end > len(text):
        return f"{defect.field} [{defect.start}, {defect.end}) is outside its field"
    if text[defect.start : defect.end] != defect.quote:
        return f"quote not at its offsets: the field has {text[defect.start : defect.end]!r}"
    return None


class LaidOut:
    """Text of one message being laid out, with where each field's characters went."""

    def __init__(self) -> None:
        self.text = Text()
        self.fields: dict[str, int] = {}  # content, reasoning_content, tool_calls[i].arguments.KEY -> start
        self.field_ends: dict[str, int] = {}
        self.json_maps: dict[int, dict[int, int]] = {}  # call -> position in the JSON text -> position here
        self.calls: dict[int, tuple[int, int]] = {}  # call -> its lines here, name through last argument

    def add(self, value: str, style: str, *, field_name: str | None = None) -> int:
        start = len(self.text)
        if field_name is not None:
            self.fields[field_name] = start
            self.field_ends[field_name] = start + len(value)
        self.text.append(value, STYLES[style])
        return start


def collapse(text: str, options: RenderOptions, style: str) -> Text:
    lines = text.split("\n")
    out = Text()
    if options.expand:
        out.append(text, STYLES[style])
    elif len(lines) > options.max_lines:
        hidden = len(lines) - options.head_lines - options.tail_lines
        out.append("\n".join(lines[: options.head_lines]) + "\n", STYLES[style])
        out.append(f"··· {hidden} lines hidden ({options.hint}) ···", STYLES["hidden"])
        out.append("\n" + "\n".join(lines[-options.tail_lines :]), STYLES[style])
    elif len(text) > options.max_chars:
        head, tail = options.max_chars * 3 // 4, options.max_chars // 4
        out.append(text[:head], STYLES[style])
        out.append(f" ··· {len(text) - head - tail} characters hidden ({options.hint}) ··· ", STYLES["hidden"])
        out.append(text[-tail:], STYLES[style])
    else:
        out.append(text, STYLES[style])
    return out


def layout_assistant(message: Message, base: str) -> LaidOut:
    doc = LaidOut()
    if message.reasoning_content is not None:
        doc.add("▸ reasoning\n", "name")
        doc.add(message.reasoning_content, base, field_name="reasoning_content")
        doc.add("\n", base)
    if message.content is not None:
        doc.add("▸ text\n", "name")
        doc.add(message.content, base, field_name="content")
        doc.add("\n", base)
    for number, call in enumerate(message.tool_calls or []):
        call_at = doc.add(f"▸ call {call.function.name}", "name")
        doc.add(f"  {call.id}\n", "context")
        json_map: dict[int, int] = {}
        json_pos = 1  # after "{"
        for order, (key, value) in enumerate(call.function.arguments.items()):
            if order:
                json_pos += 2  # ", "
            key_json = json.dumps(key, ensure_ascii=False)
            key_at = doc.add(key, base)
            if key_json == f'"{key}"':  # the key's characters in the JSON text are the key shown
                for i in range(len(key)):
                    json_map[json_pos + 1 + i] = key_at + i
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            doc.add(":\n" if "\n" in shown else ": ", base)
            value_at = doc.add(shown, base, field_name=f"tool_calls[{number}].arguments.{key}")
            json_pos = map_json_value(value, json_pos + len(key_json) + 2, value_at, json_map)  # after ": "
            doc.add("\n", base)
        if call.raw_arguments is not None and not call.function.arguments:
            doc.add("raw arguments: ", "context")
            doc.add(call.raw_arguments + "\n", "context")
        doc.json_maps[number] = json_map
        doc.calls[number] = (call_at, len(doc.text) - 1)  # the final newline stays unstruck
    return doc


def defect_range(doc: LaidOut, defect: Defect) -> tuple[int, int] | None:
    match = FIELD.match(defect.field)
    assert match is not None
    if match.group(2) is not None and match.group(3) is None:
        json_map = doc.json_maps.get(int(match.group(2)), {})
        positions = [json_map[j] for j in range(defect.start, defect.end) if j in json_map]
        return (min(positions), max(positions) + 1) if positions else None
    start = doc.fields.get(defect.field)
    if start is None or defect.end <= defect.start:
        return None
    return start + defect.start, start + defect.end


def scoped_range(doc: LaidOut, trajectory: Trajectory, defect: Defect, scope: str) -> tuple[int, int] | None:
    """The characters shown that ``relearn masks --defect-scope SCOPE`` excludes for the defect:
    under ``action`` a defect in a tool call strikes the whole call (its name and every
    argument) and one in a text-protocol agent's action its whole fenced block
    (``relearn.masks.scopes.defect_extent``); under ``minimal`` the quote."""
    extent = defect_extent(trajectory, defect, scope)
    if extent.call is not None and extent.call in doc.calls:
        return doc.calls[extent.call]
    if (extent.start, extent.end) == (defect.start, defect.end):
        return defect_range(doc, defect)
    start = doc.fields.get(extent.field)
    return (start + extent.start, start + extent.end) if start is not None and extent.end > extent.start else None


def excluded_share(doc: LaidOut, spans: list[tuple[int, int]]) -> str:
    """``wholly`` when the spans cover every generated character shown (reasoning, text and
    calls; whitespace aside), ``partly`` when they cover some, "" when none."""
    if not spans:
        return ""
    covered = [False] * len(doc.text)
    for lo, hi in spans:
        covered[lo:hi] = [True] * (hi - lo)
    plain = doc.text.plain
    generated = [(at, doc.field_ends[name]) for name, at in doc.fields.items() if not name.startswith("tool_calls[")]
    generated += list(doc.calls.values())
    left = any(not covered[i] and not plain[i].isspace() for lo, hi in generated for i in range(lo, hi))
    return "partly" if left else "wholly"


def mark_defects(doc: LaidOut, numbered: list[tuple[Numbered, tuple[int, int]]], options: RenderOptions) -> Text:
    """Strike the given characters of each defect (``scoped_range``) and label each run of
    excluded text."""
    text = doc.text
    cover = [0] * len(text)
    owners: dict[int, list[Numbered]] = {}
    for item, span in numbered:
        for i in range(*span):
            cover[i] += 1
        owners.setdefault(span[0], []).append(item)
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(cover):
        if cover[i]:
            j = i
            while j < len(cover) and cover[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    for start, end in runs:
        i = start
        while i < end:
            j = i
            while j < end and (cover[j] > 1) == (cover[i] > 1):
                j += 1
            text.stylize(STYLES["overlap" if cover[i] > 1 else "excluded"], i, j)
            i = j
    if not runs:
        return text
    out = Text()
    cursor = 0
    for start, end in runs:
        out.append_text(text[cursor:start])
        if options.markers:
            out.append("[-")
        out.append_text(text[start:end])
        if options.markers:
            out.append("-]")
        inside = sorted((item for s, items in owners.items() if start <= s < end for item in items), key=lambda x: x.number)
        out.append("{" + ", ".join(f"#{item.number} {item.defect.category}" for item in inside) + "}", STYLES["label"])
        cursor = end
    out.append_text(text[cursor:])
    return out


def colour_legend(markers: bool = False) -> Text:
    """One line naming the colours (and, in plain text, the markers) the viewer draws with."""
    out = Text("colours: ", STYLES["context"])
    for words, style in (
        ("supervised", "supervised"), ("context only (not generated)", "context"), ("generated, trajectory not selected", "eligible"),
    ):  # fmt: skip
        out.append(words, STYLES[style])
        out.append(" · ", STYLES["context"])
    out.append("excluded" + (" [-…-]" if markers else ""), STYLES["excluded"])
    out.append(" · ", STYLES["context"])
    out.append("excluded by two defects", STYLES["overlap"])
    out.append(" · ", STYLES["context"])
    out.append("{#n category}", STYLES["label"])
    out.append(" defect label · ", STYLES["context"])
    out.append("kept" + (" [+…+]" if markers else ""), STYLES["kept"])
    out.append(" keep interval", STYLES["context"])
    return out


def legend(numbered: list[Numbered]) -> Text:
    out = Text()
    for item in numbered:
        d = item.defect
        out.append(f"#{item.number} {d.category}", STYLES["label"])
        out.append(f" {d.field} [{d.start}, {d.end})", STYLES["context"])
        if d.description:
            out.append(f" {d.description}")
        if item.problem:
            out.append(f"  ⚠ not shown: {item.problem}", STYLES["warning"])
        out.append("\n")
    out.rstrip()
    return out


# ---- single-turn reviews: keep intervals ----------------------------------------------


def keep_intervals(review: object) -> list[Defect]:
    """The grounded keep intervals of a single-turn review (``review.keep``), or []."""
    extra = getattr(review, "model_extra", None) or {}
    kept = [Defect.model_validate({**k, "category": "keep"}) for k in extra.get("keep") or []]
    return sorted(kept, key=lambda k: (k.message_index, k.field != "reasoning_content", k.start))  # in the order shown


def mark_keep(doc: LaidOut, message: Message, keep: list[Defect], options: RenderOptions) -> Text:
    """A single-turn response as its keep review sees it: the kept intervals (K) in bold
    green, each labelled ``{K#n}``, the rest of its reasoning and answer dim (not trained
    on, but no defect of its own to strike). With ``markers`` kept runs are written between
    ``[+`` and ``+]``."""
    text = doc.text
    for name in ("reasoning_content", "content"):
        start = doc.fields.get(name)
        if start is not None:
            text.stylize(STYLES["outside_keep"], start, start + len(field_text(message, name) or ""))
    spans = sorted((span, number) for number, k in enumerate(keep, start=1) if (span := defect_range(doc, k)) is not None)
    out = Text()
    cursor = 0
    for (start, end), number in spans:
        text.stylize(STYLES["kept"], start, end)
        out.append_text(text[cursor:start])
        if options.markers:
            out.append("[+")
        out.append_text(text[start:end])
        if options.markers:
            out.append("+]")
        out.append(f"{{K#{number}}}", STYLES["good"])
        cursor = end
    out.append_text(text[cursor:])
    return out


def keep_legend(review: object, keep: list[Defect]) -> Text:
    """The keep intervals with their offsets, then the auditor's verdict on the kept text."""
    out = Text()
    for number, k in enumerate(keep, start=1):
        out.append(f"K#{number}", STYLES["good"])
        out.append(f" {k.field} [{k.start}, {k.end})\n", STYLES["context"])
    extra = getattr(review, "model_extra", None) or {}
    audit = extra.get("audit")
    if isinstance(audit, dict):
        passed = audit.get("verdict") == "pass"
        out.append("audit ", STYLES["context"])
        out.append(str(audit.get("verdict")), STYLES["good" if passed else "bad"])
        flags = [f"{name}: {'yes' if audit.get(name) else 'no'}" for name in ("self_contained", "correct")]
        out.append(f" ({', '.join(flags)})")
        if audit.get("reason"):
            out.append(f" {audit['reason']}")
    out.rstrip()
    return out
