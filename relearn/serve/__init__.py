"""A small OpenAI-compatible server (Chat Completions and Responses) over a ``transformers`` causal LM.

It stands in for vLLM where there is none (a CPU-only machine, a test), so that a model from
``relearn train`` is evaluated through exactly the client path a user runs against vLLM: the
``openai`` SDK in ``harness.policies.openai_chat.ChatPolicy``. What it mirrors from ``vllm serve
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
- errors use vLLM's wording where a client matches on it (the context-overflow message);
- ``POST /v1/responses`` answers the Responses API as the Codex CLI speaks it (streamed or
  not, freeform tools included), with the same prompt rendering and parsers, and the token
  ids vLLM gives for ``enable_response_messages`` (see ``responses``).

Deliberate differences: one request at a time (generation is single-stream; concurrent
requests wait on a lock); no streaming on the chat route, no ``n > 1``, no forced tool choice, no frequency or
presence penalty (each refused with a 400 naming the field, never silently ignored;
repetition_penalty, top_k and min_p are taken as vLLM takes them); reasoning and content
are trimmed of surrounding whitespace, as the chat template trims them when the turn is sent
back; a boolean parameter that is neither ``true`` nor ``false`` stays a string (vLLM makes it
false), and ``null`` becomes None only for parameters whose schema type is not string.

Modules: ``parsers`` (the completion split into reasoning, content and tool calls),
``chat_request`` (a request validated, or refused naming the field), ``engine`` (prompt,
generation, logprobs, the chat response body), ``responses`` (the Responses API's request,
response and events over the same engine), ``server`` (HTTP, and ``serve()`` to start one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relearn.options import option

# Output tokens of a request that sets no max_tokens (`relearn serve --max-new-tokens`).
DEFAULT_MAX_NEW_TOKENS = 2048


@dataclass
class ServeOptions:
    """Serve MODEL_DIR on POST /v1/chat/completions and POST /v1/responses (plus GET /v1/models, GET /health) until Ctrl-C.

    Requests are answered one at a time. Reasoning and tool calls are parsed as vLLM's qwen3 reasoning parser and qwen3_coder tool parser do; return_token_ids, logprobs and enable_response_messages work as in vLLM. The Responses route speaks the Codex CLI's dialect (streaming, freeform tools), so `relearn eval run --agent codex-cli` evaluates the model.
    """

    # A verb without a pipeline table (the eval stage serves its models itself). Past model_dir
    # and tokenizer, the keywords of server.serve.

    model_dir: Path = option(help="Hugging Face model folder, e.g. RUN/model from `relearn train`.", argument=True, metavar="MODEL_DIR")
    tokenizer: str | None = option(None, "`qwen3.6` or a tokenizer folder (default: the one saved in MODEL_DIR).")
    host: str = option("127.0.0.1", "Address to listen on (0.0.0.0: every interface).", metavar="ADDRESS")
    port: int = option(8000, "Port to listen on (0: any free port).", ge=0, le=65535)
    model_name: str | None = option(None, "Name clients send as `model` (default: MODEL_DIR as given, as vLLM names it).", metavar="NAME")
    max_new_tokens: int = option(
        DEFAULT_MAX_NEW_TOKENS, "Output limit of a request that sets no max_tokens (also capped by the context left).", ge=1,
        metavar="TOKENS",
    )  # fmt: skip
    max_context: int | None = option(
        None, "Context window in tokens, prompt plus output (default: the model's position limit).", ge=1, metavar="TOKENS"
    )
    device: str = option("cpu", "cpu | cuda (or cuda:N).", metavar="DEVICE")
    seed: int | None = option(None, "Seed: the n-th request after start samples the same way every run (a request's own seed wins).")
