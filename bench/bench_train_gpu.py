"""The GPU check of issue 44: one training step of a hybrid linear-attention MoE at 65,536 tokens on
one GPU, with transformers' PyTorch reference kernels and with the fast ones, against ``relearn
train --plan``'s prediction.

    python bench/bench_train_gpu.py                 # on a GPU machine (scripts/gpu_check.sh installs the kernels first)
    python bench/bench_train_gpu.py --dry-run       # the shape, the plans and the FLOPs, no model built
    python bench/bench_train_gpu.py --cpu-smoke     # a tiny shape for a few steps on CPU: the same table

The shape: Qwen3.6-35B-A3B's layers as they are (hidden 2,048; Gated DeltaNet 16 key / 32 value
heads of 128; gated attention 16 q / 2 kv heads of 256; experts of 512, top-8, one shared; the
248,320-token vocabulary) with fewer layers and experts, the largest of ``CANDIDATES`` whose plan
(reference kernels, the worse case) fits 90% of the card. It trains as ``relearn train --bf16``
does on one GPU: fp32 weights, bf16 autocast, AdamW, gradient checkpointing, the chunked loss.

Each kernel setting runs in its own process (its own peak; an out-of-memory stops only it). The
reference run hides ``fla`` and ``causal_conv1d`` from transformers before it is imported, so the
same machine gives both.

MFU = model FLOPs per step / step time / the GPU's dense bf16 peak (``PEAK_BF16``), with
model FLOPs = 6 x N_active x tokens (N_active: the weights one token passes through, without the
embedding, experts counted top-k of E) + 6 x supervised x hidden x vocab (the LM head, run only at
supervised positions) + 6 x t^2 x (heads x head_dim) per full-attention layer (causal: half of the
12 t^2 q of QK^T and AV, forward and backward) + 12 x t x nv x dk x dv per Gated DeltaNet layer (the
state's update and read-out per token; the chunk-local terms left out). Gradient checkpointing's
recompute is not counted: it is model FLOPs utilisation, not hardware FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 2**30
# Dense bf16 tensor-core peak (no sparsity), from NVIDIA's data sheets; matched on the device name.
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}
# (layers, experts), largest first: 3 Gated DeltaNet layers to 1 full attention, as Qwen3.6.
CANDIDATES: tuple[tuple[int, int], ...] = ((16, 64), (12, 64), (8, 64), (8, 32), (4, 64), (4, 32), (4, 16))
FIT_SHARE = 0.9  # of the card: the plan is not yet checked on a GPU (this bench is what checks it)
MODES = ("reference", "fast")
SMOKE = dict(tokens=320, steps=2, layers=2, experts=4)  # five 64-token chunks of the rule


def shape_config(layers: int, experts: int, *, tiny: bool = False) -> Any:
    """A Qwen3.5/3.6-MoE text config: Qwen3.6-35B-A3B's layer dimensions (``tiny``: CPU-sized ones)."""
    from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

    if tiny:
        dims = dict(
            vocab_size=6000, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts_per_tok=2, full_attention_interval=2,
        )  # fmt: skip
    else:
        from relearn.train.plan import NAMED_SHAPES

        dims = dict(NAMED_SHAPES["qwen3.6-35b-a3b"][1])
        dims.pop("num_hidden_layers"), dims.pop("num_experts")
    config = Qwen3_5MoeTextConfig(num_hidden_layers=layers, num_experts=experts, **dims)
    config.output_router_logits = True  # the released config's aux loss, as relearn trains it
    return config


def setting(tokens: int, mode: str, share: float, device: str) -> Any:
    from relearn.train.plan import Setting

    # relearn train --bf16 on one GPU: the plain engine (no DeepSpeed), checkpointing, chunk 1024.
    kernels = "fla" if mode == "fast" else "reference"
    return Setting(ctx=tokens, bf16=True, chunk=1024, supervised=share, device=device, linear_kernels=kernels)  # type: ignore[arg-type]


def fit_shape(capacity: int, tokens: int, share: float) -> tuple[int, int]:
    """The largest ``CANDIDATES`` shape whose reference-kernel plan fits ``FIT_SHARE`` of ``capacity``."""
    from relearn.train.plan import estimate, shape_of

    for layers, experts in CANDIDATES:
        shape = shape_of(shape_config(layers, experts), f"{layers}L{experts}E", "bench")
        if estimate(shape, setting(tokens, "reference", share, "cuda")).peak <= FIT_SHARE * capacity:
            return layers, experts
    raise SystemExit(f"no candidate shape fits {capacity / GIB:.0f} GiB at {tokens:,} tokens")


