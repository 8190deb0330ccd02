"""The ROSS objective without materialising full logits.

    L = - 1/|B| Σ_τ ( Σ_t m_t log π(z_t | z_<t) ) / Σ_t m_t   (``norm="trajectory"``, ROSS formula 4)
    L = - Σ_τ Σ_t m_t log π(z_t | z_<t) / Σ_τ Σ_t m_t            (``norm="token"``)

A trajectory is the normalisation unit, not a sample: a trajectory compiled into several
samples (a context reset such as a Codex compaction or an ATIF summarisation; every
``--per-turn`` sample) has each sample's tokens divided by the trajectory's *whole* supervised
count ``W_τ`` (over all its samples), and counts in a step's ``|B|`` for the fraction
``n_s / W_τ`` of its supervised targets that the step holds. A trajectory whose samples fall in
different micro-batches, ranks or steps therefore still weighs one in an epoch, and a 12-token
final turn weighs 12/80 of its trajectory, not as much as the 68-token turn before it.

``m_t`` (the shard's ``loss_mask``) marks *targets*: token ``t`` is supervised when ``m_t = 1``,
and it is predicted from the hidden state at position ``t - 1``. Every token stays in the
input as context whatever its mask; the mask only chooses which targets are scored, and the
targets at unsupervised positions are never read.

Memory: at 65,536 tokens and a 248,320-token vocabulary the full fp32 logits are 65 GB.
So we gather the hidden states of the supervised positions only, and run the LM head plus
cross-entropy over them in chunks, each under ``torch.utils.checkpoint``: the forward keeps
one chunk's logits at a time and frees them, the backward recomputes them chunk by chunk.
Peak loss memory is about ``3 x chunk x vocab x 4`` bytes whatever the sequence length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LossNorm = Literal["trajectory", "token"]
NORMS: tuple[str, ...] = ("trajectory", "token")


def supervised_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, S-1]``: position ``p`` is scored when its *next* token is supervised.

    The first token of a row has no context and is never a target."""
    return loss_mask[:, 1:].bool()


