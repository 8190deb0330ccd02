"""Speed work must not change a byte: pool lines, ids and content hashes from ``relearn
import``, and the shards and statistics from ``relearn masks``, compared with the digests
that the code before the throughput work (commit dea9e36) wrote for the same inputs.

The inputs are the real samples in ``../shared/samples`` and generated ones that reach the
awkward paths: legacy Codex layouts, tool outputs encoded as JSON strings, non-NFC text,
JSON escapes and control characters inside tool-call arguments, context resets, text-protocol
agents, defects in every field. ``python tests/test_outputs_unchanged.py`` rewrites the
golden file, which is only right when the output is meant to change (say why in the commit).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_import import build_corpus  # noqa: E402
from bench.bench_masks import make_trajectory, review_for  # noqa: E402
from harness.import_run import discover, import_files  # noqa: E402
from harness.scripted.codex_sessions import envelope, legacy_session, session, write_rollout  # noqa: E402
from records.pools import write_atomic  # noqa: E402
from records.review import Defect, Review  # noqa: E402
from records.trajectory import Trajectory  # noqa: E402
from relearn.masks.compile import DEFECT_SCOPES, MODES, CompileOptions  # noqa: E402
from relearn.masks.shards import build_dataset, load_reviews  # noqa: E402
from relearn.masks.tokenizers import load_tokenizer  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "golden" / "outputs.json"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
# Text that every fast path has to get right: a decomposed é (not NFC), quotes, backslashes,
# a tab, a control character, a non-BMP character and CJK.
AWKWARD = 'cafe\u0301 "quoted" back\\slash\ttab \x01ctl 🦀 中文'


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _codex_inputs(root: Path) -> None:
    (root / "codex").mkdir()
    write_rollout(root / "codex" / "plain.jsonl", session(steps=3, filler=AWKWARD))
    write_rollout(root / "codex" / "legacy.jsonl", legacy_session())
    grown = session(session_id="019e0000-0000-7000-8000-0000000000aa", steps=2)
    compacted = envelope(
        "compacted",
        {
            "message": "",
            "replacement_history": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summary: " + AWKWARD}]}
            ],
        },
    )
    write_rollout(root / "codex" / "compacted.jsonl", grown[:9] + [compacted] + grown[9:])
    (root / "codex" / "sample.jsonl").write_bytes((SAMPLES / "codex_rollout_v0.135.0_exec.jsonl").read_bytes())
    build_corpus(root / "codex" / "bench", 1.0, 40)  # the import benchmark's corpus, 1 MB of it
    (root / "mini").mkdir()
    (root / "mini" / "sample.traj.json").write_bytes((SAMPLES / "mini_swe_agent_v1.13.4.traj.json").read_bytes())


def import_digests(root: Path) -> dict[str, str]:
    """Digests of the pools ``relearn import`` writes, with paths relative to ``root``."""
    _codex_inputs(root)
    out = {}
    for fmt, folder in (("codex", "codex"), ("mini-swe-agent", "mini")):
        files = [p.relative_to(root) for p in discover(fmt, [root / folder])]
        pool = Path(f"{folder}.pool.jsonl")
        summary = import_files(fmt, files, pool)
        assert summary.imported == len(files) and not summary.rejected, summary.rejected
        out[f"import/{fmt}"] = _sha(pool.read_bytes())
        # A rerun over the same inputs adds nothing (resume by id and content hash).
        again = import_files(fmt, files, pool)
        assert again.imported == 0 and again.skipped_existing == len(files)
        out[f"import/{fmt}/rerun"] = _sha(pool.read_bytes())
    return out


def _awkward_trajectories() -> list[tuple[Trajectory, list[dict[str, Any]]]]:
    """Small trajectories with defects in every field kind; (trajectory, defect specs)."""
    patch = '*** Begin Patch\n*** Update File: a.py\n-    x = "\\t"\n+    x = \'' + AWKWARD + "'\n*** End Patch\n"
    tools = [
        {
            "id": "c1",
            "function": {
                "name": "shell",
                "arguments": {"command": ["bash", "-lc", 'grep -n "é" a.py'], "timeout_ms": 1000, "flags": {"deep": [1, 2.5, None, True]}},
            },
        },
        {"id": "c2", "type": "custom", "function": {"name": "apply_patch", "arguments": {"input": patch}}},
    ]
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix " + AWKWARD},
        {
            "role": "assistant",
            "generated": True,
            "reasoning_content": "  Think about " + AWKWARD + " first.  ",
            "content": "Looking.",
            "tool_calls": tools[:1],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py:1: " + AWKWARD},
        {
            "role": "assistant",
            "generated": True,
            "reasoning_content": "The bug is probably the tab.",
            "content": "Patching " + AWKWARD,
            "tool_calls": tools[1:],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "Success."},
        {"role": "user", "content": "Summary so far: patched.", "generated": False},
        {"role": "assistant", "generated": True, "content": "Done: " + AWKWARD},
    ]
    reset = Trajectory.model_validate(
        {"id": "awkward-reset", "messages": messages, "outcome": {"resolved": True}, "context_resets": [{"message_index": 6}]}
    )
    whole = Trajectory.model_validate({"id": "awkward-whole", "messages": messages, "outcome": {"resolved": True}})
    defects = [
        {"message_index": 2, "field": "reasoning_content", "quote": "Think about cafe\u0301"},
        {"message_index": 2, "field": "tool_calls[0].arguments.command", "quote": '\\"é\\" a.py'},
        {"message_index": 2, "field": "tool_calls[0].arguments", "quote": '"deep": [1, 2.5'},
        {"message_index": 4, "field": "tool_calls[0].arguments.input", "quote": AWKWARD[:12]},
        {"message_index": 4, "field": "content", "quote": "\ttab"},
        {"message_index": 7, "field": "content", "quote": "🦀 中文"},
    ]
    text_protocol = Trajectory.model_validate(
        {
            "id": "awkward-text",
            "outcome": {"resolved": True},
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Fix it."},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "THOUGHT: look " + AWKWARD + "\n\n```bash\ncat a.py | grep -n 'x'\n```",
                },
                {"role": "user", "content": "<output>x = 1</output>"},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
                },
            ],
        }
    )
    return [(reset, defects), (whole, defects), (text_protocol, [{"message_index": 2, "field": "content", "quote": "grep -n 'x'"}])]


def _defect(trajectory: Trajectory, spec: dict[str, Any], category: str) -> Defect:
    from records.review import field_text

    text = field_text(trajectory.messages[spec["message_index"]], spec["field"]) or ""
    start = text.index(spec["quote"])
    return Defect(
        message_index=spec["message_index"],
        field=spec["field"],
        start=start,
        end=start + len(spec["quote"]),
        quote=spec["quote"],
        category=category,
    )


def masks_pool(root: Path) -> tuple[Path, Path]:
    """A pool of generated agentic trajectories and awkward small ones, with reviews."""
    rng = random.Random(7)
    pool = [make_trajectory(rng, 3000 + 1500 * seed, seed) for seed in range(3)]
    reviews = [review_for(t, rng) for t in pool]
    categories = ("wrong_hypothesis", "failed_command", "redundant_exploration", "other")
    for trajectory, specs in _awkward_trajectories():
        pool.append(trajectory)
        reviews.append(
            Review(
                trajectory_id=trajectory.id,
                decision="accept",
                defects=[_defect(trajectory, s, categories[i % 4]) for i, s in enumerate(specs)],
            )
        )
    reviews.append(Review(trajectory_id=pool[1].id, decision="reject", reason="a later, rejecting review wins"))
    pool_path, reviews_path = root / "masks.pool.jsonl", root / "masks.reviews.jsonl"
    write_atomic(pool_path, pool)
    reviews_path.write_text("".join(r.model_dump_json() + "\n" for r in reviews))
    return pool_path, reviews_path


def masks_digests(root: Path, tokenizer: Any) -> dict[str, str]:
    """Digests of every shard column and of the statistics, per mode and defect scope."""
    pool, reviews_path = masks_pool(root)
    pool = pool.relative_to(root)
    errors: list[str] = []
    reviews = load_reviews(reviews_path.relative_to(root), errors)
    assert not errors
    out = {}
    for mode in MODES:
        for scope in DEFECT_SCOPES:
            output = Path(f"shards-{mode}-{scope}")
            stats, _reused = build_dataset(
                pool, reviews, tokenizer, "qwen3.6", CompileOptions(mode=mode, defect_scope=scope), output, shard_size=4
            )
            assert stats["trajectories_out"] >= 3, stats["rejected"]
            for shard in sorted(output.glob("shard-*.parquet")):
                table = pq.read_table(shard)
                for column in table.column_names:
                    values = table.column(column).to_pylist()
                    out[f"masks/{mode}/{scope}/{shard.name}/{column}"] = _sha(json.dumps(values).encode())
            for stats_file in sorted(output.glob("*.json")):
                out[f"masks/{mode}/{scope}/{stats_file.name}"] = _sha(stats_file.read_bytes())
    return out


def digests(root: Path, tokenizer: Any) -> dict[str, str]:
    cwd = Path.cwd()
    os.chdir(root)
    try:
        return {**import_digests(root), **masks_digests(root, tokenizer)}
    finally:
        os.chdir(cwd)


def test_import_and_masks_outputs_are_byte_identical(tmp_path: Path, tok) -> None:  # noqa: ANN001
    golden = json.loads(GOLDEN.read_text())
    now = digests(tmp_path, tok)
    assert sorted(now) == sorted(golden)
    changed = [name for name in golden if golden[name] != now[name]]
    assert not changed, f"outputs changed: {changed}"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = digests(Path(tmp), load_tokenizer("qwen3.6"))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} digests written to {GOLDEN}")
