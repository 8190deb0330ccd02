"""Dataset shards: the pool compiled into Parquet token data plus statistics.

Shard ``k`` holds the samples of input records ``[k*S, (k+1)*S)`` of the pool, in pool
order, so a shard's content depends only on its inputs and the options. Each shard's
statistics carry the digest of everything it was compiled from: the options, the
tokenizer and its chat template, the bytes of each pool record and the review each one
was compiled with. A rerun keeps a shard only when that digest is the same (resumable),
rebuilds it otherwise, and removes shards past the pool's end (a folder never mixes
shards of other inputs); the same inputs give the same bytes (deterministic). Each shard
is written beside its final name and renamed into place, then its statistics; a shard
without statistics is redone.

Duplicates: the first line of a trajectory id is compiled; each later line of that id (same
content or not) is rejected, naming the first line. They are found before the compile, in one
pass over the pool's ids (``relearn.ops.masks``), and handed to ``build_dataset`` as pool line
numbers, so every shard, in any worker, decides alike; a shard's digest includes its repeated
lines and why, so a resumed build never keeps a shard that compiled one.

Reviews: the latest review line of a trajectory is the one used. When that line cannot be
read, the trajectory is rejected with the line's located error; it never falls back to an
earlier review.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.executor import NODE_RETRIES, Backend, NodeLost, run_units
from records.pools import RecordError, is_zstd, iter_pool_records, parse_json_line, parse_trajectory, write_text_atomic
from records.review import Review, iter_review_records
from records.trajectory import Trajectory
from relearn.masks.compile import FLAGGED_BY_AUDIT, CompileOptions, Rejected, Sample, compile_batch
from relearn.masks.context_check import RULES
from relearn.masks.rows import ShardRow, ShardWriter
from relearn.masks.scopes import SCOPES
from relearn.masks.template import RenderError, TemplateShape, probe
from relearn.masks.tokens import TARGETS

SHOWN_REJECTIONS = 200
# A later line of a trajectory id that an earlier line of the pool holds (``Repeats``).
DUPLICATE_SAME = "duplicate trajectory id, same content"
DUPLICATE_DIFFERS = "duplicate trajectory id, content differs"
SHARD_SIZE = 256  # trajectories of the pool per shard


@dataclass
class ShardStats:
    options_hash: str
    inputs_hash: str = ""  # options, tokenizer, the chunk's pool records and their reviews
    inputs: int = 0
    samples: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    rejections: list[dict[str, str]] = field(default_factory=list)
    tokens: int = 0
    eligible: int = 0
    excluded: int = 0
    supervised: int = 0
    excluded_by_category: Counter[str] = field(default_factory=Counter)
    excluded_by_scope: Counter[str] = field(default_factory=Counter)  # excluded under each defect scope
    # Accepted trajectories by the rule that decided their context, and those of each rule
    # compiled per turn under the context as sent (relearn.masks.context_check).
    context_rules: Counter[str] = field(default_factory=Counter)
    as_sent: Counter[str] = field(default_factory=Counter)
    targets: Counter[str] = field(default_factory=Counter)  # samples by relearn.masks.tokens.TARGETS
    notes: list[dict[str, str]] = field(default_factory=list)  # recorded ids not used, and why
    per_sample: list[dict[str, Any]] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.samples += 1
        self.tokens += len(sample.input_ids)
        self.eligible += sample.eligible
        self.excluded += sample.excluded
        self.supervised += sample.supervised
        self.excluded_by_category.update(sample.excluded_by_category)
        self.excluded_by_scope.update(sample.excluded_by_scope)
        self.targets[sample.targets] += 1
        if sample.targets_detail:
            self.notes.append({"sample_id": sample.sample_id, "targets": sample.targets, "detail": sample.targets_detail})
        self.per_sample.append(
            {
                "sample_id": sample.sample_id,
                "trajectory_id": sample.trajectory_id,
                "tokens": len(sample.input_ids),
                "eligible": sample.eligible,
                "excluded": sample.excluded,
                "ter": sample.ter,
                "excluded_by_scope": sample.excluded_by_scope,
                "targets": sample.targets,
                # The rule that decided the sample's context (relearn.masks.context_check), and
                # whether it was compiled under the context as sent.
                "context": sample.context_rule + (" as sent" if sample.as_sent else ""),
            }
        )

    def trajectory(self, first: Sample) -> None:
        """Count an accepted trajectory's context rule (from its first sample)."""
        self.context_rules[first.context_rule] += 1
        self.as_sent[first.context_rule] += first.as_sent

    def reject(self, trajectory_id: str, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        self.rejections.append({"trajectory_id": trajectory_id, "reason": reason, "detail": detail})


# Bumped when the same inputs and options compile differently: 2 renders each context between
# resets apart (shards built before it trained post-reset turns on the history before the reset);
# 3 has ross-nomask validate the defects as ross does, so both hold the same trajectories;
# 4 counts the excluded tokens under both defect scopes (shards before it lack the count);
# 5 trains recorded ids and compiles under the context as sent (earlier shards re-tokenised
# the render and trusted the template's history); 7 gives DiffusionGemma a calling turn with text
# as text then calls (shards before it rendered the text after the tool's response, left out of
# A) and maps arguments a template writes in a syntax of its own (Gemma's lists) leaf by leaf.
BUILD = 7


def options_hash(options: CompileOptions, tokenizer_name: str, template: str) -> str:
    basis = json.dumps({"options": asdict(options), "tokenizer": tokenizer_name, "template": template, "build": BUILD}, sort_keys=True)
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What the tokenizer is, not what it is called: its whole definition (vocabulary, merges,
    normaliser, added tokens) and its chat template."""
    definition = _definition_hash(tokenizer).copy()
    definition.update(("\0" + (tokenizer.chat_template or "")).encode())
    return definition.hexdigest()


def vocabulary_fingerprint(tokenizer: Any) -> str:
    """What the ids mean, without the chat template: the tokenizer's definition (vocabulary,
    merges, added tokens, normaliser). Training refuses a dataset whose ids are another's."""
    return _definition_hash(tokenizer).hexdigest()


