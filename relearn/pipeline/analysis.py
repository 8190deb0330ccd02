"""The pipeline's analyze stage: NLL of kept (A \\ E) and excluded (E) tokens under the start
model and each trained variant, on the training pool and the held-out trajectories.

Scores are cached per model in ``analyze/MODEL/nll-scores.jsonl`` by model folder, tokenizer
and review (``relearn.analyze.nll``), so a rerun after one variant was retrained scores only
that one.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.progress import Progress

from records.pools import count_records, write_text_atomic
from relearn.analyze.pools import NamedPool
from relearn.pipeline.config import VARIANT_NAMES, AnalyzeConfig, MasksConfig


def analyze_models(
    models: dict[str, Path],
    pools: list[NamedPool],
    reviews: dict[str, Any],
    review_problems: list[str],
    tokenizer: Any,
    masks: MasksConfig,
    options: AnalyzeConfig,
    out: Path,
    progress: Progress,
) -> dict[str, Any]:
    """Score ``pools`` under each of ``models`` (the start model first: the paired differences
    are against it) and write ``out/nll.json`` and ``out/nll.md``; returns the stage's summary."""
    import torch

    from relearn.analyze.nll import Scorer, Settings, folder_fingerprint, score_pools
    from relearn.analyze.nll_report import analyze, compare_models, markdown
    from relearn.analyze.split import models_markdown
    from relearn.masks.compile import MaskOptions
    from relearn.train.model import build_model

    template_kwargs = MaskOptions().template_kwargs  # what the masks stages render with
    records = sum(count_records(pool.path) for pool in pools)
    scored: dict[str, list[Any]] = {}
    with progress:
        bar = progress.add_task("analyze", total=records * len(models))
        for name, folder in models.items():

            def load(folder: Path = folder) -> tuple[Any, Any]:
                scorer = Scorer(
                    build_model(init=str(folder), dtype=torch.bfloat16 if options.bf16 else torch.float32),
                    device=options.device,
                    chunk=options.chunk,
                )
                if len(tokenizer) > scorer.vocab_size:
                    raise ValueError(
                        f"{folder}: the tokenizer has {len(tokenizer):,} tokens but the model's vocabulary is {scorer.vocab_size:,}"
                    )
                return tokenizer, scorer

            settings = Settings(
                model=str(folder.resolve()), tokenizer=masks.tokenizer, dtype="bfloat16" if options.bf16 else "float32",
                template_kwargs=template_kwargs, fingerprint=folder_fingerprint(str(folder)), defect_scope=masks.defect_scope,
            )  # fmt: skip
            folder_out = out / name
            results = score_pools(
                pools,
                settings,
                load,
                folder_out,
                ctx=masks.ctx,
                positive_only=True,
                reviews=reviews,
                on_record=lambda: progress.advance(bar),
            )
            single = analyze(results, settings, masks.ctx, samples=options.bootstrap)
            write_text_atomic(folder_out / "nll.json", json.dumps(single, indent=1))
            write_text_atomic(folder_out / "nll.md", markdown(single))
            scored[name] = results
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
