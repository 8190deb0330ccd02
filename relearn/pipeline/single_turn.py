"""The stages of a ``[pool.single_turn]`` pipeline where they differ from the agentic ones:

    pool    the rollout rows imported (``harness.importers.single_turn``, or ``chat`` records
            with one assistant turn)
    verify  every response graded by its task's kind (``envs.single_turn.verify``): Math by
            math-verify, Code by unit tests in containers, IF by IFEval's checkers
    review  keep intervals for Math and Code positives, full supervision for IF positives
            (``review.keep``)
    masks   ``ross`` = A ∩ K (the keep review's complement is its E), in the template's
            thinking or no-thinking form; plus TER and primary categories per step window

The folder layout is the agentic one (``relearn.pipeline.stages``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from records.pools import JsonlWriter, RecordError, read_trajectories_lenient

if TYPE_CHECKING:
    from relearn.pipeline.stages import Context

NO_THINKING = {"preserve_thinking": True, "enable_thinking": False}


def tasks_file(ctx: Context) -> Path:
    from envs.single_turn.tasks import MINI_TASKS

    config = ctx.config.pool.single_turn
    assert config is not None
    return MINI_TASKS if config.tasks == "mini" else ctx.config.resolve(config.tasks)


def rollout_files(ctx: Context) -> list[Path]:
    from envs.single_turn.tasks import MINI_ROLLOUTS

    config = ctx.config.pool.single_turn
    assert config is not None
    if not config.paths:
        return [MINI_ROLLOUTS]
    files: list[Path] = []
    for written in config.paths:
        path = ctx.config.resolve(written)
        if path.is_dir():
            files += _importer(ctx).discover(path)
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"[pool.single_turn].paths: {path} does not exist")
    return files


def template_kwargs(ctx: Context) -> dict[str, Any]:
    config = ctx.config.pool.single_turn
    return dict(NO_THINKING) if config is not None and not config.thinking else {"preserve_thinking": True}


def _importer(ctx: Context) -> Any:
    from harness.importers import chat
    from harness.importers.single_turn import SingleTurnImporter, options_for

    config = ctx.config.pool.single_turn
    assert config is not None
    if config.format == "chat":
        return chat.ChatImporter(chat.options_for())
    return SingleTurnImporter(options_for(config.format, split_thinking=config.thinking, **config.columns))


def pool_stage(ctx: Context, out: Path) -> dict[str, Any]:
    from harness.import_run import import_files

    files = rollout_files(ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = import_files("single-turn", files, out, importer=_importer(ctx))
    errors: list[RecordError] = []
    count = sum(1 for _ in read_trajectories_lenient(out, errors))
    return {"files": len(files), "trajectories": count, "rejected": len(summary.rejected)}


def verify_stage(ctx: Context, pool: Path, out: Path) -> dict[str, Any]:
    """Grade every response; resumable (graded trajectories are appended to a partial file)."""
    from envs.single_turn.tasks import load_tasks
    from envs.single_turn.verify import GradeSummary, grade_all

    tasks, task_errors = load_tasks(tasks_file(ctx))
    if task_errors:
        ctx.notes.append(f"{len(task_errors)} unreadable task record(s); first: {task_errors[0]}")
    if not tasks:
        raise ValueError(f"no tasks in {tasks_file(ctx)}")
    errors: list[RecordError] = []
    trajectories = list(read_trajectories_lenient(pool, errors))
    partial = out.with_suffix(".jsonl.partial")
    done = {t.id for t in read_trajectories_lenient(partial, [])} if partial.exists() else set()
    summary = GradeSummary()
    todo = [t for t in trajectories if t.id not in done]
    with JsonlWriter(partial, fsync=True) as writer, ctx.progress("verifying") as progress:
        bar = progress.add_task("verify", total=len(todo))
        for trajectory in grade_all(todo, tasks, summary, client_image=lambda: (ctx.client(), ctx.base_image())):
            writer.write(trajectory)
            progress.advance(bar)
    partial.replace(out)
    graded = list(read_trajectories_lenient(out, []))
    kinds = Counter(str((t.outcome.verdict or {}).get("kind")) for t in graded if t.outcome and t.outcome.verdict)
    return {
        **dict(sorted(summary.counts.items())),
        "positive": sum(bool(t.outcome and t.outcome.resolved) for t in graded),
        "by_kind": dict(sorted(kinds.items())),
        "ungradable_first": summary.ungradable[:3],
        "unreadable": len(errors),
    }


def review_stage(ctx: Context, pool: Path, out: Path) -> dict[str, Any]:
    from review.estimate import judge_specs, load_prices
    from review.judges import judge_pair
    from review.keep import review_single_turn_pool

    r = ctx.config.review
    specs = judge_specs(load_prices(), backend=r.backend, base_url=r.base_url, api_key_env=r.api_key_env)
    pair = judge_pair(r.judge1, r.judge2, specs, context=r.judge_context)
    assert pair is not None  # the config requires a judge for single-turn pools
    keep_judge, auditor = pair[0], pair[1]
    keep_judge.role, auditor.role = "keep", "audit"
    total = sum(1 for _ in read_trajectories_lenient(pool, []))
    with ctx.progress("reviewing") as progress:
        bar = progress.add_task("review", total=total)
        summary, ledger = review_single_turn_pool(
            pool, out, keep_judge, auditor, workers=r.workers, spend_cap_usd=r.spend_cap_usd, on_done=lambda _r: progress.advance(bar)
        )
    if summary.errors:
        raise RuntimeError(f"{summary.not_reviewed} rollouts not reviewed (rerun to continue); first: {summary.errors[0]}")
    reviews = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {
        "reviewer": "keep judge + auditor",
        "reviewed": len(reviews),
        "decisions": dict(
            Counter(r["decision"] if r["decision"] == "accept" else f"reject: {(r.get('reason') or '').split(':')[0]}" for r in reviews)
        ),
        "protocols": dict(Counter(r.get("protocol", "none") for r in reviews)),
        "keep_intervals": sum(len(r.get("keep", [])) for r in reviews),
        "cost_usd": round(ledger.spent_usd, 4),
    }
