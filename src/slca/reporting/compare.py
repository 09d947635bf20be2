"""The report of a multi-seed, multi-estimator comparison (`slca compare`).

Every run shares one config (hyperparameters fixed before the comparison); only
the estimator and the seed change. The runs are trained by
:func:`slca.training.experiments.run_compare`. The report gives means with 95% t-intervals, every seed, paired
differences against the first estimator, learning curves with bands, steps to a
fixed tool-success level, and the paper's diagnostics.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slca import metrics as M
from slca.reporting.report import final_eval, md_header, md_row, mean_of, metric_range, read_metrics
from slca.training.experiments import RunSpec
from slca.training.samples import SampleGroup, SampleRollout, is_finite_number, read_samples

__all__ = ["summarize", "write_compare_report", "t_interval", "band"]


def t_interval(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t interval (``scipy.stats.t``; half-width NaN for n < 2).

    Non-finite values are left out; NaN mean when none is left.
    """
    from scipy import stats

    v = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return float("nan"), float("nan")
    mu = sum(v) / len(v)
    if len(v) < 2:
        return mu, float("nan")
    sd = math.sqrt(sum((x - mu) ** 2 for x in v) / (len(v) - 1))
    return mu, float(stats.t.ppf(0.5 + level / 2, len(v) - 1)) * sd / math.sqrt(len(v))


def _steps_to(rows: list[dict[str, Any]], key: str, level: float, k: int = 5) -> float:
    """First step at which the k-step moving average of ``key`` reaches ``level`` (NaN if never)."""
    vals = [r.get(key) for r in rows]
    win: list[float] = []
    for r, v in zip(rows, vals):
        if isinstance(v, (int, float)) and math.isfinite(v):
            win = (win + [float(v)])[-k:]
            if len(win) == k and sum(win) / k >= level:
                return float(r["step"])
    return float("nan")


SUMMARY_KEYS = list(M.COMPARE_SUMMARY)
"""Per-run numbers of the comparison (:data:`slca.metrics.COMPARE_SUMMARY`): the area under the held-out
tool-task Success curve (``auc/``, see :func:`curve_auc`), final held-out metrics (``eval/``: in distribution
for toolworld) and the final tool-task Success on toolworld's out-of-distribution test split (``eval_test/``)."""
DIAG_KEYS = list(M.COMPARE_DIAGNOSTICS)
"""Diagnostics of the comparison, means over training steps (:data:`slca.metrics.COMPARE_DIAGNOSTICS`)."""


def curve_auc(rows: list[dict[str, Any]], key: str) -> float:
    """Normalised area under a metric's curve: the trapezoid area over the evaluated steps divided by
    their span (the curve's mean height, in the metric's units); NaN with fewer than two points."""
    pts = sorted((float(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]))
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return float("nan")
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


_PROBES = (M.PROBE_LOGP_PARALLEL, M.PROBE_LOGP_SEQUENTIAL, M.PROBE_PARALLEL_PREF)


def _held_out_per_kind(key: str) -> bool:
    """Whether ``key`` is a held-out per-kind metric (``eval/kind/<kind>/success`` or ``.../reward_summary``)."""
    return M.eval_set_of(key) == M.EVAL_SET and (M.EVAL_KIND_SUCCESS.matches(key) or M.EVAL_KIND_SUMMARY.matches(key))


def summarize(specs: list[RunSpec], level: float) -> dict[str, Any]:
    """Per-run numbers and per-estimator means with intervals."""
    per_run: list[dict[str, Any]] = []
    for sp in specs:
        rows = read_metrics(sp.run_dir)
        ev = final_eval(rows)
        rec: dict[str, Any] = {"estimator": sp.estimator, "seed": sp.seed}
        ev.update(final_eval(rows, M.TEST_SET))
        rec.update({k: curve_auc(rows, k[len(M.AUC_PREFIX):]) if k.startswith(M.AUC_PREFIX) else ev.get(k, float("nan"))
                    for k in SUMMARY_KEYS})
        rec.update({k: v for k, v in ev.items() if _held_out_per_kind(k)})
        probes = [r for r in rows if M.PROBE_PARALLEL_PREF.name in r]
        if probes:
            rec.update({m.name: probes[-1][m.name] for m in _PROBES if m.name in probes[-1]})
        rec.update({k: mean_of(rows, k) for k in DIAG_KEYS})
        success = M.REWARD_EXEC.key(component="success")
        rec["steps_to_level"] = _steps_to(rows, success if any(success in r for r in rows) else M.REWARD_TOOL.name, level)
        per_run.append(rec)
    return {"runs": per_run}


@dataclass(frozen=True)
class DiagnosticCase:
    """A recorded rollout with its group's lowest execution and highest summary reward (the paper's case).

    Attributes:
        run: the run folder's name.
        step, kind: the recorded group's step and task kind.
        tool_reward, summary_reward: the rollout's rewards.
        tool_adv: estimator -> mean advantage on the rollout's tool tokens.
    """

    run: str
    step: int
    kind: str
    tool_reward: float
    summary_reward: float
    tool_adv: dict[str, float]


