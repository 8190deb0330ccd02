"""What `relearn stats` accepts; the work is ``relearn.ops.stats``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relearn.options import option
from relearn.stats.compute import GroupKey
from relearn.verbs.masks import CHAT_TEMPLATE_HELP, MasksOptions


@dataclass
class StatsOptions:
    """Statistics of pools, reviews and datasets: outcomes and exit statuses, per-task pass@k, acceptance and rejection reasons, TER per trajectory and weighted by group, excluded content by category, lengths.

    Tables in the terminal; --json for every figure; --plots for PNGs (TER over training steps,
    category shares). TER is in tokens with --dataset (from `relearn masks`' stats.json), else
    estimated in characters and labelled so. Records are indexed once and the index is saved
    beside each file, so a rerun over a 100k pool reads no record. --context checks the context
    each turn is trained under against the prompt ids its call recorded, or names the protocol
    rule that decides it. Exit 1 when some records are unreadable (listed with file, line and
    field).
    """

    pools: list[Path] = option(help="Pools of trajectories (.jsonl or .jsonl.zst).", argument=True, metavar="POOL")
    reviews: Path | None = option(None, "Reviews JSONL: decisions, reasons, defect categories.", flags=("--reviews", "-r"))
    dataset: Path | None = option(
        None, "Dataset folder written by `relearn masks` (TER in tokens).", flags=("--dataset", "-d"), metavar="DIR"
    )
    k: str = option("1,5,10", "pass@k for these k (comma list); a task counts for k when it has k attempts.", metavar="K,K,...")
    by: GroupKey = option("step", "Group TER and outcomes by step (training-step windows), checkpoint, policy, task, exit or none.")
    windows: int = option(2, "With --by step: this many equal windows over the steps seen (2 = early vs late).", ge=1)
    window_size: int | None = option(None, "With --by step: fixed windows of this many steps instead.", ge=1)
    by_step_window: str | None = option(
        None, "Group by these step windows (FIRST-LAST, comma-separated, e.g. 1-20,81-100: the paper's early vs late), pooled and "
        "token-weighted, with each window's primary-category shares; implies --by step.", metavar="FIRST-LAST,...",
    )  # fmt: skip
    json_out: str | None = option(
        None, "Write every statistic as JSON to this file (`-`: stdout, no tables).", flags=("--json",), metavar="FILE"
    )
    plots: Path | None = option(
        None, "Write ter_over_steps.png and category_shares.png (and, with --by-step-window, primary_by_window.png) into this folder.",
        metavar="DIR",
    )  # fmt: skip
    tasks: int = option(20, "Per-task pass@k rows shown in the table (all are in --json).", ge=0)
    no_cache: bool = option(False, "Do not read or write the saved indexes (.FILE.view-index.jsonl).", flag_only=True)
    context: bool = option(
        False, "Check the context each turn is trained under against what the model saw: where a call recorded its prompt ids, the "
        "template's render of the history is tokenised and compared with them (turns that differ, and where); elsewhere the "
        "trajectory's protocol decides and the rule is counted. Reads every record once more.", flag_only=True,
    )  # fmt: skip
    tokenizer: str = option(
        MasksOptions.tokenizer, "With --context: the tokenizer and chat template of the masks (built-in qwen3.6, qwen3 for pools "
        "sampled from Qwen3, or a Hugging Face folder).", metavar="NAME|DIR",
    )  # fmt: skip
    chat_template: str | None = option(
        None, "With --context: " + CHAT_TEMPLATE_HELP + " A --dataset compiled with another template is warned of: the check "
        "would then describe another render than the one it was trained on.", metavar="NAME|FILE",
    )  # fmt: skip
    preserve_thinking: bool = option(
        MasksOptions.preserve_thinking, "With --context: render as `relearn masks` does with this preserve_thinking."
    )
    per_turn: bool = option(
        MasksOptions.per_turn, "With --context: render one sample per turn, as `relearn masks --per-turn` does.", flag_only=True
    )
