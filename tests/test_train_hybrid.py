"""Hybrid linear-attention MoE models (Qwen3.5/3.6-MoE, Qwen3-Next) in the trainer, on CPU.

* the routers' load-balancing loss, as the config asks for it, equals transformers' own
  ``loss`` (CE + coef x aux) and ``aux_loss`` on the same batch, gradients included, and is
  logged beside the masked NLL;
* a multimodal start (``Qwen3_5MoeForConditionalGeneration`` with a vision tower) is trained
  and saved as itself: the vision weights bit for bit, processor and tokenizer files carried;
* ``--kernels fast`` is refused where the fast kernels are not, and ``run.json`` names the path taken.

Tiny random configs that transformers knows; the multimodal one has the real vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from relearn.train.checkpoints import read_metrics
from relearn.train.kernels import Kernel, KernelReport, detect, refusal
from relearn.train.loop import train
from relearn.train.model import RossLM, enable_activation_checkpointing, tiny_config
from relearn.train.options import TrainOptions, UsageError
from tests.test_train import _invoke, random_rows, write_dataset

SMALL_VOCAB = 6000  # the aux-loss comparisons need no 248k head; random_rows draws ids below 5000
COEF = 0.02  # larger than the released 0.001, so that a dropped or mis-scaled aux term shows


def qwen35_text(vocab: int = SMALL_VOCAB) -> Any:
    config = tiny_config("qwen3.5-moe", vocab_size=vocab)
    config.output_router_logits, config.router_aux_loss_coef = True, COEF
    return config


def qwen3_next() -> Any:
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=SMALL_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=2,
        decoder_sparse_step=1, tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=COEF,
    )  # fmt: skip


def causal_lm(config: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.train()
    return model


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def labels_of(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ids.masked_fill(mask == 0, -100)  # transformers shifts labels itself: mask[t] marks target t, as ours


@pytest.mark.parametrize("make", [qwen35_text, qwen3_next], ids=["qwen3.5-moe", "qwen3-next"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_aux_loss_equals_transformers_loss(make: Any, checkpointing: bool) -> None:
    """Our loss = masked NLL + coef x aux equals transformers' ``loss`` with the same labels,
    and its gradient transformers' gradient, on a batch with a padded row (padding tokens are
    left out of the aux statistics, as transformers leaves out what its attention mask zeroes)."""
    lm = causal_lm(make())
    torch.manual_seed(1)
    ids = torch.randint(0, 5000, (2, 37))
    mask = (torch.rand(2, 37) < 0.5).to(torch.uint8)
    mask[:, -1] = 1
    lengths = [37, 29]  # row 1 right-padded
    docs = torch.tensor([[0 if t < n else -1 for t in range(37)] for n in lengths])
    mask[docs < 0] = 0
    attention = (docs >= 0).long()
    positions = torch.arange(37)[None].expand(2, -1).contiguous()

    theirs = lm(input_ids=ids, attention_mask=attention, labels=labels_of(ids, mask), output_router_logits=True)
    theirs.loss.backward()
    g_theirs = grads(lm)
    ce = float((theirs.loss - COEF * theirs.aux_loss).detach())

    if checkpointing:
        enable_activation_checkpointing(lm)  # the router statistics are recomputed with each layer
    ross = RossLM(lm, norm="token", chunk=5)
    assert ross.aux is not None and (ross.aux.coef, ross.aux.top_k, ross.aux.routers) == (COEF, 2, 2)
    ours = ross(ids, mask, docs=docs, position_ids=positions)
    ours.backward()
    g_ours = grads(lm)

    assert abs(ours.item() - theirs.loss.item()) < 1e-6, (ours.item(), theirs.loss.item())
    assert abs(ross.last_nll - ce) < 1e-6 and abs(ross.last_aux - theirs.aux_loss.item()) < 1e-6  # type: ignore[operator]
    assert g_ours.keys() == g_theirs.keys()
    for name, g in g_theirs.items():
        torch.testing.assert_close(g_ours[name], g, rtol=1e-4, atol=1e-7, msg=name)
    # The router weights get a gradient from the aux term beyond the NLL's: a dropped aux would show.
    gate = next(n for n in g_theirs if n.endswith("mlp.gate.weight"))
    lm.config.output_router_logits = False
    plain = RossLM(lm, norm="token", chunk=5)
    assert plain.aux is None
    plain(ids, mask, docs=docs, position_ids=positions).backward()
    assert not torch.allclose(grads(lm)[gate], g_theirs[gate], rtol=1e-3, atol=0)


def test_config_without_router_logits_trains_the_nll_alone() -> None:
    config = qwen35_text()
    config.output_router_logits = False
    lm = causal_lm(config)
    ids = torch.randint(0, 5000, (1, 20))
    mask = torch.ones_like(ids, dtype=torch.uint8)
    ross = RossLM(lm, norm="token")
    loss = ross(ids, mask)
    logits = lm(input_ids=ids).logits
    ce = F.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert ross.aux is None and ross.last_aux is None and abs(loss.item() - ce.item()) < 1e-5


# --- a multimodal start, trained end to end -------------------------------------------------


def multimodal_folder(folder: Path) -> Path:
    """A tiny random ``Qwen3_5MoeForConditionalGeneration`` (vision tower included, real
    vocabulary, aux loss on) saved as a Hugging Face folder, with a processor config and a
    tokenizer beside it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor
    from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=8, num_position_embeddings=64)
    config = Qwen3_5MoeConfig(text_config=qwen35_text(vocab=248_320).to_dict(), vision_config=vision)
    torch.manual_seed(3)
    Qwen3_5MoeForConditionalGeneration(config).save_pretrained(folder)
    Qwen2VLImageProcessor().save_pretrained(folder)
    words = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>").save_pretrained(folder)
    (folder / "LICENSE").write_text("licence text carried with the weights\n")
    return folder


