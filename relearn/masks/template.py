"""Render a trajectory once with the target chat template, and find in the rendered text
what each generated assistant message produced.

A turn's eligible text starts where the template's generation prompt ends (what the
model was given) and runs through the end-of-turn token. Inside it, each field is
located as the template writes it: reasoning and content ``|trim``-ed, each tool call's
region by rendering the turn alone call by call and diffing (``relearn.masks.calls``), its
arguments inside it as the template serialises them (raw, JSON or a Python literal), so no
one family's call syntax is assumed.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from harness.exporters.hf_chat import chat_messages_with_sources
from records.trajectory import Message, Trajectory
from relearn.masks import adapt, calls

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
    # Values the template escapes (JSON, a Python literal): the rendered position of each of
    # the value's characters (``field_text``'s), instead of a ``Span``.
    escaped: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Turn:
    message_index: int  # in the trajectory
    start: int  # first generated character (after the generation prompt)
    end: int  # end of the end-of-turn token
    fields: dict[str, Span] = field(default_factory=dict)
    calls: list[ArgumentSpans] = field(default_factory=list)
    # Fields the template does not render in this turn at all (DeepSeek-V3 never renders
    # reasoning; gpt-oss drops a calling turn's text once a final answer follows): not trained,
    # and a defect in one cannot be placed.
    left_out: list[str] = field(default_factory=list)


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
    # Every marker that ends a generated turn (the model's stop tokens); ``end_of_turn`` first.
    stops: tuple[str, ...] = ()
    # The part of the generation prompt that the template also writes at the head of a past
    # turn; shorter than the prompt when the prompt opens the reasoning (DeepSeek-V3 and
    # Nemotron end it with ``<think>\n``) and past turns are written otherwise.
    opener: str = ""
    # What a generation prompt may hold that the rendered turn after it does not (seen by
    # probing): the prompt's own ``<think>\n``, DeepSeek-V3's ``<｜tool▁outputs▁end｜>``.
    prompt_tails: tuple[str, ...] = ()
    # What the template writes before a turn's first call's name and before a later one's
    # (``calls.learn_heads``); None when they could not be learned.
    call_heads: tuple[str, str] | None = None
    # The template refuses a calling turn with both text and reasoning and writes them merged
    # into one reasoning text (gpt-oss): ``adapt.adapt_chat`` gives it turns in that shape.
    merge_calling_text: bool = False
    # The generation prompt with ``enable_thinking=True`` where it differs from ``generation_prompt``
    # (Qwen3.5 NoThink prompts with an empty think block, ``<think>\n\n</think>\n\n``, and with
    # thinking on with ``<think>\n``): the prompt a turn that holds reasoning was generated after.
    thinking_prompt: str | None = None
    # The template writes a calling message's text after the call's response, and before the
    # call when given the text and the calls as two messages (DiffusionGemma):
    # ``adapt.adapt_chat`` splits such turns, and a turn is then the run of chat messages of
    # one trajectory message.
    split_calling_text: bool = False

    @property
    def role_header(self) -> str:
        """The generation prompt's first line (``<|im_start|>assistant\n``): every
        assistant turn opens with it, whatever the template does after."""
        head, newline, _rest = self.generation_prompt.partition("\n")
        return head + newline

    @property
    def keeps_prompt(self) -> bool:
        """Whether past turns open with the whole generation prompt (Qwen, GLM, gpt-oss): each
        turn is then found by its header in one render; else by rendering its prompt."""
        return not self.opener or self.opener == self.generation_prompt

    def turn_end(self, text: str, start: int) -> tuple[int, int] | None:
        """The first stop marker at or after ``start``: (where it starts, where it ends)."""
        found = [(at, at + len(stop)) for stop in self.stops or (self.end_of_turn,) if (at := text.find(stop, start)) >= 0]
        return min(found) if found else None


# The one registry of per-family knowledge turn location needs: templates that end an
# assistant turn with the role the model hands over to, not with the tokenizer's EOS, keyed by
# a marker only that family's templates write. GLM-4.5/4.6 (glm4moe): the model stops by
# writing ``<|observation|>`` (a tool is to run) or ``<|user|>``.
HANDOVER_STOPS: dict[str, tuple[str, ...]] = {"<|observation|>": ("<|observation|>", "<|user|>")}

# Probe texts no template writes by itself.
_PROBE_CONTENT = "Pr0beC0ntent"
_PROBE_VALUE = "Pr0beValue"
_PROBE_CALL = {"id": "call_0", "type": "function", "function": {"name": "probe_tool", "arguments": {"a": _PROBE_VALUE}}}
# A marker ``<...>`` right after a turn's text (its stop), or ending the turn.
_MARKER_AFTER = re.compile(r"\s*(<[^<>\s]{1,48}>)")
_MARKER_LAST = re.compile(r"(<[^<>\s]{1,48}>)\s*$")


def probe(tokenizer: Any, template_kwargs: dict[str, Any]) -> TemplateShape:
    """The generation prompt, the stop markers and how past turns open, from renders of tiny
    conversations: a turn with text, with reasoning, with a call; after a query, after a tool."""
    query = [{"role": "user", "content": "q"}]
    bare = tokenizer.apply_chat_template(query, tokenize=False, **template_kwargs)
    prompted = tokenizer.apply_chat_template(query, tokenize=False, add_generation_prompt=True, **template_kwargs)
    if not prompted.startswith(bare) or prompted == bare:
        raise RenderError("template", "the generation prompt is not appended to the conversation")
    prompt = prompted[len(bare) :]
    end = tokenizer.eos_token or "<|im_end|>"
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    try:
        found = _probe_turns(tokenizer, template_kwargs, query, prompted)
    except (RenderError, ValueError):  # a template that cannot render the probes: as before
        found = None
    opener, tails, stops = found or (prompt, (prompt,), (end,))
    for marker, handover in HANDOVER_STOPS.items():
        if marker in template:
            stops = handover
    try:
        heads = calls.learn_heads(_turn_render(tokenizer, None, template_kwargs))
    except RenderError:
        heads = None
    turn_render = _turn_render(tokenizer, None, template_kwargs)
    merge = adapt.refuses_calling_text(turn_render)
    thinking = _thinking_prompt(tokenizer, template_kwargs, query, prompt)
    return TemplateShape(prompt, stops[0], stops, opener, tails, heads, merge, thinking, adapt.writes_calling_text_after_calls(turn_render))


def _thinking_prompt(tokenizer: Any, kwargs: dict[str, Any], query: list[dict[str, Any]], prompt: str) -> str | None:
    """The generation prompt the template writes with thinking switched on, where the caller did
    not set the switch and it differs from ``prompt``; None otherwise."""
    if "enable_thinking" in kwargs:
        return None
    try:
        bare = tokenizer.apply_chat_template(query, tokenize=False, enable_thinking=True, **kwargs)
        prompted = tokenizer.apply_chat_template(query, tokenize=False, add_generation_prompt=True, enable_thinking=True, **kwargs)
    except Exception:  # noqa: BLE001 - a template that refuses the switch has no such prompt
        return None
    thinking = prompted[len(bare) :] if prompted.startswith(bare) else ""
    return thinking if thinking and thinking != prompt else None


def _probe_turns(
    tokenizer: Any, kwargs: dict[str, Any], query: list[dict[str, Any]], prompted: str
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    def render(chat: list[dict[str, Any]], prompt: bool = False) -> str:
        return _render(tokenizer, chat, None, kwargs, prompt)

    text = {"role": "assistant", "content": _PROBE_CONTENT}
    reasoned = {**text, "reasoning_content": "Pr0beReas0ning"}
    calling = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
    after_tool = [*query, calling, {"role": "tool", "content": "Pr0beOutput", "tool_call_id": "call_0"}]
    prompt = prompted[len(render(query)) :]
    # How much of the prompt past turns keep: the part every probe turn opens with.
    heads = [render([*query, turn])[len(prompted) - len(prompt) :] for turn in (text, reasoned, calling)]
    kept = min(calls.common_prefix(prompt, head) for head in heads)
    opener = prompt[: calls._tag_start(prompt, kept)]
    tails = []
    for history in (query, after_tool):
        given = render(history, True)
        for turn in (text, calling):
            full = render([*history, turn])
            tails.append(given[calls._tag_start(given, calls.common_prefix(given, full)) :])
    stops: list[str] = []
    last = render([*query, text])
    after = [render([*query, text, {"role": "user", "content": "q2"}]), last]
    for rendered in after:
        at = rendered.rfind(_PROBE_CONTENT) + len(_PROBE_CONTENT)
        if (marker := _MARKER_AFTER.match(rendered, at)) is not None:
            stops.append(marker.group(1))
    if (marker := _MARKER_LAST.search(render([*query, calling]))) is not None:
        stops.append(marker.group(1))
    if not stops:
        raise ValueError("no stop marker")
    return opener, tuple(dict.fromkeys(tails)), tuple(dict.fromkeys(stops))


def _turn_render(tokenizer: Any, tools: Any, kwargs: dict[str, Any]) -> TurnRender:
    return lambda chat, prompt: _render(tokenizer, chat, tools, kwargs, prompt)


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


def _field_span(text: str, raw: str | None, turn: Turn, cursor: int, what: str) -> tuple[Span | None, int]:
    if raw is None:
        return None, cursor
    kept = raw.strip()
    if not kept:
        return None, cursor
    if text.find(kept, turn.start, turn.end) < 0:
        # Nowhere in the turn: the template does not render this field here, so none of its
        # text is in A. (Found elsewhere than after the text before it, it is refused below.)
        turn.left_out.append(what)
        return None, cursor
    position = _find(text, kept, cursor, turn.end, what, turn.message_index)
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


def _locate_calls(
    text: str,
    turn: Turn,
    message: Message,
    chat_message: dict[str, Any],
    cursor: int,
    turn_render: TurnRender,
    heads: tuple[str, str] | None,
) -> None:
    """Each call's region and, inside it, each argument's key and value as the template writes
    them. The regions start where the template's call heads (learned once per template) and
    the calls' names are found in order; a turn where they are not, or where the calls so cut
    do not each hold their arguments, is located by rendering it alone with its first k calls
    and diffing (``calls.call_starts``): n + 2 small renders, which would double the time
    ``relearn masks`` takes if every turn paid them."""
    names = [call.function.name for call in message.tool_calls or []]
    found = calls.starts_by_heads(text, heads, names, cursor, turn.end) if heads else None
    if found is not None:
        try:
            _place_calls(text, turn, message, found)
            _check_regions(turn)
            return
        except RenderError:
            turn.calls.clear()
    _place_calls(text, turn, message, _rendered_call_starts(text, turn, chat_message, cursor, turn_render))
    _check_regions(turn)


def _rendered_call_starts(text: str, turn: Turn, chat_message: dict[str, Any], cursor: int, turn_render: TurnRender) -> list[int]:
    """Where each call starts in ``text``, from renders of the turn alone with 0..n calls,
    placed in the turn's conversation (``calls.align``)."""
    index = turn.message_index
    found = calls.call_starts(turn_render, chat_message)
    if found is None:
        query = {"role": "user", "content": "q"}
        bare = {key: value for key, value in chat_message.items() if key != "tool_calls"}
        if turn_render([query, chat_message], False) == turn_render([query, bare], False):
            # DeepSeek-R1-Distill drops a message's calls when it has content (and fails to
            # render one whose content is none): the render lacks what the model generated.
            raise RenderError(
                "locate", f"message {index}: the template does not write this turn's tool calls (rendered alone, it drops them)"
            )
        raise RenderError(
            "locate",
            f"message {index}: the template's tool calls cannot be told apart (rendered alone, the turn does not grow call by call)",
        )
    alone, offsets = found
    placed = calls.align(alone, offsets, text[turn.start : turn.end])
    if placed is None:
        raise RenderError("locate", f"message {index}: the turn's tool calls render otherwise in its conversation than alone")
    # ``cursor``: the end of the turn's located text, where a call placed by the turn's ending
    # alone (None) starts.
    starts = [cursor if s is None else max(turn.start + s, cursor) for s in placed]
    # The whitespace that parts a call from the text before it is not the call's.
    return [s + len(text[s : turn.end]) - len(text[s : turn.end].lstrip()) for s in starts]


