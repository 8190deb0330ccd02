"""A small OpenAI-compatible Chat Completions server over a ``transformers`` causal LM.

It stands in for vLLM where there is none (a CPU-only machine, a test), so that a model from
``relearn train`` is evaluated through exactly the client path a user runs against vLLM: the
``openai`` SDK in ``harness.policies.ChatPolicy``. What it mirrors from ``vllm serve
--reasoning-parser qwen3 --tool-call-parser qwen3_coder --enable-auto-tool-choice``:

- the prompt is the tokenizer's chat template with the request's tools, tool-call arguments
  turned from JSON strings into mappings (the Qwen templates iterate ``arguments|items``);
- the default sampling parameters come from the model folder's ``generation_config.json``,
  and the request overrides them; ``max_tokens`` defaults to what is left of the context;
- the completion is split like vLLM's Qwen3 reasoning parser (``</think>`` ends reasoning; a
  ``<tool_call>`` followed by ``<function=`` ends it too; no end at all means the output was
  cut inside reasoning) and the qwen3_coder tool parser (XML ``<function=NAME>`` blocks,
  parameters typed by the tool's JSON schema);
- ``return_token_ids`` gives ``choices[0].token_ids`` and ``prompt_token_ids``; ``logprobs``
  are of the model's raw distribution (vLLM's default logprobs mode), one per generated token;
- errors use vLLM's wording where a client matches on it (the context-overflow message).

Deliberate differences: one request at a time (generation is single-stream; concurrent
requests wait on a lock); no streaming, no ``n > 1``, no forced tool choice, no frequency or
presence penalty (each refused with a 400 naming the field, never silently ignored;
repetition_penalty, top_k and min_p are taken as vLLM takes them); reasoning and content
are trimmed of surrounding whitespace, as the chat template trims them when the turn is sent
back; a boolean parameter that is neither ``true`` nor ``false`` stays a string (vLLM makes it
false), and ``null`` becomes None only for parameters whose schema type is not string.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

DEFAULT_MAX_NEW_TOKENS = 2048
# vLLM's cap on top_logprobs (and OpenAI's).
MAX_TOP_LOGPROBS = 20
# The sampling fields a model folder's generation_config.json may set as defaults, as vLLM reads them.
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
# Template arguments the server sets itself; chat_template_kwargs may not replace them.
OWN_TEMPLATE_ARGS = frozenset({"conversation", "messages", "tools", "tokenize", "add_generation_prompt", "return_dict"})


# --- parsing the completion (Qwen3 reasoning parser + qwen3_coder tool parser) --------------

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


def parse_completion(text: str, tools: list[dict[str, Any]] | None = None, *, thinking: bool = True, parse_tools: bool = True) -> ParsedCompletion:
    """Reasoning, content and tool calls of a decoded completion (special tokens already removed)."""
    reasoning, rest = split_reasoning(text, thinking=thinking)
    calls: list[dict[str, Any]] = []
    if rest is not None and parse_tools:
        rest, calls = parse_tool_calls(rest, tools)
    return ParsedCompletion(content=_trimmed(rest), reasoning_content=_trimmed(reasoning), tool_calls=calls)


def _trimmed(text: str | None) -> str | None:
    text = (text or "").strip()
    return text or None


# --- requests ----------------------------------------------------------------------------


class RequestError(Exception):
    """A request the server refuses, with the HTTP status and an OpenAI-style error body."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    template_kwargs: dict[str, Any]
    max_tokens: int | None
    sampling: dict[str, Any]  # temperature, top_p, top_k, min_p, repetition_penalty: only those given
    seed: int | None
    stop: list[str]
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    skip_special_tokens: bool


def _number(body: dict[str, Any], key: str, *, low: float | None = None, high: float | None = None, integer: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(f"{key} must be {'an integer' if integer else 'a number'}, not {value!r}", param=key)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low:g}" if high is None else f"between {low:g} and {high:g}"
        raise RequestError(f"{key} must be {bounds}, not {value!r}", param=key)
    return value


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, not {value!r}", param=key)
    return value


