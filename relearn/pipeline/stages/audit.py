"""audit: `relearn envs audit` (``relearn.ops.envs.audit.run_audit``) of the images of the tasks
the pool holds trajectories of, appended to ``WORKDIR/audit/audit.jsonl``; every masks variant
then leaves out the trajectories of the tasks it flags (their image's .git exposes future
commits or the fix), as `relearn masks --audit FILE` does and as the paper's training set did.

It is in the plan where the pipeline has the tasks' images: a collected pool (the images of
``[pool.collect]``), or an imported one graded against the ``tasks`` the file names (the images
of ``[verify]``). ``why_not`` says why it is not, and the masks summary repeats it: ``[masks]
audit = false``; an imported pool whose file names no ``tasks`` (the default suite is not a
statement about where its trajectories ran); a single-turn pool (no task images); ``[cluster]``
(the audit opens this machine's engine, and the images are the nodes'). ``audit = "FILE"``:
the user's own audit, applied by the masks stages as it is, and no audit stage.

Tasks of the pool that ``tasks`` does not have are not audited (counted). An interrupted run
resumes: the tasks the file already holds a verdict of are not audited again (an error is).

Identity: the tasks (``tasks``, a collected pool's ``ids``), the images they resolve to (the
image map's content, the template) and the checks' version (``envs.audit.AUDIT_VERSION``);
which tasks the pool holds follows the pool stage's run (it needs the pool).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from relearn.pipeline.config import ContainersConfig, PipelineConfig
from relearn.pipeline.context import Context, audit_path, dataset_source, pool_path
from relearn.pipeline.runner import Stage

NO_TASKS = (
    "the file names no tasks for its imported pool, so the pipeline has no task images to audit (name tasks, or give [masks] audit = FILE)"
)
SINGLE_TURN = "a single-turn pool runs in no task image"
ON_CLUSTER = "with [cluster] the images are the nodes' and the audit runs on one engine: give [masks] audit = FILE from `relearn envs audit -o FILE` on a node"
TURNED_OFF = "[masks] audit = false"


def why_not(config: PipelineConfig) -> str | None:
    """Why the pipeline runs no audit of its own (None: it does)."""
    if config.masks.audit is False:
        return TURNED_OFF
    if config.masks.audit is not True:
        return "[masks] audit names the audit file"
    if config.single_turn:
        return SINGLE_TURN
    if config.cluster is not None:
        return ON_CLUSTER
    if config.pool.collect is None and "tasks" not in config.model_fields_set:
        return NO_TASKS
    return None


def applies(config: PipelineConfig) -> bool:
    return why_not(config) is None


def images_table(config: PipelineConfig) -> ContainersConfig:
    """Where the pool's tasks ran: the collect table's images, else those verify grades in."""
    return config.pool.collect if config.pool.collect is not None else config.verify


def settings(ctx: Context) -> dict[str, Any]:
    from envs.audit import AUDIT_VERSION

    c = ctx.config
    table = images_table(c)
    image_map = c.resolve(table.image_map) if table.image_map is not None else None
    images = {
        # What the map says, not only where it is: another map is other images.
        "image_map": hashlib.sha256(image_map.read_bytes()).hexdigest() if image_map and image_map.is_file() else image_map,
        "image_template": table.image_template,
    }
    ids = sorted(c.pool.collect.ids) if c.pool.collect is not None and c.pool.collect.ids else None
    return {"tasks": c.tasks, "ids": ids, "images": images, "version": AUDIT_VERSION}


def stages(ctx: Context) -> list[Stage]:
    return [
        Stage(
            "audit",
            "audit the task images' .git for the fix",
            settings(ctx),
            [audit_path(ctx)],
            lambda: run(ctx),
            ("pool",),
            [audit_path(ctx).parent],
        )
    ]


def pool_tasks(pool: Path) -> set[str]:
    """The task ids the pool's trajectories name (one pass decoding each line's task id only)."""
    import msgspec

    from records.pools import iter_lines

    class Head(msgspec.Struct):
        task_id: Any = None

    decoder = msgspec.json.Decoder(Head)
    tasks: set[str] = set()
    for _number, text in iter_lines(pool):
        try:
            task = decoder.decode(text).task_id
        except (msgspec.DecodeError, UnicodeEncodeError):
            continue  # a torn line: the masks stages reject and count it
        if isinstance(task, str) and task:
            tasks.add(task)
    return tasks


def verdicts(path: Path) -> dict[str, str]:
    """Each task's latest verdict in the stage's audit file (``envs.audit.read_latest``)."""
    from envs.audit import read_latest

    return {task: record.verdict for task, record in read_latest(path).items()} if path.is_file() else {}


def run(ctx: Context) -> dict[str, Any]:
    import dataclasses

    from eval.dataset import load_dataset_tasks
    from relearn.ops.containers import tasks_source
    from relearn.ops.envs.audit import run_audit
    from relearn.verbs.envs import AuditOptions

    out = audit_path(ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()  # an audit of no task is an audit: the masks stages apply it (nothing flagged)
    source = dataset_source(ctx, ctx.config.tasks)
    held = pool_tasks(pool_path(ctx))
    known = {t.instance_id for t in load_dataset_tasks(str(tasks_source(source)))[0]} if held else set()
    done = {task for task, verdict in verdicts(out).items() if verdict != "error"}
    todo = sorted((held & known) - done)
    if todo:
        # This machine's engine, as the verb: the nodes' registry has no part in it.
        containers = dataclasses.replace(ctx.containers(images_table(ctx.config)), ray=None, registry=None)
        summary = run_audit(AuditOptions(tasks=source, ids=todo, containers=containers, output=out), ctx.reporter())
        ctx.notes.extend(summary.image_problems)
    latest = verdicts(out)
    errors = sorted(task for task, verdict in latest.items() if verdict == "error")
    if errors:
        ctx.notes.append(f"[audit] {len(errors)} task image(s) not audited (their trajectories are kept); first: {errors[0]}")
    return {
        "tasks_audited": len(latest),
        "exposed": sum(verdict == "exposed" for verdict in latest.values()),
        "not_audited": len(errors),
        "pool_tasks_not_in_tasks": len(held - known),
    }
