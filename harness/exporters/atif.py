"""Trajectories as Harbor ATIF v1.7 documents (for Harbor's viewer, ``analyze``, SkyRL).

Each assistant message becomes an ``agent`` step whose observation holds the results
that follow it (``tool`` messages, or the ``user`` message an ATIF import took from a
call-less observation). ``system``/``developer`` messages become ``system`` steps.
Non-generated assistant messages are marked ``is_copied_context``.
"""

from __future__ import annotations

from typing import Any

from records.trajectory import Message, Trajectory, Usage

ATIF_VERSION = "ATIF-v1.7"
# Keys the ATIF importer writes into Message.extra for its own bookkeeping; any other
# key there is a step field this exporter does not model and is written back as is.
IMPORT_KEYS = {
    "atif_step_id", "atif_observation_of", "content_parts", "metrics", "model_name", "is_copied_context", "llm_call_count",
    "prompt_token_ids",
}  # fmt: skip


def _metrics(usage: Usage | None, message: Message) -> dict[str, Any] | None:
    metrics: dict[str, Any] = {}
    if usage is not None:
        for ours, theirs in (
            ("input_tokens", "prompt_tokens"),
            ("output_tokens", "completion_tokens"),
            ("cached_input_tokens", "cached_tokens"),
            ("cost_usd", "cost_usd"),
        ):
            value = getattr(usage, ours)
            if value is not None:
                metrics[theirs] = value
    if message.token_ids is not None:
        metrics["completion_token_ids"] = message.token_ids
    if message.logprobs is not None:
        metrics["logprobs"] = message.logprobs
    prompt_ids = (message.extra or {}).get("prompt_token_ids")
    if prompt_ids is not None:  # the call's prompt as sent (the chat policy's, or ATIF's own)
        metrics["prompt_token_ids"] = prompt_ids
    metrics.update((message.extra or {}).get("metrics", {}))
    return metrics or None


def _passthrough(message: Message) -> dict[str, Any]:
    extra = message.extra or {}
    if "atif_step_id" not in extra and "atif_observation_of" not in extra:
        return {}
    return {k: v for k, v in extra.items() if k not in IMPORT_KEYS}


def _is_observation(message: Message, step: dict[str, Any] | None) -> bool:
    if step is None or step["source"] != "agent":
        return False
    if message.role == "tool":
        return True
    return message.role == "user" and (message.extra or {}).get("atif_observation_of") is not None


def _content(message: Message) -> Any:
    parts = (message.extra or {}).get("content_parts")
    return parts if parts is not None and (message.extra or {}).get("atif_step_id") is not None else (message.content or "")


def _context_steps(trajectory: Trajectory) -> dict[int, list[dict[str, Any]]]:
    """ATIF context-management steps an import kept (``source.records``), by the message
    index they stood before."""
    source = trajectory.source
    out: dict[int, list[dict[str, Any]]] = {}
    if source is None or source.format != "atif":
        return out
    for entry in source.records or []:
        record = entry.get("record")
        if isinstance(record, dict) and isinstance(entry.get("at_message"), int):
            out.setdefault(entry["at_message"], []).append(record)
    return out


def to_atif(trajectory: Trajectory, agent_name: str = "relearn", agent_version: str = "0.1.0") -> dict[str, Any]:
    """``agent_name``/``agent_version`` name the scaffold that acted; a trajectory read
    from ATIF keeps the agent block it came with."""
    steps: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    context_steps = _context_steps(trajectory)
    for index, message in enumerate(trajectory.messages):
        for record in context_steps.pop(index, []):
            steps.append({**record, "step_id": len(steps) + 1})  # as read: its observation is the new context
            last = None
        if (message.extra or {}).get("context_management") is not None:
            continue  # part of that step's observation
        if _is_observation(message, last):
            assert last is not None
            result: dict[str, Any] = {"content": _content(message)}
            if message.role == "tool":
                result["source_call_id"] = message.tool_call_id
            result.update(_passthrough(message))
            last.setdefault("observation", {"results": []})["results"].append(result)
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1}
        if message.timestamp:
            step["timestamp"] = message.timestamp
        if message.role == "assistant":
            step["source"] = "agent"
            extra = message.extra or {}
            # A step read from ATIF says its own model (or none); others carry the policy's.
            model_name = extra.get("model_name") if "atif_step_id" in extra else trajectory.policy.name
            if model_name:
                step["model_name"] = model_name
            step["message"] = _content(message)
            if message.reasoning_content is not None:
                step["reasoning_content"] = message.reasoning_content
            if message.tool_calls:
                step["tool_calls"] = [
                    {"tool_call_id": c.id, "function_name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls
                ]
            metrics = _metrics(message.usage, message)
            if metrics:
                step["metrics"] = metrics
            if not message.generated and extra.get("llm_call_count") != 0:
                step["is_copied_context"] = True
            if "llm_call_count" in extra:
                step["llm_call_count"] = extra["llm_call_count"]
        else:
            step["source"] = "user" if message.role in ("user", "tool") else "system"
            step["message"] = _content(message)
            if (message.extra or {}).get("is_copied_context") is not None:
                step["is_copied_context"] = message.extra["is_copied_context"]  # type: ignore[index]
        step.update(_passthrough(message))
        steps.append(step)
        last = step
    for records in context_steps.values():  # a context step after the last message
        steps += [{**record, "step_id": len(steps) + 1 + k} for k, record in enumerate(records)]

    source = trajectory.source
    from_atif = source is not None and source.format == "atif"
    agent: dict[str, Any] = {"name": agent_name, "version": agent_version}
    if from_atif and isinstance((source.meta or {}).get("agent"), dict):
        agent = dict(source.meta["agent"])  # type: ignore[index]
    if trajectory.policy.name:
        agent["model_name"] = trajectory.policy.name
    if trajectory.tools:
        agent["tool_definitions"] = trajectory.tools
    session_id = (source.meta or {}).get("session_id") if from_atif else None
    document: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": session_id or trajectory.id,
        "agent": agent,
        "steps": steps,
    }
    if from_atif:
        for key, value in (source.meta or {}).items():  # type: ignore[union-attr]
            document.setdefault(key, value)  # notes, extra, continued_trajectory_ref, ...
        document["schema_version"] = ATIF_VERSION
    if from_atif and "final_metrics" in (source.meta or {}):
        document["final_metrics"] = source.meta["final_metrics"]  # type: ignore[index]
    elif trajectory.usage is not None:
        final = {
            "total_prompt_tokens": trajectory.usage.input_tokens,
            "total_completion_tokens": trajectory.usage.output_tokens,
            "total_cached_tokens": trajectory.usage.cached_input_tokens,
            "total_cost_usd": trajectory.usage.cost_usd,
            "total_steps": len(steps),
        }
        document["final_metrics"] = {k: v for k, v in final.items() if v is not None}
    return document
