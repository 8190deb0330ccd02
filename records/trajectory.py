"""The trajectory format: one episode of one policy on one task.

Messages are shaped the way Hugging Face chat templates consume them (``role``,
``content``, ``reasoning_content``, ``tool_calls[].function.arguments`` as an object,
``tool`` messages with ``tool_call_id``) so that rendering needs no translation.
Every record keeps what it does not understand (pydantic ``extra="allow"``), so
reading and writing a file never drops a field.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, Literal

import msgspec
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = "1.0"
SCHEMA_MAJOR = 1


class Record(BaseModel):
    """Base for every record: unknown fields survive a round trip."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)


class ExitStatus(StrEnum):
    """Why an episode ended. The agent loop and every importer use this vocabulary."""

    submitted = "submitted"
    turns_exhausted = "turns_exhausted"
    tokens_exhausted = "tokens_exhausted"
    time_exhausted = "time_exhausted"
    cost_exhausted = "cost_exhausted"
    context_overflow = "context_overflow"
    format_error = "format_error"
    env_error = "env_error"
    policy_error = "policy_error"
    # Imported episodes sometimes end without saying why (a killed process, a UI session).
    aborted = "aborted"
    unknown = "unknown"


class FunctionCall(Record):
    name: str
    # Always an object: chat templates iterate over it. Text that was not a JSON
    # object when recorded is kept verbatim in ToolCall.raw_arguments.
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(Record):
    id: str
    # "function": JSON arguments. "custom": a freeform tool (Codex apply_patch) whose
    # single text input lives in arguments["input"].
    type: Literal["function", "custom"] = "function"
    function: FunctionCall
    raw_arguments: str | None = None
    # Whatever the source carried for this call that has no field here.
    extra: dict[str, Any] | None = None


