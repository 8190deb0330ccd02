"""The stages of a pipeline file, in order, each a call into the module that owns the work.

    pool -> verify -> review -> [holdout] -> masks:V -> [contrasts] -> upstream -> train:V
         -> [analyze] -> eval:upstream, eval:V -> report

for every mask variant V the file asks for (ROSS, ROSS without mask, Positive-Rollout SFT);
``holdout`` when ``[masks].heldout_tasks`` names tasks, ``contrasts`` with two variants or
more, ``analyze`` with an ``[analyze]`` table. Work folder layout (``WORKDIR``):

    pool/trajectories.jsonl    collected (with episodes/, verify-logs/) or imported
    verified.jsonl             the pool with an outcome on every trajectory that can be graded
    reviews.jsonl              one Review per trajectory
    heldout/train.jsonl        the verified pool without the held-out tasks: what masks compile
    heldout/heldout.jsonl      the held-out tasks' trajectories: no variant trains on them
    datasets/V/                Parquet shards and stats.json
    datasets/contrasts.json    each variant's trajectory ids and how the sets relate
    upstream/                  the starting weights (for a tiny random model; else --init is used as is)
    train/V/                   the training run; train/V/model/ the final weights
    analyze/                   nll.md, nll.json: kept vs excluded NLL per model; analyze/MODEL/ its scores
    eval/NAME/                 one evaluation run per model (manifest, trajectories, report)
    report/                    report.md, report.json, PNGs
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console

from records.pools import write_text_atomic
from relearn.pipeline.config import ImportConfig, PipelineConfig
from relearn.pipeline.runner import Stage, StageResult, run_stages

if TYPE_CHECKING:
    from relearn.ops.containers import ContainerOptions
    from relearn.ops.reporting import RichReporter
    from relearn.pipeline.config import ContainersConfig


@dataclass
class Context:
    """What stages share: the config, the console, the masks tokenizer loaded once, the notes."""

    config: PipelineConfig
    console: Console
    _tokenizer: Any = None
    pool_url: str | None = None  # overrides [pool.collect].base_url (the demo's local policy)
    notes: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.config.workdir

    def tokenizer(self) -> Any:
        """The masks tokenizer, loaded once for every variant."""
        if self._tokenizer is None:
            from relearn.masks.tokenizers import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.masks.tokenizer)
        return self._tokenizer

    @property
    def ray_address(self) -> str | None:
        """[cluster] address for the ops' ``ray`` option: None runs the stage here."""
        return self.config.cluster.address if self.config.cluster is not None else None

    @property
    def registry(self) -> str | None:
        """[cluster] registry: where a node lacking a task's image pulls it from."""
        return self.config.cluster.registry if self.config.cluster is not None else None

    def containers(self, table: ContainersConfig) -> ContainerOptions:
        """A container stage's options: its table's images and limits, [cluster]'s address and registry."""
        from relearn.ops.containers import ContainerOptions

        image_map = self.config.resolve(table.image_map) if table.image_map is not None else None
        return ContainerOptions(image_map, table.image_template, table.pull, table.cpus, table.memory, self.ray_address, self.registry)

    def reporter(self) -> RichReporter:
        """Progress of an operation, under the stage's line."""
        from relearn.ops.reporting import RichReporter

        return RichReporter(self.console, indent="  ")


# ---------------------------------------------------------------- paths


def pool_path(ctx: Context) -> Path:
    return ctx.workdir / "pool" / "trajectories.jsonl"


def verified_path(ctx: Context) -> Path:
    return ctx.workdir / "verified.jsonl"


def verdicts_path(ctx: Context) -> Path:
    """Every verdict the verify stage got (``relearn envs audit --verdicts`` reads it)."""
    return ctx.workdir / "verify" / "verdicts.jsonl"


def reviews_path(ctx: Context) -> Path:
    return ctx.workdir / "reviews.jsonl"


def heldout_dir(ctx: Context) -> Path:
    return ctx.workdir / "heldout"