def _template_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages as the chat template wants them (arguments as mappings)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"{where} must be an object with a string role", param=where)
        message = dict(message)
        if message.get("reasoning_content") is None and isinstance(message.get("reasoning"), str):
            message["reasoning_content"] = message["reasoning"]  # vLLM >= 0.11 names it so
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            message["tool_calls"] = [_template_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
        out.append(message)
    return out


def _template_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"{where} must have a function with a string name", param=f"{where}.function")
    arguments = function.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise RequestError(f"{where}.function.arguments is not valid JSON: {e}", param=f"{where}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments")
    return {**call, "function": {**function, "arguments": arguments}}


def parse_request(body: Any, model_name: str) -> ChatRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("model") not in (None, model_name):
        raise RequestError(f"The model `{body['model']}` does not exist.", param="model", status=404, kind="NotFoundError")
    if body.get("stream"):
        raise RequestError("stream=true is not supported by this server: send stream=false (or leave it out)", param="stream")
    if _number(body, "n", low=1, integer=True) not in (None, 1):
        raise RequestError("n > 1 is not supported by this server (one completion per request)", param="n")
    for key in ("frequency_penalty", "presence_penalty"):
        if _number(body, key) not in (None, 0):
            raise RequestError(f"{key} is not supported by this server (use repetition_penalty)", param=key)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of tool objects", param="tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError("tool_choice must be auto or none here (forcing a call needs guided decoding)", param="tool_choice")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict) or OWN_TEMPLATE_ARGS & set(template_kwargs):
        raise RequestError(f"chat_template_kwargs must be an object without {sorted(OWN_TEMPLATE_ARGS)}", param="chat_template_kwargs")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them", param="stop")
    top_logprobs = _number(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS, integer=True)
    logprobs = _flag(body, "logprobs", False)
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    max_tokens = _number(body, "max_completion_tokens", low=1, integer=True) or _number(body, "max_tokens", low=1, integer=True)
    sampling = {
        "temperature": _number(body, "temperature", low=0, high=2),
        "top_p": _number(body, "top_p", low=0, high=1),
        "top_k": _number(body, "top_k", low=-1, integer=True),
        "min_p": _number(body, "min_p", low=0, high=1),
        "repetition_penalty": _number(body, "repetition_penalty", low=0),
    }
    for key in ("top_p", "repetition_penalty"):
        if sampling[key] == 0:
            raise RequestError(f"{key} must be greater than 0", param=key)
    return ChatRequest(
        messages=_template_messages(body.get("messages")),
        tools=tools or None,
        parse_tools=bool(tools) and choice != "none",
        template_kwargs=template_kwargs,
        max_tokens=max_tokens,
        sampling={k: v for k, v in sampling.items() if v is not None},
        seed=_number(body, "seed", integer=True),
        stop=stops,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        return_token_ids=_flag(body, "return_token_ids", False),
        skip_special_tokens=_flag(body, "skip_special_tokens", True),
    )


def context_overflow(max_context: int, prompt_tokens: int, completion_tokens: int) -> RequestError:
    """vLLM's wording, which clients (ours: harness.policies.is_context_overflow) match on."""
    return RequestError(
        f"This model's maximum context length is {max_context} tokens. However, you requested "
        f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, {completion_tokens} in the completion). "
        "Please reduce the length of the messages or completion.",
        param="messages",
    )


# --- generation --------------------------------------------------------------------------


