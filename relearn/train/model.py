"""Models: any ``transformers`` causal LM, plus tiny random configs for tests and benchmarks.

``RossLM`` wraps the causal LM so that the loss is computed *inside* ``forward``: the model
body gives hidden states, and ``relearn.train.loss`` runs the LM head only at supervised
positions. Keeping it inside one module matters under DeepSpeed: the engine's forward (and
ZeRO-3's parameter hooks) see one call per micro-batch, exactly as with ``model(..., labels=...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from relearn.train.linear_sp import SEGMENTS_KWARG, LinearAttentionSP, is_gated_deltanet, packed_segments
from relearn.train.loss import LossNorm, RouterBalance, masked_loss

QWEN_VOCAB = 248_320  # Qwen3.5/3.6 padded vocabulary: what makes full logits at 64k cost 65 GB
TINY_MODELS: tuple[str, ...] = ("qwen3", "qwen3-moe", "qwen3.5-moe")
# Model types whose layers include Gated DeltaNet (linear attention) somewhere.
LINEAR_ATTENTION_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}


def tiny_config(name: str, vocab_size: int = QWEN_VOCAB, max_positions: int = 262_144) -> Any:
    """A random-init config small enough for CPU tests, with the real vocabulary (~32M parameters,
    almost all of them in the embedding and the LM head)."""
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    if name == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(intermediate_size=128, **common)
    if name == "qwen3-moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, **common
        )
    if name == "qwen3.5-moe":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig(
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            full_attention_interval=2,  # layers: linear_attention, full_attention
            **common,
        )
    raise ValueError(f"unknown tiny model {name!r}; choose from {', '.join(TINY_MODELS)}")


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def has_linear_attention(config: Any) -> bool:
    """True when some layers are linear attention (Gated DeltaNet): their recurrent state is
    what sequence parallelism and packing get wrong."""
    text = _text_config(config)
    layer_types = getattr(text, "layer_types", None) or []
    return "linear_attention" in layer_types or config.model_type in LINEAR_ATTENTION_TYPES or text.model_type in LINEAR_ATTENTION_TYPES


def build_model(
    *,
    init: str | None = None,
    tiny: str | None = None,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    max_positions: int = 262_144,
) -> nn.Module:
    """A causal LM from a folder (``init``) or a tiny random config (``tiny``, seeded).

    Under ZeRO-3 the caller keeps a ``HfDeepSpeedConfig`` alive first, so that
    ``from_pretrained`` builds the model partitioned (``zero.Init``) instead of whole on every rank.
    """
    from transformers import AutoModelForCausalLM

    if (init is None) == (tiny is None):
        raise ValueError("give exactly one of init (a model folder) or tiny")
    if tiny is not None:
        torch.manual_seed(seed)  # the random init is part of the run's identity
        model = AutoModelForCausalLM.from_config(
            tiny_config(tiny, max_positions=max_positions), attn_implementation=attn_implementation, dtype=dtype
        )
    else:
        model = model_class(init).from_pretrained(init, attn_implementation=attn_implementation, dtype=dtype)
    check_supported(model)
    freeze_all_but_language_model(model)
    model.config.use_cache = False  # no KV cache in training; it would also disable packed-sequence masks
    return model


def model_class(init: str) -> Any:
    """The class to load ``init`` with: its own architecture when that is a multimodal model
    around a causal LM (``Qwen3_5MoeForConditionalGeneration``, the released Qwen3.5/3.6 shape),
    so that the vision tower is kept and saved again; ``AutoModelForCausalLM`` otherwise (which
    would load only the text tower of such a checkpoint and save a different model)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(init)
    arch = (getattr(config, "architectures", None) or [""])[0]
    if arch.endswith("ForConditionalGeneration") and getattr(config, "text_config", None) is not None:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return AutoModelForCausalLM


def language_model_parameters(model: nn.Module) -> set[str]:
    """Names of the parameters that masked SFT trains: the decoder body and the LM head."""
    body, head = model.get_decoder(), model.get_output_embeddings()
    keep = {id(p) for p in body.parameters()} | {id(p) for p in head.parameters()}
    return {name for name, p in model.named_parameters() if id(p) in keep}


def freeze_all_but_language_model(model: nn.Module) -> list[str]:
    """Freeze what the text loss never reaches (a vision tower): it gets no gradient and no
    optimizer state, and is saved exactly as loaded. Returns the frozen parameters' names."""
    trained = language_model_parameters(model)
    frozen = [name for name, p in model.named_parameters() if name not in trained]
    for name, p in model.named_parameters():
        if name not in trained:
            p.requires_grad_(False)
    return frozen