def _place_calls(text: str, turn: Turn, message: Message, starts: list[int]) -> None:
    """Each call's arguments found in its region, from ``starts[number]`` to the next call's start
    (the last call's, to the turn's end)."""
    for number, call in enumerate(message.tool_calls or []):
        lo, hi = starts[number], starts[number + 1] if number + 1 < len(starts) else turn.end
        name_at = text.find(call.function.name, lo, hi)
        at = lo if name_at < 0 else name_at + len(call.function.name)
        placed = _place_arguments(text, call.function.arguments, at, hi, turn.message_index, number)
        keys, shown, values, escaped = placed.keys, placed.shown, placed.values, placed.escaped
        json_map = calls.json_map_of(call.function.arguments, keys, shown)
        turn.calls.append(ArgumentSpans(values, json_map, (lo, hi), escaped))


@dataclass
class _Arguments:
    """One call's arguments as found in its region (``_place_arguments``)."""

    keys: dict[str, int] = field(default_factory=dict)  # where each key is rendered
    shown: dict[str, list[int]] = field(default_factory=dict)  # each value character's position
    values: dict[str, Span] = field(default_factory=dict)
    escaped: dict[str, list[int]] = field(default_factory=dict)
    end: int = 0  # where the last value found ends


def _place_arguments(text: str, arguments: dict[str, Any], at: int, hi: int, index: int, number: int) -> _Arguments:
    """The arguments found in ``text[at:hi]`` in the order the template writes them: the call's
    own, or sorted by key (Jinja's ``dictsort``: DiffusionGemma). The sorted order is tried
    where the call's order fails, or succeeds only by passing over another key before the
    first (a key found inside the text of a value); of the orders that place every argument,
    the one ending first is the template's, since a wrong order that succeeds must reach past
    the arguments' block to find its last key."""
    order = list(arguments)
    ranked = sorted(order)
    try:
        first: _Arguments | None = _place_in_order(text, arguments, order, at, hi, index, number)
    except RenderError as exc:
        if ranked == order:
            raise
        first, error = None, exc
    if ranked == order or (first is not None and not any(text.find(key, at, first.keys[order[0]]) >= 0 for key in order[1:])):
        assert first is not None
        return first
    try:
        other = _place_in_order(text, arguments, ranked, at, hi, index, number)
    except RenderError:
        if first is None:
            raise error from None
        return first
    return other if first is None or other.end < first.end else first


