"""Harbor ATIF trajectories (``trajectory.json``, ``schema_version`` ``ATIF-v1.0`` … ``v1.7``).

Steps map to messages: ``system``/``user`` steps to those roles, an ``agent`` step to
an assistant message (``message``, ``reasoning_content``, ``tool_calls``; metrics to
usage, ``completion_token_ids``/``logprobs`` kept per message) followed by one ``tool``
message per observation result that names its call. Results without a call (agents
that act through text) become the ``user`` message the model saw next. Steps marked
``is_copied_context`` or dispatched without a model call (``llm_call_count: 0``) are
context, not generated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.importers.base import (
    Diagnostics,
    Fields,
    ImportResult,
    fail,
    read_guarded,
    read_json_document,
    text_of_parts,
)
from records.trajectory import (
    FunctionCall,
    Message,
    Policy,
    Source,
    ToolCall,
    Trajectory,
    Usage,
)

FORMAT = "atif"
SOURCES = {"system", "user", "agent"}
STEP_FIELDS = {
    "step_id",
    "timestamp",
    "source",
    "model_name",
    "message",
    "reasoning_content",
    "tool_calls",
    "observation",
    "metrics",
    "is_copied_context",
    "llm_call_count",
}
METRIC_FIELDS = {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "completion_token_ids", "logprobs"}


def discover(root: Path) -> list[Path]:
    # Harbor trial folders also hold result.json and config.json; its trajectories are
    # agent/trajectory.json and trajectory.<subagent>.json.
    return sorted(p for p in root.rglob("*trajectory*.json") if p.is_file())


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    def convert_all(diagnostics: Diagnostics) -> list[Trajectory]:
        document = read_json_document(path)
        if not isinstance(document, list):
            return [convert(document, str(path), diagnostics)]
        return [convert(doc, str(path), diagnostics, index) for index, doc in enumerate(document)]

    return read_guarded(path, convert_all)


def convert(document: Any, path: str, diag: Diagnostics, index: int | None = None) -> Trajectory:
    top = Fields(document, path, None, "" if index is None else f"[{index}]")
    version = top.str("schema_version", required=True) or ""
    if not version.startswith("ATIF-v1."):
        raise fail(path, None, top._name("schema_version"), f"{version!r} is not ATIF v1.x")
    agent = top.obj("agent", required=True)
    assert agent is not None
    steps = list(top.items("steps", required=True))
    if not steps:
        raise fail(path, None, top._name("steps"), "empty: ATIF needs at least one step")

    messages: list[Message] = []
    for position, step in enumerate(steps, start=1):
        step_id = step.get("step_id", int, required=True)
        if step_id != position:
            diag.warn(None, f"{step.prefix}.step_id is {step_id}, expected {position} (steps must be numbered 1..N)")
        messages.extend(_step_messages(step, diag))

    final = top.obj("final_metrics")
    usage = None
    if final is not None:
        usage = Usage(
            input_tokens=final.get("total_prompt_tokens", int),
            output_tokens=final.get("total_completion_tokens", int),
            cached_input_tokens=final.get("total_cached_tokens", int),
            cost_usd=_float(final.get("total_cost_usd", (int, float))),
        )
    given_id = top.str("trajectory_id")  # session_id is run-scoped: several documents share it
    meta = {k: v for k, v in document.items() if k not in ("steps",)}
    return Trajectory(
        id=f"atif-{given_id}" if given_id else "",
        policy=Policy(name=agent.str("model_name")),
        messages=messages,
        tools=agent.get("tool_definitions", list),
        usage=usage,
        started_at=messages[0].timestamp if messages else None,
        finished_at=messages[-1].timestamp if messages else None,
        source=Source(format=FORMAT, format_version=version, path=path, meta=meta, warnings=diag.warnings or None),
    )


def _content(value: Any) -> tuple[str | None, list[Any] | None]:
    if isinstance(value, list):
        return text_of_parts(value), value
    return value, None


def _step_messages(step: Fields, diag: Diagnostics) -> list[Message]:
    source = step.str("source", required=True)
    if source not in SOURCES:
        raise fail(step.path, None, f"{step.prefix}.source", f"{source!r} is not one of system, user, agent")
    text, parts = _content(step.get("message", (str, list), default=""))
    extra: dict[str, Any] = {"atif_step_id": step.data.get("step_id")}
    if parts is not None:
        extra["content_parts"] = parts
    extra.update({k: v for k, v in step.data.items() if k not in STEP_FIELDS})
    for key in ("model_name", "is_copied_context", "llm_call_count"):
        if key in step.data:
            extra[key] = step.data[key]
    timestamp = step.str("timestamp")
    if source != "agent":
        for key in ("reasoning_content", "tool_calls", "metrics"):
            if step.data.get(key) is not None:
                raise fail(step.path, None, f"{step.prefix}.{key}", f"only agent steps may carry {key}")
    role = {"system": "system", "user": "user", "agent": "assistant"}[source]
    generated = source == "agent" and not step.data.get("is_copied_context") and step.data.get("llm_call_count") != 0
    message = Message(role=role, content=text, timestamp=timestamp, generated=generated)  # type: ignore[arg-type]
    calls = []
    for call in step.items("tool_calls"):
        arguments = call.get("arguments", dict, default={})
        call_extra = call.get("extra", dict)
        calls.append(
            ToolCall(
                id=call.str("tool_call_id", required=True) or "",
                function=FunctionCall(name=call.str("function_name", required=True) or "", arguments=arguments),
                extra={"extra": call_extra} if call_extra else None,
            )
        )
    if calls:
        message.tool_calls = calls
    message.reasoning_content = step.str("reasoning_content")
    metrics = step.obj("metrics")
    if metrics is not None:
        message.usage = Usage(
            input_tokens=metrics.get("prompt_tokens", int),
            output_tokens=metrics.get("completion_tokens", int),
            cached_input_tokens=metrics.get("cached_tokens", int),
            cost_usd=_float(metrics.get("cost_usd", (int, float))),
        )
        message.token_ids = metrics.get("completion_token_ids", list)
        message.logprobs = metrics.get("logprobs", list)
        leftover = {k: v for k, v in metrics.data.items() if k not in METRIC_FIELDS}
        if leftover:
            extra["metrics"] = leftover
    message.extra = extra
    messages = [message]

    observation = step.obj("observation")
    if observation is not None:
        call_ids = {c.id for c in calls}
        for result in observation.items("results"):
            content, result_parts = _content(result.get("content", (str, list), default=""))
            call_id = result.str("source_call_id")
            result_extra: dict[str, Any] = {k: v for k, v in result.data.items() if k not in ("content", "source_call_id")}
            if result_parts is not None:
                result_extra["content_parts"] = result_parts
            result_extra["atif_observation_of"] = step.data.get("step_id")
            if call_id is not None:
                if call_id not in call_ids:
                    raise fail(step.path, None, f"{result.prefix}.source_call_id", f"{call_id!r} matches no tool_call_id of this step")
                messages.append(Message(role="tool", content=content, tool_call_id=call_id, timestamp=timestamp, extra=result_extra))
            else:
                messages.append(Message(role="user", content=content, timestamp=timestamp, extra=result_extra))
    return messages


def _float(value: int | float | None) -> float | None:
    return None if value is None else float(value)
