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


def has_both(message: dict[str, Any]) -> bool:
    """A calling assistant message with text and reasoning (as a template tests them: non-empty)."""
    return bool(
        message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") and message.get("reasoning_content")
    )


def merged(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its text moved after its reasoning, as one reasoning text."""
    return {**message, "content": "", "reasoning_content": message["reasoning_content"] + JOIN + message["content"]}


def adapt_chat(chat: list[dict[str, Any]], merge_calling_text: bool) -> list[dict[str, Any]]:
    """The template input with each calling turn that has text and reasoning merged, where the
    template asks for it; the same list otherwise. One message in, one out, so the sources
    that map chat messages to the trajectory's stay as they are."""
    if not merge_calling_text or not any(has_both(m) for m in chat):
        return chat
    return [merged(m) if has_both(m) else m for m in chat]
