"""Mask compile throughput end to end with the built-in qwen3.6 tokenizer, against the
tokenizer's own speed and against per-turn re-rendering.

    python bench/bench_masks.py [--tokens 60000] [--trajectories 16] [--baseline-trajectories 2]

Pool: generated SWE-style agentic trajectories (one task, then rounds of reasoning, text,
a shell or apply_patch call and its output) of about ``--tokens`` tokens each, with a few
defects per trajectory, written to a pool file and a review file.

- ``relearn masks``: what the command runs (``relearn.masks.shards.build_dataset``), from
  the files on disk to the Parquet shards and statistics: read and validate the records,
  render once, tokenize once with offsets (on a thread per core while the next trajectories
  render), mask by character spans, VALIDATE, write.
- the limit: the HF fast tokenizer alone encoding the same rendered texts with offsets
  (``tokenizer(text, return_offsets_mapping=True)``), nothing else. The ratio of the two
  throughputs is the figure to compare; absolute speeds vary with this machine's load.
- per-turn re-render: the approach most trainers use (render the prefix up to each
  assistant turn with the generation prompt and the prefix through that turn, tokenize
  both, take the difference), O(turns x length), on the first trajectories only.

Also prints the time per token at 1/4, 1/2 and the full length (one trajectory compiled,
render to mask), to show that it grows linearly, and the peak memory of the masks operation
(``relearn.ops.masks.run_masks``: `relearn masks` and the pipeline's masks stages) on a pool of
N trajectories and on one of 4N (``--memory-pool N``, default one shard of ``--memory-shard``
records), to show that memory holds one shard and the reviews' offsets whatever the pool's size:

    python bench/bench_masks.py --memory-only --tokens 4000 --memory-shard 64 --memory-pool 500
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envs.executor import LocalBackend
from harness.exporters.hf_chat import to_chat_messages
from records.pools import write_atomic
from records.review import Defect, Review
from records.trajectory import Trajectory
from relearn.masks.compile import CompileOptions, compile_trajectory
from relearn.masks.shards import build_dataset, load_reviews
from relearn.masks.template import render
from relearn.masks.tokenizers import load_tokenizer

WORDS = "the a function returns value when test fails because index off by one list parse token file path error we should check".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_trajectory(rng: random.Random, target_tokens: int, seed: int) -> Trajectory:
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent working in /testbed."},
        {"role": "user", "content": f"Task {seed}: " + sentence(rng, 60)},
    ]
    approx = 200
    turn = 0
    while approx < target_tokens:
        call_id = f"call_{turn}"
        if turn % 3 == 2:
            call = {
                "id": call_id,
                "function": {
                    "name": "apply_patch",
                    "arguments": {
                        "input": "*** Begin Patch\n*** Update File: pkg/mod.py\n@@ def f():\n-    return x - 1\n+    return x + 1\n*** End Patch\n"
                    },
                },
            }
        else:
            command = f"grep -rn '{rng.choice(WORDS)}' pkg/ | head -{rng.randint(5, 50)}"
            call = {"id": call_id, "function": {"name": "shell", "arguments": {"command": ["bash", "-lc", command], "workdir": "/testbed"}}}
        messages.append(
            {
                "role": "assistant",
                "generated": True,
                "reasoning_content": sentence(rng, rng.randint(40, 120)),
                "content": sentence(rng, rng.randint(5, 25)),
                "tool_calls": [call],
            }
        )
        output = "\n".join(f"pkg/mod{rng.randint(0, 9)}.py:{rng.randint(1, 500)}: {sentence(rng, 10)}" for _ in range(rng.randint(5, 25)))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        approx += 480  # tokens a round adds, roughly
        turn += 1
    messages.append({"role": "assistant", "generated": True, "content": "Done: " + sentence(rng, 20)})
    return Trajectory.model_validate({"id": f"bench-{seed}", "messages": messages, "outcome": {"resolved": True}})


def review_for(trajectory: Trajectory, rng: random.Random) -> Review:
    defects = []
    assistant = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.reasoning_content]
    for index in rng.sample(assistant, min(5, len(assistant))):
        text = trajectory.messages[index].reasoning_content or ""
        start = rng.randint(0, len(text) // 2)
        end = start + rng.randint(5, 40)
        defects.append(
            Defect(
                message_index=index,
                field="reasoning_content",
                start=start,
                end=min(end, len(text)),
                quote=text[start : min(end, len(text))],
            )
        )
    return Review(trajectory_id=trajectory.id, decision="accept", defects=defects)


def per_turn_baseline(trajectory: Trajectory, tok) -> int:  # noqa: ANN001
    """The usual approach: tokenize the prefix before and through each assistant turn."""
    chat = to_chat_messages(trajectory)
    kwargs = {"preserve_thinking": True}
    mask: list[int] = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        before = tok(tok.apply_chat_template(chat[:i], tokenize=False, add_generation_prompt=True, **kwargs), add_special_tokens=False)[
            "input_ids"
        ]
        through = tok(tok.apply_chat_template(chat[: i + 1], tokenize=False, **kwargs), add_special_tokens=False)["input_ids"]
        mask = mask + [0] * (len(before) - len(mask)) + [1] * (len(through) - len(before))
    return len(mask)


def ours(trajectory: Trajectory, review: Review, tok) -> int:  # noqa: ANN001
    (sample,) = compile_trajectory(trajectory, review, tok, CompileOptions(ctx=10**7))
    return len(sample.input_ids)


def timed(fn, *args) -> tuple[float, int]:  # noqa: ANN001
    start = time.perf_counter()
    tokens = fn(*args)
    return time.perf_counter() - start, tokens


def end_to_end(pool: list[Trajectory], reviews: list[Review], tok, root: Path) -> tuple[float, int]:  # noqa: ANN001
    """``relearn masks`` from the files: seconds and tokens written."""
    write_atomic(root / "pool.jsonl", pool)
    (root / "reviews.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in reviews))
    shutil.rmtree(root / "dataset", ignore_errors=True)
    start = time.perf_counter()
    errors: list[str] = []
    stats, _reused = build_dataset(
        root / "pool.jsonl", load_reviews(root / "reviews.jsonl", errors), tok, "qwen3.6", CompileOptions(ctx=10**7), root / "dataset"
    )
    seconds = time.perf_counter() - start
    assert stats["trajectories_out"] == len(pool) and not errors, stats["rejected"]
    return seconds, stats["tokens"]["total"]


def with_workers(pool: list[Trajectory], reviews: list[Review], tok, root: Path, workers: int, shard_size: int) -> tuple[float, float, int]:  # noqa: ANN001
    """``relearn masks --workers N`` from the files: seconds cold (worker processes started,
    each loading the tokenizer, as one command pays) and warm (the same pool of workers
    again), and tokens written."""
    write_atomic(root / "pool.jsonl", pool)
    (root / "reviews.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in reviews))
    errors: list[str] = []
    loaded = load_reviews(root / "reviews.jsonl", errors)
    times = []
    backend = LocalBackend(workers, processes=True) if workers > 1 else None
    try:
        for _run in range(2):
            shutil.rmtree(root / "dataset", ignore_errors=True)
            start = time.perf_counter()
            stats, _reused = build_dataset(
                root / "pool.jsonl",
                loaded,
                tok,
                "qwen3.6",
                CompileOptions(ctx=10**7),
                root / "dataset",
                shard_size=shard_size,
                backend=backend,
            )
            times.append(time.perf_counter() - start)
    finally:
        if backend is not None:
            backend.close()
    assert stats["trajectories_out"] == len(pool) and not errors, stats["rejected"]
    return times[0], times[1], stats["tokens"]["total"]


def peak_rss(pool: list[Trajectory], reviews: list[Review], shard_size: int, root: Path) -> tuple[int, int]:
    """Peak resident memory of the masks operation (``relearn.ops.masks.run_masks``, what
    `relearn masks` and the pipeline's masks stages run) on this pool, in a process of its own,
    and the pool's size."""
    write_atomic(root / "mem.jsonl", pool)
    (root / "mem-reviews.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in reviews))
    shutil.rmtree(root / "mem-dataset", ignore_errors=True)
    run = (
        "import resource, sys; from pathlib import Path; from relearn.ops.masks import run_masks; from relearn.verbs.masks import MasksOptions; "
        "p = Path(sys.argv[1]); run_masks(MasksOptions(pool=p / 'mem.jsonl', output=p / 'mem-dataset', reviews=p / 'mem-reviews.jsonl', "
        "shard_size=int(sys.argv[2]), ctx=10**7)); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    result = subprocess.run([sys.executable, "-c", run, str(root), str(shard_size)], check=True, capture_output=True, text=True)
    return int(result.stdout.strip().splitlines()[-1]) * 1024, (root / "mem.jsonl").stat().st_size


def tokenizer_alone(pool: list[Trajectory], tok, *, batched: bool = False) -> tuple[float, int]:  # noqa: ANN001
    """The HF fast tokenizer encoding the rendered texts with offsets, and nothing else: one
    text per call, or (``batched``) all in one call, spread over every core."""
    texts = [render(t, tok, template_kwargs={"preserve_thinking": True}).text for t in pool]
    start = time.perf_counter()
    if batched:
        tokens = sum(len(ids) for ids in tok(texts, add_special_tokens=False, return_offsets_mapping=True)["input_ids"])
    else:
        tokens = sum(len(tok(text, add_special_tokens=False, return_offsets_mapping=True)["input_ids"]) for text in texts)
    return time.perf_counter() - start, tokens


def speed(args: argparse.Namespace, pool: list[Trajectory], reviews: list[Review], tok, root: Path) -> None:  # noqa: ANN001
    """Throughput against the tokenizer alone and the per-turn baseline, and the scaling in length."""
    # Warm: once per process, the template compiles and the tokenizer's fingerprint (a hash of its
    # serialised vocabulary, 0.35 s) is worked out; `relearn masks` pays both once per command.
    end_to_end(pool[:1], reviews[:1], tok, root)
    ours_s, tokens = end_to_end(pool, reviews, tok, root)
    limit_s, limit_tokens = tokenizer_alone(pool, tok)
    batch_s, batch_tokens = tokenizer_alone(pool, tok, batched=True)
    assert limit_tokens == batch_tokens == tokens, (limit_tokens, batch_tokens, tokens)
    few = pool[: args.baseline_trajectories]
    base_s = sum(timed(per_turn_baseline, t, tok)[0] for t in few)
    base_tokens = sum(ours(t, r, tok) for t, r in zip(few, reviews, strict=False))
    turns = sum(1 for m in pool[0].messages if m.role == "assistant")
    print(f"pool: {len(pool)} trajectories, {tokens} tokens ({tokens // len(pool)} each, {turns} assistant turns each)")
    print(f"{'':52s}{'seconds':>9s}{'tokens/s':>12s}")
    print(f"{'relearn masks, end to end (files -> shards)':52s}{ours_s:9.2f}{tokens / ours_s:12.0f}")
    print(f"{'HF fast tokenizer with offsets alone, one text a call':52s}{limit_s:9.2f}{tokens / limit_s:12.0f}")
    print(f"{'HF fast tokenizer with offsets alone, one batch call':52s}{batch_s:9.2f}{tokens / batch_s:12.0f}")
    against_baseline = ""
    if few:
        print(f"{f'per-turn re-render ({len(few)} trajectories)':52s}{base_s:9.2f}{base_tokens / base_s:12.0f}")
        against_baseline = f"; {tokens / ours_s / (base_tokens / base_s):.1f}x the per-turn baseline"
    print(
        f"relearn masks runs at {limit_s / ours_s:.0%} of the tokenizer's throughput one text a call, {batch_s / ours_s:.0%} of its batch throughput"
        + against_baseline
    )

    print("\nscaling (one trajectory compiled): length -> microseconds per token")
    for fraction in (4, 2, 1):
        trajectory = make_trajectory(random.Random(1), args.tokens // fraction, 99)
        seconds, n = timed(ours, trajectory, review_for(trajectory, random.Random(2)), tok)
        print(f"  {n:7d} tokens: {seconds / n * 1e6:6.2f} us/token")


def memory(args: argparse.Namespace, root: Path) -> None:
    """Peak RSS of the ``relearn masks`` command (``relearn.ops.masks.run_masks``) on N and 4N
    trajectories: memory holds one shard and the reviews' offsets, whatever the pool's size."""
    count = args.memory_pool or args.memory_shard
    print(f"\npeak memory of `relearn masks` (--shard-size {args.memory_shard}, trajectories of ~{args.tokens} tokens)")
    rng = random.Random(3)
    big = [make_trajectory(rng, args.tokens, 1000 + seed) for seed in range(4 * count)]
    big_reviews = [review_for(t, rng) for t in big]
    figures = []
    for n in (count, 4 * count):
        rss, size = peak_rss(big[:n], big_reviews[:n], args.memory_shard, root)
        figures.append(rss)
        print(f"  {n:6d} trajectories, pool of {size / 1e6:7.1f} MB: peak RSS {rss / 1e6:6.0f} MB")
    print(f"  4N / N: {figures[1] / figures[0]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=60000)
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--baseline-trajectories", type=int, default=2, help="trajectories the slow per-turn baseline compiles")
    parser.add_argument("--memory-shard", type=int, default=16, help="records per shard in the memory run (0: skip it)")
    parser.add_argument(
        "--workers", type=int, default=0, help="also compare --workers 1 with N worker processes, shards of --trajectories/(2N) (0: skip)"
    )
    parser.add_argument("--workers-only", action="store_true", help="only the --workers comparison")
    parser.add_argument(
        "--memory-pool", type=int, default=0, help="trajectories N of the smaller memory run, the larger has 4N (default: --memory-shard)"
    )
    parser.add_argument("--memory-only", action="store_true", help="only the memory runs")
    args = parser.parse_args()
    tok = load_tokenizer("qwen3.6")
    rng = random.Random(0)
    pool = [make_trajectory(rng, args.tokens, seed) for seed in range(args.trajectories)]
    reviews = [review_for(t, rng) for t in pool]
    root = Path(tempfile.mkdtemp(prefix="relearn-bench-masks-"))
    if args.workers:
        shard = max(1, len(pool) // (2 * args.workers))
        print(f"relearn masks --workers: {len(pool)} trajectories of ~{args.tokens} tokens, shards of {shard}")
        end_to_end(pool[:1], reviews[:1], tok, root)  # warm this process's template
        one_cold, one_warm, tokens = with_workers(pool, reviews, tok, root, 1, shard)
        many_cold, many_warm, many_tokens = with_workers(pool, reviews, tok, root, args.workers, shard)
        assert many_tokens == tokens
        print(f"{'':40s}{'cold s':>9s}{'tokens/s':>11s}{'warm s':>9s}{'tokens/s':>11s}")
        print(f"{'1 process (today)':40s}{one_cold:9.2f}{tokens / one_cold:11.0f}{one_warm:9.2f}{tokens / one_warm:11.0f}")
        print(
            f"{f'{args.workers} worker processes':40s}{many_cold:9.2f}{tokens / many_cold:11.0f}{many_warm:9.2f}{tokens / many_warm:11.0f}"
        )
        print(f"speed-up: {one_cold / many_cold:.2f}x cold (what one command gets), {one_warm / many_warm:.2f}x warm")
        if args.workers_only:
            shutil.rmtree(root, ignore_errors=True)
            return
    try:
        if not args.memory_only:
            speed(args, pool, reviews, tok, root)
        if args.memory_shard:
            memory(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
