"""Tables for docs/results.md from study 25 (scripts/run_study25.sh; plan in docs/results.md).

    .venv/bin/python scripts/study25_tables.py [docs/results/study25] [--figures]

Reads the finished runs of each stage (A: grpo, slca; B_noise: the same with summary
noise; C: gdpo, slca_cond, slca_turn; D_segments: slca with the unbiased missing-segment
options) and prints, with 95% Student-t intervals over the seeds that every compared run
finished:

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
  minus stage A's SLCA, paired by seed, and how often those options acted;
* labelled as post-hoc (not in the plan, descriptive only): the evaluations at step 8, the
  other estimators against SLCA, SLCA - GRPO within stage B, volatility within stage C.

Nothing here is tuned: the endpoints and the pairing are the plan's.

Every number is also available by name: :func:`figures` maps a name such as
``"A/slca - A/grpo: auc"`` (an arm's mean: ``"A/slca: auc"``; the mechanism arm's interaction:
``"interaction: auc"``) to its per-seed values, :func:`fmt` formats them as the docs quote
them, and ``--figures`` prints every name. ``tests/test_results_figures.py`` checks the figures
README.md, docs/results.md and docs/beyond.md quote for study 25 against them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from slca.reporting.compare import curve_auc, t_interval
from slca.reporting.report import final_eval, mean_of, read_metrics

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "docs" / "results" / "study25"
STEPS = 16
EVAL_STEPS = (0, 8, 16)
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
# the held-out metrics also kept at every evaluation step, as "step<k>/<key>"
PER_STEP = ("eval/tool_tasks/success", "eval/parallel_split", "eval/reward_summary", "eval_test/tool_tasks/success")
# logged from stage D on (issue 26) and by slca_cond
ACTED = ("rollout/no_tool_segment", "rollout/no_summary_segment", "rollout/mixed_call_groups")
STAGES = {"A": "A", "B": "B_noise", "C": "C", "D": "D_segments"}
# paired contrasts (a - b, same seed): registered by the plan, then post-hoc (descriptive only)
REGISTERED = [("A/slca", "A/grpo"), ("C/gdpo", "A/grpo"), ("C/slca_cond", "A/grpo"), ("C/slca_turn", "A/grpo"),
              ("B/grpo", "A/grpo"), ("B/slca", "A/slca"), ("D/slca", "A/slca")]
POST_HOC = [("C/slca_cond", "A/slca"), ("C/gdpo", "A/slca"), ("C/slca_turn", "A/slca"), ("B/slca", "B/grpo"),
            ("C/slca_cond", "C/gdpo"), ("C/slca_turn", "C/gdpo"), ("C/slca_cond", "C/slca_turn")]


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
    for k in (*ACTED, "adv/cond_subgroup_frac"):
        out[f"train/{k}"] = mean_of(train, k)
    logged = [r for r in train if isinstance(r.get("rollout/no_summary_segment"), (int, float))]
    # the share of training steps with at least one rollout that ended without an answer
    out["steps_without_answer"] = sum(r["rollout/no_summary_segment"] > 0 for r in logged) / len(logged) if logged else math.nan
    for s in EVAL_STEPS:
        at = next((r for r in rows if r.get("step") == s and "eval/tool_tasks/success" in r), {})
        for k in PER_STEP:
            v = at.get(k)
            out[f"step{s}/{k}"] = float(v) if isinstance(v, (int, float)) else math.nan
    out["step0/tool_tasks/success"] = out["step0/eval/tool_tasks/success"]
    # the first update, where two runs of one seed still share their rollouts (same weights, same tasks)
    first = next((r for r in train if r.get("step") == 1), {})
    for k in ("adv/summary_std", "rollout/mixed_call_groups", "rollout/no_summary_segment"):
        v = first.get(k)
        out[f"step1/{k}"] = float(v) if isinstance(v, (int, float)) else math.nan
    return out


def stage(root: Path, name: str) -> dict[str, dict[int, dict[str, float]]]:
    """``{estimator: {seed: numbers}}`` of a stage's finished runs."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for d in sorted((root / name).glob("*-seed*")):
        est, seed = d.name.rsplit("-seed", 1)
        nums = run_numbers(d)
        if nums is not None:
            out.setdefault(est, {})[int(seed)] = nums
    return out