def training_pool_path(ctx: Context) -> Path:
    """What every masks variant compiles: the verified pool, less the held-out tasks."""
    return heldout_dir(ctx) / "train.jsonl" if ctx.config.masks.heldout_tasks else verified_path(ctx)


def heldout_pool_path(ctx: Context) -> Path:
    return heldout_dir(ctx) / "heldout.jsonl"


def contrasts_path(ctx: Context) -> Path:
    return ctx.workdir / "datasets" / "contrasts.json"


def analyze_dir(ctx: Context) -> Path:
    return ctx.workdir / "analyze"


def dataset_dir(ctx: Context, variant: str) -> Path:
    return ctx.workdir / "datasets" / variant


def upstream_dir(ctx: Context) -> Path:
    train = ctx.config.train
    assert train is not None
    return ctx.workdir / "upstream" if train.tiny else ctx.config.resolve(train.init or "")


def train_dir(ctx: Context, variant: str) -> Path:
    return ctx.workdir / "train" / variant


def eval_dir(ctx: Context, name: str) -> Path:
    return ctx.workdir / "eval" / name


def report_dir(ctx: Context) -> Path:
    return ctx.workdir / "report"


def dataset_source(ctx: Context, source: str) -> str:
    """``mini``, a file or folder (relative to the pipeline file), or a Hugging Face dataset name."""
    if source == "mini":
        return source
    local = ctx.config.resolve(source)
    return str(local) if local.exists() else source


# ---------------------------------------------------------------- stages


def pool_stage(ctx: Context) -> dict[str, Any]:
    pool = ctx.config.pool
    out = pool_path(ctx)
    if pool.single_turn is not None:
        from relearn.pipeline import single_turn

        return single_turn.pool_stage(ctx, out)
    if pool.import_ is not None:
        return import_pool_stage(ctx, pool.import_, out)
    return collect_pool_stage(ctx, out)


def collect_pool_stage(ctx: Context, out: Path) -> dict[str, Any]:
    """`relearn collect` into the work folder's pool (``relearn.ops.collect``)."""
    from relearn.ops.collect import AgentOptions, CollectOptions, run_collect

    c = ctx.config.pool.collect
    assert c is not None
    options = CollectOptions(
        out=out.parent, model=c.model, tasks=dataset_source(ctx, ctx.config.tasks), ids=c.ids,
        agent=AgentOptions(c.agent, c.policy, c.apply_patch, c.reasoning_effort, c.token_ids), base_url=ctx.pool_url or c.base_url,
        api_key_env=c.api_key_env, checkpoint=c.checkpoint, step=c.step, temperature=c.temperature, max_output_tokens=c.max_output_tokens,
        attempts=c.attempts, workers=c.workers, max_turns=c.max_turns, max_tokens=c.max_tokens, max_seconds=c.max_seconds,
        max_cost=c.max_cost, price_in=c.price_in, price_out=c.price_out, containers=ctx.containers(c),
    )  # fmt: skip
    summary = run_collect(options, ctx.reporter())
    for problem in summary.task_problems + summary.image_problems:
        ctx.notes.append(problem)
    episodes = summary.collect
    if episodes.errors and not episodes.finished and not episodes.skipped:
        raise RuntimeError(f"no episode finished: {episodes.errors[0]}")
    return {
        "trajectories": summary.trajectories,
        "resolved": summary.resolved,
        "episode_errors": len(episodes.errors) + len(episodes.infra_errors),
        "exit_status": summary.exit_status,
    }


