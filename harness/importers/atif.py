"""Harbor ATIF trajectories (``trajectory.json``, ``schema_version`` ``ATIF-v1.x``: v1.0 … v1.8 seen).

A later v1 minor adds fields, never changes them (Harbor's models accept every v1.x they
know); what this reader does not map is kept (``extra``, ``source.meta``), so any ``ATIF-v1.``
version is read; another major is refused.

Steps map to messages: ``system``/``user`` steps to those roles, an ``agent`` step to
an assistant message (``message``, ``reasoning_content``, ``tool_calls``; metrics to
usage, ``completion_token_ids``/``logprobs`` kept per message, ``prompt_token_ids`` as
``extra.prompt_token_ids`` where the chat policy records a call's prompt) followed by one ``tool``
message per observation result that names its call. Results without a call (agents
that act through text) become the ``user`` message the model saw next. Steps marked
``is_copied_context`` or dispatched without a model call (``llm_call_count: 0``) are
context, not generated.

Context management (ATIF v1.7: a ``system`` step whose ``extra.context_management`` says
``type``/``boundary``): the step's own ``message`` is an annotation the model never saw and
makes no message (the step is kept under ``source.records``). With ``boundary: replace``
its observation's contents become non-generated ``user`` messages (the new context) and a
``ContextReset`` starts at the first of them; a replacement with no content is recorded as
unknown (``replacement_known: false``: later turns are not trained on). ``append`` adds the
contents without a reset.

Sub-agents: an observation result's ``subagent_trajectory_ref`` becomes a link
(``Trajectory.links``), never a message. The referenced trajectory is imported as its own
trajectory, linked back to its parent: from the document's embedded ``subagent_trajectories``
by ``trajectory_id``, else from ``trajectory_path`` beside the parent file (``session_id``
alone resolves nothing). A file that another file in the same folder references is read
through that file, not on its own.
"""

from __future__ import annotations

import json
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
    ContextReset,
    FunctionCall,
    Message,
    Policy,
    Source,
    ToolCall,
    Trajectory,
    TrajectoryLink,
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
METRIC_FIELDS = {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "completion_token_ids", "logprobs", "prompt_token_ids"}


def discover(root: Path) -> list[Path]:
    # Harbor trial folders also hold result.json and config.json; its trajectories are
    # agent/trajectory.json and trajectory.<subagent>.json. Sub-agent files that another
    # file references are read through it, with their link.
    found = sorted(p for p in root.rglob("*trajectory*.json") if p.is_file())
    referenced = {ref for path in found for ref in _referenced_files(path)}
    return [p for p in found if p.resolve() not in referenced]


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    def convert_all(diagnostics: Diagnostics) -> list[Trajectory]:
        document = read_json_document(path)
        documents = document if isinstance(document, list) else [document]
        out: list[Trajectory] = []
        for index, doc in enumerate(documents):
            parent = convert(doc, str(path), diagnostics, None if not isinstance(document, list) else index)
            out += [parent, *_subagents(parent, doc, path, diagnostics)]
        return out

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
    resets: list[ContextReset] = []
    links: list[TrajectoryLink] = []
    records: list[dict[str, Any]] = []
    for position, step in enumerate(steps, start=1):
        step_id = step.get("step_id", int, required=True)
        if step_id != position:
            diag.warn(None, f"{step.prefix}.step_id is {step_id}, expected {position} (steps must be numbered 1..N)")
        management = _context_management(step, diag)
        if management is not None:
            records.append({"at_message": len(messages), "record": step.data})
            _context_step(step, management, messages, resets, links, diag)
            continue
        messages.extend(_step_messages(step, links, len(messages), diag))

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
        context_resets=resets or None,
        links=links or None,
        started_at=messages[0].timestamp if messages else None,
        finished_at=messages[-1].timestamp if messages else None,
        source=Source(format=FORMAT, format_version=version, path=path, meta=meta, records=records or None, warnings=diag.warnings or None),
    )


def _context_management(step: Fields, diag: Diagnostics) -> dict[str, Any] | None:
    """The step's ``extra.context_management`` (where ATIF v1.7 puts it), or a top-level one
    (invalid ATIF: Harbor's models forbid the field; read anyway, with a warning)."""
    extra = step.data.get("extra")
    value = extra.get("context_management") if isinstance(extra, dict) else None
    if value is None and isinstance(step.data.get("context_management"), dict):
        diag.warn(None, f"{step.prefix}.context_management is not an ATIF field (ATIF v1.7 puts it under extra); read anyway")
        value = step.data["context_management"]
    return value if isinstance(value, dict) else None


