#!/usr/bin/env bash
# Study 42: GRPO against SLCA on SmolLM2-135M after stage-1 SFT (plan: docs/results.md, "Study 42"; issue 42 stage 2).
# Background and resumable: `slca compare` skips finished runs whose stored config and model fingerprint
# (model.json) match and resumes stopped ones, and each BFCL evaluation whose bfcl.json exists is skipped, so
# running this script again continues where it stopped.
#   pilot  grpo only, seed 100 (not a study seed): CPU per run and room above the start; changes nothing
#   main   grpo, slca, slca_paper; seeds 0, 1, 2, paired by seed; BFCL on each run's last checkpoint as the run finishes
# Budget fixed before any RL run on the model: 12 steps x 4 tasks x G=4, lr 5e-5, a fresh LoRA (r 8, alpha 16,
# q_proj,v_proj) on smollm2-toolworld, micro_batch_size 4; evaluations (greedy) at steps 0, 6, 12 on the first
# 250 train_heldout tasks of the seed and 100 test tasks; BFCL's five categories x 50 records at the end.
#   OUT     records (default docs/results/study42)   SEEDS  override the seeds   SETS  extra --set k=v (smoke only;
#           device=cuda on a GPU: docs/results.md, study 42's third start)   JOBS  runs at a time (default 2)
#   SKIP_BFCL=1  no BFCL step (on the GPU machine, where BFCL's packages are not installed)
#   bfcl   BFCL alone on each finished run of OUT/main (the GPU runs' step, afterwards on this machine's CPU)
#   rerun  grpo seeds 0 and 1 again into OUT/rerun (their final checkpoints were lost with a checkout: docs/results.md,
#          study 42's amendments); BFCL on a rerun only if its metrics.jsonl equals OUT/main's record, perf/* aside.
#          `main` runs it after its own runs
#   FROZEN  a folder to run the code from: `git worktree add --detach FROZEN HEAD` is made there if it is missing
#           (PYTHONPATH=FROZEN/src), so edits to this checkout cannot reach running or resumed runs; BFCL runs with
#           this checkout's code (it needs the checkpoint-base fix 2b097ca, newer than the study's frozen code)
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
SLCA=${SLCA:-$PWD/.venv/bin/slca}
OUT=${OUT:-$PWD/docs/results/study42}
if [[ -n ${FROZEN:-} ]]; then
  [[ -d $FROZEN/src/slca ]] || git worktree add --detach "$FROZEN" HEAD
  export PYTHONPATH=$FROZEN/src
  echo "$(date '+%F %T') code from $FROZEN at $(git -C "$FROZEN" rev-parse --short HEAD)" >> "$OUT.frozen.log"
fi
COMMON=(--set model=smollm2-toolworld --set lora_r=8 --set lora_alpha=16 --set lora_target_modules=q_proj,v_proj
        --set steps=12 --set tasks_per_step=4 --set group_size=4 --set lr=5e-5 --set micro_batch_size=4
        --set eval_on_start=true --set eval_every=6 --set eval_tasks=250 --set eval_split=train_heldout
        --set ood_splits=test --set ood_eval_tasks=100
        --set save_every=1 --set keep_checkpoints=1 --set sample_html_every=0 --set report_to=none --jobs "${JOBS:-2}")
for kv in ${SETS:-}; do COMMON+=(--set "$kv"); done
BFCL_LIMIT=${BFCL_LIMIT:-50}
mkdir -p "$OUT"
say() { echo "$(date '+%F %T') $*"; }

bfcl_one() {  # one run folder: BFCL on its last checkpoint, into <run>/bfcl/ (skipped when done)
  local run=$1 ckpt
  ckpt=$(ls -d "$run"/checkpoints/step-* 2>/dev/null | tail -1)
  [[ -n $ckpt ]] || { say "$run: no checkpoint, BFCL skipped"; return; }
  [[ -f $run/bfcl/bfcl.json ]] && return
  # one evaluation of a run at a time, whichever process asks (the watcher beside the training, a `bfcl` stage started
  # by hand): a lock per run folder, outside the records
  (
    flock -n 9 || exit 0
    [[ -f $run/bfcl/bfcl.json ]] && exit 0
    # with this checkout's code, never FROZEN's: the frozen 493626c predates 2b097ca, the fix without which a checkpoint
    # of a smollm2-toolworld run would load on plain SmolLM2 (docs/results.md, study 42's amendments)
    say "BFCL $run ($ckpt), code $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+uncommitted')"
    env -u PYTHONPATH "$SLCA" eval --model "$ckpt" --suite bfcl --categories simple_python,multiple,parallel,parallel_multiple,live_simple \
      --limit "$BFCL_LIMIT" --out "$run/bfcl" || say "  BFCL failed (rc $?)"
  ) 9> "${TMPDIR:-/tmp}/study42-bfcl-$(printf %s "$(realpath "$run")" | md5sum | cut -c1-12).lock"
}

