"""SmolLM2-135M-Instruct next to the embedded model: toolworld, BFCL, and the training step against TRL (issue 30).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/smollm2_figures.py                 # the full measurement
    OMP_NUM_THREADS=1 .venv/bin/python scripts/smollm2_figures.py --smoke         # minutes: every part, tiny sizes
    OMP_NUM_THREADS=1 .venv/bin/python scripts/smollm2_figures.py --parts eval    # only the evaluations (or: step)

Every figure comes from the project's own commands, run here one at a time as subprocesses so each one's
wall and CPU seconds are measured on their own (CPU: user + system of the child, all its threads):

* ``slca eval --model M --suite toolworld --split S --limit N`` for M in (default, smollm2), S in
  (train_heldout, test): greedy (K = 1), ``--max-new-tokens`` 256 (the command's default);
* ``slca eval --model M --suite bfcl --categories all --limit N``: every category the suite supports;
* ``benchmarks/bench_step.py --model smollm2 --threads 1 --no-plain``: TRL's ``GRPOTrainer`` and slca's
  ``Trainer`` on the same scripted work (bench_step's ``single`` and ``multi`` workloads) with SmolLM2's weights.

Output in ``--out`` (default ``runs/smollm2-figures``): each command's report (``<model>-<suite>[-<split>]/``),
``step.txt`` (bench_step's table), ``figures.json`` (every number, every command with its seconds) and
``figures.md`` (the tables to paste into docs/evaluation.md and docs/performance.md). Nothing is pasted by hand:
the markdown is written from the reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("default", "smollm2")
SPLITS = ("train_heldout", "test")
TOOLWORLD_KEYS = ("success", "name_f1", "arg_match", "process")


def run(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` (output to ``log``); its wall and CPU seconds (user + system of the child and its threads)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rec = {"cmd": " ".join(cmd[1:] if cmd[0] == sys.executable else cmd), "rc": rc, "wall_s": round(time.perf_counter() - t0, 1),
           "cpu_s": round(cpu, 1), "load_1min_after": round(os.getloadavg()[0], 2), "log": str(log)}
    print(f"  rc {rc}  {rec['wall_s']:>8.1f} s wall  {rec['cpu_s']:>8.1f} s CPU  {rec['cmd']}", flush=True)
    if rc != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
    return rec


def slca_eval(model: str, suite: str, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "slca.cli", "eval", "--model", model, "--suite", suite, "--out", str(out), *extra]


def toolworld_row(rep: dict) -> dict:
    m = rep["metrics"]
    row = {k: m.get(k) for k in TOOLWORLD_KEYS}
    tool = [g for g in ("single", "parallel", "chain") if g in rep["groups"]]
    n = sum(rep["counts"].get(g, 0) for g in tool)
    row["tool_tasks_success"] = (sum(rep["groups"][g]["success"] * rep["counts"][g] for g in tool) / n) if n else None
    row["n"] = len(rep["records"])
    row["per_kind_success"] = {g: v.get("success") for g, v in rep["groups"].items()}
    return row


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def write_markdown(fig: dict, path: Path) -> None:
    lines = [f"# SmolLM2-135M-Instruct next to the embedded model ({fig['when']}, commit {fig['commit']})", "",
             f"Machine: {fig['machine']}. Greedy decoding (K = 1), --max-new-tokens {fig['max_new_tokens']}. "
             f"{'SMOKE RUN: tiny sizes, not figures.' if fig['smoke'] else ''}", ""]
    if fig.get("toolworld"):
        lines += ["## toolworld", "", "| model | split | n | success | tool-task success | name_f1 | arg_match | process |", "|---|---|---|---|---|---|---|---|"]
        for key, row in fig["toolworld"].items():
            model, split = key.split("/")
            lines.append(f"| {model} | {split} | {row['n']} | {fmt(row['success'])} | {fmt(row['tool_tasks_success'])} | {fmt(row['name_f1'])} "
                         f"| {fmt(row['arg_match'])} | {fmt(row['process'])} |")
        lines.append("")
    if fig.get("bfcl"):
        cats = sorted({c for rep in fig["bfcl"].values() for c in rep["groups"]})
        lines += ["## BFCL", "", "| category | " + " | ".join(fig["bfcl"]) + " |", "|---" * (len(fig["bfcl"]) + 1) + "|"]
        for c in cats:
            lines.append(f"| {c} | " + " | ".join(fmt(rep["groups"].get(c, {}).get("accuracy")) for rep in fig["bfcl"].values()) + " |")
        for k in sorted({k for rep in fig["bfcl"].values() for k in rep["metrics"]}):
            lines.append(f"| **{k}** | " + " | ".join(fmt(rep["metrics"].get(k)) for rep in fig["bfcl"].values()) + " |")
        lines.append("")
    if fig.get("step"):
        lines += ["## Training step, slca vs TRL, SmolLM2-135M (bench_step.py --model smollm2)", "", "```", fig["step"].rstrip(), "```", ""]
    lines += ["## Commands", "", "| command | rc | wall s | CPU s | load after |", "|---|---|---|---|---|"]
    lines += [f"| `{c['cmd']}` | {c['rc']} | {c['wall_s']} | {c['cpu_s']} | {c['load_1min_after']} |" for c in fig["commands"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "smollm2-figures")
    p.add_argument("--parts", default="eval,step", help="comma-separated: eval (toolworld and BFCL), step (bench_step)")
    p.add_argument("--models", default=",".join(MODELS), help="models for the evaluations")
    p.add_argument("--toolworld-limit", type=int, default=300, help="tasks per toolworld split (train_heldout has 600, test 300)")
    p.add_argument("--bfcl-categories", default="all", help="BFCL categories or groups (default: every category slca runs)")
    p.add_argument("--bfcl-limit", type=int, default=20, help="entries per BFCL category")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--step-repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="every part at tiny sizes (minutes): checks the script, measures nothing")
    a = p.parse_args(argv)
    if a.smoke:
        a.toolworld_limit, a.bfcl_limit, a.bfcl_categories, a.max_new_tokens, a.step_repeats = 2, 1, "simple_python,irrelevance", 32, 1
    parts = {x.strip() for x in a.parts.split(",") if x.strip()}
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip() or "?"
    fig: dict = {"when": time.strftime("%Y-%m-%d %H:%M"), "commit": commit, "smoke": a.smoke, "max_new_tokens": a.max_new_tokens,
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
                 "commands": [], "toolworld": {}, "bfcl": {}}
    gen = ["--max-new-tokens", str(a.max_new_tokens)]
    if "eval" in parts:
        for model in models:
            for split in SPLITS:
                d = out / f"{model}-toolworld-{split}"
                fig["commands"].append(run(slca_eval(model, "toolworld", d, ["--split", split, "--limit", str(a.toolworld_limit), *gen]),
                                           out / f"{model}-toolworld-{split}.log"))
                if (d / "toolworld.json").is_file():
                    fig["toolworld"][f"{model}/{split}"] = toolworld_row(json.loads((d / "toolworld.json").read_text()))
            d = out / f"{model}-bfcl"
            fig["commands"].append(run(slca_eval(model, "bfcl", d, ["--categories", a.bfcl_categories, "--limit", str(a.bfcl_limit), *gen]),
                                       out / f"{model}-bfcl.log"))
            if (d / "bfcl.json").is_file():
                rep = json.loads((d / "bfcl.json").read_text())
                fig["bfcl"][model] = {"metrics": rep["metrics"], "groups": rep["groups"], "counts": rep["counts"]}
    if "step" in parts:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--model", "smollm2", "--threads", "1", "--no-plain",
               "--repeats", str(a.step_repeats), *(["--tiny", "--warmup", "0"] if a.smoke else [])]
        fig["commands"].append(run(cmd, out / "step.txt"))
        fig["step"] = (out / "step.txt").read_text()
    (out / "figures.json").write_text(json.dumps(fig, indent=1))
    write_markdown(fig, out / "figures.md")
    print(f"written: {out / 'figures.md'}, {out / 'figures.json'}")
    return max((c["rc"] for c in fig["commands"]), default=0)


if __name__ == "__main__":
    sys.exit(main())
