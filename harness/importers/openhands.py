"""OpenHands (V0) trajectories: saved event streams, evaluation ``output.jsonl``, and the
older flat serialisation.

Three layouts, one event vocabulary:
- a saved trajectory (``--save-trajectory-path``): a JSON array of events, each with ``id``,
  ``timestamp``, ``source`` and either ``action`` + ``args`` or ``observation`` + ``content``
  + ``extras`` + ``cause`` (the id of the action it answers);
- an evaluation ``output.jsonl``: one record per instance (``instance_id``, ``instruction``,
  ``metadata``, ``history`` = the events, ``test_result.git_patch``, ``metrics``, ``error``,
  ``instance``); its event 0 is ``action: "system"`` with the system prompt and ``tools``;
- the older flat form (resolver output): events without ``id``/``source``, each action's
  arguments at the top level of the event; ``issue``, ``git_patch``, ``success``.

The model's own messages are rebuilt from ``tool_call_metadata.model_response`` where the
event has it (the litellm response: what the model generated, every tool call of that
response included, with its usage); several actions cut from one response become one
assistant message. Without it, an action becomes an assistant message from its ``thought``
and a tool call rebuilt from its arguments (``extra.rebuilt: true`` says so). Observations
become ``tool`` messages answering their action's call (by ``cause``, or, in the flat form,
the action just before). ``finish`` is never answered: OpenHands ends on it.

Events that the model never saw as a message (``agent_state_changed``, ``null``, recall and
condensation bookkeeping, commands a user typed) are kept verbatim under ``source.records``;
a condensation is also a context reset whose replacement is unknown, so later turns are
not trained on. Each action event is kept on its assistant message (``extra.openhands_events``)
and each observation's fields on its message; an observation's ``tool_call_metadata`` that
only repeats its action's is dropped, and ``source.meta.dropped`` says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.importers.base import (
    MODELS,
    Diagnostics,
    Fields,
    ImportResult,
    Kinds,
    fail,
    flag,
    imported_outcome,
    number,
    openai_tool_call,
    read_guarded,
    read_json_document,
    text_of_parts,
)
from harness.importers.rows import JSONL_SUFFIXES, MARKED, Row, RowRecord, plain_or_model, read_rows
from records.pools import RecordError
from records.trajectory import ContextReset, ExitStatus, Message, Policy, ToolCall, Trajectory, Usage

FORMAT = "openhands"

EVENT_FIELDS = {
    "id",
    "timestamp",
    "source",
    "message",
    "action",
    "args",
    "observation",
    "content",
    "extras",
    "cause",
    "tool_call_metadata",
    "timeout",
    "llm_metrics",
    "success",
}
# A flat (legacy) action carries these beside its arguments; they are not arguments.
FLAT_ACTION_FIELDS = {"action", "cause", "id", "timestamp", "source", "message", "tool_call_metadata"}
# Runtime bookkeeping inside an action's args: the model wrote none of it.
BOOKKEEPING_ARGS = {
    "thought",
    "impl_source",
    "translated_ipython_code",
    "is_confirmed",
    "confirmation_state",
    "action_risk",
    "security_risk",
    "kernel_init_code",
    "keep_prompt",
    "hidden",
    "blocking",
    "wait_for_response",
    "image_urls",
    "images_urls",
}
# Actions no model call produced, and observations the model never read as a message.
BOOKKEEPING_ACTIONS = {"change_agent_state", "recall", "null", "condensation", "condensation_request"}
BOOKKEEPING_OBSERVATIONS = {"agent_state_changed", "null", "recall", "condense", "user_rejected"}
TOOL_ACTIONS = {
    "run",
    "run_ipython",
    "read",
    "write",
    "edit",
    "browse",
    "browse_interactive",
    "finish",
    "reject",
    "think",
    "delegate",
    "call_tool_mcp",
    "mcp",
    "task_tracking",
}
RECORD_FIELDS = {
    "instance_id",
    "instruction",
    "metadata",
    "history",
    "test_result",
    "metrics",
    "error",
    "instance",
    "report",
    "resolved",
    "llm_completions",
    # the flat resolver output
    "issue",
    "issue_type",
    "git_patch",
    "success",
    "comment_success",
    "result_explanation",
    "success_explanation",
    "base_commit",
}
ERROR_STATUS = (
    ("maximum iteration", ExitStatus.turns_exhausted),
    ("max iteration", ExitStatus.turns_exhausted),
    ("budget", ExitStatus.cost_exhausted),
    ("context window", ExitStatus.context_overflow),
    ("contextwindowexceeded", ExitStatus.context_overflow),
    ("stuck", ExitStatus.aborted),
)


def discover(root: Path) -> list[Path]:
    """``output*.jsonl`` records, and ``.json`` files holding an array (saved event streams);
    an evaluation folder's ``metadata.json`` and per-call completion dumps are objects."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.name
        if name.endswith(JSONL_SUFFIXES) and name.startswith("output"):
            found.append(path)
        elif name.endswith(".json") and _starts_with(path, b"["):
            found.append(path)
    return found