def _place_in_order(text: str, arguments: dict[str, Any], order: list[str], at: int, hi: int, index: int, number: int) -> _Arguments:
    found = _Arguments(end=at)
    for key in order:
        value = arguments[key]
        key_at = text.find(key, at, hi)
        if key_at < 0:
            raise RenderError("locate", f"message {index}: tool call {number} argument {key!r} not found in its rendered call")
        found.keys[key] = key_at
        place = calls.find_value(text, value, key_at + len(key), hi)
        if place is None:
            raise RenderError(
                "locate", f"message {index}: tool call {number} argument {key!r} is rendered in no form known (raw, JSON, Python)"
            )
        form_at, at, positions = place
        found.shown[key] = positions
        if not positions:
            found.values[key] = Span(form_at, 0, 0)
        elif positions == list(range(positions[0], positions[0] + len(positions))):
            found.values[key] = Span(positions[0], 0, len(positions))
        else:
            found.escaped[key] = positions
    found.end = at
    return found


# Renders a conversation (messages, whether to add the generation prompt) with one
# trajectory's tools and template arguments.
TurnRender = Callable[[list[dict[str, Any]], bool], str]


def _locate_fields(
    text: str, turn: Turn, message: Message, chat_message: dict[str, Any], turn_render: TurnRender, heads: tuple[str, str] | None
) -> None:
    cursor = turn.start
    reasoning, cursor = _field_span(text, message.reasoning_content, turn, cursor, "reasoning_content")
    content, cursor = _field_span(text, message.content, turn, cursor, "content")
    if reasoning is not None:
        turn.fields["reasoning_content"] = reasoning
    if content is not None:
        turn.fields["content"] = content
    if message.tool_calls:
        _locate_calls(text, turn, message, chat_message, cursor, turn_render, heads)


