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

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from records.pools import JsonlWriter, RecordError, read_trajectories_lenient, write_text_atomic
from records.trajectory import Trajectory
from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.runner import Stage, StageResult, run_stages


@dataclass
class Context:
    """What stages share: the config, the console, and a Docker client made on first use."""

    config: PipelineConfig
    console: Console
    _client: Any = None
    _base: str | None = None
    _tokenizer: Any = None
    pool_url: str | None = None  # overrides [pool.collect].base_url (the demo's local policy)
    notes: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.config.workdir

    def client(self) -> Any:
        if self._client is None:
            from envs.docker_backend import client_from_env

            self._client = client_from_env()
        return self._client

    def base_image(self) -> str:
        if self._base is None:
            from envs.images import build_base

            self._base = build_base(self.client(), log=lambda m: self.console.print(f"  [dim]{m}[/dim]"))
        return self._base

    def tokenizer(self) -> Any:
        """The masks tokenizer, loaded once for every variant."""
        if self._tokenizer is None:
            from relearn.masks.tokenizers import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.masks.tokenizer)
        return self._tokenizer

    def backend(self, needs: Any) -> Any:
        """The Ray backend for a fan-out stage when the file has [cluster] (or `relearn run
        --ray`), else None: the stage runs here. The caller closes it."""
        if self.config.cluster is None:
            return None
        from envs.executor import RayBackend

        return RayBackend(self.config.cluster.address, needs)

    @property
    def registry(self) -> str | None:
        """[cluster] registry: where a node lacking a task's image pulls it from."""
        return self.config.cluster.registry if self.config.cluster is not None else None

    def progress(self, label: str) -> Progress:
        return Progress(
            TextColumn(f"  [bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True
        )


# ---------------------------------------------------------------- paths


def pool_path(ctx: Context) -> Path:
    return ctx.workdir / "pool" / "trajectories.jsonl"


def verified_path(ctx: Context) -> Path:
    return ctx.workdir / "verified.jsonl"


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


def _read_pool(path: Path) -> tuple[list[Trajectory], list[RecordError]]:
    errors: list[RecordError] = []
    return list(read_trajectories_lenient(path, errors)), errors


def dataset_source(ctx: Context, source: str) -> str:
    """``mini``, a file or folder (relative to the pipeline file), or a Hugging Face dataset name."""
    if source == "mini":
        return source
    local = ctx.config.resolve(source)
    return str(local) if local.exists() else source


def _tasks(source: str, ctx: Context) -> list[Any]:
    from eval.dataset import load_dataset_tasks

    tasks, errors = load_dataset_tasks(dataset_source(ctx, source))
    if errors:
        ctx.notes.append(f"{len(errors)} unreadable task record(s) in {source}; first: {errors[0]}")
    if not tasks:
        raise ValueError(f"no tasks in {source}")
    return tasks


# ---------------------------------------------------------------- stages


def pool_stage(ctx: Context) -> dict[str, Any]:
    pool = ctx.config.pool
    out = pool_path(ctx)
    if pool.single_turn is not None:
        from relearn.pipeline import single_turn

        return single_turn.pool_stage(ctx, out)
    if pool.import_ is not None:
        from harness.import_run import discover, import_files

        files = discover(pool.import_.format, [ctx.config.resolve(p) for p in pool.import_.paths])
        out.parent.mkdir(parents=True, exist_ok=True)
        summary = import_files(pool.import_.format, files, out)
        trajectories, _ = _read_pool(out)
        return {"files": len(files), "trajectories": len(trajectories), "rejected": len(summary.errors)}
    from harness.agent import AgentConfig
    from harness.budget import Budget
    from harness.collect import collect
    from harness.policies.base import PolicySpec
    from harness.policies.make import make_policy

    c = pool.collect
    assert c is not None
    tasks = _tasks(ctx.config.tasks, ctx)
    if c.ids:
        from eval.dataset import Selection

        tasks = Selection(ids=tuple(c.ids)).apply(tasks)
    sampling = {"temperature": c.temperature} if c.temperature is not None else {}
    spec = PolicySpec(
        kind=c.policy,
        model=c.model,
        base_url=ctx.pool_url or c.base_url,
        api_key_env=c.api_key_env,
        sampling=sampling,
        checkpoint=c.checkpoint,
        step=c.step,
    )
    budget = Budget(max_turns=c.max_turns, max_tokens=c.max_tokens, max_seconds=c.max_seconds)
    base = ctx.base_image() if ctx.registry is None else None  # with a registry, the nodes pull their images
    from envs.executor import Needs

    backend = ctx.backend(Needs(docker=1))
    with ctx.progress("collecting") as progress:
        bar = progress.add_task("collect", total=len(tasks) * c.attempts)
        try:
            summary = collect(
                ctx.client(), tasks, make_policy(spec), spec, out.parent, attempts=c.attempts, workers=c.workers,
                config=AgentConfig(budget=budget), base_image=base, on_done=lambda _t: progress.advance(bar), backend=backend, registry=ctx.registry,
            )  # fmt: skip
        finally:
            if backend is not None:
                backend.close()
    if summary.errors and not summary.finished and not summary.skipped:
        raise RuntimeError(f"no episode finished: {summary.errors[0]}")
    trajectories, _ = _read_pool(out)
    return {
        "trajectories": len(trajectories),
        "resolved": sum(bool(t.outcome and t.outcome.resolved) for t in trajectories),
        "episode_errors": len(summary.errors) + len(summary.infra_errors),
        "exit_status": dict(Counter(t.exit_status.value for t in trajectories)),
    }


def _imported_grade(trajectory: Trajectory) -> bool:
    """The outcome is the source's own grade (``verdict.imported_from``), never verified here."""
    verdict = trajectory.outcome.verdict if trajectory.outcome is not None else None
    return bool(verdict and verdict.get("imported_from") and not verdict.get("re_verified"))


def _needs_grading(trajectory: Trajectory) -> bool:
    outcome = trajectory.outcome
    return outcome is None or outcome.resolved is None or _imported_grade(trajectory)


def verify_stage(ctx: Context) -> dict[str, Any]:
    """Grade what the pool has not graded yet: imported trajectories carry a final patch but no
    verdict of ours. Collected trajectories were graded right after their episode and are kept."""
    if ctx.config.single_turn:
        from relearn.pipeline import single_turn

        return single_turn.verify_stage(ctx, pool_path(ctx), verified_path(ctx))
    from envs.images import task_image
    from envs.verify import verify
    from harness.collect import outcome_of

    trajectories, errors = _read_pool(pool_path(ctx))
    partial = verified_path(ctx).with_suffix(".jsonl.partial")
    done = {t.id for t in _read_pool(partial)[0]} if partial.exists() else set()
    needs = [t for t in trajectories if t.id not in done and _needs_grading(t)]
    tasks = {t.instance_id: t for t in _tasks(ctx.config.tasks, ctx)} if needs else {}
    counts: Counter[str] = Counter()
    with JsonlWriter(partial, fsync=True) as writer, ctx.progress("verifying") as progress:
        bar = progress.add_task("verify", total=len(trajectories) - len(done))
        for trajectory in trajectories:
            if trajectory.id in done:
                continue
            if not _needs_grading(trajectory):
                counts["graded when collected"] += 1
            elif trajectory.task_id not in tasks or not trajectory.final_patch:
                counts[
                    "kept the imported grade (no task or no final patch)"
                    if _imported_grade(trajectory)
                    else "ungradable (no task or no final patch)"
                ] += 1
            else:
                task = tasks[trajectory.task_id]
                verdict = verify(
                    ctx.client(),
                    task,
                    trajectory.final_patch,
                    task_image(ctx.client(), task, ctx.base_image()),
                    log_dir=ctx.workdir / "verify-logs",
                )
                trajectory.outcome = outcome_of(verdict)
                counts["graded now"] += 1
            writer.write(trajectory)
            progress.advance(bar)
    partial.replace(verified_path(ctx))
    everything, _ = _read_pool(verified_path(ctx))
    return {**counts, "resolved": sum(bool(t.outcome and t.outcome.resolved) for t in everything), "unreadable": len(errors)}


def review_stage(ctx: Context) -> dict[str, Any]:
    if ctx.config.single_turn:
        from relearn.pipeline import single_turn

        return single_turn.review_stage(ctx, verified_path(ctx), reviews_path(ctx))
    from review.estimate import judge_specs, load_prices
    from review.judges import judge_pair
    from review.run import review_pool

    r = ctx.config.review
    specs = judge_specs(load_prices(), backend=r.backend, base_url=r.base_url, api_key_env=r.api_key_env)
    judges = judge_pair(r.judge1, r.judge2, specs, context=r.judge_context)
    with open(verified_path(ctx), "rb") as pool:
        total = sum(1 for _ in pool)
    if judges:
        print_review_estimate(ctx, judges)
    from envs.executor import Needs

    backend = ctx.backend(Needs(cpus=0.5))
    with ctx.progress("reviewing") as progress:
        bar = progress.add_task("review", total=total)
        try:
            summary, ledger = review_pool(
                verified_path(ctx), reviews_path(ctx), judges=judges, workers=r.workers, spend_cap_usd=r.spend_cap_usd,
                on_done=lambda _r, _l: progress.advance(bar), backend=backend,
            )  # fmt: skip
        finally:
            if backend is not None:
                backend.close()
    if summary.errors:
        raise RuntimeError(f"{summary.not_reviewed} trajectories not reviewed (rerun to continue); first: {summary.errors[0]}")
    reviews = [json.loads(line) for line in reviews_path(ctx).read_text().splitlines() if line.strip()]
    return {
        "reviewer": "judges" if judges else "heuristic",
        "reviewed": len(reviews),
        "decisions": dict(Counter(r["decision"] for r in reviews)),
        "defects": sum(len(r.get("defects", [])) for r in reviews),
        "cost_usd": round(ledger.spent_usd, 4),
    }


def print_review_estimate(ctx: Context, judges: Any) -> None:
    """What the judges will cost, printed before any of it is paid (review.estimate)."""
    from review.estimate import PricesError, UnknownModel, estimate_pool, load_prices, render

    try:
        table = load_prices()
        estimates, count = estimate_pool(verified_path(ctx), reviews_path(ctx), judges, table)
    except (PricesError, UnknownModel) as exc:
        ctx.console.print(f"  [dim]no cost estimate: {exc}[/dim]")
        return
    ctx.console.print(render(estimates, count, table))


def holdout_stage(ctx: Context) -> dict[str, Any]:
    from relearn.pipeline.holdout import split_by_task

    return split_by_task(verified_path(ctx), set(ctx.config.masks.heldout_tasks or ()), training_pool_path(ctx), heldout_pool_path(ctx))


def masks_stage(ctx: Context, variant: str) -> dict[str, Any]:
    from relearn.masks.compile import MaskOptions
    from relearn.masks.shards import build_dataset, load_reviews

    m = ctx.config.masks
    problems: list[str] = []
    reviews = load_reviews(reviews_path(ctx), problems)
    options = MaskOptions(mode=variant, ctx=m.ctx, defect_scope=m.defect_scope)
    if ctx.config.single_turn:
        from relearn.pipeline.single_turn import template_kwargs

        options.template_kwargs = template_kwargs(ctx)
    from envs.executor import Needs

    backend = ctx.backend(Needs(cpus=1))
    try:
        stats, _ = build_dataset(
            training_pool_path(ctx), reviews, ctx.tokenizer(), m.tokenizer, options, dataset_dir(ctx, variant), backend=backend
        )
    finally:
        if backend is not None:
            backend.close()
    return {
        "trajectories_in": stats["trajectories_in"],
        "trajectories_out": stats["trajectories_out"],
        "rejected": stats["rejected"],
        "samples": stats["samples"],
        "supervised_tokens": stats["tokens"]["supervised"],
        "excluded_tokens": stats["tokens"]["excluded"],
        "ter": round(stats["ter_token_weighted"], 4),
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
    from relearn.train.loop import train
    from relearn.train.options import TrainOptions

    t = ctx.config.train
    assert t is not None
    opts = TrainOptions(
        dataset=dataset_dir(ctx, variant), out=train_dir(ctx, variant), init=str(upstream_dir(ctx)), tokenizer=ctx.config.masks.tokenizer,
        ctx=t.ctx, epochs=t.epochs, lr=t.lr, warmup=t.warmup, grad_accum=t.grad_accum, loss_norm=t.loss_norm, bf16=t.bf16, seed=t.seed,
        max_steps=t.max_steps,
    )  # fmt: skip
    summary = train(opts, console=ctx.console)
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
    from relearn.masks.shards import load_reviews
    from relearn.pipeline.analysis import analyze_models

    problems: list[str] = []
    reviews = load_reviews(reviews_path(ctx), problems)
    pools = [NamedPool("train", training_pool_path(ctx))]
    if ctx.config.masks.heldout_tasks:
        pools.append(NamedPool("heldout", heldout_pool_path(ctx)))
    assert ctx.config.analyze is not None
    return analyze_models(
        analyzed_models(ctx),
        pools,
        reviews,
        problems,
        ctx.tokenizer(),
        ctx.config.masks,
        ctx.config.analyze,
        analyze_dir(ctx),
        ctx.progress("scoring NLL"),
    )


def eval_stage(ctx: Context, name: str, model_dir: Path) -> dict[str, Any]:
    """Serve the weights locally (the vLLM stand-in) and run the fixed-budget evaluation."""
    from eval.dataset import Selection
    from eval.report import write_report
    from eval.run import RunConfig, run_eval
    from harness.budget import Budget
    from harness.policies.base import PolicySpec
    from relearn.serve.server import serve

    e = ctx.config.eval
    assert e is not None
    out = eval_dir(ctx, name)
    with serve(model_dir, model_name=name, max_new_tokens=e.max_new_tokens, max_context=e.max_context, seed=e.seed) as server:
        spec = PolicySpec(kind="chat", model=name, base_url=server.url, sampling={"max_tokens": e.max_new_tokens})
        config = RunConfig(
            dataset=dataset_source(ctx, e.dataset), spec=spec,
            budget=Budget(max_turns=e.max_turns, max_tokens=e.max_tokens, max_seconds=e.max_seconds),
            selection=Selection(ids=tuple(e.ids or ())), seed=e.seed, workers=e.workers,
        )  # fmt: skip
        with ctx.progress(f"evaluating {name}") as progress:
            bar = progress.add_task("eval", total=None)
            summary, selected = run_eval(ctx.client(), config, out, base_image=ctx.base_image(), on_done=lambda _t: progress.advance(bar))
    report = write_report(out)
    return {
        "instances": selected,
        "resolved": report["resolved"],
        "rate": round(report["resolved_rate"], 4),
        "infra_errors": len(summary.infra_errors),
    }


# ---------------------------------------------------------------- the plan


def plan(ctx: Context, report: Callable[[], dict[str, Any]]) -> list[Stage]:
    """Every stage of the file, in order, with what decides its outputs."""
    c = ctx.config
    pool_settings = c.pool.model_dump(mode="json", by_alias=True)
    if c.pool.collect is not None:
        pool_settings["collect"].pop("base_url", None)  # transport, not identity
        pool_settings["collect"].pop("api_key_env", None)
    stages = [
        Stage("pool", "collect" if c.pool.collect else "import single-turn rollouts" if c.pool.single_turn else "import", {"tasks": c.tasks, **pool_settings}, [pool_path(ctx)], lambda: pool_stage(ctx), workspace=[pool_path(ctx).parent]),
        Stage("verify", "grade what the pool has not graded", {"tasks": c.tasks}, [verified_path(ctx)], lambda: verify_stage(ctx), ("pool",), [verified_path(ctx), ctx.workdir / "verify-logs"]),
        Stage("review", "review with " + ("keep intervals" if c.single_turn else "the judges" if c.review.judge1 or c.review.judge2 else "the heuristic reviewer"),
              c.review.model_dump(mode="json", exclude={"base_url", "api_key_env", "workers"}), [reviews_path(ctx)], lambda: review_stage(ctx), ("verify",)),
    ]  # fmt: skip
    pool_stage_name = "verify"
    if c.masks.heldout_tasks:
        pool_stage_name = "holdout"
        stages.append(Stage("holdout", f"set {len(c.masks.heldout_tasks)} held-out tasks apart", {"heldout_tasks": sorted(c.masks.heldout_tasks)},
                            [training_pool_path(ctx), heldout_pool_path(ctx)], lambda: holdout_stage(ctx), ("verify",), [heldout_dir(ctx)]))  # fmt: skip
    masks_settings = c.masks.model_dump(mode="json", exclude={"variants"})
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
                **c.analyze.model_dump(mode="json", exclude={"device"}), "tokenizer": c.masks.tokenizer, "ctx": c.masks.ctx,
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
            eval_settings = c.eval.model_dump(mode="json")
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
