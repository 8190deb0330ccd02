"""Training data: Parquet shards -> validated samples -> per-epoch plans -> micro-batches.

Shards are read through ``relearn.masks.rows`` (one row class, ``ShardRow``, and one reader);
the trainer needs ``sample_id``, ``trajectory_id``, ``input_ids`` (int32) and ``loss_mask``
(uint8, 1 = supervised target).

The normalisation unit is the trajectory (``trajectory_id``), not the sample: a trajectory
compiled into several samples (context resets, ``--per-turn``) is weighed once, each sample's
targets divided by the trajectory's whole supervised count over the samples loaded
(``trajectory_totals``, one pass over the loaded samples; see ``relearn.train.loss``).

Order of work in a run, and why it is all decided up front:
  * an epoch's order is a permutation drawn from ``(seed, epoch)``, so every rank computes the
    same plan without talking to the others, and a resumed run finds the same order again;
  * the plan cuts that order into rows (one trajectory per row, or several packed up to
    ``ctx`` tokens), then into optimizer steps of ``world x grad_accum x rows_per_micro`` rows;
  * the last step of an epoch is filled by wrapping around to the start of the order (as
    ``torch.utils.data.DistributedSampler`` pads), so every rank runs the same number of
    micro-batches, which ZeRO-3 requires.
Token ids stay as zero-copy numpy views into the Arrow buffers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relearn.masks.rows import RowProblem, ShardError, ShardRow, iter_located_rows, shard_files
from relearn.masks.shards import vocabulary_fingerprint

Row = tuple[int, ...]  # indices of the samples in one sequence (several when packed)


class DataError(ValueError):
    """The dataset cannot be used at all (missing files or columns)."""


@dataclass
class LoadReport:
    files: list[Path] = field(default_factory=list)
    rows: int = 0
    problems: list[str] = field(default_factory=list)  # refused samples, each with file, row and reason
    too_long: int = 0
    unsupervised: int = 0  # samples with no supervised target: they carry no loss, so they are left out
    trajectories: int = 0  # distinct trajectory ids among the samples loaded (the normalisation units)


def tokenizer_mismatch(dataset: Path, tokenizer: Any, saved_with: str) -> str | None:
    """Why the dataset's token ids are not ``tokenizer``'s: trained anyway, the weights would
    learn one vocabulary and be saved beside another. None when they agree, or when either side
    cannot tell (no tokenizer to save; a dataset from before masks recorded it). ``saved_with``
    names the run's tokenizer in the message."""
    stats_path = dataset / "stats.json"
    if tokenizer is None or not stats_path.is_file():
        return None
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, ValueError):
        return None
    expected = stats.get("vocabulary_fingerprint") if isinstance(stats, dict) else None
    if not isinstance(expected, str) or vocabulary_fingerprint(tokenizer) == expected:
        return None
    compiled_with = stats.get("tokenizer") or "another tokenizer"
    return (
        f"{dataset}: its token ids are those of {compiled_with} (relearn masks --tokenizer), not of the tokenizer this run "
        f"would save with the model ({saved_with}); give --tokenizer {compiled_with}, or compile the dataset with the model's"
    )


def load_samples(path: Path, *, ctx: int, vocab_size: int | None = None) -> tuple[list[ShardRow], LoadReport]:
    """Read and check every sample. A sample longer than ``ctx`` is refused and listed, never cut."""
    try:
        report = LoadReport(files=shard_files(path))
        samples: list[ShardRow] = []
        for where, row in iter_located_rows(report.files):
            report.rows += 1
            if isinstance(row, RowProblem):
                report.problems.append(str(row))
                continue
            problem = _refusal(row, ctx, vocab_size)
            if problem is not None:
                report.too_long += row.n_tokens > ctx
                report.problems.append(f"{where}: {problem}")
                continue
            if row.supervised == 0:
                report.unsupervised += 1
                continue
            samples.append(row)
    except ShardError as exc:
        raise DataError(str(exc)) from None
    report.trajectories = len({s.trajectory_id for s in samples})
    return samples, report