def arms(root: Path) -> dict[str, dict[int, dict[str, float]]]:
    """Every arm of the study by name, ``"<stage letter>/<estimator>"`` (``"B/grpo"``: GRPO under summary noise)."""
    return {f"{letter}/{est}": runs for letter, name in STAGES.items() for est, runs in stage(root, name).items()}


def fmt(xs: list[float], sign: bool = False, decimals: int = 3, percent: bool = False) -> str:
    """``mean ± half-width`` of a 95% t-interval, as the docs quote it (``+0.020 ± 0.013``; ``20.9% ± 2.1%``)."""
    mu, hw = t_interval(xs)
    if math.isnan(mu):
        return "n/a"
    k, unit = (100.0, "%") if percent else (1.0, "")
    m = f"{k * mu:+.{decimals}f}" if sign else f"{k * mu:.{decimals}f}"
    return f"{m}{unit} ± {k * hw:.{decimals}f}{unit}" if not math.isnan(hw) else m + unit


def paired(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], key: str) -> tuple[list[float], list[int]]:
    seeds = sorted(set(a) & set(b))
    return [a[s][key] - b[s][key] for s in seeds], seeds


def figures(root: Path = DEFAULT_ROOT) -> dict[str, list[float]]:
    """Every figure of the study by name, as its per-seed values (means and intervals: :func:`fmt`).

    ``"<arm>: <key>"`` an arm's values; ``"<arm a> - <arm b>: <key>"`` paired by seed (the pairs
    of :data:`REGISTERED` and :data:`POST_HOC`); ``"interaction: <key>"`` the mechanism arm's
    ``(B/slca - A/slca) - (B/grpo - A/grpo)``. Keys: those of :func:`run_numbers`.
    """
    by_arm = arms(root)
    out: dict[str, list[float]] = {}
    for name, runs in by_arm.items():
        seeds = sorted(runs)
        for k in runs[seeds[0]]:
            out[f"{name}: {k}"] = [runs[s][k] for s in seeds]
    for a, b in REGISTERED + POST_HOC:
        if a in by_arm and b in by_arm:
            for k in by_arm[a][min(by_arm[a])]:
                out[f"{a} - {b}: {k}"] = paired(by_arm[a], by_arm[b], k)[0]
    if {"A/grpo", "A/slca", "B/grpo", "B/slca"} <= set(by_arm):
        A_g, A_s, B_g, B_s = (by_arm[n] for n in ("A/grpo", "A/slca", "B/grpo", "B/slca"))
        seeds = sorted(set(A_g) & set(A_s) & set(B_g) & set(B_s))
        for k in A_s[seeds[0]]:
            out[f"interaction: {k}"] = [(B_s[s][k] - A_s[s][k]) - (B_g[s][k] - A_g[s][k]) for s in seeds]
    return out


def empty_tool_only(a: dict[int, dict[str, float]], d: dict[int, dict[str, float]]) -> list[int]:
    """Seeds whose step-1 summary advantages differ between stage A's and D's SLCA (same rollouts at step 1) with no mixed
    group and no rollout without an answer at that step: there ``empty_tool`` alone made the difference."""
    return [s for s in sorted(set(a) & set(d)) if d[s]["step1/adv/summary_std"] != a[s]["step1/adv/summary_std"]
            and d[s]["step1/rollout/mixed_call_groups"] == 0 and d[s]["step1/rollout/no_summary_segment"] == 0]


def ahead(xs: list[float]) -> str:
    """How many seeds are above 0 of how many: ``9/10``."""
    return f"{sum(x > 0 for x in xs)}/{len(xs)}"