def enable_activation_checkpointing(model: nn.Module, offload: bool = False) -> None:
    """Recompute each decoder layer in the backward pass (keeping only its input), optionally
    holding those inputs in pinned host memory (``offload``, GPU only)."""
    kwargs = {"use_reentrant": False}  # non-reentrant: works with ZeRO-3 hooks and inputs without grad
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, offload=offload)
    elif offload:
        raise ValueError("activation offload needs transformers >= 5.24")
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def check_supported(model: nn.Module) -> None:
    config = _text_config(model.config)
    if getattr(config, "final_logit_softcapping", None):
        raise ValueError(f"{config.model_type}: logit soft-capping is not supported by the chunked loss")
    if model.get_output_embeddings() is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head); a causal LM is needed")


def attention_inputs(
    input_ids: torch.Tensor, docs: torch.Tensor | None, position_ids: torch.Tensor | None, packed: bool, impl: str, dtype: torch.dtype
) -> dict[str, Any]:
    """How to tell the model body which tokens may attend to which.

    * one unpadded trajectory per row: nothing (SDPA/flash use their causal fast path, no S x S mask);
    * padded rows: a 2-D padding mask, the model builds the rest;
    * packed rows: attention must not cross trajectories. Flash attention takes the restarting
      ``position_ids`` (its varlen path); SDPA and eager get an explicit 4-D block-diagonal causal
      mask, which costs B x S x S bytes (64 MiB at 8,192 tokens, 4 GiB at 65,536): pack short
      trajectories only, or use flash attention for long packs.
    """
    if docs is None:
        # Sequence-parallel shards carry their global positions (Ulysses gathers them back).
        return {} if position_ids is None else {"position_ids": position_ids}
    if not packed:
        return {"attention_mask": (docs >= 0).long(), "position_ids": position_ids}
    if impl.startswith("flash"):
        if bool((docs < 0).any()):
            raise ValueError("packing with flash attention needs unpadded rows: use --batch-trajectories 1")
        return {"position_ids": position_ids}
    s = docs.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=docs.device).tril()
    # Padding positions form their own "trajectory": every query row keeps at least its diagonal,
    # so no row is fully masked (which would give NaN through softmax).
    allowed = (docs[:, :, None] == docs[:, None, :]) & causal
    allowed = allowed[:, None]
    if impl == "sdpa":
        return {"attention_mask": allowed, "position_ids": position_ids}
    additive = torch.zeros(allowed.shape, dtype=dtype, device=docs.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return {"attention_mask": additive, "position_ids": position_ids}


@dataclass(frozen=True)
class RouterAux:
    """The routers' load-balancing loss as the model's config asks for it."""

    coef: float  # router_aux_loss_coef
    top_k: int  # num_experts_per_tok
    routers: int  # router modules found (the MoE layers)

    def describe(self) -> str:
        return f"router aux loss on: coef {self.coef:g} x load-balancing loss (top-{self.top_k}, {self.routers} MoE layers)"


def router_modules(lm: nn.Module) -> list[tuple[nn.Module, int]]:
    """Every router of ``lm`` with the index of its logits in its output: the modules that
    transformers itself records as ``router_logits`` (each model class's ``_can_record_outputs``),
    so any MoE transformers can train with an aux loss is covered, not a list of class names."""
    from transformers import PreTrainedModel

    specs: list[tuple[type, int, str | None]] = []
    for module in lm.modules():
        if isinstance(module, PreTrainedModel):
            spec = (getattr(module, "_can_record_outputs", None) or {}).get("router_logits")
            if isinstance(spec, type):
                specs.append((spec, 0, None))
            elif spec is not None and getattr(spec, "target_class", None) is not None:
                specs.append((spec.target_class, spec.index or 0, spec.layer_name))
    found = []
    for name, module in lm.named_modules():
        for cls, index, layer_name in specs:
            if isinstance(module, cls) and (layer_name is None or f".{layer_name.strip('.')}." in f".{name}."):
                found.append((module, index))
                break
    return found


def router_aux(lm: nn.Module) -> RouterAux | None:
    """``RouterAux`` when the config asks for the aux loss (``output_router_logits``, with a
    non-zero ``router_aux_loss_coef``), else ``None``. A config that asks for it on a model
    without routers is refused: the loss would be dropped in silence."""
    config = _text_config(lm.config)
    if not getattr(config, "output_router_logits", False) or not getattr(config, "router_aux_loss_coef", 0.0):
        return None
    routers = router_modules(lm)
    if not routers:
        raise ValueError(f"{config.model_type}: the config asks for the router aux loss (output_router_logits) but no router was found")
    return RouterAux(float(config.router_aux_loss_coef), int(config.num_experts_per_tok), len(routers))


class RossLM(nn.Module):
    """A causal LM whose forward returns the ROSS loss of a micro-batch (plus the routers'
    aux loss when the config asks for it; see ``relearn.train.loss.RouterBalance``)."""

    def __init__(self, lm: nn.Module, *, norm: LossNorm = "trajectory", chunk: int = 1024) -> None:
        super().__init__()
        self.lm = lm
        self.norm: LossNorm = norm
        self.chunk = chunk
        self.aux = router_aux(lm)
        self.balance = RouterBalance(self.aux.top_k) if self.aux else None
        self.sp_group: Any = None  # set under sequence parallelism: the ranks sharing a row
        self.sp = 1
        # Gated DeltaNet layers: packed rows need them wrapped (relearn.train.linear_sp), which
        # restart their state at each trajectory from the segments passed down.
        self.linear_wrapped = any(isinstance(m, LinearAttentionSP) for m in lm.modules())
        self.linear_bare = any(is_gated_deltanet(m) for m in lm.modules())
        # The last forward's parts, detached (for the metrics): its NLL share and its aux loss.
        self.last_nll = 0.0
        self.last_aux: float | None = None
        if self.balance is not None:
            balance = self.balance
            for module, index in router_modules(lm):
                module.register_forward_hook(lambda _m, _args, out, i=index: balance.add(out[i] if isinstance(out, tuple) else out))

    def body(self) -> nn.Module:
        return self.lm.get_decoder()

    def hidden_states(self, input_ids: torch.Tensor, **attention: Any) -> torch.Tensor:
        out = self.body()(input_ids=input_ids, use_cache=False, **attention)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        segments: torch.Tensor | None = None,
        n_segments: int | None = None,
        docs: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        packed: bool = False,
        denominator: float | None = None,
        min_chunks: int = 0,
        targets: torch.Tensor | None = None,
        shifted: bool = False,
        segment_counts: torch.Tensor | None = None,
        aux_weight: float | None = None,
        real: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``targets`` defaults to ``input_ids`` (teacher forcing); only its supervised positions are read.
        ``shifted``/``segment_counts``: a sequence-parallel shard (see ``relearn.train.data.shard_sequence``).
        ``aux_weight``: what this micro-batch's router aux loss is multiplied by (the step's
        micro-batches share the coefficient: ``coef / micro-batches``); default the coefficient.
        ``real``: a shard's non-padding tokens (its ``docs`` is None), for the routers' statistics."""
        impl = getattr(self.lm.config, "_attn_implementation", "sdpa") or "sdpa"
        head = self.lm.get_output_embeddings()
        attention = attention_inputs(input_ids, docs, position_ids, packed, impl, head.weight.dtype)
        if packed and docs is not None and (self.linear_wrapped or self.linear_bare):
            if self.linear_bare:
                raise ValueError(
                    "packed rows through bare Gated DeltaNet layers would carry state across trajectories: install relearn.train.linear_sp first"
                )
            attention[SEGMENTS_KWARG] = packed_segments(docs)
        if self.balance is not None:
            self.balance.start(real if real is not None else torch.ones_like(input_ids, dtype=torch.bool) if docs is None else docs >= 0)
        try:
            hidden = self.hidden_states(input_ids, **attention)
        finally:
            if self.balance is not None:
                self.balance.stop()
        loss = masked_loss(
            hidden, input_ids if targets is None else targets, loss_mask, head, norm=self.norm, segments=segments, n_segments=n_segments,
            denominator=denominator, chunk=self.chunk, min_chunks=min_chunks, shifted=shifted, segment_counts=segment_counts,
        )  # fmt: skip
        self.last_nll = float(loss.detach())
        self.last_aux = None
        if self.balance is not None and self.aux is not None:
            aux = self.balance.loss(self.sp_group)
            if aux is not None:
                self.last_aux = float(aux.detach()) / self.sp
                weight = self.aux.coef if aux_weight is None else aux_weight
                # Under sequence parallelism every rank of the group holds the rows' whole aux
                # value but the gradient of its own tokens only: count the value 1/sp times.
                loss = loss + weight * (aux - aux.detach() * (1 - 1 / self.sp))
        return loss


def chunks_needed(supervised: int, chunk: int) -> int:
    return math.ceil(supervised / chunk)


def parameter_count(model: nn.Module) -> int:
    # Under ZeRO-3 a parameter's local tensor is an empty placeholder; ds_numel is its real size.
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
