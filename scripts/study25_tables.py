"""Tables for docs/results.md from study 25 (scripts/run_study25.sh; plan in docs/results.md).

    .venv/bin/python scripts/study25_tables.py [docs/results/study25]

Reads the finished runs of each stage (A: grpo, slca; B_noise: the same with summary
noise; C: gdpo, slca_cond, slca_turn) and prints, with 95% Student-t intervals over the
seeds that every compared run finished:

* the primary endpoint: the area under the held-out in-distribution tool-task Success
  curve (``slca.reporting.compare.curve_auc`` of ``eval/tool_tasks/success`` over steps 0, 8, 16),
  SLCA - GRPO paired by seed, and each other estimator - GRPO;
* the secondary endpoints (final values unless said): Success per kind, parallel steps
  split over turns, held-out summary reward, contamination / gradient cosine / volatility
  (means over the 16 steps), OOD test and heldout_tools tool-task Success, the training
  execution reward (mean over the 16 steps);
* the mechanism arm: (noise - clean) per estimator and the interaction
  ``(slca_noise - slca) - (grpo_noise - grpo)``, paired by seed;
* stage D (issue 26, item 9): SLCA with ``empty_tool=both``, ``empty_summary=last_turn``
  minus stage A's SLCA, paired by seed, and how often those options acted.

Nothing here is tuned: the endpoints and the pairing are the plan's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from slca.reporting.compare import curve_auc, t_interval
from slca.reporting.report import final_eval, mean_of, read_metrics

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/study25")
STEPS = 16
PRIMARY = "auc"
KEYS = {
    "auc": "AUC tool-task Success (in distribution)",
    "eval/tool_tasks/success": "final tool-task Success",
    "eval/kind/single/success": "single",
    "eval/kind/parallel/success": "parallel",
    "eval/kind/chain/success": "chain",
    "eval/parallel_split": "parallel split (lower is better)",
    "eval/reward_summary": "held-out summary reward",
    "eval_test/tool_tasks/success": "test (OOD) tool-task Success",
    "eval_heldout_tools/tool_tasks/success": "heldout_tools (OOD) tool-task Success",
    "train/reward/tool": "training execution reward, steps 1-16",
    "train/adv/contamination": "contamination",
    "train/grad/cosine_tool_summary": "grad cosine tool/summary",
    "train/grad/volatility": "grad-norm volatility",
}


def run_numbers(run: Path) -> dict[str, float] | None:
    """The endpoints of one finished run; None while it is unfinished."""
    rows = read_metrics(run) if (run / "metrics.jsonl").exists() else []
    if not rows or rows[-1].get("step") != STEPS:
        return None
    ev = {**final_eval(rows), **final_eval(rows, "eval_test"), **final_eval(rows, "eval_heldout_tools")}
    out = {"auc": curve_auc(rows, "eval/tool_tasks/success")}
    train = [r for r in rows if r.get("step", 0) >= 1]
    for k in KEYS:
        if k.startswith("train/"):
            out[k] = mean_of(train, k[len("train/"):])
        elif k != "auc":
            v = ev.get(k)
            out[k] = float(v) if isinstance(v, (int, float)) else math.nan
    for k in ("rollout/no_tool_segment", "rollout/no_summary_segment", "rollout/mixed_call_groups"):
        out[f"train/{k}"] = mean_of(train, k)  # logged from stage D on
    out["step0/tool_tasks/success"] = next((r["eval/tool_tasks/success"] for r in rows if r.get("step") == 0 and "eval/tool_tasks/success" in r), math.nan)
    return out


def stage(name: str) -> dict[str, dict[int, dict[str, float]]]:
    """``{estimator: {seed: numbers}}`` of a stage's finished runs."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for d in sorted((ROOT / name).glob("*-seed*")):
        est, seed = d.name.rsplit("-seed", 1)
        nums = run_numbers(d)
        if nums is not None:
            out.setdefault(est, {})[int(seed)] = nums
    return out


def fmt(xs: list[float], sign: bool = False) -> str:
    mu, hw = t_interval(xs)
    if math.isnan(mu):
        return "n/a"
    m = f"{mu:+.3f}" if sign else f"{mu:.3f}"
    return f"{m} ± {hw:.3f}" if not math.isnan(hw) else m


def paired(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], key: str) -> tuple[list[float], list[int]]:
    seeds = sorted(set(a) & set(b))
    return [a[s][key] - b[s][key] for s in seeds], seeds


