"""(f) Scaling: how a step's time and peak memory grow with the work, slca (and TRL) on the multi-turn workload.

    .venv/bin/python benchmarks/bench_scaling.py                 # every axis, slca only
    .venv/bin/python benchmarks/bench_scaling.py --trl G         # TRL beside slca on the group-size axis

One factor at a time from a base of 4 prompts x G=4, 2 tool turns of two
parallel calls each plus a summary, every turn 64 tokens (the scripted policy
of ``_common``, padded with filler text before the calls):

* ``G``: group size 4, 8, 16 (16, 32, 64 rollouts);
* ``turns``: tool turns 1, 2, 4;
* ``tokens``: tokens per turn 64, 128, 256;
* ``mb``: minibatches 1, 2, 4 at G=8 (rows x tokens per minibatch vs peak memory).

Each point runs in a fresh child process (1 warm-up + ``--repeats`` timed
steps) so that its peak RSS (``ru_maxrss``) is its own; ``base RSS`` is the
resident set after the model and trainer are built, and ``step RSS`` the
growth above it. Times are process CPU seconds (the median step; robust to
other load), split into rollouts (``generate_rollouts``) and the rest (the
training pass: forward, backward, AdamW; rewards and advantages are < 1%).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402

BASE = {"G": 4, "turns": 2, "tokens": 64, "mb": 1}
AXES = {"G": [4, 8, 16], "turns": [1, 2, 4], "tokens": [64, 128, 256], "mb": [1, 2, 4]}
MB_BASE = {"G": 8}

CHILD = r"""
import json, resource, statistics, sys, tempfile, time
sys.path.insert(0, {here!r})
import torch
import _common as C, bench_step
torch.set_num_threads(1)
p = json.loads({point!r})
size = C.Size(prompts=p["prompts"], generations=p["G"]) if not p["tiny"] else C.Size(**{{**C.TINY.__dict__, "generations": p["G"]}})
tok = C.build_tokenizer(size.vocab)
script = C.script_turns(tok, p["turns"], p["tokens"])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
out = {{"side": p["side"]}}
with tempfile.TemporaryDirectory() as d:
    if p["side"] == "slca":
        import slca.training.trainer as R  # the trainer's own reference to generate_rollouts (imported at its top)
        tr = bench_step.slca_trainer(tok, size, True, d, script=script, minibatches=p["mb"])
        roll = []
        gen = R.generate_rollouts
        def timed(*a, **k):
            c = time.process_time(); r = gen(*a, **k); roll.append(time.process_time() - c); return r
        R.generate_rollouts = timed
        out["base_rss"] = rss()
        steps, toks = [], []
        for i in range(1 + p["repeats"]):
            c = time.process_time(); m = tr.train_step(); dt = time.process_time() - c
            if i:
                steps.append(dt)
            toks.append(m["rollout/response_tokens"])
        out.update(step=statistics.median(steps), rollout=statistics.median(roll[1:]), tokens=toks[-1],
                   policy=toks[-1] * m["rollout/policy_token_frac"])
    else:
        from transformers import TrainerCallback
        steps = []
        class T(TrainerCallback):
            def on_step_begin(self, *a, **k): self.c = time.process_time()
            def on_step_end(self, args, state, *a, **k):
                if state.global_step > 1: steps.append(time.process_time() - self.c)
        tr = bench_step.trl_trainer(tok, size, True, d, 1 + p["repeats"], [T()], script=script)
        out["base_rss"] = rss()
        tr.train()
        hist = [h for h in tr.state.log_history if "completions/mean_length" in h]
        out.update(step=statistics.median(steps), rollout=float("nan"), tokens=float("nan"),
                   policy=hist[-1]["completions/mean_length"] if hist else float("nan"))
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT " + json.dumps(out))
"""


def run_point(point: dict) -> dict:
    code = CHILD.format(here=str(HERE), point=json.dumps(point))
    w = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"scaling point {point} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT "):])
    out["wall"] = time.perf_counter() - w
    out["load"] = C.load()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--axes", default="G,turns,tokens,mb", help="comma-separated axes to sweep")
    p.add_argument("--trl", default="", help="axes on which TRL runs beside slca (e.g. 'G'; minibatches do not apply to TRL)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="timed steps per point (median)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny model (tests)")
    a = p.parse_args(argv)
    C.header("bench_scaling: step time and peak memory vs the work (multi-turn workload, 1 thread)", a)
    axes = [x for x in a.axes.split(",") if x]
    trl_axes = {x for x in a.trl.split(",") if x}
    for x in set(axes) | trl_axes:
        if x not in AXES:
            raise SystemExit(f"unknown axis {x!r}; choose from {sorted(AXES)}")
    print(f"{'axis':<7}{'value':>6}{'side':>6}{'rows':>6}{'tok/row':>8}{'policy':>7}{'step cpu s':>11}{'rollout s':>10}"
          f"{'train s':>9}{'rollout %':>10}{'s/ktok':>8}{'base RSS':>10}{'step RSS':>10}{'peak RSS':>10}{'load':>6}")
    done: dict[tuple, dict] = {}
    for axis in axes:
        for value in (AXES[axis][:1] if a.tiny else AXES[axis]):
            cfg = {**BASE, **(MB_BASE if axis == "mb" else {}), axis: value}
            if a.tiny:
                cfg["tokens"] = min(cfg["tokens"], 64)
            sides = ["slca"] + (["trl"] if axis in trl_axes and axis != "mb" else [])
            for side in sides:
                key = (side, tuple(sorted(cfg.items())))
                if key not in done:
                    done[key] = run_point({**cfg, "side": side, "prompts": a.prompts, "repeats": a.repeats, "tiny": a.tiny})
                r = done[key]
                rows = a.prompts * cfg["G"] if not a.tiny else C.TINY.prompts * cfg["G"]
                train = r["step"] - r["rollout"]
                ktok = rows * r["tokens"] / 1e3 if r["tokens"] == r["tokens"] else float("nan")
                gb = 1e9
                print(f"{axis:<7}{value:>6}{side:>6}{rows:>6}{r['tokens']:>8.0f}{r['policy']:>7.0f}{r['step']:>11.2f}"
                      f"{r['rollout']:>10.2f}{train:>9.2f}{100 * r['rollout'] / r['step']:>9.0f}%{r['step'] / ktok:>8.3f}"
                      f"{r['base_rss'] / gb:>8.2f}GB{(r['peak_rss'] - r['base_rss']) / gb:>8.2f}GB{r['peak_rss'] / gb:>8.2f}GB"
                      f"{r['load']:>6.1f}", flush=True)
    print("cpu: median process CPU seconds of a step (1 thread); rollout = generate_rollouts, train = the rest "
          "(training forward/backward/AdamW; rewards, advantages < 1%). tok/row: prompt-free response tokens per "
          "rollout (policy + tool results); policy: model-written tokens per rollout. s/ktok: step CPU seconds per "
          "1000 response tokens in the batch (flat = linear scaling). RSS in GB (10^9 bytes): base after building "
          "model and trainer, step = peak - base. load: 1-minute load average after the point.")


if __name__ == "__main__":
    main()