class _StopStrings(StoppingCriteria):
    """Stops once the generated text holds a stop string; only the last few tokens are decoded
    each step, enough to hold the longest one."""

    def __init__(self, tokenizer: Any, stops: list[str], prompt_len: int, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.prompt_len = prompt_len
        self.window = 4 * max(len(s) for s in stops) + 8  # a character can take up to 4 byte-level tokens
        self.skip = skip_special_tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        start = max(self.prompt_len, input_ids.shape[1] - self.window)
        tail = self.tokenizer.decode(input_ids[0, start:].tolist(), skip_special_tokens=self.skip)
        return torch.tensor([any(s in tail for s in self.stops)], device=input_ids.device)


class _GumbelSample(LogitsProcessor):
    """Draws the next token: the argmax of log-probabilities plus Gumbel noise is an exact sample
    of the softmax (vLLM samples the same way, with exponential noise). Under greedy decoding
    this replaces torch.multinomial, which takes ~50 ms per token over a 248k vocabulary on CPU,
    and its own generator seeds one request without touching the process's global RNG."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        uniform = torch.rand(scores.shape, generator=self.generator, device=scores.device).clamp_(min=1e-20)
        return torch.log_softmax(scores.float(), dim=-1) - torch.log(-torch.log(uniform))


class _Logprobs(LogitsProcessor):
    """Records the logprob of each chosen token (and the top ones) under the raw distribution.

    A processor sees step t's scores before the token is chosen, so it keeps that step's
    log-softmax and reads the choice at the next call (or from ``take`` after the last step):
    one vocabulary-sized vector at a time, where ``output_logits`` would hold one per token
    (1 MB each at 248k entries)."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.pending: torch.Tensor | None = None
        self.steps: list[tuple[float, list[tuple[int, float]]]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.take(int(input_ids[0, -1]))
        self.pending = torch.log_softmax(scores[0].float(), dim=-1)
        return scores

    def take(self, token_id: int) -> None:
        if self.pending is None:
            return
        top: list[tuple[int, float]] = []
        if self.top:
            values, indices = torch.topk(self.pending, self.top)
            top = [(int(i), float(v)) for v, i in zip(values, indices, strict=True)]
        self.steps.append((float(self.pending[token_id]), top))
        self.pending = None


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    configured = model.generation_config.eos_token_id
    ids.update(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    # A folder saved from a bare config (a tiny test model) has no eos in its generation config;
    # chat models end a turn with the template's end-of-turn token.
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id >= 0:
            ids.add(token_id)
    return ids


def check_model_folder(path: str | Path) -> Path:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"{path}: not a Hugging Face model folder (no config.json)")
    return folder


def load_model(path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """A causal LM from a Hugging Face folder; ValueError with the reason when it is not one."""
    folder = check_model_folder(path)
    try:
        # float32 on CPU: bf16 matmuls there are slow and fp16 ones partly missing.
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or (torch.float32 if device == "cpu" else "auto"), local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ValueError(f"{path}: cannot load a causal LM: {e}") from e
    return model


def load_tokenizer_folder(path: str | Path) -> Any:
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: no tokenizer there ({e}); give one explicitly") from e


def _is_tokenizer(value: Any) -> bool:
    return value is not None and not isinstance(value, str | Path)


class ChatEngine:
    """The model, its tokenizer and the lock that makes generation single-stream."""

    def __init__(self, model: Any, tokenizer: Any, *, model_name: str, max_new_tokens: int, max_context: int | None, device: str, seed: int | None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_new_tokens = max_new_tokens
        limits = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
        limits = [n for n in limits if isinstance(n, int) and 0 < n < 10**9]  # tokenizers say 1e30 for "unknown"
        self.max_context = max_context or (min(limits) if limits else 32768)
        self.device = device
        self.seed = seed
        self.requests = 0
        self.eos = _eos_ids(model, tokenizer)
        # What the folder's generation_config.json sets (not transformers' class defaults), as vLLM reads it.
        diff = model.generation_config.to_diff_dict()
        self.defaults = {k: diff[k] for k in GENERATION_DEFAULTS if diff.get(k) is not None}
        self.lock = threading.Lock()

    def prompt(self, request: ChatRequest) -> list[int]:
        from jinja2 import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(
                request.messages, tools=request.tools, add_generation_prompt=True, tokenize=False, **request.template_kwargs
            )
        except TemplateError as e:
            raise RequestError(f"the chat template refused the messages: {e}", param="messages") from None
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def complete(self, request: ChatRequest) -> dict[str, Any]:
        # Templating and tokenizing under the lock too: a fast tokenizer shared between threads
        # can fail with "Already borrowed", and generation is one at a time anyway.
        with self.lock:
            prompt = self.prompt(request)
            room = self.max_context - len(prompt)
            if room <= 0 or (request.max_tokens is not None and request.max_tokens > room):
                raise context_overflow(self.max_context, len(prompt), request.max_tokens or 0)
            default_max = int(self.defaults.get("max_new_tokens", self.max_new_tokens))
            max_new = request.max_tokens or min(default_max, room)
            self.requests += 1
            seed = request.seed if request.seed is not None else None if self.seed is None else self.seed + self.requests
            ids, logprobs = self._generate(prompt, max_new, request, seed)
            return self._response(request, prompt, ids, logprobs, max_new)

    def _generate(self, prompt: list[int], max_new: int, request: ChatRequest, seed: int | None) -> tuple[list[int], _Logprobs | None]:
        sampling = {**{k: v for k, v in self.defaults.items() if k != "max_new_tokens"}, **request.sampling}
        temperature = sampling.get("temperature", 1.0)
        # Greedy for transformers, with every processor ours and in vLLM's order: logprobs of the
        # raw distribution first, then penalties, then the warpers, then sampling (_GumbelSample).
        config = GenerationConfig(
            max_new_tokens=max_new,
            do_sample=False,
            use_cache=True,  # trained folders say use_cache=false in config.json; decoding needs the cache
            eos_token_id=sorted(self.eos),
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos, default=0),
            # Explicit, or transformers fills it in from the model's generation config and builds
            # its own penalty processor next to ours.
            repetition_penalty=1.0,
            # Likewise the sampling values, which would only earn a "flags ignored" warning: ours apply.
            temperature=1.0,
            top_p=1.0,
            top_k=50,  # transformers' own default: the one value it does not flag
            min_p=None,
            return_dict_in_generate=True,
        )
        recorder = _Logprobs(request.top_logprobs) if request.logprobs else None
        processors = LogitsProcessorList([recorder] if recorder else [])
        penalty = sampling.get("repetition_penalty", 1.0)
        if penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(penalty))
        if temperature > 0:
            generator = torch.Generator(device=self.device)
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
            processors.append(TemperatureLogitsWarper(temperature))
            top_k, top_p, min_p = sampling.get("top_k", 0), sampling.get("top_p", 1.0), sampling.get("min_p", 0.0)
            if top_k > 0:  # vLLM's -1 and 0 both mean "off"
                processors.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p))
            if min_p > 0:
                processors.append(MinPLogitsWarper(min_p))
            processors.append(_GumbelSample(generator))
        stopping = StoppingCriteriaList([_StopStrings(self.tokenizer, request.stop, len(prompt), request.skip_special_tokens)] if request.stop else [])
        input_ids = torch.tensor([prompt], device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, logits_processor=processors, stopping_criteria=stopping
            )
        ids = out.sequences[0, len(prompt) :].tolist()
        if recorder is not None and ids:
            recorder.take(ids[-1])
        return ids, recorder

    def _response(self, request: ChatRequest, prompt: list[int], ids: list[int], logprobs: _Logprobs | None, max_new: int) -> dict[str, Any]:
        text_ids = ids[:-1] if ids and ids[-1] in self.eos else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=request.skip_special_tokens)
        finish, stop_reason = "stop", None
        hits = [(text.find(s), s) for s in request.stop if s in text]
        if hits:
            at, stop_reason = min(hits)
            text = text[:at]  # vLLM leaves the stop string out of the output
        elif not (ids and ids[-1] in self.eos) and len(ids) >= max_new:
            finish = "length"
        thinking = request.template_kwargs.get("enable_thinking", True) is not False
        parsed = parse_completion(text, request.tools, thinking=thinking, parse_tools=request.parse_tools)
        if parsed.tool_calls:
            finish = "tool_calls"  # vLLM reports tool calls over the engine's own reason
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": parsed.content,
                "reasoning_content": parsed.reasoning_content,
                "reasoning": parsed.reasoning_content,
                "tool_calls": parsed.tool_calls,
            },
            "logprobs": {"content": self._logprobs(ids, logprobs)} if logprobs is not None else None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
        }
        if request.return_token_ids:
            choice["token_ids"] = ids
            response["prompt_token_ids"] = prompt
        return response

    def _logprobs(self, ids: list[int], recorder: _Logprobs) -> list[dict[str, Any]]:
        if len(recorder.steps) != len(ids):
            raise RuntimeError(f"internal: {len(recorder.steps)} logprob steps for {len(ids)} tokens")
        entries = []
        for token_id, (logprob, top) in zip(ids, recorder.steps, strict=True):
            entry = self._logprob_entry(token_id, logprob)
            entry["top_logprobs"] = [self._logprob_entry(i, v) for i, v in top]
            entries.append(entry)
        return entries

    def _logprob_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": token, "logprob": max(logprob, -9999.0), "bytes": list(token.encode("utf-8"))}

    def models(self) -> dict[str, Any]:
        card = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "relearn", "max_model_len": self.max_context}
        return {"object": "list", "data": [card]}


