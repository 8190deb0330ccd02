"""Generation over a ``transformers`` causal LM: the prompt from the chat template, sampling
with the model folder's defaults, logprobs of the raw distribution, and the response body."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
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

from relearn.serve.chat_request import ChatRequest, RequestError, context_overflow
from relearn.serve.parsers import THINK_END, ParsedCompletion, parse_completion

# The sampling fields a model folder's generation_config.json may set as defaults, as vLLM reads them.
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")


@dataclass
class Generation:
    """One completion: the prompt's and the output's token ids, the decoded text and its parse,
    and why the engine stopped (``stop``: an end token or a stop string; ``length``: the token
    limit), which the chat and Responses answers share."""

    prompt: list[int]
    ids: list[int]
    logprobs: _Logprobs | None
    text: str
    parsed: ParsedCompletion
    finish: str
    stop_reason: str | None
    reasoning_tokens: int


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
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=dtype or (torch.float32 if device == "cpu" else "auto"), local_files_only=True
        )
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ValueError(f"{path}: cannot load a causal LM: {e}") from e
    return model


def load_tokenizer_folder(path: str | Path) -> Any:
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: no tokenizer there ({e}); give one explicitly") from e


class ChatEngine:
    """The model, its tokenizer and the lock that makes generation single-stream."""

    def __init__(
        self, model: Any, tokenizer: Any, *, model_name: str, max_new_tokens: int, max_context: int | None, device: str, seed: int | None
    ) -> None:
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
        think_end = tokenizer.convert_tokens_to_ids(THINK_END)
        self.think_end = think_end if isinstance(think_end, int) and think_end != tokenizer.unk_token_id and think_end >= 0 else None

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
        """The Chat Completions answer to ``request``."""
        return self._response(request, self.generate(request))

    def generate(self, request: ChatRequest, on_start: Callable[[], None] | None = None) -> Generation:
        """The completion of ``request``, parsed; ``on_start`` runs once the prompt fits, just
        before generation (a streamed answer sends its first events then)."""
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
            if on_start is not None:
                on_start()
            ids, logprobs = self._generate(prompt, max_new, request, seed)
            return self._parse(request, prompt, ids, logprobs, max_new)

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
        stopping = StoppingCriteriaList(
            [_StopStrings(self.tokenizer, request.stop, len(prompt), request.skip_special_tokens)] if request.stop else []
        )
        input_ids = torch.tensor([prompt], device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=stopping,
            )
        ids = out.sequences[0, len(prompt) :].tolist()
        if recorder is not None and ids:
            recorder.take(ids[-1])
        return ids, recorder

    def _parse(self, request: ChatRequest, prompt: list[int], ids: list[int], logprobs: _Logprobs | None, max_new: int) -> Generation:
        ended = bool(ids) and ids[-1] in self.eos
        text_ids = ids[:-1] if ended else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=request.skip_special_tokens)
        finish, stop_reason = "stop", None
        hits = [(text.find(s), s) for s in request.stop if s in text]
        if hits:
            at, stop_reason = min(hits)
            text = text[:at]  # vLLM leaves the stop string out of the output
        elif not ended and len(ids) >= max_new:
            finish = "length"
        thinking = request.template_kwargs.get("enable_thinking", True) is not False
        parsed = parse_completion(text, request.tools, thinking=thinking, parse_tools=request.parse_tools)
        return Generation(prompt, ids, logprobs, text, parsed, finish, stop_reason, self._reasoning_tokens(ids, parsed, thinking))

    def _reasoning_tokens(self, ids: list[int], parsed: ParsedCompletion, thinking: bool) -> int:
        """How many generated tokens were reasoning: up to ``</think>``, or all of them when the
        output was cut inside reasoning."""
        if self.think_end is not None and self.think_end in ids:
            return ids.index(self.think_end) + 1
        return len(ids) if thinking and parsed.reasoning_content is not None and parsed.content is None and not parsed.tool_calls else 0

    def _response(self, request: ChatRequest, generation: Generation) -> dict[str, Any]:
        prompt, ids, logprobs, parsed = generation.prompt, generation.ids, generation.logprobs, generation.parsed
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
            # vLLM reports tool calls over the engine's own reason.
            "finish_reason": "tool_calls" if parsed.tool_calls else generation.finish,
            "stop_reason": generation.stop_reason,
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
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "relearn",
            "max_model_len": self.max_context,
        }
        return {"object": "list", "data": [card]}
