"""The multi-token-prediction layer of a Qwen3.5/3.6 start (``mtp.*``) survives training.

transformers' Qwen3.5/3.6 and Qwen3-Next classes drop ``mtp.*`` at load
(``_keys_to_ignore_on_load_unexpected``), so the trained model would lose what vLLM's MTP
speculative decoding reads. The trainer copies those tensors into ``RUN/model/`` byte for byte,
in their stored dtype, as a shard that the index names. On CPU, with a tiny random
Qwen3.5-MoE text model whose checkpoint also holds an MTP layer of the released shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from relearn.train.loop import train
from relearn.train.model import tiny_config
from relearn.train.options import TrainOptions
from tests.test_train import random_rows, write_dataset

VOCAB = 6000  # random_rows draws ids below 5000; the 248k head is not needed here


def mtp_tensors(config: Any) -> dict[str, torch.Tensor]:
    """An MTP layer named and shaped as in the released checkpoints (what vLLM's Qwen3.5 MTP
    loads): the fc over [embedding; hidden], its two input norms, one full-attention MoE decoder
    layer with one tensor per expert (the checkpoint form, not transformers' fused one), and a
    final norm. bf16, as released, while the start's own weights are fp32: the stored dtype is
    what must come back."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

    torch.manual_seed(7)
    h, inter = config.hidden_size, config.moe_intermediate_size
    full = config.layer_types.index("full_attention")
    layer = Qwen3_5MoeDecoderLayer(config, layer_idx=full).state_dict()
    out = {f"mtp.layers.0.{k}": v for k, v in layer.items() if ".experts." not in k}
    for e in range(config.num_experts):
        for proj, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
            out[f"mtp.layers.0.mlp.experts.{e}.{proj}.weight"] = torch.empty(shape)
    out["mtp.fc.weight"] = torch.empty(h, 2 * h)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{norm}.weight"] = torch.empty(h)
    return {k: torch.randn(v.shape).to(torch.bfloat16) for k, v in out.items()}


def start_with_mtp(folder: Path) -> Path:
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    config = tiny_config("qwen3.5-moe", vocab_size=VOCAB)
    config.mtp_num_hidden_layers = 1  # as the released config.json says it
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    weights = folder / "model.safetensors"
    save_file({**load_file(weights), **mtp_tensors(config)}, weights, metadata={"format": "pt"})
    return folder


def stored(folder: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of a saved folder as its stored dtype and raw bytes, read through the index
    when there is one (as transformers and vLLM do)."""
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    tensors = {}
    for name in files:
        data = (folder / name).read_bytes()
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        for key, spec in header.items():
            if key != "__metadata__":
                start, end = spec["data_offsets"]
                assert key not in tensors, f"{key} stored twice"
                tensors[key] = (spec["dtype"], data[8 + size + start : 8 + size + end])
    return tensors


def loading_info(folder: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    return {k: sorted(v) if isinstance(v, (list, set)) else v for k, v in info.items()}


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return start_with_mtp(tmp_path_factory.mktemp("mtp") / "init")


def test_mtp_weights_are_saved_byte_identical_and_the_model_reloads(init: Path, tmp_path: Path, capsys: Any) -> None:
    data = write_dataset(tmp_path / "data", random_rows(2, seed=56, lengths=(16, 32)))
    out = tmp_path / "run"
    summary = train(TrainOptions(dataset=data, out=out, init=str(init), epochs=1, lr=5e-3, warmup=1, chunk=8, ctx=64, progress=False))
    assert summary.steps == 2
    before, after = stored(init), stored(out / "model")
    mtp = [k for k in before if k.startswith("mtp.")]
    # fc and 3 norms; the layer: q/k/v/o and q/k norms, 2 norms, router, shared expert and its gate; 4 experts x 3
    assert len(mtp) == 4 + 6 + 2 + 1 + 4 + 4 * 3
    n = len(mtp)
    assert f"{n} tensors of --init that Qwen3_5MoeForCausalLM ignores at load (mtp.*)" in " ".join(capsys.readouterr().err.split())

    # The saved folder has every tensor the start had, under the same names; MTP ones as stored.
    assert before.keys() == after.keys()
    for k in mtp:
        assert after[k] == before[k], k  # dtype (BF16) and bytes
    assert {before[k][0] for k in mtp} == {"BF16"} and before["lm_head.weight"][0] == "F32"
    changed = [k for k in before if not k.startswith("mtp.") and after[k] != before[k]]
    assert "lm_head.weight" in changed and any("linear_attn" in k for k in changed) and any(".mlp.gate." in k for k in changed)

    # The index names each tensor's file, its size adds up, and the shards are the standard form.
    index = json.loads((out / "model" / "model.safetensors.index.json").read_text())
    assert index["weight_map"].keys() == before.keys()
    assert index["metadata"]["total_size"] == sum(len(b) for _, b in after.values())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert not (out / "model" / "model.safetensors").exists()  # transformers would read it and skip the index
    assert json.loads((out / "model" / "config.json").read_text())["mtp_num_hidden_layers"] == 1

    # transformers loads the saved folder as it loads the start: the MTP keys ignored, nothing missing.
    info = loading_info(out / "model")
    assert info == loading_info(init) and not info["missing_keys"] and not info["unexpected_keys"]


def test_a_start_without_mtp_is_saved_as_before(tmp_path: Path) -> None:
    """Nothing to carry: one ``model.safetensors``, no index, no extra shard."""
    from transformers import AutoModelForCausalLM

    init = tmp_path / "init"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config("qwen3.5-moe", vocab_size=VOCAB)).save_pretrained(init)
    data = write_dataset(tmp_path / "data", random_rows(1, seed=57, lengths=(16, 24)))
    train(TrainOptions(dataset=data, out=tmp_path / "run", init=str(init), epochs=1, lr=5e-3, chunk=8, ctx=64, progress=False))
    saved = sorted(p.name for p in (tmp_path / "run" / "model").glob("model*"))
    assert saved == ["model.safetensors"]
    assert stored(tmp_path / "run" / "model").keys() == stored(init).keys()


@pytest.mark.slow  # torchrun starts two DeepSpeed processes
def test_zero3_saves_the_mtp_weights_too(init: Path, tmp_path: Path) -> None:
    """Under ZeRO-3 the weights are gathered to rank 0 before the save; the MTP shard is added the same way."""
    from tests.test_train_deepspeed import torchrun

    data = write_dataset(tmp_path / "data", random_rows(2, seed=58, lengths=(16, 24)))
    out = tmp_path / "z3"
    flags = ["--init", str(init), "--epochs", "1", "--lr", "5e-3", "--chunk", "8", "--ctx", "64", "--no-progress", "--zero", "3"]
    result = torchrun(str(data), "--out", str(out), *flags)
    assert "ZeRO-3" in result.stderr and "ignores at load (mtp.*)" in " ".join(result.stderr.split())
    before, after = stored(init), stored(out / "model")
    assert before.keys() == after.keys()
    assert all(after[k] == before[k] for k in before if k.startswith("mtp."))
    assert after["lm_head.weight"] != before["lm_head.weight"]
    assert loading_info(out / "model") == loading_info(init)


def test_the_init_folder_may_be_gone_by_the_save(init: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the save takes from --init (the MTP tensors, the files a server needs) is copied into
    the run folder at the start: a start folder moved or cleaned during a long run loses nothing."""
    import shutil

    import relearn.train.loop as loop

    moved = tmp_path / "init"
    shutil.copytree(init, moved)
    (moved / "LICENSE").write_text("licence text carried with the weights\n")
    real_save = loop.save_final

    def save_after_the_start_is_gone(*args: Any, **kwargs: Any) -> Path:
        shutil.rmtree(moved)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(loop, "save_final", save_after_the_start_is_gone)
    data = write_dataset(tmp_path / "data", random_rows(1, seed=58, lengths=(16, 24)))
    out = tmp_path / "run"
    train(TrainOptions(dataset=data, out=out, init=str(moved), epochs=1, lr=5e-3, chunk=8, ctx=64, progress=False))
    assert not moved.exists()
    before, after = stored(init), stored(out / "model")
    assert before.keys() == after.keys()
    assert all(after[k] == before[k] for k in before if k.startswith("mtp."))
    assert (out / "model" / "LICENSE").read_text() == "licence text carried with the weights\n"
    assert not (out / "model" / "dtypes.json").exists() and not (out / "model" / "ignored-at-load.safetensors").exists()