def _definition_hash(tokenizer: Any) -> Any:
    """The sha256 state after the tokenizer's serialised definition, which both fingerprints
    continue from.

    Serialising the definition takes a third of a second for Qwen's 248k tokens, so a fast
    tokenizer's hash is kept per tokenizer object for as long as the object lives, and worked
    out again when anything that can change without replacing its vocabulary model has
    changed (added tokens, normaliser, pre-tokenizer, post-processor, decoder, truncation,
    padding)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return hashlib.sha256(repr(sorted(tokenizer.get_vocab().items())).encode())
    state = _mutable_state(tokenizer, backend)
    cached = _DEFINITIONS.get(tokenizer)
    if cached is not None and cached[0] == state:
        return cached[1]
    value = hashlib.sha256(backend.to_str().encode())
    with contextlib.suppress(TypeError):  # an object without weak references is not cached
        _DEFINITIONS[tokenizer] = (state, value)
    return value


_DEFINITIONS: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def _mutable_state(tokenizer: Any, backend: Any) -> tuple[Any, ...]:
    """Everything of a fast tokenizer's definition but its vocabulary model, cheaply (0.2 ms)."""
    components = (backend.normalizer, backend.pre_tokenizer, backend.post_processor, backend.decoder)
    return (
        backend.get_vocab_size(with_added_tokens=True),
        repr(sorted((i, repr(token)) for i, token in backend.get_added_tokens_decoder().items())),
        *(c.__getstate__() if c is not None else None for c in components),
        repr(backend.truncation),
        repr(backend.padding),
    )


def chat_template_sha256(tokenizer: Any) -> str:
    return hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()


ReviewMap = Mapping[str, Review | RecordError]
# Pool lines (1-based) to reject as later lines of a trajectory id: line -> (reason, detail).
Repeats = Mapping[int, tuple[str, str]]