def _check_regions(turn: Turn) -> None:
    for number in range(len(turn.calls)):
        _check_region(turn, number, turn.message_index)


def _check_region(turn: Turn, number: int, index: int) -> None:
    """A call's region holds all of its arguments and none of the turn's text or other calls."""
    lo, hi = turn.calls[number].region
    values = turn.calls[number].values.values()
    inside = all(lo <= v.start and v.start + v.kept <= hi for v in values)
    inside = inside and all(lo <= p < hi for positions in turn.calls[number].escaped.values() for p in positions)
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


def template_input(trajectory: Trajectory, indexes: list[int] | None = None, shape: TemplateShape | None = None) -> TemplateInput:
    """The template input of the messages at ``indexes`` (default: all), with sources given as
    indexes into the whole trajectory; with ``shape``, each turn in a shape the template refuses
    given to it as it asks (``adapt``), so that what is compared with transformers' mask and
    what is compiled are the same render."""
    messages = normalised_messages(trajectory)
    chosen = list(range(len(messages))) if indexes is None else indexes
    chat, local = chat_messages_with_sources([messages[i] for i in chosen])
    chat, origins = adapt.adapt_chat(chat, shape is not None and shape.merge_calling_text, shape is not None and shape.split_calling_text)
    return TemplateInput(messages, chat, [chosen[local[o]] for o in origins], nfc(trajectory.tools) or None)