def _case(group: SampleGroup) -> tuple[SampleRollout, float, float] | None:
    """The group's rollout with the lowest execution and the highest summary reward, if one has both (and tool tokens)."""
    rs = group.rollouts
    tr = [r.tool_reward for r in rs]
    sr = [r.summary_reward for r in rs]
    if len(rs) < 2 or not all(is_finite_number(x) for x in tr + sr) or max(tr) == min(tr) or max(sr) == min(sr):
        return None
    i = tr.index(min(tr))
    if sr[i] != max(sr) or not any(rs[i].tool_mask):
        return None
    return rs[i], tr[i], sr[i]


def diagnostic_cases(specs: list[RunSpec]) -> list[DiagnosticCase]:
    """Recorded rollouts with the group's lowest execution and highest summary reward."""
    out = []
    for sp in specs:
        f = sp.run_dir / "samples.json"
        if not f.exists():
            continue
        for grp in read_samples(f):
            case = _case(grp)
            if case is None:
                continue
            r, tool_reward, summary_reward = case
            # every estimator the run recorded (the registry's reference estimators)
            adv = {e: r.segment_mean(e, tool=True) for e in r.adv}
            out.append(DiagnosticCase(sp.run_dir.name, grp.step, grp.kind, tool_reward, summary_reward, adv))
    return out


def _cases_md(cases: list[DiagnosticCase]) -> list[str]:
    """The report section on :func:`diagnostic_cases`: one column per recorded estimator."""
    if not cases:
        return []
    ests = list(cases[0].tool_adv)
    L = ["", "## The diagnostic case in recorded groups", "",
         "Groups in which one rollout has the worst execution reward but the best summary reward "
         "(e.g. redundant sequential calls, then the best answer). Mean advantage on *its tool tokens* "
         "under each estimator, computed on the same rewards and masks:", "",
         *md_header(["run", "step", "task kind", "exec reward", "summary reward", *(e.upper() for e in ests)])]
    for c in cases[:12]:
        L.append(md_row([c.run, c.step, c.kind, f"{c.tool_reward:.2f}", f"{c.summary_reward:.2f}", *(f"{c.tool_adv[e]:+.3f}" for e in ests)]))
    if "grpo" in ests and "slca" in ests:
        n_sign = sum(1 for c in cases if c.tool_adv["grpo"] > 0 > c.tool_adv["slca"])
        L += ["", f"{len(cases)} such rollouts recorded; in {n_sign} of them GRPO *rewarded* the bad tool segment (advantage > 0) while SLCA punished it."]
    return L


def _curve(specs: list[RunSpec], est: str, key: str) -> tuple[list[int], list[float], list[float]]:
    by_step: dict[int, list[float]] = {}
    for sp in specs:
        if sp.estimator != est:
            continue
        for r in read_metrics(sp.run_dir):
            v = r.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                by_step.setdefault(r["step"], []).append(float(v))
    xs = sorted(by_step)
    mus, hws = zip(*[t_interval(by_step[x]) for x in xs]) if xs else ((), ())
    return xs, list(mus), [0.0 if math.isnan(h) else h for h in hws]


def band(key: str, mu: list[float], hw: list[float]) -> tuple[list[float], list[float]]:
    """Lower and upper edges of an interval band (``mu -/+ hw``), clipped to the metric's range
    (:func:`slca.reporting.report.metric_range`): with 2 seeds a t-interval on Success can reach below 0."""
    lo, hi = metric_range(key)
    return [max(lo, m - h) for m, h in zip(mu, hw)], [min(hi, m + h) for m, h in zip(mu, hw)]


PANELS = [(p.key, p.title) for p in M.COMPARE_PANELS]
"""(metric, title) of each panel of ``curves_compare.png`` (:data:`slca.metrics.COMPARE_PANELS`): one line per estimator with its band."""


def write_compare_report(specs: list[RunSpec], out: Path, *, level: float, command: str, wall_s: float, title: str = "slca compare") -> Path:
    """The comparison's docs-ready ``report.md``, its numbers (``summary.json``) and ``curves_compare.png``; returns the markdown."""
    summary = summarize(specs, level)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    ests = list(dict.fromkeys(sp.estimator for sp in specs))
    seeds = sorted({sp.seed for sp in specs})
    _plot_curves(specs, ests, out / "curves_compare.png")
    by_est = {e: [r for r in summary["runs"] if r["estimator"] == e] for e in ests}
    L = [f"# {title}", "", f"Command: `{command}`", "", f"Estimators: {', '.join(ests)}; seeds: {seeds}; wall time {wall_s / 60:.1f} min.", "",
          "Means over seeds with 95% Student-t intervals (± half-width). Held-out metrics are from the final evaluation; "
         "`auc` is the area under the held-out curve over all evaluations divided by their span (`slca.reporting.compare.curve_auc`); "
         "`test:` columns are toolworld's out-of-distribution test split.", ""]
    L += _heldout_md(by_est)
    L += _paired_md(by_est, seeds)
    L += _mean_table_md("Diagnostics (mean over training steps)", by_est, DIAG_KEYS, DIAG_KEYS)
    kinds = sorted({k.split("/")[2] for r in summary["runs"] for k in r if _held_out_per_kind(k)})
    if kinds:
        L += _mean_table_md("Held-out Success per task kind", by_est, [M.EVAL_KIND_SUCCESS.key(set=M.EVAL_SET, kind=k) for k in kinds], kinds)
    L += _seeds_md(summary["runs"])
    L += _cases_md(diagnostic_cases(specs))
    L += ["", f"Steps to level: first step at which the 5-step moving average of the training tool success reaches {level}.", "",
          "![curves](curves_compare.png)", "",
          "Curves: the mean over seeds at each `step` of metrics.jsonl (raw, not smoothed); bands: 95% Student-t intervals over seeds, "
          "clipped to the metric's range (e.g. [0, 1] for Success and rewards, [-1, 1] for the cosine).", ""]
    md = out / "report.md"
    md.write_text("\n".join(L))
    return md


