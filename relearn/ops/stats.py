"""``relearn stats``' options and the checks that refuse unusable ones before any record is read
(the statistics are ``relearn.stats.compute``'s). ``--context`` renders with ``relearn masks``'
defaults. The verb has no pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relearn.ops.outputs import POOL, REVIEWS, check_json_output, check_jsonl_input
from relearn.ops.reporting import OpError, check_writable
from relearn.stats.compute import GroupKey, parse_step_windows
from relearn.verbs.stats import StatsOptions
from relearn.view.catalog import DatasetInfo, UsageError

# The keys of the report `--json` writes: an existing file without them is not replaced.
STATS_KEYS = frozenset({"pools", "trajectories", "pass_at_k"})


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
    for pool in options.pools:
        check_jsonl_input(pool, POOL, flag="POOL")
    if options.reviews is not None:
        check_jsonl_input(options.reviews, REVIEWS, flag="--reviews")
    try:
        dataset = DatasetInfo.load(options.dataset) if options.dataset is not None else None
    except UsageError as exc:
        raise OpError(str(exc)) from None
    if options.chat_template is not None and not options.context:
        raise OpError("--chat-template: only with --context (the only statistic that renders a template)")
    if options.json_out and options.json_out != "-":
        check_json_output(Path(options.json_out), STATS_KEYS, "a statistics file of `relearn stats`", flag="--json")
        check_writable(Path(options.json_out), "--json")
    if options.plots is not None:
        check_writable(options.plots, "--plots")
        if options.plots.exists() and not options.plots.is_dir():
            raise OpError(f"--plots {options.plots}: is a file, not a folder; give a new or existing folder")
    return StatsPlan(ks, "step" if step_windows is not None else options.by, step_windows, dataset)


def context_tokenizer(options: StatsOptions, dataset: DatasetInfo | None) -> tuple[Any, list[str]]:
    """``--context``'s tokenizer, rendering with ``--chat-template`` where one is named, and a
    warning when ``--dataset`` was compiled with another template. A warning, not a refusal:
    the check is still true of the template it rendered with and the dataset's figures are read
    as compiled, but it then describes another render than the one the dataset trains on."""
    from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template, with_chat_template  # transformers: slow, only here

    try:
        template = resolve_chat_template(options.chat_template) if options.chat_template is not None else None
    except (ValueError, OSError) as exc:
        raise OpError(f"--chat-template {options.chat_template}: {exc}") from None
    try:
        tokenizer = with_chat_template(load_tokenizer(options.tokenizer), template)
    except (ValueError, OSError) as exc:
        raise OpError(f"--tokenizer {options.tokenizer}: {exc}") from None
    return tokenizer, [w for w in [other_template(dataset, tokenizer, options)] if w]


def other_template(dataset: DatasetInfo | None, tokenizer: Any, options: StatsOptions) -> str | None:
    """Why --context's render is not the dataset's, if it is not."""
    from relearn.export.source import shipped_template_named
    from relearn.masks.shards import chat_template_sha256

    compiled = dataset.stats.get("chat_template_sha256") if dataset is not None else None
    rendered = chat_template_sha256(tokenizer)
    if dataset is None or not isinstance(compiled, str) or compiled == rendered:
        return None  # a dataset from before templates were recorded says nothing to compare
    named = shipped_template_named(compiled)
    fix = f" (trl's {named}: add --chat-template {named})" if named else ""
    used = f"--chat-template {options.chat_template}" if options.chat_template is not None else f"{options.tokenizer}'s own template"
    return (
        f"--context rendered with {used} (sha256 {rendered[:12]}), but {dataset.path} was compiled with another (sha256 "
        f"{compiled[:12]}){fix}: the context check describes another render than the dataset's"
    )
