"""What every importer shares: located errors, per-file diagnostics, field checks."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec
from pydantic import ValidationError

from records.pools import RecordError, json_problem, loads, validation_error
from records.trajectory import (
    SCHEMA_VERSION,
    ContextReset,
    ExitStatus,
    FunctionCall,
    Message,
    Outcome,
    Policy,
    Record,
    Source,
    ToolCall,
    Trajectory,
    Usage,
    WideFloat,
    is_wide,
)


@dataclass
class Diagnostics:
    """What one input file taught us besides its trajectory."""

    path: str
    warnings: list[str] = field(default_factory=list)
    unknown: Counter[str] = field(default_factory=Counter)

    def warn(self, line: int | None, message: str) -> None:
        where = self.path if line is None else f"{self.path}:{line}"
        self.warnings.append(f"{where}: {message}")

    def unknown_kind(self, line: int | None, kind: str) -> None:
        """An unknown record type or field: kept under ``source``, counted, reported."""
        if not self.unknown[kind]:
            self.warn(line, f"unknown {kind} (kept under source)")
        self.unknown[kind] += 1

    def unknown_kinds(self, line: int | None, kinds: list[str]) -> None:
        """``unknown_kind`` of each of ``kinds``, all different, in order: for a row's many."""
        for kind in kinds:
            if kind not in self.unknown:
                self.warn(line, f"unknown {kind} (kept under source)")
        self.unknown.update(kinds)


class Importer(Protocol):
    """What ``FORMATS`` holds: an importer module, or an object configured for one run
    (``chat`` with its column names) that offers the same two functions."""

    def discover(self, root: Path) -> list[Path]: ...

    def read(self, path: Path, *, salvage: bool = False) -> Iterable[ImportResult]: ...


@dataclass
class ImportResult:
    """One trajectory read from ``path``, or the error that rejected it."""

    path: str
    built: Trajectory | None
    error: RecordError | None
    diagnostics: Diagnostics
    # The trajectory as its pool line's JSON object (fields in model order, None left out),
    # where the importer builds it so (codex, for speed): valid by construction, and made a
    # Trajectory only when someone asks for one.
    record: dict[str, Any] | None = None
    # The record's content id (``records.trajectory.record_content_id``) where the importer has
    # computed it already, for the id of a row that has none of its own: not computed twice.
    content_hash: str | None = None
    # Why the input holds no trajectory to import, where that is no error (a Harbor trial of
    # the oracle agent, or one that never finished): counted by reason, never imported.
    skipped: str | None = None

    @property
    def trajectory(self) -> Trajectory | None:
        if self.built is None and self.record is not None:
            self.built = Trajectory.model_validate(self.record)
        return self.built


def fail(path: str | Path, line: int | None, field_name: str | None, message: str) -> RecordError:
    return RecordError(str(path), line, field_name, message)


class Fields:
    """Typed access to one JSON object, raising located errors.

    ``prefix`` is the object's position in its record (``payload``, ``messages[2]``),
    so an error names the exact field.
    """

    def __init__(self, data: Any, path: str, line: int | None, prefix: str) -> None:
        if not isinstance(data, dict):
            raise fail(path, line, prefix or None, f"expected an object, got {_kind(data)}")
        self.data = data
        self.path = path
        self.line = line
        self.prefix = prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, types: type | tuple[type, ...], *, required: bool = False, default: Any = None) -> Any:
        value = self.data.get(key)
        if type(value) is types:  # the common case, checked first: importers call this per field
            return value
        if value is None:
            if required:
                raise fail(self.path, self.line, self._name(key), "missing")
            return default
        # JSON true/false must not pass as numbers.
        if isinstance(value, bool) and bool not in _as_tuple(types):
            raise fail(self.path, self.line, self._name(key), f"expected {_names(types)}, got boolean")
        if not isinstance(value, types):
            raise fail(self.path, self.line, self._name(key), f"expected {_names(types)}, got {_kind(value)}")
        return value

    def str(self, key: str, *, required: bool = False, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if type(value) is str:
            return value
        if value is None and not required:  # the other common case: the key is absent
            return default
        return self.get(key, str, required=required, default=default)

    def obj(self, key: str, *, required: bool = False) -> Fields | None:
        value = self.data.get(key)
        if value is None and not required:
            return None
        value = self.get(key, dict, required=required)
        return None if value is None else Fields(value, self.path, self.line, self._name(key))

    def list(self, key: str, *, required: bool = False) -> list[Any]:
        return self.get(key, list, required=required, default=[])

    def items(self, key: str, *, required: bool = False) -> Iterator[Fields]:
        for index, item in enumerate(self.list(key, required=required)):
            yield Fields(item, self.path, self.line, f"{self._name(key)}[{index}]")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(_kind_name(t) for t in _as_tuple(types))


_JSON_NAMES = {str: "string", int: "integer", float: "number", dict: "object", list: "array", bool: "boolean"}


def _kind_name(t: type) -> str:
    return _JSON_NAMES.get(t, t.__name__)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):  # a WideFloat too (rows decoded with their wide floats marked)
        return "number"
    return _kind_name(type(value))


