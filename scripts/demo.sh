#!/usr/bin/env bash
# The main job, as far as the pipeline exists today: build the offline images and verify
# the mini task suite in real containers, import real trajectories written by other tools
# into a pool, check it, and export it for chat templates and for Harbor. Later stages
# (collect, review, masks, train, eval) join here as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
RELEARN=.venv/bin/relearn
SAMPLES=${SAMPLES:-../shared/samples}
OUT=${OUT:-runs/demo}
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== 1/6 build the offline base image and the mini task images (no registry needed)"
$RELEARN envs build -t mini

echo "== 2/6 verify the mini suite: every gold patch must resolve, every empty patch must not"
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

echo "== 3/6 import a Codex CLI rollout and a mini-swe-agent trajectory"
$RELEARN import codex "$SAMPLES/codex_rollout_v0.135.0_exec.jsonl" -o "$OUT/pool.jsonl"
$RELEARN import mini-swe-agent "$SAMPLES/mini_swe_agent_v1.13.4.traj.json" -o "$OUT/pool.jsonl"

echo "== 4/6 validate the pool"
$RELEARN validate "$OUT/pool.jsonl"

echo "== 5/6 export chat messages for apply_chat_template"
$RELEARN export hf "$OUT/pool.jsonl" -o "$OUT/chat.jsonl"

echo "== 6/6 export Harbor ATIF v1.7"
$RELEARN export atif "$OUT/pool.jsonl" -o "$OUT/atif"

cat <<DONE

Artifacts:
  $OUT/verdicts.jsonl    one Verdict per (task, patch): per-test results, resolved, reward, image digest
  $OUT/verify-logs/      full test logs of every verification
  $OUT/pool.jsonl    relearn trajectories (one JSON object per line)
  $OUT/chat.jsonl    {id, messages, tools} rows for tokenizer.apply_chat_template
  $OUT/atif/         one ATIF v1.7 document per trajectory (Harbor viewer, harbor analyze)
DONE
