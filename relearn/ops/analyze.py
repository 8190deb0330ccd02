"""``relearn analyze nll`` / ``passk`` and the pipeline's analyze stage.

NLL scoring is set up here once, for both front-ends: the model and tokenizer are loaded by a
``relearn.analyze.nll.ModelSpec`` (in this process, in each worker process, or on each Ray
node), the score cache is keyed by the same ``Settings``, and the results are written the same
way, so the pipeline's per-model scores equal `relearn analyze nll` on the same pool."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.executor import Needs
from records.pools import count_records, write_text_atomic
from relearn.analyze.nll import ModelLoadError, ModelSpec, PoolScores, Settings, folder_fingerprint, score_pools
from relearn.analyze.nll_report import analyze, markdown
from relearn.ops.containers import process_backend
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.analyze import NllOptions, PasskOptions


@dataclass
class NllSummary:
    result: dict[str, Any]  # what nll.json holds (relearn.analyze.nll_report.analyze)
    pools: list[PoolScores]
    review_problems: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.rejected or self.review_problems)


def check_options(options: NllOptions) -> None:
    if (options.model is None) == (options.tiny is None):
        raise OpError("give exactly one of --model FOLDER or --tiny NAME")
    if options.model is not None and not Path(options.model).is_dir():
        raise OpError(f"--model {options.model}: no such folder")
    if options.reviews is not None and not options.reviews.is_file():
        raise OpError(f"--reviews {options.reviews}: no such file")
    if options.ctx < 2:  # the pipeline scores at [masks].ctx, which may be 1
        raise OpError(f"--ctx {options.ctx}: must be at least 2")
    if not options.pools:
        raise OpError("give at least one --pool NAME=PATH")
    for pool in options.pools:
        if not pool.path.is_file():
            raise OpError(f"--pool {pool.name}={pool.path}: no such file")
    if options.workers > 1 and options.device != "cpu":
        raise OpError("--workers runs CPU processes: score on GPUs with --ray")
    if options.ray is None or not options.device.startswith("cuda"):  # on a cluster, the nodes' GPUs count, not this machine's
        _check_device(options.device)


def _check_device(device: str) -> None:
    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise OpError(f"--device must be cpu or cuda[:N], not {device!r}")
    import torch

    if not torch.cuda.is_available():
        raise OpError(f"--device {device}: no CUDA device is available here")


def chat_template_text(options: NllOptions) -> str | None:
    """--chat-template's text (None: the tokenizer's own template)."""
    if options.chat_template is None:
        return None
    from relearn.masks.tokenizers import resolve_chat_template  # transformers: slow, only here

    try:
        return resolve_chat_template(options.chat_template)
    except (ValueError, OSError) as exc:
        raise OpError(f"--chat-template {options.chat_template}: {exc}") from None


def nll_settings(options: NllOptions, template: str | None = None) -> Settings:
    """What decides the scores (the score cache's key); ``template``: --chat-template's text."""
    name = options.tokenizer_name
    return Settings(
        model=f"tiny:{options.tiny}:seed={options.seed}" if options.tiny else str(Path(str(options.model)).resolve()),
        tokenizer=name if not Path(name).is_dir() else str(Path(name).resolve()),
        dtype="bfloat16" if options.bf16 else "float32",
        template_kwargs={"preserve_thinking": options.preserve_thinking},
        fingerprint=folder_fingerprint(*([options.model] if options.model else []), name),
        defect_scope=options.defect_scope,
        context=options.context,
        chat_template=hashlib.sha256(template.encode()).hexdigest() if template is not None else None,
    )


def model_spec(options: NllOptions, template: str | None = None) -> ModelSpec:
    # A Ray unit sees the GPU Ray gave it as cuda (cuda:0), whatever index was named here.
    device = "cuda" if options.ray is not None and options.device.startswith("cuda") else options.device
    return ModelSpec(
        options.model, options.tiny, options.seed, options.tokenizer_name, options.attn, options.bf16, device, options.chunk, template
    )


def run_nll(options: NllOptions, reporter: Reporter = SILENT) -> NllSummary:
    """Score every pool under one model, write ``out/nll.json`` and ``out/nll.md`` (and
    ``nll.png``); a rerun takes what the score cache holds. Raises ``OpError`` for unusable
    options, a model that cannot be loaded, or when no trajectory could be scored; a batch a
    worker could not score raises ``RuntimeError``."""
    from relearn.masks.shards import load_reviews

    check_options(options)
    template = chat_template_text(options)
    review_problems: list[str] = []
    reviews = load_reviews(options.reviews, review_problems) if options.reviews is not None else None
    settings = nll_settings(options, template)
    total = sum(count_records(p.path, options.limit) for p in options.pools)
    needs = Needs(gpus=1) if options.device.startswith("cuda") else Needs(cpus=1)  # on Ray, a GPU per unit with --device cuda
    threads = max(1, (os.cpu_count() or 1) // options.workers)  # the CPU worker processes share this machine's cores
    try:
        with process_backend(options.ray, needs, options.workers, threads) as backend, stage(reporter, "scoring NLL", total):
            results = score_pools(
                options.pools, settings, model_spec(options, template), options.out, ctx=options.ctx, limit=options.limit,
                positive_only=options.positive_only, reviews=reviews, on_record=reporter.advance, backend=backend, batch=options.batch,
            )  # fmt: skip
            per_node = dict(getattr(backend, "per_node", {}) or {})
    except ModelLoadError as exc:
        raise OpError(str(exc)) from None
    rejected = [str(e) for r in results for e in r.rejected]
    review_problems += [problem for r in results for problem in r.review_errors]
    if not any(r.scores for r in results):
        skipped = {reason: n for r in results for reason, n in r.skipped.items()}
        raise OpError(f"{options.out}: no trajectory could be scored (skipped: {skipped or 'none'}, rejected: {len(rejected)})")
    result = analyze(results, settings, options.ctx, samples=options.bootstrap)
    write_text_atomic(options.out / "nll.json", json.dumps(result, indent=1))
    write_text_atomic(options.out / "nll.md", markdown(result))
    if options.chart:
        from relearn.analyze.plots import nll_chart

        nll_chart(result, options.out / "nll.png")
    return NllSummary(result, results, review_problems, rejected, per_node)


@dataclass
class PasskSummary:
    result: dict[str, Any]
    rejected: list[str]

    @property
    def partial(self) -> bool:
        return bool(self.rejected)


def run_passk(options: PasskOptions, reporter: Reporter = SILENT) -> PasskSummary:
    """Per-problem success rates and pass@k curves of each pool; writes passk.json/.md/.png."""
    from relearn.analyze.passk import analyze as passk_analyze
    from relearn.analyze.passk import markdown as passk_markdown
    from relearn.analyze.passk import read_outcomes
    from relearn.analyze.plots import passk_chart

    if not options.pools:
        raise OpError("give at least one --pool NAME=PATH")
    for pool in options.pools:
        if not pool.path.is_file():
            raise OpError(f"--pool {pool.name}={pool.path}: no such file")
    total = sum(count_records(p.path, options.limit) for p in options.pools)
    with stage(reporter, "reading pools", total):
        outcomes = [read_outcomes(p, options.limit, on_record=reporter.advance) for p in options.pools]
    rejected = [str(e) for o in outcomes for e in o.rejected]
    if not any(o.table for o in outcomes):
        raise OpError(f"no verified trajectory with a task_id in any pool (rejected: {len(rejected)})")
    result = passk_analyze(outcomes, options.max_k)
    for p in result["pools"]:
        fewer = [point for point in p["curve"] if point["problems"] < p["problems"]]
        if fewer:
            reporter.note(
                f"{p['name']}: from k={fewer[0]['k']} on, pass@k averages only the problems with at least k attempts "
                f"({fewer[-1]['problems']} of {p['problems']} at k={fewer[-1]['k']})"
            )
    write_text_atomic(options.out / "passk.json", json.dumps(result, indent=1))
    write_text_atomic(options.out / "passk.md", passk_markdown(result))
    passk_chart(result, options.out / "passk.png")
    return PasskSummary(result, rejected)
