"""``relearn export masks``: the A \\ E selection itself, per sample, for any trainer.

Each line holds the rendered text (what the chat template produced, which the token ids
decode to), the supervised token runs ``[start, end)`` over ``input_ids``, and the same runs as
character ranges of the text. A trainer with its own tokenization supervises the tokens that
lie wholly inside a character range; one with the same tokenizer can use the token runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from records.pools import write_atomic
from relearn.export.source import DatasetInfo, ExportError, iter_samples
from relearn.masks.rows import ShardRow


def token_runs(mask: np.ndarray) -> list[list[int]]:
    """Maximal runs of 1s as [start, end) token indexes."""
    padded = np.concatenate([[0], (mask[1:] == 1).astype(np.int8), [0]])  # token 0 is never a target
    edges = np.flatnonzero(np.diff(padded))
    return [[int(a) + 1, int(b) + 1] for a, b in zip(edges[::2], edges[1::2], strict=True)]


def sample_spans(sample: ShardRow, tokenizer: Any) -> dict[str, Any]:
    text = tokenizer.decode(sample.input_ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if encoding["input_ids"] != sample.input_ids.tolist():
        raise ExportError(f"{sample.sample_id}: its ids do not re-tokenize from their own text under this tokenizer")
    offsets = encoding["offset_mapping"]
    runs = token_runs(sample.loss_mask)
    return {
        "sample_id": sample.sample_id,
        "trajectory_id": sample.trajectory_id,
        "tokens": len(sample.input_ids),
        "supervised": sample.supervised,
        "text": text,
        "token_spans": runs,
        "char_spans": [[int(offsets[a][0]), int(offsets[b - 1][1])] for a, b in runs],
    }


def export_spans(info: DatasetInfo, tokenizer: Any, out: Path, on_row: Callable[[], None] | None = None) -> int:
    def lines() -> Any:
        for sample in iter_samples(info):
            if on_row:
                on_row()
            yield sample_spans(sample, tokenizer)

    return write_atomic(out, lines())
