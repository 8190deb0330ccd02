"""A verl SFT dataset over relearn's exported rows (``relearn export dataset --for verl``).

verl's own SFT datasets tokenize text (prompt/response or ``messages``); this one hands its
trainers the token ids and the A \\ E mask relearn compiled, unchanged. Point verl at it:

    data.train_files=OUT/train-00000.parquet \\
    data.custom_cls.path=OUT/relearn_verl_dataset.py data.custom_cls.name=RelearnSFTDataset

``loss_mask[t] = 1`` means token ``input_ids[t]`` is trained (aligned with ``input_ids``), the
convention of verl's current SFT trainers, which slice ``loss_mask[:, 1:]`` against
``logits[:, :-1]``. With ``pad_mode: no_padding`` (the engine trainer's default) items are
unpadded; otherwise they are right-padded to ``max_length``. A row longer than ``max_length``
is refused: cutting it would train on a turn without its end.

This file is copied beside the data and imports only torch and pyarrow, so it runs wherever
verl does, without relearn.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset


def _get(config: Any, key: str, default: Any) -> Any:
    """A key of verl's data config (an OmegaConf DictConfig, or a plain dict in tests)."""
    getter = getattr(config, "get", None)
    return getter(key, default) if callable(getter) else getattr(config, key, default)


class RelearnSFTDataset(Dataset):
    def __init__(
        self, parquet_files: str | list[str], tokenizer: Any = None, config: Any = None, max_samples: int = -1, processor: Any = None
    ) -> None:
        files = [parquet_files] if isinstance(parquet_files, str) else list(parquet_files)
        self.rows: list[tuple[list[int], list[int]]] = []
        for file in files:
            table = pq.read_table(file, columns=["input_ids", "loss_mask"])
            self.rows += list(zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), strict=True))
        if max_samples is not None and max_samples > 0:
            self.rows = self.rows[:max_samples]
        self.max_length = int(_get(config, "max_length", 0) or 0)
        self.pad = _get(config, "pad_mode", "right") != "no_padding"
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, mask = self.rows[index]
        n = len(ids)
        if self.max_length and n > self.max_length:
            raise ValueError(
                f"row {index}: {n} tokens is longer than data.max_length {self.max_length}; raise it (relearn never cuts a trajectory)"
            )
        width = self.max_length if self.pad and self.max_length else n
        input_ids = torch.full((width,), self.pad_id, dtype=torch.long)
        input_ids[:n] = torch.tensor(ids, dtype=torch.long)
        attention_mask = torch.zeros(width, dtype=torch.long)
        attention_mask[:n] = 1
        loss_mask = torch.zeros(width, dtype=torch.long)
        loss_mask[:n] = torch.tensor(mask, dtype=torch.long)
        position_ids = torch.clamp(torch.cumsum(attention_mask, 0) - 1, min=0)
        item = {"input_ids": input_ids, "position_ids": position_ids, "loss_mask": loss_mask}
        if self.pad:
            item["attention_mask"] = attention_mask
        return item
