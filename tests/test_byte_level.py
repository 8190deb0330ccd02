"""The byte-level shortcut of the masks' tokenization (``relearn.masks.byte_level``): where a
byte-level BPE's ids are exactly the text's bytes, the offsets it derives are the tokenizer's
own and the ids decode to the text; elsewhere it concludes nothing and the decode decides."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import numpy as np

from relearn.masks.byte_level import byte_table, offsets_if_exact
from relearn.masks.tokenizers import load_tokenizer
from relearn.masks.tokens import _offsets_array, encode_texts


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = list('abc xyz\n\t  é中文🦀🙂ａ\x01"\\<>|{}()[]') + [
        c for c in (chr(rng.randrange(0x20, 0x2FFFF)) for _ in range(400)) if not 0xD800 <= ord(c) < 0xE000
    ]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 300))) for _ in range(count)]
    texts.append("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>\n")
    return [unicodedata.normalize("NFC", t) for t in texts]


def test_every_token_of_both_builtin_vocabularies_decodes_as_its_table_bytes(tok, tokenizer_cache: Path) -> None:  # noqa: ANN001
    for tokenizer in (tok, load_tokenizer("qwen3", cache_dir=tokenizer_cache)):
        table = byte_table(tokenizer)
        assert table is not None
        size = len(table.lengths)
        decoded = tokenizer.backend_tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        flat = table.flat.tobytes()
        wrong = [
            i for i in range(size) if flat[table.starts[i] : table.starts[i] + table.lengths[i]].decode("utf-8", "replace") != decoded[i]
        ]
        assert wrong == [] and size == tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def test_offsets_from_bytes_are_the_tokenizers_own(tok) -> None:  # noqa: ANN001
    table = byte_table(tok)
    assert table is not None
    texts = _texts(0, 1500)
    for text, encoding in zip(texts, tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False), strict=True):
        ids = np.asarray(encoding.ids, dtype=np.int32)
        offsets = offsets_if_exact(table, text, ids)
        assert offsets is not None, text
        assert np.array_equal(offsets, _offsets_array(encoding.offsets)), text
        assert tok.backend_tokenizer.decode(encoding.ids, skip_special_tokens=False) == text


def test_ids_that_are_not_the_texts_bytes_conclude_nothing(tok) -> None:  # noqa: ANN001
    table = byte_table(tok)
    assert table is not None
    text = "café 🦀 done"
    ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
    assert offsets_if_exact(table, text, ids) is not None
    assert offsets_if_exact(table, text.replace("done", "dune"), ids) is None  # other bytes, same length
    assert offsets_if_exact(table, text + "!", ids) is None
    assert offsets_if_exact(table, text, np.asarray([*ids.tolist(), 10**7], dtype=np.int32)) is None
    assert offsets_if_exact(table, "\ud800", ids) is None  # no UTF-8 to compare with
    # The tokenizer NFC-normalises: a decomposed é is tokenised as the composed one, so the ids
    # do not spell the text given, and the encoding falls back to the decode, which says so.
    decomposed = "cafe\u0301"
    (encoded,) = encode_texts(tok, [decomposed])
    assert encoded.decoded == "café" != decomposed
    assert np.array_equal(encoded.offsets, _offsets_array(tok.backend_tokenizer.encode(decomposed, add_special_tokens=False).offsets))


def test_a_tokenizer_that_is_not_byte_level_has_no_table(tok) -> None:  # noqa: ANN001
    class Slow:
        pass

    assert byte_table(Slow()) is None
