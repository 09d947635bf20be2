#!/usr/bin/env bash
# The multi-seed study (issue 9), run in the background; every command is the one docs/results.md shows.
cd /work/main
export OMP_NUM_THREADS=1
M=runs/models/warmstart-f1ab
COMMON="--set model=$M --set steps=30 --set lr=5e-4 --set eval_every=10 --set eval_tasks=48 --set save_every=10"
date > runs/study.started
.venv/bin/slca compare --estimators grpo,slca,gdpo --seeds 0,1,2,3,4 --out runs/study/main $COMMON --title "Main study: GRPO vs SLCA vs GDPO on toolworld" > runs/study-main.log 2>&1
date > runs/study.main.done
.venv/bin/slca compare --estimators grpo,slca --seeds 0,1,2 --out runs/study/noise $COMMON --set steps=20 --set summary_noise=0.5 --title "Sensitivity: summary-reward noise 0.5" > runs/study-noise.log 2>&1
.venv/bin/slca compare --estimators grpo,slca --seeds 0,1,2 --out runs/study/group8 $COMMON --set steps=20 --set tasks_per_step=4 --set group_size=8 --title "Sensitivity: group size 8 (4 tasks x 8)" > runs/study-group8.log 2>&1
.venv/bin/slca compare --estimators grpo,slca --seeds 0,1,2 --out runs/study/segbal $COMMON --set steps=20 --set loss_agg=segment_balanced --title "Sensitivity: segment-balanced loss aggregation" > runs/study-segbal.log 2>&1
date > runs/study.all.done
