#!/usr/bin/env bash
# The step benchmark on a CUDA machine: slca vs TRL (and slca with fast_paths=False), bf16 weights,
# a from-scratch Qwen2 of hidden 1024 / 12 layers / 16 heads (4 KV heads) / SwiGLU 2816, vocab 1000,
# 8 prompts x 4 generations, single- and multi-turn workloads (benchmarks/_common.py). Prints the table.
#
#   benchmarks/gpu.sh                  # from the repository root; PYTHON=... picks the interpreter
#
# Without a CUDA device it prints one line and exits 0 (skipped). The run is capped at 5 minutes
# (GPU_BENCH_TIMEOUT seconds, default 290): 1 warm-up + 2 timed steps per side and workload.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if ! cuda="$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))')"; then
    echo "gpu.sh: $PY cannot import torch (set PYTHON to the project's interpreter)" >&2
    exit 2
fi
if [ "$cuda" != 1 ]; then
    echo "gpu.sh: skipped (no CUDA device: torch.cuda.is_available() is False)"
    exit 0
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
"$PY" -c 'import torch; print("gpu.sh:", torch.cuda.get_device_name(0), "torch", torch.__version__)'
exec timeout "${GPU_BENCH_TIMEOUT:-290}" "$PY" benchmarks/bench_step.py --size gpu --device cuda --dtype bf16 \
    --workload both --threads 1 --repeats "${GPU_BENCH_REPEATS:-2}" --warmup 1 "$@"
