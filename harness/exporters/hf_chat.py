"""Trajectories as Hugging Face chat messages, ready for ``apply_chat_template``.

Templates know four roles and (Qwen, Llama, ...) accept a system message only first.
So the leading run of ``system``/``developer`` messages becomes one system message,
and a later ``system``/``developer`` message (Codex permission notes, compaction
context) is shown as ``user`` text, the role through which the model read it.
"""

from __future__ import annotations

from typing import Any

from records.trajectory import Message, Trajectory

INSTRUCTION_ROLES = ("system", "developer")


def chat_message(message: Message, role: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role or message.role, "content": message.content or ""}
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for call in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
    return out


def to_chat_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The messages of ``trajectory`` as template input, one output per input message
    except the merged leading instructions."""
    return chat_messages_with_sources(trajectory.messages)[0]


def chat_messages_with_sources(messages: list[Message]) -> tuple[list[dict[str, Any]], list[int]]:
    """Chat messages, and for each the index of the trajectory message it came from
    (the merged leading system message points at the first of them)."""
    lead = 0
    while lead < len(messages) and messages[lead].role in INSTRUCTION_ROLES:
        lead += 1
    out: list[dict[str, Any]] = []
    sources: list[int] = []
    if lead:
        out.append({"role": "system", "content": "\n\n".join(m.content or "" for m in messages[:lead])})
        sources.append(0)
    for index in range(lead, len(messages)):
        message = messages[index]
        role = "user" if message.role in INSTRUCTION_ROLES else message.role
        out.append(chat_message(message, role))
        sources.append(index)
    return out, sources


def to_chat_record(trajectory: Trajectory) -> dict[str, Any]:
    """One JSONL row: what ``tokenizer.apply_chat_template(messages, tools=tools)``
    takes, plus ids to join back to the pool."""
    record: dict[str, Any] = {"id": trajectory.id, "messages": to_chat_messages(trajectory)}
    if trajectory.tools:
        record["tools"] = trajectory.tools
    if trajectory.task_id:
        record["task_id"] = trajectory.task_id
    return record
