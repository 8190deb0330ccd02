"""``relearn analyze nll`` / ``passk`` and the pipeline's analyze stage.

NLL scoring is set up here once, for both front-ends: the model and tokenizer are loaded by a
``relearn.analyze.nll.ModelSpec`` (in this process, in each worker process, or on each Ray
node), the score cache is keyed by the same ``Settings``, and the results are written the same
way, so the pipeline's per-model scores equal `relearn analyze nll` on the same pool."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envs.executor import Needs
from records.pools import count_records, write_text_atomic
from relearn.analyze.nll import BATCH, ModelLoadError, ModelSpec, PoolScores, Settings, folder_fingerprint, score_pools
from relearn.analyze.nll_report import analyze, markdown
from relearn.analyze.pools import NamedPool
from relearn.analyze.split import BOOTSTRAP_SAMPLES
from relearn.masks.compile import Context, DefectScope
from relearn.ops.containers import ContainerOptions, process_backend
from relearn.ops.masks import MasksOptions
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.options import option, same_as
from relearn.train.options import TrainOptions

BUILTIN_TOKENIZER = MasksOptions.tokenizer
POOL_HELP = (
    "A pool as NAME=PATH (.jsonl or .jsonl.zst); repeat for several, e.g. --pool historical=a.jsonl --pool current=b.jsonl. "
    "The first is the baseline."
)
PIPELINE_MODELS = "the pipeline scores its own pools (training, held-out) under its own models (the start model, each variant)"
AS_MASKS = "the pipeline scores as its [masks] compiled"


@dataclass
class NllOptions:
    """Compatibility: token-level NLL of each pool's eligible tokens under one model.

    Each trajectory is rendered over the chat template and scored on its eligible tokens A (generated assistant turns, as `relearn masks` finds them; defects are not removed), everything else staying as context. Per pool: NLL per token (token-weighted, 95% bootstrap CI), perplexity, the distribution of per-trajectory means (mean with CI, median, p10-p90) and the difference from the first pool. Lower means more compatible: historical rollouts of the same policy line, current-policy rollouts and an external teacher's can be compared side by side. Scores are cached in --out; a rerun is free.

    With --reviews, each trajectory's eligible tokens are also split by the ROSS mask its latest review gives: kept (A \\ E, what ROSS trains on) and excluded (E), with the NLL of each, of each defect category's excluded tokens and of the excluded - kept gap (95% bootstrap over trajectories). A trajectory the review rejects, or that the mask compiler refuses, is scored but not split, and counted by reason; one whose latest review line is unreadable is listed too (never split by an earlier review). A changed review is split again; everything else comes from the cache.

    With --workers N (CPU) or --ray ADDRESS, batches of trajectories are scored by worker processes or on a Ray cluster's nodes (--device cuda: each unit asks Ray for a GPU, and this machine needs none); each worker process loads the model once. Only this process writes the score cache and the results, which equal a run here.
    """

    out: Path = option(
        help="Folder for nll.json, nll.md, nll.png and the score cache nll-scores.jsonl.", flags=("--out", "-o"), metavar="DIR",
        front="cli", why="the pipeline writes each model's scores under analyze/MODEL/",
    )  # fmt: skip
    pools: list[NamedPool] = option(  # the first is the baseline of the differences
        help=POOL_HELP, factory=list, flags=("--pool", "-p"), metavar="NAME=PATH", front="cli", why=PIPELINE_MODELS
    )
    reviews: Path | None = option(
        None, "reviews.jsonl (relearn review): also split each pool's eligible tokens into kept (A \\ E) and excluded (E, by category) "
        "as `relearn masks --mode ross` does; the latest review line of a trajectory is used.",
        flags=("--reviews", "-r"), front="cli", why="the pipeline splits by its own review stage's reviews.jsonl",
    )  # fmt: skip
    defect_scope: DefectScope = option(
        MasksOptions.defect_scope, "With --reviews: action (a defect in a tool call excludes the whole call, as `relearn masks` does "
        "by default) | minimal (only the quoted text).", front="cli", why=AS_MASKS,
    )  # fmt: skip
    context: Context = option(
        MasksOptions.context, "as-sent: a trajectory whose render departs from what the model saw (its recorded prompt ids disagree, "
        "or the harness never sent reasoning back) is scored one turn at a time under the context it was sent, as `relearn masks` "
        "compiles it | render: every turn under the template's render of the history.", front="cli", why=AS_MASKS,
    )  # fmt: skip
    model: str | None = option(
        None, "Model folder: any Hugging Face causal LM (the current policy, say).", metavar="DIR", front="cli", why=PIPELINE_MODELS
    )
    tiny: Literal["qwen3", "qwen3-moe", "qwen3.5-moe"] | None = option(
        None, "Tiny random model instead of --model (tests).", front="cli", why=PIPELINE_MODELS
    )
    seed: int = option(0, "Seed of a --tiny model's init.", front="cli", why=PIPELINE_MODELS)
    tokenizer: str | None = option(
        None, "`qwen3.6` (built in, offline) or a tokenizer folder (default: the --model folder's; qwen3.6 with --tiny).",
        metavar="NAME|DIR", front="cli", why=AS_MASKS,
    )  # fmt: skip
    ctx: int = option(
        MasksOptions.ctx, "Longest trajectory in tokens; longer ones are skipped and counted, never cut.", ge=2, metavar="TOKENS",
        front="cli", why=AS_MASKS,
    )  # fmt: skip
    limit: int | None = option(None, "Read at most the first N records of each pool.", ge=1)
    positive_only: bool = option(
        False, "Score only verified-positive trajectories (what SFT would train on).", flag_only=True,
        front="cli", why="the pipeline scores what its variants trained on: verified-positive trajectories only",
    )  # fmt: skip
    device: str = option("cpu", "cpu | cuda | cuda:N.", metavar="DEVICE")
    bf16: bool = option(False, "Run the model in bf16 (the softmax stays fp32).", flag_only=True)
    attn: Literal["sdpa", "flash_attention_2", "eager"] = option(TrainOptions.attn, "Attention implementation.")
    chunk: int = option(TrainOptions.chunk, "Eligible positions per LM-head chunk (memory ~ chunk x vocab x 4 bytes).", ge=1)
    preserve_thinking: bool = option(
        MasksOptions.preserve_thinking, "Keep reasoning on every turn (Qwen3.6's preserve_thinking), as `relearn masks` does.",
        front="cli", why=AS_MASKS,
    )  # fmt: skip
    bootstrap: int = option(BOOTSTRAP_SAMPLES, "Bootstrap resamples for the 95% intervals.", ge=100)
    progress: bool = option(True, "Show the progress bar.", front="cli", why="the pipeline draws its own progress")
    workers: int = option(
        1, "Worker processes scoring on CPU at once (each loads the model once; batches of trajectories are their work units). "
        "1: score here.", ge=1,
    )  # fmt: skip
    ray: str | None = same_as(ContainerOptions, "ray")
    batch: int = option(
        BATCH, "With --workers or --ray: trajectories per work unit (larger: less overhead per unit; smaller: spread over more "
        "workers).", ge=1,
    )  # fmt: skip
    chart: bool = True  # also draw nll.png

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer or self.model or BUILTIN_TOKENIZER


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


def nll_settings(options: NllOptions) -> Settings:
    """What decides the scores (the score cache's key)."""
    name = options.tokenizer_name
    return Settings(
        model=f"tiny:{options.tiny}:seed={options.seed}" if options.tiny else str(Path(str(options.model)).resolve()),
        tokenizer=name if not Path(name).is_dir() else str(Path(name).resolve()),
        dtype="bfloat16" if options.bf16 else "float32",
        template_kwargs={"preserve_thinking": options.preserve_thinking},
        fingerprint=folder_fingerprint(*([options.model] if options.model else []), name),
        defect_scope=options.defect_scope,
        context=options.context,
    )


def model_spec(options: NllOptions) -> ModelSpec:
    # A Ray unit sees the GPU Ray gave it as cuda (cuda:0), whatever index was named here.
    device = "cuda" if options.ray is not None and options.device.startswith("cuda") else options.device
    return ModelSpec(options.model, options.tiny, options.seed, options.tokenizer_name, options.attn, options.bf16, device, options.chunk)


def run_nll(options: NllOptions, reporter: Reporter = SILENT) -> NllSummary:
    """Score every pool under one model, write ``out/nll.json`` and ``out/nll.md`` (and
    ``nll.png``); a rerun takes what the score cache holds. Raises ``OpError`` for unusable
    options, a model that cannot be loaded, or when no trajectory could be scored; a batch a
    worker could not score raises ``RuntimeError``."""
    from relearn.masks.shards import load_reviews

    check_options(options)
    review_problems: list[str] = []
    reviews = load_reviews(options.reviews, review_problems) if options.reviews is not None else None
    settings = nll_settings(options)
    total = sum(count_records(p.path, options.limit) for p in options.pools)
    needs = Needs(gpus=1) if options.device.startswith("cuda") else Needs(cpus=1)  # on Ray, a GPU per unit with --device cuda
    threads = max(1, (os.cpu_count() or 1) // options.workers)  # the CPU worker processes share this machine's cores
    try:
        with process_backend(options.ray, needs, options.workers, threads) as backend, stage(reporter, "scoring NLL", total):
            results = score_pools(
                options.pools, settings, model_spec(options), options.out, ctx=options.ctx, limit=options.limit,
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
class PasskOptions:
    """Complementarity: per-problem success rates, unbiased pass@k curves, problems solved by one pool only.

    Success is the verifier's (resolved, or a positive reward); trajectories without a verifier result or a task_id are rejected and listed, never counted as failures. Over the problems all pools attempted: problems solved only by each pool, and by any; for each pair of pools, problems solved by both, only one, or neither.
    """

    out: Path = option(help="Folder for passk.json, passk.md and passk.png.", flags=("--out", "-o"), metavar="DIR")
    pools: list[NamedPool] = option(help=POOL_HELP, factory=list, flags=("--pool", "-p"), metavar="NAME=PATH")
    max_k: int | None = option(
        None, "Largest k of the curves (default: the fewest attempts any problem of the pool has, so every point averages the same "
        "problems).", ge=1,
    )  # fmt: skip
    limit: int | None = option(None, "Read at most the first N records of each pool.", ge=1)


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