@pytest.fixture(scope="module")
def mm_init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return multimodal_folder(tmp_path_factory.mktemp("mm") / "init")


@pytest.fixture(scope="module")
def mm_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("mmdata") / "data", random_rows(4, seed=44, lengths=(16, 40)))


def test_multimodal_start_is_trained_and_saved_as_itself(mm_init: Path, mm_data: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoImageProcessor, AutoTokenizer
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

    out = tmp_path / "run"
    opts = TrainOptions(dataset=mm_data, out=out, init=str(mm_init), epochs=1, lr=5e-3, warmup=1, chunk=8, ctx=64, progress=False)
    summary = train(opts)
    assert summary.finished and summary.steps == 4

    # The aux loss is logged beside the masked NLL and is part of the trained loss.
    for m in read_metrics(out):
        assert m["aux_loss"] > 0 and abs(m["loss"] - (m["nll"] + COEF * m["aux_loss"])) < 1e-6 * max(1.0, m["loss"])
    run = json.loads((out / "run.json").read_text())
    assert run["router_aux_loss"] == {"coef": COEF, "top_k": 2, "moe_layers": 2}
    assert run["frozen"]["class"] == "Qwen3_5MoeForConditionalGeneration" and run["frozen"]["tensors"] > 0

    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "vision_config" in saved
    before, after = load_file(mm_init / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert before.keys() == after.keys()  # nothing dropped (every vision weight), nothing renamed
    vision = [k for k in before if k.startswith("model.visual.")]
    assert len(vision) > 10
    for k in vision:
        assert before[k].dtype == after[k].dtype and torch.equal(before[k].view(torch.uint8), after[k].view(torch.uint8)), k
    language = [k for k in before if k.startswith("model.language_model.") or k == "lm_head.weight"]
    changed = [k for k in language if not torch.equal(before[k], after[k])]
    assert "lm_head.weight" in changed and any(".mlp.gate." in k for k in changed) and any("linear_attn" in k for k in changed)

    # Reloaded with the original class: the vision tower is the one it started from.
    reloaded = Qwen3_5MoeForConditionalGeneration.from_pretrained(out / "model")
    for name, p in reloaded.model.visual.named_parameters():
        assert torch.equal(p, before[f"model.visual.{name}"]), name
    # Processor and tokenizer files came along and load.
    for name in ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "LICENSE"):
        assert (out / "model" / name).read_bytes() == (mm_init / name).read_bytes(), name
    assert type(AutoImageProcessor.from_pretrained(out / "model")).__name__.startswith("Qwen2VLImageProcessor")
    text = "hello world hello"
    assert AutoTokenizer.from_pretrained(out / "model")(text)["input_ids"] == AutoTokenizer.from_pretrained(mm_init)(text)["input_ids"]


def test_multimodal_first_step_loss_equals_transformers(mm_init: Path, mm_data: Path, tmp_path: Path) -> None:
    """lr 0, one trajectory per step: each step's logged loss is transformers' ``loss`` of the
    multimodal class on that sample (CE over the supervised labels + coef x aux), its NLL the CE."""
    import pyarrow.parquet as pq
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

    out = tmp_path / "run"
    train(TrainOptions(dataset=mm_data, out=out, init=str(mm_init), epochs=1, lr=0.0, chunk=8, ctx=64, progress=False, max_steps=2))
    metrics = read_metrics(out)
    rows = {r["sample_id"]: r for r in pq.read_table(mm_data).to_pylist()}
    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(mm_init)
    model.train()
    losses = {}
    for sid, row in rows.items():
        ids = torch.tensor([row["input_ids"]])
        out_hf = model(input_ids=ids, labels=labels_of(ids, torch.tensor([row["loss_mask"]])))
        losses[sid] = (out_hf.loss.item(), out_hf.aux_loss.item())
    # Which sample each step trained is the epoch's shuffled order; match by value.
    for m in metrics:
        assert min(abs(m["loss"] - loss) + abs(m["aux_loss"] - aux) for loss, aux in losses.values()) < 1e-5, (m, losses)


# --- kernels ---------------------------------------------------------------------------------


def test_kernels_fast_is_refused_without_a_gpu_and_run_json_names_the_path(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", random_rows(2, seed=45))
    opts = TrainOptions(dataset=data, out=tmp_path / "run", tiny="qwen3.5-moe", epochs=1, ctx=64, kernels="fast", progress=False)
    with pytest.raises(UsageError, match="--kernels fast needs a CUDA GPU"):
        train(opts)
    assert not (tmp_path / "run").exists()  # refused before anything was written
    result = _invoke(str(data), "--out", str(tmp_path / "run"), "--tiny", "qwen3.5-moe", "--kernels", "fast")
    assert result.exit_code == 2 and "--kernels fast needs a CUDA GPU" in result.text

    opts.kernels = "auto"
    opts.max_steps = 1
    train(opts)
    kernels = json.loads((tmp_path / "run" / "run.json").read_text())["kernels"]
    assert kernels["mode"] == "auto" and kernels["device"] == "cpu" and kernels["used"] == []
    assert kernels["reference"] == ["the gated delta rule", "the short causal convolution"]
    assert kernels["kernels"]["flash-linear-attention"]["needed"] and not kernels["kernels"]["flash-attn"]["needed"]


def test_kernels_fast_names_what_is_missing_on_a_gpu() -> None:
    def kernel(name: str, dist: str, role: str, present: bool) -> Kernel:
        return Kernel(name, dist, role, present, "1.0" if present else None, True, present)

    report = KernelReport(
        "fast", "cuda", (kernel("fla", "flash-linear-attention", "the gated delta rule", True), kernel("causal_conv1d", "causal-conv1d", "the short causal convolution", False))
    )  # fmt: skip
    why = refusal(report)
    assert why is not None and "relearn[gpu]" in why
    missing = why.split("Install")[0]
    assert "causal-conv1d (import causal_conv1d) for the short causal convolution" in missing and "flash-linear" not in missing
    assert refusal(KernelReport("fast", "cuda", (kernel("fla", "flash-linear-attention", "x", True),))) is None
    assert refusal(KernelReport("auto", "cpu", report.kernels)) is None
    # A dense model with sdpa needs none of them: on CPU nothing is even imported.
    dense = detect(linear_attention=False, attn="sdpa", device="cpu")
    assert not any(k.needed or k.present for k in dense.kernels)


@pytest.mark.slow  # torchrun starts two DeepSpeed processes
def test_zero3_two_ranks_match_single_process_with_aux_and_vision_kept(mm_init: Path, mm_data: Path, tmp_path: Path) -> None:
    """ZeRO-3 over 2 gloo ranks, one trajectory each per step, against one process taking the
    same two trajectories as two accumulated micro-batches (the aux loss is a per-micro-batch
    statistic, averaged over the step's micro-batches either way): losses, NLLs and aux losses
    agree, and the gathered model keeps its vision tower bit for bit."""
    from safetensors.torch import load_file

    from tests.test_train_deepspeed import assert_close, torchrun

    common = dict(init=str(mm_init), epochs=1, lr=5e-3, warmup=1, chunk=8, ctx=64, progress=False)
    single = tmp_path / "single"
    train(TrainOptions(dataset=mm_data, out=single, grad_accum=2, **common))  # type: ignore[arg-type]
    ref = read_metrics(single)
    out = tmp_path / "z3"
    flags = ["--init", str(mm_init), "--epochs", "1", "--lr", "5e-3", "--warmup", "1", "--chunk", "8", "--ctx", "64", "--no-progress"]
    result = torchrun(str(mm_data), "--out", str(out), *flags, "--zero", "3")
    assert "ZeRO-3" in result.stderr and "router aux loss on" in result.stderr
    ours = read_metrics(out)
    for key in ("loss", "nll", "aux_loss"):
        assert_close([m[key] for m in ours], [m[key] for m in ref])
    before, after = load_file(mm_init / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert before.keys() == after.keys()
    for k in (k for k in before if k.startswith("model.visual.")):
        assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before["lm_head.weight"], after["lm_head.weight"])


@pytest.mark.slow  # torchrun starts two DeepSpeed processes
def test_ulysses_sp_two_ranks_pool_the_aux_statistics(mm_data: Path, tmp_path: Path) -> None:
    """--sp 2 on a Qwen3-MoE with the aux loss on: each rank routes half of a row's tokens, and
    the aux of the row needs both halves' sums. The group pools them, so losses, NLLs and aux
    losses equal one process taking the same rows whole."""
    from transformers import AutoModelForCausalLM

    from tests.test_train_deepspeed import assert_close, torchrun

    config = tiny_config("qwen3-moe")
    config.output_router_logits, config.router_aux_loss_coef = True, COEF
    torch.manual_seed(5)
    init = tmp_path / "init"
    AutoModelForCausalLM.from_config(config).save_pretrained(init)
    single = tmp_path / "single"
    train(
        TrainOptions(
            dataset=mm_data, out=single, init=str(init), epochs=1, lr=5e-3, warmup=1, chunk=8, ctx=64, grad_accum=2, progress=False
        )
    )
    ref = read_metrics(single)
    out = tmp_path / "sp2"
    flags = ["--init", str(init), "--epochs", "1", "--lr", "5e-3", "--warmup", "1", "--chunk", "8", "--ctx", "64", "--no-progress"]
    result = torchrun(str(mm_data), "--out", str(out), *flags, "--zero", "3", "--sp", "2", "--grad-accum", "2")
    assert "sequence parallel 2" in " ".join(result.stderr.split())
    ours = read_metrics(out)
    for key in ("loss", "nll", "aux_loss"):
        assert_close([m[key] for m in ours], [m[key] for m in ref])