def _context_step(
    step: Fields,
    management: dict[str, Any],
    messages: list[Message],
    resets: list[ContextReset],
    links: list[TrajectoryLink],
    diag: Diagnostics,
) -> None:
    """A context-management step: its observation's contents are what later calls see."""
    kind, boundary = str(management.get("type") or "compaction"), str(management.get("boundary") or "replace")
    start = len(messages)
    observation = step.obj("observation")
    for result in observation.items("results") if observation is not None else []:
        content, parts = _content(result.get("content", (str, list), default=""))
        _links_of(result, links, len(messages))
        if content:
            extra: dict[str, Any] = {"atif_step_id": step.data.get("step_id"), "context_management": management}
            if parts is not None:
                extra["content_parts"] = parts
            messages.append(Message(role="user", content=content, generated=False, timestamp=step.str("timestamp"), extra=extra))
    if boundary == "append":
        return
    known = boundary == "replace" and len(messages) > start
    if not known:
        diag.warn(
            None,
            f"{step.prefix}: {kind} with boundary {boundary!r} and no replacement content: what later turns saw is unknown, and they are not trained on",
        )
    resets.append(
        ContextReset(message_index=start, reason="compacted" if kind == "compaction" else f"atif:{kind}", replacement_known=known)
    )


def _links_of(result: Fields, links: list[TrajectoryLink], message_index: int) -> bool:
    """Record an observation result's sub-agent references; True when it had any."""
    refs = result.get("subagent_trajectory_ref", list, default=[]) or []
    for ref in refs:
        if isinstance(ref, dict):
            links.append(TrajectoryLink(relation="subagent", message_index=message_index, ref=ref))
    return bool(refs)


def _subagents(parent: Trajectory, document: Any, path: Path, diag: Diagnostics) -> list[Trajectory]:
    """The sub-agent trajectories ``parent`` references, each linked to it (and it to them)."""
    embedded = (
        {d.get("trajectory_id"): d for d in document.get("subagent_trajectories") or [] if isinstance(d, dict)}
        if isinstance(document, dict)
        else {}
    )
    children: list[Trajectory] = []
    for link in parent.links or []:
        ref = link.ref or {}
        child_doc, where = None, str(path)
        if ref.get("trajectory_id") in embedded:
            child_doc, where = embedded[ref["trajectory_id"]], f"{path}#subagent_trajectories[{ref['trajectory_id']}]"
        elif (
            isinstance(ref.get("trajectory_path"), str)
            and "://" not in ref["trajectory_path"]
            and not ref["trajectory_path"].startswith("/")
        ):
            file = path.parent / ref["trajectory_path"]
            if file.is_file():
                child_doc, where = read_json_document(file), str(file)
        if child_doc is None:
            diag.warn(None, f"sub-agent reference {ref} does not resolve to a trajectory in the document or beside {path.name}")
            continue
        child = convert(child_doc, where, diag)
        child.links = [
            *(child.links or []),
            TrajectoryLink(relation="parent", trajectory_id=parent.id, message_index=link.message_index, ref=ref, resolved=True),
        ]
        link.trajectory_id, link.resolved = child.id, True
        children.append(child)
    return children


def _referenced_files(path: Path) -> list[Path]:
    """Files a trajectory file references as its sub-agents (by ``trajectory_path``)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    if "subagent_trajectory_ref" not in text:
        return []
    try:
        document = json.loads(text)
    except ValueError:
        return []
    found: list[Path] = []
    for doc in document if isinstance(document, list) else [document]:
        for step in doc.get("steps") or [] if isinstance(doc, dict) else []:
            for result in ((step.get("observation") or {}).get("results") or []) if isinstance(step, dict) else []:
                for ref in (result.get("subagent_trajectory_ref") or []) if isinstance(result, dict) else []:
                    if isinstance(ref, dict) and isinstance(ref.get("trajectory_path"), str):
                        found.append((path.parent / ref["trajectory_path"]).resolve())
    return found


def _content(value: Any) -> tuple[str | None, list[Any] | None]:
    if isinstance(value, list):
        return text_of_parts(value), value
    return value, None


def _step_messages(step: Fields, links: list[TrajectoryLink], at: int, diag: Diagnostics) -> list[Message]:
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
        prompt_ids = metrics.get("prompt_token_ids", list)
        if prompt_ids is not None:
            extra["prompt_token_ids"] = prompt_ids
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
            linked = _links_of(result, links, at + len(messages))
            result_extra: dict[str, Any] = {
                k: v for k, v in result.data.items() if k not in ("content", "source_call_id", "subagent_trajectory_ref")
            }
            if result_parts is not None:
                result_extra["content_parts"] = result_parts
            result_extra["atif_observation_of"] = step.data.get("step_id")
            if call_id is not None:
                if call_id not in call_ids:
                    raise fail(step.path, None, f"{result.prefix}.source_call_id", f"{call_id!r} matches no tool_call_id of this step")
                messages.append(Message(role="tool", content=content, tool_call_id=call_id, timestamp=timestamp, extra=result_extra))
            elif linked and not content:
                continue  # only references to sub-agents: a link, not a message the model never saw
            else:
                messages.append(Message(role="user", content=content, timestamp=timestamp, extra=result_extra))
    return messages


def _float(value: int | float | None) -> float | None:
    return None if value is None else float(value)
