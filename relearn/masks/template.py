"""Render a trajectory once with the target chat template, and find in the rendered text
what each generated assistant message produced.

A turn's eligible text starts where the template's generation prompt ends (what the
model was given) and runs through the end-of-turn token. Inside it, each field is
located as the template writes it: reasoning and content ``|trim``-ed, tool-call
arguments as XML parameters (``<parameter=KEY>\\nVALUE\\n</parameter>``, string values
raw, others as JSON), which is how Qwen3.5/3.6/3.8 and Nemotron 3 templates render them.
Anything that cannot be located is a ``RenderError``: the trajectory is refused, never
masked by guesswork.

A trajectory whose context was reset (``context_resets``: a Codex compaction, an ATIF
compaction step) is rendered once per context the model had: the leading system/developer
instructions, then the messages from one reset to the next (``context_segments``). A turn
after a reset is thus rendered after exactly what the model saw, never after the history it
no longer had.

All text is NFC-normalised before rendering, as the Qwen tokenizer's normaliser would
do, so that token offsets index the rendered text exactly; defect offsets are carried
through the same normalisation.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from harness.exporters.hf_chat import chat_messages_with_sources
from records.trajectory import Message, Trajectory

PrefixCheck = Literal["every", "header", "off"]
PREFIX_CHECKS: tuple[PrefixCheck, ...] = get_args(PrefixCheck)


class RenderError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Span:
    """Where a field's text lies in the rendered text.

    ``lead`` characters were trimmed from the front of the field and ``kept`` remain,
    so field offset ``i`` (lead <= i < lead + kept) is rendered at ``start + i - lead``.
    """

    start: int
    lead: int
    kept: int


@dataclass
class ArgumentSpans:
    """One tool call's arguments: each key's value span, a map from positions in
    ``json.dumps(arguments, ensure_ascii=False)`` to rendered positions, and ``region``, the
    whole call as rendered: from the template's call opener (``<tool_call>``) through its
    closing tags, up to the next call, or through the end-of-turn token for the turn's last
    call. A defect of ``action`` scope covers the region: the decision to call, not only
    the quoted text."""

    values: dict[str, Span]
    json_to_render: dict[int, int]
    region: tuple[int, int] = (0, 0)


@dataclass
class Turn:
    message_index: int  # in the trajectory
    start: int  # first generated character (after the generation prompt)
    end: int  # end of the end-of-turn token
    fields: dict[str, Span] = field(default_factory=dict)
    calls: list[ArgumentSpans] = field(default_factory=list)


@dataclass
class Rendered:
    text: str
    turns: list[Turn]
    messages: list[Message]  # the NFC-normalised messages the offsets refer to
    end_of_turn: str = ""  # the template's end-of-turn token (each turn's end)
    # The history as the call was sent, where it replaces the template's (``tokens.as_sent``):
    # the recorded prompt ids that ``text`` before the turn decodes from.
    context_ids: list[int] | None = None


def nfc(value: Any) -> Any:
    if isinstance(value, str):
        return value if unicodedata.is_normalized("NFC", value) else unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [nfc(v) for v in value]
    if isinstance(value, dict):
        return {k: nfc(v) for k, v in value.items()}
    return value


def nfc_offset(text: str, offset: int) -> int:
    """Where raw offset ``offset`` lands in NFC(text)."""
    if unicodedata.is_normalized("NFC", text):
        return offset
    return len(unicodedata.normalize("NFC", text[:offset]))


@dataclass(frozen=True)
class TemplateShape:
    """What the template writes around an assistant turn, found by probing it."""

    generation_prompt: str
    end_of_turn: str
    call_opener: str = ""  # what precedes ``<function=NAME>`` in a call (Qwen: ``<tool_call>\n``)

    @property
    def role_header(self) -> str:
        """The generation prompt's first line (``<|im_start|>assistant\n``): every
        assistant turn opens with it, whatever the template does after."""
        head, newline, _rest = self.generation_prompt.partition("\n")
        return head + newline


def probe(tokenizer: Any, template_kwargs: dict[str, Any]) -> TemplateShape:
    query = [{"role": "user", "content": "q"}]
    bare = tokenizer.apply_chat_template(query, tokenize=False, **template_kwargs)
    prompted = tokenizer.apply_chat_template(query, tokenize=False, add_generation_prompt=True, **template_kwargs)
    if not prompted.startswith(bare) or prompted == bare:
        raise RenderError("template", "the generation prompt is not appended to the conversation")
    end = tokenizer.eos_token or "<|im_end|>"
    return TemplateShape(prompted[len(bare) :], end, _probe_call_opener(tokenizer, template_kwargs))


_PROBE_TEXT = "relearn-probe-text"
_PROBE_FUNCTION = "relearn_probe_function"


def _probe_call_opener(tokenizer: Any, template_kwargs: dict[str, Any]) -> str:
    """The wrapper the template writes between a turn's text and ``<function=NAME>``, found by
    rendering one call; "" when the template renders calls some other way (then a call's
    region starts at its function tag)."""
    chat = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": _PROBE_TEXT,
            "tool_calls": [{"type": "function", "function": {"name": _PROBE_FUNCTION, "arguments": {"a": "b"}}}],
        },
    ]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False, **template_kwargs)
    except Exception:  # jinja raises template errors as several types
        return ""
    after_text = text.find(_PROBE_TEXT)
    tag = text.find(f"<function={_PROBE_FUNCTION}>", max(after_text, 0))
    if after_text < 0 or tag < 0:
        return ""
    return text[after_text + len(_PROBE_TEXT) : tag].lstrip()


def _render(tokenizer: Any, chat: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=prompt, **kwargs)
    except Exception as exc:  # jinja raises template errors as several types
        raise RenderError("template", f"{type(exc).__name__}: {exc}") from None


def _find(text: str, needle: str, start: int, end: int, what: str, index: int) -> int:
    position = text.find(needle, start, end)
    if position < 0:
        raise RenderError("locate", f"message {index}: {what} not found in its rendered turn")
    return position


def _field_span(text: str, raw: str | None, cursor: int, end: int, what: str, index: int) -> tuple[Span | None, int]:
    if raw is None:
        return None, cursor
    kept = raw.strip()
    if not kept:
        return None, cursor
    position = _find(text, kept, cursor, end, what, index)
    return Span(position, len(raw) - len(raw.lstrip()), len(kept)), position + len(kept)


def map_json_value(value: Any, json_pos: int, shown_at: int, json_map: dict[int, int]) -> int:
    """Map each character of ``value``'s JSON text (``json.dumps(arguments)`` from ``json_pos``)
    onto the character showing it, from ``shown_at``: a string is shown unquoted and unescaped
    (an escape's several JSON characters all map to the one character), anything else as its
    JSON. Returns the JSON position after the value."""
    if not isinstance(value, str):
        shown = json.dumps(value, ensure_ascii=False)
        _map_run(json_map, json_pos, shown_at, len(shown))
        return json_pos + len(shown)
    json_pos += 1  # opening quote
    done = 0
    # Runs of characters JSON writes as themselves map one to one; each escaped character
    # (wider in JSON) maps all of its JSON characters onto itself.
    for escaped in _JSON_ESCAPED.finditer(value):
        run = escaped.start() - done
        _map_run(json_map, json_pos, shown_at + done, run)
        json_pos += run
        width = len(json.dumps(escaped.group(), ensure_ascii=False)) - 2
        for j in range(width):
            json_map[json_pos + j] = shown_at + escaped.start()
        json_pos += width
        done = escaped.end()
    run = len(value) - done
    _map_run(json_map, json_pos, shown_at + done, run)
    return json_pos + run + 1  # closing quote


def _map_run(json_map: dict[int, int], json_pos: int, shown_at: int, length: int) -> None:
    """``length`` JSON characters from ``json_pos`` shown one for one from ``shown_at``."""
    json_map.update(zip(range(json_pos, json_pos + length), range(shown_at, shown_at + length), strict=True))


# The characters ``json.dumps(..., ensure_ascii=False)`` escapes (its own ESCAPE pattern).
_JSON_ESCAPED = re.compile(r'[\x00-\x1f\\"]')


def _argument_spans(text: str, arguments: dict[str, Any], cursor: int, end: int, index: int) -> tuple[ArgumentSpans, int]:
    values: dict[str, Span] = {}
    json_map: dict[int, int] = {}
    json_pos = 1  # after "{"
    for number, (key, value) in enumerate(arguments.items()):
        if number:
            json_pos += 2  # ", "
        tag = f"<parameter={key}>\n"
        tag_at = _find(text, tag, cursor, end, f"argument {key!r}", index)
        rendered = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        start = tag_at + len(tag)
        if not text.startswith(rendered + "\n</parameter>", start):
            raise RenderError("locate", f"message {index}: argument {key!r} is not rendered verbatim")
        values[key] = Span(start, 0, len(rendered))
        # The key's characters in the JSON text map onto the key inside the tag.
        key_json = json.dumps(key, ensure_ascii=False)
        key_at = tag_at + len("<parameter=")
        if key_json == f'"{key}"':
            for i in range(len(key)):
                json_map[json_pos + 1 + i] = key_at + i
        json_pos = map_json_value(value, json_pos + len(key_json) + 2, start, json_map)  # after ": "
        cursor = start + len(rendered)
    return ArgumentSpans(values, json_map), cursor


def _locate_fields(text: str, turn: Turn, message: Message, shape: TemplateShape) -> None:
    index = turn.message_index
    cursor = turn.start
    reasoning, cursor = _field_span(text, message.reasoning_content, cursor, turn.end, "reasoning", index)
    content, cursor = _field_span(text, message.content, cursor, turn.end, "content", index)
    if reasoning is not None:
        turn.fields["reasoning_content"] = reasoning
    if content is not None:
        turn.fields["content"] = content
    starts = []
    for number, call in enumerate(message.tool_calls or []):
        tag_at = _find(text, f"<function={call.function.name}>", cursor, turn.end, f"tool call {number}", index)
        opener = len(shape.call_opener) if shape.call_opener and text.startswith(shape.call_opener, tag_at - len(shape.call_opener)) else 0
        starts.append(max(tag_at - opener, cursor))
        spans, cursor = _argument_spans(text, call.function.arguments, tag_at, turn.end, index)
        turn.calls.append(spans)
    for number, spans in enumerate(turn.calls):
        spans.region = (starts[number], starts[number + 1] if number + 1 < len(starts) else turn.end)
        _check_region(turn, number, index)


def _check_region(turn: Turn, number: int, index: int) -> None:
    """A call's region holds all of its arguments and none of the turn's text or other calls."""
    lo, hi = turn.calls[number].region
    values = turn.calls[number].values.values()
    inside = all(lo <= v.start and v.start + v.kept <= hi for v in values)
    clear = all(f.start + f.kept <= lo or f.start >= hi for f in turn.fields.values())
    if not (turn.start <= lo < hi <= turn.end and inside and clear):
        raise RenderError("locate", f"message {index}: tool call {number} does not render as one block of its turn")


def _is_nfc(value: Any) -> bool:
    if isinstance(value, str):
        return unicodedata.is_normalized("NFC", value)
    if isinstance(value, list):
        return all(_is_nfc(v) for v in value)
    if isinstance(value, dict):
        return all(_is_nfc(v) for v in value.values())
    return True


def normalised_messages(trajectory: Trajectory) -> list[Message]:
    """The messages with every rendered text NFC-normalised; a message already in NFC (nearly
    all) is the same object, not a copy."""
    out = []
    for message in trajectory.messages:
        calls = message.tool_calls or []
        if _is_nfc(message.content) and _is_nfc(message.reasoning_content) and all(_is_nfc(c.function.arguments) for c in calls):
            out.append(message)
            continue
        data = message.model_dump()
        for key in ("content", "reasoning_content"):
            data[key] = nfc(data[key])
        for call in data.get("tool_calls") or []:
            call["function"]["arguments"] = nfc(call["function"]["arguments"])
        out.append(Message.model_validate(data))
    return out


@dataclass
class TemplateInput:
    """What the chat template is given for one trajectory, with where each part came from."""

    messages: list[Message]  # the trajectory's messages, NFC-normalised (offsets refer to these)
    chat: list[dict[str, Any]]  # the chat messages the template renders
    sources: list[int]  # for each chat message, the index of the trajectory message it came from
    tools: Any


def context_segments(trajectory: Trajectory) -> list[list[int]]:
    """The message indexes of each context the model had, in order: all of them without a
    context reset; with resets, the messages up to the first reset, then for each reset what
    it keeps (by default the leading system/developer instructions, which every call still
    carried) and the messages from it to the next reset."""
    count = len(trajectory.messages)
    resets = {r.message_index: r for r in trajectory.context_resets or [] if 0 < r.message_index < count}
    if not resets:
        return [list(range(count))]
    lead = 0
    while lead < count and trajectory.messages[lead].role in ("system", "developer"):
        lead += 1
    starts = sorted(resets)
    bounds = [0, *starts, count]
    segments = [list(range(bounds[0], bounds[1]))]
    for start, stop in zip(bounds[1:-1], bounds[2:], strict=True):
        keep = resets[start].keep
        kept = sorted(i for i in keep if 0 <= i < start) if keep is not None else list(range(min(lead, start)))
        segments.append(kept + list(range(start, stop)))
    return segments


def template_input(trajectory: Trajectory, indexes: list[int] | None = None) -> TemplateInput:
    """The template input of the messages at ``indexes`` (default: all), with sources given as
    indexes into the whole trajectory."""
    messages = normalised_messages(trajectory)
    chosen = list(range(len(messages))) if indexes is None else indexes
    chat, local = chat_messages_with_sources([messages[i] for i in chosen])
    return TemplateInput(messages, chat, [chosen[s] for s in local], nfc(trajectory.tools) or None)


def render(
    trajectory: Trajectory,
    tokenizer: Any,
    *,
    template_kwargs: dict[str, Any] | None = None,
    prefix_check: str = "header",
    segment: list[int] | None = None,
    shape: TemplateShape | None = None,
) -> Rendered:
    """Render the trajectory (or the messages of one ``segment``, see ``context_segments``)
    once and locate every generated assistant turn.

    ``prefix_check``: ``header`` (default) requires each generated turn to open with the
    template's generation prompt, which catches templates that rewrite past turns
    (dropped reasoning) at no extra cost; ``every`` also renders the conversation up to
    each generated turn and requires it to be an exact prefix of the whole render;
    ``off`` trusts the template. ``shape``: what ``probe`` found for this tokenizer and these
    keyword arguments, when the caller probed once for many trajectories.
    """
    kwargs = dict(template_kwargs or {})
    shape = shape or probe(tokenizer, kwargs)
    conversation = template_input(trajectory, segment)
    messages, chat, sources, tools = conversation.messages, conversation.chat, conversation.sources, conversation.tools
    text = _render(tokenizer, chat, tools, kwargs)
    turns: list[Turn] = []
    cursor = 0
    for chat_index, source in enumerate(sources):
        message = messages[source]
        if chat[chat_index]["role"] != "assistant":
            continue
        # Every assistant turn, generated or not, opens with the role header.
        opening = text.find(shape.role_header, cursor)
        if opening < 0:
            raise RenderError("locate", f"message {source}: no {shape.role_header!r} for this assistant turn")
        if not message.generated:
            end_at = text.find(shape.end_of_turn, opening)
            cursor = opening + len(shape.role_header) if end_at < 0 else end_at + len(shape.end_of_turn)
            continue
        if prefix_check == "every":
            prefix = _render(tokenizer, chat[:chat_index], tools, kwargs, prompt=True)
            if not text.startswith(prefix):
                raise RenderError(
                    "prefix",
                    f"message {source}: the template renders the history before this turn differently from what the model was given",
                )
            start = len(prefix)
        else:
            if prefix_check == "header" and not text.startswith(shape.generation_prompt, opening):
                raise RenderError(
                    "prefix",
                    f"message {source}: its turn does not open with the generation prompt {shape.generation_prompt!r} (the template rewrote it)",
                )
            start = opening + len(shape.generation_prompt)
        end_at = text.find(shape.end_of_turn, start)
        if end_at < 0:
            raise RenderError("locate", f"message {source}: no end-of-turn token {shape.end_of_turn!r}")
        turn = Turn(source, start, end_at + len(shape.end_of_turn))
        _locate_fields(text, turn, message, shape)
        turns.append(turn)
        cursor = turn.end
    return Rendered(text, turns, messages, shape.end_of_turn)


def per_turn_renders(
    trajectory: Trajectory,
    tokenizer: Any,
    *,
    template_kwargs: dict[str, Any] | None = None,
    segment: list[int] | None = None,
    shape: TemplateShape | None = None,
    history_reasoning: bool = True,
) -> list[Rendered]:
    """For templates that rewrite earlier turns: one render per generated assistant turn,
    the conversation up to it (as the model was given it, within its ``segment``) plus that turn.
    Without ``history_reasoning`` the earlier assistant turns are given without their reasoning,
    as harnesses that send only text back gave them."""
    kwargs = dict(template_kwargs or {})
    shape = shape or probe(tokenizer, kwargs)
    conversation = template_input(trajectory, segment)
    messages, chat, sources, tools = conversation.messages, conversation.chat, conversation.sources, conversation.tools
    history = chat if history_reasoning else [_without_reasoning(m) for m in chat]
    out = []
    for chat_index, source in enumerate(sources):
        if chat[chat_index]["role"] != "assistant" or not messages[source].generated:
            continue
        prefix = _render(tokenizer, history[:chat_index], tools, kwargs, prompt=True)
        full = _render(tokenizer, [*history[:chat_index], chat[chat_index]], tools, kwargs)
        if not full.startswith(prefix):
            raise RenderError("prefix", f"message {source}: the turn does not continue its own prompt")
        end_at = full.find(shape.end_of_turn, len(prefix))
        if end_at < 0:
            raise RenderError("locate", f"message {source}: no end-of-turn token")
        text = full[: end_at + len(shape.end_of_turn)]
        turn = Turn(source, len(prefix), len(text))
        _locate_fields(text, turn, messages[source], shape)
        out.append(Rendered(text, [turn], messages, shape.end_of_turn))
    return out


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] != "assistant" or "reasoning_content" not in message:
        return message
    return {key: value for key, value in message.items() if key != "reasoning_content"}
