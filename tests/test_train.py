"""The trainer on CPU with tiny random models and the real 248,320-token vocabulary.

The loss tests compare the chunked, supervised-positions-only loss with a full-logits
reference (``model(input_ids).logits`` + cross-entropy over the supervised targets, same
normalisation); the run tests drive ``relearn train`` end to end, resume included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from relearn.masks.rows import SCHEMA, ShardRow
from relearn.train.checkpoints import read_metrics, step_at
from relearn.train.data import collate, load_samples, shard_sequence
from relearn.train.loop import train
from relearn.train.loss import masked_loss, step_denominator
from relearn.train.model import QWEN_VOCAB, RossLM, build_model, enable_activation_checkpointing
from relearn.train.options import TrainOptions

ROOT = Path(__file__).resolve().parent.parent
VOCAB_USED = 5000  # token ids drawn below this; the model still has the full vocabulary


def write_dataset(path: Path, rows: list[tuple[list[int], list[int]]]) -> Path:
    """A shard with relearn.masks.shards's schema; rows are (input_ids, loss_mask)."""
    path.mkdir(parents=True, exist_ok=True)
    records = [
        {
            "sample_id": f"s{i}",
            "trajectory_id": f"t{i}",
            "input_ids": ids,
            "loss_mask": mask,
            "n_tokens": len(ids),
            "eligible": sum(mask),
            "excluded": 0,
            "supervised": sum(mask),
            "ter": 0.0,
            "mode": "ross",
        }  # fmt: skip
        for i, (ids, mask) in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(records, schema=SCHEMA), path / "shard-00000.parquet")
    return path


def random_rows(n: int, seed: int, lengths: tuple[int, int] = (16, 40), density: float = 0.5) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        length = int(rng.integers(*lengths))
        ids = rng.integers(0, VOCAB_USED, length).tolist()
        mask = (rng.random(length) < density).astype(int).tolist()
        mask[-1] = 1  # at least one supervised target
        rows.append((ids, mask))
    return rows


@pytest.fixture(scope="module")
def lm() -> torch.nn.Module:
    model = build_model(tiny="qwen3", seed=0)
    model.train()
    return model


def reference_loss(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, norm: str, targets: torch.Tensor | None = None
) -> torch.Tensor:
    """Full logits, then cross-entropy over the supervised targets: the obvious (memory-hungry) way."""
    targets = ids if targets is None else targets
    logits = model(input_ids=ids).logits.float()  # [B, S, V]
    nll = -F.log_softmax(logits[:, :-1], dim=-1).gather(-1, targets[:, 1:, None])[..., 0]
    sel = mask[:, 1:].float()
    if norm == "token":
        return (nll * sel).sum() / sel.sum()
    per = (nll * sel).sum(1) / sel.sum(1).clamp(min=1)
    return per[sel.sum(1) > 0].mean()


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def grad_norm(g: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in g.values())))


def batch_of(rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows], dtype=torch.uint8)
    return ids, mask


@pytest.mark.parametrize("norm", ["trajectory", "token"])
def test_chunked_loss_equals_full_logits_reference(lm: torch.nn.Module, norm: str) -> None:
    rows = random_rows(3, seed=1, lengths=(40, 41), density=0.3)
    rows[1] = (rows[1][0], [1] * 40)  # different supervised counts per trajectory
    ids, mask = batch_of(rows)
    ross = RossLM(lm, norm=norm, chunk=7)  # a chunk size that does not divide the count
    loss = ross(ids, mask)
    loss.backward()
    ours = grads(lm)
    ref = reference_loss(lm, ids, mask, norm)
    ref.backward()
    theirs = grads(lm)
    assert abs(loss.item() - ref.item()) < 1e-5
    assert abs(grad_norm(ours) - grad_norm(theirs)) / grad_norm(theirs) < 1e-5
    assert ours.keys() == theirs.keys()
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"):
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-3, atol=1e-5)


def test_chunked_loss_with_activation_checkpointing_matches(lm: torch.nn.Module) -> None:
    model = build_model(tiny="qwen3", seed=0)
    enable_activation_checkpointing(model)
    model.train()
    ids, mask = batch_of(random_rows(2, seed=2, lengths=(32, 33)))
    plain = RossLM(lm, chunk=5)(ids, mask)
    plain.backward()
    g_plain = grads(lm)
    ckpt = RossLM(model, chunk=5)(ids, mask)
    ckpt.backward()
    g_ckpt = grads(model)
    assert abs(plain.item() - ckpt.item()) < 1e-6
    assert abs(grad_norm(g_plain) - grad_norm(g_ckpt)) / grad_norm(g_plain) < 1e-5