def signs(xs: list[float]) -> str:
    """How many seeds lie above and below 0: ``9 above, 1 below``."""
    return f"{sum(x > 0 for x in xs)} above, {sum(x < 0 for x in xs)} below"


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", help="the study's records (default: the repository's docs/results/study25)")
    ap.add_argument("--figures", action="store_true", help="print every named figure (the names tests/test_results_figures.py uses)")
    args = ap.parse_args()
    root = Path(args.root) if args.root else DEFAULT_ROOT
    F = figures(root)
    if args.figures:
        for name, xs in F.items():
            print(f"{name}\t{fmt(xs, sign=' - ' in name or name.startswith('interaction'))}\t{ahead(xs)}")
        return
    by_arm = arms(root)
    A = {e[2:]: r for e, r in by_arm.items() if e.startswith("A/")}
    C = {e[2:]: r for e, r in by_arm.items() if e.startswith("C/")}
    B = {e[2:]: r for e, r in by_arm.items() if e.startswith("B/")}
    cols = list(KEYS)
    print(f"# Study 25 tables ({args.root or 'docs/results/study25'})\n")
    print("Finished runs: " + ", ".join(f"{e} {len(v)}" for e, v in {**A, **C}.items())
          + (", " + ", ".join(f"{e}+noise {len(v)}" for e, v in B.items()) if B else ""))

    rows = []
    for name in [n for n in by_arm if n[0] in "AC"] + [n for n in by_arm if n[0] == "B"]:
        label = name[2:] + (" + noise" if name[0] == "B" else "")
        rows.append([label, str(len(by_arm[name])), fmt(F[f"{name}: step0/tool_tasks/success"])] + [fmt(F[f"{name}: {k}"]) for k in cols])
    _table("## Means over seeds (95% t-intervals)", ["estimator", "n", "warm start (step 0)"] + [KEYS[k] for k in cols], rows)

    if "grpo" in A:
        rows = [[f"{a[2:]} - grpo", str(len(F[f'{a} - A/grpo: auc']))] + [fmt(F[f"{a} - A/grpo: {k}"], sign=True) for k in cols]
                + [ahead(F[f"{a} - A/grpo: auc"])] for a, b in REGISTERED if b == "A/grpo" and a[0] in "AC" and a in by_arm]
        _table("## Paired against GRPO (same seed)", ["pair", "seeds"] + [KEYS[k] for k in cols] + ["AUC: seeds a > b"], rows)

        per_step = ["eval/tool_tasks/success", "eval/parallel_split", "eval/reward_summary"]
        rows = []
        for name in ("A/grpo", "A/slca", "A/slca - A/grpo"):
            signed = " - " in name
            for k in per_step:
                rows.append([name, k] + [fmt(F[f"{name}: step{s}/{k}"], sign=signed) + (f" ({signs(F[f'{name}: step{s}/{k}'])})" if signed and s else "")
                                         for s in EVAL_STEPS])
        _table("## Stage A at each evaluation (step 16 is the registered final value; step 8 is post-hoc, descriptive)",
               ["arm", "metric"] + [f"step {s}" for s in EVAL_STEPS], rows)

    if {"grpo", "slca"} <= set(B) and {"grpo", "slca"} <= set(A):
        keys = ["auc", "train/reward/tool", "eval/tool_tasks/success", "eval/reward_summary"]
        rows = [[f"{e}: noise - clean", str(len(F[f'B/{e} - A/{e}: auc']))] + [fmt(F[f"B/{e} - A/{e}: {k}"], sign=True) for k in keys]
                for e in ("grpo", "slca")]
        rows.append(["interaction (slca_noise - slca) - (grpo_noise - grpo)", str(len(F["interaction: auc"]))]
                    + [fmt(F[f"interaction: {k}"], sign=True) for k in keys])
        _table("## The mechanism arm: summary noise (std 0.5)", ["quantity", "seeds"] + [KEYS[k] for k in keys], rows)
        keys_b = ["auc", "eval/tool_tasks/success", "eval/parallel_split", "train/reward/tool", "train/adv/contamination",
                  "train/grad/volatility"]
        _table("Post-hoc, within stage B (both under noise; the volatility of B is issue 28's definition, comparable within B only):",
               ["pair", "seeds"] + [KEYS[k] for k in keys_b] + ["AUC: seeds a > b"],
               [["slca_noise - grpo_noise", str(len(F["B/slca - B/grpo: auc"]))]
                + [fmt(F[f"B/slca - B/grpo: {k}"], sign=True) for k in keys_b] + [ahead(F["B/slca - B/grpo: auc"])]])

    if "slca" in A and C:
        keys_c = ["auc", "eval/tool_tasks/success", "eval/kind/parallel/success", "eval/kind/chain/success", "eval/parallel_split",
                  "eval/reward_summary"]
        rows = [[f"{a[2:]} - slca", str(len(F[f'{a} - A/slca: auc']))] + [fmt(F[f"{a} - A/slca: {k}"], sign=True) for k in keys_c]
                + [ahead(F[f"{a} - A/slca: auc"])] for a, b in POST_HOC if b == "A/slca" and a in by_arm]
        _table("## Post-hoc: stage C against stage A's SLCA (not in the plan; descriptive only)",
               ["pair", "seeds"] + [KEYS[k] for k in keys_c] + ["AUC: seeds a > b"], rows)
        rows = [[f"{a[2:]} - {b[2:]}", fmt(F[f"{a} - {b}: train/grad/volatility"], sign=True)]
                for a, b in POST_HOC if a.startswith("C/") and b.startswith("C/") and a in by_arm and b in by_arm]
        _table("Post-hoc, volatility within stage C (issue 28's definition):", ["pair", KEYS["train/grad/volatility"]], rows)
        if "C/slca_cond: train/adv/cond_subgroup_frac" in F:
            print(f"\nslca_cond: rollouts with another summary baseline than SLCA's (adv/cond_subgroup_frac, mean over steps and seeds): "
                  f"{fmt(F['C/slca_cond: train/adv/cond_subgroup_frac'])}")

    if "D/slca" in by_arm and "A/slca" in by_arm:
        # volatility left out: A logged the pre-issue-28 definition, D the current one
        cols_d = [k for k in cols if not k.startswith(("train/adv", "train/grad/volatility"))] + ["train/adv/contamination"]
        d = "D/slca - A/slca"
        _table("## Stage D: the unbiased missing-segment options (D's slca - A's slca, same seed)",
               ["pair", "seeds"] + [KEYS[k] for k in cols_d] + ["AUC: seeds D > A"],
               [["D - A (slca)", str(len(F[f"{d}: auc"]))] + [fmt(F[f"{d}: {k}"], sign=True) for k in cols_d] + [ahead(F[f"{d}: auc"])]])
        xs = F[f"{d}: auc"]
        print(f"\nAUC per seed, D - A: {sum(x > 0 for x in xs)} ahead, {sum(x < 0 for x in xs)} behind, {sum(x == 0 for x in xs)} equal; "
              f"largest |difference| {max(abs(x) for x in xs):.3f}")
        print("How often the options acted (D, mean over training steps and seeds): "
              + ", ".join(f"{k[len('rollout/'):]} {fmt(F[f'D/slca: train/{k}'])}" for k in ACTED)
              + f"; steps with a rollout that ended without an answer {fmt(F['D/slca: steps_without_answer'])}")
        A_s, D_s = by_arm["A/slca"], by_arm["D/slca"]
        print("Step 1 (A and D share their rollouts): seeds whose summary advantages differ (adv/summary_std) although no group "
              "mixed callers with non-callers and every rollout answered, so that only empty_tool=both on whole-group "
              "abstentions can have changed them: " + ", ".join(str(s) for s in empty_tool_only(A_s, D_s)))


if __name__ == "__main__":
    main()
