"""The pipeline's final report: every stage's counts, and the paper's comparison side by side.

Upstream vs Positive-Rollout SFT vs ROSS w/o mask vs ROSS on the same instances, scaffold and
budget (paired against Upstream: McNemar exact test, paired bootstrap CI), with what each
model was trained on (trajectories, supervised tokens, TER) and how its loss went; the three
contrasts' trajectory sets and how they relate; and, with an analyze stage, each model's NLL
on the kept (A \\ E) and excluded (E) tokens of the training pool and of held-out trajectories.
Markdown for people, JSON for scripts, PNGs for slides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from records.pools import write_text_atomic
from relearn.masks.scopes import ACTION_SCOPE
from relearn.pipeline.config import VARIANT_NAMES
from relearn.pipeline.runner import Stage, read_stamp, value_text

ORDER = ("upstream", "positive", "ross-nomask", "ross")


def loss_chart(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.6))
    for name, points in curves.items():
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("training loss (supervised NLL)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def contrasts_lines(contrasts: dict[str, Any]) -> list[str]:
    """The variants' trajectory sets: their sizes, their relation, the differences counted."""
    counts = contrasts["trajectories"]
    ordered = [v for v in ORDER if v in counts]
    lines = ["| contrast | trajectories |", "|---|---|"]
    lines += [f"| {VARIANT_NAMES[v]} (`{v}`) | {counts[v]} |" for v in ordered]
    differences = [f"{pair}: {n}" for pair, n in contrasts.get("only", {}).items() if n]
    lines += ["", f"Relation: {contrasts['relation']}. Trajectories in one and not the other: {'; '.join(differences) or 'none'}."]
    return lines


def analysis_lines(analysis: dict[str, Any]) -> list[str]:
    from relearn.analyze.split import models_markdown

    order = {name: i for i, name in enumerate(ORDER)}
    rows = sorted(analysis["rows"], key=lambda r: (r["pool"] != "train", order.get(r["model"], len(order))))
    return [
        "Token-weighted NLL (nats) of each model on the eligible tokens ROSS keeps (A \\ E) and those it excludes (E), split as "
        "`relearn masks --mode ross` compiles each trajectory with its review; `train` is the pool the variants were trained on, "
        "`heldout` the held-out tasks' trajectories, which no variant saw. Intervals: 95% bootstrap over trajectories; the Δ are "
        "paired (the same trajectories resampled for both models). The second table is the ablation's two steps: "
        "filtering (Positive-Rollout SFT → ROSS w/o mask) and masking (ROSS w/o mask → ROSS).",
        "",
        *models_markdown({**analysis, "rows": rows}, VARIANT_NAMES),
    ]


def write_pipeline_report(
    workdir: Path,
    stages: list[Stage],
    eval_names: list[str],
    train_dirs: dict[str, Path],
    eval_dirs: dict[str, Path],
    out: Path,
    *,
    contrasts: Path | None = None,
    analysis: Path | None = None,
) -> dict[str, Any]:
    """Read every finished stage's stamp and outputs; write report.md/json and the PNGs into ``out``."""
    from eval.report import compare, compare_chart, compare_markdown
    from relearn.train.checkpoints import read_metrics

    out.mkdir(parents=True, exist_ok=True)
    counts = {s.name: (read_stamp(workdir, s.name) or {}).get("counts", {}) for s in stages if s.name != "report"}
    seconds = {s.name: (read_stamp(workdir, s.name) or {}).get("seconds") for s in stages if s.name != "report"}
    report: dict[str, Any] = {"workdir": str(workdir), "stages": counts, "seconds": seconds}
    lines = [
        "# ROSS pipeline report",
        "",
        f"Work folder: `{workdir}`",
        "",
        "## Stages",
        "",
        "| stage | seconds | counts |",
        "|---|---|---|",
    ]
    for name, stage_counts in counts.items():
        lines.append(f"| {name} | {seconds[name] or '-'} | " + "; ".join(f"{k}: {value_text(v)}" for k, v in stage_counts.items()) + " |")

    if contrasts is not None and contrasts.is_file():
        sets = json.loads(contrasts.read_text())  # the ids stay in the stage's file; here only how many
        report["contrasts"] = {
            "trajectories": sets["trajectories"],
            "relation": sets["relation"],
            "only": {pair: len(ids) for pair, ids in sets.get("only", {}).items()},
        }
        lines += ["", "## What each contrast trains on", "", *contrasts_lines(report["contrasts"])]
    if analysis is not None and analysis.is_file():
        report["nll_kept_excluded"] = json.loads(analysis.read_text())
        lines += [
            "",
            "## NLL of kept and excluded tokens: start model and each trained variant",
            "",
            *analysis_lines(report["nll_kept_excluded"]),
        ]

    curves = {VARIANT_NAMES[v]: [(m["step"], m["loss"]) for m in read_metrics(d)] for v, d in train_dirs.items()}
    if curves:
        loss_chart(curves, out / "train_loss.png")
        report["train_loss_png"] = str(out / "train_loss.png")

    ordered = [n for n in ORDER if n in eval_names]
    if ordered:
        runs = [(VARIANT_NAMES[n], eval_dirs[n]) for n in ordered]
        comparison = compare(runs)
        trained_on = {VARIANT_NAMES[v]: counts.get(f"masks:{v}", {}) for v in train_dirs}
        report["comparison"] = comparison
        report["trained_on"] = trained_on
        compare_chart(comparison, out / "resolved.png")
        report["resolved_png"] = str(out / "resolved.png")
        lines += [
            "",
            "## Upstream vs Positive-Rollout SFT vs ROSS w/o mask vs ROSS",
            "",
            compare_markdown(comparison).split("\n", 2)[2].strip(),
            "",
        ]
        # TER under both defect scopes (the paper's is the quote-only one); the trained scope's is the first.
        lines += [
            "| model | trajectories trained on | supervised tokens | TER (trained) | TER action | TER minimal | loss first -> last |",
            "|---|---|---|---|---|---|---|",
        ]
        for v in train_dirs:
            m, t = counts.get(f"masks:{v}", {}), counts.get(f"train:{v}", {})
            scopes = m.get("ter_by_scope") or {}
            lines.append(
                f"| {VARIANT_NAMES[v]} | {m.get('trajectories_out', '-')} | {m.get('supervised_tokens', '-')} | {value_text(m.get('ter', '-'))} "
                f"| {value_text(scopes.get(ACTION_SCOPE, '-'))} | {value_text(scopes.get('minimal', '-'))} | {t.get('first_loss', '-')} -> {t.get('last_loss', '-')} |"
            )
        lines += ["", "![resolved](resolved.png)", "", "![training loss](train_loss.png)"]
    write_text_atomic(out / "report.json", json.dumps(report, indent=1, sort_keys=True, default=str))
    write_text_atomic(out / "report.md", "\n".join(lines) + "\n")
    return report
