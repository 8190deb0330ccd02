"""Offsets and the round trip of a byte-level BPE encoding, from its ids alone.

A byte-level BPE tokenizer (Qwen, GPT-2, Llama 3: a ``ByteLevel`` decoder) decodes a sequence
to the UTF-8 text of its tokens' bytes laid end to end. So where those bytes are exactly the
text's UTF-8 bytes, the ids decode to the very text (the round trip VALIDATE asks for) and
each token's characters follow from where its bytes lie: the characters its first and last
byte belong to, a character split over several tokens given to each of them, as the
tokenizer's own offsets give it. Both come out of a few numpy operations over a table of every
token's bytes, instead of a decode of the whole text and a Python list of an offset pair per
token. Where the bytes are not the text's (the tokenizer changed the text, or the table does
not describe it), nothing is concluded and the caller decodes as before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ByteTable:
    """Every token id's bytes, laid end to end in ``flat``, the id's at ``starts[id]`` for
    ``lengths[id]`` bytes; ``key`` is what it was built from (its validity)."""

    flat: np.ndarray  # uint8
    starts: np.ndarray  # int64, per id
    lengths: np.ndarray  # int64, per id
    key: tuple[Any, ...]


def _bytes_to_unicode() -> dict[str, int]:
    """The byte-level alphabet: each byte as the printable character that stands for it
    (GPT-2's table, which every ``ByteLevel`` decoder inverts)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF = _bytes_to_unicode()
# One table per tokenizer object for as long as it lives (built in about half a second for
# Qwen's 248k tokens), rebuilt when its vocabulary or decoder changes.
_TABLES: weakref.WeakKeyDictionary[Any, ByteTable] = weakref.WeakKeyDictionary()


def _token_bytes(token: str) -> bytes:
    """What the ``ByteLevel`` decoder makes of one token: its characters as the bytes they
    stand for, or, where one of them stands for none (an added token's text), its UTF-8."""
    try:
        return bytes(_BYTE_OF[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def byte_table(tokenizer: Any) -> ByteTable | None:
    """The tokenizer's table, or None where it is not a byte-level BPE."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    key = (backend.get_vocab_size(with_added_tokens=True), repr(backend.decoder), repr(backend.normalizer))
    table = _TABLES.get(tokenizer)
    if table is not None and table.key == key:
        return table
    vocab = backend.get_vocab(with_added_tokens=True)
    size = max(vocab.values()) + 1
    pieces = [b""] * size
    for token, token_id in vocab.items():
        pieces[token_id] = _token_bytes(token)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=size)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    table = ByteTable(np.frombuffer(b"".join(pieces), dtype=np.uint8), starts, lengths, key)
    _TABLES[tokenizer] = table
    return table


def offsets_if_exact(table: ByteTable, text: str, ids: np.ndarray) -> np.ndarray | None:
    """The character offsets (n x 2, int64) of ``ids`` in ``text`` when their bytes are
    exactly the text's UTF-8 (so they decode to ``text``); None otherwise."""
    try:
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 to compare with
        return None
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(table.lengths)):
        return None
    lengths = table.lengths[ids]
    if int(lengths.sum()) != len(data) or (len(lengths) and int(lengths.min()) == 0):
        return None
    ends = np.cumsum(lengths)
    begins = ends - lengths
    gather = np.repeat(table.starts[ids] - begins, lengths) + np.arange(len(data), dtype=np.int64)
    if not np.array_equal(table.flat[gather], data):
        return None
    # The character each byte belongs to: a count of the characters begun up to it.
    char_of = np.cumsum((data & 0xC0) != 0x80, dtype=np.int64) - 1
    offsets = np.empty((len(ids), 2), dtype=np.int64)
    offsets[:, 0] = char_of[begins]
    offsets[:, 1] = char_of[ends - 1] + 1
    return offsets