def test_only_the_loss_mask_selects_targets(lm: torch.nn.Module) -> None:
    """Targets at unsupervised positions are never read (loss and gradients identical, bit for
    bit), while the tokens there stay in the input as context (changing them changes the loss)."""
    ids, mask = batch_of(random_rows(2, seed=3, lengths=(36, 37), density=0.4))
    ross = RossLM(lm, chunk=8)
    loss_a = ross(ids, mask, targets=ids)
    loss_a.backward()
    g_a = grads(lm)
    scrambled = ids.clone()
    unsupervised = mask == 0
    scrambled[unsupervised] = torch.randint(0, QWEN_VOCAB, (int(unsupervised.sum()),))
    loss_b = ross(ids, mask, targets=scrambled)
    loss_b.backward()
    g_b = grads(lm)
    assert loss_a.item() == loss_b.item()
    for name in g_a:
        assert torch.equal(g_a[name], g_b[name]), name
    # The same change made to the *inputs* changes the context, hence the loss: unselected
    # tokens are kept in the sequence, not dropped.
    with torch.no_grad():
        changed_context = ross(scrambled, mask)
    assert abs(changed_context.item() - loss_a.item()) > 1e-4
    # And the HF path with -100 labels at the unsupervised positions agrees (token mean).
    labels = ids.clone()
    labels[unsupervised] = -100
    with torch.no_grad():
        hf = lm(input_ids=ids, labels=labels).loss
        ours_token = RossLM(lm, norm="token")(ids, mask)
    assert abs(hf.item() - ours_token.item()) < 1e-5


def test_trajectory_and_token_normalisation(lm: torch.nn.Module) -> None:
    short, long = random_rows(2, seed=4, lengths=(40, 41))
    short = (short[0], [0] * 36 + [1] * 4)  # 4 supervised targets
    long = (long[0], [0] * 4 + [1] * 36)  # 36
    ids, mask = batch_of([short, long])
    with torch.no_grad():
        logits = lm(input_ids=ids).logits.float()
        nll = -F.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]
        sums, counts = nll.sum(1), mask[:, 1:].sum(1).float()
        per_trajectory = RossLM(lm, norm="trajectory")(ids, mask).item()
        per_token = RossLM(lm, norm="token")(ids, mask).item()
    assert counts.tolist() == [4.0, 36.0]
    assert abs(per_trajectory - (sums[0] / 4 + sums[1] / 36).item() / 2) < 1e-5  # each trajectory weighs the same
    assert abs(per_token - (sums.sum() / 40).item()) < 1e-5  # each token weighs the same
    assert abs(per_trajectory - per_token) > 1e-4
    # Gradient accumulation: micro-batches divided by the *step's* denominator add up to the step's loss.
    for norm, expected in (("trajectory", per_trajectory), ("token", per_token)):
        denominator = step_denominator([4, 36], norm)  # type: ignore[arg-type]
        with torch.no_grad():
            parts = [RossLM(lm, norm=norm)(ids[i : i + 1], mask[i : i + 1], denominator=denominator).item() for i in range(2)]  # type: ignore[arg-type]
        assert abs(sum(parts) - expected) < 1e-5


def test_all_masked_sequence_gives_finite_loss_and_gradient(lm: torch.nn.Module) -> None:
    ids, mask = batch_of(random_rows(2, seed=5, lengths=(24, 25)))
    empty = torch.zeros_like(mask)
    for norm in ("trajectory", "token"):
        loss = RossLM(lm, norm=norm)(ids, empty)  # type: ignore[arg-type]
        assert torch.isfinite(loss) and loss.item() == 0.0
        loss.backward()  # no "does not require grad" error: the zero is connected to the graph
        g = grads(lm)
        assert all(torch.isfinite(t).all() for t in g.values())
    # One unsupervised trajectory beside a supervised one: it is left out of the normaliser.
    mixed = mask.clone()
    mixed[0] = 0
    with torch.no_grad():
        both = RossLM(lm)(ids, mixed).item()
        alone = RossLM(lm)(ids[1:], mask[1:]).item()
    assert abs(both - alone) < 1e-5