# --- HTTP --------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server_version = "relearn-serve"
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects

    @property
    def engine(self) -> ChatEngine:
        return self.server.engine  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        log = self.server.log  # type: ignore[attr-defined]
        if log is not None:
            log(f"{self.address_string()} {format % args}")

    def _send(self, status: int, body: dict[str, Any] | None) -> None:
        data = b"" if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send(200, None)
        elif path == "/v1/models":
            self._send(200, self.engine.models())
        else:
            self._send(404, RequestError(f"no route GET {path}", status=404, kind="NotFoundError").body())

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if path != "/v1/chat/completions":
            self._send(404, RequestError(f"no route POST {path}; this server answers POST /v1/chat/completions", status=404, kind="NotFoundError").body())
            return
        try:
            try:
                body = json.loads(raw or b"null")
            except ValueError as e:
                raise RequestError(f"the request body is not JSON: {e}") from None
            request = parse_request(body, self.engine.model_name)
            self._send(200, self.engine.complete(request))
        except RequestError as e:
            self._send(e.status, e.body())
        except Exception as e:  # a bug or an engine failure: say so, keep serving
            print(f"relearn serve: request failed: {e!r}", file=sys.stderr)
            self._send(500, RequestError(f"internal error: {e}", status=500, kind="InternalServerError").body())


