"""Tables for docs/results.md from study 41 (scripts/run_study41.sh; plan in docs/results.md, "Study 41").

    .venv/bin/python scripts/study41_tables.py [docs/results/study41] [--figures]

Reads the finished runs of ``main/`` (every run's ``model.json`` must name the shipped build the plan
names; a run of another build is refused, not counted) and prints, with 95% Student-t intervals over
the seeds that both compared runs finished:

* the primary endpoint: the area under the held-out parallel-split curve (``curve_auc`` of
  ``eval/parallel_split`` over steps 0, 4, 8, 12, 16; lower is better), for the five registered
  contrasts (a) slca_paper - slca, (b) slca - grpo, (c) slca_paper - grpo, (d) slca_paper -
  toolpo_grpo, (e) slca_paper - rltr_planner;
* the secondary endpoints: the area under the held-out tool-task Success curve, Success at steps 4
  and 16, the authors' Success@0.9 (``eval/paper_success``), Success per kind, the held-out summary
  reward, the training execution reward, contamination / gradient cosine / gradient-norm volatility
  (means over the 16 steps), final OOD tool-task Success (``test``, ``heldout_tools``);
* the decision rule of the plan, applied to contrast (a).

Nothing here is tuned: the endpoints, the contrasts and the rule are the plan's. Every number is also
available by name (:func:`figures`, ``--figures``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from slca.reporting.compare import curve_auc, t_interval
from slca.reporting.report import final_eval, mean_of, read_metrics

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "docs" / "results" / "study41"
FINGERPRINT = "default:767ade0a9d121fc1"  # the plan's build (PF3)
STEPS = 16
EVAL_STEPS = (0, 4, 8, 12, 16)
ARMS = ("grpo", "slca", "slca_paper", "toolpo_grpo", "rltr_planner")
REGISTERED = [("slca_paper", "slca"), ("slca", "grpo"), ("slca_paper", "grpo"), ("slca_paper", "toolpo_grpo"),
              ("slca_paper", "rltr_planner")]
KEYS = {
    "split_auc": "AUC parallel split (primary; lower is better)",
    "auc": "AUC tool-task Success",
    "step4/eval/tool_tasks/success": "tool-task Success at step 4",
    "eval/tool_tasks/success": "tool-task Success at step 16",
    "eval/paper_success": "the authors' Success@0.9 at step 16",
    "eval/kind/single/success": "single",
    "eval/kind/parallel/success": "parallel",
    "eval/kind/chain/success": "chain",
    "step8/eval/parallel_split": "parallel split at step 8",
    "eval/parallel_split": "parallel split at step 16",
    "eval/reward_summary": "held-out summary reward",
    "train/reward/tool": "training execution reward, steps 1-16",
    "train/adv/contamination": "contamination",
    "train/grad/cosine_tool_summary": "grad cosine tool/summary",
    "train/grad/volatility": "grad-norm volatility",
    "eval_test/tool_tasks/success": "test (OOD) tool-task Success",
    "eval_heldout_tools/tool_tasks/success": "heldout_tools (OOD) tool-task Success",
}


def run_numbers(run: Path) -> dict[str, float] | None:
    """The endpoints of one finished run; None while it is unfinished. ValueError for a run of another build."""
    rows = read_metrics(run) if (run / "metrics.jsonl").exists() else []
    if not rows or rows[-1].get("step") != STEPS:
        return None
    model = json.loads((run / "model.json").read_text()) if (run / "model.json").exists() else {}
    if model.get("fingerprint") != FINGERPRINT:
        raise ValueError(f"{run}: model {model.get('fingerprint')!r}, the plan's build is {FINGERPRINT!r}")
    ev = {**final_eval(rows), **final_eval(rows, "eval_test"), **final_eval(rows, "eval_heldout_tools")}
    out = {"auc": curve_auc(rows, "eval/tool_tasks/success"), "split_auc": curve_auc(rows, "eval/parallel_split")}
    for k in KEYS:
        if k not in out:
            out[k] = endpoint(rows, ev, k)
    return out


def endpoint(rows: list[dict], ev: dict, k: str) -> float:
    """One run's value of ``k``: ``train/<key>`` the mean over the training steps, ``step<N>/<key>`` the value
    logged at step N, anything else the final evaluation's (``ev``); NaN where it is missing."""
    if k.startswith("train/"):
        return mean_of([r for r in rows if r.get("step", 0) >= 1], k[len("train/"):])
    if k.startswith("step"):
        step, key = k.split("/", 1)
        v = next((r for r in rows if r.get("step") == int(step[4:]) and key in r), {}).get(key)
    else:
        v = ev.get(k)
    return float(v) if isinstance(v, (int, float)) else math.nan


