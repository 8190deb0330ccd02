"""``relearn stats``' options and the checks that refuse unusable ones before any record is read
(the statistics are ``relearn.stats.compute``'s). ``--context`` renders with ``relearn masks``'
defaults. The verb has no pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relearn.ops.masks import MasksOptions
from relearn.ops.outputs import check_json_output
from relearn.ops.reporting import OpError, check_writable
from relearn.options import option
from relearn.stats.compute import GroupKey, parse_step_windows
from relearn.view.catalog import DatasetInfo, UsageError

# The keys of the report `--json` writes: an existing file without them is not replaced.
STATS_KEYS = frozenset({"pools", "trajectories", "pass_at_k"})


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
    preserve_thinking: bool = option(
        MasksOptions.preserve_thinking, "With --context: render as `relearn masks` does with this preserve_thinking."
    )
    per_turn: bool = option(
        MasksOptions.per_turn, "With --context: render one sample per turn, as `relearn masks --per-turn` does.", flag_only=True
    )


@dataclass
class StatsPlan:
    """What the options ask for, made plain."""

    ks: tuple[int, ...]  # the k of pass@k
    by: GroupKey  # step with --by-step-window
    step_windows: list[tuple[int, int]] | None
    dataset: DatasetInfo | None


def check_options(options: StatsOptions) -> StatsPlan:
    """The plan of a run, or OpError for an option that cannot be used."""
    try:
        ks = tuple(sorted({int(x) for x in options.k.split(",") if x.strip()}))
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1:
        raise OpError(f"--k takes positive integers separated by commas, not {options.k!r}")
    try:
        step_windows = parse_step_windows(options.by_step_window) if options.by_step_window is not None else None
    except ValueError as exc:
        raise OpError(f"--by-step-window: {exc}") from None
    missing = [str(p) for p in [*options.pools, *([options.reviews] if options.reviews else [])] if not p.is_file()]
    if missing:
        raise OpError(f"no such file: {', '.join(missing)}")
    try:
        dataset = DatasetInfo.load(options.dataset) if options.dataset is not None else None
    except UsageError as exc:
        raise OpError(str(exc)) from None
    if options.json_out and options.json_out != "-":
        check_json_output(Path(options.json_out), STATS_KEYS, "a statistics file of `relearn stats`", flag="--json")
        check_writable(Path(options.json_out), "--json")
    if options.plots is not None:
        check_writable(options.plots, "--plots")
        if options.plots.exists() and not options.plots.is_dir():
            raise OpError(f"--plots {options.plots}: is a file, not a folder; give a new or existing folder")
    return StatsPlan(ks, "step" if step_windows is not None else options.by, step_windows, dataset)
