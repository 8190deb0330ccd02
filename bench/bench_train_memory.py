"""Peak memory of one optimizer step at long context: our chunked loss against the naive path.

    python bench/bench_train_memory.py [--ctx 65536] [--chunk 1024] [--supervised 0.3] [--bf16]
    python bench/bench_train_memory.py --device cuda        # ~1.7B Qwen3 at 65,536 tokens on one GPU

Model: tiny random Qwen3 (hidden 64, 2 layers) with the real 248,320-token vocabulary, so
the loss, not the body, dominates memory, as it does for Qwen3.6 at 64k. Every run is a
separate subprocess, so a crash or an out-of-memory kill does not stop the bench, and each
peak RSS (``ru_maxrss`` of that process) is its own.

  ours   relearn.train: body -> hidden states, activation checkpointing, LM head + CE only at
         supervised positions in checkpointed chunks; forward + backward + AdamW step at --ctx.
  naive  ``model(input_ids, labels=...)`` (full logits, HF loss) + backward + AdamW step at
         1,024 / 2,048 / 4,096 tokens, stopping at the first length that fails or passes
         --naive-cap-gib (the parent watches the child's RSS and kills it there); then ours
         again at the naive path's longest length, for a same-length comparison.
Printed: peak RSS and supervised tokens/s of each run, the naive path projected to --ctx
(a line through its measured peaks, and the fp32 logits alone: ctx x vocab x 4 bytes), and
the ratio projected-naive / ours.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

VOCAB = 248_320
GIB = 2**30


def make_sample(length: int, share: float, seed: int = 0):  # type: ignore[no-untyped-def]
    """Token ids and a loss mask shaped like an agentic trajectory: context spans (prompt, tool
    output) alternating with supervised spans (assistant turns), ``share`` of tokens supervised."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, length)
    mask = np.zeros(length, dtype=np.uint8)
    at = 0
    while at < length:
        context = int(rng.integers(200, 800))
        turn = max(1, int(context * share / (1 - share))) if share < 1 else length
        at += context
        mask[at : at + turn] = 1
        at += turn
    return ids, mask