def _turn_parts(sources: list[int]) -> list[tuple[int, int]]:
    """Each run of chat messages from one trajectory message (a turn ``adapt`` split in two):
    (its first chat index, its last)."""
    runs: list[tuple[int, int]] = []
    for index, source in enumerate(sources):
        if runs and sources[runs[-1][1]] == source:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


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
    conversation = template_input(trajectory, segment, shape)
    messages, chat, sources, tools = conversation.messages, conversation.chat, conversation.sources, conversation.tools
    text = _render(tokenizer, chat, tools, kwargs)
    turn_render = _turn_render(tokenizer, tools, kwargs)
    turns: list[Turn] = []
    cursor = 0
    # A turn split in two (``adapt``) is located once, from its first part's prompt and with its
    # last part, the one that holds the calls (what ``_rendered_call_starts`` renders alone).
    for first_index, chat_index in _turn_parts(sources):
        source = sources[chat_index]
        message = messages[source]
        if chat[chat_index]["role"] != "assistant":
            continue
        if not shape.keeps_prompt and prefix_check != "every":
            if message.generated:
                given = _render(tokenizer, chat[:first_index], tools, kwargs, prompt=True)
                start = _start_after_prompt(text, given, cursor, shape, source, bool((message.reasoning_content or "").strip()))
                turns.append(_locate_turn(text, start, message, chat[chat_index], shape, turn_render, source))
                cursor = turns[-1].end
            continue
        # Every assistant turn, generated or not, opens with the role header.
        opening = text.find(shape.role_header, cursor)
        if opening < 0:
            raise RenderError("locate", f"message {source}: no {shape.role_header!r} for this assistant turn")
        if not message.generated:
            stop = shape.turn_end(text, opening)
            cursor = opening + len(shape.role_header) if stop is None else stop[1]
            continue
        if prefix_check == "every":
            prefix = _render(tokenizer, chat[:first_index], tools, kwargs, prompt=True)
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
        turn = _locate_turn(text, start, message, chat[chat_index], shape, turn_render, source)
        turns.append(turn)
        cursor = turn.end
    return Rendered(text, turns, messages, shape.end_of_turn)


def _start_after_prompt(text: str, given: str, cursor: int, shape: TemplateShape, source: int, reasoned: bool = False) -> int:
    """Where a generated turn starts in ``text`` for a template whose past turns do not keep
    the whole generation prompt: after what ``text`` shares with ``given`` (the history and
    prompt the model was given), moved back to the start of a marker shared only in part.
    What ``given`` holds beyond that must be what the probe saw a prompt hold that its turn
    does not (the prompt's own ``<think>\n``); anything else means the template rewrote the
    history, and the turn would start inside it.

    A turn that holds reasoning (``reasoned``) was generated after a prompt that opened the
    reasoning, whatever the template prompts with by default: where the template's prompt with
    thinking on (``shape.thinking_prompt``) differs, the turn must continue that prompt exactly
    (Qwen3.5 NoThink writes a past turn ``<think>\nREASONING\n</think>\n\n``, which continues
    its thinking prompt ``<think>\n`` and not its default ``<think>\n\n</think>\n\n``)."""
    if reasoned and shape.thinking_prompt is not None and given.endswith(shape.generation_prompt):
        thinking = given[: len(given) - len(shape.generation_prompt)] + shape.thinking_prompt
        if text.startswith(thinking, 0) and len(thinking) >= cursor:
            return len(thinking)
    start = calls._tag_start(given, calls.common_prefix(given, text))
    rest = given[start:]
    if start < cursor or not any(tail.endswith(rest) for tail in shape.prompt_tails):
        raise RenderError(
            "prefix", f"message {source}: the template renders the history before this turn differently from what the model was given"
        )
    return start


