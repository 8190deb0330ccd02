"""Gated DeltaNet (linear attention) layers under sequence parallelism and packing.

transformers' ``GatedDeltaNet`` (Qwen3.5/3.6, Qwen3-Next) runs a short causal convolution and
the gated delta rule, a recurrence, over the whole sequence it is given. Two trainer settings
give it the wrong sequence:

* ``--sp N`` (Ulysses): each rank holds 1/N of the tokens. Run as is, every rank's layers would
  start their recurrent state and convolution window from zero in the middle of the row.
* ``--pack``: one row holds several trajectories. Run as is, the state and the window would
  carry over from one trajectory into the next (transformers' PyTorch path ignores ``cu_seqlens``).

``LinearAttentionSP`` replaces each such layer with the same computation, arranged for both:

1. the per-token projections (q, k, v, the output gate z, the step sizes a and b) on the rank's
   own tokens;
2. under ``--sp``, one all-to-all that turns ``[S/N tokens, all heads]`` into ``[S tokens, 1/N of
   the heads]``: the convolution is depthwise and the recurrence is per head, so a rank that holds
   every token of some heads computes them exactly as one process would;
3. the convolution and the gated delta rule, once per trajectory of a packed row (the window and
   the state start from zero at each boundary), else once over the row. Where the fast kernels
   run (``install(varlen_rule=True)``: flash-linear-attention on the GPU), a packed micro-batch
   is one call of the rule over all its trajectories laid end to end, with their boundaries as
   ``cu_seqlens``, and, with causal-conv1d too, one call of the convolution with ``seq_idx``:
   the form those kernels take for variable-length batches. transformers' PyTorch reference takes
   neither, so on the reference path the calls stay one per trajectory;
4. the inverse all-to-all back to ``[S/N tokens, all heads]``, then the gated norm and the output
   projection on the rank's own tokens.

Why heads and not a context-parallel scan passing the recurrent state from rank to rank: the
scan serialises the ranks (rank r waits for r-1's final state, and the backward the other way)
and needs the chunked rule split into an intra-chunk and a state-passing part, which neither
transformers' reference function nor the fused kernels expose; the head exchange reuses both
functions unchanged, costs two all-to-alls per layer like Ulysses' softmax attention, and is
exact. Its limit: the linear-attention key and value head counts must divide by N (Qwen3.6-35B-A3B
has 16 key and 32 value heads).

The wrapper adopts the wrapped layer's submodules and parameters under their own names, so the
state dict (checkpoints, the saved model) is unchanged, and ZeRO-3 gathers them as it did.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# A packed micro-batch's trajectories, per row: the lengths of its consecutive segments, summing to
# the row's width (right padding counts as one more segment). ``None``: every row is one sequence.
Segments = tuple[tuple[int, ...], ...]
SEGMENTS_KWARG = "linear_attention_segments"  # the forward kwarg that carries them down to the layers


class _AllToAll(torch.autograd.Function):
    """Dimension 0 of ``x`` (one slice per rank of ``group``) is exchanged: slice j goes to rank j,
    and slice j of the result came from rank j. The exchange is its own adjoint, so the backward
    is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()  # before empty_like, which would copy a permuted input's strides
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def seq_to_heads(x: torch.Tensor, sp: int, group: Any) -> torch.Tensor:
    """``[B, S/sp, sp, c]`` (the last two dims: destination rank, its channels) -> ``[B, S, c]``."""
    b, s, _, c = x.shape
    out = _AllToAll.apply(x.permute(2, 0, 1, 3), group)  # [sp: whose tokens, B, s, c]
    return out.permute(1, 0, 2, 3).reshape(b, sp * s, c)


