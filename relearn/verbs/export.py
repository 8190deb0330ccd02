"""What the `relearn export` verbs accept (pool, dataset, masks); the work is ``relearn.ops.export``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.import_run import ChatPreset
from relearn.options import option
from relearn.verbs.masks import CHAT_TEMPLATE_HELP

PoolFormat = Literal["atif", "hf", "chat"]
# relearn.export.trainers.FORMATS, named here without loading the exporters (numpy, pyarrow).
Trainer = Literal["trl", "axolotl", "verl", "llamafactory", "hf"]


@dataclass
class PoolExportOptions:
    """``relearn export atif|hf|chat POOL... -o OUTPUT``."""

    pools: list[Path] = option(help="Pool files (.jsonl or .jsonl.zst).", argument=True, metavar="POOL")
    output: Path = option(
        help="atif: a directory (one <id>.trajectory.json each); hf: a .jsonl file; chat: a .jsonl, .jsonl.zst or .parquet file.",
        flags=("-o", "--output"),
    )  # fmt: skip
    format: PoolFormat = "hf"  # the verb's name (`relearn export atif`), not a flag of it
    preset: ChatPreset | None = option(
        None, "Rows in the shape of a published set (what `relearn import chat --preset` reads); default: the generic OpenAI form.",
        metavar=f"[{'|'.join(ChatPreset)}]",
    )  # fmt: skip


@dataclass
class DatasetExportOptions:
    """Write a compiled dataset in a trainer's own pre-tokenized format, supervising exactly the tokens its loss_mask marks.

    trl: Parquet input_ids + assistant_masks (SFTTrainer builds labels from them). axolotl: Parquet input_ids, attention_mask, labels (-100 where not supervised). llamafactory: the same as a save_to_disk folder for tokenized_path. verl: Parquet input_ids + loss_mask and relearn_verl_dataset.py for data.custom_cls. hf: sample and trajectory ids, input_ids, loss_mask, labels and a per-trajectory weight, as Parquet and save_to_disk.

    Beside the data: rows.jsonl (each row's sample and trajectory) and relearn-export.json (tokenizer, chat template hash, the loss that trainer computes and how far it is from relearn's per-trajectory loss). Rows with no supervised token are left out and counted.

    Set the trainer's length limit to at least the longest row (`relearn masks --ctx`): axolotl drops every row longer than its `sequence_len` (512 tokens unless set; its default `excess_length_strategy: drop`), and TRL cuts rows at `max_length` (1,024 unless set; `max_length=None` keeps them whole).
    """

    dataset: Path = option(
        help="A folder `relearn masks` wrote (shard-*.parquet, stats.json); any of the three contrasts.", argument=True,
        metavar="DATASET_DIR",
    )  # fmt: skip
    trainer: Trainer = option(help="The trainer whose format to write.", flags=("--for",))
    output: Path = option(help="Folder to write (it appears whole or not at all).", flags=("-o", "--output"), metavar="DIR")
    tokenizer: str | None = option(
        None, "The tokenizer your trainer will load (`qwen3.6` or a folder): refused unless its vocabulary and chat template are the "
        "ones the dataset was compiled with.",
    )  # fmt: skip
    chat_template: str | None = option(
        None, CHAT_TEMPLATE_HELP + " The template your trainer will render with, with --tokenizer (or the dataset's tokenizer): "
        "refused unless it is the one the dataset was compiled with.", metavar="NAME|FILE",
    )  # fmt: skip
    rows_per_file: int = option(10_000, "Rows per Parquet file.", ge=1)
    overwrite: bool = option(False, "Replace OUTPUT if it exists.")


@dataclass
class MasksExportOptions:
    """Write each sample's A \\ E selection as JSONL: the rendered text, the supervised token runs [start, end) and the same runs as character ranges of the text.

    A trainer with another tokenization supervises the tokens lying wholly inside a character range; one with this tokenizer can use the token runs.
    """

    dataset: Path = option(help="A folder `relearn masks` wrote.", argument=True, metavar="DATASET_DIR")
    output: Path = option(help="JSONL file (.jsonl or .jsonl.zst).", flags=("-o", "--output"), metavar="FILE")
    tokenizer: str | None = option(None, "Tokenizer to decode with (default: the one the dataset records); refused unless it is that one.")
    chat_template: str | None = option(
        None, CHAT_TEMPLATE_HELP + " For a dataset compiled with `relearn masks --chat-template`: the tokenizer is checked with "
        "this template, and refused unless it is the one the dataset was compiled with.", metavar="NAME|FILE",
    )  # fmt: skip