def _plot_curves(specs: list[RunSpec], ests: list[str], png: Path) -> None:
    """:data:`PANELS`: per estimator the mean over seeds at each step, with its clipped t-interval band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(3, 3, figsize=(16, 12))
    logged = {k for sp in specs for r in read_metrics(sp.run_dir) for k in r}
    for ax, (key, ttl) in zip(axes.flat, [(p.key, p.title) for p in M.with_logged_ood_split(M.COMPARE_PANELS, logged)]):
        for est in ests:
            xs, mu, hw = _curve(specs, est, key)
            if not xs:
                continue
            ax.plot(xs, mu, label=est, marker="o" if len(xs) < 12 else "")
            ax.fill_between(xs, *band(key, mu, hw), alpha=0.2)
        ax.set_title(ttl, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 0.5 ticks
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle("lines: mean over seeds per step; bands: 95% Student-t intervals over seeds, clipped to each metric's range", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _fmt_interval(mu: float, hw: float) -> str:
    """``mu ± hw`` (``mu`` alone when there is no half-width, ``n/a`` when there is no mean)."""
    if math.isnan(mu):
        return "n/a"
    return f"{mu:.3f} ± {hw:.3f}" if not math.isnan(hw) else f"{mu:.3f}"


def _interval(xs: list[float]) -> str:
    return _fmt_interval(*t_interval(xs))


def _short(key: str) -> str:
    """A column name: ``success``, ``tool_tasks/success``, ``auc tool_tasks/success``, ``test: tool_tasks/success``."""
    if key.startswith(M.AUC_PREFIX):
        return "auc " + _short(key[len(M.AUC_PREFIX):])
    prefix, rest = key.split("/", 1)
    return rest if prefix == M.EVAL_SET else f"{prefix[len('eval_'):]}: {rest}"


def _heldout_md(by_est: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Held-out metrics per estimator (mean ± half-width over seeds) and the seeds that reached the level."""
    L = ["## Held-out metrics", "", *md_header(["estimator", *map(_short, SUMMARY_KEYS), "steps to level"])]
    for est, rr in by_est.items():
        stl = [r["steps_to_level"] for r in rr]
        reached = sum(1 for x in stl if math.isfinite(x))
        L.append(md_row([est, *(_interval([r[k] for r in rr]) for k in SUMMARY_KEYS), f"{_interval(stl)} ({reached}/{len(rr)} reached)"]))
    return L


def _paired_md(by_est: dict[str, list[dict[str, Any]]], seeds: list[int]) -> list[str]:
    """Differences of each estimator's held-out metrics from the first estimator's, seed by seed (none with one estimator)."""
    ests = list(by_est)
    if len(ests) < 2:
        return []
    base = ests[0]
    of = {(r["estimator"], r["seed"]): r for rr in by_est.values() for r in reversed(rr)}  # the first run of a seed
    L = ["", f"## Paired differences against {base} (same seed)", "", *md_header(["estimator", *map(_short, SUMMARY_KEYS)])]
    for est in ests[1:]:
        cells = [_interval([of[est, s][k] - of[base, s][k] for s in seeds]) for k in SUMMARY_KEYS]
        L.append(md_row([f"{est} - {base}", *cells]))
    return L


def _mean_table_md(heading: str, by_est: dict[str, list[dict[str, Any]]], keys: list[str], columns: list[str]) -> list[str]:
    """One row per estimator: the mean ± half-width over seeds of each of ``keys`` (NaN where a run lacks one)."""
    L = ["", f"## {heading}", "", *md_header(["estimator", *columns])]
    for est, rr in by_est.items():
        L.append(md_row([est, *(_interval([r.get(k, float("nan")) for r in rr]) for k in keys)]))
    return L


def _seeds_md(runs: list[dict[str, Any]]) -> list[str]:
    """Every run's held-out metrics and parallel-turn preference."""
    L = ["", "## Every seed", "", *md_header(["estimator", "seed", *map(_short, SUMMARY_KEYS), "parallel_pref"])]
    for r in runs:
        L.append(md_row([r["estimator"], r["seed"], *(f"{r[k]:.3f}" for k in SUMMARY_KEYS), f"{r.get(M.PROBE_PARALLEL_PREF.name, float('nan')):.2f}"]))
    return L