def arms(root: Path) -> dict[str, dict[int, dict[str, float]]]:
    """``{estimator: {seed: numbers}}`` of the finished runs of ``root/main``."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for d in sorted((root / "main").glob("*-seed*")):
        est, seed = d.name.rsplit("-seed", 1)
        nums = run_numbers(d)
        if nums is not None:
            out.setdefault(est, {})[int(seed)] = nums
    return out


def fmt(xs: list[float], sign: bool = False, decimals: int = 3) -> str:
    mu, hw = t_interval(xs)
    if math.isnan(mu):
        return "n/a"
    m = f"{mu:+.{decimals}f}" if sign else f"{mu:.{decimals}f}"
    return f"{m} ± {hw:.{decimals}f}" if not math.isnan(hw) else m


def paired(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], key: str) -> tuple[list[float], list[int]]:
    seeds = sorted(set(a) & set(b))
    return [a[s][key] - b[s][key] for s in seeds], seeds


def figures(root: Path = DEFAULT_ROOT) -> dict[str, list[float]]:
    """``"<arm>: <key>"`` and ``"<a> - <b>: <key>"`` (the registered contrasts) as per-seed values."""
    by = arms(root)
    out: dict[str, list[float]] = {}
    for arm, runs in by.items():
        for k in KEYS:
            out[f"{arm}: {k}"] = [runs[s][k] for s in sorted(runs)]
    for a, b in REGISTERED:
        if a in by and b in by:
            for k in KEYS:
                out[f"{a} - {b}: {k}"] = paired(by[a], by[b], k)[0]
    return out


def decision(by: dict[str, dict[int, dict[str, float]]]) -> str:
    """The plan's rule on contrast (a): ``slca_paper`` becomes the default only if better on the primary
    endpoint (interval below 0) and its Success-area contrast does not lie below 0."""
    if "slca_paper" not in by or "slca" not in by:
        return "not decided: stage 1 is not complete"
    d, seeds = paired(by["slca_paper"], by["slca"], "split_auc")
    if len(seeds) < 10:
        return f"not decided: {len(seeds)} of 10 seeds finished"
    mu, hw = t_interval(d)
    su, shw = t_interval(paired(by["slca_paper"], by["slca"], "auc")[0])
    if mu + hw < 0 and not su + shw < 0:
        return f"slca_paper becomes the default (split-area contrast {mu:+.3f} ± {hw:.3f}, Success-area {su:+.3f} ± {shw:.3f})"
    who = "slca better" if mu - hw > 0 else ("slca_paper better on the split but worse on Success" if mu + hw < 0 else
                                            "no difference detected")
    return f"slca stays the default ({who}: split-area contrast {mu:+.3f} ± {hw:.3f}, Success-area {su:+.3f} ± {shw:.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=str(DEFAULT_ROOT))
    ap.add_argument("--figures", action="store_true", help="print every named figure")
    a = ap.parse_args()
    root = Path(a.root)
    by = arms(root)
    if a.figures:
        for name, xs in figures(root).items():
            print(f"{name}: {fmt(xs, sign=' - ' in name)}")
        return
    present = [e for e in ARMS if e in by]
    print("| endpoint | " + " | ".join(f"{e} (n={len(by[e])})" for e in present) + " |")
    print("|---" * (len(present) + 1) + "|")
    for k, label in KEYS.items():
        print(f"| {label} | " + " | ".join(fmt([by[e][s][k] for s in sorted(by[e])]) for e in present) + " |")
    print("\n| contrast (paired by seed) | seeds | " + " | ".join(KEYS[k] for k in ("split_auc", "auc")) + " |")
    print("|---|---|---|---|")
    for x, y in REGISTERED:
        if x in by and y in by:
            d1, seeds = paired(by[x], by[y], "split_auc")
            d2, _ = paired(by[x], by[y], "auc")
            print(f"| {x} - {y} | {len(seeds)} | {fmt(d1, sign=True)} | {fmt(d2, sign=True)} |")
    print("\nsecondary contrasts:")
    for x, y in REGISTERED:
        if x in by and y in by:
            print(f"  {x} - {y}: " + "; ".join(f"{KEYS[k]} {fmt(paired(by[x], by[y], k)[0], sign=True)}" for k in KEYS
                                              if k not in ("split_auc", "auc")))
    print("\ndecision:", decision(by))


if __name__ == "__main__":
    main()
