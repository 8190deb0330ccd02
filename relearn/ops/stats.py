"""``relearn stats``' options and the checks that refuse unusable ones before any record is read
(the statistics are ``relearn.stats.compute``'s). ``--context`` renders with ``relearn masks``'
defaults. The verb has no pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relearn.ops.outputs import check_json_output
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
