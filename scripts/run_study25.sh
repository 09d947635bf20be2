#!/usr/bin/env bash
# The pre-registered study of issue 25 (plan: docs/results.md, "Study 25"), as run for the docs.
# Background and resumable: `slca compare` skips finished runs whose stored config and model
# fingerprint (model.json) match, so re-running this script continues where it stopped. The
# records were made on build J (default:802a004aea881d79); on another shipped build (PF3 since
# issue 27) compare refuses to reuse them and would retrain every run. Stages in order of priority:
#   A  grpo, slca                      (the primary endpoint)
#   B  grpo, slca with summary_noise    (the paper's mechanism; paired with A by seed)
#   C  gdpo, slca_cond, slca_turn       (the other estimators; paired with A's grpo by seed)
#   D  slca with the unbiased missing-segment options (issue 26, item 9; paired with A's slca by seed)
# Budget fixed before any comparison run: the demo's (16 steps x 8 tasks x G=4, lr 5e-5, chosen
# by study 13's GRPO-only check), evaluations at steps 0, 8, 16 on the first 400 train_heldout
# tasks of the seed (>= 300 tool-needing), 100 test and 100 heldout_tools tasks (OOD), greedy.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
SLCA=${SLCA:-.venv/bin/slca}
OUT=${SLCA_STUDY_OUT:-docs/results/study25}
SEEDS=${SEEDS:-0,1,2,3,4,5,6,7,8,9}
COMMON=(--set steps=16 --set tasks_per_step=8 --set group_size=4 --set lr=5e-5 --set eval_every=8 --set eval_on_start=true
        --set eval_tasks=400 --set eval_split=train_heldout --set ood_splits=test,heldout_tools --set ood_eval_tasks=100
        --set save_every=0 --set keep_checkpoints=1 --set sample_html_every=0 --set report_to=none --jobs 2
        # the missing-segment options the study was pre-registered under (the defaults until issue 26, item 9)
        --set empty_tool=response --set empty_summary=drop)
mkdir -p "$OUT"
stage=${1:-all}
if [[ $stage == all || $stage == A ]]; then
  $SLCA compare --estimators grpo,slca --seeds "$SEEDS" --out "$OUT/A" "${COMMON[@]}" \
    --title "Study 25, stage A: GRPO vs SLCA, held out in distribution" > "$OUT/A.log" 2>&1
fi
if [[ $stage == all || $stage == B ]]; then
  $SLCA compare --estimators grpo,slca --seeds "$SEEDS" --out "$OUT/B_noise" "${COMMON[@]}" --set summary_noise=0.5 \
    --title "Study 25, stage B: summary reward noise (sigma 0.5)" > "$OUT/B_noise.log" 2>&1
fi
if [[ $stage == all || $stage == C ]]; then
  $SLCA compare --estimators gdpo,slca_cond,slca_turn --seeds "$SEEDS" --out "$OUT/C" "${COMMON[@]}" \
    --title "Study 25, stage C: GDPO and the beyond-the-paper estimators" > "$OUT/C.log" 2>&1
fi
if [[ $stage == all || $stage == D ]]; then
  $SLCA compare --estimators slca --seeds "$SEEDS" --out "$OUT/D_segments" "${COMMON[@]}" \
    --set empty_tool=both --set empty_summary=last_turn \
    --title "Study 25, stage D: SLCA with the unbiased missing-segment options" > "$OUT/D_segments.log" 2>&1
fi
