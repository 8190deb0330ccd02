"""``relearn train --plan``: the memory one GPU needs for a training configuration, by part, before
a launch; and, for a model and a length, a configuration that fits a given GPU.

The formula (``docs/training.md``, "Will it fit") has three groups of parts, in bytes per GPU:

* model states, from the exact parameter count (the model built on the ``meta`` device, so no
  weights are read or allocated): parameters, gradients and AdamW's states, divided over the
  data-parallel ranks as the ZeRO stage says, or moved to host memory by ``--offload``;
* activations of one micro-batch of ``t = rows x ctx / sp`` tokens: the input of every decoder
  layer kept by gradient checkpointing, the recompute of the largest layer in the backward pass
  (its saved tensors and the gradients alive during its backward: per-token coefficients of each
  block, measured on transformers' own layers, see ``LAYER_COEFFICIENTS``), and the chunked loss (``3 x chunk x vocab x 4`` bytes);
* under ZeRO, the communication buffers and the whole layer that ZeRO-3 gathers (its weights and
  their unreduced gradient).

The parts do not all live at once: the peak is the largest of three phases (the loss's backward,
a layer's backward, the optimizer step), each the sum of the parts alive then. Checked on CPU
against the trainer's measured peaks (``bench/bench_train_plan.py``, ``tests/test_train_plan.py``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

GIB = 2**30
# Usable memory of the cards the plan is asked about (what nvidia-smi reports as the total).
CAPACITIES: dict[str, int] = {"80 GB (H100)": 81_559 * 2**20, "141 GB (H200)": 143_771 * 2**20}
# On a GPU, outside the tensors: the CUDA context, cuBLAS/NCCL workspaces and allocator slack.
# An assumption (no GPU measured it here), added to every GPU plan; none on CPU.
GPU_RESERVE = 2 * GIB
GPU_SLACK = 0.05  # fragmentation of the caching allocator, as a share of the rest
# DeepSpeed's defaults that set buffer sizes (elements): reduce_bucket_size, stage3_prefetch_bucket_size.
REDUCE_BUCKET = 500_000_000
PREFETCH_BUCKET = 50_000_000

# Per-token elements each block keeps for its backward pass (autograd's saved tensors), measured
# on transformers 5.25's Qwen3 / Qwen3-MoE / Qwen3.5-MoE layers with hooks on the saved tensors and
# fitted to the dimensions (within 3% of the measured saved bytes of every shape below):
#   norms (two RMSNorms and the residuals)      5 H
#   full attention (sdpa, causal, no mask)      5.5 q + 5 kv   (q = heads x head_dim; kv likewise)
#     with an output gate (Qwen3.5/3.6)         + 4 q
#   dense MLP (SwiGLU)                          4 I
#   MoE, per token                              k (2 H + 4 I_e) + 4 E + H / 2   (+ 4 I_s + H shared expert)
#   Gated DeltaNet, transformers' reference     6 nk dk + nv (12 dk + 12 dv + 320), in fp32
#   Gated DeltaNet, fused kernels (fla)         2 conv + 3 nv dv + nv dk dv / 64: an estimate, not measured
# A checkpointed layer's backward holds more than what it saved: it recomputes the layer (all of the
# saved tensors come back), then runs the backward of its last block, the MLP or MoE, first, while
# the attention's saved tensors are still alive, and that block's gradients sit on top of them:
#   dense MLP (SwiGLU) backward                 2 I - H / 2   (the gradients of two I-wide tensors)
#   MoE backward                                3 k H         (each routed copy's gradients)
# plus the gradient of the layer's output (H) that started its backward. These were measured, not
# fitted to the end-to-end runs: ``python bench/bench_train_plan.py --layers`` runs one checkpointed
# layer's forward and backward at 2,048 and 4,096 tokens under a ``TorchDispatchMode`` that counts
# the bytes of every live tensor storage, and takes the peak above the level where the layer's
# backward started; the slope between the two lengths is the per-token figure (what does not grow
# with the tokens is the layer's weight gradients, counted apart). Varying one dimension at a time
# (H, I, q, kv; k, I_e, I_s, E, nv, nk, dv) around Qwen3 H 256 / I 1,024 and Qwen3.5-MoE H 256 / 8
# experts top-2 / 8 DeltaNet value heads gave the formulas above; saved + backward is within 7% of
# the measured peak on each (``--layers`` prints both).
LAYER_COEFFICIENTS = "see the comment above: relearn/train/plan.py"

LinearKernels = Literal["reference", "fla"]


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model: dimensions, and parameter counts from the model itself."""

    name: str
    source: str
    vocab: int
    hidden: int
    layers: int
    layer_kinds: tuple[str, ...]  # "full" or "linear" per decoder layer
    heads: int
    kv_heads: int
    head_dim: int
    gated_attention: bool
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    intermediate: int  # dense MLP (0: none)
    experts: int  # 0: dense
    top_k: int
    expert_intermediate: int
    shared_intermediate: int
    sparse_layers: tuple[bool, ...]
    parameters: int
    embedding: int
    head: int  # 0 when tied to the embedding
    largest_layer: int

    @property
    def hybrid(self) -> bool:
        return "linear" in self.layer_kinds


