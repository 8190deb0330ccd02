"""The pipeline's analyze stage: NLL of kept (A \\ E) and excluded (E) tokens under the start
model and each trained variant, on the training pool and the held-out trajectories.

Each model is scored by `relearn analyze nll` (``relearn.ops.analyze.run_nll``), with the
masks' tokenizer, context, defect scope and thinking form, into ``analyze/MODEL/``; its score
cache is keyed by model folder, tokenizer and review, so a rerun after one variant was
retrained scores only that one. The comparison across models is written to ``analyze/``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from records.pools import write_text_atomic
from relearn.analyze.pools import NamedPool
from relearn.ops.analyze import run_nll
from relearn.ops.reporting import Reporter
from relearn.pipeline.config import VARIANT_NAMES, AnalyzeConfig, MasksConfig


def analyze_models(
    models: dict[str, Path],
    pools: list[NamedPool],
    reviews: Path,
    masks: MasksConfig,
    options: AnalyzeConfig,
    out: Path,
    reporter: Reporter,
    *,
    ray: str | None = None,
) -> dict[str, Any]:
    """Score ``pools`` under each of ``models`` (the start model first: the paired differences
    are against it) and write ``out/nll.json`` and ``out/nll.md``; returns the stage's summary."""
    from relearn.analyze.nll_report import compare_models
    from relearn.analyze.split import models_markdown

    scored: dict[str, list[Any]] = {}
    review_problems: list[str] = []
    for name, folder in models.items():
        reporter.note(f"scoring under {name}")
        summary = run_nll(options.nll_options(pools, out / name, str(folder), reviews, masks, ray=ray), reporter)
        scored[name] = summary.pools
        review_problems = review_problems or summary.review_problems
    # The two contrasts of the paper's ablation: filtering (positive -> ross-nomask), then masking (-> ross).
    comparison = compare_models(scored, samples=options.bootstrap, pairs=[("positive", "ross-nomask"), ("ross-nomask", "ross")])
    comparison["reviews_unreadable"] = review_problems[:20]
    comparison["models"] = {name: str(folder) for name, folder in models.items()}
    write_text_atomic(out / "nll.json", json.dumps(comparison, indent=1))
    lines = ["# NLL of kept (A \\ E) and excluded (E) tokens", "", *models_markdown(comparison, VARIANT_NAMES), ""]
    write_text_atomic(out / "nll.md", "\n".join(lines))
    start = scored[next(iter(models))]
    return {
        "models": len(models),
        **{f"{p.name}_trajectories": len(p.scores) for p in start},
        **{f"{p.name}_split": sum(1 for s in p.scores if "split" in s) for p in start},
        "not_split": dict(sum((p.not_split for p in start), Counter())),
        "rejected": sum(len(p.rejected) for p in start),
        "reused": sum(p.reused for results in scored.values() for p in results),
    }