def _samples(rows: list[tuple[list[int], list[int]]]) -> list[ShardRow]:
    return [ShardRow(f"s{i}", f"t{i}", np.array(ids, dtype=np.int32), np.array(m, dtype=np.uint8)) for i, (ids, m) in enumerate(rows)]


def _run(ross: RossLM, batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return ross(
        batch.input_ids, batch.loss_mask, segments=batch.segments, n_segments=batch.n_segments, docs=batch.docs,
        position_ids=batch.position_ids, packed=batch.packed,
    )  # fmt: skip


@pytest.mark.parametrize("norm", ["trajectory", "token"])
def test_packing_keeps_trajectories_apart(lm: torch.nn.Module, norm: str) -> None:
    rows = random_rows(3, seed=6, lengths=(12, 30))
    samples = _samples(rows)
    ross = RossLM(lm, norm=norm, chunk=6)  # type: ignore[arg-type]
    with torch.no_grad():
        separate = [_run(ross, collate(samples, [(i,)])).item() for i in range(3)]
        packed_batch = collate(samples, [(0, 1, 2)])
        packed = _run(ross, packed_batch).item()
        # Without the block-diagonal mask the later trajectories would see the earlier ones.
        leaky = ross(packed_batch.input_ids, packed_batch.loss_mask, segments=packed_batch.segments, n_segments=3).item()
        padded = _run(ross, collate(samples, [(0,), (1,), (2,)])).item()  # three rows of different lengths
    counts = [s.supervised for s in samples]
    if norm == "trajectory":
        expected = sum(separate) / 3
    else:
        expected = sum(loss * n for loss, n in zip(separate, counts, strict=True)) / sum(counts)
    assert packed_batch.packed and packed_batch.position_ids is not None
    assert packed_batch.position_ids[0, len(rows[0][0])].item() == 0  # positions restart
    assert abs(packed - expected) < 1e-5
    assert abs(padded - expected) < 1e-5
    assert abs(leaky - expected) > 1e-4


@pytest.mark.parametrize("norm", ["trajectory", "token"])
def test_sequence_parallel_shards_add_up_to_the_whole(lm: torch.nn.Module, norm: str) -> None:
    """What each Ulysses rank computes on its shard (targets shifted before cutting, whole
    per-trajectory counts) sums to the unsharded loss. The hidden states are computed whole
    here; tests/test_train_deepspeed.py runs the real thing over 2 processes."""
    samples = _samples(random_rows(2, seed=12, lengths=(21, 40)))
    batch = collate(samples, [(0,), (1,)])
    ross = RossLM(lm, norm=norm, chunk=4)  # type: ignore[arg-type]
    with torch.no_grad():
        whole = _run(ross, batch).item()
        sp = 3
        shards = [shard_sequence(batch, sp, r) for r in range(sp)]
        width = shards[0].input_ids.shape[1] * sp
        padded = torch.nn.functional.pad(batch.input_ids, (0, width - batch.input_ids.shape[1]))
        hidden = ross.hidden_states(padded)
        counts = torch.tensor(batch.supervised_per_segment)
        denominator = step_denominator(batch.supervised_per_segment, norm)  # type: ignore[arg-type]
        parts = []
        for r, shard in enumerate(shards):
            per = shard.input_ids.shape[1]
            assert torch.equal(shard.input_ids, padded[:, r * per : (r + 1) * per])
            assert shard.position_ids is not None and shard.position_ids[0, 0].item() == r * per
            h = hidden[:, r * per : (r + 1) * per]
            assert shard.targets is not None
            parts.append(
                masked_loss(
                    h, shard.targets, shard.loss_mask, lm.get_output_embeddings(), norm=norm, segments=shard.segments,  # type: ignore[arg-type]
                    n_segments=shard.n_segments, denominator=denominator, shifted=True, segment_counts=counts,
                ).item()
            )  # fmt: skip
    assert sum(int(s.loss_mask.sum()) for s in shards) == batch.supervised
    assert abs(sum(parts) - whole) < 1e-5


@pytest.mark.parametrize(("tiny", "bf16"), [("qwen3", False), ("qwen3", True), ("qwen3-moe", False), ("qwen3.5-moe", False)])
def test_tiny_models_learn_a_repeated_sample(tmp_path: Path, tiny: str, bf16: bool) -> None:
    data = write_dataset(tmp_path / "data", random_rows(1, seed=7, lengths=(48, 49)))
    opts = TrainOptions(
        dataset=data, out=tmp_path / "run", tiny=tiny, epochs=5, lr=3e-3, warmup=0, chunk=16, ctx=128, bf16=bf16, progress=False
    )
    summary = train(opts)
    losses = [m["loss"] for m in read_metrics(tmp_path / "run")]
    assert summary.steps == 5 and len(losses) == 5
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(np.isfinite(losses))


def test_data_refuses_long_samples_and_lists_them(tmp_path: Path) -> None:
    rows = random_rows(3, seed=8, lengths=(20, 30))
    rows.append(([1] * 100, [1] * 100))  # longer than --ctx below
    rows.append(([2] * 10, [0] * 10))  # nothing supervised
    samples, report = load_samples(write_dataset(tmp_path / "data", rows), ctx=64, vocab_size=QWEN_VOCAB)
    assert len(samples) == 3 and report.too_long == 1 and report.unsupervised == 1
    assert any("s3" in p and "longer than --ctx 64" in p and "never cut" in p for p in report.problems)


def _wait_for_steps(out: Path, n: int, proc: subprocess.Popen[str] | None = None, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(read_metrics(out)) < n:
        assert time.monotonic() < deadline, "the run did not reach the expected step in time"
        assert proc is None or proc.poll() is None, proc.communicate()[1][-3000:] if proc else ""
        time.sleep(0.05)


def test_killed_run_resumes_to_the_uninterrupted_losses(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", random_rows(6, seed=9))
    common = [
        "--tiny",
        "qwen3",
        "--epochs",
        "1",
        "--lr",
        "2e-3",
        "--warmup",
        "2",
        "--chunk",
        "8",
        "--ctx",
        "64",
        "--no-progress",
        "--save-every",
        "2",
    ]
    # Uninterrupted: 6 steps, in this process.
    train(
        TrainOptions(
            dataset=data, out=tmp_path / "whole", tiny="qwen3", epochs=1, lr=2e-3, warmup=2, chunk=8, ctx=64, max_steps=6, progress=False
        )
    )
    whole = [m["loss"] for m in read_metrics(tmp_path / "whole")]
    # Interrupted for real: the CLI in a subprocess is SIGKILLed (no cleanup) once step 3 is
    # logged, i.e. after its step-2 checkpoint and possibly while writing the step-4 one.
    split = tmp_path / "split"
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relearn.cli.train", str(data), "--out", str(split), *common, "--max-steps", "6"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_steps(split, 3, proc)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    logged = len(read_metrics(split))
    assert 3 <= logged < 6 and step_at(split) in (2, 4)
    # The same command again (here, in this process): it resumes from the checkpoint, drops the
    # metrics logged after it, and finishes.
    second = _invoke(str(data), "--out", str(split), *common, "--max-steps", "6")
    assert second.exit_code == 0, second.output[-3000:]
    assert "resumed from" in second.text
    metrics = read_metrics(split)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert max(abs(a - m["loss"]) for a, m in zip(whole, metrics, strict=True)) <= 1e-6, (whole, metrics)
    assert [m["lr"] for m in metrics] == [m["lr"] for m in read_metrics(tmp_path / "whole")]

    # The final folder is a Hugging Face model that transformers loads as is, equal to the run's weights.
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(split / "model")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "whole" / "model")
    assert loaded.config.vocab_size == QWEN_VOCAB
    for (name, a), (_, b) in zip(loaded.state_dict().items(), reference.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    run = json.loads((split / "run.json").read_text())
    assert run["finished"] is True and run["global_step"] == 6


def test_max_steps_stop_then_rerun_and_sigterm(tmp_path: Path) -> None:
    """--max-steps stops after a checkpoint and a rerun continues; SIGTERM finishes the step,
    checkpoints and exits 143 (128 + 15), and a rerun continues from there."""
    data = write_dataset(tmp_path / "data", random_rows(6, seed=13))
    run = [str(data), "--out", str(tmp_path / "run"), "--tiny", "qwen3", "--epochs", "1", "--chunk", "8", "--ctx", "64", "--no-progress"]
    first = _invoke(*run, "--max-steps", "1")
    assert first.exit_code == 0 and step_at(tmp_path / "run") == 1
    sender = threading.Thread(target=lambda: (_wait_for_steps(tmp_path / "run", 2), os.kill(os.getpid(), signal.SIGTERM)))
    sender.start()
    stopped = _invoke(*run)
    sender.join()
    assert stopped.exit_code == 128 + signal.SIGTERM, stopped.output[-2000:]
    assert "stopped by signal SIGTERM" in stopped.text
    at = step_at(tmp_path / "run")
    assert 2 <= at < 6 and len(read_metrics(tmp_path / "run")) == at
    last = _invoke(*run)
    assert last.exit_code == 0 and [m["step"] for m in read_metrics(tmp_path / "run")] == [1, 2, 3, 4, 5, 6]


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    import typer

    from relearn.cli.train import register

    app = typer.Typer(add_completion=False)
    register(app)
    result = CliRunner().invoke(app, list(args))
    result.text = " ".join(result.output.split())  # rich wraps long lines; compare words
    return result


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", random_rows(2, seed=10))
    out = str(tmp_path / "run")
    result = _invoke(str(data), "--out", out, "--tiny", "qwen3.5-moe", "--sp", "4")
    assert result.exit_code == 2
    assert "linear-attention (Gated DeltaNet)" in result.text and "2 key and 4 value heads" in result.text
    result = _invoke(str(data), "--out", out, "--tiny", "qwen3", "--sp", "2")
    assert result.exit_code == 2 and "--sp" in result.text
    result = _invoke(str(data), "--out", out, "--tiny", "qwen3", "--loss-norm", "sentence")
    assert result.exit_code == 2
    result = _invoke(str(data), "--out", out)
    assert result.exit_code == 2 and "--init PATH or --tiny" in result.text
    result = _invoke(str(tmp_path / "missing"), "--out", out, "--tiny", "qwen3")
    assert result.exit_code == 2


def test_cli_lists_refused_samples_and_trains_the_rest(tmp_path: Path) -> None:
    rows = random_rows(2, seed=11)
    rows.append(([3] * 80, [1] * 80))
    data = write_dataset(tmp_path / "data", rows)
    run = ["--out", str(tmp_path / "run"), "--tiny", "qwen3", "--ctx", "64", "--no-progress"]
    result = _invoke(str(data), *run, "--epochs", "1", "--tokenizer", "qwen3.6")
    assert result.exit_code == 1, result.output  # done, but an input was refused
    assert "80 tokens is longer than --ctx 64; refused (never cut)" in result.text
    assert len(read_metrics(tmp_path / "run")) == 2
    assert (tmp_path / "run" / "model" / "tokenizer_config.json").exists()  # saved beside the weights
    # Rerunning a finished run does nothing; changing what is trained is refused.
    again = _invoke(str(data), *run, "--epochs", "1")
    assert "already finished" in again.text
    changed = _invoke(str(data), *run, "--epochs", "2")
    assert changed.exit_code == 2 and "different settings (epochs)" in changed.text


def test_a_dataset_of_another_tokenizers_ids_is_refused_before_the_model_is_built(tmp_path: Path) -> None:
    from relearn.masks.shards import vocabulary_fingerprint
    from relearn.masks.tokenizers import load_tokenizer

    data = write_dataset(tmp_path / "data", random_rows(2, seed=12))
    stats = {"tokenizer": "qwen3", "vocabulary_fingerprint": vocabulary_fingerprint(load_tokenizer("qwen3"))}
    (data / "stats.json").write_text(json.dumps(stats))
    run = ["--out", str(tmp_path / "run"), "--tiny", "qwen3", "--ctx", "64", "--no-progress", "--epochs", "1"]
    refused = _invoke(str(data), *run, "--tokenizer", "qwen3.6")
    assert refused.exit_code == 2, refused.output
    assert (
        f"{data}: its token ids are those of qwen3 (relearn masks --tokenizer), not of the tokenizer this run would save with the model (qwen3.6)"
        in refused.text
    )
    assert "give --tokenizer qwen3," in refused.text
    assert not (tmp_path / "run").exists()
    # The same ids with their own tokenizer train (another chat template does not change them),
    # and the model is saved with the template the dataset was rendered with.
    trained = _invoke(str(data), *run, "--tokenizer", "qwen3", "--chat-template", "glm4moe_training")
    assert trained.exit_code == 0, trained.output
    from transformers import AutoTokenizer

    from relearn.masks.tokenizers import resolve_chat_template

    saved = AutoTokenizer.from_pretrained(tmp_path / "run" / "model")
    assert saved.chat_template == resolve_chat_template("glm4moe_training")
