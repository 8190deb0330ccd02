"""Compatibility: how likely a model finds each pool's own assistant tokens.

Each trajectory is rendered over the chat template and its eligible tokens A found exactly
as ``relearn masks`` finds them (``relearn.masks.compile.context_renders`` + ``compile_one`` with
no defects, VALIDATE included), on the same sequences: one per context the model had, or, under
the context as sent, one per turn where the render departs from what the model was sent. Its NLL
is the mean of ``-log π(z_t | z_<t)`` over A, every other token staying in the sequence as
context. Pools whose tokens the model already finds
likely (historical rollouts of the same policy line) are compatible with it; an external
teacher's usually are not, whatever their quality.

The LM head runs only at eligible positions, in chunks (``relearn.train.loss``), so a
65,536-token trajectory never materialises its 65 GB of logits.

With reviews (``relearn analyze nll --reviews``), each trajectory's eligible tokens are also
split into kept (A \\ E, what ROSS trains on) and excluded (E, by defect category) exactly as
``relearn masks --mode ross`` compiles them (``relearn.analyze.split``); a trajectory its
latest review rejects, or that the mask compiler refuses, is scored as without reviews and
counted as not split, by reason.

Scoring runs here one trajectory after another, or (``relearn analyze nll --workers N`` /
``--ray``) as work units of a few trajectories on worker processes or Ray nodes
(envs.executor): each worker process loads the model once (``ModelSpec``, cached there) and
returns the batch's results; this process alone writes the score cache and tallies the
results in pool order, so they equal the serial run's.

Results (scores, skips, rejections) are appended to ``nll-scores.jsonl`` as they are
computed, keyed by trajectory id and a digest of what decides them (model, tokenizer, dtype,
template options, context), and a split also by its review's content: a rerun of the same analysis
costs nothing and loads no model, a killed one resumes, a changed review is split again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.executor import NODE_RETRIES, Backend, NodeLost, node_name, run_units
from records.pools import JsonlWriter, RecordError, iter_lines, iter_pool
from records.review import Review
from records.trajectory import Trajectory, is_verified_positive
from relearn.analyze.pools import NamedPool
from relearn.analyze.split import (
    TrajectorySplit,
    review_key,
    split_sequence,
)
from relearn.masks.compile import CONTEXT_TOKENS, CompileOptions, Rejected, Sample, compile_one, compile_trajectory, context_renders
from relearn.masks.scopes import ACTION_SCOPE
from relearn.masks.shards import BUILD
from relearn.train.options import TrainOptions

# The latest review of each trajectory (``relearn.masks.shards.load_reviews``): its Review, or
# the located error of that line when it cannot be read.
Reviews = Mapping[str, Review | RecordError]

SCORES_FILE = "nll-scores.jsonl"
TOO_LONG = "longer than ctx"
# Trajectories per work unit on a backend: enough to make a unit's overhead (ms on Ray)
# small against scoring (tens of ms each at least), few enough to spread a pool over nodes.
BATCH = 8


class ModelLoadError(ValueError):
    """The model or tokenizer cannot be loaded as asked (the user's to fix)."""


class Skipped(Exception):
    """Not scored, and not the input's fault (too long, nothing generated, filtered out)."""

    def __init__(self, reason: str, tokens: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tokens = tokens


@dataclass(frozen=True)
class Settings:
    """What decides a trajectory's NLL; its digest keys the score cache."""

    model: str
    tokenizer: str
    dtype: str
    template_kwargs: dict[str, Any]
    # Folders' file names, sizes and modification times: a checkpoint folder overwritten
    # with new weights must not reuse the old weights' scores.
    fingerprint: str = ""
    defect_scope: str = ACTION_SCOPE  # how the kept/excluded split reads defects (relearn.masks.compile.DEFECT_SCOPES)
    context: str = "as-sent"  # the context each turn is scored under, as masks compiles it (relearn.masks.compile.CONTEXTS)
    chat_template: str | None = None  # sha256 of --chat-template's text; None: the tokenizer's own (its name and fingerprint say it)

    def digest(self) -> str:
        # The masks build (relearn.masks.shards.BUILD) says how sequences are cut: scores of
        # another build are of other sequences. No --chat-template adds nothing, so the caches
        # written before the option keep their keys.
        fields = {k: v for k, v in asdict(self).items() if not (k == "chat_template" and v is None)}
        return hashlib.sha256(json.dumps({**fields, "build": BUILD}, sort_keys=True).encode()).hexdigest()[:16]


def folder_fingerprint(*paths: str) -> str:
    """What changes when a model or tokenizer folder is rewritten, without reading its weights."""
    h = hashlib.sha256()
    for path in paths:
        folder = Path(path)
        if not folder.is_dir():
            continue  # a built-in name: its build is versioned by its own cache digest
        for entry in sorted(folder.iterdir()):
            if entry.is_file():
                stat = entry.stat()
                h.update(f"{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def eligible_tokens(trajectory: Trajectory, tokenizer: Any, template_kwargs: dict[str, Any], context: str = "as-sent") -> list[Sample]:
    """``input_ids`` and the eligible-token mask A of one trajectory (no defects, no
    selection): one sequence per context the model had, as ``relearn masks`` compiles them
    under ``context`` (``relearn.masks.compile.context_renders``): per context segment, or per
    turn where the render departs from what the model saw."""
    options = CompileOptions(mode="positive", ctx=sys.maxsize, template_kwargs=template_kwargs, context=context)
    samples = []
    for suffix, rendered in context_renders(trajectory, tokenizer, options).renders:
        if rendered.turns:
            sample = compile_one(rendered, trajectory, [], tokenizer, trajectory.id + suffix)
            # What the model produced is scored: text its recorded ids do not decode to is not.
            if sample.targets == "ids_disagree":
                raise Rejected("recorded token ids disagree", sample.targets_detail)
            samples.append(sample)
    if not samples:
        raise Skipped("no generated assistant turn")
    return samples


class Scorer:
    """Per-token NLL of the eligible targets of one sequence under a causal LM."""

    def __init__(self, lm: Any, *, device: str = "cpu", chunk: int = TrainOptions.chunk) -> None:
        from relearn.train.model import RossLM

        self.device = device
        self.chunk = chunk
        self.ross = RossLM(lm.to(device).eval(), chunk=chunk)

    @property
    def vocab_size(self) -> int:
        return int(self.ross.lm.get_input_embeddings().num_embeddings)

    def token_nll(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """float64 ``[mask[1:].sum()]``: token ``t`` (mask 1) is predicted from position ``t - 1``."""
        import torch

        from relearn.train.loss import chunked_nll, select_supervised

        ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64), device=self.device)[None]
        loss_mask = torch.as_tensor(np.asarray(mask, dtype=np.uint8), device=self.device)[None]
        with torch.inference_mode():
            hidden = self.ross.hidden_states(ids)
            h, targets, _ = select_supervised(hidden, ids, loss_mask, torch.zeros_like(ids))
            nll = chunked_nll(h, targets, self.ross.lm.get_output_embeddings(), self.chunk)
        return nll.double().cpu().numpy()


@dataclass(frozen=True)
class ModelSpec:
    """How to load the (tokenizer, scorer) pair: called in this process for a serial run, and
    shipped by value to worker processes and Ray nodes, where each process loads it once."""

    model: str | None  # a model folder, or None with ``tiny``
    tiny: str | None
    seed: int
    tokenizer: str
    attn: str = TrainOptions.attn
    bf16: bool = False
    device: str = "cpu"
    chunk: int = TrainOptions.chunk
    # --chat-template's text, not its name: a worker or Ray node need not hold the file.
    chat_template: str | None = None

    def __call__(self) -> tuple[Any, Scorer]:
        import torch

        from relearn.masks.tokenizers import load_tokenizer, with_chat_template
        from relearn.train.model import build_model

        try:
            lm = build_model(
                init=self.model,
                tiny=self.tiny,
                seed=self.seed,
                attn_implementation=self.attn,
                dtype=torch.bfloat16 if self.bf16 else torch.float32,
            )
        except (ValueError, OSError) as exc:
            raise ModelLoadError(f"{'--model' if self.model else '--tiny'}: {exc}") from None
        try:
            tok = with_chat_template(load_tokenizer(self.tokenizer), self.chat_template)
        except (ValueError, OSError) as exc:
            raise ModelLoadError(f"--tokenizer: {exc}") from None
        scorer = Scorer(lm, device=self.device, chunk=self.chunk)
        # Ids past the embedding would index garbage (or crash on CUDA): refuse the pairing outright.
        if len(tok) > scorer.vocab_size:
            raise ModelLoadError(
                f"the tokenizer has {len(tok):,} tokens but the model's vocabulary is {scorer.vocab_size:,}: they do not belong together"
            )
        return tok, scorer


@functools.cache
def _worker_model(spec: ModelSpec) -> tuple[Any, Scorer]:
    """One load per worker process: it scores batch after batch with the same model."""
    try:
        return spec()
    except ModelLoadError as exc:
        raise ModelLoadError(f"{node_name()}: {exc}") from None


# A trajectory due a score in a work unit: with its review (or _NOT_ASKED) and the review's key.
Due = tuple[Trajectory, "Review | RecordError | None | _NotAsked", "str | None"]


@dataclass(frozen=True)
class ScoreJob:
    """One NLL work unit's function: a batch of (trajectory, its review) in, their results
    out, in order (the driver adds the settings digest and review key, and writes them)."""

    spec: ModelSpec
    settings: Settings
    ctx: int

    def __call__(self, batch: list[Due]) -> list[dict[str, Any]]:
        tokenizer, scorer = _worker_model(self.spec)
        return [_result(trajectory, tokenizer, scorer, self.settings, self.ctx, review) for trajectory, review, _key in batch]


@dataclass
class PoolScores:
    name: str
    path: str
    records: int = 0
    scores: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    rejected: list[RecordError] = field(default_factory=list)
    reused: int = 0  # scores taken from an earlier run
    split_asked: bool = False  # reviews were given: scores carry a kept/excluded split where they could
    not_split: Counter[str] = field(default_factory=Counter)
    # Trajectories whose latest review line is unreadable: scored, not split, and listed.
    review_errors: list[str] = field(default_factory=list)


class ScoreCache:
    """Earlier results under the same settings (a torn last line is ignored). A result split
    with reviews is found again only under the same review (``review_key``); a plain lookup
    takes any result of the trajectory, since the plain figures do not depend on a review."""

    def __init__(self, path: Path, digest: str) -> None:
        self.plain: dict[str, dict[str, Any]] = {}
        self.reviewed: dict[tuple[str, str], dict[str, Any]] = {}
        if not path.is_file():
            return
        try:
            for _line, text in iter_lines(path):
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    continue  # a killed writer's torn line; the writer starts the next record on a new line
                if isinstance(record, dict) and record.get("settings") == digest and "trajectory_id" in record:
                    self.put(record)
        except RecordError:
            pass  # an unreadable cache only costs recomputation

    def put(self, record: dict[str, Any]) -> None:
        self.plain[record["trajectory_id"]] = record
        if "review" in record:
            self.reviewed[(record["trajectory_id"], record["review"])] = record

    def get(self, trajectory_id: str, review: str | None) -> dict[str, Any] | None:
        return self.plain.get(trajectory_id) if review is None else self.reviewed.get((trajectory_id, review))


def _from_cache(cached: dict[str, Any] | None, ctx: int) -> dict[str, Any] | None:
    """A cached result still valid at this ``ctx``: a score that fits, or a skip for any reason
    but length. A trajectory skipped as too long is tried again when ``ctx`` grew enough."""
    if cached is None:
        return None
    if "skipped" in cached:
        return None if cached["skipped"] == TOO_LONG and cached.get("tokens", 0) <= ctx else cached
    return cached


def score_pools(
    pools: list[NamedPool],
    settings: Settings,
    load: Callable[[], tuple[Any, Scorer]],
    out_dir: Path,
    *,
    ctx: int = CONTEXT_TOKENS,
    limit: int | None = None,
    positive_only: bool = False,
    reviews: Reviews | None = None,
    on_record: Callable[[], None] | None = None,
    backend: Backend | None = None,
    batch: int = BATCH,
) -> list[PoolScores]:
    """Score every trajectory of every pool, reusing ``out_dir``'s earlier scores; with
    ``reviews``, split each one's eligible tokens into kept and excluded too.

    ``load`` returns ``(tokenizer, scorer)`` and is called once, at the first trajectory the
    cache lacks, so a rerun that has everything loads no model. With ``backend`` (worker
    processes, a Ray cluster), the trajectories the cache lacks are scored there in units of
    ``batch``; ``load`` must then be a ``ModelSpec`` (it travels by value). ``on_record`` is
    called once per record, when its result is known.
    """
    digest = settings.digest()
    scores_path = out_dir / SCORES_FILE
    cache = ScoreCache(scores_path, digest)
    with JsonlWriter(scores_path) as writer:

        def keep(record: dict[str, Any], key: str | None) -> None:
            record["settings"] = digest
            if key is not None:
                record["review"] = key
            writer.write(record)
            cache.put(record)

        if backend is None:
            return _score_here(pools, settings, load, cache, keep, ctx, limit, positive_only, reviews, on_record or _nothing)
        if not isinstance(load, ModelSpec):
            raise TypeError("a backend loads the model from a ModelSpec")
        return _score_on(
            backend, ScoreJob(load, settings, ctx), pools, cache, keep, ctx, limit, positive_only, reviews, on_record or _nothing, batch
        )


def _nothing() -> None:
    pass


@dataclass
class _Seen:
    """A record read and due a result: scored now, taken from the cache, or (on a backend)
    to be looked up in the cache once its unit came back."""

    line: int
    trajectory_id: str
    key: str | None  # the review's key, with reviews
    review: Review | RecordError | None
    resolved: bool


def _read(
    pool: NamedPool, result: PoolScores, limit: int | None, positive_only: bool, reviews: Reviews | None, on_record: Callable[[], None]
) -> Iterator[RecordError | tuple[_Seen, Trajectory]]:
    """A pool's records in file order: the located errors of unreadable or repeated ones,
    and each trajectory due a result (repeats and, with ``positive_only``, the others are
    counted here)."""
    errors: list[RecordError] = []
    first_line: dict[str, int] = {}
    for line, trajectory in iter_pool(pool.path, errors, limit):
        yield from errors
        errors.clear()
        result.records += 1
        if trajectory.id in first_line:
            on_record()
            yield RecordError(str(pool.path), line, "id", f"{trajectory.id!r} repeats line {first_line[trajectory.id]}")
            continue
        first_line[trajectory.id] = line
        if positive_only and not is_verified_positive(trajectory):
            on_record()
            result.skipped["not verified positive"] += 1
            continue
        review = reviews.get(trajectory.id) if reviews is not None else None
        key = review_key(review) if reviews is not None else None
        yield _Seen(line, trajectory.id, key, review, is_verified_positive(trajectory)), trajectory
    yield from errors


def _score_here(
    pools: list[NamedPool],
    settings: Settings,
    load: Callable[[], tuple[Any, Scorer]],
    cache: ScoreCache,
    keep: Callable[[dict[str, Any], str | None], None],
    ctx: int,
    limit: int | None,
    positive_only: bool,
    reviews: Reviews | None,
    on_record: Callable[[], None],
) -> list[PoolScores]:
    """One trajectory after another in this process, tallied as it goes (memory: one)."""
    loaded: list[tuple[Any, Scorer]] = []
    results = []
    for pool in pools:
        result = PoolScores(pool.name, str(pool.path), split_asked=reviews is not None)
        for event in _read(pool, result, limit, positive_only, reviews, on_record):
            if isinstance(event, RecordError):
                result.rejected.append(event)
                continue
            seen, trajectory = event
            on_record()
            record = _from_cache(cache.get(seen.trajectory_id, seen.key), ctx)
            if record is not None:
                result.reused += 1
            else:
                if not loaded:
                    loaded.append(load())
                tokenizer, scorer = loaded[0]
                record = _result(trajectory, tokenizer, scorer, settings, ctx, seen.review if reviews is not None else _NOT_ASKED)
                keep(record, seen.key)
            _tally_record(result, pool, seen.line, record, ctx, seen.review, seen.resolved)
        results.append(result)
    return results


def _score_on(
    backend: Backend,
    job: ScoreJob,
    pools: list[NamedPool],
    cache: ScoreCache,
    keep: Callable[[dict[str, Any], str | None], None],
    ctx: int,
    limit: int | None,
    positive_only: bool,
    reviews: Reviews | None,
    on_record: Callable[[], None],
    batch: int,
) -> list[PoolScores]:
    """The trajectories the cache lacks scored on ``backend`` in units of ``batch``, read from the
    pools as slots free up (the driver holds the units in flight, and of every record only where
    it was), then every record tallied in file order from the cache the results went into: the
    figures of ``_score_here``, in the same order."""
    read: list[tuple[PoolScores, NamedPool, list[RecordError | _Seen]]] = []
    due: set[tuple[str, str | None]] = set()

    def units() -> Iterator[list[Due]]:
        unit: list[Due] = []
        for pool in pools:
            result = PoolScores(pool.name, str(pool.path), split_asked=reviews is not None)
            events: list[RecordError | _Seen] = []
            read.append((result, pool, events))
            for event in _read(pool, result, limit, positive_only, reviews, on_record):
                if isinstance(event, RecordError):
                    events.append(event)
                    continue
                seen, trajectory = event
                events.append(seen)
                wanted = (seen.trajectory_id, seen.key)
                # Found in the cache, or already due (the same id earlier in the pools): the serial
                # run would find it in the cache by now.
                if wanted in due or _from_cache(cache.get(*wanted), ctx) is not None:
                    result.reused += 1
                    on_record()
                    continue
                due.add(wanted)
                unit.append((trajectory, seen.review if reviews is not None else _NOT_ASKED, seen.key))
                if len(unit) >= batch:
                    yield unit
                    unit = []
        if unit:
            yield unit

    def scored(unit: list[Due], records: list[dict[str, Any]]) -> None:
        for (_trajectory, _review, key), record in zip(unit, records, strict=True):
            keep(record, key)
            on_record()

    def failed(unit: list[Due], exc: BaseException, tries: int) -> bool:
        if isinstance(exc, NodeLost) and tries <= NODE_RETRIES:
            return True  # a lost worker: the batch is scored again elsewhere
        if isinstance(exc, ModelLoadError):
            raise exc
        first, last = unit[0][0].id, unit[-1][0].id
        raise RuntimeError(f"NLL batch {first} .. {last}: {type(exc).__name__}: {exc}") from exc

    run_units(backend, units(), job, on_result=scored, on_error=failed)
    results = []
    for result, pool, events in read:
        for event in events:
            if isinstance(event, RecordError):
                result.rejected.append(event)
                continue
            record = cache.get(event.trajectory_id, event.key)
            assert record is not None, event.trajectory_id  # scored above or found in the cache
            _tally_record(result, pool, event.line, record, ctx, event.review, event.resolved)
        results.append(result)
    return results


def _result(
    trajectory: Trajectory, tokenizer: Any, scorer: Scorer, settings: Settings, ctx: int, review: Review | RecordError | None | _NotAsked
) -> dict[str, Any]:
    """One trajectory's result record: its score, or why it was skipped or rejected (kept
    too: under the same settings the same trajectory fails the same way)."""
    try:
        return _score_one(trajectory, tokenizer, scorer, settings, ctx, review)
    except Rejected as exc:
        return {"trajectory_id": trajectory.id, "task_id": trajectory.task_id, "rejected": str(exc)}


def _tally_record(
    result: PoolScores, pool: NamedPool, line: int, record: dict[str, Any], ctx: int, review: Review | RecordError | None, resolved: bool
) -> None:
    if result.split_asked and isinstance(review, RecordError):
        # Never an earlier review in its place: that could split by defects the reviewer withdrew.
        result.review_errors.append(f"{pool.path}:{line}: {record['trajectory_id']}: not split, its latest review is unreadable: {review}")
    if "rejected" in record:
        result.rejected.append(RecordError(str(pool.path), line, "messages", f"{record['trajectory_id']}: {record['rejected']}"))
    elif "skipped" in record:
        result.skipped[record["skipped"]] += 1
    elif record["tokens"] > ctx:  # scored under a larger ctx earlier
        result.skipped[TOO_LONG] += 1
    else:
        score = {**record, "line": line, "resolved": resolved}
        if not result.split_asked:
            score.pop("split", None)  # a cached split of some other review is no answer here
            score.pop("not_split", None)
        elif "not_split" in score:
            result.not_split[score["not_split"]] += 1
        result.scores.append(score)


class _NotAsked:
    """No reviews were given: no split is attempted (unlike a trajectory without a review)."""


_NOT_ASKED = _NotAsked()


def _score_one(
    trajectory: Trajectory,
    tokenizer: Any,
    scorer: Scorer,
    settings: Settings,
    ctx: int,
    review: Review | RecordError | None | _NotAsked = _NOT_ASKED,
) -> dict[str, Any]:
    base: dict[str, Any] = {"trajectory_id": trajectory.id, "task_id": trajectory.task_id}
    try:
        samples = eligible_tokens(trajectory, tokenizer, settings.template_kwargs, settings.context)
    except Skipped as exc:
        return {**base, "skipped": exc.reason}
    tokens = max(len(s.input_ids) for s in samples)  # the longest sequence the model is run on
    eligible = sum(s.eligible for s in samples)
    if tokens > ctx:
        return {**base, "skipped": TOO_LONG, "tokens": tokens}
    if eligible == 0:
        return {**base, "skipped": "no eligible token", "tokens": tokens}
    masked: list[Sample] | None = None
    outcome: dict[str, Any] = {}
    if not isinstance(review, _NotAsked):
        try:
            masked = ross_samples(trajectory, review, tokenizer, settings.template_kwargs, samples, settings.defect_scope, settings.context)
        except Rejected as exc:
            outcome = {"not_split": exc.reason, "not_split_detail": exc.detail}
    total = 0.0
    split = TrajectorySplit()
    for number, sample in enumerate(samples):
        if int(sample.input_ids.max()) >= scorer.vocab_size:
            raise Rejected("token id outside the model's vocabulary", f"{int(sample.input_ids.max())} >= {scorer.vocab_size}")
        nll = scorer.token_nll(sample.input_ids, sample.loss_mask)
        # The first token is never a target; A never holds it (it opens the system turn), checked.
        if len(nll) != sample.eligible:
            raise Rejected("internal: scored tokens differ from the eligible count", f"{len(nll)} != {sample.eligible}")
        total += float(nll.sum())
        if masked is not None:
            m = masked[number]
            split.add(*split_sequence(nll, sample.loss_mask, m.loss_mask, m.excluded_category))
    if masked is not None:
        outcome = {"split": split.to_json()}
    return {**base, "tokens": tokens, "eligible": eligible, "nll_sum": total, "nll_mean": total / eligible, **outcome}


def ross_samples(
    trajectory: Trajectory,
    review: Review | RecordError | None,
    tokenizer: Any,
    template_kwargs: dict[str, Any],
    plain: list[Sample],
    defect_scope: str = ACTION_SCOPE,
    context: str = "as-sent",
) -> list[Sample]:
    """The trajectory compiled as ``relearn masks --mode ross`` compiles it with ``review``,
    sequence for sequence over the same tokens and eligible positions as ``plain``; Rejected
    (the compiler's reason) when it cannot be split."""
    if isinstance(review, RecordError):
        raise Rejected("unreadable review", str(review))
    # Length is the plain score's business (skipped as too long, counted there), not a reason here.
    options = CompileOptions(mode="ross", ctx=sys.maxsize, template_kwargs=template_kwargs, defect_scope=defect_scope, context=context)
    masked = compile_trajectory(trajectory, review, tokenizer, options)
    if len(masked) != len(plain):
        raise Rejected("internal: the mask compiler's sequences differ from the scored ones", f"{len(masked)} != {len(plain)}")
    for m, p in zip(masked, plain, strict=True):
        if not np.array_equal(m.input_ids, p.input_ids) or not np.array_equal(m.eligible_mask, p.loss_mask):
            raise Rejected("internal: the mask compiler's eligible tokens differ from the scored ones", m.sample_id)
    return masked
