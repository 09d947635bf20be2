"""Tables for docs/results.md from the study's run folders (runs/study/*).

Sensitivity settings ran 20 steps on seeds 0 and 1; their baseline is the main study's
evaluation at step 20 of the same seeds (same config otherwise).

    .venv/bin/python scripts/study_tables.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from slca.reporting.compare import t_interval
from slca.reporting.report import read_metrics

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study")
KEYS = ["eval/success", "eval/name_f1", "eval/arg_match", "eval/reward_tool", "eval/reward_summary", "eval/parse_ok"]


def eval_at(run: Path, step: int) -> dict[str, float] | None:
    f = run / "metrics.jsonl"
    if not f.exists():
        return None
    for r in read_metrics(run):  # 1-based steps, also for run folders written 0-based
        if r["step"] == step and "eval/success" in r:
            return r
    return None


def row(setting: str, folder: str, step: int, seeds: list[int]) -> list[str]:
    out = []
    for est in ("grpo", "slca"):
        vals = {k: [] for k in KEYS}
        for s in seeds:
            r = eval_at(ROOT / folder / f"{est}-seed{s}", step)
            if r:
                for k in KEYS:
                    vals[k].append(r.get(k, float("nan")))
        cells = []
        for k in KEYS:
            mu, _ = t_interval(vals[k])
            cells.append("n/a" if math.isnan(mu) else f"{mu:.3f}")
        out.append(f"| {setting} | {est} | {len(vals[KEYS[0]])} | " + " | ".join(cells) + " |")
    return out


def train_window(run: Path, key: str, lo: int, hi: int) -> float:
    """Mean of a training metric over steps lo..hi (1-based, inclusive)."""
    rows = read_metrics(run)
    v = [r[key] for r in rows if lo <= r["step"] <= hi and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sum(v) / len(v) if v else float("nan")


def training_table(folder: str = "main", estimators=("grpo", "slca", "gdpo"), seeds=range(5)) -> None:
    """Training rewards early (steps 1-5) and late (steps 21-30), mean over seeds with 95% t-intervals."""
    keys = ["reward/tool", "reward/summary", "reward/exec/efficiency", "reward/summary/faithfulness", "rollout/tool_turns"]
    print("| estimator | " + " | ".join(f"{k} 1-5" + " | " + f"{k} 21-30" for k in keys) + " |")
    print("|---" * (2 * len(keys) + 1) + "|")
    for est in estimators:
        runs = [ROOT / folder / f"{est}-seed{s}" for s in seeds if (ROOT / folder / f"{est}-seed{s}" / "metrics.jsonl").exists()]
        cells = []
        for k in keys:
            for lo, hi in ((1, 5), (21, 30)):
                mu, hw = t_interval([train_window(r, k, lo, hi) for r in runs])
                cells.append(f"{mu:.3f} ± {hw:.3f}" if not math.isnan(hw) else f"{mu:.3f}")
        print(f"| {est} (n={len(runs)}) | " + " | ".join(cells) + " |")


def probe_table(folder: str = "main", estimators=("grpo", "slca", "gdpo"), seeds=range(5)) -> None:
    """log p(one parallel turn) - log p(first call alone) at each evaluation, mean over seeds."""
    print("| estimator | " + " | ".join(f"parallel_pref @ step {s}" for s in (10, 20, 30)) + " | log p(parallel) @ 10 | log p(parallel) @ 30 |")
    print("|---" * 6 + "|")
    for est in estimators:
        cells = []
        for key, steps in (("probe/parallel_pref", (10, 20, 30)), ("probe/logp_parallel", (10, 30))):
            for st in steps:
                v = [r.get(key, float("nan")) for s in seeds if (r := eval_at(ROOT / folder / f"{est}-seed{s}", st))]
                mu, hw = t_interval(v)
                cells.append(f"{mu:.1f} ± {hw:.1f}")
        print(f"| {est} | " + " | ".join(cells) + " |")


def paired_train_table(folder: str = "main", seeds=range(5)) -> None:
    """Training execution / summary reward, paired by seed (same seed = same tasks each step)."""
    pairs = (("slca", "grpo"), ("gdpo", "grpo"), ("slca", "gdpo"))
    wins = ((1, 10), (11, 20), (21, 30), (1, 30))
    for key in ("reward/tool", "reward/summary"):
        print(f"| {key}: pair | " + " | ".join(f"steps {lo}-{hi}" for lo, hi in wins) + " | seeds a > b (steps 1-30) |")
        print("|---" * (len(wins) + 2) + "|")
        for a, b in pairs:
            cells = []
            for lo, hi in wins:
                d = [train_window(ROOT / folder / f"{a}-seed{s}", key, lo, hi) - train_window(ROOT / folder / f"{b}-seed{s}", key, lo, hi) for s in seeds]
                mu, hw = t_interval(d)
                cells.append(f"{mu:+.3f} ± {hw:.3f}")
            d = [train_window(ROOT / folder / f"{a}-seed{s}", key, 1, 30) - train_window(ROOT / folder / f"{b}-seed{s}", key, 1, 30) for s in seeds]
            print(f"| {a} - {b} | " + " | ".join(cells) + f" | {sum(x > 0 for x in d)}/{len(d)} |")
        print()


def sensitivity_train_table(seeds=(0, 1)) -> None:
    """Training execution reward over steps 1-20 per setting; baseline = main study steps 1-20."""
    print("| setting | grpo | slca | slca - grpo, per seed |")
    print("|---|---|---|---|")
    for setting, folder in (("baseline (main study)", "main"), ("summary noise 0.5", "noise"), ("group size 8", "group8"), ("segment-balanced loss", "segbal")):
        g = [train_window(ROOT / folder / f"grpo-seed{s}", "reward/tool", 1, 20) for s in seeds if (ROOT / folder / f"grpo-seed{s}" / "metrics.jsonl").exists()]
        l = [train_window(ROOT / folder / f"slca-seed{s}", "reward/tool", 1, 20) for s in seeds if (ROOT / folder / f"slca-seed{s}" / "metrics.jsonl").exists()]
        if not g or len(g) != len(l):
            print(f"| {setting} | not run | | |")
            continue
        d = ", ".join(f"{b - a:+.3f}" for a, b in zip(g, l))
        print(f"| {setting} | {sum(g) / len(g):.3f} | {sum(l) / len(l):.3f} | {d} |")


def main() -> None:
    sensitivity_train_table()
    print()
    paired_train_table()
    training_table()
    print()
    probe_table()
    print()
    print("| setting | estimator | seeds | " + " | ".join(k.split("/")[1] for k in KEYS) + " |")
    print("|---" * (len(KEYS) + 3) + "|")
    for line in row("baseline (main study, step 20)", "main", 20, [0, 1]):
        print(line)
    for setting, folder in (("summary noise 0.5", "noise"), ("group size 8", "group8"), ("segment-balanced loss", "segbal")):
        for line in row(setting, folder, 20, [0, 1]):
            print(line)


if __name__ == "__main__":
    main()