def import_pool_stage(ctx: Context, config: ImportConfig, out: Path) -> dict[str, Any]:
    """`relearn import` into the work folder's pool (a rerun resumes: what the pool holds is
    skipped); the counts come from the import and one streaming pass over the pool."""
    from relearn.ops.importing import count_pool, run_import
    from relearn.ops.reporting import OpError

    summary = run_import(config.options([ctx.config.resolve(p) for p in config.paths], out), ctx.reporter())
    for problem in summary.rejected[:3]:
        ctx.console.print(f"  [yellow]rejected:[/yellow] {problem}", highlight=False)
    if summary.rejected:
        ctx.notes.append(f"{len(summary.rejected)} input file(s) or row(s) rejected by the import; first: {summary.rejected[0]}")
    counts = count_pool(out)
    if not counts.trajectories:
        raise OpError(f"[pool.import]: no trajectory in {out} ({len(summary.rejected)} rejected; first: {summary.rejected[0]})"
                      if summary.rejected else f"[pool.import]: no trajectory in {out}")  # fmt: skip
    return {
        "files": summary.files,
        "imported": summary.imported,
        "skipped": summary.skipped_existing,
        "rejected": len(summary.rejected),
        "warnings": len(summary.warnings),
        "trajectories": counts.trajectories,
        "graded": counts.graded,
        "imported_grades": counts.imported_grades,
        "positive": counts.positive,
        "exit_status": dict(counts.exit_status),
    }


def verify_stage(ctx: Context) -> dict[str, Any]:
    """Grade what the pool has not graded yet, through the same executor, images and limits as
    `relearn verify` (``relearn.ops.verify.verify_pool``): imported trajectories carry a final
    patch but no verdict of ours. Collected trajectories were graded right after their episode
    and are kept. The pool is streamed; an interrupted run resumes by trajectory id."""
    if ctx.config.single_turn:
        from relearn.pipeline import single_turn

        return single_turn.verify_stage(ctx, pool_path(ctx), verified_path(ctx))
    from relearn.ops.verify import PoolVerifyOptions, verify_pool

    v = ctx.config.verify
    options = PoolVerifyOptions(
        pool=pool_path(ctx), output=verified_path(ctx), verdicts=verdicts_path(ctx), tasks=dataset_source(ctx, ctx.config.tasks),
        workers=v.workers, timeout=v.timeout, log_dir=ctx.workdir / "verify-logs", containers=ctx.containers(v),
    )  # fmt: skip
    summary = verify_pool(options, ctx.reporter())
    for problem in summary.image_problems:
        ctx.notes.append(problem)
    if summary.errors:
        raise RuntimeError(f"{len(summary.errors)} patch(es) not graded (rerun to continue); first: {summary.errors[0]}")
    on_nodes = {"graded by node": summary.per_node} if set(summary.per_node) - {"local"} else {}
    return {**summary.counts, "resolved": summary.resolved, "unreadable": len(summary.unreadable), **on_nodes}


def review_stage(ctx: Context) -> dict[str, Any]:
    """`relearn review` over the verified pool (``relearn.ops.review``): with judges, their cost
    estimate is printed first; the counts come from one pass over reviews.jsonl."""
    if ctx.config.single_turn:
        from relearn.pipeline import single_turn

        return single_turn.review_stage(ctx, verified_path(ctx), reviews_path(ctx))
    from relearn.ops.reporting import OpError, RichReporter
    from relearn.ops.review import count_reviews, run_review

    r = ctx.config.review
    options = r.options(verified_path(ctx), reviews_path(ctx), ctx.config.resolve(r.prices) if r.prices else None, ray=ctx.ray_address)
    summary = run_review(options, RichReporter(ctx.console, indent="  "), on_estimate=lambda e: ctx.console.print(e.render()))
    if r.estimate:
        raise OpError("[review] estimate = true: the estimate is above and nothing was sent; set estimate = false to review")
    run, ledger = summary.run, summary.ledger
    assert run is not None and ledger is not None
    if run.errors:
        raise RuntimeError(f"{run.not_reviewed} trajectories not reviewed (rerun to continue); first: {run.errors[0]}")
    counts = count_reviews(reviews_path(ctx))
    return {
        "reviewer": summary.reviewer,
        "reviewed": counts.reviewed,
        "decisions": dict(counts.decisions),
        "defects": counts.defects,
        "cost_usd": round(ledger.spent_usd, 4),
    }


def holdout_stage(ctx: Context) -> dict[str, Any]:
    from relearn.pipeline.holdout import split_by_task

    return split_by_task(verified_path(ctx), set(ctx.config.masks.heldout_tasks or ()), training_pool_path(ctx), heldout_pool_path(ctx))


