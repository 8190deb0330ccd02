"""``relearn masks`` and the pipeline's masks stages: a pool into token masks A \\ E and Parquet
shards (``relearn.masks.shards``), here, in worker processes or on a Ray cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from envs.audit import read_flagged
from envs.executor import Needs
from records.pools import RecordError, is_zstd, iter_line_texts
from relearn.masks.compile import CONTEXTS, DEFECT_SCOPES, FLAGGED_BY_AUDIT, MODES
from relearn.masks.shards import FirstLines, build_dataset, load_reviews
from relearn.masks.template import PREFIX_CHECKS
from relearn.ops.containers import process_backend
from relearn.ops.outputs import POOL, REVIEWS, check_dataset_dir, check_jsonl_input, empty_pool, output_lock, reviews_of_another_pool
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.masks import MasksOptions

# Rejections that are the mode's selection, not a problem with the input.
SELECTED_OUT = ("not verified positive", "review rejected", "no review", FLAGGED_BY_AUDIT)


@dataclass
class MasksSummary:
    stats: dict[str, Any]  # what stats.json holds (relearn.masks.shards.summarise)
    reused: int  # shards kept from an earlier run with the same inputs
    review_errors: list[str] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)
    pool: Path = Path()
    records: int = 0  # lines of the pool (readable or not)
    reviews: Path | None = None
    reviewed: int = 0  # trajectories in the reviews file (its latest line of each)
    matched: int = 0  # of those, trajectories the pool holds

    @property
    def foreign_reviews(self) -> bool:
        """Reviews, none of them of this pool's trajectories: another pool's."""
        return self.reviews is not None and self.reviewed > 0 and not self.matched

    @property
    def warnings(self) -> list[str]:
        """What makes the dataset useless although the run worked: the front-ends warn and the
        verb exits 1 (the pipeline's masks stage fails on an empty pool or another pool's reviews)."""
        if not self.records:
            return [empty_pool(self.pool)]
        if self.foreign_reviews:
            return [reviews_of_another_pool(self.reviews or Path(), self.pool, self.reviewed)]
        if self.reviews is not None and not self.reviewed and self.stats["mode"] != "positive":
            return [f"the reviews file {self.reviews} holds no review: nothing can be accepted"]
        if not self.stats["samples"]:
            rejected = ", ".join(f"{reason} {count}" for reason, count in self.stats["rejected"].items())
            return [f"no trajectory of {self.pool} was kept ({rejected or 'none read'}): the dataset has no sample"]
        return []

    @property
    def invalid(self) -> dict[str, int]:
        """Rejections for a problem with the input (not the mode's selection)."""
        return {k: v for k, v in self.stats["rejected"].items() if k not in SELECTED_OUT}

    @property
    def partial(self) -> bool:
        return bool(self.invalid or self.review_errors)


def rejection_lines(stats: dict[str, Any]) -> list[str]:
    """The trajectories rejected for a problem with the input, one line each (``ID: reason:
    detail``, without the parts one lacks: an unreadable record has no id, its detail locates
    it). Those the mode selected out are counted in the summary, not listed: they are not errors."""
    return [
        ": ".join(part for part in (r["trajectory_id"], r["reason"], r["detail"]) if part)
        for r in stats["rejections"]
        if r["reason"] not in SELECTED_OUT
    ]


def check_options(options: MasksOptions) -> None:
    for name, value, allowed in (
        ("--mode", options.mode, MODES), ("--defect-scope", options.defect_scope, DEFECT_SCOPES),
        ("--prefix-check", options.prefix_check, PREFIX_CHECKS), ("--context", options.context, CONTEXTS),
    ):  # fmt: skip
        if value not in allowed:
            raise OpError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    if options.mode != "positive" and options.reviews is None:
        raise OpError(f"--mode {options.mode} needs --reviews")
    if not options.pool.is_file():
        raise OpError(f"{options.pool}: no such pool")
    if options.reviews is not None and not options.reviews.is_file():
        raise OpError(f"--reviews {options.reviews}: no such file")
    check_jsonl_input(options.pool, POOL, flag="POOL")
    if options.reviews is not None:
        check_jsonl_input(options.reviews, REVIEWS, flag="--reviews")
    if options.audit is not None and not options.audit.is_file():
        raise OpError(f"--audit {options.audit}: no such file (write one with `relearn envs audit -o FILE`)")
    if options.keep_flagged and options.audit is None:
        raise OpError("--keep-flagged needs --audit FILE (the audit whose flagged tasks to keep)")
    check_dataset_dir(options.output)


class _Head(msgspec.Struct):
    """A pool line's ids, of any type (a malformed one counts as no match; the compile
    rejects the record, located)."""

    id: Any = ""
    task_id: Any = None


_HEAD_DECODER = msgspec.json.Decoder(_Head)


def _pool_heads(pool: Path, reviewed: Any, flagged: dict[str, str]) -> tuple[int, int, int, FirstLines]:
    """The pool's records, how many of them ``reviewed`` holds a review of, how many are of a
    task ``flagged`` names (whatever their outcome), and its later lines of a trajectory id (the
    compile rejects them; the first line of an id is the one counted here): one pass that
    decodes each line's ids only."""
    records = matched = of_flagged = 0
    first_lines = FirstLines()
    try:
        for number, text in iter_line_texts(pool):
            records += 1
            if isinstance(text, RecordError):
                continue  # the compile rejects it, located
            try:
                head = _HEAD_DECODER.decode(text)
            except (msgspec.DecodeError, UnicodeEncodeError):
                continue  # the compile rejects it, located
            if isinstance(head.id, str) and not first_lines.add(number, head.id, text):
                continue
            matched += isinstance(head.id, str) and head.id in reviewed
            of_flagged += isinstance(head.task_id, str) and head.task_id in flagged
    except RecordError:
        records += 1  # the rest cannot be read (a broken zstd stream): the compile says where
    return records, matched, of_flagged, first_lines


def read_audit(options: MasksOptions) -> tuple[dict[str, str], dict[str, Any]]:
    """The tasks the audit file flags (task id -> why), and what stats.json says of the audit."""
    if options.audit is None:
        return {}, {"applied": False, "note": "no audit applied (--audit FILE from `relearn envs audit -o`)"}
    try:
        flagged, audited = read_flagged(options.audit)
    except RecordError as exc:
        raise OpError(f"--audit {exc}; fix the line or audit again with `relearn envs audit -o FILE`") from None
    return flagged, {
        "applied": True, "file": str(options.audit), "tasks_audited": audited, "tasks_flagged": len(flagged),
        "kept": options.keep_flagged, "trajectories_of_flagged_tasks": 0,
    }  # fmt: skip


def run_masks(options: MasksOptions, reporter: Reporter = SILENT, *, tokenizer: Any = None) -> MasksSummary:
    """Compile ``options.pool`` into ``options.output``. ``tokenizer``: the one named by
    ``options.tokenizer``, already loaded (the pipeline loads it once for every variant).

    Raises ``OpError`` for unusable options; a shard a worker could not compile raises
    ``RuntimeError`` (the finished shards are kept; a rerun goes on)."""
    check_options(options)
    from relearn.masks.tokenizers import load_tokenizer, resolve_chat_template, with_chat_template  # transformers: slow, only here

    if tokenizer is None:
        try:
            tokenizer = load_tokenizer(options.tokenizer)
        except ValueError as exc:
            raise OpError(f"--tokenizer {options.tokenizer}: {exc}") from None
    if options.chat_template is not None:
        try:
            tokenizer = with_chat_template(tokenizer, resolve_chat_template(options.chat_template))
        except (ValueError, OSError) as exc:
            raise OpError(f"--chat-template {options.chat_template}: {exc}") from None
    flagged, audit = read_audit(options)
    review_errors: list[str] = []
    reviews = load_reviews(options.reviews, review_errors)  # an index of offsets: flat in the pool's size
    records, matched, of_flagged, first_lines = _pool_heads(options.pool, reviews, flagged)
    if flagged:
        audit["trajectories_of_flagged_tasks"] = of_flagged
    # Progress counts the pool's bytes (a compressed pool's are only known as they are read).
    total = None if is_zstd(options.pool) else options.pool.stat().st_size
    tokens = 0

    def advance(size: int, compiled: int) -> None:
        nonlocal tokens
        tokens += compiled
        reporter.advance(size, tokens=f"{tokens:,}")

    with (
        output_lock(options.output, folder=True),  # two compiles into one folder would race on its shards' temporary files
        process_backend(options.ray, Needs(cpus=1), options.workers) as backend,
        stage(reporter, f"compiling {options.mode} masks", total),
    ):
        stats, reused = build_dataset(
            options.pool, reviews, tokenizer, options.tokenizer, options.compile_options(flagged), options.output,
            shard_size=options.shard_size, on_record=advance, backend=backend, audit=audit, repeats=first_lines.repeats,
        )  # fmt: skip
        per_node = dict(getattr(backend, "per_node", {}) or {})
    return MasksSummary(stats, reused, review_errors, per_node, options.pool, records, options.reviews, len(reviews), matched)
