"""PNG plots of ``relearn stats``: TER over training steps, and what is excluded by category."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():  # noqa: ANN202 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")  # files only, no display (CI, SSH)
    import matplotlib.pyplot as plt

    return plt


def ter_figure(report: dict[str, Any]) -> Any | None:
    """Per-trajectory TER against the policy's training step, with the weighted TER of
    each step window; None when no trajectory has both a step and a TER. A pool of one
    training step gets a bar with its weighted TER written on it: a scatter in one column
    and a line across nothing read as an empty axis."""
    ter = report["ter"]
    points = [p for p in ter["points"] if p["step"] is not None]
    if not points:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 3.8))
    unit = ter["unit"]
    steps = sorted({p["step"] for p in points})
    if len(steps) == 1:
        eligible = sum(p["eligible"] for p in points)
        weighted = sum(p["ter"] * p["eligible"] for p in points) / eligible
        bars = axis.bar(steps, [weighted * 100], width=0.6, color="#C44E52", alpha=0.6, label=f"{unit}-weighted")
        axis.bar_label(bars, labels=[f"{weighted * 100:.1f}%"], padding=3, fontsize=9)
        axis.set_xticks(steps)
        axis.set_xlim(steps[0] - 1, steps[0] + 1)
        axis.set_ylim(0, max(1.0, max(p["ter"] for p in points) * 100) * 1.15)  # room for the label; 0% stays a visible axis
    axis.scatter(
        [p["step"] for p in points], [p["ter"] * 100 for p in points], s=10, alpha=0.35, color="#4C72B0", label="per trajectory", zorder=3
    )
    if ter["by"] == "step" and len(steps) > 1:
        windows = [g for g in ter["groups"] if g["window"] is not None and g["ter_token_weighted"] is not None]
        for number, g in enumerate(windows):
            lo, hi = g["window"]
            axis.hlines(
                g["ter_token_weighted"] * 100,
                lo - 0.5,
                hi + 0.5,
                colors="#C44E52",
                linewidth=2.5,
                label=f"{unit}-weighted per window" if number == 0 else None,
            )
    axis.set_xlabel("policy training step")
    axis.set_ylabel(f"TER (%, {unit})")
    weighted = ter["weighted"]
    axis.set_title(
        f"TER over training steps · {len(points)} trajectories · weighted {weighted * 100:.1f}%"
        if weighted is not None
        else "TER over training steps",
        fontsize=10,
    )
    axis.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    return figure


def ter_over_steps(report: dict[str, Any], path: Path) -> bool:
    """``ter_figure`` as a PNG; False when there is nothing to draw."""
    figure = ter_figure(report)
    if figure is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    _pyplot().close(figure)
    return True


def category_shares(report: dict[str, Any], path: Path) -> bool:
    """Share of excluded content by category (tokens, or characters without a dataset)
    beside trajectories by primary category; False when nothing was excluded."""
    excluded = report["excluded"]
    shares = excluded.get("token_share") or excluded.get("char_share") or {}
    unit = "tokens" if excluded.get("token_share") else "characters"
    primary = excluded.get("primary_category") or {}
    if not shares and not primary:
        return False
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    names = sorted(shares, key=lambda k: -shares[k])
    left.barh(names[::-1], [shares[k] * 100 for k in names[::-1]], color="#C44E52")
    left.set_xlabel(f"share of excluded {unit} (%)")
    left.set_title(f"excluded {unit} by category", fontsize=10)
    kinds = sorted(primary, key=lambda k: -primary[k])
    right.barh(kinds[::-1], [primary[k] for k in kinds[::-1]], color="#4C72B0")
    right.set_xlabel("trajectories")
    right.set_title("primary category per trajectory", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def primary_by_window(report: dict[str, Any], path: Path) -> bool:
    """Per step window (``--by-step-window``): its pooled TER beside the shares of its
    trajectories' primary categories (one label per trajectory, stacked to 100%); False
    without explicit windows."""
    windows = [g for g in report["ter"]["groups"] if "primary_share" in g and g["window"] is not None]
    if not windows:
        return False
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    labels = [g["group"] for g in windows]
    left.bar(labels, [(g["ter_token_weighted"] or 0) * 100 for g in windows], color="#C44E52")
    left.set_ylabel(f"TER (%, {report['ter']['unit']}, pooled)")
    left.set_title("TER per step window", fontsize=10)
    names = sorted({k for g in windows for k in g["primary_share"]})
    bottom = [0.0] * len(windows)
    for name in names:
        heights = [g["primary_share"].get(name, 0) * 100 for g in windows]
        right.bar(labels, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    right.set_ylabel("share of trajectories with defects (%)")
    right.set_title("primary category per window", fontsize=10)
    if names:
        right.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_plots(report: dict[str, Any], folder: Path) -> list[Path]:
    written = []
    for name, plot in (
        ("ter_over_steps.png", ter_over_steps),
        ("category_shares.png", category_shares),
        ("primary_by_window.png", primary_by_window),
    ):
        if plot(report, folder / name):
            written.append(folder / name)
    return written