def _starts_with(path: Path, byte: bytes) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(64).lstrip()[:1] == byte
    except OSError:
        return False


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    if path.name.endswith(".json"):
        try:
            document = read_json_document(path)
        except RecordError:  # the row reader below rejects it, with its location
            document = None
        if (
            isinstance(document, list)
            and document
            and isinstance(document[0], dict)
            and ("action" in document[0] or "observation" in document[0])
        ):
            return read_guarded(path, lambda diagnostics: [convert_events(document, str(path), None, "", diagnostics)])
    return read_rows(path, lambda row, diagnostics: convert_row(row, str(path), diagnostics), empty="no records", decoder=MARKED)


def convert_events(events: list[Any], path: str, line: int | None, prefix: str, diag: Diagnostics) -> Trajectory:
    """A saved trajectory: the events alone."""
    builder = _Events(path, line, prefix, diag)
    builder.run(events)
    return builder.trajectory(meta={}, task_id=None)


def convert_row(row: Row, path: str, diag: Diagnostics) -> RowRecord | Trajectory:
    """The record as its pool line's JSON object, built by ``convert_record`` without the models
    where every value is one they would keep (``rows.plain_or_model``); else its Trajectory."""
    return plain_or_model(row, diag, lambda kinds: convert_record(row, path, diag, kinds))


def convert_record(row: Row, path: str, diag: Diagnostics, kinds: Kinds = MODELS) -> Trajectory:
    """One evaluation (or resolver) record: its events, and what the run says around them; built
    with ``kinds``, the models (the reference) or the plain records ``convert_row`` writes."""
    top = Fields(row.data, path, row.line, row.prefix)
    history = top.list("history", required=True)
    if not history:
        raise fail(path, row.line, top._name("history"), "empty: nothing to import")
    builder = _Events(path, row.line, top._name("history"), diag, kinds)
    builder.run(history)
    for key in top.data:
        if key not in RECORD_FIELDS:
            diag.unknown_kind(row.line, f"record field {key!r}")
    meta = {k: v for k, v in top.data.items() if k != "history"}

    metadata = top.obj("metadata")
    llm = metadata.obj("llm_config") if metadata is not None else None
    if llm is not None and llm.str("model"):
        builder.policy.name = llm.str("model")
    test_result = top.obj("test_result")
    patch = top.str("git_patch")
    if test_result is not None:
        patch = test_result.str("git_patch") or patch
    task_id = top.str("instance_id")
    issue = top.obj("issue")
    if task_id is None and issue is not None and issue.str("repo"):
        task_id = f"{issue.str('owner') or ''}/{issue.str('repo')}#{issue.data.get('number')}".lstrip("/")

    error = top.str("error")
    if error and not builder.finished:
        lowered = error.lower()
        builder.exit_status = next((status for needle, status in ERROR_STATUS if needle in lowered), ExitStatus.env_error)
    builder.usage = _record_usage(top, builder)

    resolved, details = _resolved(top, test_result)
    trajectory = builder.trajectory(meta=meta, task_id=task_id)
    trajectory.final_patch = patch
    trajectory.outcome = imported_outcome(FORMAT, resolved=resolved, details=details, kinds=kinds)
    return trajectory