class Usage(Record):
    input_tokens: int | None = None
    cached_input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    api_calls: int | None = None


Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(Record):
    role: Role
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # True where the policy produced this message: the only messages whose tokens
    # can ever carry loss.
    generated: bool = False
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    timestamp: str | None = None
    duration_ms: float | None = None
    usage: Usage | None = None
    # Tool results: exit code and wall time when the tool reported them.
    metadata: dict[str, Any] | None = None
    # Whatever the source carried for this message that has no field here.
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_role_fields(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls only belong on assistant messages, not on role {self.role!r}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self


class Policy(Record):
    name: str | None = None
    checkpoint: str | None = None
    step: int | None = None  # training iteration/step of the checkpoint that acted
    provider: str | None = None


class Outcome(Record):
    reward: float | None = None
    resolved: bool | None = None
    # Where the full verifier report lives (a path or an id), and its summary.
    verdict_ref: str | None = None
    verdict: dict[str, Any] | None = None
    # What the verifier found worth a look (tests or pytest config edited, test machinery
    # reached from source code): such a trajectory is not positive unless asked for.
    suspicious: list[str] | None = None


class ContextReset(Record):
    """From ``message_index`` on, the policy saw a rebuilt history (a Codex compaction, an
    ATIF compaction step): messages before it are not context for later model calls, except
    ``keep`` (indexes of earlier messages that stay; None: the leading system/developer
    instructions, which every call carries). ``replacement_known`` is False where the source
    says the context was rebuilt but not into what: turns after such a reset are never
    trained on."""

    message_index: int
    reason: str = "compacted"
    keep: list[int] | None = None
    replacement_known: bool = True


class TrajectoryLink(Record):
    """Another trajectory this one is tied to: a sub-agent it called (``subagent``), or the
    trajectory that called it (``parent``). ``ref`` is the source's own reference."""

    relation: Literal["subagent", "parent"]
    trajectory_id: str | None = None  # the linked trajectory's id, once imported
    message_index: int | None = None  # where in this trajectory the link belongs
    ref: dict[str, Any] | None = None
    resolved: bool = False


class Source(Record):
    format: str
    format_version: str | None = None
    path: str | None = None
    # Top-level fields and records of the input that have no field here.
    meta: dict[str, Any] | None = None
    records: list[dict[str, Any]] | None = None
    warnings: list[str] | None = None
    # content_id() at import: tells a re-import of the same episode from other content
    # that reuses a source id.
    content_hash: str | None = None


class Trajectory(Record):
    schema_version: str = SCHEMA_VERSION
    id: str = ""
    task_id: str | None = None
    policy: Policy = Field(default_factory=Policy)
    attempt: int | None = None
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    final_patch: str | None = None
    exit_status: ExitStatus = ExitStatus.unknown
    outcome: Outcome | None = None
    usage: Usage | None = None
    context_resets: list[ContextReset] | None = None
    links: list[TrajectoryLink] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    source: Source | None = None

    @model_validator(mode="after")
    def _check(self) -> Trajectory:
        major = self.schema_version.split(".", 1)[0]
        if major != str(SCHEMA_MAJOR):
            raise ValueError(
                f"schema_version {self.schema_version!r} has major version {major}; this relearn reads major version {SCHEMA_MAJOR}"
            )
        if not self.id:
            self.id = content_id(self)
        return self


# What an episode is, for its id: serialised in field order, which the model fixes.
ID_FIELDS: dict[str, Any] = {
    "task_id": True,
    "policy": True,
    "attempt": True,
    "messages": {"__all__": {"role", "content", "reasoning_content", "tool_calls", "tool_call_id"}},
}


def content_id(trajectory: Trajectory) -> str:
    """A stable id from what the episode is: task, policy, attempt and messages.

    Independent of where the file lies and of fields that describe the import, so the
    same episode imported twice gets the same id.
    """
    basis = trajectory.model_dump_json(include=ID_FIELDS, exclude_none=True)
    digest = hashlib.sha256(basis.encode()).hexdigest()
    return f"t-{digest[:24]}"


# msgspec writes every JSON value as pydantic does (the same shortest float digits, escapes,
# big integers, key order, null for NaN and infinities) except floats of magnitude 1e16 and
# up: ``1e16`` where pydantic writes ``1e+16``. Smaller ones come out alike, ``1e-7`` included.
WIDE_FLOAT = 1e16


class WideFloat(float):
    """A float that msgspec would write otherwise than pydantic (see ``WIDE_FLOAT``), so marked
    that ``dump_record`` writes it pydantic's way. It is a float in every other respect."""

    __slots__ = ()


def is_wide(value: float) -> bool:
    """A float that ``dump_record`` needs marked (NaN and the infinities among them)."""
    return not -WIDE_FLOAT < value < WIDE_FLOAT


def mark_wide_floats(value: Any) -> Any:
    """``value``, a JSON value, with each float that ``is_wide`` made a ``WideFloat`` (in place in
    its objects and arrays). A walk over every value: for the records that hold such a float."""
    if type(value) is float:
        return WideFloat(value) if is_wide(value) else value
    if type(value) is not dict and type(value) is not list:
        return value
    pending = [value]
    while pending:
        container = pending.pop()
        slots = container.items() if type(container) is dict else enumerate(container)
        for key, item in list(slots):
            if type(item) is float:
                if is_wide(item):
                    container[key] = WideFloat(item)
            elif type(item) is dict or type(item) is list:
                pending.append(item)
    return value


def _write_wide(value: Any) -> msgspec.Raw:
    if type(value) is WideFloat:
        return msgspec.Raw(pydantic_core.to_json(float(value), inf_nan_mode="null"))
    raise TypeError(f"not JSON: {type(value).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_write_wide)


def dump_record(record: dict[str, Any] | msgspec.Struct) -> bytes:
    """A trajectory held as its pool line's JSON object (fields in model order, None left
    out), as the bytes ``model_dump_json`` writes for it.

    msgspec writes it, twice as fast as pydantic, which is exact where every float that
    ``is_wide`` in the record is a ``WideFloat`` (``mark_wide_floats``). What msgspec cannot
    write (a lone surrogate) goes to pydantic, to fail as it fails there. ``record`` may also
    be a content id's basis (``_IdBasis``)."""
    try:
        return _ENCODER.encode(record)
    except (TypeError, ValueError):
        return pydantic_core.to_json(record, inf_nan_mode="null", fallback=_struct_fields)


def _struct_fields(value: msgspec.Struct) -> dict[str, Any]:
    return {field: item for field in value.__struct_fields__ if (item := getattr(value, field)) is not None}


class _IdMessage(msgspec.Struct, omit_defaults=True):
    """A message's fields in ``ID_FIELDS``, in the model's order (None left out)."""

    role: Any = None
    content: Any = None
    reasoning_content: Any = None
    tool_calls: Any = None
    tool_call_id: Any = None


class _IdBasis(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What ``content_id`` serialises, in the model's order: msgspec projects a record onto it
    in one call (a key it has no field for is skipped, not read)."""

    task_id: Any = None
    policy: Any = None
    attempt: Any = None
    messages: list[_IdMessage]


def record_content_id(record: dict[str, Any]) -> str:
    """``content_id`` of a trajectory held as its pool line's JSON object."""
    digest = hashlib.sha256(dump_record(msgspec.convert(record, _IdBasis))).hexdigest()
    return f"t-{digest[:24]}"


def is_verified_positive(trajectory: Trajectory, *, allow_suspicious: bool = False) -> bool:
    """The verifier said this episode succeeded: resolved, or a positive reward when the
    verifier gives only a reward. What review and the mask compiler select on. A success
    the verifier found suspicious counts only with ``allow_suspicious``."""
    outcome = trajectory.outcome
    if outcome is None:
        return False
    if outcome.suspicious and not allow_suspicious:
        return False
    if outcome.resolved is not None:
        return bool(outcome.resolved)
    return (outcome.reward or 0.0) > 0.0


def tool_call_pairs(messages: list[Message]) -> tuple[dict[str, int], dict[str, int]]:
    """Map each tool-call id to the index of the assistant message that made it, and
    each tool result's id to its message index."""
    calls: dict[str, int] = {}
    results: dict[str, int] = {}
    for i, message in enumerate(messages):
        for call in message.tool_calls or []:
            calls[call.id] = i
        if message.role == "tool" and message.tool_call_id:
            results[message.tool_call_id] = i
    return calls, results
