"""Mask compile throughput with the built-in qwen3.6 tokenizer, against per-turn re-rendering.

    python bench/bench_masks.py [--tokens 60000] [--trajectories 3]

Pool: generated SWE-style agentic trajectories (one task, then rounds of reasoning,
text, a shell or apply_patch call and its output) of about ``--tokens`` tokens each,
with a few defects per trajectory. Ours: render once, tokenize once with offsets, mask
by character spans (relearn.masks.compile). Baseline: the per-turn approach most trainers use
(render the prefix up to each assistant turn with the generation prompt and the prefix
through that turn, tokenize both, take the difference as the turn's tokens), which
costs O(turns x length). Also prints our time per token at 1/4, 1/2 and the full
length to show that it grows linearly.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.exporters.hf_chat import to_chat_messages  # noqa: E402
from records.review import Defect, Review  # noqa: E402
from records.trajectory import Trajectory  # noqa: E402
from relearn.masks.compile import MaskOptions, compile_trajectory  # noqa: E402
from relearn.masks.tokenizers import load_tokenizer  # noqa: E402

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
            call = {"id": call_id, "function": {"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** Update File: pkg/mod.py\n@@ def f():\n-    return x - 1\n+    return x + 1\n*** End Patch\n"}}}
        else:
            command = f"grep -rn '{rng.choice(WORDS)}' pkg/ | head -{rng.randint(5, 50)}"
            call = {"id": call_id, "function": {"name": "shell", "arguments": {"command": ["bash", "-lc", command], "workdir": "/testbed"}}}
        messages.append(
            {"role": "assistant", "generated": True, "reasoning_content": sentence(rng, rng.randint(40, 120)), "content": sentence(rng, rng.randint(5, 25)), "tool_calls": [call]}
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
        defects.append(Defect(message_index=index, field="reasoning_content", start=start, end=min(end, len(text)), quote=text[start:min(end, len(text))]))
    return Review(trajectory_id=trajectory.id, decision="accept", defects=defects)


def per_turn_baseline(trajectory: Trajectory, tok) -> int:  # noqa: ANN001
    """The usual approach: tokenize the prefix before and through each assistant turn."""
    chat = to_chat_messages(trajectory)
    kwargs = {"preserve_thinking": True}
    mask: list[int] = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        before = tok(tok.apply_chat_template(chat[:i], tokenize=False, add_generation_prompt=True, **kwargs), add_special_tokens=False)["input_ids"]
        through = tok(tok.apply_chat_template(chat[: i + 1], tokenize=False, **kwargs), add_special_tokens=False)["input_ids"]
        mask = mask + [0] * (len(before) - len(mask)) + [1] * (len(through) - len(before))
    return len(mask)


def ours(trajectory: Trajectory, review: Review, tok) -> int:  # noqa: ANN001
    (sample,) = compile_trajectory(trajectory, review, tok, MaskOptions(ctx=10**7))
    return len(sample.input_ids)


def timed(fn, *args) -> tuple[float, int]:  # noqa: ANN001
    start = time.perf_counter()
    tokens = fn(*args)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=60000)
    parser.add_argument("--trajectories", type=int, default=3)
    args = parser.parse_args()
    tok = load_tokenizer("qwen3.6")
    rng = random.Random(0)
    pool = [make_trajectory(rng, args.tokens, seed) for seed in range(args.trajectories)]
    reviews = [review_for(t, rng) for t in pool]

    total_ours = total_base = 0.0
    tokens = 0
    for trajectory, review in zip(pool, reviews, strict=True):
        seconds, n = timed(ours, trajectory, review, tok)
        total_ours += seconds
        tokens += n
        seconds, _ = timed(per_turn_baseline, trajectory, tok)
        total_base += seconds
    turns = sum(1 for m in pool[0].messages if m.role == "assistant")
    print(f"pool: {len(pool)} trajectories, {tokens} tokens ({tokens // len(pool)} each, {turns} assistant turns each)")
    print(f"{'':36s}{'seconds':>9s}{'tokens/s':>12s}")
    print(f"{'relearn masks (render once)':36s}{total_ours:9.2f}{tokens / total_ours:12.0f}")
    print(f"{'per-turn re-render (baseline)':36s}{total_base:9.2f}{tokens / total_base:12.0f}")
    print(f"speed-up: {total_base / total_ours:.1f}x")

    print("\nscaling (one trajectory, ours): length -> microseconds per token")
    for fraction in (4, 2, 1):
        trajectory = make_trajectory(random.Random(1), args.tokens // fraction, 99)
        seconds, n = timed(ours, trajectory, review_for(trajectory, random.Random(2)), tok)
        base_seconds, _ = timed(per_turn_baseline, trajectory, tok)
        print(f"  {n:7d} tokens: ours {seconds / n * 1e6:6.1f} us/token, per-turn baseline {base_seconds / n * 1e6:8.1f} us/token")


if __name__ == "__main__":
    main()
