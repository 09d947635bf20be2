"""Tables for docs/results.md from study 47 (scripts/run_study47.sh; plan in docs/results.md, "Study 47").

    .venv/bin/python scripts/study47_tables.py [--arm NAME=FOLDER ...]

Each arm is a folder of ``slca-seed<k>`` runs; the control is study 41's ``slca`` runs
(``docs/results/study41/main``), which stands only once ``run_study47.sh control`` found them equal to a
rerun at the study's commit. By default the arms are ``turn_mean`` (``docs/results/study47/turn_mean``) and
``span`` (``docs/results/study47/span``), each where it has finished runs. Printed, with 95% Student-t
intervals over the seeds both runs finished (paired by seed), as the plan registers them:

* the primary endpoint, arm - control on the area under the held-out parallel-split curve (``curve_auc`` of
  ``eval/parallel_split`` over steps 0, 4, 8, 12, 16; lower is better), and the plan's reading of it;
* the secondary endpoints: the area under the held-out tool-task Success curve and its step-16 value, the
  held-out summary reward, the training execution reward, the mean CPU seconds per step (``perf/cpu_s``;
  study 41's records predate it, so the control has none).

Every run must name the plan's build (study 41's reader refuses another). ``--arm slca_paper=
docs/results/study41/main`` with ``--estimator slca_paper`` reproduces study 41's contrast (a), a check of
this script against figures already published.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from study41_tables import KEYS, fmt, paired, run_numbers  # the plan's endpoints and study 41's reader

from slca.reporting.compare import t_interval
from slca.reporting.report import mean_of, read_metrics

ROOT = Path(__file__).resolve().parents[1] / "docs" / "results"
CONTROL = ROOT / "study41" / "main"
ARMS = {"turn_mean": ROOT / "study47" / "turn_mean", "span": ROOT / "study47" / "span"}
SECONDARY = ("auc", "eval/tool_tasks/success", "eval/reward_summary", "train/reward/tool")


def runs(folder: Path, estimator: str = "slca") -> dict[int, dict[str, float]]:
    """``{seed: endpoints}`` of the finished ``<estimator>-seed<k>`` runs of ``folder``, with the mean ``perf/cpu_s``."""
    out: dict[int, dict[str, float]] = {}
    for d in sorted(folder.glob(f"{estimator}-seed*")):
        nums = run_numbers(d)
        if nums is not None:
            rows = [r for r in read_metrics(d) if r.get("step", 0) >= 1]
            out[int(d.name.rsplit("-seed", 1)[1])] = {**nums, "cpu_s": mean_of(rows, "perf/cpu_s")}
    return out


def reading(d: list[float]) -> str:
    """The plan's words for a contrast on the primary endpoint (lower is better)."""
    mu, hw = t_interval(d)
    if len(d) < 10:
        return f"not read: {len(d)} of 10 seeds finished"
    if mu + hw < 0:
        return "the arm is better"
    if mu - hw > 0:
        return "the arm is worse"
    return "no difference detected at this budget"


def table(arms: dict[str, str], estimator: str = "slca") -> list[str]:
    """The contrast table's lines (header first), one row per arm; then each run arm's per-seed primary differences."""
    control = runs(CONTROL)
    lines = ["| arm - control (paired by seed) | seeds | " + KEYS["split_auc"] + " | reading | "
             + " | ".join(KEYS[k] for k in SECONDARY) + " | CPU s per step (arm) |", "|---" * (5 + len(SECONDARY)) + "|"]
    per_seed = []
    for name, folder in arms.items():
        arm = runs(Path(folder), estimator)
        if not arm:
            lines.append(f"| {name} | 0 | no finished run in {folder} |")
            continue
        d, seeds = paired(arm, control, "split_auc")
        cpu = [arm[s]["cpu_s"] for s in sorted(arm) if not math.isnan(arm[s]["cpu_s"])]
        lines.append(f"| {name} | {len(seeds)} | {fmt(d, sign=True)} | {reading(d)} | "
                     + " | ".join(fmt(paired(arm, control, k)[0], sign=True) for k in SECONDARY)
                     + f" | {fmt(cpu, decimals=1) if cpu else 'n/a'} |")
        per_seed.append(f"{name} - control, primary, seeds {', '.join(map(str, seeds))}: " + ", ".join(f"{x:+.3f}" for x in d))
    return lines + [""] + per_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=FOLDER", help="an arm's folder (default: the plan's)")
    ap.add_argument("--estimator", default="slca", help="the arms' run prefix (default slca)")
    a = ap.parse_args()
    arms = dict(x.split("=", 1) for x in a.arm) if a.arm else {k: str(v) for k, v in ARMS.items()}
    print(f"control: study 41's slca, {len(runs(CONTROL))} seeds\n")
    print("\n".join(table(arms, a.estimator)))


if __name__ == "__main__":
    main()
