#!/usr/bin/env bash
# Study 41: slca's SLCA against the estimators as the paper's authors released them (plan: docs/results.md,
# "Study 41"). Background and resumable: `slca compare` skips finished runs whose stored config and model
# fingerprint (model.json) match, so re-running this script continues where it stopped.
#   pilot  grpo only, seeds 100-102 (not the study's seeds): room and power of the endpoint, CPU per run
#   main   stage 1: grpo, slca, slca_paper; then stage 2: toolpo_grpo, rltr_planner; seeds 0-9, paired by seed
# Budget fixed before any comparison run: study 25's (16 steps x 8 tasks x G=4, lr 5e-5), the shipped warm
# start, evaluations every 4 steps (0, 4, 8, 12, 16) on the first 400 train_heldout tasks of the seed,
# 100 test and 100 heldout_tools tasks (OOD), greedy; slca's own reward for every arm; the missing-segment
# options at their defaults (empty_tool=both, empty_summary=last_turn).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
SLCA=${SLCA:-.venv/bin/slca}
OUT=${SLCA_STUDY_OUT:-docs/results/study41}
COMMON=(--set steps=16 --set tasks_per_step=8 --set group_size=4 --set lr=5e-5 --set eval_every=4 --set eval_on_start=true
        --set eval_tasks=400 --set eval_split=train_heldout --set ood_splits=test,heldout_tools --set ood_eval_tasks=100
        --set save_every=0 --set keep_checkpoints=1 --set sample_html_every=0 --set report_to=none --jobs 2)
mkdir -p "$OUT"
stage=${1:-main}
if [[ $stage == pilot ]]; then
  $SLCA compare --estimators grpo --seeds "${SEEDS:-100,101,102}" --out "$OUT/pilot" "${COMMON[@]}" \
    --title "Study 41 pilot: GRPO only (room and power of the endpoint)" > "$OUT/pilot.log" 2>&1
fi
if [[ $stage == main || $stage == 1 ]]; then
  $SLCA compare --estimators grpo,slca,slca_paper --seeds "${SEEDS:-0,1,2,3,4,5,6,7,8,9}" --out "$OUT/main" "${COMMON[@]}" \
    --title "Study 41, stage 1: GRPO, slca's SLCA and the released SLCA" > "$OUT/stage1.log" 2>&1
fi
if [[ $stage == main || $stage == 2 ]]; then
  $SLCA compare --estimators toolpo_grpo,rltr_planner --seeds "${SEEDS:-0,1,2,3,4,5,6,7,8,9}" --out "$OUT/main" "${COMMON[@]}" \
    --title "Study 41, stage 2: the released baselines" > "$OUT/stage2.log" 2>&1
fi