def masks_stage(ctx: Context, variant: str) -> dict[str, Any]:
    """`relearn masks` for one variant (``relearn.ops.masks``), here, in [masks] workers or on [cluster]."""
    from relearn.ops.masks import run_masks
    from relearn.ops.reporting import OpError, RichReporter

    single_turn = ctx.config.pool.single_turn
    options = ctx.config.masks.options(
        training_pool_path(ctx), dataset_dir(ctx, variant), reviews_path(ctx), variant,
        no_thinking=single_turn is not None and not single_turn.thinking, ray=ctx.ray_address,
        audit=ctx.config.resolve(ctx.config.masks.audit) if ctx.config.masks.audit else None,
    )  # fmt: skip
    summary = run_masks(options, RichReporter(ctx.console, indent="  "), tokenizer=ctx.tokenizer())
    stats = summary.stats
    if summary.warnings and (not summary.records or summary.foreign_reviews):
        # An empty pool or reviews that match none of it: every later stage would train on nothing.
        raise OpError(f"[masks] {variant}: {summary.warnings[0]}")
    ctx.notes.extend(f"[masks] {variant}: {warning}" for warning in summary.warnings)
    if summary.review_errors:
        ctx.notes.append(f"{len(summary.review_errors)} unreadable review line(s); first: {summary.review_errors[0]}")
    return {
        "trajectories_in": stats["trajectories_in"],
        "trajectories_out": stats["trajectories_out"],
        "rejected": stats["rejected"],
        "samples": stats["samples"],
        "supervised_tokens": stats["tokens"]["supervised"],
        "excluded_tokens": stats["tokens"]["excluded"],
        "ter": round(stats["ter_token_weighted"], 4),
        "ter_by_scope": {scope: round(ter["ter_token_weighted"], 4) for scope, ter in stats["ter_by_scope"].items()},
        "audit": stats["audit"],
    }


def contrasts_stage(ctx: Context) -> dict[str, Any]:
    """The datasets' trajectory sets side by side; refuses (so training does not start) when
    ROSS and ROSS w/o mask differ. The ids are written first, also when it refuses."""
    from relearn.pipeline.contrasts import ContrastError, contrast_problem, read_contrasts

    datasets = {v: dataset_dir(ctx, v) for v in ctx.config.variants}
    contrasts = read_contrasts(datasets)
    write_text_atomic(contrasts_path(ctx), json.dumps(contrasts.to_json(), indent=1, sort_keys=True))
    problem = contrast_problem(contrasts, datasets)
    if problem is not None:
        raise ContrastError(f"{problem} All ids: {contrasts_path(ctx)}")
    return {**{v: len(ids) for v, ids in contrasts.sets.items()}, "relation": contrasts.relation()}


def upstream_stage(ctx: Context) -> dict[str, Any]:
    """The starting weights every variant trains from and the upstream evaluation serves."""
    train = ctx.config.train
    assert train is not None
    if not train.tiny:
        if not (upstream_dir(ctx) / "config.json").exists():
            raise FileNotFoundError(f"[train].init {upstream_dir(ctx)}: no config.json (not a Hugging Face model folder)")
        return {"model": str(upstream_dir(ctx))}
    from relearn.train.model import build_model, parameter_count

    model = build_model(tiny=train.tiny, seed=train.seed)
    model.config.use_cache = True
    target = upstream_dir(ctx)
    tmp = target.with_name(".upstream.tmp")
    model.save_pretrained(tmp)
    ctx.tokenizer().save_pretrained(tmp)
    tmp.replace(target)
    return {"model": f"tiny {train.tiny}", "parameters": parameter_count(model)}


