"""Run reports and paired comparisons between runs.

A report gives the resolved rate with a bootstrap confidence interval, broken down by
repository, difficulty and exit status, and tokens and cost per instance;
infrastructure failures are counted apart from model failures. A comparison puts runs
side by side only when their manifests agree on scaffold, budget and instances, and
pairs them instance by instance: McNemar's exact test on the discordant pairs and a
paired bootstrap of the difference in resolved rate.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from math import comb
from pathlib import Path
from statistics import mean, median
from typing import Any

from eval.run import differences, latest_trajectories, load_manifest
from records.pools import RecordError, iter_lines, write_text_atomic

BOOTSTRAP_SAMPLES = 10_000
SEED = 0
COMPARABLE = ("scaffold", "budget", "dataset")


def bootstrap_ci(outcomes: list[bool], level: float = 0.95, samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> tuple[float, float]:
    if not outcomes:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(outcomes)
    rates = sorted(sum(rng.choice(outcomes) for _ in range(n)) / n for _ in range(samples))
    low = rates[int((1 - level) / 2 * samples)]
    high = rates[min(samples - 1, int((1 + level) / 2 * samples))]
    return low, high


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: discordant pairs b (only A) and c (only B)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(0, min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(a: list[bool], b: list[bool], samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> tuple[float, float]:
    """95% interval of rate(b) - rate(a) resampling instances (pairs stay together)."""
    rng = random.Random(seed)
    n = len(a)
    if n == 0:
        return 0.0, 0.0
    diffs = []
    for _ in range(samples):
        picks = [rng.randrange(n) for _ in range(n)]
        diffs.append(sum(b[i] - a[i] for i in picks) / n)
    diffs.sort()
    return diffs[int(0.025 * samples)], diffs[min(samples - 1, int(0.975 * samples))]


def infra_errors(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = run_dir / "infra_errors.jsonl"
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for _number, text in iter_lines(path):
            record = json.loads(text)
            out[record["task_id"]] = record
    return out


def build_report(run_dir: Path) -> dict[str, Any]:
    manifest = load_manifest(run_dir)
    errors: list[RecordError] = []
    trajectories = latest_trajectories(run_dir, errors)
    infra = {iid: r for iid, r in infra_errors(run_dir).items() if iid not in trajectories}
    instances: dict[str, dict[str, Any]] = manifest.get("instances", {})
    graded = sorted(trajectories)
    resolved = sorted(iid for iid in graded if trajectories[iid].outcome and trajectories[iid].outcome.resolved)
    outcomes = [iid in resolved for iid in graded]
    low, high = bootstrap_ci(outcomes)

    def breakdown(key: str) -> dict[str, dict[str, Any]]:
        groups: dict[str, list[bool]] = defaultdict(list)
        for iid in graded:
            groups[str(instances.get(iid, {}).get(key) or "unknown")].append(iid in resolved)
        return {name: {"instances": len(v), "resolved": sum(v), "rate": sum(v) / len(v)} for name, v in sorted(groups.items())}

    tokens = [(t.usage.total_tokens or 0) if t.usage else 0 for t in trajectories.values()]
    costs = [(t.usage.cost_usd or 0.0) if t.usage else 0.0 for t in trajectories.values()]
    return {
        "run": str(run_dir),
        "model": manifest["policy"]["model"],
        "checkpoint": manifest["policy"].get("checkpoint"),
        "selected": len(instances),
        "graded": len(graded),
        "resolved": len(resolved),
        "resolved_rate": len(resolved) / len(graded) if graded else 0.0,
        "resolved_rate_ci95": [low, high],
        "resolved_rate_of_selected": len(resolved) / len(instances) if instances else 0.0,
        "not_run": sorted(set(instances) - set(graded) - set(infra)),
        "infra_errors": {iid: r["error"] for iid, r in sorted(infra.items())},
        "resolved_ids": resolved,
        "unresolved_ids": sorted(set(graded) - set(resolved)),
        "by_repo": breakdown("repo"),
        "by_difficulty": breakdown("difficulty"),
        "by_exit_status": dict(sorted(Counter(t.exit_status.value for t in trajectories.values()).items())),
        "tokens_per_instance": {"mean": mean(tokens) if tokens else 0, "median": median(tokens) if tokens else 0, "total": sum(tokens)},
        "cost_per_instance_usd": {"mean": mean(costs) if costs else 0.0, "median": median(costs) if costs else 0.0, "total": sum(costs)},
        "unreadable_records": [str(e) for e in errors],
        "budget": manifest["budget"],
        "scaffold": manifest["scaffold"]["version"],
    }


def report_markdown(report: dict[str, Any]) -> str:
    low, high = report["resolved_rate_ci95"]
    lines = [
        f"# Evaluation: {report['model']}" + (f" ({report['checkpoint']})" if report.get("checkpoint") else ""),
        "",
        f"Resolved **{report['resolved']} / {report['graded']}** = **{report['resolved_rate']:.1%}** (95% bootstrap CI {low:.1%}–{high:.1%}); "
        f"{len(report['infra_errors'])} infrastructure failures kept apart; {len(report['not_run'])} not run.",
        "",
        f"Scaffold {report['scaffold']}; budget {json.dumps(report['budget'])}.",
        "",
    ]
    for title, key in (("By repository", "by_repo"), ("By difficulty", "by_difficulty")):
        lines += [f"## {title}", "", "| group | instances | resolved | rate |", "|---|---|---|---|"]
        lines += [f"| {name} | {g['instances']} | {g['resolved']} | {g['rate']:.1%} |" for name, g in report[key].items()]
        lines.append("")
    lines += ["## By exit status", "", "| exit status | instances |", "|---|---|"]
    lines += [f"| {name} | {count} |" for name, count in report["by_exit_status"].items()]
    tokens, cost = report["tokens_per_instance"], report["cost_per_instance_usd"]
    lines += [
        "",
        f"Tokens per instance: mean {tokens['mean']:.0f}, median {tokens['median']:.0f}. Cost per instance: mean ${cost['mean']:.4f}, total ${cost['total']:.4f}.",
        "",
    ]
    if report["infra_errors"]:
        lines += ["## Infrastructure failures", ""] + [f"- {iid}: {error}" for iid, error in report["infra_errors"].items()] + [""]
    return "\n".join(lines)


def write_report(run_dir: Path) -> dict[str, Any]:
    report = build_report(run_dir)
    write_text_atomic(run_dir / "report.json", json.dumps(report, indent=1, sort_keys=True))
    write_text_atomic(run_dir / "report.md", report_markdown(report))
    return report


class NotComparable(ValueError):
    pass


def compare(runs: list[tuple[str, Path]]) -> dict[str, Any]:
    """Side by side, paired against the first run (the baseline)."""
    manifests = [(name, load_manifest(path)) for name, path in runs]
    base_name, base_manifest = manifests[0]
    for name, manifest in manifests[1:]:
        changed = differences(base_manifest, manifest, COMPARABLE)
        if changed:
            raise NotComparable(f"{name} is not comparable with {base_name}: " + "; ".join(changed))
    reports = [(name, build_report(path)) for name, path in runs]
    common = set(reports[0][1]["resolved_ids"]) | set(reports[0][1]["unresolved_ids"])
    for _name, report in reports[1:]:
        common &= set(report["resolved_ids"]) | set(report["unresolved_ids"])
    ids = sorted(common)
    base_resolved = set(reports[0][1]["resolved_ids"])
    a = [iid in base_resolved for iid in ids]
    rows = []
    for name, report in reports:
        resolved = set(report["resolved_ids"])
        b = [iid in resolved for iid in ids]
        only_base = sum(x and not y for x, y in zip(a, b, strict=True))
        only_this = sum(y and not x for x, y in zip(a, b, strict=True))
        rate = sum(b) / len(ids) if ids else 0.0
        rows.append(
            {
                "name": name,
                "model": report["model"],
                "resolved": sum(b),
                "rate": rate,
                "rate_ci95": list(bootstrap_ci(b)),
                "diff_vs_baseline": rate - (sum(a) / len(ids) if ids else 0.0),
                "diff_ci95": list(paired_bootstrap(a, b)),
                "only_baseline": only_base,
                "only_this": only_this,
                "mcnemar_p": mcnemar_exact(only_base, only_this),
            }
        )
    return {
        "baseline": base_name,
        "paired_instances": len(ids),
        "budget": base_manifest["budget"],
        "scaffold": base_manifest["scaffold"]["version"],
        "runs": rows,
    }


def compare_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Comparison on {result['paired_instances']} paired instances (baseline: {result['baseline']})",
        "",
        f"Same scaffold ({result['scaffold']}) and budget {json.dumps(result['budget'])}.",
        "",
        "| run | model | resolved | rate (95% CI) | Δ vs baseline (95% paired CI) | only baseline / only this | McNemar p |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        lo, hi = r["rate_ci95"]
        dlo, dhi = r["diff_ci95"]
        lines.append(
            f"| {r['name']} | {r['model']} | {r['resolved']} | {r['rate']:.1%} ({lo:.1%}–{hi:.1%}) | {r['diff_vs_baseline']:+.1%} ({dlo:+.1%}–{dhi:+.1%}) | {r['only_baseline']} / {r['only_this']} | {r['mcnemar_p']:.3g} |"
        )
    return "\n".join(lines) + "\n"


def compare_chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in result["runs"]]
    rates = [r["rate"] * 100 for r in result["runs"]]
    errors = [
        [(r["rate"] - r["rate_ci95"][0]) * 100 for r in result["runs"]],
        [(r["rate_ci95"][1] - r["rate"]) * 100 for r in result["runs"]],
    ]
    figure, axis = plt.subplots(figsize=(max(4, 1.6 * len(names)), 3.6))
    bars = axis.bar(names, rates, yerr=errors, capsize=4, color="#4C72B0")
    for bar, rate in zip(bars, rates, strict=True):
        axis.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1, f"{rate:.1f}%", ha="center", va="bottom", fontsize=9)
    axis.set_ylabel("resolved (%)")
    axis.set_ylim(0, 105)
    axis.set_title(f"{result['paired_instances']} paired instances, same scaffold and budget", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