def _locate_turn(
    text: str, start: int, message: Message, chat_message: dict[str, Any], shape: TemplateShape, turn_render: TurnRender, source: int
) -> Turn:
    """The turn from ``start`` through its stop marker, its fields located. A turn that is
    several messages of the template (gpt-oss writes the analysis, then the call or the
    answer, each opening with ``<|start|>assistant``) runs on to a later stop while its
    fields are not all found, or its calls' names are not all written in it (a call without
    arguments has no field to miss: ``{}`` after a text turn ended the turn at the text's
    ``<|end|>``, leaving the call the model generated, its ``<|start|>assistant to=`` header
    and all, out of A), and the text after the stop opens another of its messages."""
    stop = shape.turn_end(text, start)
    if stop is None:
        raise RenderError("locate", f"message {source}: no end-of-turn token {shape.end_of_turn!r}")
    first: Turn | None = None
    while True:
        turn: Turn | None = Turn(source, start, stop[1])
        error = None
        try:
            _locate_fields(text, turn, message, chat_message, turn_render, shape.call_heads)  # type: ignore[arg-type]
        except RenderError as exc:
            turn, error = None, exc
        if turn is not None and not turn.left_out and _holds_calls(text, turn, message):
            return turn
        first = first or turn
        later = shape.turn_end(text, stop[1])
        if later is None or not text.startswith(shape.opener or shape.role_header, stop[1]):
            if first is not None:
                return first
            assert error is not None
            raise error
        stop = later


def _holds_calls(text: str, turn: Turn, message: Message) -> bool:
    """Whether each call's function name is written in the turn, in order, outside its located
    text: every template writes the name (``<function=NAME>``, ``"name": "NAME"``,
    ``to=functions.NAME``, ``call:NAME{``), wherever it puts the calls against the text."""
    spans = [(span.start, span.start + span.kept) for span in turn.fields.values()]
    at = turn.start
    for call in message.tool_calls or []:
        name = call.function.name
        at = text.find(name, at, turn.end)
        while at >= 0 and any(lo <= at < hi for lo, hi in spans):
            at = text.find(name, at + 1, turn.end)
        if at < 0:
            return False
        at += len(name)
    return True


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
    conversation = template_input(trajectory, segment, shape)
    messages, chat, sources, tools = conversation.messages, conversation.chat, conversation.sources, conversation.tools
    history = chat if history_reasoning else [_without_reasoning(m) for m in chat]
    out = []
    for first_index, chat_index in _turn_parts(sources):
        source = sources[chat_index]
        if chat[chat_index]["role"] != "assistant" or not messages[source].generated:
            continue
        prefix = _render(tokenizer, history[:first_index], tools, kwargs, prompt=True)
        full = _render(tokenizer, [*history[:first_index], *chat[first_index : chat_index + 1]], tools, kwargs)
        if not full.startswith(prefix) and (messages[source].reasoning_content or "").strip() and shape.thinking_prompt is not None:
            # Generated after the prompt that opens the reasoning (``_start_after_prompt``).
            prefix = prefix.removesuffix(shape.generation_prompt) + shape.thinking_prompt
        if not full.startswith(prefix):
            raise RenderError("prefix", f"message {source}: the turn does not continue its own prompt")
        stop = shape.turn_end(full, len(prefix))
        if stop is None:
            raise RenderError("locate", f"message {source}: no end-of-turn token")
        text = full[: stop[1]]
        turn = Turn(source, len(prefix), len(text))
        _locate_fields(text, turn, messages[source], chat[chat_index], _turn_render(tokenizer, tools, kwargs), shape.call_heads)
        out.append(Rendered(text, [turn], messages, shape.end_of_turn))
    return out


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] != "assistant" or "reasoning_content" not in message:
        return message
    return {key: value for key, value in message.items() if key != "reasoning_content"}