def parse_arguments(text: str, decoder: msgspec.json.Decoder | None = None) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments arrive as a JSON string; templates need an object.

    Returns ``(arguments, raw)``: ``raw`` is the original text when it was not a JSON
    object, so nothing the model wrote is lost. ``decoder``: one with a ``float_hook`` (an
    importer that must see every float), as ``records.pools.loads`` takes.
    """
    try:
        value = (loads(text) if decoder is None else loads(text, decoder)) if text.strip() else {}
    except json.JSONDecodeError:
        return {}, text
    if isinstance(value, dict):
        return value, None
    return {}, text


def text_of_parts(parts: list[Any]) -> str:
    """Join the text of OpenAI/Anthropic-style content parts."""
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts)


def read_json_document(path: Path) -> Any:
    """Read a whole-file JSON document with a located error on failure."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise fail(path, None, None, f"cannot read: {exc.strerror}") from None
    if not raw.strip():
        raise fail(path, None, None, "empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(path, None, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        line, message = json_problem(text)
        raise fail(path, line, None, message) from None


def openai_tool_call(call: Fields, diag: Diagnostics, kinds: Kinds | None = None) -> ToolCall:
    """An OpenAI-format ``{id, type, function: {name, arguments}}`` tool call, built with
    ``kinds`` (the models when None)."""
    kinds = kinds or MODELS
    function = call.obj("function", required=True)
    assert function is not None
    arguments_raw = function.get("arguments", (str, dict), default="")
    raw = None
    if isinstance(arguments_raw, str):
        arguments, raw = parse_arguments(arguments_raw)
        if raw is not None:
            diag.warn(call.line, f"{function.prefix}.arguments: not a JSON object (kept verbatim in raw_arguments)")
    else:
        arguments = arguments_raw
    extra = {k: v for k, v in call.data.items() if k not in ("id", "type", "function")}
    return kinds.tool_call(
        id=call.str("id", required=True) or "",
        function=kinds.function_call(name=function.str("name", required=True) or "", arguments=arguments),
        raw_arguments=raw,
        extra=extra or None,
    )


def read_guarded(path: Path, convert: Callable[[Diagnostics], list[Trajectory] | list[dict[str, Any]]]) -> Iterator[ImportResult]:
    """Run one file's conversion so that whatever goes wrong becomes a located
    rejection of that file and the batch goes on; never a traceback. ``convert`` gives
    Trajectories, or records in pool-line shape (see ``ImportResult.record``)."""
    diagnostics = Diagnostics(str(path))
    try:
        converted = convert(diagnostics)
    except Exception as exc:
        yield ImportResult(str(path), None, conversion_error(path, exc), diagnostics)
        return
    for item in converted:
        if isinstance(item, Trajectory):
            yield ImportResult(str(path), item, None, diagnostics)
        else:
            yield ImportResult(str(path), None, None, diagnostics, record=item)


def conversion_error(path: Path, exc: Exception) -> RecordError:
    """What rejects a file whose conversion raised ``exc``, located as well as it can be.
    An input no converter foresaw is rejected too, so the batch goes on: never a traceback."""
    if isinstance(exc, RecordError):
        return exc
    if isinstance(exc, ValidationError):
        return validation_error(path, None, exc)
    return fail(path, None, None, f"could not be converted ({type(exc).__name__}: {exc})")


CHAT_FIELDS = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name"}


def chat_message(
    item: Fields, role: str, diag: Diagnostics, *, handled: frozenset[str] = frozenset(), tool_call_id: str | None = None
) -> Message:
    """An OpenAI-style chat message (as mini-swe-agent and SWE-agent save them).

    List content is flattened to its text, with the parts kept in ``extra``; every key
    outside the chat fields and ``handled`` is kept in ``extra`` under its own name.
    ``tool_call_id`` stands in when the message names its call some other way.
    """
    raw_content = item.get("content", (str, list))
    extra: dict[str, Any] = {}
    content = raw_content
    if isinstance(raw_content, list):
        content = text_of_parts(raw_content)
        extra["content_parts"] = raw_content
    extra.update((k, v) for k, v in item.data.items() if k not in CHAT_FIELDS and k not in handled)
    tool_calls = None
    if role == "assistant" and item.data.get("tool_calls"):
        tool_calls = [openai_tool_call(call, diag) for call in item.items("tool_calls")]
    return Message(
        role=role,  # type: ignore[arg-type]
        content=content,
        reasoning_content=item.str("reasoning_content"),
        tool_calls=tool_calls,
        tool_call_id=item.str("tool_call_id", required=role == "tool" and tool_call_id is None) or tool_call_id,
        name=item.str("name"),
        generated=role == "assistant",
        extra=extra or None,
    )


def imported_outcome(
    fmt: str,
    *,
    reward: float | None = None,
    resolved: bool | None = None,
    details: dict[str, Any] | None = None,
    kinds: Kinds | None = None,
) -> Outcome | None:
    """The source's own grade, kept as the outcome until ``relearn verify`` grades the patch.

    ``verdict.imported_from`` says the grade was read from the file and never re-verified
    here, so it can be told apart from a verdict of ours; ``details`` are the source's own
    verifier fields (test counts, exit code). None when the source graded nothing."""
    if reward is None and resolved is None:
        return None
    verdict: dict[str, Any] = {"imported_from": fmt, "re_verified": False}
    if details:
        verdict["source_fields"] = details
    return (kinds or MODELS).outcome(reward=reward, resolved=resolved, verdict=verdict)


def number(value: Any) -> float | None:
    """A JSON number as a float; booleans and text are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def flag(value: Any) -> bool | None:
    """A resolved/target flag as datasets write it: a boolean, 0/1, or "true"/"false"."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None


# ---- records built without the model ---------------------------------------------------
# A converter that builds with ``PLAIN`` runs the same code as with ``MODELS``, but each record is
# a plain object that ``to_record`` turns into its pool line's JSON object (fields in the model's
# order, None left out: the line ``model_dump_json`` writes), checking each value is one the model
# would keep unchanged. Any other (one pydantic would coerce or reject) raises ``NotPlain``, and
# the caller converts again with the models, which validate, coerce and locate the error.


class NotPlain(Exception):
    """A value the model would change or reject: the record is built with the models instead."""


# A field's check: a JSON type (the value must be exactly of it, and is kept as it is), or a
# function that returns the value as the model would write it, raising NotPlain where it can't.
Check = type | Callable[[Any], Any]


def _float(value: Any) -> float:
    """A float field: an integer becomes a float, as pydantic makes it; marked where wide."""
    kind = type(value)
    if kind is int:
        value = float(value)
    elif kind is not float and kind is not WideFloat:
        raise NotPlain
    return WideFloat(value) if is_wide(value) else value


def _objects(value: Any) -> list[dict[str, Any]]:
    if type(value) is not list or not all(type(item) is dict for item in value):
        raise NotPlain
    return value


def _ints(value: Any) -> list[int]:
    if type(value) is not list or not all(type(item) is int for item in value):
        raise NotPlain
    return value


def _strs(value: Any) -> list[str]:
    if type(value) is not list or not all(type(item) is str for item in value):
        raise NotPlain
    return value


def _floats(value: Any) -> list[float]:
    if type(value) is not list:
        raise NotPlain
    return [_float(item) for item in value]


def _never(value: Any) -> Any:
    raise NotPlain  # a field no plain converter fills (links)


def _one(kind: type[Plain]) -> Check:
    def check(value: Any) -> dict[str, Any]:
        if type(value) is not kind:
            raise NotPlain
        return value.to_record()

    return check


def _many(kind: type[Plain]) -> Check:
    def check(value: Any) -> list[dict[str, Any]]:
        if type(value) is not list or not all(type(item) is kind for item in value):
            raise NotPlain
        return [item.to_record() for item in value]

    return check


def _among(*allowed: str) -> Check:
    def check(value: Any) -> str:
        if type(value) is not str or value not in allowed:
            raise NotPlain
        return value

    return check


Layout = dict[str, tuple[type | None, Callable[[Any], Any] | None]]


def _layout(model: type[Record], checks: dict[str, Check]) -> Layout:
    """``checks`` in the model's field order, each as (JSON type, None) or (None, function); every
    field of the model has one."""
    if set(checks) != set(model.model_fields):
        raise TypeError(f"{model.__name__}: checks for {sorted(checks)}, fields {sorted(model.model_fields)}")
    plain_types = (str, int, bool, dict)
    return {name: (checks[name], None) if checks[name] in plain_types else (None, checks[name]) for name in model.model_fields}  # type: ignore[misc]


class Plain:
    """A record of ``FIELDS`` built without validation; ``to_record`` checks and writes it.
    ``BLANK``: every field at its default (None unless the model says otherwise), in the model's
    order, which the object's own fields keep (``BLANK`` goes in first)."""

    FIELDS: ClassVar[Layout]
    BLANK: ClassVar[dict[str, Any]]

    def __init__(self, **values: Any) -> None:
        fields = self.__dict__
        fields.update(self.BLANK)
        fields.update(values)

    def to_record(self) -> dict[str, Any]:
        values = self.__dict__
        if len(values) != len(self.BLANK):  # a key the model would keep as an extra field
            raise NotPlain
        record = {}
        layout = self.FIELDS
        for name, value in values.items():
            if value is None:
                continue
            kind, check = layout[name]
            if kind is not None:
                if type(value) is not kind:
                    raise NotPlain
                record[name] = value
            else:
                record[name] = check(value)  # type: ignore[misc]
        return record


def _blank(fields: Layout, **defaults: Any) -> dict[str, Any]:
    return {name: defaults.get(name) for name in fields}


class PlainFunctionCall(Plain):
    FIELDS = _layout(FunctionCall, {"name": str, "arguments": dict})
    BLANK = _blank(FIELDS)


class PlainToolCall(Plain):
    FIELDS = _layout(
        ToolCall,
        {"id": str, "type": _among("function", "custom"), "function": _one(PlainFunctionCall), "raw_arguments": str, "extra": dict},
    )
    BLANK = _blank(FIELDS, type="function")


_USAGE = {"input_tokens": int, "cached_input_tokens": int, "output_tokens": int, "reasoning_output_tokens": int, "total_tokens": int}


class PlainUsage(Plain):
    FIELDS = _layout(Usage, {**_USAGE, "cost_usd": _float, "api_calls": int})
    BLANK = _blank(FIELDS)


class PlainMessage(Plain):
    FIELDS = _layout(
        Message,
        {
            "role": _among("system", "developer", "user", "assistant", "tool"),
            "content": str,
            "reasoning_content": str,
            "tool_calls": _many(PlainToolCall),
            "tool_call_id": str,
            "name": str,
            "generated": bool,
            "token_ids": _ints,
            "logprobs": _floats,
            "timestamp": str,
            "duration_ms": _float,
            "usage": _one(PlainUsage),
            "metadata": dict,
            "extra": dict,
        },
    )
    BLANK = _blank(FIELDS, generated=False)

    def to_record(self) -> dict[str, Any]:
        # Message's own validator: these the model rejects.
        if (self.tool_calls and self.role != "assistant") or (self.role == "tool" and not self.tool_call_id):
            raise NotPlain
        return super().to_record()


class PlainPolicy(Plain):
    FIELDS = _layout(Policy, {"name": str, "checkpoint": str, "step": int, "provider": str})
    BLANK = _blank(FIELDS)


class PlainOutcome(Plain):
    FIELDS = _layout(Outcome, {"reward": _float, "resolved": bool, "verdict_ref": str, "verdict": dict, "suspicious": _strs})
    BLANK = _blank(FIELDS)


class PlainContextReset(Plain):
    FIELDS = _layout(ContextReset, {"message_index": int, "reason": str, "keep": _ints, "replacement_known": bool})
    BLANK = _blank(FIELDS, reason="compacted", replacement_known=True)


class PlainSource(Plain):
    FIELDS = _layout(
        Source,
        {"format": str, "format_version": str, "path": str, "meta": dict, "records": _objects, "warnings": _strs, "content_hash": str},
    )
    BLANK = _blank(FIELDS)


def _exit_status(value: Any) -> str:
    if type(value) is not ExitStatus:
        raise NotPlain
    return value.value


class PlainTrajectory(Plain):
    """A trajectory whose ``to_record`` leaves ``id`` empty where the model would compute it
    (the content id): the row reader computes it once, for the id and the content hash alike."""

    FIELDS = _layout(
        Trajectory,
        {
            "schema_version": _among(SCHEMA_VERSION),
            "id": str,
            "task_id": str,
            "policy": _one(PlainPolicy),
            "attempt": int,
            "messages": _many(PlainMessage),
            "tools": _objects,
            "final_patch": str,
            "exit_status": _exit_status,
            "outcome": _one(PlainOutcome),
            "usage": _one(PlainUsage),
            "context_resets": _many(PlainContextReset),
            "links": _never,
            "started_at": str,
            "finished_at": str,
            "source": _one(PlainSource),
        },
    )
    BLANK = _blank(FIELDS, schema_version=SCHEMA_VERSION, id="", exit_status=ExitStatus.unknown)


@dataclass(frozen=True)
class Kinds:
    """The record classes a converter builds with: the models, or their plain stand-ins (which
    have the models' fields, so the converter's code and annotations hold for both)."""

    message: Any
    tool_call: Any
    function_call: Any
    usage: Any
    policy: Any
    outcome: Any
    context_reset: Any
    source: Any
    trajectory: Any


MODELS = Kinds(Message, ToolCall, FunctionCall, Usage, Policy, Outcome, ContextReset, Source, Trajectory)
PLAIN = Kinds(
    PlainMessage, PlainToolCall, PlainFunctionCall, PlainUsage, PlainPolicy, PlainOutcome, PlainContextReset, PlainSource, PlainTrajectory
)