def _resolved(top: Fields, test_result: Fields | None) -> tuple[bool | None, dict[str, Any] | None]:
    """The run's own grade: an evaluation report's ``resolved``, else the resolver's ``success``
    (an LLM's judgement of the result, said so in the details)."""
    report = test_result.obj("report") if test_result is not None else None
    for source, value in (
        ("test_result.report.resolved", report.data.get("resolved") if report else None),
        ("resolved", top.data.get("resolved")),
    ):
        if flag(value) is not None:
            return flag(value), {"field": source, **({"report": report.data} if report else {})}
    if flag(top.data.get("success")) is not None:
        return flag(top.data["success"]), {"field": "success", "graded_by": "the resolver's success check, not tests"}
    return None, None


def _record_usage(top: Fields, builder: _Events) -> Usage | None:
    metrics = top.obj("metrics")
    usage = builder.usage
    if metrics is None:
        return usage
    cost = number(metrics.data.get("accumulated_cost"))
    accumulated = metrics.obj("accumulated_token_usage")
    costs = metrics.list("costs")
    if accumulated is not None:
        usage = builder.kinds.usage(
            input_tokens=accumulated.get("prompt_tokens", int),
            output_tokens=accumulated.get("completion_tokens", int),
            cached_input_tokens=accumulated.get("cache_read_tokens", int),
            api_calls=usage.api_calls if usage is not None else None,
        )
    if cost is not None or costs:
        usage = usage or builder.kinds.usage()
        usage.cost_usd = cost
        usage.api_calls = usage.api_calls or (len(costs) if costs else None)
    return usage