def train_stage(ctx: Context, variant: str) -> dict[str, Any]:
    """`relearn train` on one variant's dataset (``relearn.ops.train``), from the upstream weights."""
    from relearn.ops.train import run_train

    t = ctx.config.train
    assert t is not None
    opts = t.options(dataset_dir(ctx, variant), train_dir(ctx, variant), str(upstream_dir(ctx)), ctx.config.masks.tokenizer)
    summary = run_train(opts, console=ctx.console)
    if summary.stopped_by:
        raise KeyboardInterrupt
    return {
        "steps": summary.steps,
        "first_loss": round(summary.first_loss, 4) if summary.first_loss is not None else None,
        "last_loss": round(summary.last_loss, 4) if summary.last_loss is not None else None,
        "supervised_tokens": summary.supervised,
        "refused_samples": len(summary.report.problems),
    }


def analyzed_models(ctx: Context) -> dict[str, Path]:
    """The start model first (the paired differences are against it), then every trained variant."""
    return {"upstream": upstream_dir(ctx), **{v: train_dir(ctx, v) / "model" for v in ctx.config.variants}}


def analyze_stage(ctx: Context) -> dict[str, Any]:
    """NLL of the training pool's and the held-out trajectories' kept (A \\ E) and excluded
    (E) tokens under each model (``relearn.pipeline.analysis``)."""
    from relearn.analyze.pools import NamedPool
    from relearn.ops.reporting import RichReporter
    from relearn.pipeline.analysis import analyze_models

    pools = [NamedPool("train", training_pool_path(ctx))]
    if ctx.config.masks.heldout_tasks:
        pools.append(NamedPool("heldout", heldout_pool_path(ctx)))
    assert ctx.config.analyze is not None
    return analyze_models(
        analyzed_models(ctx), pools, reviews_path(ctx), ctx.config.masks, ctx.config.analyze, analyze_dir(ctx),
        RichReporter(ctx.console, indent="  "), ray=ctx.ray_address,
    )  # fmt: skip


def eval_stage(ctx: Context, name: str, model_dir: Path) -> dict[str, Any]:
    """Serve the weights locally (the vLLM stand-in) and run the fixed-budget evaluation
    (``relearn.ops.evaluate``, as `relearn eval run` does)."""
    import dataclasses

    from relearn.ops.collect import AgentOptions
    from relearn.ops.evaluate import EvalOptions, run_evaluation
    from relearn.serve.server import serve

    e = ctx.config.eval
    assert e is not None
    with serve(model_dir, model_name=name, max_new_tokens=e.max_new_tokens, max_context=e.max_context, seed=e.seed) as server:
        options = EvalOptions(
            out=eval_dir(ctx, name), model=name, dataset=dataset_source(ctx, e.dataset), agent=AgentOptions(policy="chat", apply_patch=e.apply_patch),
            base_url=server.url, ids=e.ids, repos=e.repos, difficulties=e.difficulties, slice=e.slice, temperature=e.temperature,
            max_output_tokens=e.max_new_tokens, seed=e.seed, workers=e.workers, max_turns=e.max_turns, max_tokens=e.max_tokens,
            max_seconds=e.max_seconds, spend_cap=e.spend_cap,
            # The model is served on this machine's loopback, so its episodes run here ([cluster]'s registry still applies).
            containers=dataclasses.replace(ctx.containers(e), ray=None),
        )  # fmt: skip
        summary = run_evaluation(options, ctx.reporter())
    return {
        "instances": summary.selected,
        "resolved": summary.report["resolved"],
        "rate": round(summary.report["resolved_rate"], 4),
        "infra_errors": len(summary.collect.infra_errors),
    }


# ---------------------------------------------------------------- the plan


# Fields the container stages' tables gained after pipelines were written without them: at their
# default they stay out of the stage's settings, so such a file keeps its stamps (None values
# are left out anyway, by the runner).
ADDED_COLLECT_FIELDS = {"agent", "apply_patch", "reasoning_effort", "token_ids", "price_in", "price_out", "cpus", "memory"}
ADDED_EVAL_FIELDS = {"apply_patch", "cpus", "memory"}


def _identity(table: BaseModel, transport: set[str], added: set[str]) -> dict[str, Any]:
    """What of ``table`` decides a stage's outputs: not ``transport``, not an ``added`` field at its default."""
    fields = type(table).model_fields
    settings = table.model_dump(mode="json", exclude=transport)
    return {k: v for k, v in settings.items() if not (k in added and v == fields[k].default)}