class FirstLines:
    """The repeated trajectory ids of a pool, fed its lines in order (``add``): each id's first
    line and a digest of its content, packed in one int (line << 64 | 64-bit digest), so memory
    holds one dict entry per trajectory id (160 bytes with a 36-character id, measured: 85 the
    id's str, 75 the int and the entry) and one per repeated line, whatever the pool's size."""

    def __init__(self) -> None:
        self._first: dict[str, int] = {}
        self.repeats: dict[int, tuple[str, str]] = {}

    @staticmethod
    def digest(text: str) -> int:
        """The line's content (the whitespace around a JSON line is not)."""
        return int.from_bytes(hashlib.blake2b(text.strip().encode(), digest_size=8).digest(), "big")

    def add(self, line: int, trajectory_id: str, text: str) -> bool:
        """Whether ``line`` is the first of its id (else it is recorded as a repeat)."""
        digest = self.digest(text)
        first = self._first.setdefault(trajectory_id, line << 64 | digest)
        if first == line << 64 | digest:
            return True
        first_line, first_digest = first >> 64, first & (1 << 64) - 1
        if first_digest == digest:
            self.repeats[line] = (DUPLICATE_SAME, f"line {line} repeats line {first_line}")
        else:
            self.repeats[line] = (
                DUPLICATE_DIFFERS,
                f"line {line} differs from line {first_line}, which is compiled (content {digest:016x}, first {first_digest:016x})",
            )
        return False


class ReviewIndex(Mapping[str, Review | RecordError]):
    """The latest review line of each trajectory, read from the file when asked for: memory holds
    each trajectory's byte offset, never its review (a parsed Review takes kilobytes; a pool can
    hold a hundred thousand trajectories). A compressed file cannot be read at an offset, so its
    reviews are held. A line that cannot be read is held as its located error."""

    CACHED = 1024  # reviews kept parsed: a shard's, looked up several times while it compiles

    def __init__(self, path: Path | None, errors: list[str]) -> None:
        self.path = path
        self._at: dict[str, int | Review | RecordError] = {}
        self._cache: OrderedDict[str, Review] = OrderedDict()
        if path is None:
            return
        held = is_zstd(path)
        offsets = self._offsets(path) if not held else iter(())
        for trajectory_id, item in iter_review_records(path):
            offset = next(offsets, None)
            if isinstance(item, RecordError):
                errors.append(str(item))
            if trajectory_id is not None:
                # The latest line of a trajectory wins, readable or not.
                self._at[trajectory_id] = offset if isinstance(item, Review) and offset is not None else item

    @staticmethod
    def _offsets(path: Path) -> Iterator[int]:
        """The byte offset of each line ``iter_review_records`` reads (it skips blank lines)."""
        with open(path, "rb") as handle:
            while True:
                offset = handle.tell()
                line = handle.readline()
                if not line:
                    return
                if not line.decode("utf-8", "replace").isspace():  # as iter_lines decides
                    yield offset

    def __getitem__(self, trajectory_id: str) -> Review | RecordError:
        at = self._at[trajectory_id]
        if not isinstance(at, int):
            return at
        review = self._cache.get(trajectory_id)
        if review is None:
            assert self.path is not None
            with open(self.path, "rb") as handle:
                handle.seek(at)
                text = handle.readline().decode("utf-8")
            review = Review.model_validate(parse_json_line(self.path, 0, text))  # read whole before: it validates
            self._cache[trajectory_id] = review
            if len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(trajectory_id)
        return review

    def __iter__(self) -> Iterator[str]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, trajectory_id: object) -> bool:
        return trajectory_id in self._at


def load_reviews(path: Path | None, errors: list[str]) -> ReviewIndex:
    """The latest review line of each trajectory: its Review, or the located error of that
    line when it cannot be read (the trajectory is then rejected, never given an earlier
    review). Lines that name no trajectory at all are only listed in ``errors``."""
    return ReviewIndex(path, errors)


@dataclass
class Item:
    """A pool record as a shard holds it until compiled: its line (a parsed record takes several
    times the memory of its text, so a record is parsed again, a batch at a time, to compile
    it), the line's digest and size in bytes, and the record's id or why it cannot be read."""

    line: int | None
    text: str
    digest: bytes
    size: int
    trajectory_id: str | None
    error: RecordError | None

    def trajectory(self, pool: Path) -> Trajectory:
        return parse_trajectory(pool, self.line, parse_json_line(pool, self.line or 0, self.text))


