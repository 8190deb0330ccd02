"""The offline reviewer: pre-filter signals turned into grounded defects, no judge API.

For runs without judges. Each signal's defect is the offending action itself (the shell
command text, or the whole apply_patch input), which the masks' default ``action`` scope
widens to the whole tool call; reasoning next to the action may be right, and text we
cannot show is wrong stays supervised. The last
assistant message (the answer after the work) is never excluded.

Hint signals (``review.signals.HINT_KINDS``: a failure the agent expected, such as the
failing test run that reproduces the bug before the fix) claim no mistake, so they get no
entry in the Review at all: not a defect and not an error. An entry marked "not a defect"
would still be counted by everything that reads ``errors`` as a confirmed error (the
category shares in ``records.pool_index``, agreement with the judges).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from records.review import Defect, Review, numbered_steps
from records.trajectory import Message, Trajectory, is_verified_positive
from review.actions import command_key, is_inline_script, shell_script
from review.grounding import ground
from review.prefilters import prefilter
from review.signals import Signal

# Recorded in every review (as prompts_hash): which version of these rules made it.
PROMPTS_VERSION = "heuristic-2"
PROMPTS_HASH = hashlib.sha256(PROMPTS_VERSION.encode()).hexdigest()
_BASH_FENCE = re.compile(r"```(?:bash|sh)\s*\n")


def heuristic_review(trajectory: Trajectory, *, include_suspicious: bool = False) -> Review:
    messages = trajectory.messages
    steps = {index: number for number, index in numbered_steps(trajectory).items()}
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    errors: list[dict[str, Any]] = []
    defects: list[Defect] = []
    ungrounded: list[int] = []
    for signal in prefilter(trajectory):
        if not signal.is_defect:
            continue  # a hint for the judges, not a mistake (see the module docstring)
        if signal.message_index == last or signal.message_index not in steps:
            continue  # the final answer stays; non-generated text is never supervised anyway
        error: dict[str, Any] = {
            "step": steps[signal.message_index],
            "message_index": signal.message_index,
            "category": signal.category,
            "description": signal.detail,
            "evidence": signal.evidence,
            "source": "heuristic",
            "kind": signal.kind,
            "call_index": signal.call_index,
        }
        defect, problem = _ground_action(trajectory, signal)
        if defect is None:
            error["grounding"] = problem
            ungrounded.append(steps[signal.message_index])
        elif not any(
            (d.message_index, d.field, d.start, d.end) == (defect.message_index, defect.field, defect.start, defect.end) for d in defects
        ):
            defects.append(defect)
        errors.append(error)
    base: dict[str, Any] = {
        "trajectory_id": trajectory.id,
        "errors": errors,
        "defects": defects,
        "judges": {"judge1": "heuristic", "judge2": "heuristic"},
        "prompts_hash": PROMPTS_HASH,
        "cost_usd": 0,
    }
    if not is_verified_positive(trajectory, allow_suspicious=include_suspicious):
        return Review(**base, decision="reject", reason="not verified positive")
    if ungrounded:
        # A flagged action that cannot be excluded would be imitated: fail closed, as the judges do.
        return Review(
            **base, decision="reject", reason=f"no_valid_target: signals at steps {sorted(set(ungrounded))} could not be grounded"
        )
    if not any(_has_target(messages[i], [d for d in defects if d.message_index == i]) for i in steps):
        return Review(**base, decision="reject", reason="no_valid_target")
    return Review(**base, decision="accept")


def _ground_action(trajectory: Trajectory, signal: Signal) -> tuple[Defect | None, str | None]:
    """The defect covering the action a signal points at, or why there is none."""
    message = trajectory.messages[signal.message_index]
    target = _action_text(message, signal.call_index)
    if target is None:
        return None, "no action text"
    field, quote, before = target
    result = ground(
        trajectory, signal.message_index, field, quote, context_before=before, category=signal.category, description=signal.detail
    )
    return result.defect, result.reason


def _action_text(message: Message, call_index: int | None) -> tuple[str, str, str] | None:
    """(field, quote, context before) of the action itself."""
    if call_index is None:  # text protocol: the command inside the ```bash block
        fence = _BASH_FENCE.search(message.content or "")
        if fence is None:
            return None
        body = (message.content or "")[fence.end() :]
        close = body.find("\n```")
        command = body[:close] if close != -1 else body
        return ("content", command, fence.group(0)) if command.strip() else None
    calls = message.tool_calls or []
    if call_index >= len(calls):
        return None
    call = calls[call_index]
    arguments = call.function.arguments
    prefix = f"tool_calls[{call_index}].arguments"
    if call.function.name == "apply_patch" and isinstance(arguments.get("input"), str) and arguments["input"].strip():
        return f"{prefix}.input", arguments["input"], ""
    key = command_key(arguments)
    command = arguments.get(key)
    if isinstance(command, str) and command.strip():
        return f"{prefix}.{key}", command, ""
    if isinstance(command, list) and shell_script(command) is not None:
        # argv: quote what runs (the script after -lc, else every element) in the JSON text,
        # anchored by the JSON that precedes it so a repeat elsewhere cannot be taken.
        head = json.dumps(key) + ": ["
        if is_inline_script(command) and command[2].strip():
            before = head + ", ".join(json.dumps(c, ensure_ascii=False) for c in command[:2]) + ', "'
            return prefix, json.dumps(command[2], ensure_ascii=False)[1:-1], before
        return prefix, json.dumps(command, ensure_ascii=False)[1:-1], head
    return prefix, json.dumps(arguments, ensure_ascii=False), ""


def _has_target(message: Message, defects: list[Defect]) -> bool:
    """Whether a generated message keeps anything worth imitating: text outside every
    defect, or a tool call no defect touches (its JSON skeleton alone teaches nothing)."""
    for name in ("content", "reasoning_content"):
        text = getattr(message, name) or ""
        covered = [False] * len(text)
        for d in defects:
            if d.field == name:
                covered[d.start : d.end] = [True] * (d.end - d.start)
        if any(ch.strip() and not covered[i] for i, ch in enumerate(text)):
            return True
    touched = {d.field.split("]", 1)[0] for d in defects if d.field.startswith("tool_calls[")}
    return any(f"tool_calls[{i}" not in touched for i in range(len(message.tool_calls or [])))