def flops(config: Any, tokens: int, supervised: int) -> dict[str, float]:
    """Model FLOPs of one step (see the module docstring), by part, from the model on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    active = 0.0
    for name, p in model.get_decoder().layers.named_parameters():
        active += p.numel() * (config.num_experts_per_tok / config.num_experts if ".experts." in name else 1)
    kinds = config.layer_types
    q = config.num_attention_heads * config.head_dim
    nv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
    parts = {
        "matmul": 6 * active * tokens,
        "head": 6 * supervised * config.hidden_size * config.vocab_size,
        "attention": 6 * tokens**2 * q * kinds.count("full_attention"),
        "delta rule": 12 * tokens * nv * dk * dv * kinds.count("linear_attention"),
    }
    parts["total"] = sum(parts.values())
    parts["active_parameters"] = active
    parts["parameters"] = float(sum(p.numel() for p in model.parameters()))
    return parts


def sample(tokens: int, share: float, vocab: int, seed: int = 0) -> tuple[Any, Any]:
    """Random ids; a loss mask of alternating context and supervised spans, ``share`` supervised."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, tokens), generator=g)
    span = max(1, min(512, tokens // 8))
    on = max(1, round(span * share / (1 - share))) if share < 1 else tokens
    mask = torch.zeros(1, tokens, dtype=torch.uint8)
    at = span
    while at < tokens:
        mask[0, at : at + on] = 1
        at += on + span
    mask[0, -1] = 1
    return ids, mask


# --- one kernel setting, in its own process ------------------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.mode == "reference":
        # Hidden before transformers imports its Gated DeltaNet module: it binds the kernels then.
        for name in ("fla", "causal_conv1d"):
            sys.modules[name] = None  # type: ignore[assignment]
    import torch

    from relearn.train.engines import PlainEngine
    from relearn.train.kernels import detect
    from relearn.train.model import RossLM, enable_activation_checkpointing
    from relearn.train.options import TrainOptions

    device = torch.device(args.device)
    baseline = _rss()  # on CPU the peak is counted above what the interpreter and its imports hold
    report = detect(linear_attention=True, attn="sdpa", device=device.type, mode="auto")
    used = [k.distribution for k in report.kernels if k.used]
    if args.mode == "fast" and "flash-linear-attention" not in used:
        return {"mode": args.mode, "skipped": f"the fast kernels are not usable here ({report.describe()})"}
    config = shape_config(args.layers, args.experts, tiny=args.tiny)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    with device:
        lm = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    lm.config.use_cache = False
    lm.train()
    enable_activation_checkpointing(lm)
    opts = TrainOptions(dataset=Path("-"), out=Path("-"), tiny="qwen3.5-moe", bf16=True, lr=1e-5, warmup=0, chunk=1024)
    engine = PlainEngine(RossLM(lm, norm="token", chunk=opts.chunk), opts, total_steps=args.steps + 1, device=device)
    ids, mask = sample(args.tokens, args.share, config.vocab_size)
    ids, mask = ids.to(device), mask.to(device)
    supervised = int(mask[0, 1:].sum())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    times, losses = [], []
    for _ in range(args.steps + 1):  # the first warms up (allocator, Triton autotuning) and is not timed
        sync()
        started = time.perf_counter()
        loss = engine.forward(input_ids=ids, loss_mask=mask, denominator=float(supervised))
        engine.backward(loss)
        engine.finish_step()
        sync()
        times.append(time.perf_counter() - started)
        losses.append(float(loss.detach()))
    peak = {}
    if device.type == "cuda":
        peak = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
    else:
        peak = {"rss_above_start": _rss() - baseline}
    timed = times[1:] or times
    return {
        "mode": args.mode, "kernels_used": used, "kernels": report.describe(), "tokens": args.tokens, "supervised": supervised,
        "step_seconds": sorted(timed)[len(timed) // 2], "steps_timed": len(timed), "losses": losses, "peak_bytes": peak,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }  # fmt: skip


def _rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- the parent: shape, plans, the two runs, the table ----------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=65_536, help="tokens of the one training row")
    p.add_argument("--steps", type=int, default=2, help="timed steps per kernel setting, after one warm-up step")
    p.add_argument("--share", type=float, default=0.5, help="share of the row's tokens that are supervised targets")
    p.add_argument("--kernels", choices=("both", *MODES), default="both", help="which kernel settings to run")
    p.add_argument("--layers", type=int, help="decoder layers (default: the largest candidate that fits the card)")
    p.add_argument("--experts", type=int, help="experts per MoE layer (with --layers)")
    p.add_argument("--capacity-gib", type=float, help="the card's memory (default: the GPU's, or 80 GB with --dry-run)")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for all runs together; a run is stopped at what is left")
    p.add_argument("--json", type=Path, help="write the results here too")
    p.add_argument("--dry-run", action="store_true", help="print the shape, the plans and the FLOPs; build no model")
    p.add_argument("--cpu-smoke", action="store_true", help=f"a tiny shape on CPU ({SMOKE}); the same table, no MFU")
    p.add_argument("--worker", choices=MODES, dest="mode", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.tokens, args.steps, args.layers, args.experts = SMOKE["tokens"], SMOKE["steps"], SMOKE["layers"], SMOKE["experts"]
        args.tiny, args.device = True, "cpu"
    if (args.layers is None) != (args.experts is None):
        p.error("give --layers and --experts together")
    if args.tokens < 2 or args.steps < 1 or not 0 < args.share <= 1:
        p.error("--tokens >= 2, --steps >= 1 and 0 < --share <= 1")
    return args


def capacity(args: argparse.Namespace) -> tuple[int, str]:
    if args.capacity_gib:
        return int(args.capacity_gib * GIB), f"{args.capacity_gib:g} GiB (given)"
    import torch

    if torch.cuda.is_available() and not args.cpu_smoke:
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, f"{props.name}, {props.total_memory / GIB:.1f} GiB"
    from relearn.train.plan import CAPACITIES

    return CAPACITIES["80 GB (H100)"], "80 GB (H100), assumed: no GPU here"


def peak_flops(name: str) -> float | None:
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def run_mode(args: argparse.Namespace, mode: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--device", args.device, "--tokens", str(args.tokens)]
    cmd += ["--steps", str(args.steps), "--share", str(args.share), "--layers", str(args.layers), "--experts", str(args.experts)]
    cmd += ["--tiny"] if args.tiny else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout), env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "failed": f"stopped after {timeout:.0f} s (--budget)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        oom = "out of memory" in done.stderr.lower()
        return {"mode": mode, "failed": ("out of memory: " if oom else f"exit {done.returncode}: ") + " | ".join(tail)[-400:]}
    return json.loads(lines[-1])


def table(results: list[dict[str, Any]], plans: dict[str, Any], work: dict[str, float], peak: float | None) -> list[str]:
    head = f"{'kernels':<10} {'used':<26} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9} {'plan GiB':>9} {'meas/plan':>9}"
    rows = [head, "-" * len(head)]
    for r in results:
        plan = plans[r["mode"]].peak
        if "step_seconds" not in r:
            why = r.get("skipped") or r.get("failed")
            rows.append(f"{r['mode']:<10} {'-':<26} not run: {why}   (plan {plan / GIB:.1f} GiB)")
            continue
        s = r["step_seconds"]
        measured = r["peak_bytes"].get("reserved", r["peak_bytes"].get("rss_above_start", 0))
        tflops = work["total"] / s / 1e12
        mfu = f"{work['total'] / s / peak:.1%}" if peak else "n/a"
        used = ", ".join(r["kernels_used"]) or "PyTorch reference"
        rows.append(
            f"{r['mode']:<10} {used[:26]:<26} {s:>8.2f} {r['tokens'] / s:>10,.0f} {tflops:>8.3g} {mfu:>6} "
            f"{measured / GIB:>9.3g} {plan / GIB:>9.3g} {measured / plan:>9.2f}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.mode is not None:
        print(json.dumps(worker(args)), flush=True)
        return 0
    from relearn.train.plan import estimate, shape_of

    started = time.perf_counter()
    card, card_name = capacity(args)
    if args.layers is None:
        args.layers, args.experts = fit_shape(card, args.tokens, args.share)
    config = shape_config(args.layers, args.experts, tiny=args.tiny)
    shape = shape_of(config, f"hybrid MoE {args.layers} layers x {args.experts} experts", "bench/bench_train_gpu.py")
    device = "cpu" if args.cpu_smoke else "cuda"
    plans = {m: estimate(shape, setting(args.tokens, m, args.share, device)) for m in MODES}
    _, mask = sample(args.tokens, args.share, config.vocab_size)
    work = flops(config, args.tokens, int(mask[0, 1:].sum()))
    print(f"card: {card_name}")
    print(
        f"shape: {shape.name}: {shape.parameters / 1e6:,.1f}M parameters, {work['active_parameters'] / 1e6:,.2f}M active per token (no embedding)"
    )
    print(f"row: {args.tokens:,} tokens, {args.share:.0%} supervised; relearn train --bf16 on one GPU (plain engine, checkpointing)")
    print(
        "model FLOPs per step: "
        + ", ".join(f"{k} {v / 1e12:,.4g} T" for k, v in work.items() if k not in ("active_parameters", "parameters"))
    )
    for m, plan in plans.items():
        print(f"plan ({m} kernels): {plan.peak / GIB:.2f} GiB peak ({plan.peak_phase}); fits this card: {plan.peak <= card}")
    if args.dry_run:
        return 0
    modes = MODES if args.kernels == "both" else (args.kernels,)
    results = []
    for mode in modes:
        left = args.budget - (time.perf_counter() - started)
        results.append(run_mode(args, mode, left))
        print(f"{mode}: {json.dumps(results[-1])}", flush=True)
    name = next((r["device_name"] for r in results if "device_name" in r), "")
    peak = peak_flops(name) if not args.cpu_smoke else None
    print(
        f"\nMFU over {name or 'the device'}'s dense bf16 peak: {f'{peak / 1e12:,.0f} TFLOP/s' if peak else 'unknown (CPU or an unlisted GPU)'}"
    )
    print("\n".join(table(results, plans, work, peak)))
    if args.cpu_smoke:
        print("(CPU smoke: the interpreter's own allocations dwarf a tiny model, so meas/plan checks nothing here)")
    if args.json:
        payload = {"card": card_name, "shape": shape.name, "flops": work, "plans_gib": {m: p.peak / GIB for m, p in plans.items()}}
        args.json.write_text(json.dumps({**payload, "results": results, "peak_bf16": peak}, indent=1))
    return 0 if any("step_seconds" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
