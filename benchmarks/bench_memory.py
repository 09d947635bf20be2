"""(e) Peak memory (resident set) of ``slca demo --quick``, or of a trainer run.

    .venv/bin/python benchmarks/bench_memory.py                  # slca demo --quick
    .venv/bin/python benchmarks/bench_memory.py --what trainer   # 3 slca Trainer steps, bench_step multi workload
    .venv/bin/python benchmarks/bench_memory.py --what demo-train --model PATH  # `slca train` at the demo's quick
                                                                 # settings (2 steps + eval) on a built model folder
    .venv/bin/python benchmarks/bench_memory.py --what step --side trl --model smollm2 --workload multi
                                                                 # one step of one side of bench_step, alone
    .venv/bin/python benchmarks/bench_memory.py --what step --side slca --model smollm2 --lora-r 8 --micro-batch-size 4
                                                                 # the same with study 42's LoRA (both sides take --lora-r)

The command runs in a child process; its peak RSS is ``ru_maxrss`` of
``getrusage(RUSAGE_CHILDREN)`` after it exits (Linux: the largest resident set
any waited-for descendant reached), the figure ``/usr/bin/time -v`` prints as
"Maximum resident set size". The demo builds and caches the embedded model on
its first run (``$SLCA_CACHE`` or ``~/.cache/slca``); that build is part of the
measured run when the cache is empty.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET_GB = 3.0

TRAINER_SNIPPET = """
import sys, tempfile
sys.path.insert(0, {here!r})
import _common as C, bench_step
size = C.TINY if {tiny} else C.FULL
tok = C.build_tokenizer(size.vocab)
with tempfile.TemporaryDirectory() as d:
    tr = bench_step.slca_trainer(tok, size, True, d)
    for _ in range({steps}):
        tr.train_step()
"""

STEP_SNIPPET = """
import sys, tempfile
sys.path.insert(0, {here!r})
import _common as C, bench_step
size = C.TINY if {tiny} else C.FULL
tok = C.smollm2_tokenizer() if {smol} else C.build_tokenizer(size.vocab)
build = C.build_smollm2 if {smol} else C.build_model
lora = ({lora_r}, {lora_targets!r}) if {lora_r} > 0 else None
with tempfile.TemporaryDirectory() as d:
    if {side!r} == "trl":
        bench_step.trl_trainer(tok, size, {multi}, d, 1, [], build=build, lora=lora).train()
    else:
        bench_step.slca_trainer(tok, size, {multi}, d, build=build, micro_batch_size={micro}, lora=lora).train_step()
"""


def run_child(cmd: list[str]) -> tuple[int, float, float]:
    """``(exit code, peak RSS in GB (10^9 bytes), wall seconds)`` of ``cmd`` run to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kb <= before and rc.returncode == 0:
        print("   note: this child's peak did not exceed an earlier child's; the figure is an upper bound")
    if rc.returncode != 0:
        print(f"   command failed (exit {rc.returncode}); last lines of its stderr:")
        print("   " + "\n   ".join(rc.stderr.strip().splitlines()[-8:]))
    return rc.returncode, peak_kb * 1024 / 1e9, wall  # Linux ru_maxrss is in KiB


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--what", choices=("demo", "trainer", "demo-train", "step"), default="demo")
    p.add_argument("--model", default=None, help="model folder for --what demo-train (e.g. a cache entry of the embedded model); "
                                                 "for --what step: random (bench_step's Qwen2, the default) or smollm2")
    p.add_argument("--side", choices=("slca", "trl"), default="slca", help="--what step: whose training step, in a process of its own")
    p.add_argument("--workload", choices=("single", "multi"), default="multi", help="--what step: bench_step's workload")
    p.add_argument("--micro-batch-size", type=int, default=0, help="--what step --side slca: TrainConfig.micro_batch_size (0: the whole batch)")
    p.add_argument("--lora-r", type=int, default=0, help="--what step: fresh LoRA adapters of this rank (bench_step's --lora-r; 0: full fine-tuning)")
    p.add_argument("--lora-targets", default="q_proj,v_proj", help="--lora-r: the modules that get adapters (study 42's)")
    p.add_argument("--steps", type=int, default=3, help="trainer steps (--what trainer)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run: the trainer on a tiny model (tests)")
    a = p.parse_args(argv)
    print("== bench_memory: peak resident memory")
    print(f"   args: {vars(a)}")
    if a.tiny and a.what != "step":
        a.what, a.steps = "trainer", 1
    with tempfile.TemporaryDirectory() as d:
        slca = Path(sys.executable).parent / "slca"
        if a.what == "demo":
            cmd = [str(slca), "demo", "--quick", "--out", str(Path(d) / "demo")]
        elif a.what == "demo-train":
            from slca.cli import DEMO_OVERRIDES

            if a.model is None:
                p.error("--what demo-train needs --model PATH")
            sets = {**DEMO_OVERRIDES["quick"], "steps": 2, "eval_every": 2, "model": a.model, "run_dir": str(Path(d) / "run")}
            cmd = [str(slca), "train"] + [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
        elif a.what == "step":
            if a.model not in (None, "random", "smollm2"):
                p.error(f"--what step takes --model random or smollm2, got {a.model!r}")
            code = STEP_SNIPPET.format(here=str(HERE), tiny=a.tiny, smol=a.model == "smollm2", side=a.side, multi=a.workload == "multi",
                                       micro=a.micro_batch_size, lora_r=a.lora_r, lora_targets=a.lora_targets.split(","))
            cmd = [sys.executable, "-c", code]
        else:
            code = TRAINER_SNIPPET.format(here=str(HERE), tiny=a.tiny, steps=a.steps)
            cmd = [sys.executable, "-c", code]
        label = {"trainer": f"<slca Trainer, {a.steps} steps>", "step": f"<one {a.side} step, {a.workload}, model {a.model or 'random'}, micro_batch_size {a.micro_batch_size}"
                                                             f"{f', LoRA r {a.lora_r} on {a.lora_targets}' if a.lora_r else ''}>"}
        print(f"   command: {'python -c ' + label[a.what] if a.what in label else ' '.join(cmd)}")
        rc, gb, wall = run_child(cmd)
    status = "failed" if rc else ("met" if gb <= TARGET_GB else "NOT met")
    print(f"{'what':<11}{'exit':>5}{'peak RSS':>11}{'wall':>9}  target <= {TARGET_GB:.0f} GB")
    print(f"{a.what:<11}{rc:>5}{gb:>8.2f} GB{wall:>8.0f}s  {status}")
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