def heads_to_seq(x: torch.Tensor, sp: int, group: Any) -> torch.Tensor:
    """``[B, S, c]`` (this rank's heads) -> ``[B, S/sp, sp, c]`` (every rank's heads of this rank's tokens)."""
    b, full, c = x.shape
    out = _AllToAll.apply(x.reshape(b, sp, full // sp, c).permute(1, 0, 2, 3), group)  # [sp: whose heads, B, s, c]
    return out.permute(1, 2, 0, 3)


@dataclass(frozen=True)
class _Projected:
    """A layer's per-token projections, by head: q, k ``[B, s, Hk, dk]``; v, z ``[B, s, Hv, dv]``; a, b ``[B, s, Hv]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    z: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


def is_gated_deltanet(module: nn.Module) -> bool:
    return type(module).__name__.endswith("GatedDeltaNet")


def check_heads(module: nn.Module, sp: int) -> str | None:
    """Why ``module``'s heads cannot be split over ``sp`` ranks, or None."""
    nk, nv = module.num_k_heads, module.num_v_heads
    if nk % sp or nv % sp:
        return (
            f"{type(module).__name__} has {nk} key and {nv} value heads of linear attention; sequence parallelism "
            f"splits them over the --sp {sp} ranks, so both must divide by it"
        )
    return None


class LinearAttentionSP(nn.Module):
    """One Gated DeltaNet layer computed by head shards (``sp`` > 1) and per packed trajectory.
    ``group``: the ranks sharing each row (``None`` with ``sp`` 1, packing only)."""

    def __init__(self, layer: nn.Module, *, sp: int = 1, group: Any = None, varlen_rule: bool = False, varlen_conv: bool = False) -> None:
        super().__init__()
        why = check_heads(layer, sp)
        if why is not None:
            raise ValueError(why)
        if not (hasattr(layer, "in_proj_qkv") or hasattr(layer, "in_proj_qkvz")):
            raise ValueError(f"{type(layer).__name__}: an unknown Gated DeltaNet layout (no in_proj_qkv or in_proj_qkvz)")
        # The wrapped layer's children and own parameters become this module's, under the same
        # names: the state dict keys do not change. The layer itself stays out of the module tree
        # (a plain attribute); only its shape fields and Qwen3-Next's reordering method are used.
        object.__setattr__(self, "layer", layer)
        for name, child in layer.named_children():
            self.add_module(name, child)
        for name, param in layer.named_parameters(recurse=False):
            self.register_parameter(name, param)
        self.sp, self.group = sp, group
        # The kernels take packed trajectories in one call (cu_seqlens, seq_idx): see the module's docstring.
        self.varlen_rule, self.varlen_conv = varlen_rule, varlen_conv
        self.nk, self.nv, self.dk, self.dv = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        self.activation = layer.activation
        self.layer_idx = layer.layer_idx
        # The functions transformers' own forward calls (they pick the fused kernels where present).
        modeling = sys.modules[type(layer).__module__]
        self._conv: Callable[..., torch.Tensor] = modeling.causal_conv1d_fn
        self._rule: Callable[..., tuple[torch.Tensor, Any]] = modeling.torch_chunk_gated_delta_rule

    def forward(
        self, hidden_states: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        if cache is not None:
            raise ValueError("LinearAttentionSP is for training: no cache")
        segments: Segments | None = kwargs.get(SEGMENTS_KWARG)
        if attention_mask is not None and attention_mask.dim() == 2:  # padding carries nothing into the state
            hidden_states = hidden_states * attention_mask[:, :, None].to(hidden_states.dtype)
        p = self._project(hidden_states)
        b, s = hidden_states.shape[:2]
        nk, nv = self.nk // self.sp, self.nv // self.sp  # the heads this rank runs the recurrence of
        # Every per-head quantity in one exchange: [B, s, sp, (q k v a b) of the sp-th head group].
        parts = (p.q, p.k, p.v, p.a[..., None], p.b[..., None])
        packed = torch.cat([t.reshape(b, s, self.sp, -1) for t in parts], dim=-1)
        full = seq_to_heads(packed, self.sp, self.group) if self.sp > 1 else packed.reshape(b, s, -1)
        sizes = [nk * self.dk, nk * self.dk, nv * self.dv, nv, nv]
        mixed, a, beta_in = full.split([sum(sizes[:3]), nv, nv], dim=-1)
        out = self._mix(mixed, a, beta_in, nk, nv, segments)  # [B, S, nv * dv]
        if self.sp > 1:
            out = heads_to_seq(out, self.sp, self.group)  # [B, s, sp, nv * dv]: head groups in rank order
        out = out.reshape(-1, self.dv)
        out = self.norm(out, p.z.reshape(-1, self.dv))
        return self.out_proj(out.reshape(b, s, -1))

    def _project(self, hidden: torch.Tensor) -> _Projected:
        b, s = hidden.shape[:2]
        if hasattr(self, "in_proj_qkvz"):  # Qwen3-Next: heads interleaved by key-head group
            q, k, v, z, beta_in, a = self.layer.fix_query_key_value_ordering(self.in_proj_qkvz(hidden), self.in_proj_ba(hidden))
        else:  # Qwen3.5/3.6
            q, k, v = self.in_proj_qkv(hidden).split([self.nk * self.dk, self.nk * self.dk, self.nv * self.dv], dim=-1)
            z, beta_in, a = self.in_proj_z(hidden), self.in_proj_b(hidden), self.in_proj_a(hidden)
        shape = lambda t, n, d: t.reshape(b, s, n, d)  # noqa: E731
        return _Projected(
            shape(q, self.nk, self.dk), shape(k, self.nk, self.dk), shape(v, self.nv, self.dv), shape(z, self.nv, self.dv),
            a.reshape(b, s, self.nv), beta_in.reshape(b, s, self.nv),
        )  # fmt: skip

    def _channels(self, nk: int, nv: int) -> torch.Tensor:
        """This rank's channels of the depthwise convolution: its q, k and v heads."""
        r = dist.get_rank(self.group) if self.sp > 1 else 0
        key_dim = self.nk * self.dk
        q = torch.arange(r * nk * self.dk, (r + 1) * nk * self.dk)
        v = torch.arange(r * nv * self.dv, (r + 1) * nv * self.dv) + 2 * key_dim
        return torch.cat([q, q + key_dim, v]).to(self.conv1d.weight.device)

    def _mix(
        self, mixed: torch.Tensor, a: torch.Tensor, beta_in: torch.Tensor, nk: int, nv: int, segments: Segments | None
    ) -> torch.Tensor:
        """The convolution and the gated delta rule of this rank's heads over whole rows."""
        r = dist.get_rank(self.group) if self.sp > 1 else 0
        heads = slice(r * nv, (r + 1) * nv)
        weight = self.conv1d.weight.squeeze(1)
        if self.sp > 1:
            weight = weight[self._channels(nk, nv)]
        bias = self.conv1d.bias
        beta = beta_in.sigmoid()
        g = -self.A_log[heads].float().exp() * F.softplus(a.float() + self.dt_bias[heads])
        b, full = mixed.shape[:2]
        if segments is None:
            return self._run(mixed, g, beta, weight, bias, nk, nv)
        if len(segments) != b or any(sum(row) != full for row in segments):
            raise ValueError(f"packed segments {segments} do not cover the micro-batch's {b} rows of {full} tokens")
        if self.varlen_rule:
            return self._run_varlen(mixed, g, beta, weight, bias, nk, nv, segments)
        rows = []
        for i, lengths in enumerate(segments):
            pieces, at = [], 0
            for n in lengths:
                cut = slice(at, at + n)
                pieces.append(self._run(mixed[i : i + 1, cut], g[i : i + 1, cut], beta[i : i + 1, cut], weight, bias, nk, nv))
                at += n
            rows.append(torch.cat(pieces, dim=1))
        return torch.cat(rows, dim=0)

    def _run(
        self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, weight: torch.Tensor, bias: Any, nk: int, nv: int
    ) -> torch.Tensor:
        """One sequence (or a batch of whole rows): window and state start from zero."""
        b, s = mixed.shape[:2]
        x = self._conv(mixed.transpose(1, 2), weight, bias, activation=self.activation).transpose(1, 2)
        q, k, v = x.split([nk * self.dk, nk * self.dk, nv * self.dv], dim=-1)
        out, _ = self._rule(
            q.reshape(b, s, nk, self.dk), k.reshape(b, s, nk, self.dk), v.reshape(b, s, nv, self.dv), g=g, beta=beta,
            initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return out.reshape(b, s, nv * self.dv)

    def _run_varlen(
        self,
        mixed: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        weight: torch.Tensor,
        bias: Any,
        nk: int,
        nv: int,
        segments: Segments,
    ) -> torch.Tensor:
        """The micro-batch's rows laid end to end as one sequence of trajectories, each starting
        from a zero window and state at its boundary: one call of the rule with ``cu_seqlens``, and
        of the convolution with ``seq_idx`` where causal-conv1d runs it (else once per trajectory)."""
        b, full = mixed.shape[:2]
        lengths = [n for row in segments for n in row]
        flat = mixed.reshape(1, b * full, -1)
        if self.varlen_conv:
            seq_idx = torch.repeat_interleave(
                torch.arange(len(lengths), device=flat.device, dtype=torch.int32), torch.tensor(lengths, device=flat.device)
            )
            x = self._conv(flat.transpose(1, 2), weight, bias, activation=self.activation, seq_idx=seq_idx[None]).transpose(1, 2)
        else:
            pieces = flat.split(lengths, dim=1)
            x = torch.cat([self._conv(p.transpose(1, 2), weight, bias, activation=self.activation).transpose(1, 2) for p in pieces], dim=1)
        q, k, v = x.split([nk * self.dk, nk * self.dk, nv * self.dv], dim=-1)
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        out, _ = self._rule(
            q.reshape(1, b * full, nk, self.dk), k.reshape(1, b * full, nk, self.dk), v.reshape(1, b * full, nv, self.dv),
            g=g.reshape(1, b * full, -1), beta=beta.reshape(1, b * full, -1), initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(bounds, device=flat.device, dtype=torch.long),
        )  # fmt: skip
        return out.reshape(b, full, nv * self.dv)


def install(model: nn.Module, *, sp: int = 1, group: Any = None, varlen_rule: bool = False, varlen_conv: bool = False) -> int:
    """Replace every Gated DeltaNet layer of ``model`` with ``LinearAttentionSP``; returns how many.
    Raises ``ValueError`` when a layer's heads do not divide by ``sp``. ``varlen_rule`` /
    ``varlen_conv``: flash-linear-attention / causal-conv1d run this model's layers (on the GPU),
    so packed trajectories go to them in one call each."""
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children() if is_gated_deltanet(child)]
    for _, _, child in found:
        why = check_heads(child, sp)
        if why is not None:
            raise ValueError(why)
    for parent, name, child in found:
        setattr(parent, name, LinearAttentionSP(child, sp=sp, group=group, varlen_rule=varlen_rule, varlen_conv=varlen_conv))
    return len(found)


def packed_segments(docs: torch.Tensor) -> Segments:
    """The segment lengths of each row of a packed micro-batch, from its per-position trajectory
    index (``-1`` for padding): a new segment wherever the index changes."""
    rows = []
    for row in docs.tolist():
        lengths: list[int] = []
        previous = None
        for d in row:
            if d != previous:
                lengths.append(0)
                previous = d
            lengths[-1] += 1
        rows.append(tuple(lengths))
    return tuple(rows)


def head_counts(config: Any) -> Sequence[int]:
    """The linear-attention key and value head counts of a config (empty when it has none)."""
    text = getattr(config, "text_config", None) or config
    nk, nv = getattr(text, "linear_num_key_heads", None), getattr(text, "linear_num_value_heads", None)
    return [n for n in (nk, nv) if n]