def select_supervised(
    hidden: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, segments: torch.Tensor, shifted: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states ``[N, H]``, target ids ``[N]`` and trajectory index ``[N]`` of the N scored positions.

    ``shifted``: ``targets``/``loss_mask`` are already aligned with the hidden states (entry ``p``
    is the token predicted at ``p``), as they must be when the sequence is split across ranks
    (sequence parallelism): the target of a shard's last position lives in the next shard."""
    if shifted:
        sel = loss_mask.bool()
        return hidden[sel], targets[sel], segments[sel]
    sel = supervised_positions(loss_mask)
    return hidden[:, :-1][sel], targets[:, 1:][sel], segments[:, 1:][sel]


def _chunk_nll(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # fp32 for the softmax even when the head runs in bf16: log-probabilities over 248k classes
    # lose too much in bf16.
    logits = head(hidden).float()
    return F.cross_entropy(logits, targets, reduction="none")


def chunked_nll(
    hidden: torch.Tensor, targets: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], chunk: int, min_chunks: int = 0
) -> torch.Tensor:
    """Negative log-likelihood ``[N]`` of ``targets`` under ``head(hidden)``, ``chunk`` rows at a time.

    ``min_chunks`` pads with empty chunks: under ZeRO-3 every call of the head gathers its
    weight with a collective, so all ranks must call it equally often or they deadlock.
    """
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    n = hidden.shape[0]
    starts = list(range(0, n, chunk))
    starts += [n] * max(0, min_chunks - len(starts))
    pieces = [
        checkpoint(_chunk_nll, head, hidden[start : start + chunk], targets[start : start + chunk], use_reentrant=False) for start in starts
    ]
    if not pieces:
        return hidden.new_zeros(0, dtype=torch.float32)
    return torch.cat(pieces)


def reduce_nll(
    nll: torch.Tensor, segments: torch.Tensor, n_segments: int, norm: LossNorm, counts: torch.Tensor | None = None
) -> tuple[torch.Tensor, int, float]:
    """Sum of the loss contributions in this micro-batch, before the step's denominator.

    Returns ``(contribution, supervised_tokens, trajectories)``. Under ``trajectory`` each
    segment adds its NLL sum divided by ``counts`` (its trajectory's whole supervised count:
    the trajectory's mean when the segment holds all of it), and ``trajectories`` is the
    fraction of trajectories these targets make (``Σ n_seg / counts``); a segment without a
    supervised target adds nothing (no 0/0 = NaN). Under ``token`` every supervised token adds
    its NLL. ``counts`` defaults to the segments' own counts here (each segment a whole trajectory).
    """
    if norm == "token":
        return nll.sum(), int(nll.numel()), 0.0
    local = torch.bincount(segments, minlength=n_segments)
    if counts is None:
        counts = local
    sums = nll.new_zeros(n_segments).index_add(0, segments, nll)
    present = (local > 0) & (counts > 0)
    whole = counts[present].to(sums.dtype)
    contribution = (sums[present] / whole).sum()
    return contribution, int(nll.numel()), float((local[present].to(torch.float64) / whole.to(torch.float64)).sum())


def masked_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    loss_mask: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    norm: LossNorm,
    segments: torch.Tensor | None = None,
    n_segments: int | None = None,
    denominator: float | None = None,
    chunk: int = 1024,
    min_chunks: int = 0,
    shifted: bool = False,
    segment_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ROSS loss of a micro-batch from the model body's hidden states ``[B, S, H]``.

    ``segments`` ``[B, S]`` numbers the trajectories of the micro-batch (a packed row holds
    several); by default each row is one whole trajectory. ``denominator`` is the step's normaliser
    (trajectories with supervision, in fractions of one, or supervised tokens, over the whole optimizer step:
    all micro-batches and all ranks), so that summing micro-batch losses gives exactly the
    step's loss under gradient accumulation and data parallelism. By default it is this
    micro-batch's own count. ``segment_counts`` ``[n_segments]``: each segment's trajectory's whole
    supervised count (see ``reduce_nll``); ``shifted``: see ``select_supervised`` (sequence-parallel shards).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, not {norm!r}")
    if segments is None:
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        segments = rows[:, None].expand(loss_mask.shape)
        n_segments = hidden.shape[0]
    assert n_segments is not None
    h, t, seg = select_supervised(hidden, targets, loss_mask, segments, shifted)
    nll = chunked_nll(h, t, head, chunk, min_chunks)
    contribution, tokens, trajectories = reduce_nll(nll, seg, n_segments, norm, segment_counts)
    if denominator is None:
        denominator = float(tokens if norm == "token" else trajectories)
    # A micro-batch without any supervised token still returns a loss connected to the
    # graph (zero-valued), so backward runs and data-parallel ranks stay in step. The
    # denominator may be below one (a step holding parts of trajectories only); it is zero
    # only when nothing is supervised, and then so is the contribution.
    zero = hidden.sum() * 0.0
    return contribution / (denominator if denominator > 0 else 1.0) + zero


def step_denominator(supervised_counts: list[int], norm: LossNorm, trajectory_counts: list[int] | None = None) -> float:
    """The normaliser of an optimizer step from the supervised-target counts of its samples.

    ``trajectory_counts[k]``: the whole supervised count of sample ``k``'s trajectory (by
    default each sample is a whole trajectory). Under ``trajectory`` a sample counts for the
    fraction ``n / W`` of its trajectory, so a trajectory counts once over all its samples."""
    if norm == "token":
        return float(sum(supervised_counts))
    whole = supervised_counts if trajectory_counts is None else trajectory_counts
    return sum(n / w for n, w in zip(supervised_counts, whole, strict=True) if n > 0)


class RouterBalance:
    """The routers' load-balancing loss of one micro-batch, accumulated layer by layer.

    The loss is transformers' ``load_balancing_loss_func`` (Switch Transformer eq. 4-6, as
    Qwen3-MoE, Qwen3-Next and Qwen3.5/3.6-MoE compute it when ``output_router_logits`` is on):

        aux = E * Σ_e f_e * P_e,   f_e = Σ_{l,t} [e ∈ topk(p_{l,t})] / R,   P_e = Σ_{l,t} p_{l,t,e} / R

    over every MoE layer ``l`` and every real token ``t`` of the micro-batch (``R`` = layers x
    tokens; ``p`` = the router's softmax). Padding is left out, as transformers leaves out what
    its ``attention_mask`` zeroes; every other token counts whether it is a supervised target or
    not, because the router routes context tokens too. ``f`` carries no gradient (top-k counts).

    Why not collect the routers' logits and compute it after the forward, as transformers does:
    at 65,536 tokens x 256 experts x 40 layers those logits and their softmax hold ~4 GB until
    the backward pass. Here each router call reduces its logits to three small sums inside the
    decoder layer, so under activation checkpointing the softmax is recomputed with the layer,
    and the loss costs ``O(layers x experts)`` memory whatever the length.
    """

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.recording = False
        self.mask: torch.Tensor | None = None  # [B*S] float, 1 = a real token
        self.counts: torch.Tensor | None = None  # [E] top-k assignments (no gradient)
        self.probs: torch.Tensor | None = None  # [E] summed router probabilities (with gradient)
        self.rows: torch.Tensor | None = None  # scalar: layers x real tokens

    def start(self, token_mask: torch.Tensor) -> None:
        self.mask = token_mask.reshape(-1).float()
        self.counts = self.probs = self.rows = None
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    def add(self, logits: torch.Tensor) -> None:
        """One router call: ``logits`` ``[tokens, experts]`` (the router's first output)."""
        if self.mask is None:
            return
        # The same work runs when a checkpointed layer is recomputed in the backward pass (its
        # saved tensors must line up with the first forward's); only the first forward records.
        mask = self.mask.to(logits.device)
        probs = torch.softmax(logits.float(), dim=-1)
        chosen = torch.topk(probs.detach(), self.top_k, dim=-1).indices
        counts = torch.zeros(probs.shape[-1], dtype=torch.float32, device=probs.device)
        counts.scatter_add_(0, chosen.reshape(-1), mask.repeat_interleave(self.top_k))
        prob_sum = (probs * mask[:, None]).sum(0)
        if not self.recording:
            return
        rows = mask.sum()
        self.counts = counts if self.counts is None else self.counts + counts
        self.probs = prob_sum if self.probs is None else self.probs + prob_sum
        self.rows = rows if self.rows is None else self.rows + rows

    def loss(self, group: object | None = None) -> torch.Tensor | None:
        """The micro-batch's aux loss (``None`` if no router ran).

        ``group``: a sequence-parallel process group whose ranks hold shards of the same rows:
        the sums are then the group's (all-reduced), so every rank gets the whole rows' value,
        while the gradient flows through this rank's own probabilities only (the caller weighs
        the value by 1/sp so that the group's losses add up to one aux)."""
        if self.counts is None or self.probs is None or self.rows is None:
            return None
        counts, probs, rows = self.counts, self.probs, self.rows
        if group is not None:
            import torch.distributed as tdist

            whole = torch.cat([counts, probs.detach(), rows.reshape(1)])
            tdist.all_reduce(whole, group=group)  # type: ignore[arg-type]
            e = counts.shape[0]
            counts, rows = whole[:e], whole[-1]
            probs = probs + (whole[e : 2 * e] - probs.detach())
        rows = rows.clamp(min=1.0)
        return (counts / rows * (probs / rows)).sum() * counts.shape[0]
