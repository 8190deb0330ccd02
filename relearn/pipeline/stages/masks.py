"""masks:V: `relearn masks` for one variant V (``relearn.ops.masks``), here, in [masks] workers or
on [cluster]; a single-turn pool compiles in the template's thinking or no-thinking form.

The image audit each variant applies: the audit stage's (``relearn.pipeline.stages.audit``,
which it then needs) where the plan has one, else the file ``[masks] audit`` names, else none,
and the summary's ``audit`` says why none.

Identity: the [masks] table less where it runs, with the variant as its mode, the audit's
content (not only its path) or that it is the audit stage's (whose run it follows), and the
held-out tasks sorted. No audit adds nothing: a file written before the audit stage keeps its
stamps where the plan has none.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from relearn.pipeline.config import PipelineConfig
from relearn.pipeline.context import Context, audit_path, dataset_dir, reviews_path, training_pool_path, training_pool_stage
from relearn.pipeline.runner import Stage
from relearn.pipeline.stages import audit as audit_stage
from relearn.pipeline.stages import identity

# ``variants``: each stage's own variant is its ``mode``, so adding a variant redoes no other;
# ``workers``: where it runs, not what it makes.
NOT_IDENTITY = {"variants", "workers"}
ADDED_MASKS_FIELDS = {"keep_flagged", "chat_template"}  # added after pipelines were written: out at its default


def applies(config: PipelineConfig) -> bool:
    return True


def settings(ctx: Context) -> dict[str, Any]:
    """What every variant shares of its identity."""
    c = ctx.config
    settings = identity(c.masks, NOT_IDENTITY | {"audit"}, ADDED_MASKS_FIELDS)
    if isinstance(c.masks.audit, Path):
        # What the audit says, not only where it is: a new audit compiles the datasets again.
        audit = c.resolve(c.masks.audit)
        settings["audit"] = hashlib.sha256(audit.read_bytes()).hexdigest() if audit.is_file() else str(audit)
    elif audit_stage.applies(c):
        settings["audit"] = "the audit stage's"  # what it says reaches the stamp as the audit stage's run
    if c.masks.chat_template is not None:
        # What the template says, not its name or path: an edited template compiles again.
        settings["chat_template"] = hashlib.sha256(_chat_template_text(ctx).encode()).hexdigest()
    if c.masks.heldout_tasks:
        settings["heldout_tasks"] = sorted(c.masks.heldout_tasks)  # a set: its order decides nothing
    return settings


def stages(ctx: Context) -> list[Stage]:
    shared = settings(ctx)
    return [
        Stage(
            f"masks:{v}",
            f"compile {v} masks",
            {**shared, "mode": v},
            [dataset_dir(ctx, v) / "stats.json"],
            lambda v=v: run(ctx, v),
            (training_pool_stage(ctx), "review", *(("audit",) if audit_stage.applies(ctx.config) else ())),
            [dataset_dir(ctx, v)],
        )
        for v in ctx.config.variants
    ]


def run(ctx: Context, variant: str) -> dict[str, Any]:
    from relearn.ops.masks import run_masks
    from relearn.ops.reporting import OpError

    single_turn = ctx.config.pool.single_turn
    options = ctx.config.masks.options(
        training_pool_path(ctx), dataset_dir(ctx, variant), reviews_path(ctx), variant,
        no_thinking=single_turn is not None and not single_turn.thinking, ray=ctx.ray_address, audit=audit_file(ctx),
    )  # fmt: skip
    if options.chat_template is not None:
        options.chat_template = _chat_template_name(ctx)
    summary = run_masks(options, ctx.reporter(), tokenizer=ctx.tokenizer())
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
        "audit": stats["audit"] if stats["audit"].get("applied") else {"applied": False, "note": f"no audit applied: {unaudited(ctx)}"},
    }


def audit_file(ctx: Context) -> Path | None:
    """The audit every variant applies: the file [masks] audit names, the audit stage's, or none."""
    c = ctx.config
    if isinstance(c.masks.audit, Path):
        return c.resolve(c.masks.audit)
    return audit_path(ctx) if audit_stage.applies(c) else None


def unaudited(ctx: Context) -> str:
    """Why no audit is applied (the summary's and the report's words)."""
    return audit_stage.why_not(ctx.config) or "no audit file"


def _chat_template_name(ctx: Context) -> str | None:
    """``[masks] chat_template``: a path relative to the pipeline file where such a file
    exists, else the name of a template trl ships."""
    name = ctx.config.masks.chat_template
    if name is None:
        return None
    resolved = ctx.config.resolve(Path(name))
    return str(resolved) if resolved.is_file() else name


def _chat_template_text(ctx: Context) -> str:
    from relearn.masks.tokenizers import resolve_chat_template

    name = _chat_template_name(ctx) or ""
    try:
        return resolve_chat_template(name)
    except ValueError:
        return name  # the masks stage says what is wrong when it runs