def _text(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def shape_of(config: Any, name: str, source: str) -> Shape:
    """A ``Shape`` from a transformers config: the causal LM built on the meta device (no memory,
    no weights) gives the exact parameter counts of any architecture transformers knows."""
    import torch
    from transformers import AutoModelForCausalLM

    text = _text(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text)
    layers = model.get_decoder().layers
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    embedding = model.get_input_embeddings().weight.numel()
    head_module = model.get_output_embeddings()
    tied = head_module.weight is model.get_input_embeddings().weight
    n = text.num_hidden_layers
    kinds = tuple("linear" if t == "linear_attention" else "full" for t in (getattr(text, "layer_types", None) or ["full_attention"] * n))
    experts = int(getattr(text, "num_experts", 0) or 0)
    mlp_only = set(getattr(text, "mlp_only_layers", None) or [])
    step = int(getattr(text, "decoder_sparse_step", 1) or 1)
    sparse = tuple(experts > 0 and i not in mlp_only and (i + 1) % step == 0 for i in range(n))
    heads = text.num_attention_heads
    return Shape(
        name=name, source=source, vocab=text.vocab_size, hidden=text.hidden_size, layers=n, layer_kinds=kinds, heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", heads), head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        gated_attention=text.model_type.startswith(("qwen3_5", "qwen3_next")),
        linear_key_heads=int(getattr(text, "linear_num_key_heads", 0) or 0), linear_value_heads=int(getattr(text, "linear_num_value_heads", 0) or 0),
        linear_key_dim=int(getattr(text, "linear_key_head_dim", 0) or 0), linear_value_dim=int(getattr(text, "linear_value_head_dim", 0) or 0),
        intermediate=int(getattr(text, "intermediate_size", 0) or 0), experts=experts, top_k=int(getattr(text, "num_experts_per_tok", 0) or 0),
        expert_intermediate=int(getattr(text, "moe_intermediate_size", 0) or 0),
        shared_intermediate=int(getattr(text, "shared_expert_intermediate_size", 0) or 0), sparse_layers=sparse,
        parameters=sum(p.numel() for p in model.parameters()), embedding=embedding, head=0 if tied else head_module.weight.numel(),
        largest_layer=max(per_layer),
    )  # fmt: skip


# Named shapes: the architectures' published figures, so a plan needs no download.
QWEN36_SOURCE = (
    "Qwen3.6-35B-A3B = Qwen3.5-35B-A3B's architecture (transformers model doc qwen3_5_moe.md: 'Qwen3.6 checkpoints share the "
    "same architecture and model_type as Qwen3.5'); figures from transformers' Qwen3_5MoeTextConfig defaults (checkpoint "
    "Qwen/Qwen3.5-35B-A3B) and the model card: 40 layers, hidden 2048, 3 Gated DeltaNet : 1 gated attention, 16 q / 2 kv heads "
    "of 256, DeltaNet 16 key / 32 value heads of 128, 256 experts top-8 of 512 + 1 shared of 512, vocab 248,320, untied"
)
NAMED_SHAPES: dict[str, tuple[str, dict[str, Any], str]] = {
    "qwen3.6-35b-a3b": (
        "qwen3_5_moe_text",
        dict(
            vocab_size=248_320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
            linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
            shared_expert_intermediate_size=512, full_attention_interval=4, tie_word_embeddings=False, max_position_embeddings=262_144,
        ),
        QWEN36_SOURCE,
    ),
    "qwen3-30b-a3b": (
        "qwen3_moe",
        dict(
            vocab_size=151_936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            intermediate_size=6144, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
            tie_word_embeddings=False, max_position_embeddings=40_960,
        ),
        "Qwen/Qwen3-30B-A3B config.json (Qwen3MoeForCausalLM): 48 layers, hidden 2048, 32 q / 4 kv heads of 128, 128 experts "
        "top-8 of 768, vocab 151,936",
    ),
}  # fmt: skip


def named_shape(name: str) -> Shape:
    if name not in NAMED_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; named shapes: {', '.join(NAMED_SHAPES)}")
    from transformers import AutoConfig

    model_type, kwargs, source = NAMED_SHAPES[name]
    return shape_of(AutoConfig.for_model(model_type, **kwargs), name, source)


@dataclass(frozen=True)
class Setting:
    """The training configuration the plan is for (``relearn train``'s flags, and the launch's size)."""

    ctx: int
    gpus_per_node: int = 1
    nodes: int = 1
    zero: int = 0
    sp: int = 1
    offload: bool = False
    offload_activations: bool = False
    pack: bool = False
    gradient_checkpointing: bool = True
    bf16: bool = False
    chunk: int = 1024
    rows: int = 1  # trajectories (or packs) per micro-batch per rank
    supervised: float = 1.0  # share of a row's tokens that are supervised targets (1.0: the worst case)
    device: Literal["cuda", "cpu"] = "cuda"
    linear_kernels: LinearKernels = "reference"

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def deepspeed(self) -> bool:
        return self.zero > 0 or self.offload or self.world > 1 or self.sp > 1

    @property
    def dp(self) -> int:
        return max(1, self.world // self.sp)


@dataclass
class Part:
    name: str
    bytes: int
    note: str = ""


@dataclass
class Plan:
    shape: Shape
    setting: Setting
    parts: list[Part]
    phases: dict[str, int]  # phase -> bytes alive then (parts, reserve included)
    peak: int
    peak_phase: str
    host_per_node: int  # host memory the offloaded states and activations take, per node
    refused: list[str] = field(default_factory=list)  # what relearn refuses for this setting today
    needs: list[str] = field(default_factory=list)  # what the setting asks of the launch

    def fits(self) -> dict[str, bool]:
        return {name: not self.refused and self.peak <= capacity for name, capacity in CAPACITIES.items()}

    def part(self, name: str) -> int:
        return next((p.bytes for p in self.parts if p.name == name), 0)


def layer_elements(shape: Shape, kind: str, sparse: bool, kernels: LinearKernels, sp: int = 1) -> tuple[float, float]:
    """Per-token saved elements of one decoder layer: (in the compute dtype, in fp32). Per token
    of the rank: under ``--sp`` a linear-attention layer runs ``1/sp`` of its heads over ``sp``
    times the tokens (``relearn.train.linear_sp``), the same elements per local token."""
    h = shape.hidden
    compute = 5.0 * h
    fp32 = 0.0
    if kind == "full":
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        compute += 5.5 * q + 5 * kv + (4 * q if shape.gated_attention else 0)
    else:
        nk, nv, dk, dv = shape.linear_key_heads, shape.linear_value_heads, shape.linear_key_dim, shape.linear_value_dim
        if kernels == "reference":  # torch_chunk_gated_delta_rule runs in fp32 whatever the autocast
            fp32 += 6 * nk * dk + nv * (12 * dk + 12 * dv + 320)
        else:
            conv = 2 * nk * dk + nv * dv
            compute += 2 * conv + 3 * nv * dv + nv * dk * dv / 64
        if sp > 1:
            # The head exchange's buffers: the per-head inputs (q, k, v, a, b) sent, and the output
            # received back before the norm; an estimate from the tensors' sizes, not measured.
            compute += 2 * nk * dk + 2 * nv * dv + 2 * nv
    if sparse:
        compute += shape.top_k * (2 * h + 4 * shape.expert_intermediate) + 4 * shape.experts + h / 2
        if shape.shared_intermediate:
            compute += 4 * shape.shared_intermediate + h
    else:
        compute += 4 * shape.intermediate
    return compute, fp32


def backward_elements(shape: Shape, sparse: bool) -> float:
    """Per-token elements (compute dtype) that a checkpointed layer's backward holds on top of its
    recomputed saved tensors: its MLP's (or MoE's) gradients, run first, and the output's gradient."""
    h = shape.hidden
    block = 3 * shape.top_k * h if sparse else max(0.0, 2 * shape.intermediate - h / 2)
    return block + h


def refusals(shape: Shape, s: Setting) -> list[str]:
    """What ``relearn.train.options.check_options`` refuses for this shape today, in its words."""
    found = []
    if s.sp > 1 and shape.hybrid and (shape.linear_key_heads % s.sp or shape.linear_value_heads % s.sp):
        found.append(
            f"--sp {s.sp}: {shape.linear_key_heads} key / {shape.linear_value_heads} value heads of linear attention do not divide by it"
        )
    if s.sp > 1 and s.pack:
        found.append("--sp > 1 with --pack (Ulysses discards attention masks)")
    if s.offload and s.zero == 0:
        found.append("--offload needs --zero 2 or 3")
    if s.world % s.sp:
        found.append(f"--sp {s.sp} does not divide {s.world} processes")
    if s.sp > 1 and (shape.heads % s.sp or (shape.kv_heads % s.sp and s.sp % shape.kv_heads)):
        found.append(f"--sp {s.sp}: {shape.heads} query / {shape.kv_heads} key-value heads do not divide by it")
    return found


def estimate(shape: Shape, s: Setting) -> Plan:
    """The memory per GPU (or per CPU process) of one optimizer step in the steady state."""
    p = shape.parameters
    # ZeRO partitions over every rank, the sequence-parallel ones included (DeepSpeed's
    # seq_data_parallel_group: sp x data-parallel), not over the data-parallel groups alone.
    dp = s.world
    ds = s.deepspeed
    ds_bf16 = ds and s.bf16
    wb = 2 if ds_bf16 else 4  # weights (and their gradients) on the device: DeepSpeed bf16, else fp32
    ab = 2 if s.bf16 else 4  # activations inside a layer (autocast's matmul outputs are bf16)
    rb = 2 if ds_bf16 else 4  # the residual stream (fp32 under autocast over fp32 weights)
    host = 0

    # Model states.
    fp32_grads = 0
    if not ds:
        params, grads, optim = 4 * p, 4 * p, 8 * p
        grad_note, optim_note = "fp32, whole", "AdamW m, v in fp32"
    else:
        params = wb * p if s.zero < 3 else math.ceil(wb * p / dp)
        grads = math.ceil(wb * p / dp) if s.zero >= 2 else wb * p
        states = 12 if ds_bf16 else 8  # fp32 master + m + v, or m + v
        optim = math.ceil(states * p / dp) if (s.zero >= 2 or ds_bf16) else states * p
        # bf16: the optimizer step makes an fp32 copy of the gradient partition.
        fp32_grads = math.ceil(4 * p / dp) if ds_bf16 else 0
        grad_note = f"{'bf16' if ds_bf16 else 'fp32'}{f', 1/{dp}' if s.zero >= 2 else ''}"
        optim_note = f"{'fp32 master + m + v' if ds_bf16 else 'm + v'}{f', 1/{dp}' if s.zero >= 2 or ds_bf16 else ''}"
        if s.offload:
            host += optim + fp32_grads
            optim = fp32_grads = 0
            optim_note = "in host memory (--offload)"
            if s.zero == 3:
                host += params
                params = 0
    param_note = "fp32" if wb == 4 else "bf16"
    if ds and s.zero == 3:
        param_note += f", 1/{dp}" + ("; in host memory (--offload)" if s.offload else "")

    # Activations of one micro-batch.
    t = math.ceil(s.rows * s.ctx / s.sp)
    per_layer = [
        layer_elements(shape, k, sparse, s.linear_kernels, s.sp) for k, sparse in zip(shape.layer_kinds, shape.sparse_layers, strict=True)
    ]
    layer_bytes = [t * (c * ab + f * 4) for c, f in per_layer]
    # A layer's backward: its saved tensors recomputed, its MLP/MoE gradients, its output gradient.
    backward_bytes = [t * backward_elements(shape, sp) * ab for sp in shape.sparse_layers]
    if s.gradient_checkpointing:
        kept = (shape.layers + 3) * t * shape.hidden * rb
        recompute = max(saved + grads for saved, grads in zip(layer_bytes, backward_bytes, strict=True))
        kept_note = f"{shape.layers} layer inputs + 3 x {t:,} tokens x {shape.hidden}"
    else:
        kept = sum(layer_bytes) + 3 * t * shape.hidden * rb
        recompute = max(backward_bytes)
        kept_note = "every layer's saved tensors (no gradient checkpointing)"
    if s.offload_activations and s.device == "cuda" and s.gradient_checkpointing:
        host += kept
        kept = 2 * t * shape.hidden * rb
        kept_note = "in host memory (--offload-activations); one layer's in flight"
    supervised = max(1, math.ceil(s.supervised * t))
    rows_per_chunk = min(s.chunk, supervised)
    loss = 3 * rows_per_chunk * shape.vocab * 4 + (rows_per_chunk * shape.vocab * 2 if s.bf16 else 0)
    loss += 2 * supervised * shape.hidden * ab  # the supervised positions' hidden states and their gradient

    # ZeRO buffers: gradient reduction buckets; ZeRO-3's gathered layer (weights + unreduced gradient).
    buckets = min(REDUCE_BUCKET, p) * wb if ds and s.zero >= 2 else 0
    biggest = max(shape.largest_layer, shape.embedding, shape.head)
    gathered = (2 * biggest + min(PREFETCH_BUCKET, p)) * wb if ds and s.zero == 3 else 0

    # What a plain step holds besides: the head's (or tied embedding's) gradient from the loss's
    # backward on; AdamW's per-parameter temporaries at the step (torch's for-loop / foreach).
    head_grad = (shape.head or shape.embedding) * (4 if not ds else 0)
    layer_grad = shape.largest_layer * (4 if not ds else 0)
    step_tmp = 2 * max(biggest, 1) * 4 if not ds else fp32_grads

    parts = [
        Part("parameters", params, param_note),
        Part("gradients", grads, grad_note),
        Part("optimizer states", optim, optim_note),
        Part("checkpointed activations", kept, kept_note),
        Part("recompute of one layer", recompute, f"largest layer at {t:,} tokens{', linear attention: ' + s.linear_kernels + ' kernels' if shape.hybrid else ''}"),
        Part("loss chunks", loss, f"{rows_per_chunk:,} x {shape.vocab:,} logits, fp32 softmax and gradient"),
        Part("ZeRO buckets", buckets, "reduce bucket (DeepSpeed default 5e8 elements)" if buckets else ""),
        Part("optimizer step temporaries", step_tmp, "fp32 gradient partition (bf16)" if ds else "AdamW's per-parameter temporaries"),
        Part("gathered layers (ZeRO-3)", gathered, f"largest module {biggest / 1e6:,.0f}M params + its gradient + prefetch" if gathered else ""),
    ]  # fmt: skip
    states = params + optim
    phases = {
        "loss backward": states + (grads if ds else head_grad) + kept + loss + buckets + gathered,
        "layer backward": states + (grads if ds else head_grad + layer_grad) + kept + recompute + buckets + gathered,
        "optimizer step": states + grads + step_tmp + buckets,
    }
    if s.device == "cuda":
        reserve = GPU_RESERVE + int(GPU_SLACK * max(phases.values()))
        parts.append(Part("CUDA context, workspaces, slack", reserve, f"assumed: {GPU_RESERVE / GIB:.0f} GiB + {GPU_SLACK:.0%}"))
        phases = {k: v + reserve for k, v in phases.items()}
    peak_phase = max(phases, key=lambda k: phases[k])
    needs = [f"{s.world} processes ({s.gpus_per_node} per node x {s.nodes} node{'s' if s.nodes > 1 else ''})"]
    if s.zero:
        needs.append(f"--zero {s.zero}")
    if s.bf16:
        needs.append("--bf16")
    if s.offload:
        needs.append("--offload (the optimizer step on the CPU)")
    if s.offload_activations:
        needs.append("--offload-activations")
    if host:
        needs.append(f"{host * s.gpus_per_node / GIB:,.0f} GiB of host memory per node for what is offloaded")
    if s.sp > 1:
        needs.append(f"--sp {s.sp}")
    if shape.hybrid and s.linear_kernels == "fla":
        needs.append("flash-linear-attention and causal-conv1d installed (fused Gated DeltaNet kernels)")
    return Plan(
        shape=shape, setting=s, parts=parts, phases=phases, peak=phases[peak_phase], peak_phase=peak_phase,
        host_per_node=host * s.gpus_per_node,
        refused=refusals(shape, s), needs=needs,
    )  # fmt: skip


# Candidates tried by ``suggest``, cheapest in speed first.
LADDER: tuple[dict[str, Any], ...] = (
    {"zero": 2},
    {"zero": 3},
    {"zero": 3, "offload_activations": True},
    {"zero": 3, "offload": True},
    {"zero": 3, "offload": True, "offload_activations": True},
    {"zero": 3, "offload": True, "offload_activations": True, "chunk": 256},
)


def suggest(shape: Shape, base: Setting, capacity: int) -> Plan | None:
    """The first configuration of ``LADDER`` (with ``base``'s size, length and kernels, bf16) that
    relearn accepts for ``shape`` and that fits ``capacity`` bytes per GPU; None when none does."""
    sps = [1, 2, 4, 8]
    for step in LADDER:
        for sp in sps:
            if base.world % sp:
                continue
            plan = estimate(shape, replace(base, bf16=True, sp=sp, pack=False, **step))
            if not plan.refused and plan.peak <= capacity:
                return plan
    return None


def to_json(plan: Plan) -> dict[str, Any]:
    shape = asdict(plan.shape)
    shape.pop("layer_kinds")
    shape.pop("sparse_layers")
    shape["full_attention_layers"] = plan.shape.layer_kinds.count("full")
    shape["linear_attention_layers"] = plan.shape.layer_kinds.count("linear")
    return {
        "model": shape,
        "setting": asdict(plan.setting),
        "parts_bytes": {p.name: p.bytes for p in plan.parts},
        "phases_bytes": plan.phases,
        "peak_bytes": plan.peak,
        "peak_gib": round(plan.peak / GIB, 2),
        "peak_phase": plan.peak_phase,
        "host_per_node_bytes": plan.host_per_node,
        "fits": plan.fits(),
        "refused": plan.refused,
        "needs": plan.needs,
    }


def gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def describe(plan: Plan) -> str:
    """One line: the model, the setting."""
    s, m = plan.setting, plan.shape
    layout = f"{m.layer_kinds.count('linear')} linear + {m.layer_kinds.count('full')} full attention" if m.hybrid else f"{m.layers} layers"
    moe = f", {m.experts} experts top-{m.top_k}" if m.experts else ""
    engine = f"ZeRO-{s.zero}" if s.deepspeed else "plain PyTorch, one process"
    flags = [
        f"{s.ctx:,} tokens", f"{s.gpus_per_node} x {s.nodes} {'GPUs' if s.device == 'cuda' else 'processes'}", engine,
        f"sp {s.sp}", "bf16" if s.bf16 else "fp32", f"chunk {s.chunk}",
    ]  # fmt: skip
    flags += [name for name, on in (("offload", s.offload), ("offload-activations", s.offload_activations), ("pack", s.pack)) if on]
    if not s.gradient_checkpointing:
        flags.append("no gradient checkpointing")
    return f"{m.name}: {m.parameters / 1e9:,.2f}B parameters, {layout}{moe}, vocab {m.vocab:,}; " + ", ".join(flags)


def plan_options(
    opts: Any,
    *,
    gpus_per_node: int = 1,
    nodes: int = 1,
    shape: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
    alternatives: bool = True,
) -> tuple[Plan, dict[str, Plan | None]]:
    """The plan of ``relearn train``'s options (a ``TrainOptions``), and for each card of
    ``CAPACITIES`` that it does not fit, the first configuration of ``suggest`` that would.
    The model is ``shape`` (a named shape), else ``--init``'s ``config.json``, else ``--tiny``'s."""
    from relearn.train.options import UsageError, model_config

    if shape is not None:
        try:
            model = named_shape(shape)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif opts.init is None and opts.tiny is None:
        raise UsageError(f"--plan needs a model: --init FOLDER (its config.json), --tiny NAME or --shape {'|'.join(NAMED_SHAPES)}")
    else:
        try:
            config = model_config(opts)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--init {opts.init}: cannot read the model config: {exc}") from None
        model = shape_of(
            config, str(opts.init or f"tiny {opts.tiny}"), f"{opts.init}/config.json" if opts.init else "relearn's tiny config"
        )
    setting = Setting(
        ctx=opts.ctx, gpus_per_node=gpus_per_node, nodes=nodes, zero=opts.zero, sp=opts.sp, offload=opts.offload,
        offload_activations=opts.offload_activations, pack=opts.pack, gradient_checkpointing=opts.gradient_checkpointing,
        bf16=opts.bf16, chunk=opts.chunk, rows=opts.batch_trajectories, device=device,
        # --kernels fast: the fused Gated DeltaNet kernels; auto counts the reference path (the worst case).
        linear_kernels="fla" if getattr(opts, "kernels", "auto") == "fast" else "reference",
    )  # fmt: skip
    plan = estimate(model, setting)
    if not alternatives or device == "cpu":
        return plan, {}
    return plan, {name: suggest(model, setting, capacity) for name, capacity in CAPACITIES.items() if not plan.fits()[name]}


def table_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """(part, GiB, note) rows, then each phase and the peak."""
    rows = [(p.name, gib(p.bytes), p.note) for p in plan.parts if p.bytes or p.note]
    rows += [(f"phase: {name}", gib(value), "peak" if name == plan.peak_phase else "") for name, value in plan.phases.items()]
    return rows


def verdict_lines(plan: Plan, alternatives: dict[str, Plan | None]) -> list[str]:
    lines = [f"peak per {'GPU' if plan.setting.device == 'cuda' else 'process'}: {gib(plan.peak)} ({plan.peak_phase})"]
    if plan.host_per_node:
        lines.append(f"host memory per node: {gib(plan.host_per_node)}")
    lines += [f"refused by relearn today: {reason}" for reason in plan.refused]
    if plan.setting.device == "cpu":
        return lines
    for name, fits in plan.fits().items():
        if fits:
            lines.append(f"{name}: fits, {gib(CAPACITIES[name] - plan.peak)} to spare")
            continue
        lines.append(f"{name}: does not fit" + ("" if plan.refused else f" ({gib(plan.peak - CAPACITIES[name])} over)"))
        other = alternatives.get(name)
        if other is not None:
            lines.append(f"  fits with: {describe(other).split('; ', 1)[1]} -> {gib(other.peak)}; needs {', '.join(other.needs)}")
        elif name in alternatives:
            lines.append("  nothing relearn runs today fits at this size: add GPUs (--nodes), or shorten --ctx")
    return lines
