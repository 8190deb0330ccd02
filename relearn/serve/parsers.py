"""The completion split as vLLM's Qwen3 reasoning parser and qwen3_coder tool parser split it:
``</think>`` ends reasoning (a ``<tool_call>`` followed by ``<function=`` ends it too; no end
at all means the output was cut inside reasoning); tool calls are XML ``<function=NAME>``
blocks whose parameters are typed by the tool's JSON schema."""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START = "<tool_call>"
FUNCTION_PREFIX = "<function="
# A block runs to its closing tag or, when the output was cut, to the end of the text (\Z, not
# $, which would also stop before a final newline).
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION_BLOCK = re.compile(r"<function=(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER_BLOCK = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)", re.DOTALL)
_FUNCTION_OPEN = re.compile(r"<function[\s=]")
_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})


@dataclass
class ParsedCompletion:
    content: str | None
    reasoning_content: str | None
    # OpenAI wire format: {"id", "type": "function", "function": {"name", "arguments": JSON text}}.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class _Malformed(ValueError):
    """A tool-call block the parser cannot read: the whole text is then content, as in vLLM."""


def split_reasoning(text: str, *, thinking: bool = True) -> tuple[str | None, str | None]:
    """(reasoning, rest) of a completion whose prompt ended inside ``<think>`` (Qwen3.5/3.6 templates)."""
    before, marker, after = text.partition(THINK_START)
    text = after if marker else before  # an older template lets the model open <think> itself
    if THINK_END in text:
        reasoning, _, rest = text.partition(THINK_END)
        return reasoning, rest
    if not thinking:
        return None, text
    start = text.find(TOOL_CALL_START)
    if start != -1 and _FUNCTION_OPEN.match(text[start + len(TOOL_CALL_START) :].lstrip()):
        return text[:start], text[start:]  # the model went straight to a call without closing </think>
    return text, None  # cut off while still reasoning


def parameter_value(raw: str, schema: Any) -> Any:
    """A parameter's text typed by its JSON schema, as qwen3_coder does; anything that does not
    convert stays the text the model wrote (the tool then reports the type error to it)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):  # ["integer", "null"]: the non-null type decides
        kind = next((k for k in kind if k != "null"), "string")
    kind = str(kind or "string").strip().lower()
    if kind in _STRING_TYPES:
        return raw
    if raw.lower() == "null":
        return None
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind.startswith(("num", "float")):
        try:
            number = float(raw)
        except ValueError:
            return raw
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return {"true": True, "false": False}.get(raw.strip().lower(), raw)
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:  # Python literals ({'a': 1}), which models write now and then
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw
    try:
        json.dumps(value)
    except (TypeError, ValueError):  # a tuple of sets, say: nothing JSON can carry
        return raw
    return value


def _tool_properties(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    """The parameter schemas of the named function tool, or None when it was not offered."""
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            if not isinstance(parameters, dict):
                return {}
            properties = parameters.get("properties")
            return properties if isinstance(properties, dict) else {}
    return None


def _function_call(block: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    name, sep, body = block.partition(">")
    if not sep or not name.strip():
        raise _Malformed(f"no function name in {block[:40]!r}")
    properties = _tool_properties(tools, name)
    arguments: dict[str, Any] = {}
    for param in _PARAMETER_BLOCK.findall(body):
        key, sep, value = param.partition(">")
        if not sep:
            raise _Malformed(f"no parameter name in {param[:40]!r}")
        # The template writes "\n" after the opening tag and before the closing one; only those go.
        value = value.removeprefix("\n").removesuffix("\n")
        if properties is None or key not in properties:
            arguments[key] = value  # no schema for it: keep the text, as qwen3_coder does
        else:
            arguments[key] = parameter_value(value, properties[key])
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[dict[str, Any]]]:
    """(the content before the first call, the calls); (text, []) when there is no readable call."""
    if FUNCTION_PREFIX not in text:
        return text, []
    blocks = _TOOL_CALL_BLOCK.findall(text) or [text]  # qwen3_coder also reads a bare <function=...>
    try:
        calls = [_function_call(function, tools) for block in blocks for function in _FUNCTION_BLOCK.findall(block)]
    except _Malformed:
        return text, []
    if not calls:
        return text, []
    start = text.find(TOOL_CALL_START)
    return text[: start if start != -1 else text.find(FUNCTION_PREFIX)], calls


def parse_completion(
    text: str, tools: list[dict[str, Any]] | None = None, *, thinking: bool = True, parse_tools: bool = True
) -> ParsedCompletion:
    """Reasoning, content and tool calls of a decoded completion (special tokens already removed)."""
    reasoning, rest = split_reasoning(text, thinking=thinking)
    calls: list[dict[str, Any]] = []
    if rest is not None and parse_tools:
        rest, calls = parse_tool_calls(rest, tools)
    return ParsedCompletion(content=_trimmed(rest), reasoning_content=_trimmed(reasoning), tool_calls=calls)


def _trimmed(text: str | None) -> str | None:
    text = (text or "").strip()
    return text or None