class _Events:
    """Walks one event list into messages."""

    def __init__(self, path: str, line: int | None, prefix: str, diag: Diagnostics, kinds: Kinds = MODELS) -> None:
        self.path = path
        self.line = line
        self.prefix = prefix
        self.diag = diag
        self.kinds = kinds
        self.messages: list[Message] = []
        self.records: list[dict[str, Any]] = []
        self.resets: list[ContextReset] = []
        self.policy: Policy = kinds.policy()
        self.tools: list[dict[str, Any]] | None = None
        self.version: str | None = None
        self.finished = False
        self.exit_status = ExitStatus.unknown
        self.usage: Usage | None = None
        self.dropped: set[str] = set()
        self.responses: dict[str, int] = {}  # model response id -> its assistant message
        self.response_usage: dict[str, Usage] = {}
        self.call_of_action: dict[Any, str] = {}  # action event id -> its tool call id
        self.metadata_of_call: dict[str, dict[str, Any]] = {}
        self.open_calls: dict[str, str] = {}  # call id -> tool name, in the order made
        self.answered: set[str] = set()
        self.timestamps: list[str] = []
        self.flat = False

    # ---- driving ------------------------------------------------------------

    def run(self, events: list[Any]) -> None:
        for index, raw in enumerate(events):
            event = Fields(raw, self.path, self.line, f"{self.prefix}[{index}]")
            timestamp = event.str("timestamp")
            if timestamp is not None:
                self.timestamps.append(timestamp)
            if not (event.data.keys() <= EVENT_FIELDS or self._is_flat(event)):
                for key in event.data:
                    if key not in EVENT_FIELDS:
                        self.diag.unknown_kind(self.line, f"event field {key!r}")
            if "action" in event.data:
                self.action(index, event)
            elif "observation" in event.data:
                self.observation(index, event)
            else:
                self.diag.unknown_kind(self.line, "event without action or observation")
                self.keep(index, raw)
        if not self.messages:
            raise fail(self.path, self.line, self.prefix or None, "no event maps to a message: not an OpenHands trajectory")
        self.unanswered()
        self.totals()

    def _is_flat(self, event: Fields) -> bool:
        """In the flat form an event's arguments sit beside ``action``: not unknown fields."""
        return "args" not in event.data and "extras" not in event.data

    def keep(self, index: int, event: Any) -> None:
        self.records.append({"event_index": index, "at_message": len(self.messages), "record": event})

    # ---- actions --------------------------------------------------------------

    def action(self, index: int, event: Fields) -> None:
        kind = event.str("action", required=True) or ""
        args = self.args(event)
        source = event.str("source")
        if kind == "system":
            self.system(event, args)
        elif kind == "message":
            self.message_action(index, event, args, source)
        elif kind in BOOKKEEPING_ACTIONS:
            self.keep(index, event.data)
            if kind == "condensation":
                # The condenser rewrote what later calls see, and the events do not say into what.
                self.resets.append(
                    self.kinds.context_reset(message_index=len(self.messages), reason="openhands:condensation", replacement_known=False)
                )
                self.diag.warn(self.line, f"{event.prefix}: a condensation: what later turns saw is unknown, and they are not trained on")
        elif source == "user":
            # A command the user ran in the session (a GUI terminal): not the model's action.
            self.keep(index, event.data)
        else:
            if kind not in TOOL_ACTIONS:
                self.diag.unknown_kind(self.line, f"action {kind!r}")
            self.tool_action(index, event, kind, args)

    def args(self, event: Fields) -> dict[str, Any]:
        if "args" in event.data:
            return event.get("args", dict, default={})
        self.flat = True
        return {k: v for k, v in event.data.items() if k not in FLAT_ACTION_FIELDS}

    def system(self, event: Fields, args: dict[str, Any]) -> None:
        fields = Fields(args, self.path, self.line, f"{event.prefix}.args")
        tools = fields.get("tools", list)
        if tools is not None:
            self.tools = tools
        self.version = fields.str("openhands_version") or self.version
        extra = {"openhands_event": _without(event.data, "args"), "args": _without(args, "content", "tools")}
        self.messages.append(
            self.kinds.message(
                role="system", content=fields.str("content", default="") or "", timestamp=event.str("timestamp"), extra=extra
            )
        )

    def message_action(self, index: int, event: Fields, args: dict[str, Any], source: str | None) -> None:
        fields = Fields(args, self.path, self.line, f"{event.prefix}.args" if "args" in event.data else event.prefix)
        content = fields.get("content", (str, list), default="")
        parts = content if isinstance(content, list) else None
        text = text_of_parts(content) if parts is not None else content
        if source is None:  # the flat form names no source: a message the agent waits on is the agent's
            source = "agent" if args.get("wait_for_response") is True else "user"
        if source == "agent":
            message = self.assistant(index, event, "message", args)
            if message.content is None:
                message.content = text
            return
        extra: dict[str, Any] = {"openhands_event": _without(event.data, "args") if "args" in event.data else {"action": "message"}}
        leftover = _without(args, "content")
        if leftover:
            extra["args"] = leftover
        if parts is not None:
            extra["content_parts"] = parts
        self.messages.append(self.kinds.message(role="user", content=text, timestamp=event.str("timestamp"), extra=extra))

    def tool_action(self, index: int, event: Fields, kind: str, args: dict[str, Any]) -> None:
        message = self.assistant(index, event, kind, args)
        tcm = event.obj("tool_call_metadata")
        call_id = tcm.str("tool_call_id") if tcm is not None else None
        known = {c.id for c in message.tool_calls or []}
        if call_id is None or call_id not in known:
            call = self.rebuilt_call(index, event, kind, args, call_id, tcm)
            message.tool_calls = [*(message.tool_calls or []), call]
            call_id = call.id
        name = next(c.function.name for c in message.tool_calls or [] if c.id == call_id)
        self.call_of_action[event.data.get("id", index)] = call_id
        if tcm is not None:
            self.metadata_of_call[call_id] = tcm.data
        if call_id in self.open_calls or call_id in self.answered:
            raise fail(self.path, self.line, f"{event.prefix}.tool_call_metadata.tool_call_id", f"tool call {call_id!r} made twice")
        self.open_calls[call_id] = name
        if kind == "finish":
            self.finished = True
            self.exit_status = ExitStatus.submitted

    def rebuilt_call(self, index: int, event: Fields, kind: str, args: dict[str, Any], call_id: str | None, tcm: Fields | None) -> ToolCall:
        """A call from the action's own arguments: the model's wording is not in the file."""
        name = (tcm.str("function_name") if tcm is not None else None) or kind
        arguments = {k: v for k, v in args.items() if k not in BOOKKEEPING_ARGS}
        return self.kinds.tool_call(
            id=call_id or f"openhands-{event.data.get('id', index)}",
            function=self.kinds.function_call(name=name, arguments=arguments),
            extra={"rebuilt": True, "openhands_action": kind},
        )

    def assistant(self, index: int, event: Fields, kind: str, args: dict[str, Any]) -> Message:
        """The assistant message an agent action belongs to: the one already made from its
        model response, else a new one (from the response, or from the action itself)."""
        tcm = event.obj("tool_call_metadata")
        response = tcm.obj("model_response") if tcm is not None else None
        response_id = response.str("id") if response is not None else None
        stored = _without(event.data, "tool_call_metadata")
        if tcm is not None:
            stored["tool_call_metadata"] = _without(tcm.data, "model_response")
        if response_id is not None and response_id in self.responses:
            message = self.messages[self.responses[response_id]]
            message.extra = {**(message.extra or {}), "openhands_events": [*(message.extra or {}).get("openhands_events", []), stored]}
            return message
        if response is not None and response.list("choices"):
            message = self.from_response(response)
        else:
            thought = args.get("thought") if isinstance(args.get("thought"), str) else None
            message = self.kinds.message(role="assistant", content=thought or None, generated=True)
            if kind != "message":
                message.extra = {"rebuilt": True}
        message.timestamp = event.str("timestamp")
        message.extra = {**(message.extra or {}), "openhands_events": [stored]}
        if response_id is not None:
            self.responses[response_id] = len(self.messages)
            if message.usage is not None:
                self.response_usage[response_id] = message.usage
        if self.policy.name is None and response is not None:
            self.policy.name = response.str("model")
        self.messages.append(message)
        return message

    def from_response(self, response: Fields) -> Message:
        """What the model generated, from its litellm response."""
        choice = next(response.items("choices"))
        body = choice.obj("message", required=True)
        assert body is not None
        content = body.get("content", (str, list))
        extra: dict[str, Any] = {"model_response": response.data}
        if isinstance(content, list):
            content = text_of_parts(content)
        calls = [openai_tool_call(call, self.diag, self.kinds) for call in body.items("tool_calls")]
        message = self.kinds.message(
            role="assistant",
            content=content,
            reasoning_content=body.str("reasoning_content"),
            tool_calls=calls or None,
            generated=True,
            usage=_usage(response.obj("usage"), self.kinds),
            extra=extra,
        )
        # vLLM returns the sampled ids when asked (return_token_ids); keep them for the mask check.
        token_ids = choice.get("token_ids", list)
        if token_ids:
            message.token_ids = token_ids
        logprobs = choice.obj("logprobs")
        if logprobs is not None and logprobs.list("content"):
            message.logprobs = [float(item.get("logprob", 0.0)) for item in logprobs.list("content") if isinstance(item, dict)]
        return message

    # ---- observations -----------------------------------------------------------

    def observation(self, index: int, event: Fields) -> None:
        kind = event.str("observation", required=True) or ""
        if kind in BOOKKEEPING_OBSERVATIONS:
            self.keep(index, event.data)
            if kind == "agent_state_changed":
                self.agent_state(event)
            return
        call_id = self.call_answered(event)
        content = self.observation_text(event, kind)
        extras = event.get("extras", dict, default={})
        metadata = extras.get("metadata") if isinstance(extras.get("metadata"), dict) else {}
        exit_code = metadata.get("exit_code", event.data.get("exit_code"))
        stored = _without(event.data, "content", "tool_call_metadata")
        tcm = event.get("tool_call_metadata", dict)
        if tcm is not None:
            if call_id is not None and tcm == self.metadata_of_call.get(call_id):
                self.dropped.add("observation tool_call_metadata (a copy of its action's)")
            else:
                stored["tool_call_metadata"] = tcm
        extra = {"openhands_event": stored}
        meta = {"exit_code": exit_code} if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
        timestamp = event.str("timestamp")
        if call_id is not None:
            self.messages.append(
                self.kinds.message(
                    role="tool",
                    content=content,
                    tool_call_id=call_id,
                    name=self.open_calls.pop(call_id),
                    timestamp=timestamp,
                    metadata=meta,
                    extra=extra,
                )
            )
            self.answered.add(call_id)
        elif content:
            # No call it answers (an error the agent loop reported, a text-protocol turn): the
            # model read it as the next user message.
            self.messages.append(self.kinds.message(role="user", content=content, timestamp=timestamp, metadata=meta, extra=extra))
        else:
            self.keep(index, event.data)

    def call_answered(self, event: Fields) -> str | None:
        """The open call this observation answers: by its tool call id, by ``cause``, or (the
        flat form, which has neither) the latest open call."""
        tcm = event.obj("tool_call_metadata")
        call_id = tcm.str("tool_call_id") if tcm is not None else None
        if call_id is None and "cause" in event.data:
            call_id = self.call_of_action.get(event.data["cause"])
        if call_id is None and self.flat and "cause" not in event.data and self.open_calls:
            call_id = next(reversed(self.open_calls))
        if call_id is None:
            return None
        if call_id not in self.open_calls:
            why = "answered twice" if call_id in self.answered else "matches no earlier action"
            self.diag.warn(self.line, f"{event.prefix}: observation for call {call_id!r} {why}; kept as the next user message")
            return None
        return call_id

    def observation_text(self, event: Fields, kind: str) -> str:
        content = event.get("content", (str, list), default="")
        text = text_of_parts(content) if isinstance(content, list) else content
        extras = event.get("extras", dict, default={})
        metadata = extras.get("metadata")
        if kind == "run" and isinstance(metadata, dict):
            # What the agent was shown: OpenHands wraps command output in the metadata's prefix
            # and suffix ("[The command completed with exit code 0.]").
            prefix, suffix = metadata.get("prefix"), metadata.get("suffix")
            text = f"{prefix if isinstance(prefix, str) else ''}{text}{suffix if isinstance(suffix, str) else ''}"
        return text

    def agent_state(self, event: Fields) -> None:
        extras = event.get("extras", dict, default={})
        state = extras.get("agent_state")
        if self.finished:
            return
        if state == "error":
            self.exit_status = ExitStatus.env_error
        elif state in ("stopped", "paused", "awaiting_user_input", "rejected"):
            self.exit_status = ExitStatus.aborted
        elif state == "finished":
            self.exit_status = ExitStatus.submitted

    # ---- the end --------------------------------------------------------------------

    def unanswered(self) -> None:
        for call_id, name in self.open_calls.items():
            if name != "finish":  # OpenHands never answers finish
                self.diag.warn(self.line, f"call {call_id!r} ({name}) has no observation: the run ended before it was answered")

    def totals(self) -> None:
        usages = list(self.response_usage.values())
        if not usages:
            return

        def total(key: str) -> int | None:
            values = [getattr(u, key) for u in usages if getattr(u, key) is not None]
            return sum(values) if values else None

        self.usage = self.kinds.usage(
            input_tokens=total("input_tokens"),
            output_tokens=total("output_tokens"),
            cached_input_tokens=total("cached_input_tokens"),
            reasoning_output_tokens=total("reasoning_output_tokens"),
            total_tokens=total("total_tokens"),
            api_calls=len(self.responses),
        )

    def trajectory(self, *, meta: dict[str, Any], task_id: str | None) -> Trajectory:
        meta = {"layout": "flat" if self.flat else "events", **meta}
        if self.dropped:
            meta["dropped"] = sorted(self.dropped)
        return self.kinds.trajectory(
            task_id=task_id,
            policy=self.policy,
            messages=self.messages,
            tools=self.tools,
            exit_status=self.exit_status,
            usage=self.usage,
            context_resets=self.resets or None,
            started_at=self.timestamps[0] if self.timestamps else None,
            finished_at=self.timestamps[-1] if self.timestamps else None,
            source=self.kinds.source(
                format=FORMAT,
                format_version=self.version,
                path=self.path,
                meta=meta,
                records=self.records or None,
                warnings=self.diag.warnings or None,
            ),
        )


def _usage(fields: Fields | None, kinds: Kinds) -> Usage | None:
    """A litellm (OpenAI-shaped) usage block; Anthropic's cache reads count as cached input."""
    if fields is None:
        return None
    prompt_details = fields.obj("prompt_tokens_details")
    completion_details = fields.obj("completion_tokens_details")
    cached = prompt_details.get("cached_tokens", int) if prompt_details is not None else None
    cached = cached or fields.get("cache_read_input_tokens", int) or cached
    return kinds.usage(
        input_tokens=fields.get("prompt_tokens", int),
        output_tokens=fields.get("completion_tokens", int),
        total_tokens=fields.get("total_tokens", int),
        cached_input_tokens=cached,
        reasoning_output_tokens=completion_details.get("reasoning_tokens", int) if completion_details is not None else None,
    )


def _without(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in keys}