finished() {  # whether the run folder $1 logged its last step (12); a run in progress has checkpoints too
  [[ -f $1/metrics.jsonl ]] && "${PYTHON:-$PWD/.venv/bin/python}" -c 'import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
sys.exit(0 if rows and rows[-1].get("step") == 12 else 1)' "$1/metrics.jsonl" 2>/dev/null
}

bfcl() {  # each finished run of $1
  for run in "$1"/*-seed*/; do
    run=${run%/}
    finished "$run" || continue
    bfcl_one "$run"
  done
}

stage=${1:-main}
if [[ $stage == pilot ]]; then
  $SLCA compare --estimators grpo --seeds "${SEEDS:-100}" --out "$OUT/pilot" "${COMMON[@]}" \
    --title "Study 42 pilot: GRPO only (CPU per run, room above the start)" >> "$OUT/pilot.log" 2>&1
fi
if [[ $stage == main ]]; then
  $SLCA compare --estimators grpo,slca,slca_paper --seeds "${SEEDS:-0,1,2}" --out "$OUT/main" "${COMMON[@]}" \
    --title "Study 42: GRPO, SLCA and the released SLCA on SmolLM2 after SFT" >> "$OUT/main.log" 2>&1 &
  compare_pid=$!
  # BFCL on each run as it finishes, beside the training (a third process on two cores, rather than a core left idle
  # while the last run trains alone and the evaluations wait for it)
  if [[ -z ${SKIP_BFCL:-} ]]; then
    ( while kill -0 "$compare_pid" 2>/dev/null; do bfcl "$OUT/main"; sleep "${WATCH_EVERY:-120}"; done
      bfcl "$OUT/main" ) >> "$OUT/main.log" 2>&1 &
  fi
  wait "$compare_pid"
fi
rerun() {  # grpo seeds 0 and 1 again; BFCL on each rerun whose records equal the study's
  $SLCA compare --estimators grpo --seeds 0,1 --out "$OUT/rerun" "${COMMON[@]}" \
    --title "Study 42: grpo seeds 0 and 1 again, for their BFCL checkpoints" >> "$OUT/rerun.log" 2>&1
  for seed in 0 1; do
    new=$OUT/rerun/grpo-seed$seed old=$OUT/main/grpo-seed$seed
    [[ -f $new/metrics.jsonl && -f $old/metrics.jsonl ]] || continue
    if "${PYTHON:-$PWD/.venv/bin/python}" - "$new/metrics.jsonl" "$old/metrics.jsonl" <<'PY' >> "$OUT/rerun.log" 2>&1
import json, sys
new, old = ([json.loads(x) for x in open(p) if x.strip()] for p in sys.argv[1:])
diff = [(o.get("step"), k, o.get(k), n.get(k)) for o, n in zip(old, new) for k in sorted({*o, *n})
        if not k.startswith("perf/") and (k not in o or k not in n or n[k] != o[k])]
print(f"{sys.argv[1]}: {len(new)} rows, the study's record {len(old)}")
print("equal in every field, perf/* aside" if not diff and len(new) == len(old) else f"NOT equal: {diff[:10]}")
sys.exit(0 if not diff and len(new) == len(old) else 1)
PY
    then bfcl_one "$new"; else say "$new differs from $old: no BFCL for it (see rerun.log)"; fi
  done
}

if [[ $stage == main ]]; then
  rerun >> "$OUT/main.log" 2>&1
  wait  # the BFCL watcher
fi
if [[ $stage == rerun ]]; then
  rerun >> "$OUT/main.log" 2>&1
fi
if [[ $stage == bfcl ]]; then
  bfcl "$OUT/main" >> "$OUT/main.log" 2>&1
fi
