"""PNGs for ``relearn analyze``: what people would rather see than read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none needed
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(tmp, dpi=120)
    tmp.replace(path)  # a reader never sees half a PNG


def nll_chart(result: dict[str, Any], path: Path) -> None:
    """Left: histograms of per-trajectory mean NLL, one per pool. Right: box plots of the same,
    with each pool's token-weighted NLL as a diamond."""
    plt = _pyplot()
    pools = [p for p in result["pools"] if p["scored"]]
    means = {p["name"]: [s["nll_mean"] for s in result["trajectories"][p["name"]]] for p in pools}
    figure, (hist, box) = plt.subplots(1, 2, figsize=(11, 4))
    values = [v for m in means.values() for v in m]
    if values:
        lo, hi = min(values), max(values)
        bins = 30 if hi > lo else 1
        for i, p in enumerate(pools):
            hist.hist(
                means[p["name"]],
                bins=bins,
                range=(lo, hi + 1e-9),
                histtype="step",
                linewidth=1.6,
                color=COLORS[i % len(COLORS)],
                label=f"{p['name']} ({p['scored']})",
            )
        hist.legend(fontsize=8)
        names = [p["name"] for p in pools]
        box.boxplot([means[n] for n in names], showfliers=True)
        box.set_xticks(range(1, len(names) + 1), names)
        box.scatter(
            range(1, len(names) + 1), [p["nll_per_token"] for p in pools], marker="D", color="#C44E52", zorder=3, label="token-weighted"
        )
        box.legend(fontsize=8)
    hist.set_xlabel("mean NLL per eligible token (nats), per trajectory")
    hist.set_ylabel("trajectories")
    box.set_ylabel("NLL per eligible token (nats)")
    figure.suptitle(f"NLL under {result['settings']['model']}", fontsize=10)
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)


def passk_chart(result: dict[str, Any], path: Path) -> None:
    """Left: pass@k curves. Right: per-problem success rate of the first pool against the
    second (points on an axis: solved by one pool only), or a histogram with one pool."""
    plt = _pyplot()
    pools = result["pools"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    partial = False
    for i, p in enumerate(pools):
        color = COLORS[i % len(COLORS)]
        ks = [point["k"] for point in p["curve"]]
        left.plot(ks, [100 * point["pass"] for point in p["curve"]], color=color, label=p["name"])
        for point in p["curve"]:
            # Hollow: this point averages only the problems with at least k attempts.
            whole = point["problems"] == p["problems"]
            partial |= not whole
            left.plot(point["k"], 100 * point["pass"], marker="o", markersize=4, color=color, markerfacecolor=color if whole else "white")
    if partial:
        left.text(0.02, 0.02, "hollow: fewer problems (not all have k attempts)", transform=left.transAxes, fontsize=8)
    from matplotlib.ticker import MaxNLocator

    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("k")
    left.set_ylabel("pass@k (%)")
    left.set_ylim(0, 105)
    left.legend(fontsize=8)
    left.set_title("unbiased pass@k", fontsize=10)
    problems = result["problems"]
    if len(pools) >= 2:
        a, b = pools[0]["name"], pools[1]["name"]
        both = [(row[a]["rate"], row[b]["rate"]) for row in problems.values() if a in row and b in row]
        right.scatter([x for x, _ in both], [y for _, y in both], alpha=0.5, s=18, color=COLORS[0])
        right.plot([0, 1], [0, 1], color="#8C8C8C", linewidth=0.8)
        pair = result["pairs"][0]
        right.text(0.98, 0.02, f"only {a}: {pair['only_a']}", ha="right", va="bottom", transform=right.transAxes, fontsize=9)
        right.text(0.02, 0.98, f"only {b}: {pair['only_b']}", ha="left", va="top", transform=right.transAxes, fontsize=9)
        right.set_xlabel(f"success rate, {a}")
        right.set_ylabel(f"success rate, {b}")
        right.set_xlim(-0.05, 1.05)
        right.set_ylim(-0.05, 1.05)
        right.set_title(f"{pair['problems']} problems in both", fontsize=10)
    elif pools:
        name = pools[0]["name"]
        right.hist([row[name]["rate"] for row in problems.values() if name in row], bins=10, range=(0, 1), color=COLORS[0])
        right.set_xlabel("success rate per problem")
        right.set_ylabel("problems")
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)