def main() -> None:
    A, B, C, D = stage("A"), stage("B_noise"), stage("C"), stage("D_segments")
    arms = {**A, **C}
    print(f"# Study 25 tables ({ROOT})\n")
    print("Finished runs: " + ", ".join(f"{e} {len(v)}" for e, v in arms.items()) + (", " + ", ".join(f"{e}+noise {len(v)}" for e, v in B.items()) if B else ""))
    print("\n## Means over seeds (95% t-intervals)\n")
    cols = list(KEYS)
    print("| estimator | n | warm start (step 0) | " + " | ".join(KEYS[k] for k in cols) + " |")
    print("|---" * (len(cols) + 3) + "|")
    for e, runs in list(arms.items()) + [(f"{e} + noise", r) for e, r in B.items()]:
        seeds = sorted(runs)
        print(f"| {e} | {len(seeds)} | {fmt([runs[s]['step0/tool_tasks/success'] for s in seeds])} | "
              + " | ".join(fmt([runs[s][k] for s in seeds]) for k in cols) + " |")
    if "grpo" in arms:
        print("\n## Paired against GRPO (same seed)\n")
        print("| pair | seeds | " + " | ".join(KEYS[k] for k in cols) + " | AUC: seeds a > b |")
        print("|---" * (len(cols) + 3) + "|")
        for e in arms:
            if e == "grpo":
                continue
            diffs, seeds = paired(arms[e], arms["grpo"], PRIMARY)
            wins = sum(d > 0 for d in diffs)
            cells = [fmt(paired(arms[e], arms["grpo"], k)[0], sign=True) for k in cols]
            print(f"| {e} - grpo | {len(seeds)} | " + " | ".join(cells) + f" | {wins}/{len(seeds)} |")
    if {"grpo", "slca"} <= set(B) and {"grpo", "slca"} <= set(A):
        print("\n## The mechanism arm: summary noise (std 0.5)\n")
        keys = ["auc", "train/reward/tool", "eval/tool_tasks/success", "eval/reward_summary"]
        print("| quantity | seeds | " + " | ".join(KEYS[k] for k in keys) + " |")
        print("|---" * (len(keys) + 2) + "|")
        for e in ("grpo", "slca"):
            d = {k: paired(B[e], A[e], k) for k in keys}
            print(f"| {e}: noise - clean | {len(d['auc'][1])} | " + " | ".join(fmt(d[k][0], sign=True) for k in keys) + " |")
        seeds = sorted(set(A["grpo"]) & set(A["slca"]) & set(B["grpo"]) & set(B["slca"]))
        inter = {k: [(B["slca"][s][k] - A["slca"][s][k]) - (B["grpo"][s][k] - A["grpo"][s][k]) for s in seeds] for k in keys}
        print(f"| interaction (slca_noise - slca) - (grpo_noise - grpo) | {len(seeds)} | " + " | ".join(fmt(inter[k], sign=True) for k in keys) + " |")
        print("\nWithin stage B (both under noise; the volatility of B is issue 28's definition, comparable within B only):\n")
        keys_b = ["auc", "eval/tool_tasks/success", "eval/parallel_split", "train/reward/tool", "train/adv/contamination",
                  "train/grad/volatility"]
        diffs, seeds = paired(B["slca"], B["grpo"], PRIMARY)
        print("| pair | seeds | " + " | ".join(KEYS[k] for k in keys_b) + " | AUC: seeds a > b |")
        print("|---" * (len(keys_b) + 3) + "|")
        print(f"| slca_noise - grpo_noise | {len(seeds)} | " + " | ".join(fmt(paired(B["slca"], B["grpo"], k)[0], sign=True) for k in keys_b)
              + f" | {sum(d > 0 for d in diffs)}/{len(seeds)} |")

    if "slca" in D and "slca" in A:
        print("\n## Stage D: the unbiased missing-segment options (D's slca - A's slca, same seed)\n")
        # volatility left out: A logged the pre-issue-28 definition, D the current one
        cols_d = [k for k in cols if not k.startswith(("train/adv", "train/grad/volatility"))] + ["train/adv/contamination"]
        diffs, seeds = paired(D["slca"], A["slca"], PRIMARY)
        print("| pair | seeds | " + " | ".join(KEYS[k] for k in cols_d) + " | AUC: seeds D > A |")
        print("|---" * (len(cols_d) + 3) + "|")
        print(f"| D - A (slca) | {len(seeds)} | " + " | ".join(fmt(paired(D["slca"], A["slca"], k)[0], sign=True) for k in cols_d)
              + f" | {sum(d > 0 for d in diffs)}/{len(seeds)} |")
        acted = ["train/rollout/no_tool_segment", "train/rollout/no_summary_segment", "train/rollout/mixed_call_groups"]
        runs = D["slca"]
        print("\nHow often the options acted (D, mean over training steps and seeds): "
              + ", ".join(f"{k[len('train/rollout/'):]} {fmt([runs[s][k] for s in sorted(runs)])}" for k in acted))


if __name__ == "__main__":
    main()
