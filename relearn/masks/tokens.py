"""Train on the tokens the policy produced and was given, where the pool recorded them.

A generated turn that carries its generation ids (``Message.token_ids``: vLLM's
``return_token_ids``, ``relearn serve``, NeMo Gym's ``generation_token_ids``) is trained on
those ids, not on the template's re-rendered text tokenised again: the two differ wherever the
tokenizer would merge across the edge of what was generated (an empty reasoning block,
``<think>\\n`` given and ``\\n</think>`` generated, re-tokenises as one ``\\n\\n``). Each
recorded token is given the characters it decodes to, so that the render's turn, fields and
defects map onto the recorded tokens as they map onto re-tokenised ones. Ids that do not decode
to the rendered turn are reported and the sample falls back to the text (``TARGETS``).

A turn trained under the context as sent (``as_sent``) replaces the render's history by the
call's recorded prompt ids (``extra.prompt_token_ids``), decoded the same way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from relearn.masks.byte_level import byte_table, offsets_if_exact
from relearn.masks.template import ArgumentSpans, Rendered, Span, Turn

# What a sample's generated tokens are: every turn's ``recorded`` ids, the recorded ids of the
# turns that have them and the others' text tokenised (``partly_recorded``), the render's
# ``text`` tokenised (no ids recorded, or the option off), or the text because recorded ids
# decode to something else than their rendered turn (``ids_disagree``, reported).
TARGETS = ("recorded", "partly_recorded", "text", "ids_disagree")
# How far a run of tokens that each decode to part of a character (U+FFFD) is grown until the
# run decodes whole: a UTF-8 character has at most 4 bytes, a token at least one.
_LONGEST_SPLIT = 8


@dataclass
class Encoded:
    """One text through the tokenizer: ids (int32), their character offsets (int64, n x 2),
    the ids decoded back to text, and where the generated ids came from (``TARGETS``)."""

    ids: np.ndarray
    offsets: np.ndarray
    decoded: str
    targets: str = "text"
    detail: str = ""  # why the recorded ids were not used (``ids_disagree``)


def encode_texts(tokenizer: Any, texts: list[str]) -> list[Encoded]:
    """Tokenize ``texts`` with offsets and decode them back, all in one call.

    A fast tokenizer is driven through its Rust backend's batch calls: the same ids and
    offsets as ``tokenizer(text, return_offsets_mapping=True)`` for each text, the texts
    spread over the backend's threads, and none of the per-token Python lists the wrapper
    builds on the way. A byte-level BPE's ids prove their own round trip and give their offsets
    (``relearn.masks.byte_level``): the ids are decoded, and their offsets listed, only where
    they do not."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        out = []
        for text in texts:
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = np.asarray(encoded["input_ids"], dtype=np.int32)
            offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
            out.append(Encoded(ids, offsets, tokenizer.decode(ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)))
        return out
    table = byte_table(tokenizer)
    out = []
    for text, encoding in zip(texts, backend.encode_batch(texts, add_special_tokens=False), strict=True):
        token_ids = encoding.ids
        ids = np.fromiter(token_ids, dtype=np.int32, count=len(token_ids))
        offsets = offsets_if_exact(table, text, ids) if table is not None else None
        if offsets is not None:  # the ids' bytes are the text's: they decode to it
            out.append(Encoded(ids, offsets, text))
        else:
            out.append(Encoded(ids, _offsets_array(encoding.offsets), backend.decode(token_ids, skip_special_tokens=False)))
    return out


def _offsets_array(offsets: list[tuple[int, int]]) -> np.ndarray:
    # Flattened through an iterator: two and a half times faster than np.array of the tuples.
    return np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)


def _decode_each(tokenizer: Any, ids: list[int]) -> list[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.decode_batch([[i] for i in ids], skip_special_tokens=False))
    return [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]


