"""Multi-seed, multi-estimator comparisons (`slca compare`).

Every run shares one config (hyperparameters fixed before the comparison); only
the estimator and the seed change. Runs execute as separate `slca train`
processes, ``jobs`` at a time (one torch thread each), so a 2-core machine runs
two at once. The report gives means with 95% t-intervals, every seed, paired
differences against the first estimator, learning curves with bands, steps to a
fixed tool-success level, and the paper's diagnostics.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slca import metrics as M
from slca._fs import writing
from slca._procs import Children
from slca.core.registry import _entry_points, resolve_estimator
from slca.reporting.report import final_eval, md_header, md_row, mean_of, metric_range, read_metrics
from slca.training.baseline_cache import BASELINE_CACHE_ENV
from slca.training.config import config_diff, load_config
from slca.models.named import model_fingerprint
from slca.training.runs import RESUME_MAY_CHANGE, RunFolder, checkpoint_step, model_record_problem, newest_intact_checkpoint, write_atomic
from slca.training.samples import SampleGroup, SampleRollout, is_finite_number, read_samples

__all__ = ["RunSpec", "run_compare", "train_process", "train_command", "train_env", "check_out", "run_status", "check_runs", "summarize", "write_compare_report", "t_interval", "band"]


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


@dataclass(frozen=True)
class RunSpec:
    estimator: str
    seed: int
    run_dir: Path


def run_config(spec: RunSpec, overrides: list[str]) -> Any:
    """The validated config ``slca train`` builds for one run of the comparison."""
    return load_config(None, [*overrides, f"estimator={spec.estimator}", f"seed={spec.seed}", f"run_dir={spec.run_dir}"])


REUSE_MAY_DIFFER = tuple(f for f in RESUME_MAY_CHANGE if f in ("micro_batch_size", "save_every", "keep_checkpoints", "report_to", "project"))
"""Fields in which a run folder may differ from the comparison's config and still be reused or resumed: those of
:data:`slca.training.runs.RESUME_MAY_CHANGE` that change neither the updates nor the records the report reads (when a
run evaluates, ``eval_every``, shapes its curve's area; the diagnostics' cadence, their means)."""


def run_status(spec: RunSpec, overrides: list[str]) -> tuple[str, list[str]]:
    """What a comparison does with a run folder, and why.

    ``("new", [])`` nothing there yet; ``("done", [])`` finished with this very
    config: reused; ``("resume", [])`` interrupted (or shorter) with this config:
    continued with ``--resume``; ``("differs", diff)`` trained with another config
    (or not a run slca wrote): retrained only with ``overwrite``.
    """
    cfg = run_config(spec, overrides)
    folder = RunFolder(cfg)
    if not folder.holds_run():
        return "new", []
    try:
        stored = json.loads((spec.run_dir / "config.json").read_text())
        if not isinstance(stored, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError) as e:
        return "differs", [f"config.json unreadable ({e})"]
    diff = config_diff(stored, cfg, ignore=("run_dir", "steps", *REUSE_MAY_DIFFER))  # steps: below
    if stored.get("steps", cfg.steps) > cfg.steps:
        diff.append(f"steps: {stored.get('steps')!r} -> {cfg.steps!r}")
    problem = model_record_problem(spec.run_dir, cfg.model, model_fingerprint(cfg.model))
    if problem is not None:  # records of another build (or of an unnamed one) are not this model's
        diff.append(problem)
    if diff:
        return "differs", diff
    ckpt = newest_intact_checkpoint(spec.run_dir / "checkpoints")[0]
    if (spec.run_dir / "samples.json").exists() and ((ckpt is not None and checkpoint_step(ckpt) == cfg.steps) or _records_finished(spec.run_dir, cfg.steps)):
        return "done", []
    return "resume", []


def _records_finished(run_dir: Path, steps: int) -> bool:
    """Whether a run's records are complete without its checkpoints (a study's committed records):
    ``metrics.jsonl`` ends with the record of step ``steps``, which holds its final evaluation."""
    try:
        rows = read_metrics(run_dir)
    except ValueError:
        return False
    last = rows[-1] if rows else {}
    return last.get("step") == steps and bool(M.eval_sets_of(last))


def check_runs(estimators: list[str], seeds: list[int], out: Path, overrides: list[str], *, overwrite: bool = False) -> Any:
    """Refuse a bad comparison before any work starts; returns the shared config.

    Every run's config is validated, and a run folder already in ``out`` that
    was trained with a different config is refused unless ``overwrite``.
    """
    check_estimators(estimators)
    if any(k.split("=", 1)[0].strip() in ("estimator", "seed", "run_dir") for k in overrides):
        raise ValueError("--set: may not change estimator, seed or run_dir (compare sets them per run)")
    base = load_config(None, overrides)
    differ = []
    for sp in _specs(estimators, seeds, out):
        status, diff = run_status(sp, overrides)
        if status == "differs":
            differ.append(f"{sp.run_dir.name} ({'; '.join(diff)})")
    if differ and not overwrite:
        raise ValueError(f"--out: {len(differ)} run folder(s) in {out} were trained with another config: {', '.join(differ)}. "
                         "Pass --overwrite to retrain them, or choose another --out")
    return base


def check_estimators(estimators: list[str]) -> None:
    """Refuse, before any run starts, an estimator the runs' own processes could not resolve.

    Each run is a fresh ``slca train`` process: it finds slca's estimators, an
    import path ``package.module:function`` and a ``slca.estimators`` entry point,
    but not a name registered only in this process (by a script or a notebook).
    Also refused: two references to one estimator, and two whose run folders
    would share a name.
    """
    done: list[tuple[str, Any]] = []
    for e in estimators:
        try:
            spec = resolve_estimator(e)
        except ValueError as err:
            raise ValueError(f"--estimators: {err}") from None
        mod = getattr(spec.fn, "__module__", None) or "?"
        if ":" not in e and mod != "slca" and not mod.startswith("slca.") and e not in _entry_points():
            qual = getattr(spec.fn, "__qualname__", "")
            path = (f"'{mod}:{qual}'" if mod != "__main__" and qual.isidentifier()
                    else "'package.module:function' (define it at the top level of a module, not in a script or a function)")
            raise ValueError(f"--estimators: {e!r} is registered in this process only (by {mod}); each run trains in a fresh "
                             f"`slca train` process, which cannot see it: pass its import path {path}, or declare it in the "
                             f"slca.estimators entry points of its package")
        for other, o_spec in done:
            if o_spec is spec:
                raise ValueError(f"--estimators: {other!r} and {e!r} are the same estimator {spec.name!r}")
            if _label(other) == _label(e):
                raise ValueError(f"--estimators: {other!r} and {e!r} would share the run folders {_label(e)}-seed*")
        done.append((e, spec))


def _label(estimator: str) -> str:
    """The run folders' name for ``estimator``: itself, or for an import path the name it is registered under."""
    if ":" not in estimator:
        return estimator
    return resolve_estimator(estimator).name