def plan(ctx: Context, report: Callable[[], dict[str, Any]]) -> list[Stage]:
    """Every stage of the file, in order, with what decides its outputs."""
    c = ctx.config
    pool_settings = c.pool.model_dump(mode="json", by_alias=True)
    if c.pool.collect is not None:
        collect = c.pool.collect
        pool_settings["collect"] = _identity(collect, {"base_url", "api_key_env", "pull"}, ADDED_COLLECT_FIELDS)
        # The protocol used, as files written before `agent` existed said it.
        pool_settings["collect"]["policy"] = collect.policy or ("chat" if collect.agent == "builtin" else "responses")
    verify_settings = {"tasks": c.tasks, **_identity(c.verify, {"workers", "pull"}, set(type(c.verify).model_fields))}
    stages = [
        Stage("pool", "collect" if c.pool.collect else "import single-turn rollouts" if c.pool.single_turn else "import", {"tasks": c.tasks, **pool_settings}, [pool_path(ctx)], lambda: pool_stage(ctx), workspace=[pool_path(ctx).parent]),
        Stage("verify", "grade what the pool has not graded", verify_settings, [verified_path(ctx)], lambda: verify_stage(ctx), ("pool",), [verified_path(ctx), verdicts_path(ctx).parent, ctx.workdir / "verify-logs"]),
        Stage("review", "review with " + ("keep intervals" if c.single_turn else "the judges" if c.review.judge1 or c.review.judge2 else "the heuristic reviewer"),
              c.review.model_dump(mode="json", exclude={"base_url", "judge2_base_url", "api_key_env", "workers", "poll_interval", "estimate"}), [reviews_path(ctx)], lambda: review_stage(ctx), ("verify",)),
    ]  # fmt: skip
    pool_stage_name = "verify"
    if c.masks.heldout_tasks:
        pool_stage_name = "holdout"
        stages.append(Stage("holdout", f"set {len(c.masks.heldout_tasks)} held-out tasks apart", {"heldout_tasks": sorted(c.masks.heldout_tasks)},
                            [training_pool_path(ctx), heldout_pool_path(ctx)], lambda: holdout_stage(ctx), ("verify",), [heldout_dir(ctx)]))  # fmt: skip
    masks_settings = _identity(c.masks, {"variants", "workers"}, {"keep_flagged"})
    if c.masks.audit:
        # What the audit says, not only where it is: a new audit compiles the datasets again.
        audit = c.resolve(c.masks.audit)
        masks_settings["audit"] = hashlib.sha256(audit.read_bytes()).hexdigest() if audit.is_file() else str(audit)
    if c.masks.heldout_tasks:
        masks_settings["heldout_tasks"] = sorted(c.masks.heldout_tasks)  # a set: its order decides nothing
    for v in c.variants:
        stages.append(
            Stage(
                f"masks:{v}",
                f"compile {v} masks",
                {**masks_settings, "mode": v},
                [dataset_dir(ctx, v) / "stats.json"],
                lambda v=v: masks_stage(ctx, v),
                (pool_stage_name, "review"),
                [dataset_dir(ctx, v)],
            )
        )
    if len(c.variants) > 1:
        # Before any training, so a run stops here (the runner stops at a failed stage) when the
        # contrasts are broken; training does not need it, or retraining one variant would follow
        # every other variant's masks.
        stages.append(Stage("contrasts", "compare the variants' trajectory sets", {"variants": sorted(c.variants)}, [contrasts_path(ctx)],
                            lambda: contrasts_stage(ctx), tuple(f"masks:{v}" for v in c.variants), [contrasts_path(ctx)]))  # fmt: skip
    names: list[str] = []
    if c.train is not None:
        train_settings = c.train.model_dump(mode="json")
        upstream_out = [upstream_dir(ctx) / "config.json"] if c.train.tiny else []
        stages.append(
            Stage(
                "upstream",
                "make the starting weights",
                {k: train_settings[k] for k in ("init", "tiny", "seed")},
                upstream_out,
                lambda: upstream_stage(ctx),
                (),
                [upstream_dir(ctx)] if c.train.tiny else [],
            )
        )
        for v in c.variants:
            stages.append(
                Stage(
                    f"train:{v}",
                    f"train on the {v} dataset",
                    train_settings,
                    [train_dir(ctx, v) / "model" / "config.json"],
                    lambda v=v: train_stage(ctx, v),
                    (f"masks:{v}", "upstream"),
                    [train_dir(ctx, v)],
                )
            )
        if c.analyze is not None:
            analyze_settings = {
                **c.analyze.model_dump(mode="json", exclude={"device", "workers", "batch"}), "tokenizer": c.masks.tokenizer, "ctx": c.masks.ctx,
                "heldout_tasks": sorted(c.masks.heldout_tasks or []), "variants": c.variants,
            }  # fmt: skip
            # Only the tables move aside when stale: the score caches under analyze/MODEL/ are keyed
            # by model folder, tokenizer and review, so what is still valid in them is reused.
            outputs = [analyze_dir(ctx) / "nll.json", analyze_dir(ctx) / "nll.md"]
            needs = (pool_stage_name, "review", "upstream", *(f"train:{v}" for v in c.variants))
            stages.append(
                Stage(
                    "analyze",
                    "NLL of kept and excluded tokens under every model",
                    analyze_settings,
                    outputs,
                    lambda: analyze_stage(ctx),
                    needs,
                    outputs,
                )
            )
        if c.eval is not None:
            eval_settings = _identity(c.eval, {"pull"}, ADDED_EVAL_FIELDS)
            stages.append(
                Stage(
                    "eval:upstream",
                    "evaluate the starting weights",
                    eval_settings,
                    [eval_dir(ctx, "upstream") / "report.json"],
                    lambda: eval_stage(ctx, "upstream", upstream_dir(ctx)),
                    ("upstream",),
                    [eval_dir(ctx, "upstream")],
                )
            )
            names.append("upstream")
            for v in c.variants:
                stages.append(
                    Stage(
                        f"eval:{v}",
                        f"evaluate the {v} model",
                        eval_settings,
                        [eval_dir(ctx, v) / "report.json"],
                        lambda v=v: eval_stage(ctx, v, train_dir(ctx, v) / "model"),
                        (f"train:{v}",),
                        [eval_dir(ctx, v)],
                    )
                )
                names.append(v)
    needs = tuple(s.name for s in stages)
    stages.append(
        Stage(
            "report",
            "write the report",
            {"names": names},
            [report_dir(ctx) / "report.md", report_dir(ctx) / "report.json"],
            report,
            needs,
            [report_dir(ctx)],
        )
    )
    return stages


def run_pipeline(
    config: PipelineConfig, console: Console, *, pool_url: str | None = None, dry_run: bool = False
) -> tuple[list[StageResult], Context]:
    """Run every stage of ``config`` that is not current; returns each stage's result."""
    from relearn.pipeline.report import write_pipeline_report

    ctx = Context(config, console, pool_url=pool_url)
    variants = config.variants if config.train is not None else []
    eval_names = (["upstream", *variants] if config.eval is not None else []) if config.train is not None else []
    stages: list[Stage] = []

    def report() -> dict[str, Any]:
        write_pipeline_report(
            ctx.workdir, stages, eval_names, {v: train_dir(ctx, v) for v in variants}, {n: eval_dir(ctx, n) for n in eval_names}, report_dir(ctx),
            contrasts=contrasts_path(ctx) if len(config.variants) > 1 else None,
            analysis=analyze_dir(ctx) / "nll.json" if config.analyze is not None and config.train is not None else None,
        )  # fmt: skip
        return {"report": str(report_dir(ctx) / "report.md")}

    stages.extend(plan(ctx, report))
    return run_stages(stages, config.workdir, console, dry_run=dry_run), ctx