def trajectory_totals(samples: list[ShardRow]) -> list[int]:
    """For each sample, the supervised count of its whole trajectory: the sum over every loaded
    sample with the same ``trajectory_id`` (a refused sample is not trained, so not counted)."""
    whole: dict[str, int] = {}
    for s in samples:
        whole[s.trajectory_id] = whole.get(s.trajectory_id, 0) + s.supervised
    return [whole[s.trajectory_id] for s in samples]


def _refusal(row: ShardRow, ctx: int, vocab_size: int | None) -> str | None:
    """Why the trainer cannot use a readable row, or None."""
    if row.n_tokens == 0:
        return "empty sample"
    if row.n_tokens > ctx:
        return f"{row.n_tokens} tokens is longer than --ctx {ctx}; refused (never cut)"
    if row.loss_mask.max() > 1:
        return "loss_mask holds values other than 0 and 1"
    if row.input_ids.min() < 0 or (vocab_size is not None and row.input_ids.max() >= vocab_size):
        return f"token id out of range [0, {vocab_size}) for this model"
    return None


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffled sample order of one epoch; a pure function of (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return [int(i) for i in rng.permutation(n)]


def plan_rows(samples: list[ShardRow], order: list[int], *, pack: bool, ctx: int) -> list[Row]:
    """Cut an order into rows: one sample each, or consecutive samples packed up to ``ctx`` tokens."""
    if not pack:
        return [(i,) for i in order]
    rows: list[Row] = []
    current: list[int] = []
    length = 0
    for i in order:
        n = samples[i].n_tokens
        if current and length + n > ctx:
            rows.append(tuple(current))
            current, length = [], 0
        current.append(i)
        length += n
    if current:
        rows.append(tuple(current))
    return rows


@dataclass(frozen=True)
class Layout:
    """How the rows of one optimizer step are spread over ranks and micro-batches."""

    world: int = 1
    grad_accum: int = 1
    rows_per_micro: int = 1

    @property
    def rows_per_step(self) -> int:
        return self.world * self.grad_accum * self.rows_per_micro

    def steps(self, n_rows: int) -> int:
        return math.ceil(n_rows / self.rows_per_step) if n_rows else 0

    def step_rows(self, rows: list[Row], step: int) -> list[Row]:
        """Every row of one global step (all ranks), wrapping around at the end of the epoch."""
        base = step * self.rows_per_step
        return [rows[(base + k) % len(rows)] for k in range(self.rows_per_step)]

    def micro_rows(self, rows: list[Row], step: int, rank: int) -> list[list[Row]]:
        """This rank's micro-batches of one step: ``grad_accum`` lists of ``rows_per_micro`` rows."""
        flat = self.step_rows(rows, step)
        per_rank = self.grad_accum * self.rows_per_micro
        mine = flat[rank * per_rank : (rank + 1) * per_rank]
        return [mine[m * self.rows_per_micro : (m + 1) * self.rows_per_micro] for m in range(self.grad_accum)]


@dataclass
class Batch:
    input_ids: torch.Tensor  # long [B, S]; also the targets (shifted inside the loss)
    loss_mask: torch.Tensor  # uint8 [B, S]; 1 = the token at this position is a supervised target
    segments: torch.Tensor  # long [B, S]; index of the sample in this micro-batch (one segment per sample)
    n_segments: int
    position_ids: torch.Tensor | None  # restarts at 0 for every packed trajectory
    docs: torch.Tensor | None  # long [B, S]: trajectory per position, -1 for padding; None = plain causal
    packed: bool
    tokens: int  # real (unpadded) tokens
    supervised: int
    supervised_per_segment: list[int]
    trajectory_supervised: list[int]  # per segment: its trajectory's whole supervised count (the loss's divisor)
    targets: torch.Tensor | None = None  # set with ``shifted``: the token predicted at each position
    shifted: bool = False  # loss_mask/targets already aligned with positions (sequence-parallel shards)
    real: torch.Tensor | None = None  # bool [B, S] of a shard: not padding (docs is None there); None = all real

    def to(self, device: torch.device | str) -> Batch:
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(
            move(self.input_ids), move(self.loss_mask), move(self.segments), self.n_segments, move(self.position_ids),
            move(self.docs), self.packed, self.tokens, self.supervised, self.supervised_per_segment, self.trajectory_supervised,
            move(self.targets), self.shifted, move(self.real),
        )  # fmt: skip


def collate(samples: list[ShardRow], rows: list[Row], pad_id: int = 0, totals: list[int] | None = None) -> Batch:
    """Pad rows to the longest; in a packed row, positions restart per sample and the first
    token of each sample is not a target (it would be predicted across the boundary).
    ``totals``: ``trajectory_totals(samples)``, computed here when not given."""
    totals = trajectory_totals(samples) if totals is None else totals
    whole: list[int] = []
    lengths = [sum(samples[i].n_tokens for i in row) for row in rows]
    width = max(lengths)
    b = len(rows)
    ids = np.full((b, width), pad_id, dtype=np.int64)
    mask = np.zeros((b, width), dtype=np.uint8)
    segments = np.zeros((b, width), dtype=np.int64)
    positions = np.zeros((b, width), dtype=np.int64)
    docs = np.full((b, width), -1, dtype=np.int64)
    per_segment: list[int] = []
    segment = 0
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            s = samples[i]
            n = s.n_tokens
            ids[r, at : at + n] = s.input_ids
            mask[r, at : at + n] = s.loss_mask
            mask[r, at] = 0
            segments[r, at : at + n] = segment
            positions[r, at : at + n] = np.arange(n)
            docs[r, at : at + n] = segment
            per_segment.append(s.supervised)
            whole.append(totals[i])
            segment += 1
            at += n
        positions[r, at:] = np.arange(width - at)  # padding: harmless positions, never attended by real tokens
    packed = any(len(row) > 1 for row in rows)
    padded = any(n < width for n in lengths)
    return Batch(
        input_ids=torch.from_numpy(ids),
        loss_mask=torch.from_numpy(mask),
        segments=torch.from_numpy(segments),
        n_segments=segment,
        position_ids=torch.from_numpy(positions) if packed or padded else None,
        docs=torch.from_numpy(docs) if packed or padded else None,
        packed=packed,
        tokens=sum(lengths),
        supervised=sum(per_segment),
        supervised_per_segment=per_segment,
        trajectory_supervised=whole,
    )


def shard_sequence(batch: Batch, sp: int, sp_rank: int) -> Batch:
    """This rank's contiguous ``1/sp`` of every row, for Ulysses sequence parallelism.

    Targets are shifted *before* cutting (the target of a shard's last position is the next
    shard's first token). Rows are right-padded to a multiple of ``sp``: padding is never a
    target, and causal attention keeps real tokens from seeing it, so no mask is needed (Ulysses
    discards masks). ``position_ids`` are the global positions; Ulysses gathers them back.
    """
    if batch.packed:
        raise ValueError("packed rows cannot be sharded for sequence parallelism with SDPA (masks are discarded)")
    b, s = batch.input_ids.shape
    width = math.ceil(s / sp) * sp
    pad = width - s
    pad_right = lambda t, n: torch.nn.functional.pad(t, (0, n), value=0)  # noqa: E731
    targets = pad_right(batch.input_ids[:, 1:], pad + 1)
    mask = pad_right(batch.loss_mask[:, 1:], pad + 1)
    per = width // sp
    part = slice(sp_rank * per, (sp_rank + 1) * per)
    # The routers' load-balancing statistics count real tokens only (the rows' padding and the
    # few tokens added here to make the width divide by sp), as in the unsharded run.
    real = batch.docs >= 0 if batch.docs is not None else torch.ones(b, s, dtype=torch.bool)
    return Batch(
        input_ids=pad_right(batch.input_ids, pad)[:, part].contiguous(),
        loss_mask=mask[:, part].contiguous(),
        segments=pad_right(batch.segments, pad)[:, part].contiguous(),
        n_segments=batch.n_segments,
        position_ids=torch.arange(width, dtype=torch.long).expand(b, width)[:, part].contiguous(),
        docs=None,
        packed=False,
        tokens=batch.tokens,
        supervised=batch.supervised,
        supervised_per_segment=batch.supervised_per_segment,
        trajectory_supervised=batch.trajectory_supervised,
        targets=targets[:, part].contiguous(),
        shifted=True,
        real=torch.nn.functional.pad(real, (0, pad), value=False)[:, part].contiguous(),
    )
