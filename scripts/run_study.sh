#!/usr/bin/env bash
# The multi-seed study (issue 9), as run for docs/results.md (background; resumable: finished runs are skipped).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
M=${SLCA_STUDY_MODEL:-runs/models/warmstart-f1ab}   # a frozen copy of the embedded model the study used
COMMON="--set model=$M --set steps=30 --set lr=5e-4 --set eval_every=10 --set eval_tasks=48 --set save_every=10"
.venv/bin/slca compare --estimators grpo,slca,gdpo --seeds 0,1,2,3,4 --out runs/study/main $COMMON \
  --title "Main study: GRPO vs SLCA vs GDPO on toolworld" > runs/study-main.log 2>&1
# Sensitivity to summary-reward noise (fewer seeds and steps: the session's time)
.venv/bin/slca compare --estimators grpo,slca --seeds 0,1 --out runs/study/noise $COMMON --set steps=20 --set summary_noise=0.5 \
  --title "Sensitivity: summary-reward noise 0.5" > runs/study-noise.log 2>&1
# Sensitivity to group size (same batch of 32 rollouts: 4 tasks x 8) and to loss aggregation
S20="--set model=$M --set lr=5e-4 --set eval_every=10 --set eval_tasks=48 --set save_every=10 --set steps=20"
.venv/bin/slca compare --estimators grpo,slca --seeds 0,1 --out runs/study/group8 $S20 --set tasks_per_step=4 --set group_size=8 \
  --title "Sensitivity: group size 8 (4 tasks x 8)" > runs/study-group8.log 2>&1
.venv/bin/slca compare --estimators grpo,slca --seeds 0,1 --out runs/study/segbal $S20 --set loss_agg=segment_balanced \
  --title "Sensitivity: segment-balanced loss aggregation" > runs/study-segbal.log 2>&1