def _chunks(items: Iterator[Item], size: int) -> Iterator[list[Item]]:
    chunk: list[Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _pool_items(pool: Path) -> Iterator[Item]:
    for line, text, item in iter_pool_records(pool):
        data = text.encode()
        readable = isinstance(item, Trajectory)
        yield Item(line, text, hashlib.sha256(data).digest(), len(data), item.id if readable else None, None if readable else item)


def _inputs_hash(digest: str, tokenizer_id: str, chunk: list[Item], reviews: ReviewMap, repeats: Repeats) -> str:
    h = hashlib.sha256(f"{digest}\0{tokenizer_id}\0".encode())
    for entry in chunk:
        h.update(entry.digest)
        if entry.line in repeats:  # (nothing for other lines: a pool without repeats keeps its digests)
            h.update("repeat: {}: {}\0".format(*repeats[entry.line]).encode())
        review = reviews.get(entry.trajectory_id) if entry.trajectory_id is not None else None
        if isinstance(review, Review):
            h.update(json.dumps(review.model_dump(mode="json"), sort_keys=True).encode())
        elif review is not None:
            h.update(f"unreadable: {review}".encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


# Pool text tokenized in one batch call, and one row group of the shard: enough trajectories
# to keep every core busy, few enough that their tokenizer encodings (~6 MB per 60k tokens)
# stay small (at 4 MB, a shard of 256 such trajectories peaked at 938 MB; at 2 MB, 836 MB).
BATCH_BYTES = 2_000_000


def _batches(chunk: list[Item]) -> Iterator[list[Item]]:
    batch: list[Item] = []
    size = 0
    for item in chunk:
        batch.append(item)
        size += item.size
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _unreadable(entry: Item, reviews: ReviewMap, repeats: Repeats) -> tuple[str, str, str] | None:
    """Why a record cannot go to the compiler, as (trajectory id, reason, detail); None when it can."""
    if entry.trajectory_id is None:
        return "", "unreadable record", str(entry.error)
    if entry.line in repeats:
        return entry.trajectory_id, *repeats[entry.line]
    review = reviews.get(entry.trajectory_id)
    if isinstance(review, RecordError):
        return entry.trajectory_id, "unreadable review", str(review)
    return None


def _compilable(batch: list[Item], reviews: ReviewMap, pool: Path, repeats: Repeats) -> Iterator[tuple[Trajectory, Review | None]]:
    """The records of ``batch`` that go to the compiler, parsed, with their reviews."""
    for entry in batch:
        if _unreadable(entry, reviews, repeats) is None:
            review = reviews.get(entry.trajectory_id or "")
            yield entry.trajectory(pool), review if isinstance(review, Review) else None


def _row(sample: Sample) -> ShardRow:
    """What a shard keeps of a compiled sample (not the per-token arrays only analyses use)."""
    return ShardRow(
        sample.sample_id, sample.trajectory_id, sample.input_ids, sample.loss_mask, sample.eligible, sample.excluded, sample.ter
    )


def _compile_batches(
    chunk: list[Item],
    reviews: ReviewMap,
    pool: Path,
    tokenizer: Any,
    options: CompileOptions,
    shape: TemplateShape | None,
    stats: ShardStats,
    repeats: Repeats,
) -> Iterator[tuple[list[ShardRow], list[tuple[int, int]]]]:
    """A shard's rows a batch (one row group) at a time, with each record's (size, tokens)
    for progress; ``stats`` counts as it goes."""
    for batch in _batches(chunk):
        compiled = iter(compile_batch(list(_compilable(batch, reviews, pool, repeats)), tokenizer, options, shape=shape))
        rows: list[ShardRow] = []
        progress: list[tuple[int, int]] = []
        for entry in batch:
            tokens = 0
            stats.inputs += 1
            problem = _unreadable(entry, reviews, repeats)
            if problem is not None:
                stats.reject(*problem)
            else:
                produced = next(compiled)
                if isinstance(produced, Rejected):
                    stats.reject(entry.trajectory_id or "", produced.reason, produced.detail)
                else:
                    stats.accepted += 1
                    stats.trajectory(produced[0])
                    for sample in produced:
                        stats.add(sample)
                        rows.append(_row(sample))
                        tokens += len(sample.input_ids)
            progress.append((entry.size, tokens))
        yield rows, progress


@dataclass
class CompiledShard:
    """What a masks work unit returns: the shard's row groups and statistics; the driver
    writes the file (the same row groups, so the same bytes as compiling it here)."""

    number: int
    stats: ShardStats
    batches: list[list[ShardRow]]
    progress: list[tuple[int, int]]


@dataclass(frozen=True)
class ShardUnit:
    """One shard to compile: its records and, of the reviews and repeated lines, only theirs (a
    unit travels to a worker process or a Ray node by value)."""

    number: int
    inputs_hash: str
    chunk: list[Item]
    reviews: dict[str, Review | RecordError]
    repeats: dict[int, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardJob:
    """One masks work unit's function, for worker processes or Ray nodes: the tokenizer
    travels by name and is loaded once per worker process (a pickled tokenizer is 15 MB and
    seconds to load), then checked against the driver's by fingerprint."""

    tokenizer_name: str
    tokenizer_id: str
    pool: Path
    options: CompileOptions
    digest: str
    chat_template: str | None = None  # the driver's template, where it is not the named tokenizer's own

    def __call__(self, unit: ShardUnit) -> CompiledShard:
        tokenizer = _worker_tokenizer(self.tokenizer_name, self.tokenizer_id, self.chat_template)
        try:
            shape: TemplateShape | None = probe(tokenizer, dict(self.options.template_kwargs))
        except RenderError:
            shape = None
        stats = ShardStats(options_hash=self.digest, inputs_hash=unit.inputs_hash)
        batches, progress = [], []
        for rows, seen in _compile_batches(unit.chunk, unit.reviews, self.pool, tokenizer, self.options, shape, stats, unit.repeats):
            batches.append(rows)
            progress.extend(seen)
        return CompiledShard(unit.number, stats, batches, progress)


@functools.cache
def _worker_tokenizer(name: str, expected_id: str, chat_template: str | None = None) -> Any:
    """One load (and one fingerprint, itself a hash of the whole vocabulary) per worker
    process: the tokenizer is immutable and the process serves many shards."""
    from relearn.masks.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(name)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if tokenizer_fingerprint(tokenizer) != expected_id:
        raise RuntimeError(
            f"tokenizer {name} on this worker is not the driver's (fingerprint differs): install the same files on every node"
        )
    return tokenizer


def build_dataset(
    pool: Path,
    reviews: ReviewMap,
    tokenizer: Any,
    tokenizer_name: str,
    options: CompileOptions,
    output: Path,
    *,
    shard_size: int = SHARD_SIZE,
    on_record: Callable[[int, int], None] | None = None,
    backend: Backend | None = None,
    audit: dict[str, Any] | None = None,
    repeats: Repeats | None = None,
) -> tuple[dict[str, Any], int]:
    """Compile ``pool`` into ``output``; returns the statistics and how many shards
    were already there and reused. ``on_record(size, tokens)`` follows progress: each record's
    size in bytes and the tokens it gave (0 when rejected or in a reused shard).

    Without ``backend``, shards are compiled here one after another and memory holds one
    shard's lines and one batch's rows at a time, whatever the pool's size. With one (worker
    processes, a Ray cluster: envs.executor), each shard is a work unit compiled there, and
    this process writes the files from the rows that come back, in the same bytes; memory
    then holds the shards in flight. ``audit``: what the image audit did (``relearn.ops.masks``),
    written to the statistics as it is. ``repeats``: the pool's later lines of a trajectory id
    (``FirstLines``, filled by the caller's pass over the pool), each rejected with its reason."""
    repeats = repeats or {}
    output.mkdir(parents=True, exist_ok=True)
    digest = options_hash(options, tokenizer_name, tokenizer.chat_template or "")
    tokenizer_id = tokenizer_fingerprint(tokenizer)
    try:
        shape: TemplateShape | None = probe(tokenizer, dict(options.template_kwargs))
    except RenderError:
        shape = None  # each trajectory probes again and is rejected with the reason
    shard_stats: dict[int, ShardStats] = {}
    reused = shards = 0

    def due() -> Iterator[tuple[int, str, list[Item], dict[int, tuple[str, str]]]]:
        """The shards to compile, read from the pool as they are asked for (a backend asks as
        its slots free up); a shard already compiled from the same inputs is taken as it is."""
        nonlocal reused, shards
        for number, chunk in enumerate(_chunks(_pool_items(pool), shard_size)):
            shards = number + 1
            mine = {e.line: repeats[e.line] for e in chunk if e.line is not None and e.line in repeats}
            inputs_hash = _inputs_hash(digest, tokenizer_id, chunk, reviews, mine)
            saved = _saved_stats(output, number, inputs_hash)
            if saved is None:
                yield number, inputs_hash, chunk, mine
                continue
            shard_stats[number] = saved
            reused += 1
            for entry in chunk:
                if on_record:
                    on_record(entry.size, 0)

    def report(progress: list[tuple[int, int]]) -> None:
        for size, tokens in progress:
            if on_record:
                on_record(size, tokens)

    def finish(number: int, stats: ShardStats) -> None:
        write_text_atomic(output / f"shard-{number:05d}.stats.json", json.dumps(_stats_to_json(stats), indent=1, sort_keys=True))
        shard_stats[number] = stats

    if backend is None:
        for number, inputs_hash, chunk, mine in due():
            stats = ShardStats(options_hash=digest, inputs_hash=inputs_hash)
            with ShardWriter(output / f"shard-{number:05d}.parquet", options.mode) as writer:
                for rows, progress in _compile_batches(chunk, reviews, pool, tokenizer, options, shape, stats, mine):
                    report(progress)
                    writer.write(rows)
            finish(number, stats)
    else:

        def written(_unit: ShardUnit, compiled: CompiledShard) -> None:
            with ShardWriter(output / f"shard-{compiled.number:05d}.parquet", options.mode) as writer:
                for rows in compiled.batches:
                    writer.write(rows)
            finish(compiled.number, compiled.stats)
            report(compiled.progress)

        def failed(unit: ShardUnit, exc: BaseException, tries: int) -> bool:
            if isinstance(exc, NodeLost) and tries <= NODE_RETRIES:
                return True  # a lost worker: the shard is compiled again elsewhere
            raise RuntimeError(f"shard {unit.number}: {type(exc).__name__}: {exc}") from exc

        units = (ShardUnit(number, inputs_hash, chunk, _reviews_of(chunk, reviews), mine) for number, inputs_hash, chunk, mine in due())
        run_units(
            backend,
            units,
            ShardJob(tokenizer_name, tokenizer_id, pool, options, digest, tokenizer.chat_template),
            on_result=written,
            on_error=failed,
        )
    _remove_stale_shards(output, shards)
    summary = summarise([shard_stats[k] for k in sorted(shard_stats)], options, tokenizer_name, pool)
    # What the ids mean: exports refuse a tokenizer that is not this one (relearn.export).
    summary["tokenizer_fingerprint"] = tokenizer_id
    summary["vocabulary_fingerprint"] = vocabulary_fingerprint(tokenizer)
    summary["chat_template_sha256"] = chat_template_sha256(tokenizer)
    summary["audit"] = {**(audit or {"applied": False})}
    if summary["audit"]["applied"]:
        summary["audit"]["trajectories_left_out"] = summary["rejected"].get(FLAGGED_BY_AUDIT, 0)
    write_text_atomic(output / "stats.json", json.dumps(summary, indent=1, sort_keys=True))
    return summary, reused


def _reviews_of(chunk: list[Item], reviews: ReviewMap) -> dict[str, Review | RecordError]:
    ids = (entry.trajectory_id for entry in chunk if entry.trajectory_id is not None)
    return {i: reviews[i] for i in ids if i in reviews}


def _saved_stats(output: Path, number: int, inputs_hash: str) -> ShardStats | None:
    """The statistics of shard ``number`` where it was compiled from these very inputs."""
    shard, stats_path = output / f"shard-{number:05d}.parquet", output / f"shard-{number:05d}.stats.json"
    if not (shard.exists() and stats_path.exists()):
        return None
    try:
        saved = json.loads(stats_path.read_text())
    except ValueError:
        return None
    return _stats_from_json(saved) if saved.get("inputs_hash") == inputs_hash else None


def _remove_stale_shards(output: Path, count: int) -> None:
    """Shards numbered past this pool's end were compiled from other inputs: a trainer
    reading the folder must not see them."""
    for path in output.glob("shard-*.parquet"):
        index = path.name.removeprefix("shard-").split(".")[0]
        if index.isdigit() and int(index) >= count:
            path.unlink()
            path.with_name(f"shard-{index}.stats.json").unlink(missing_ok=True)


def _stats_to_json(stats: ShardStats) -> dict[str, Any]:
    data = asdict(stats)
    data["rejected"] = dict(stats.rejected)
    data["excluded_by_category"] = dict(stats.excluded_by_category)
    data["excluded_by_scope"] = dict(stats.excluded_by_scope)
    for name in ("context_rules", "as_sent", "targets"):
        data[name] = dict(getattr(stats, name))
    return data


def _stats_from_json(data: dict[str, Any]) -> ShardStats:
    stats = ShardStats(**{k: v for k, v in data.items() if k in ShardStats.__dataclass_fields__})
    stats.rejected = Counter(data.get("rejected", {}))
    stats.excluded_by_category = Counter(data.get("excluded_by_category", {}))
    stats.excluded_by_scope = Counter(data.get("excluded_by_scope", {}))
    for name in ("context_rules", "as_sent", "targets"):
        setattr(stats, name, Counter(data.get(name, {})))
    return stats


def _mean_ter(per_sample: list[dict[str, Any]], scope: str) -> float:
    ters = [s.get("excluded_by_scope", {}).get(scope, 0) / s["eligible"] if s["eligible"] else 0.0 for s in per_sample]
    return sum(ters) / len(ters) if ters else 0.0


def summarise(shards: list[ShardStats], options: CompileOptions, tokenizer_name: str, pool: Path) -> dict[str, Any]:
    rejected: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    rejections: list[dict[str, str]] = []
    per_sample: list[dict[str, Any]] = []
    for shard in shards:
        rejected.update(shard.rejected)
        categories.update(shard.excluded_by_category)
        rejections.extend(shard.rejections)
        per_sample.extend(shard.per_sample)
    eligible = sum(s.eligible for s in shards)
    excluded = sum(s.excluded for s in shards)
    ters = [s["ter"] for s in per_sample]
    scopes: Counter[str] = Counter()
    rules: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    targets: Counter[str] = Counter()
    for shard in shards:
        scopes.update(shard.excluded_by_scope)
        rules.update(shard.context_rules)
        sent.update(shard.as_sent)
        targets.update(shard.targets)
    return {
        "pool": str(pool),
        "mode": options.mode,
        "ctx": options.ctx,
        "tokenizer": tokenizer_name,
        "per_turn": options.per_turn,
        "defect_scope": options.defect_scope,
        "prefix_check": options.prefix_check,
        "template_kwargs": options.template_kwargs,
        "shards": len(shards),
        "trajectories_in": sum(s.inputs for s in shards),
        "trajectories_out": sum(s.accepted for s in shards),
        "samples": sum(s.samples for s in shards),
        "rejected": dict(sorted(rejected.items())),
        "rejections": rejections[:SHOWN_REJECTIONS],
        "tokens": {
            "total": sum(s.tokens for s in shards),
            "eligible": eligible,
            "excluded": excluded,
            "supervised": sum(s.supervised for s in shards),
        },
        "ter_token_weighted": excluded / eligible if eligible else 0.0,
        "ter_mean": sum(ters) / len(ters) if ters else 0.0,
        # TER under each defect scope, whichever was trained (the paper's is ``minimal``).
        "ter_by_scope": {
            scope: {
                "excluded": scopes[scope],
                "ter_token_weighted": scopes[scope] / eligible if eligible else 0.0,
                "ter_mean": _mean_ter(per_sample, scope),
            }
            for scope in SCOPES
        },
        "excluded_by_category": dict(sorted(categories.items())),
        # What the model saw: accepted trajectories by the rule that decided their context, and
        # of those the ones compiled per turn under the context as sent; samples by where their
        # generated tokens came from (recorded ids, or the text), with why ids were not used.
        "context": {
            "mode": options.context,
            "by_rule": {rule: rules[rule] for rule in RULES if rules[rule]},
            "as_sent": {rule: sent[rule] for rule in RULES if sent[rule]},
        },
        "targets": {
            "recorded_ids": options.recorded_ids,
            "samples": {name: targets[name] for name in TARGETS if targets[name]},
            "notes": [note for shard in shards for note in shard.notes][:SHOWN_REJECTIONS],
        },
        "per_sample": per_sample,
    }
