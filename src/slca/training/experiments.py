"""Experiments: every (estimator, seed) run of a comparison as its own ``slca train`` process.

:func:`run_compare` trains the runs of ``slca compare`` (``jobs`` at a time, each a fresh
process with one torch thread, so a 2-core machine runs two at once), reusing a finished
run folder with the same config, resuming an interrupted one and refusing one of another
config or model build (:func:`run_status`). :func:`train_process` starts one ``slca train``
process; ``slca demo`` starts its arms with it. The report of a comparison (tables, curves,
intervals) is :mod:`slca.reporting.compare`'s.
"""

from __future__ import annotations

import json
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
from slca.models.named import model_fingerprint
from slca.training.baseline_cache import BASELINE_CACHE_ENV
from slca.training.config import config_diff, load_config
from slca.training.runs import RESUME_MAY_CHANGE, RunFolder, checkpoint_step, model_record_problem, newest_intact_checkpoint, read_metrics, write_atomic

__all__ = ["RunSpec", "REUSE_MAY_DIFFER", "COMPARE_FILE", "run_config", "run_status", "check_runs", "check_estimators",
           "check_out", "run_compare", "train_env", "train_command", "train_process"]


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