def _specs(estimators: list[str], seeds: list[int], out: Path) -> list[RunSpec]:
    return [RunSpec(e, s, out / f"{_label(e)}-seed{s}") for s in seeds for e in estimators]


def _import_roots(estimators: list[str]) -> list[str]:
    """Folders this process imported the estimators' import-path modules from, outside the Python installation
    (a folder added to ``sys.path`` in a script or notebook): the runs get them on PYTHONPATH, so they import the same file."""
    roots = []
    prefixes = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    for e in estimators:
        name = e.split(":", 1)[0].split(".")[0].strip()
        if ":" not in e or name == "slca":  # slca itself: the run imports it anyway
            continue
        top = sys.modules.get(name)
        f = getattr(top, "__file__", None)
        where = [Path(f).parent] if f else [Path(p) for p in getattr(top, "__path__", [])][:1]  # a namespace package: __path__
        for d in where:
            root = (d.parent if f is None or Path(f).name == "__init__.py" else d).resolve()
            if not any(root == p or p in root.parents for p in prefixes) and str(root) not in roots:
                roots.append(str(root))
    return roots


def train_env(roots: list[str] = (), threads: int = 1) -> dict[str, str]:
    """The environment of a ``slca train`` process: ``threads`` torch threads, unbuffered output, ``roots``
    appended to its PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if roots:  # appended: the run's own path (its slca, its packages) comes first
        env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p] + list(roots))
    return env


def train_command(args: list[str]) -> list[str]:
    """``slca train *args`` with the interpreter running now."""
    return [sys.executable, "-m", "slca.cli", "train", *args]


def train_process(args: list[str], log, roots: list[str] = (), threads: int = 1, *, children: Children | None = None,
                  label: str = "") -> subprocess.Popen:
    """``slca train *args`` started in its own process (the interpreter running now), its output to the
    open file ``log``, with ``threads`` torch threads; ``roots`` are appended to its PYTHONPATH. Given
    ``children``, it is started as one of them (``label``), so that it is stopped with them."""
    kids = children if children is not None else Children()
    return kids.start(label or " ".join(args), train_command(args), log=log, env=train_env(roots, threads))


def _run_args(spec: RunSpec, overrides: list[str], flag: str | None) -> list[str]:
    args = ["--set", f"estimator={spec.estimator}", "--set", f"seed={spec.seed}", "--set", f"run_dir={spec.run_dir}"]
    for o in overrides:
        args += ["--set", o]
    return args + ([flag] if flag else [])


_FLAGS = {"new": None, "resume": "--resume", "differs": "--overwrite"}
COMPARE_FILE = "compare.json"
"""The comparison's record in ``--out`` (estimators, seeds, overrides, training wall time); written when a comparison
starts, so that a folder holding one is known as a comparison's (:func:`check_out`)."""


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that holds something other than a comparison: a comparison writes into a new or empty
    folder or one a comparison wrote (its ``compare.json``, or the ``logs/*-seed*.log`` of an interrupted one)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a folder")
    entries = sorted(p.name for p in out.iterdir())
    if not entries or COMPARE_FILE in entries or any((out / "logs").glob("*-seed*.log")):
        return
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise ValueError(f"--out: {str(out)!r} holds files that are not a comparison's ({shown}); slca compare writes into a new "
                     "or empty folder, or one an earlier slca compare wrote: choose another --out")


def _write_meta(out: Path, estimators: list[str], seeds: list[int], overrides: list[str], wall: float) -> None:
    write_atomic(out / COMPARE_FILE, json.dumps({"estimators": estimators, "seeds": seeds, "overrides": overrides, "train_wall_s": wall}, indent=2))


def run_compare(estimators: list[str], seeds: list[int], out: Path, overrides: list[str], jobs: int = 2, progress=None,
                *, overwrite: bool = False, poll: float = 0.5) -> list[RunSpec]:
    """Train every (estimator, seed) pair; returns the specs. Raises if a run failed.

    Runs start estimator by estimator (all seeds of the first, then the next), so that a seed's later runs find
    its step-0 evaluation in the comparison's baseline cache (``<out>/baseline_cache``, or ``$SLCA_BASELINE_CACHE``;
    :mod:`slca.training.baseline_cache`): the estimators of one seed start from the same weights, and the runs
    that start together are of different seeds. A run folder already in ``out`` is reused if it finished with the same
    config, resumed if it was interrupted, and refused (retrained with
    ``overwrite``) if its config differs: see :func:`run_status`. The runs are
    ``slca train`` processes, ``jobs`` at a time, started and watched from this
    thread; whatever ends this call (a signal, an error) stops those still running
    (:class:`slca._procs.Children`). A run that fails does not stop the others: the
    failures are raised together at the end.
    """
    check_out(out)
    check_runs(estimators, seeds, out, overrides, overwrite=overwrite)
    with writing(out / "logs", "the comparison's folder"):  # a folder not writable: one line naming it (WriteError)
        out.mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)
    meta = out / COMPARE_FILE
    try:
        prev = float(json.loads(meta.read_text()).get("train_wall_s", 0.0)) if meta.exists() else 0.0
    except (OSError, ValueError, TypeError, AttributeError):
        prev = 0.0
    _write_meta(out, estimators, seeds, overrides, prev)  # the folder is a comparison's from now on
    specs = _specs(estimators, seeds, out)
    todo = []
    for sp in specs:
        status = run_status(sp, overrides)[0]
        if status != "done":
            todo.append((sp, _FLAGS[status]))
    todo.sort(key=lambda item: (estimators.index(item[0].estimator), seeds.index(item[0].seed)))
    t0, trained = time.time(), bool(todo)
    failed = []
    roots = _import_roots(estimators)
    running: dict[str, tuple[RunSpec, Any, Any, float]] = {}  # label -> (spec, process, log file, start)
    with Children() as kids:
        try:
            while todo or running:
                while todo and len(running) < max(1, jobs):
                    spec, flag = todo.pop(0)
                    with writing(out / "logs" / f"{spec.run_dir.name}.log", "the run's log"):
                        log = open(out / "logs" / f"{spec.run_dir.name}.log", "w")
                    p = kids.start(spec.run_dir.name, train_command(_run_args(spec, overrides, flag)), log=log,
                                   env={**train_env(roots), BASELINE_CACHE_ENV: os.environ.get(BASELINE_CACHE_ENV) or str(out / "baseline_cache")})
                    running[spec.run_dir.name] = (spec, p, log, time.time())
                for label, (spec, p, log, started) in list(running.items()):
                    rc = p.poll()
                    if rc is None:
                        continue
                    log.close()
                    del running[label]
                    if progress:
                        progress(spec, rc, time.time() - started)
                    if rc != 0:
                        failed.append(f"{spec.estimator} seed {spec.seed} (see {out / 'logs' / (label + '.log')})")
                if running:
                    time.sleep(poll)
        finally:
            kids.stop()
            for _, _, log, _ in running.values():
                log.close()
    if failed:
        raise RuntimeError("runs failed: " + ", ".join(failed))
    # training wall time, summed over invocations (a re-run with every run finished only rewrites the report)
    _write_meta(out, estimators, seeds, overrides, prev + (time.time() - t0 if trained else 0.0))
    return specs


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
