"""Give a chat template a turn in the one shape it can write, where it refuses the shape the
trajectory holds, keeping every character the model generated.

One shape is known: gpt-oss's template (harmony) raises for an assistant message that has tool
calls and both text and reasoning ("Cannot pass both content and thinking in an assistant message
with tool calls! Put the analysis message in one or the other, but not both."). It writes a calling
turn as at most one ``analysis`` message and then the call; a calling turn's ``content`` alone is
written on ``analysis`` too, so to this template a calling turn's text is analysis.

What harmony writes for such a turn, as the model generates it (openai/harmony ``docs/format.md``,
"Preambles"; vLLM's chat-to-harmony reader maps a calling message's ``content`` to a
``commentary`` message and its reasoning to an ``analysis`` one) is three messages: the reasoning
on ``analysis``, then the text on ``commentary`` with no recipient (a preamble), then the call on
``commentary`` addressed ``to=functions.NAME``. The template has no way to write a preamble. Of
what it can write:

- reasoning and text as one analysis message, then the call (``merge_calling_text``): every
  character kept, in the order generated (analysis first, then the preamble); what differs from
  the model's own tokens is only the message break between the two texts
  (``<|end|><|start|>assistant<|channel|>commentary<|message|>``), written as a blank line;
- the text split off into an assistant message of its own, before the call (what the error
  message might be read as asking): a message without calls is rendered as a ``final`` answer
  ending ``<|end|>``, which drops the turn's reasoning and makes every earlier calling turn one
  that "a final answer follows", so the template drops their analysis too; it writes neither the
  model's tokens nor the history it saw;
- the reasoning or the text alone: the other is lost from the render and from training.

So the first. Whether a template needs it is found by probing (``refuses_calling_text``: the shape
raises, the merged one renders), never by the template's name; templates that render the shape
are given the messages unchanged.

A second shape: DiffusionGemma's template (Gemma 4's format) writes a calling message as its
reasoning, its calls, the tools' responses (the message's following ``tool`` messages, inside
the same model turn) and only then the message's ``content``: Google's native shape, where an
assistant message carries its ``tool_responses`` and its text is what the model wrote after
reading them. The model generates a calling turn as reasoning, text, calls, then stops with
``<|tool_response>``; after the responses are written into its turn it goes on, with what the
next assistant message holds. So the text that the trajectory's model wrote before its call
lands, rendered as it is, where the model writes after the response: TRL's mask trains it
there, conditioned on an answer it had not seen, and every later turn is trained under a
history that moved it. The same template writes text before calls when it is given an
assistant message with the text (and reasoning) and then one with only the calls: a message
without calls followed by an assistant message continues into it, in the same model turn.
``writes_calling_text_after_calls`` probes both (the text after the call's response as one
message; only the text moved, nothing else changed, as two), and ``adapt_chat`` then splits
each calling message with text in two: reasoning, text, calls, the response, in the order
generated. The one difference from a single message: the template gates a message's reasoning
on it being after the last user message or carrying calls, so where a user message follows, the
split-off text message's reasoning is not written (left out of A, as the template drops it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Renders a conversation (messages, whether to add the generation prompt).
Render = Callable[[list[dict[str, Any]], bool], str]

# What parts the reasoning from the text in the merged analysis message: a paragraph break,
# the nearest plain-text rendering of the message break harmony writes there.
JOIN = "\n\n"

_QUERY = {"role": "user", "content": "q"}
_CALL = {"id": "call_0", "type": "function", "function": {"name": "probe_tool", "arguments": {"a": "Pr0beValue"}}}
_TEXT, _REASONING = "Pr0beText", "Pr0beReas0ning"


def refuses_calling_text(render: Render) -> bool:
    """Whether the template raises for a calling turn with both text and reasoning, and renders
    the same turn with the two merged into its reasoning (``merged``)."""
    turn = {"role": "assistant", "content": _TEXT, "reasoning_content": _REASONING, "tool_calls": [_CALL]}
    try:
        render([_QUERY, turn], False)
        return False
    except Exception:  # noqa: BLE001 - the template's own raise_exception, whatever type it reaches us as
        pass
    try:
        shown = render([_QUERY, merged(turn)], False)
    except Exception:  # noqa: BLE001 - a template that refuses this too: nothing to adapt to
        return False
    return _REASONING in shown and _TEXT in shown


def writes_calling_text_after_calls(render: Render) -> bool:
    """Whether the template writes a calling message's text after the call's response, and
    writes it before the call, changing nothing else, when given as a text message and then
    a calls-only one (``split``)."""
    turn = {"role": "assistant", "content": _TEXT, "reasoning_content": _REASONING, "tool_calls": [_CALL]}
    # A final answer after the response, so that both shapes end the model's turn alike.
    after = [{"role": "tool", "content": _OUTPUT, "tool_call_id": "call_0"}, {"role": "assistant", "content": "Pr0beAnswer"}]
    try:
        whole = render([_QUERY, turn, *after], False)
        parted = render([_QUERY, *split(turn), *after], False)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: nothing to adapt
        return False
    if whole.find(_OUTPUT) < 0 or whole.find(_TEXT) < whole.find(_OUTPUT):
        return False
    return parted.find(_TEXT) < parted.find(_CALL_NAME) and whole.replace(_TEXT, "") == parted.replace(_TEXT, "")


_OUTPUT = "Pr0beOutput"
_CALL_NAME = _CALL["function"]["name"]  # type: ignore[index]


def splits(message: dict[str, Any]) -> bool:
    """A calling assistant message with text (as a template tests it: non-empty once trimmed)."""
    return bool(message.get("role") == "assistant" and message.get("tool_calls") and (message.get("content") or "").strip())


def split(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message as its text (with its reasoning) and then its calls, two assistant messages."""
    text = {key: value for key, value in message.items() if key != "tool_calls"}
    calls = {key: value for key, value in message.items() if key not in ("content", "reasoning_content")}
    return [text, {**calls, "content": ""}]


def has_both(message: dict[str, Any]) -> bool:
    """A calling assistant message with text and reasoning (as a template tests them: non-empty)."""
    return bool(
        message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") and message.get("reasoning_content")
    )


def merged(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its text moved after its reasoning, as one reasoning text."""
    return {**message, "content": "", "reasoning_content": message["reasoning_content"] + JOIN + message["content"]}


def adapt_chat(
    chat: list[dict[str, Any]], merge_calling_text: bool, split_calling_text: bool = False
) -> tuple[list[dict[str, Any]], list[int]]:
    """The template input with each calling turn that has text and reasoning merged, or each
    calling turn with text split in two, where the template asks for it (the same list
    otherwise), and for each message out the index of the message in it came from: a split
    message's two parts both come from it, so a turn is the run of chat messages of one source."""
    if merge_calling_text and any(has_both(m) for m in chat):
        chat = [merged(m) if has_both(m) else m for m in chat]
    if not split_calling_text or not any(splits(m) for m in chat):
        return chat, list(range(len(chat)))
    out: list[dict[str, Any]] = []
    origins: list[int] = []
    for index, message in enumerate(chat):
        parts = split(message) if splits(message) else [message]
        out.extend(parts)
        origins.extend([index] * len(parts))
    return out, origins