def _decode(tokenizer: Any, ids: list[int]) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return str(backend.decode(ids, skip_special_tokens=False))
    return str(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def decode_spans(tokenizer: Any, ids: list[int]) -> tuple[str, np.ndarray]:
    """The text ``ids`` decode to and each token's characters in it. A character split over
    several tokens (each decodes to U+FFFD alone) gives every token of the run the run's
    characters, as a byte-level tokenizer's own offsets do."""
    pieces = _decode_each(tokenizer, ids)
    offsets = np.zeros((len(ids), 2), dtype=np.int64)
    parts: list[str] = []
    at = i = 0
    while i < len(ids):
        piece = pieces[i]
        stop = i + 1
        if "\ufffd" in piece:
            for stop in range(i + 2, min(len(ids), i + _LONGEST_SPLIT) + 1):
                joint = _decode(tokenizer, ids[i:stop])
                if "\ufffd" not in joint:
                    piece = joint
                    break
            else:
                stop = i + 1  # no run decodes whole: the text holds U+FFFD itself
        offsets[i:stop] = (at, at + len(piece))
        parts.append(piece)
        at += len(piece)
        i = stop
    return "".join(parts), offsets


def _has_ids(rendered: Rendered, turn: Turn) -> bool:
    return bool(rendered.messages[turn.message_index].token_ids)


def _uses_recorded_ids(rendered: Rendered, recorded: bool) -> bool:
    return recorded and any(_has_ids(rendered, t) for t in rendered.turns)


def tokenised_whole(rendered: Rendered, recorded: bool) -> bool:
    """Whether the render's ids are its text tokenised in one piece: no recorded ids are used
    (none are, or ``recorded`` is off) and its history is the template's, not recorded prompt
    ids (callers batch such renders into one tokenizer call)."""
    return rendered.context_ids is None and not _uses_recorded_ids(rendered, recorded)


def encode_render(tokenizer: Any, rendered: Rendered, recorded: bool) -> Encoded:
    """The sample's ids: with ``recorded`` and ids on generated turns, the history tokenised
    and each turn's recorded ids (a turn without them, its text tokenised); else the render
    tokenised whole. An ``as_sent`` render's history is its recorded prompt ids. Where a turn's
    ids decode to other text than the turn's, the text is trained and the disagreement named
    (``targets`` ``ids_disagree``)."""
    if tokenised_whole(rendered, recorded):
        return encode_texts(tokenizer, [rendered.text])[0]
    exact = _uses_recorded_ids(rendered, recorded)
    pieces = _pieces(tokenizer, rendered, exact)
    if isinstance(pieces, str):
        if rendered.context_ids is None:
            return replace(encode_texts(tokenizer, [rendered.text])[0], targets="ids_disagree", detail=pieces)
        problem, pieces = pieces, _pieces(tokenizer, rendered, False)
        assert not isinstance(pieces, str)
        return replace(_joined(pieces), targets="ids_disagree", detail=problem)
    if not exact:
        return replace(_joined(pieces), targets="text")
    every = all(_has_ids(rendered, t) for t in rendered.turns)
    return replace(_joined(pieces), targets="recorded" if every else "partly_recorded")


def _joined(pieces: list[Encoded]) -> Encoded:
    return Encoded(
        np.concatenate([p.ids for p in pieces]).astype(np.int32),
        np.concatenate([p.offsets for p in pieces]).reshape(-1, 2),
        "".join(p.decoded for p in pieces),
    )


def _pieces(tokenizer: Any, rendered: Rendered, exact: bool) -> list[Encoded] | str:
    """The render's tokens a part at a time, offsets in the whole text: the history between
    turns tokenised (the first part the recorded prompt ids where the render has them), each
    turn its recorded ids (with ``exact``, where it has them) or its text tokenised. A str names
    a disagreement."""
    text = rendered.text
    bounds = [0, *itertools.chain.from_iterable((t.start, t.end) for t in rendered.turns), len(text)]
    spans = list(itertools.pairwise(bounds))  # history, turn, history, ..., turn, history
    recorded = {2 * n + 1 for n, turn in enumerate(rendered.turns) if exact and _has_ids(rendered, turn)}
    tokenised = [k for k, (lo, hi) in enumerate(spans) if hi > lo and k not in recorded and not (k == 0 and rendered.context_ids)]
    encoded = dict(zip(tokenised, encode_texts(tokenizer, [text[spans[k][0] : spans[k][1]] for k in tokenised]), strict=True))
    pieces: list[Encoded] = []
    for k, (lo, _hi) in enumerate(spans):
        if k == 0 and rendered.context_ids is not None:
            decoded, offsets = decode_spans(tokenizer, rendered.context_ids)
            pieces.append(Encoded(np.asarray(rendered.context_ids, dtype=np.int32), offsets, decoded))
        elif k in recorded:
            ids, offsets, decoded, problem = _turn_tokens(tokenizer, rendered, rendered.turns[k // 2])
            if problem:
                return problem
            pieces.append(Encoded(ids, offsets + lo, decoded))
        elif k in encoded:
            piece = encoded[k]
            pieces.append(replace(piece, offsets=piece.offsets + lo))
    return pieces


def _turn_tokens(tokenizer: Any, rendered: Rendered, turn: Turn) -> tuple[np.ndarray, np.ndarray, str, str]:
    """A turn's recorded ids and their characters from the turn's start; the end-of-turn token
    is added where the ids stop before it. The last item names a disagreement, else ""."""
    recorded = list(rendered.messages[turn.message_index].token_ids or [])
    want = rendered.text[turn.start : turn.end]
    decoded, offsets = decode_spans(tokenizer, recorded)
    if decoded != want and want.endswith(rendered.end_of_turn) and decoded == want[: len(want) - len(rendered.end_of_turn)]:
        end = tokenizer.convert_tokens_to_ids(rendered.end_of_turn)
        if isinstance(end, int) and end >= 0:
            recorded.append(end)
            offsets = np.vstack([offsets, [[len(decoded), len(want)]]])
            decoded = want
    if decoded != want:
        first = next((p for p, (a, b) in enumerate(zip(decoded, want, strict=False)) if a != b), min(len(decoded), len(want)))
        return (
            np.zeros(0, dtype=np.int32),
            np.zeros((0, 2), dtype=np.int64),
            "",
            f"message {turn.message_index}: its {len(recorded)} recorded ids decode to other text than the turn "
            f"(at character {first}: {decoded[first : first + 20]!r} vs {want[first : first + 20]!r})",
        )
    return np.asarray(recorded, dtype=np.int32), offsets, decoded, ""


class PromptMismatch(Exception):
    """The recorded prompt ids cannot stand for a turn's history (they do not end with the
    template's generation prompt)."""


def as_sent(rendered: Rendered, prompt_ids: list[int], tokenizer: Any, generation_prompt: str) -> Rendered:
    """One per-turn render (``template.per_turn_renders``) with its history replaced by what
    the call was sent: the text its recorded ``prompt_ids`` decode to, every offset of the
    turn moved with it."""
    (turn,) = rendered.turns
    history, _offsets = decode_spans(tokenizer, prompt_ids)
    if not history.endswith(generation_prompt):
        raise PromptMismatch(
            f"message {turn.message_index}: its recorded prompt ids end with {history[-len(generation_prompt) - 10 :]!r}, "
            f"not the template's generation prompt {generation_prompt!r}"
        )
    shift = len(history) - turn.start
    return Rendered(
        history + rendered.text[turn.start :],
        [_shifted(turn, shift)],
        rendered.messages,
        rendered.end_of_turn,
        context_ids=list(prompt_ids),
    )


def _shifted(turn: Turn, by: int) -> Turn:
    def span(s: Span) -> Span:
        return Span(s.start + by, s.lead, s.kept)

    calls = [
        ArgumentSpans(
            {key: span(value) for key, value in call.values.items()},
            {j: r + by for j, r in call.json_to_render.items()},
            (call.region[0] + by, call.region[1] + by),
            {key: [p + by for p in positions] for key, positions in call.escaped.items()},
        )
        for call in turn.calls
    ]
    return Turn(turn.message_index, turn.start + by, turn.end + by, {name: span(s) for name, s in turn.fields.items()}, calls)
