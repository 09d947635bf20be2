"""Tables for docs/results.md from the issue-13 study (scripts/run_study.sh).

    .venv/bin/python scripts/study13_tables.py [runs/study13/main]

Training rewards paired by seed over steps 1-8, 9-16 and 1-16 (same seed = same tasks at
every step for every estimator), and the held-out tool-task success at the final
evaluation, paired by seed, with 95% Student-t intervals over the seeds present.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from slca.reporting.compare import t_interval
from slca.reporting.report import final_eval, read_metrics

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study13/main")
WINDOWS = ((1, 8), (9, 16), (1, 16))


def seeds_of(est: str) -> dict[int, Path]:
    out = {}
    for d in ROOT.glob(f"{est}-seed*"):
        rows = read_metrics(d) if (d / "metrics.jsonl").exists() else []
        if any("eval/success" in r and r["step"] >= 16 for r in rows):  # finished runs only
            out[int(d.name.rsplit("seed", 1)[1])] = d
    return out


def window(run: Path, key: str, lo: int, hi: int) -> float:
    v = [r[key] for r in read_metrics(run) if lo <= r["step"] <= hi and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sum(v) / len(v) if v else float("nan")


def fmt(v: list[float], sign: bool = True) -> str:
    mu, hw = t_interval(v)
    return f"{mu:+.3f} ± {hw:.3f}" if sign else f"{mu:.3f} ± {hw:.3f}"


def main() -> None:
    runs = {e: seeds_of(e) for e in ("grpo", "slca", "gdpo")}
    print("finished runs:", {e: sorted(r) for e, r in runs.items()})
    for key in ("reward/tool", "reward/summary"):
        print(f"\n| {key}: pair | " + " | ".join(f"steps {a}-{b}" for a, b in WINDOWS) + " | seeds a > b (1-16) |")
        print("|---" * (len(WINDOWS) + 2) + "|")
        for a, b in (("slca", "grpo"), ("gdpo", "grpo"), ("slca", "gdpo")):
            seeds = sorted(set(runs[a]) & set(runs[b]))
            if not seeds:
                continue
            cells = [fmt([window(runs[a][s], key, lo, hi) - window(runs[b][s], key, lo, hi) for s in seeds]) for lo, hi in WINDOWS]
            d = [window(runs[a][s], key, 1, 16) - window(runs[b][s], key, 1, 16) for s in seeds]
            print(f"| {a} - {b} (n={len(seeds)}) | " + " | ".join(cells) + f" | {sum(x > 0 for x in d)}/{len(d)} |")
    print("\n| estimator | reward/tool 1-8 | reward/tool 9-16 | held-out success | tool-task success | arg_match | reward_summary |")
    print("|---" * 7 + "|")
    for e, rs in runs.items():
        if not rs:
            continue
        fin = [final_eval(read_metrics(d)) for d in rs.values()]
        cells = [fmt([window(d, "reward/tool", 1, 8) for d in rs.values()], False), fmt([window(d, "reward/tool", 9, 16) for d in rs.values()], False)]
        cells += [fmt([f.get(k, float("nan")) for f in fin], False) for k in ("eval/success", "eval/tool_tasks/success", "eval/arg_match", "eval/reward_summary")]
        print(f"| {e} (n={len(rs)}) | " + " | ".join(cells) + " |")
    print("\n| held-out, paired | success | tool-task success | arg_match | reward_summary |")
    print("|---" * 5 + "|")
    for a in ("slca", "gdpo"):
        seeds = sorted(set(runs[a]) & set(runs["grpo"]))
        if not seeds:
            continue
        fa = {s: final_eval(read_metrics(runs[a][s])) for s in seeds}
        fg = {s: final_eval(read_metrics(runs["grpo"][s])) for s in seeds}
        cells = [fmt([fa[s].get(k, math.nan) - fg[s].get(k, math.nan) for s in seeds])
                 for k in ("eval/success", "eval/tool_tasks/success", "eval/arg_match", "eval/reward_summary")]
        print(f"| {a} - grpo (n={len(seeds)}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
