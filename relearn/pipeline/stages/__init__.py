"""The stages of a pipeline file, one module per kind, in the order ``relearn.pipeline.plan`` runs them:

    pool -> verify -> review -> [holdout] -> [audit] -> masks:V -> [contrasts] -> upstream
         -> train:V -> [analyze] -> eval:upstream, eval:V -> report

for every mask variant V the file asks for (ROSS, ROSS without mask, Positive-Rollout SFT);
``holdout`` when ``[masks].heldout_tasks`` names tasks, ``audit`` where the pipeline has the
tasks' images and ``[masks] audit`` is not false or a file, ``contrasts`` with two variants or
more, ``analyze`` with an ``[analyze]`` table. Where the work differs by the pool's kind, a
stage has alternatives, one module each, of which a file's plan takes one:

    pool      pool_collect (``[pool.collect]``), pool_import (``[pool.import]``), pool_single_turn
    verify    verify, verify_single_turn
    review    review, review_single_turn

Every module says ``applies(config)`` (is it in this file's plan), ``stages(ctx)`` (its
``Stage``: name, identity settings, outputs, needs, workspace, and its ``run(ctx, ...)``), and,
where it reads a table, ``NOT_IDENTITY``: the table's fields that do not decide its outputs.
The work folder's layout is ``relearn.pipeline.context``'s.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pydantic import BaseModel


def identity(table: BaseModel, not_identity: set[str], added: Collection[str] = ()) -> dict[str, Any]:
    """What of ``table`` decides a stage's outputs: not the ``not_identity`` fields, and not an
    ``added`` field at its default (fields a table gained after pipeline files were written
    without them: left out at their default, such a file keeps its stamps)."""
    fields = type(table).model_fields
    settings = table.model_dump(mode="json", exclude=not_identity)
    return {k: v for k, v in settings.items() if not (k in added and v == fields[k].default)}