def worker(mode: str, length: int, chunk: int, share: float, bf16: bool) -> dict[str, float]:
    import torch

    from relearn.train.model import RossLM, build_model, enable_activation_checkpointing

    torch.manual_seed(0)
    model = build_model(tiny="qwen3", seed=0)
    enable_activation_checkpointing(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    ids_np, mask_np = make_sample(length, share)
    ids = torch.from_numpy(ids_np)[None].long()
    mask = torch.from_numpy(mask_np)[None]
    supervised = int(mask[0, 1:].sum())
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if mode == "ours":
            loss = RossLM(model, norm="trajectory", chunk=chunk)(ids, mask)
        else:
            labels = ids.clone()
            labels[mask == 0] = -100  # HF shifts labels itself: label t is predicted at t-1
            loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    seconds = time.perf_counter() - start
    return {
        "mode": mode, "length": length, "supervised": supervised, "loss": float(loss), "seconds": seconds,
        "supervised_per_s": supervised / seconds, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
    }  # fmt: skip


QWEN3_1P7B = dict(  # Qwen/Qwen3-1.7B's architecture (config.json), random init
    vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=262_144,
)  # fmt: skip
H200_BF16_FLOPS = 989e12  # dense bf16 peak


def device_step(args: argparse.Namespace) -> None:
    """``--device cuda``: one optimizer step of a ~1.7B Qwen3-architecture model at --ctx on one GPU
    (our chunked path only: the naive one needs the full logits), reporting peak GPU memory,
    tokens/s and MFU. A first step warms up kernels and the allocator; the second is measured.
    ``--device cpu --layers 2`` runs the same code small, to check it without a GPU."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from relearn.train.model import RossLM, enable_activation_checkpointing

    device = torch.device(args.device)
    config = Qwen3Config(**{**QWEN3_1P7B, "num_hidden_layers": args.layers, **({"vocab_size": args.vocab} if args.vocab else {})})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn, dtype=torch.float32).to(device)
    model.config.use_cache = False
    enable_activation_checkpointing(model, offload=args.offload_activations)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0, fused=device.type == "cuda")
    ross = RossLM(model, norm="trajectory", chunk=args.chunk)
    ids_np, mask_np = make_sample(args.ctx, args.supervised)
    ids = torch.from_numpy(ids_np % config.vocab_size)[None].long().to(device)
    mask = torch.from_numpy(mask_np)[None].to(device)
    supervised = int(mask[0, 1:].sum())
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = device.type == "cuda" or args.bf16  # bf16 on a CPU without native bf16 is emulated and very slow
    times = []
    for _ in range(2):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = ross(ids, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - start)
    seconds = times[-1]
    # Model FLOPs (no recompute): 6 x matmul parameters per token for the body, the LM head only
    # at supervised positions, and causal attention (q.k and p.v, forward + backward).
    body = params - config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    attn_dim = config.num_attention_heads * config.head_dim
    flops = (
        6 * body * args.ctx
        + 6 * config.vocab_size * config.hidden_size * supervised
        + 6 * config.num_hidden_layers * args.ctx * args.ctx * attn_dim
    )
    peak = (
        torch.cuda.max_memory_allocated() / GIB
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    )
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"{name}: Qwen3 architecture, {params / 1e9:.2f}B parameters ({config.num_hidden_layers} layers, vocab {config.vocab_size:,}), "
        f"{args.ctx:,} tokens, {supervised:,} supervised, chunk {args.chunk}, {'bf16 autocast' if autocast else 'fp32'}, {args.attn}"
    )
    print(f"  step {seconds:.2f} s (warm-up step {times[0]:.2f} s), loss {loss.item():.4f}")
    print(f"  peak {'GPU memory allocated' if device.type == 'cuda' else 'RSS'} {peak:.2f} GiB")
    print(f"  {args.ctx / seconds:,.0f} tokens/s, {supervised / seconds:,.0f} supervised tokens/s")
    print(
        f"  model FLOPs {flops / 1e15:.2f} PFLOP per step -> {flops / seconds / 1e12:.1f} TFLOP/s, "
        f"MFU {flops / seconds / H200_BF16_FLOPS:.1%} of {H200_BF16_FLOPS / 1e12:.0f} TFLOP/s (H200 dense bf16)"
    )


def run_child(mode: str, length: int, args: argparse.Namespace, cap_gib: float | None) -> dict[str, object]:
    """One measurement in a fresh process; killed when its RSS passes ``cap_gib``."""
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        "--length",
        str(length),
        "--chunk",
        str(args.chunk),
        "--supervised",
        str(args.supervised),
    ]
    if args.bf16:
        cmd.append("--bf16")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched_peak = 0.0
    killed = False
    try:
        import psutil

        handle = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = handle.memory_info().rss / GIB
            except psutil.Error:
                break
            watched_peak = max(watched_peak, rss)
            if cap_gib is not None and rss > cap_gib:
                proc.kill()
                killed = True
                break
            time.sleep(0.05)
    except ImportError:
        pass
    stdout, stderr = proc.communicate()
    if killed:
        return {"mode": mode, "length": length, "failed": f"killed at {watched_peak:.1f} GiB RSS (cap {cap_gib} GiB)"}
    if proc.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {"mode": mode, "length": length, "failed": f"exit {proc.returncode}: {tail[0][:200]}"}
    return json.loads(stdout.strip().splitlines()[-1])


def show(result: dict[str, object]) -> None:
    if "failed" in result:
        print(f"  {result['mode']:5s} {result['length']:>7,} tokens  FAILED: {result['failed']}", flush=True)
        return
    print(
        f"  {result['mode']:5s} {result['length']:>7,} tokens  supervised {result['supervised']:>7,}  "
        f"peak RSS {result['peak_rss_gib']:6.2f} GiB  step {result['seconds']:7.1f} s  "
        f"{result['supervised_per_s']:8.1f} supervised tok/s  loss {result['loss']:.4f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=65536)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--supervised", type=float, default=0.3, help="share of tokens that are supervised targets")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--naive-lengths", default="1024,2048,4096")
    parser.add_argument("--naive-cap-gib", type=float, default=16.0, help="kill a naive run whose RSS passes this")
    parser.add_argument("--device", default="", help="cuda: the ~1.7B Qwen3 step on one GPU (see device_step); cpu: the same code, small")
    parser.add_argument("--layers", type=int, default=28, help="--device: decoder layers (28 = Qwen3-1.7B)")
    parser.add_argument("--vocab", type=int, default=0, help="--device: vocabulary (default Qwen3-1.7B's 151,936)")
    parser.add_argument("--attn", default="sdpa", help="--device: attention implementation")
    parser.add_argument("--offload-activations", action="store_true", help="--device cuda: checkpointed activations in host memory")
    parser.add_argument("--worker", choices=["ours", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.chunk, args.supervised, args.bf16)))
        return
    if args.device:
        device_step(args)
        return

    print(
        f"one optimizer step, tiny Qwen3 (hidden 64, 2 layers), vocab {VOCAB:,}, {args.supervised:.0%} supervised, chunk {args.chunk}, {'bf16' if args.bf16 else 'fp32'}"
    )
    ours = run_child("ours", args.ctx, args, None)
    show(ours)
    naive: list[dict[str, object]] = []
    for length in (int(x) for x in args.naive_lengths.split(",")):
        result = run_child("naive", length, args, args.naive_cap_gib)
        show(result)
        if "failed" in result:
            break
        naive.append(result)

    same_length = None
    if naive and int(naive[-1]["length"]) != args.ctx:  # type: ignore[call-overload]
        same_length = run_child("ours", int(naive[-1]["length"]), args, None)  # type: ignore[call-overload]
        show(same_length)

    logits_gb = args.ctx * VOCAB * 4 / 1e9
    print(
        f"\nnaive at {args.ctx:,} tokens: the fp32 logits alone are {args.ctx:,} x {VOCAB:,} x 4 B = {logits_gb:.1f} GB ({logits_gb * 1e9 / GIB:.1f} GiB)"
    )
    projected = logits_gb * 1e9 / GIB
    if naive:
        longest = naive[-1]
        print(f"naive survives up to {longest['length']:,} tokens here (peak RSS {longest['peak_rss_gib']:.2f} GiB)")
    if len(naive) >= 2:
        (x0, y0), (x1, y1) = ((float(r["length"]), float(r["peak_rss_gib"])) for r in naive[-2:])  # type: ignore[arg-type]
        slope = (y1 - y0) / (x1 - x0)
        projected = max(projected, y1 + slope * (args.ctx - x1))
        print(f"naive projected at {args.ctx:,} from its measured peaks: {projected:.0f} GiB ({slope * 1024:.2f} GiB per 1,024 tokens)")
    if "failed" not in ours:
        ratio = projected / float(ours["peak_rss_gib"])  # type: ignore[arg-type]
        verdict = "meets" if float(ours["peak_rss_gib"]) < 6.0 else "MISSES"  # type: ignore[arg-type]
        print(
            f"ours at {args.ctx:,}: {float(ours['peak_rss_gib']):.2f} GiB peak RSS ({verdict} the 6 GiB target), "  # type: ignore[arg-type]
            f"{float(ours['supervised_per_s']):.0f} supervised tok/s"
        )  # type: ignore[arg-type]
        print(f"ratio projected naive / ours at {args.ctx:,}: {ratio:.0f}x")
    if same_length is not None and "failed" not in same_length:
        n = naive[-1]
        print(
            f"at {int(n['length']):,} tokens (both run): peak RSS naive / ours = {float(n['peak_rss_gib']) / float(same_length['peak_rss_gib']):.1f}x, "  # type: ignore[call-overload,arg-type]
            f"supervised tok/s ours / naive = {float(same_length['supervised_per_s']) / float(n['supervised_per_s']):.1f}x"  # type: ignore[arg-type]
        )


if __name__ == "__main__":
    main()