class Server:
    """A running server: ``url`` is the base URL an OpenAI client takes (``.../v1``)."""

    def __init__(self, engine: ChatEngine, host: str, port: int, log: Callable[[str], None] | None) -> None:
        self.engine = engine
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.engine = engine  # type: ignore[attr-defined]
        self._httpd.log = log  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="relearn-serve", daemon=True)
        self._thread.start()

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = str(host)
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"  # a client cannot connect to the wildcard address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(
    model: str | Path | Any,
    tokenizer: str | Path | Any | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    model_name: str | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_context: int | None = None,
    device: str = "cpu",
    seed: int | None = None,
    log: Callable[[str], None] | None = None,
) -> Server:
    """Serve ``model`` (a Hugging Face folder or a loaded causal LM) in a background thread.

    ``tokenizer``: a loaded tokenizer, a folder, or None for the model folder's own.
    ``port=0`` picks a free port; ``max_context`` defaults to the model's position limit.
    ``seed`` makes the n-th request after start sample the same way each run (a request's
    own seed wins). ValueError when the model or tokenizer cannot be used.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    if isinstance(model, str | Path):
        name = model_name or str(model)
        folder = check_model_folder(model)
        # The tokenizer first: a missing one should not cost the wait for a large model.
        tokenizer = load_tokenizer_folder(folder if tokenizer is None else tokenizer) if not _is_tokenizer(tokenizer) else tokenizer
        model = load_model(folder, device)
    else:
        name = model_name or getattr(model, "name_or_path", None) or "model"
        if tokenizer is None:
            raise ValueError("a loaded model needs a tokenizer")
        if not _is_tokenizer(tokenizer):
            tokenizer = load_tokenizer_folder(tokenizer)
    engine = ChatEngine(model, tokenizer, model_name=name, max_new_tokens=max_new_tokens, max_context=max_context, device=device, seed=seed)
    return Server(engine, host, port, log)


__all__ = ["ChatEngine", "ParsedCompletion", "RequestError", "Server", "context_overflow", "parse_completion", "parse_request", "parse_tool_calls", "parameter_value", "serve", "split_reasoning"]
