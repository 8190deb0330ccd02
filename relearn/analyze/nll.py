"""Compatibility: how likely a model finds each pool's own assistant tokens.

Each trajectory is rendered over the chat template and its eligible tokens A found exactly
as ``relearn masks`` finds them (``relearn.masks.template`` + ``relearn.masks.compile.compile_one`` with no
defects, VALIDATE included); its NLL is the mean of ``-log π(z_t | z_<t)`` over A, every
other token staying in the sequence as context. Pools whose tokens the model already finds
likely (historical rollouts of the same policy line) are compatible with it; an external
teacher's usually are not, whatever their quality.

The LM head runs only at eligible positions, in chunks (``relearn.train.loss``), so a
65,536-token trajectory never materialises its 65 GB of logits.

Results (scores, skips, rejections) are appended to ``nll-scores.jsonl`` as they are
computed, keyed by trajectory id and a digest of what decides them (model, tokenizer, dtype,
template options): a rerun of the same analysis costs nothing and loads no model, a killed
one resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from records.pools import JsonlWriter, RecordError, iter_lines, iter_pool
from records.trajectory import Trajectory, is_verified_positive
from relearn.analyze.pools import NamedPool
from relearn.masks.compile import Rejected, Sample, compile_one
from relearn.masks.shards import BUILD
from relearn.masks.template import RenderError, context_segments, render

SCORES_FILE = "nll-scores.jsonl"
BOOTSTRAP_SAMPLES = 10_000
SEED = 0
TOO_LONG = "longer than ctx"


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

    def digest(self) -> str:
        # The masks build (relearn.masks.shards.BUILD) says how sequences are cut: scores of
        # another build are of other sequences.
        return hashlib.sha256(json.dumps({**asdict(self), "build": BUILD}, sort_keys=True).encode()).hexdigest()[:16]


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


def eligible_tokens(trajectory: Trajectory, tokenizer: Any, template_kwargs: dict[str, Any]) -> list[Sample]:
    """``input_ids`` and the eligible-token mask A of one trajectory (no defects, no
    selection): one sequence per context the model had (``context_segments``), as masks
    renders them."""
    samples = []
    try:
        for number, segment in enumerate(context_segments(trajectory)):
            rendered = render(trajectory, tokenizer, template_kwargs=template_kwargs, segment=segment)
            if rendered.turns:
                samples.append(compile_one(rendered, trajectory, [], tokenizer, f"{trajectory.id}#r{number}"))
    except RenderError as exc:
        raise Rejected(f"render: {exc.reason}", exc.detail) from None
    if not samples:
        raise Skipped("no generated assistant turn")
    return samples


class Scorer:
    """Per-token NLL of the eligible targets of one sequence under a causal LM."""

    def __init__(self, lm: Any, *, device: str = "cpu", chunk: int = 1024) -> None:
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


@dataclass
class PoolScores:
    name: str
    path: str
    records: int = 0
    scores: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    rejected: list[RecordError] = field(default_factory=list)
    reused: int = 0  # scores taken from an earlier run


def load_cache(path: Path, digest: str) -> dict[str, dict[str, Any]]:
    """Earlier scores under the same settings, by trajectory id (a torn last line is ignored)."""
    cache: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return cache
    try:
        for _line, text in iter_lines(path):
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                continue  # a killed writer's torn line; the writer starts the next record on a new line
            if isinstance(record, dict) and record.get("settings") == digest and "trajectory_id" in record:
                cache[record["trajectory_id"]] = record
    except RecordError:
        pass  # an unreadable cache only costs recomputation
    return cache


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
    ctx: int = 65536,
    limit: int | None = None,
    positive_only: bool = False,
    on_record: Callable[[], None] | None = None,
) -> list[PoolScores]:
    """Score every trajectory of every pool, reusing ``out_dir``'s earlier scores.

    ``load`` returns ``(tokenizer, scorer)`` and is called once, at the first trajectory the
    cache lacks, so a rerun that has everything loads no model.
    """
    digest = settings.digest()
    scores_path = out_dir / SCORES_FILE
    cache = load_cache(scores_path, digest)
    loaded: list[tuple[Any, Scorer]] = []
    results = []
    with JsonlWriter(scores_path) as writer:
        for pool in pools:
            result = PoolScores(pool.name, str(pool.path))
            first_line: dict[str, int] = {}
            for line, trajectory in iter_pool(pool.path, result.rejected, limit):
                result.records += 1
                if on_record:
                    on_record()
                if trajectory.id in first_line:
                    result.rejected.append(RecordError(str(pool.path), line, "id", f"{trajectory.id!r} repeats line {first_line[trajectory.id]}"))
                    continue
                first_line[trajectory.id] = line
                if positive_only and not is_verified_positive(trajectory):
                    result.skipped["not verified positive"] += 1
                    continue
                record = _from_cache(cache.get(trajectory.id), ctx)
                if record is not None:
                    result.reused += 1
                else:
                    if not loaded:
                        loaded.append(load())
                    tokenizer, scorer = loaded[0]
                    try:
                        record = _score_one(trajectory, tokenizer, scorer, settings, ctx)
                    except Rejected as exc:
                        # Kept too: under the same settings the same trajectory fails the same way.
                        record = {"trajectory_id": trajectory.id, "task_id": trajectory.task_id, "rejected": str(exc)}
                    record["settings"] = digest
                    writer.write(record)
                    cache[trajectory.id] = record
                if "rejected" in record:
                    result.rejected.append(RecordError(str(pool.path), line, "messages", f"{trajectory.id}: {record['rejected']}"))
                elif "skipped" in record:
                    result.skipped[record["skipped"]] += 1
                elif record["tokens"] > ctx:  # scored under a larger ctx earlier
                    result.skipped[TOO_LONG] += 1
                else:
                    result.scores.append({**record, "line": line, "resolved": is_verified_positive(trajectory)})
            results.append(result)
    return results


def _score_one(trajectory: Trajectory, tokenizer: Any, scorer: Scorer, settings: Settings, ctx: int) -> dict[str, Any]:
    base: dict[str, Any] = {"trajectory_id": trajectory.id, "task_id": trajectory.task_id}
    try:
        samples = eligible_tokens(trajectory, tokenizer, settings.template_kwargs)
    except Skipped as exc:
        return {**base, "skipped": exc.reason}
    tokens = max(len(s.input_ids) for s in samples)  # the longest sequence the model is run on
    eligible = sum(s.eligible for s in samples)
    if tokens > ctx:
        return {**base, "skipped": TOO_LONG, "tokens": tokens}
    if eligible == 0:
        return {**base, "skipped": "no eligible token", "tokens": tokens}
    total = 0.0
    for sample in samples:
        if int(sample.input_ids.max()) >= scorer.vocab_size:
            raise Rejected("token id outside the model's vocabulary", f"{int(sample.input_ids.max())} >= {scorer.vocab_size}")
        nll = scorer.token_nll(sample.input_ids, sample.loss_mask)
        # The first token is never a target; A never holds it (it opens the system turn), checked.
        if len(nll) != sample.eligible:
            raise Rejected("internal: scored tokens differ from the eligible count", f"{len(nll)} != {sample.eligible}")
        total += float(nll.sum())
    return {**base, "tokens": tokens, "eligible": eligible, "nll_sum": total, "nll_mean": total / eligible}


# ---------------------------------------------------------------- statistics


def bootstrap_ratio(sums: np.ndarray, counts: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> np.ndarray:
    """``samples`` resamples (trajectories with replacement) of Σ sums / Σ counts."""
    n = len(sums)
    out = np.empty(samples)
    rng = np.random.default_rng(seed)
    batch = max(1, 2_000_000 // max(n, 1))  # bounded memory whatever the pool size
    for start in range(0, samples, batch):
        stop = min(samples, start + batch)
        picks = rng.integers(0, n, (stop - start, n))
        out[start:stop] = sums[picks].sum(1) / counts[picks].sum(1)
    return out


def _interval(values: np.ndarray) -> list[float]:
    return [float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))]


def summarize(pool: PoolScores, baseline: PoolScores | None = None, samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """The pool's row: token-weighted NLL with a 95% bootstrap CI, the distribution of
    per-trajectory means, and the difference from ``baseline`` (resampled independently)."""
    row: dict[str, Any] = {
        "name": pool.name,
        "path": pool.path,
        "records": pool.records,
        "scored": len(pool.scores),
        "reused": pool.reused,
        "skipped": dict(pool.skipped),
        "rejected": len(pool.rejected),
    }
    if not pool.scores:
        return row
    sums = np.array([s["nll_sum"] for s in pool.scores])
    counts = np.array([s["eligible"] for s in pool.scores], dtype=np.float64)
    means = sums / counts
    token_nll = float(sums.sum() / counts.sum())
    boot = bootstrap_ratio(sums, counts, samples)
    row.update(
        eligible_tokens=int(counts.sum()),
        tokens=int(sum(s["tokens"] for s in pool.scores)),
        nll_per_token=token_nll,
        nll_per_token_ci95=_interval(boot),
        perplexity=math.exp(token_nll),
        trajectory_mean=float(means.mean()),
        trajectory_mean_ci95=_interval(bootstrap_ratio(means, np.ones_like(means), samples, SEED + 1)),
        median=float(np.median(means)),
        p10=float(np.quantile(means, 0.1)),
        p90=float(np.quantile(means, 0.9)),
        std=float(means.std()),
    )
    if baseline is not None and baseline is not pool and baseline.scores:
        base_sums = np.array([s["nll_sum"] for s in baseline.scores])
        base_counts = np.array([s["eligible"] for s in baseline.scores], dtype=np.float64)
        base_boot = bootstrap_ratio(base_sums, base_counts, samples, SEED + 2)
        row["diff_vs_first"] = token_nll - float(base_sums.sum() / base_counts.sum())
        row["diff_vs_first_ci95"] = _interval(boot - base_boot)
    return row


def analyze(pools: list[PoolScores], settings: Settings, ctx: int, samples: int = BOOTSTRAP_SAMPLES) -> dict[str, Any]:
    """Everything ``relearn analyze nll`` writes to nll.json."""
    baseline = pools[0] if pools else None
    return {
        "settings": {**asdict(settings), "digest": settings.digest(), "ctx": ctx},
        "pools": [summarize(p, baseline, samples) for p in pools],
        "trajectories": {p.name: p.scores for p in pools},
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = result["pools"]
    first = rows[0]["name"] if rows else "-"
    lines = [
        f"# NLL of eligible tokens under {s['model']}",
        "",
        f"Tokenizer {s['tokenizer']}, {s['dtype']}, ctx {s['ctx']}. NLL per token is token-weighted over the pool (nats); "
        f"the distribution is of per-trajectory means; intervals are 95% bootstrap over trajectories; Δ is against {first}.",
        "",
        "| pool | scored | skipped | rejected | eligible tokens | NLL/token (95% CI) | ppl | per-trajectory mean (95% CI) | median | p10–p90 | Δ vs first (95% CI) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        skipped = sum(r["skipped"].values())
        if not r["scored"]:
            lines.append(f"| {r['name']} | 0 | {skipped} | {r['rejected']} | 0 | – | – | – | – | – | – |")
            continue
        lo, hi = r["nll_per_token_ci95"]
        tlo, thi = r["trajectory_mean_ci95"]
        diff = "–"
        if "diff_vs_first" in r:
            dlo, dhi = r["diff_vs_first_ci95"]
            diff = f"{r['diff_vs_first']:+.3f} ({dlo:+.3f}–{dhi:+.3f})"
        lines.append(
            f"| {r['name']} | {r['scored']} | {skipped} | {r['rejected']} | {r['eligible_tokens']:,} | {r['nll_per_token']:.3f} ({lo:.3f}–{hi:.3f}) "
            f"| {r['perplexity']:.2f} | {r['trajectory_mean']:.3f} ({tlo:.3f}–{thi:.3f}) | {r['median']:.3f} | {r['p10']:.3f}–{r['p90']:.3f} | {diff} |"
        )
    reasons = sorted({reason for r in rows for reason in r["skipped"]})
    if reasons:
        lines += ["", "Skipped: " + "; ".join(f"{reason}: " + ", ".join(f"{r['name']} {r['skipped'].get(reason, 0)}" for r in rows) for reason in reasons) + "."]
    return "\n".join(lines) + "\n"
