#!/usr/bin/env bash
# The main job, as far as the pipeline exists today: build the offline images and verify
# the mini task suite in real containers; collect a historical pool from a scripted
# policy, review it, compile masks A \ E; import real trajectories written by other
# tools, check them and export them. Training and evaluation join here as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
RELEARN=.venv/bin/relearn
SAMPLES=${SAMPLES:-../shared/samples}
OUT=${OUT:-runs/demo}
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== 1/9 build the offline base image and the mini task images (no registry needed)"
$RELEARN envs build -t mini

echo "== 2/9 verify the mini suite: every gold patch must resolve, every empty patch must not"
.venv/bin/python - "$OUT/predictions.jsonl" <<'PY'
import json, sys
from pathlib import Path
from envs.tasks import load_tasks
tasks, _ = load_tasks(Path("envs/mini_tasks"))
with open(sys.argv[1], "w") as out:
    for t in tasks:
        out.write(json.dumps({"instance_id": t.instance_id, "model_name_or_path": "gold", "model_patch": t.patch}) + "\n")
        out.write(json.dumps({"instance_id": t.instance_id, "model_name_or_path": "empty", "model_patch": ""}) + "\n")
PY
$RELEARN verify -t mini -p "$OUT/predictions.jsonl" -o "$OUT/verdicts.jsonl" --workers 2 --log-dir "$OUT/verify-logs"

echo "== 3/9 collect a historical pool: a scripted policy (standing in for an earlier checkpoint) on the mini suite"
.venv/bin/python scripts/demo_policy.py "$OUT/policy.url" &
POLICY=$!
trap 'kill $POLICY 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do [ -s "$OUT/policy.url" ] && break; sleep 0.2; done
OPENAI_API_KEY=local $RELEARN collect -t mini --model historical-ckpt --checkpoint iter-29 --step 29 \
    --base-url "$(cat "$OUT/policy.url")" --out "$OUT/collect" --workers 2 --max-turns 12

echo "== 4/9 review it with the offline heuristic reviewer (real judges: relearn review --judge1 ...)"
$RELEARN review "$OUT/collect/trajectories.jsonl" -o "$OUT/reviews.jsonl"

echo "== 5/9 compile masks A \\ E with the Qwen3.6 tokenizer and chat template"
$RELEARN masks "$OUT/collect/trajectories.jsonl" -r "$OUT/reviews.jsonl" -o "$OUT/dataset" --mode ross

echo "== 6/9 import a Codex CLI rollout and a mini-swe-agent trajectory"
$RELEARN import codex "$SAMPLES/codex_rollout_v0.135.0_exec.jsonl" -o "$OUT/pool.jsonl"
$RELEARN import mini-swe-agent "$SAMPLES/mini_swe_agent_v1.13.4.traj.json" -o "$OUT/pool.jsonl"

echo "== 7/9 validate the imported pool"
$RELEARN validate "$OUT/pool.jsonl"

echo "== 8/9 export chat messages for apply_chat_template"
$RELEARN export hf "$OUT/pool.jsonl" -o "$OUT/chat.jsonl"

echo "== 9/9 export Harbor ATIF v1.7"
$RELEARN export atif "$OUT/pool.jsonl" -o "$OUT/atif"

cat <<DONE

Artifacts:
  $OUT/collect/trajectories.jsonl   the historical pool: verified trajectories of a scripted checkpoint
  $OUT/collect/episodes/            every episode as it was recorded
  $OUT/reviews.jsonl      one Review per trajectory (decision, errors, grounded defect spans)
  $OUT/dataset/           Parquet shards (input_ids, loss_mask) and stats.json (TER, excluded tokens by category)
  $OUT/verdicts.jsonl    one Verdict per (task, patch): per-test results, resolved, reward, image digest
  $OUT/verify-logs/      full test logs of every verification
  $OUT/pool.jsonl    relearn trajectories (one JSON object per line)
  $OUT/chat.jsonl    {id, messages, tools} rows for tokenizer.apply_chat_template
  $OUT/atif/         one ATIF v1.7 document per trajectory (Harbor viewer, harbor analyze)
DONE
