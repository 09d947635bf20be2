#!/usr/bin/env bash
# Study 47: issue 47's options against slca's defaults (plan: docs/results.md, "Study 47"). Background and resumable:
# `slca compare` skips finished runs whose stored config and model fingerprint match, so running a stage again
# continues where it stopped. Runs after study 42 (which has the cores first).
#   control  slca seed 0 again at this commit, study 41's command: its records must equal study 41's slca-seed0
#            (every field that record has, perf/* aside) for study 41's slca runs to stand as the control
#   pilot    segmentation=span, seed 100 (not a study seed): rollout/span_moved and CPU per run
#   turn     loss_agg=turn_mean, seeds 0-9
#   span     segmentation=span, seeds 0-9 (run only if the pilot's rollout/span_moved is above 0 on some step)
# Setting: study 41's, unchanged (scripts/run_study41.sh): 16 steps x 8 tasks x G=4, lr 5e-5, the shipped warm start,
# evaluations at steps 0, 4, 8, 12, 16 on the first 400 train_heldout tasks of the seed, greedy.
# Tables: scripts/study47_tables.py (it gives study 41's published contrast (a) back from its records: -0.024 ± 0.025).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
SLCA=${SLCA:-.venv/bin/slca}
PY=${PY:-.venv/bin/python}
OUT=${SLCA_STUDY_OUT:-docs/results/study47}
COMMON=(--set steps=16 --set tasks_per_step=8 --set group_size=4 --set lr=5e-5 --set eval_every=4 --set eval_on_start=true
        --set eval_tasks=400 --set eval_split=train_heldout --set ood_splits=test,heldout_tools --set ood_eval_tasks=100
        --set save_every=0 --set keep_checkpoints=1 --set sample_html_every=0 --set report_to=none --jobs 2)
mkdir -p "$OUT"
stage=${1:-}
case $stage in
  control)
    $SLCA compare --estimators slca --seeds 0 --out "$OUT/control" "${COMMON[@]}" --jobs 1 \
      --title "Study 47: study 41's slca seed 0 again (the control check)" > "$OUT/control.log" 2>&1
    $PY - "$OUT/control/slca-seed0/metrics.jsonl" docs/results/study41/main/slca-seed0/metrics.jsonl <<'PY'
import json, sys
new, old = ([json.loads(x) for x in open(p) if x.strip()] for p in sys.argv[1:])
diff = [(o["step"], k, o[k], n.get(k)) for o, n in zip(old, new) for k in o if not k.startswith("perf/") and n.get(k) != o[k]]
added = sorted({k for n in new for k in n} - {k for o in old for k in o})
print(f"rows: {len(new)} here, {len(old)} in study 41; fields this commit adds: {added}")
print("control stands: every field equal" if not diff and len(new) == len(old) else f"control does NOT stand: {diff[:10]}")
PY
    ;;
  pilot)
    $SLCA compare --estimators slca --seeds "${SEEDS:-100}" --out "$OUT/pilot_span" "${COMMON[@]}" --set segmentation=span \
      --title "Study 47 pilot: segmentation=span (rollout/span_moved, CPU per run)" > "$OUT/pilot.log" 2>&1
    ;;
  turn)
    $SLCA compare --estimators slca --seeds "${SEEDS:-0,1,2,3,4,5,6,7,8,9}" --out "$OUT/turn_mean" "${COMMON[@]}" \
      --set loss_agg=turn_mean --title "Study 47: slca with loss_agg=turn_mean" > "$OUT/turn.log" 2>&1
    ;;
  span)
    $SLCA compare --estimators slca --seeds "${SEEDS:-0,1,2,3,4,5,6,7,8,9}" --out "$OUT/span" "${COMMON[@]}" \
      --set segmentation=span --title "Study 47: slca with segmentation=span" > "$OUT/span.log" 2>&1
    ;;
  *) echo "usage: $0 control|pilot|turn|span" >&2; exit 2 ;;
esac
