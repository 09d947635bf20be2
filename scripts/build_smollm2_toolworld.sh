#!/usr/bin/env bash
# Issue 42, stage 1: SFT that makes SmolLM2-135M-Instruct a toolworld tool caller (a LoRA adapter), ships the
# adapter in the package (model=smollm2-toolworld) and evaluates before (smollm2) and after (smollm2-toolworld):
# toolworld tool-task success on train_heldout, test, test_entities, test_phrasings, heldout_tools (greedy,
# >= 300 tool-needing tasks each) and BFCL simple_python, multiple, parallel, parallel_multiple, live_simple
# (the first 50 records each). Recipe: recipes/smollm2_toolworld (docs/training.md, "SmolLM2 as a tool caller:
# stage 1"); its hyperparameters may only be chosen by train_heldout.
#
# Background-safe and resumable: run it as `nohup bash scripts/build_smollm2_toolworld.sh &`; everything goes to
# $OUT/build.log, a lock keeps a second copy from running, the SFT resumes from its last checkpoint
# ($OUT/state.pt, every 5 steps) and each finished evaluation (its summary.json) is skipped, so running the
# script again continues where it stopped. About 2 CPU hours of SFT (measured: 19.9 CPU s a step, 360 steps),
# then the evaluations (several CPU hours; the `before` ones last, SKIP_BEFORE=1 leaves them out).
#   OUT      build folder (checkpoint, log, adapter)                   default runs/smollm2_toolworld
#   RESULTS  records (build.json, after/, before/, summary.md)         default docs/results/smollm2_toolworld
#   THREADS  torch threads (OMP_NUM_THREADS)                           default 2
#   SETS     extra Stage1Config overrides, e.g. "steps=400 lr=5e-4"   (chosen by train_heldout only)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2_toolworld}
RESULTS=${RESULTS:-docs/results/smollm2_toolworld}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT" "$RESULTS"
exec >> "$OUT/build.log" 2>&1
exec 9> "$OUT/.lock"
if ! flock -n 9; then echo "$(date '+%F %T') another build_smollm2_toolworld.sh holds $OUT/.lock: not started"; exit 1; fi
export OMP_NUM_THREADS=${THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
R=(nice -n "${NICE:-10}" "$PY" -m recipes.smollm2_toolworld)
say() { echo "$(date '+%F %T') $*"; }

SET_ARGS=()
for kv in ${SETS:-}; do SET_ARGS+=(--set "$kv"); done
say "start: commit $(git rev-parse --short HEAD), OMP_NUM_THREADS=$OMP_NUM_THREADS, sets: ${SETS:-none}"
"${R[@]}" build --out "$OUT" "${SET_ARGS[@]}" || { say "SFT failed (rc $?); run the script again to resume"; exit 1; }
"${R[@]}" ship --adapter "$OUT/adapter" --records "$RESULTS" || { say "ship failed (rc $?)"; exit 1; }
say "shipped: src/slca/models/shipped_smollm2_toolworld (commit it with $RESULTS/build.json)"

failed=0
evaluate() {  # which (after|before), model, suite, [split]
  local which=$1 model=$2 suite=$3 split=${4:-}
  local dir="$RESULTS/$which/${suite}${split:+-$split}"
  say "eval $which $model $suite $split"
  "${R[@]}" eval --model "$model" --suite "$suite" ${split:+--split "$split"} --out "$dir" || { say "  failed (rc $?)"; failed=1; }
}
for split in train_heldout test test_entities test_phrasings heldout_tools; do evaluate after smollm2-toolworld toolworld "$split"; done
evaluate after smollm2-toolworld bfcl
if [[ -z ${SKIP_BEFORE:-} ]]; then
  evaluate before smollm2 bfcl
  for split in train_heldout test test_entities test_phrasings heldout_tools; do evaluate before smollm2 toolworld "$split"; done
fi
"${R[@]}" summary --results "$RESULTS" > /dev/null && say "summary: $RESULTS/summary.md"
say "done (evaluations failed: $failed)"
exit $failed
