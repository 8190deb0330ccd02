#!/usr/bin/env bash
# The main job, as far as the pipeline exists today: import real trajectories written by
# other tools into a pool, check it, and export it for chat templates and for Harbor.
# Later stages (collect, verify, review, masks, train, eval) join here as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
RELEARN=.venv/bin/relearn
SAMPLES=${SAMPLES:-../shared/samples}
OUT=${OUT:-runs/demo}
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== 1/4 import a Codex CLI rollout and a mini-swe-agent trajectory"
$RELEARN import codex "$SAMPLES/codex_rollout_v0.135.0_exec.jsonl" -o "$OUT/pool.jsonl"
$RELEARN import mini-swe-agent "$SAMPLES/mini_swe_agent_v1.13.4.traj.json" -o "$OUT/pool.jsonl"

echo "== 2/4 validate the pool"
$RELEARN validate "$OUT/pool.jsonl"

echo "== 3/4 export chat messages for apply_chat_template"
$RELEARN export hf "$OUT/pool.jsonl" -o "$OUT/chat.jsonl"

echo "== 4/4 export Harbor ATIF v1.7"
$RELEARN export atif "$OUT/pool.jsonl" -o "$OUT/atif"

cat <<DONE

Artifacts:
  $OUT/pool.jsonl    relearn trajectories (one JSON object per line)
  $OUT/chat.jsonl    {id, messages, tools} rows for tokenizer.apply_chat_template
  $OUT/atif/         one ATIF v1.7 document per trajectory (Harbor viewer, harbor analyze)
DONE
