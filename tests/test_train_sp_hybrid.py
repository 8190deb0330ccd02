"""Sequence parallelism (``--sp``) and packing (``--pack``) for hybrid Gated DeltaNet models, on CPU.

* ``--sp 2`` over two gloo ranks: each rank holds half of a row, and the linear-attention layers
  exchange heads around their convolution and recurrence (``relearn.train.linear_sp``). The loss
  and every parameter's gradient (summed over the two ranks, as the data-parallel reduction does)
  equal one process taking the whole row, for tiny Qwen3.5-MoE-text and Qwen3-Next models at a
  length of several of the rule's 64-token chunks; and ``relearn train --sp 2 --zero 3`` trains and
  saves, its losses those of one process.
* ``--sp 4`` over four gloo ranks: the same shapes with 4 key / 8 value heads of linear attention,
  at odd lengths of three and four chunks; loss, aux loss and gradients equal one process's.
* ``--pack``: a packed row's loss and gradients equal the same samples run one by one; the
  recurrent state and the convolution window restart at each trajectory.
* The released checkpoints' multimodal shape (``Qwen3_5MoeForConditionalGeneration``): ``--sp 2
  --zero 3`` and ``--pack`` log the single-process / unpacked losses and save the model multimodal,
  its vision weights byte-identical.

The two-rank checks run this file as a script under torchrun (``worker``).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from relearn.masks.rows import ShardRow
from relearn.train.checkpoints import read_metrics
from relearn.train.data import collate, shard_sequence
from relearn.train.linear_sp import LinearAttentionSP, install, packed_segments
from relearn.train.loop import train
from relearn.train.model import RossLM, tiny_config
from relearn.train.options import TrainOptions, UsageError, check_options
from tests.test_train import random_rows, write_dataset
from tests.test_train_hybrid import causal_lm, grads, qwen3_next, qwen35_text

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"qwen3.5-moe": qwen35_text, "qwen3-next": qwen3_next}
LENGTHS = {"qwen3.5-moe": 150, "qwen3-next": 131}  # several 64-token chunks; one odd, so sp pads it


def four_heads(config: Any) -> Any:
    """The same tiny shape with 4 linear-attention key heads and 8 value heads: --sp 4 gives each
    rank one key head and two value heads (one value head per key head's group of two)."""
    config.linear_num_key_heads, config.linear_num_value_heads = 4, 8
    return config


# For --sp 4: lengths of several 64-token chunks of the reference rule, odd (padded to a multiple of 4).
MODELS_SP4 = {"qwen3.5-moe": lambda: four_heads(qwen35_text()), "qwen3-next": lambda: four_heads(qwen3_next())}
LENGTHS_SP4 = {"qwen3.5-moe": 261, "qwen3-next": 203}
LOSS_TOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


def sample(length: int, seed: int, name: str = "s") -> ShardRow:
    rng = np.random.default_rng(seed)
    mask = (rng.random(length) < 0.5).astype(np.uint8)
    mask[-1] = 1
    return ShardRow(f"{name}{seed}", f"t{name}{seed}", rng.integers(0, 5000, length).astype(np.int32), mask)


def no_aux(config: Any) -> Any:
    # The router aux loss is a statistic of a whole micro-batch: one pack's is not the sum of its
    # samples' taken apart, so the packing checks compare the NLL alone.
    config.output_router_logits = False
    return config


def ross_inputs(batch: Any, denominator: float) -> dict[str, Any]:
    return dict(
        input_ids=batch.input_ids, loss_mask=batch.loss_mask, segments=batch.segments, n_segments=batch.n_segments,
        docs=batch.docs, position_ids=batch.position_ids, packed=batch.packed, denominator=denominator,
        targets=batch.targets, shifted=batch.shifted, segment_counts=torch.tensor(batch.trajectory_supervised), real=batch.real,
    )  # fmt: skip


# --- packing, in one process ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_row_equals_its_samples_one_by_one(name: str) -> None:
    """Three samples packed into one row, through the wrapped layers: the same loss and gradients
    as the three run one at a time through transformers' own layers (the row's first sample is
    longer than a 64-token chunk, the others start mid-chunk). Unwrapped, the pack is refused."""
    samples = [sample(90, 1), sample(37, 2), sample(70, 3)]
    denominator = float(sum(s.supervised for s in samples))  # token mean over the three
    reference = causal_lm(no_aux(MODELS[name]()))
    lm = copy.deepcopy(reference)  # one RossLM per model: each hooks the routers
    ross = RossLM(reference, norm="token", chunk=16)
    expected = sum(ross(**ross_inputs(collate(samples, [(i,)]), denominator)) for i in range(3))
    expected.backward()  # type: ignore[union-attr]
    g_expected = grads(reference)

    packed = collate(samples, [(0, 1, 2)])
    assert packed.packed and packed_segments(packed.docs) == ((90, 37, 70),)
    with pytest.raises(ValueError, match="carry state across trajectories"):
        ross(**ross_inputs(packed, denominator))
    assert install(lm) == 1
    ross = RossLM(lm, norm="token", chunk=16)
    loss = ross(**ross_inputs(packed, denominator))
    loss.backward()
    g_packed = grads(lm)
    assert abs(loss.item() - expected.item()) < LOSS_TOL, (loss.item(), expected.item())  # type: ignore[union-attr]
    assert g_packed.keys() == g_expected.keys()
    for key, g in g_expected.items():
        torch.testing.assert_close(g_packed[key], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=key)
    # The state really would have leaked: the same row with no boundaries differs.
    leaked = collate([ShardRow("x", "x", np.concatenate([s.input_ids for s in samples]), packed.loss_mask[0].numpy())], [(0,)])
    assert abs(ross(**ross_inputs(leaked, denominator)).item() - expected.item()) > 1e-3  # type: ignore[union-attr]


def test_two_padded_packed_rows() -> None:
    """Two packed rows of different lengths in one micro-batch (the shorter right-padded)."""
    samples = [sample(40, 4), sample(30, 5), sample(50, 6), sample(12, 7)]
    reference = causal_lm(no_aux(qwen35_text()))
    lm = copy.deepcopy(reference)
    ross = RossLM(reference, norm="token", chunk=16)
    denominator = float(sum(s.supervised for s in samples))
    expected = sum(ross(**ross_inputs(collate(samples, [(i,)]), denominator)).item() for i in range(4))
    install(lm)
    ross = RossLM(lm, norm="token", chunk=16)
    batch = collate(samples, [(0, 1), (2, 3)])
    assert packed_segments(batch.docs) == ((40, 30), (50, 12, 8))
    assert abs(ross(**ross_inputs(batch, denominator)).item() - expected) < LOSS_TOL


class VarlenKernels:
    """The variable-length contract of flash-linear-attention's chunked rule (one sequence of
    trajectories laid end to end, ``cu_seqlens`` their boundaries, batch 1) and of causal-conv1d
    (``seq_idx``: each position's trajectory), kept on CPU by transformers' reference functions
    run per trajectory. Neither kernel runs on CPU; this checks what the layers hand them."""

    def __init__(self, modeling: Any) -> None:
        self.modeling = modeling
        self.rule_calls: list[list[int]] = []
        self.conv_calls: list[list[int]] = []

    def rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor, **kw: Any
    ) -> Any:
        assert q.shape[0] == 1 and cu_seqlens.dtype == torch.long
        bounds = cu_seqlens.tolist()
        self.rule_calls.append(bounds)
        cut = lambda t, a, b: t[:, a:b]  # noqa: E731
        outs = [
            self.modeling.torch_chunk_gated_delta_rule(
                cut(q, a, b), cut(k, a, b), cut(v, a, b), g=cut(g, a, b), beta=cut(beta, a, b), **kw
            )[0]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return torch.cat(outs, dim=1), None

    def conv(self, x: torch.Tensor, weight: torch.Tensor, bias: Any, *, activation: Any, seq_idx: torch.Tensor) -> torch.Tensor:
        assert x.stride(1) == 1, "causal-conv1d takes seq_idx only for channel-last inputs"
        lengths = torch.unique_consecutive(seq_idx[0], return_counts=True)[1].tolist()
        self.conv_calls.append(lengths)
        pieces = x.split(lengths, dim=2)
        return torch.cat([self.modeling.causal_conv1d_fn(p, weight, bias, activation=activation) for p in pieces], dim=2)


@pytest.mark.parametrize("conv_too", [False, True])
def test_packed_rows_reach_the_fast_kernels_in_one_call(conv_too: bool) -> None:
    """With the fast kernels (``install(varlen_rule=True)``), a packed micro-batch of two padded
    rows is one call of the rule per layer with the trajectories' boundaries as ``cu_seqlens``
    (and of the convolution with ``seq_idx`` where causal-conv1d runs it): the same loss and
    gradients as the reference path's one call per trajectory."""
    import sys

    samples = [sample(40, 4), sample(30, 5), sample(50, 6), sample(12, 7)]
    reference = causal_lm(no_aux(qwen35_text()))
    lm = copy.deepcopy(reference)
    denominator = float(sum(s.supervised for s in samples))
    batch = collate(samples, [(0, 1), (2, 3)])
    install(reference)
    expected = RossLM(reference, norm="token", chunk=16)(**ross_inputs(batch, denominator))
    expected.backward()
    assert install(lm, varlen_rule=True, varlen_conv=conv_too) == 1
    layer = lm.model.layers[0].linear_attn
    kernels = VarlenKernels(sys.modules[type(layer.layer).__module__])
    # transformers' kernel functions are modules (hub kernels): set past nn.Module's registry.
    object.__setattr__(layer, "_rule", kernels.rule)
    if conv_too:
        object.__setattr__(layer, "_conv", kernels.conv)
    loss = RossLM(lm, norm="token", chunk=16)(**ross_inputs(batch, denominator))
    loss.backward()
    assert kernels.rule_calls == [[0, 40, 70, 120, 132, 140]]  # rows of 70 and 62 tokens, the second padded by 8
    assert kernels.conv_calls == ([[40, 30, 50, 12, 8]] if conv_too else [])
    assert abs(loss.item() - expected.item()) < LOSS_TOL
    g_expected, g_varlen = grads(reference), grads(lm)
    assert g_varlen.keys() == g_expected.keys(), set(g_varlen) ^ set(g_expected)
    for key, g in g_expected.items():
        torch.testing.assert_close(g_varlen[key], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=key)


def test_wrapped_layers_keep_the_state_dict_and_refuse_heads_that_do_not_divide() -> None:
    lm = causal_lm(qwen3_next())
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    install(lm)
    assert isinstance(lm.model.layers[0].linear_attn, LinearAttentionSP)
    after = lm.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    config = tiny_config("qwen3.5-moe")  # 2 key / 4 value heads of linear attention; 4 / 2 of softmax attention
    opts = TrainOptions(dataset=Path("x"), out=Path("y"), tiny="qwen3.5-moe", sp=4)
    with pytest.raises(UsageError, match="2 key and 4 value heads.*divide by 4"):
        check_options(opts, config)
    opts.sp = 2
    check_options(opts, config)  # accepted now
    opts.sp, opts.pack = 1, True
    check_options(opts, config)
    with pytest.raises(ValueError, match="divide"):
        install(causal_lm(qwen35_text()), sp=4)


def test_pack_end_to_end_equals_unpacked(tmp_path: Path) -> None:
    """``relearn train --pack`` on a hybrid model (lr 0): the step that packs four samples logs the
    NLL of the unpacked run taking the same four as four micro-batches."""
    data = write_dataset(tmp_path / "data", random_rows(4, seed=46, lengths=(20, 60)))
    init = tmp_path / "init"
    causal_lm(no_aux(qwen35_text())).save_pretrained(init)  # a 6,000-token vocabulary: quick
    common = dict(dataset=data, init=str(init), epochs=1, lr=0.0, chunk=8, ctx=256, progress=False)
    train(TrainOptions(out=tmp_path / "packed", pack=True, **common))  # type: ignore[arg-type]
    train(TrainOptions(out=tmp_path / "plain", grad_accum=4, **common))  # type: ignore[arg-type]
    packed, plain = read_metrics(tmp_path / "packed"), read_metrics(tmp_path / "plain")
    assert len(packed) == len(plain) == 1 and packed[0]["trajectories"] == 4
    assert abs(packed[0]["nll"] - plain[0]["nll"]) < LOSS_TOL, (packed, plain)
    assert (tmp_path / "packed" / "model" / "config.json").is_file()
    saved = json.loads((tmp_path / "packed" / "model" / "config.json").read_text())
    assert saved["model_type"] == "qwen3_5_moe_text"


# --- two gloo ranks ----------------------------------------------------------------------------


def torchrun(*args: str, timeout: int = 420, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    from tests.test_train_deepspeed import TORCHRUN, extensions_dir

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions_dir()), "PYTHONPATH": str(ROOT)}
    env.update(NO_COLOR="1", OMP_NUM_THREADS="1")
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node", str(ranks), *args]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"torchrun failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.mark.slow  # torchrun starts two processes
@pytest.mark.parametrize("sp", [2, 4])
def test_sp_loss_and_gradients_equal_one_process(sp: int, tmp_path: Path) -> None:
    """``sp`` gloo ranks share one row (2: the tiny models' 2 key / 4 value heads; 4: the same
    shapes with 4 / 8), at lengths of several 64-token chunks, one of them odd; the loss, the aux
    loss and every gradient equal one process's."""
    out = tmp_path / "report.json"
    torchrun("-m", "tests.test_train_sp_hybrid", str(out), ranks=sp, timeout=600)
    report = json.loads(out.read_text())
    lengths = LENGTHS if sp == 2 else LENGTHS_SP4
    assert set(report) == set(lengths)
    for name, r in report.items():
        padded = -(-lengths[name] // sp) * sp  # shard_sequence pads the row to a multiple of sp
        assert r["linear_layers_wrapped"] == 1 and r["tokens"] == lengths[name] and r["sp"] == sp and r["padded"] == padded
        assert abs(r["loss_sp"] - r["loss_single"]) < LOSS_TOL, (name, r)
        assert r["aux_sp"] == pytest.approx(r["aux_single"], abs=LOSS_TOL)
        assert r["grad_mismatches"] == [], (name, r["grad_mismatches"][:5])
        assert r["grads_compared"] == r["grads_total"] > 20
        # Each rank alone holds only part of the gradient: the exchange carried the rest.
        assert r["rank0_alone_max_error"] > 1e-4


@pytest.mark.slow  # torchrun starts two DeepSpeed processes
def test_train_sp2_zero3_end_to_end_matches_one_process(tmp_path: Path) -> None:
    """``relearn train --sp 2 --zero 3`` on the tiny Qwen3.5-MoE (real vocabulary): every step's
    loss equals the single process taking the same rows (steps after the first depend on the
    gradients of the ones before), and the model is saved."""
    from tests.test_train_deepspeed import assert_close

    data = write_dataset(tmp_path / "data", random_rows(4, seed=47, lengths=(70, 140)))
    common = dict(tiny="qwen3.5-moe", epochs=1, lr=5e-3, warmup=1, chunk=8, ctx=256, progress=False)
    train(TrainOptions(dataset=data, out=tmp_path / "single", grad_accum=2, **common))  # type: ignore[arg-type]
    flags = ["--tiny", "qwen3.5-moe", "--epochs", "1", "--lr", "5e-3", "--warmup", "1", "--chunk", "8", "--ctx", "256"]
    result = torchrun("-m", "relearn.cli.train", str(data), "--out", str(tmp_path / "sp2"), *flags, "--no-progress", "--zero", "3", "--sp", "2", "--grad-accum", "2")  # fmt: skip
    said = " ".join(result.stderr.split())
    assert "sequence parallel 2" in said and "Gated DeltaNet) layers: split by head over the 2 ranks" in said
    ours, ref = read_metrics(tmp_path / "sp2"), read_metrics(tmp_path / "single")
    assert len(ours) == 2
    assert_close([m["loss"] for m in ours], [m["loss"] for m in ref])
    assert abs(ours[1]["loss"] - ref[1]["loss"]) < 1e-4
    assert (tmp_path / "sp2" / "model" / "model.safetensors").is_file()


# --- the released checkpoints' multimodal shape ----------------------------------------------


@pytest.fixture(scope="module")
def mm_long(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny ``Qwen3_5MoeForConditionalGeneration`` start (vision tower, real vocabulary, aux loss
    on) and four rows of 70-140 tokens: each longer than one of the rule's 64-token chunks."""
    from tests.test_train_hybrid import multimodal_folder

    root = tmp_path_factory.mktemp("mm_sp")
    return multimodal_folder(root / "init"), write_dataset(root / "data", random_rows(4, seed=48, lengths=(70, 140)))


def assert_saved_multimodal(init: Path, out: Path) -> None:
    """``out``'s model is the start's class, its vision tower byte for byte the start's, and its
    language model trained."""
    from safetensors.torch import load_file

    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "vision_config" in saved
    before, after = load_file(init / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert before.keys() == after.keys()
    vision = [k for k in before if k.startswith("model.visual.")]
    assert len(vision) > 10
    for k in vision:
        assert before[k].dtype == after[k].dtype and torch.equal(before[k].view(torch.uint8), after[k].view(torch.uint8)), k
    linear = [k for k in before if ".linear_attn." in k]
    assert linear and any(not torch.equal(before[k], after[k]) for k in linear)  # the wrapped layers were trained and saved


@pytest.mark.slow  # three runs with the 248k-token head: ~50 s here
def test_multimodal_pack_equals_unpacked_and_is_saved_multimodal(mm_long: tuple[Path, Path], tmp_path: Path) -> None:
    """``--pack`` on the multimodal start: the packed step's NLL is the unpacked run's over the same
    samples (lr 0; the aux loss is a per-micro-batch statistic, so it is logged but not compared),
    and, trained with a learning rate, the model is saved multimodal with its vision tower intact."""
    init, data = mm_long
    common = dict(dataset=data, init=str(init), epochs=1, chunk=8, ctx=512, progress=False)
    train(TrainOptions(out=tmp_path / "packed", pack=True, lr=0.0, **common))  # type: ignore[arg-type]
    train(TrainOptions(out=tmp_path / "plain", grad_accum=4, lr=0.0, **common))  # type: ignore[arg-type]
    packed, plain = read_metrics(tmp_path / "packed"), read_metrics(tmp_path / "plain")
    assert len(packed) == len(plain) == 1 and packed[0]["trajectories"] == 4, (packed, plain)
    assert abs(packed[0]["nll"] - plain[0]["nll"]) < LOSS_TOL, (packed, plain)
    assert packed[0]["aux_loss"] > 0
    out = tmp_path / "trained"
    train(TrainOptions(out=out, pack=True, lr=5e-3, warmup=1, **common))  # type: ignore[arg-type]
    assert_saved_multimodal(init, out)


@pytest.mark.slow  # torchrun starts two DeepSpeed processes
def test_multimodal_sp2_zero3_matches_one_process(mm_long: tuple[Path, Path], tmp_path: Path) -> None:
    """``relearn train --sp 2 --zero 3`` from the multimodal start: every step's loss, NLL and aux
    loss equal one process taking the same rows, and the gathered model is saved multimodal with
    its vision weights byte-identical."""
    from tests.test_train_deepspeed import assert_close

    init, data = mm_long
    common = dict(init=str(init), epochs=1, lr=5e-3, warmup=1, chunk=8, ctx=256, progress=False)
    train(TrainOptions(dataset=data, out=tmp_path / "single", grad_accum=2, **common))  # type: ignore[arg-type]
    flags = ["--init", str(init), "--epochs", "1", "--lr", "5e-3", "--warmup", "1", "--chunk", "8", "--ctx", "256", "--no-progress"]
    result = torchrun("-m", "relearn.cli.train", str(data), "--out", str(tmp_path / "sp2"), *flags, "--zero", "3", "--sp", "2", "--grad-accum", "2")  # fmt: skip
    said = " ".join(result.stderr.split())
    assert "sequence parallel 2" in said and "split by head over the 2 ranks" in said
    ours, ref = read_metrics(tmp_path / "sp2"), read_metrics(tmp_path / "single")
    assert len(ours) == 2
    for key in ("loss", "nll", "aux_loss"):
        assert_close([m[key] for m in ours], [m[key] for m in ref])
    # The first step is the same weights on the same rows; the second follows one update (AdamW
    # over a 248k-row head), where fp32 sums taken in another order leave ~1e-5 of relative noise.
    assert abs(ours[0]["loss"] - ref[0]["loss"]) < LOSS_TOL, (ours, ref)
    assert abs(ours[1]["loss"] - ref[1]["loss"]) < 2e-5 * abs(ref[1]["loss"]), (ours, ref)
    assert_saved_multimodal(init, tmp_path / "sp2")
    assert_saved_multimodal(init, tmp_path / "single")


def worker(out: Path) -> None:
    """One rank of the two-rank check: the reference on the whole row first (before Ulysses takes
    over sdpa), then the same row half per rank; rank 0 writes the comparison."""
    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, sp = dist.get_rank(), dist.get_world_size()
    makers, lengths = (MODELS, LENGTHS) if sp == 2 else (MODELS_SP4, LENGTHS_SP4)
    models, batches, single = {}, {}, {}
    for name, make in makers.items():
        lm = causal_lm(make())
        models[name] = copy.deepcopy(lm)  # the one sharded (one RossLM per model: each hooks the routers)
        row = sample(lengths[name], 11, name)
        batch = collate([row], [(0,)])
        ross = RossLM(lm, norm="token", chunk=16)
        loss = ross(**ross_inputs(batch, float(row.supervised)))
        loss.backward()
        single[name] = (loss.item(), ross.last_aux, grads(lm))
        batches[name] = (batch, float(row.supervised))

    mpu = None
    report: dict[str, Any] = {}
    for name, lm in models.items():
        if mpu is None:  # the tiny configs share their softmax-attention shape
            mpu = UlyssesSPAttentionHF.register_with_transformers(
                model_name_or_path=lm, core_attn_implementation="sdpa", sequence_parallel_size=sp, micro_batch_size=1,
                seq_length_is_variable=True,
            )  # fmt: skip
        group = mpu.get_sequence_parallel_group()
        wrapped = install(lm, sp=sp, group=group)
        ross = RossLM(lm, norm="token", chunk=16)
        ross.sp, ross.sp_group = sp, group
        batch, denominator = batches[name]
        shard = shard_sequence(batch, sp, rank)
        loss = ross(**ross_inputs(shard, denominator))
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        local = grads(lm)
        summed = {k: g.clone() for k, g in local.items()}
        for g in summed.values():
            dist.all_reduce(g, group=group)
        ref_loss, ref_aux, ref_grads = single[name]
        mismatches = []
        for key, g in ref_grads.items():
            if key not in summed or not torch.allclose(summed[key], g, rtol=GRAD_RTOL, atol=GRAD_ATOL):
                err = float((summed[key] - g).abs().max()) if key in summed else None
                mismatches.append([key, err])
        report[name] = {
            "tokens": batch.input_ids.shape[1], "linear_layers_wrapped": wrapped, "loss_single": ref_loss, "loss_sp": total.item(),
            "sp": sp, "padded": shard.input_ids.shape[1] * sp,
            "aux_single": ref_aux, "aux_sp": ross.last_aux * sp if ross.last_aux is not None else None,
            "grads_total": len(ref_grads), "grads_compared": len(ref_grads.keys() & summed.keys()), "grad_mismatches": mismatches,
            "max_grad_error": max(float((summed[k] - g).abs().max()) for k, g in ref_grads.items() if k in summed),
            "rank0_alone_max_error": max(float((local[k] - g).abs().max()) for k, g in ref_grads.items() if k in local),
        }  # fmt: skip
    if rank == 0:
        out.write_text(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
