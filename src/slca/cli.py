"""The `slca` command line: demo, train, report, compare (and eval)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from slca import metrics as M


class _OneLineErrors(typer.core.TyperGroup):
    """Usage errors of the command line itself (``--jobs abc``, an unknown option, a missing one) as one
    ``error: <option>: <what is wrong>`` line on stderr, exit 2, like every other refusal (not a box)."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True, **extra: Any) -> Any:
        import importlib
        import sys

        cx = importlib.import_module(typer.BadParameter.__module__)  # click's exceptions, as this typer ships them
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except cx.NoArgsIsHelpError as e:  # plain `slca`: the help, as before
            from typer import rich_utils

            rich_utils.rich_format_error(e)
            sys.exit(e.exit_code)
        except cx.ClickException as e:
            if isinstance(e, cx.BadParameter) and e.param is not None and not isinstance(e, cx.MissingParameter):
                name = e.param.opts[0] if getattr(e.param, "opts", None) else e.param.human_readable_name
                msg = f"{name}: {e.message}"
            else:
                msg = e.format_message()
            where = f" (see {e.ctx.command_path} --help)" if getattr(e, "ctx", None) is not None else ""
            typer.secho("error: ", fg="red", err=True, nl=False)
            typer.echo(" ".join(f"{msg}{where}".split()), err=True)
            sys.exit(e.exit_code)
        except (typer.Abort, getattr(cx, "Abort", typer.Abort)):
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True, help="Segment-Locked Credit Assignment for tool-calling RL.")
console = Console()
console.soft_wrap = not console.is_terminal  # in logs and CI, long lines (paths, errors) stay whole, not wrapped at 80 columns


def _version(value: bool) -> None:
    if value:
        import slca

        console.print(f"slca {slca.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the slca version and exit."),
) -> None:
    """Segment-Locked Credit Assignment for tool-calling RL."""


def _print_table(table: Table) -> None:
    """Print a table whole: on a terminal at its width; elsewhere (logs, CI, pipes, where rich
    assumes 80 columns) at the table's natural width, so no cell is cut."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    width = Measurement.get(console, console.options.update_width(10_000), table).maximum
    Console(file=console.file, width=max(width, console.width), color_system=None, highlight=False).print(table)


def _fail(msg: str) -> None:
    """One ``error: <field>: <what is wrong>`` line on stderr, exit status 2."""
    typer.secho("error: ", fg="red", err=True, nl=False)
    typer.echo(" ".join(str(msg).split()), err=True)  # one line, whatever the message holds
    raise typer.Exit(2)


def _refuse_value_errors(fn):
    """Run ``fn()``; a ValueError (bad input: config, files, run folder) or an OSError (disk full,
    permissions) becomes an ``error:`` line. ``SLCA_DEBUG=1`` re-raises it with its traceback instead.
    """
    import os

    try:
        return fn()
    except (ValueError, OSError) as e:
        if os.environ.get("SLCA_DEBUG"):
            raise
        _fail(str(e))


def _quiet_loading() -> None:
    """transformers' progress bars for every model load and save ("Loading weights", "Writing model
    shards": stderr noise in every run and checkpoint) off; downloads from the hub keep theirs."""
    import transformers
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    hub_off = are_progress_bars_disabled()
    transformers.utils.logging.disable_progress_bar()
    if not hub_off:
        enable_progress_bars()


def _run_with_progress(cfg, label: str, **kw: Any):
    """Train one run with a rich progress bar showing live metrics."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slca.training.trainer import train

    _quiet_loading()
    prog = Progress(
        TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
        console=console,
    )
    task = prog.add_task("", total=cfg.steps)

    eval_success = M.EVAL_SUCCESS.key(set=M.EVAL_SET)

    def on_step(m: dict[str, Any]) -> None:
        prog.start()  # on the first step: a refusal of the run folder prints no empty bar before it
        nan = float("nan")
        desc = (f"tool {m.get(M.REWARD_TOOL.name, nan):.2f}  summary {m.get(M.REWARD_SUMMARY.name, nan):.2f}"
                if m[M.STEP.name] else "before training")  # step 0: the evaluation before any update
        if eval_success in m:
            desc += f"  eval success {m[eval_success]:.2f}"
        prog.update(task, completed=m["step"], description=desc)

    try:
        return train(cfg, on_step=on_step, **kw)
    finally:
        prog.stop()


def _load_cfg(config: Optional[Path], overrides: list[str]):
    from slca.training.config import load_config

    return _refuse_value_errors(lambda: load_config(config, overrides))


DEMO_OVERRIDES = {
    # sized for a few minutes on 2 CPU cores (the four arms side by side, one process each)
    # lr 5e-5: 5e-4 lowers the shipped warm start's training reward below the frozen policy's (docs/results.md)
    # eval/: new requests of the training distribution, evaluated at steps 0, 8, 16 (the study's primary endpoint is the
    # area under that curve); eval_fresh/: toolworld's fresh split (names and phrasings new to toolworld, chosen on by nothing)
    "full": dict(steps=16, tasks_per_step=8, group_size=4, lr=5e-5, eval_every=8, eval_tasks=100, ood_splits=["fresh"], ood_eval_tasks=48,
                 save_every=0, sample_html_every=4),
    "quick": dict(steps=6, tasks_per_step=6, group_size=4, lr=5e-5, eval_every=3, eval_tasks=48, ood_splits=["fresh"], ood_eval_tasks=24,
                  save_every=0, sample_html_every=3),
}

DEMO_MODEL_OVERRIDES = {
    # smollm2-toolworld (SmolLM2-135M after stage-1 SFT, issue 42): study 42's setting (a fresh LoRA r 8 on q and v,
    # lr 5e-5, micro_batch_size 4) at a budget one seed can afford on 2 cores; evaluations at the start, mid-run and end
    "smollm2-toolworld": {
        "full": dict(lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"], micro_batch_size=4, steps=8,
                     tasks_per_step=4, group_size=4, lr=5e-5, eval_every=4, eval_tasks=48, ood_splits=["fresh"],
                     ood_eval_tasks=24, save_every=0, sample_html_every=4),
        "quick": dict(lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"], micro_batch_size=4, steps=2,
                      tasks_per_step=2, group_size=4, lr=5e-5, eval_every=1, eval_tasks=12, ood_splits=["fresh"],
                      ood_eval_tasks=8, save_every=0, sample_html_every=1),
    },
}
"""The demo's budget for a named real model, replacing :data:`DEMO_OVERRIDES` (sized for the embedded model) when
``--model`` names it; ``--set`` still overrides any field. Such a demo runs two arms at a time unless ``--jobs`` says
otherwise (four copies of a 135M model and their KV caches do not fit 24 GB beside each other)."""
DEMO_MODEL_JOBS = {"smollm2-toolworld": 2}



def demo_budget(model: str, quick: bool, jobs: int | None) -> tuple[dict[str, Any], int]:
    """The demo's training fields for ``model`` (:data:`DEMO_MODEL_OVERRIDES` for a named real model, else
    :data:`DEMO_OVERRIDES`) and the runs at a time (``jobs``, else the model's default: 4, or 2 for a real model)."""
    budget = DEMO_MODEL_OVERRIDES.get(model, DEMO_OVERRIDES)["quick" if quick else "full"]
    return budget, jobs if jobs is not None else DEMO_MODEL_JOBS.get(model, 4)


DEMO_NOISE = 0.5
"""The noisy judge's summary_noise: study 25's stage-B setting (docs/results.md)."""

DEMO_ARMS = {  # label -> (estimator, summary_noise, run folder under --out)
    "GRPO": ("grpo", 0.0, "grpo"),
    "SLCA": ("slca", 0.0, "slca"),
    "GRPO, noisy judge": ("grpo", DEMO_NOISE, "grpo_noisy"),
    "SLCA, noisy judge": ("slca", DEMO_NOISE, "slca_noisy"),
}

STUDY_FIGURES = {  # the 10-seed results the demo's verdict cites (docs/results.md; tests/test_cli.py checks they are there)
    "study 25 (build J): SLCA - GRPO, tool-task Success area": "+0.020 ± 0.013",
    "study 25 stage B: noisy-judge interaction on the area": "+0.019 ± 0.017",
    "study 41 (build PF3): SLCA - GRPO, Success area": "+0.002 ± 0.006",
}
_F = list(STUDY_FIGURES.values())
STUDY_LINE = (f"What 10 seeds show (docs/results.md): in study 25, on build J (the warm start shipped before PF3), SLCA - GRPO "
              f"{_F[0]} on the area under the held-out tool-task Success curve (SLCA learns faster), and in its stage B the noisy "
              f"judge slowed GRPO's tool learning and not SLCA's (interaction {_F[1]}); in study 41, on the shipped build PF3, "
              f"SLCA - GRPO {_F[2]} on the Success area: no difference detected, the curve is at its ceiling.")
STUDY42_FIGURES = {  # what study 42 found on smollm2-toolworld (docs/results.md; tests/test_cli.py checks they are there)
    "study 42: held-out tool-task Success at step 0": "0.765",
    "study 42 (a): slca - grpo, Success area": "-0.002 ± 0.012",
    "study 42 (b): slca_paper - grpo, Success area": "+0.003 ± 0.002",
}
_F42 = list(STUDY42_FIGURES.values())
STUDY_LINES = {  # the demo's model -> the seeded result it cites; other models cite the embedded model's studies
    "smollm2-toolworld": (f"What 3 seeds show on this model (docs/results.md, study 42: 12 steps x 4 tasks x G=4, evaluated "
                          f"on 250 held-out tasks): every arm rose from {_F42[0]} to about 0.80 in held-out tool-task Success; "
                          f"SLCA - GRPO {_F42[1]} on the area under that curve (no difference detected); SLCA as its authors "
                          f"released it {_F42[2]} (one or two tasks of about 215 a seed): the arms sampled the same rollouts at "
                          "almost every step, so the estimators had little to act on."),
}


def _num(v: Any, fmt: str = ".3f") -> str:
    """A table cell: the number formatted, ``nan`` for a missing or non-finite one (a NaN is logged as null)."""
    return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "nan"


def _diag_mean(rows: list[dict[str, Any]], metric: M.Metric) -> str:
    """A diagnostics cell: the mean over the steps that logged ``metric`` (signed for a metric that can be negative)."""
    vals = [r[metric.name] for r in rows if isinstance(r.get(metric.name), float)]
    return format(sum(vals) / max(len(vals), 1), "+.3f" if metric.range[0] < 0 else ".3f")


def _eval_rows(rows: list[dict[str, Any]], prefix: str = M.EVAL_SET) -> list[dict[str, Any]]:
    return [r for r in rows if any(k.startswith(prefix + "/") for k in r)]


def _compare_table(runs: dict[str, Path], title: str, prefix: str = M.EVAL_SET, diagnostics: bool = True, auc: bool = False) -> Table:
    """Final metrics of one evaluation set (``prefix``) per run, with the warm start (the evaluation before
    the first update) as its own row; ``parallel split`` is the share of parallel tasks whose calls were
    spread over more turns than the task has steps (the paper's diagnostic case; lower is better). ``auc``:
    a first column with the area under each run's tool-task Success curve over its evaluations
    (:func:`slca.reporting.compare.curve_auc`, the study's primary endpoint)."""
    from slca.reporting.compare import curve_auc
    from slca.reporting.report import final_eval, read_metrics

    t = Table(title=title)
    t.add_column("estimator")
    if auc:
        t.add_column("tool-task success area", justify="right")
    for m in M.CLI_FINAL:
        t.add_column(m.short, justify="right")
    if diagnostics:
        for m in M.CLI_DIAGNOSTICS:
            t.add_column(m.short, justify="right")
    first = next(iter(runs.values()), None)
    evals = _eval_rows(read_metrics(first), prefix) if first is not None else []
    if evals and evals[0].get("step") == 0:
        t.add_row("warm start (step 0)", *([""] * auc), *[_num(evals[0].get(m.key(set=prefix))) for m in M.CLI_FINAL],
                  *([""] * len(M.CLI_DIAGNOSTICS) * diagnostics))
    for label, d in runs.items():
        rows = read_metrics(d)
        ev = final_eval(rows, prefix)
        diag = [_diag_mean(rows, m) for m in M.CLI_DIAGNOSTICS] if diagnostics else []
        area = [_num(curve_auc(rows, M.EVAL_TOOL_TASKS.key(set=prefix)))] if auc else []
        t.add_row(label, *area, *[_num(ev.get(m.key(set=prefix))) for m in M.CLI_FINAL], *diag)
    return t


def _print_eval_tables(runs: dict[str, Path], what: str, auc: bool = False) -> None:
    """One table per evaluation set of the runs: the held-out set first, then each out-of-distribution split
    (``auc``: the held-out table also gives the area under each run's tool-task Success curve)."""
    from slca.reporting.report import eval_prefixes, read_metrics

    first = next(iter(runs.values()), None)
    prefixes = eval_prefixes(read_metrics(first)) if first is not None else [M.EVAL_SET]
    for i, prefix in enumerate(prefixes or [M.EVAL_SET]):
        name = "held-out set" if prefix == M.EVAL_SET else f"toolworld {prefix[len('eval_'):]} split, out of distribution"
        _print_table(_compare_table(runs, f"{what}: {name} ({prefix}/*, final)", prefix, diagnostics=i == 0, auc=auc and i == 0))


def frozen_tool_rewards(cfg, model, tokenizer, on_step=None) -> list[float]:
    """The training execution reward, step by step, of ``model`` left as it is on the tasks a run
    of ``cfg`` draws (same task sampler, same rollout settings; no update). A run's own reward
    curve mixes what it learned with how hard each step's tasks are; against this baseline
    (same tasks, step for step) only the learning is left. ``on_step(k)`` after step k (1-based)."""
    import torch

    from slca.training.trainer import Trainer

    tr = Trainer(cfg, model=model, tokenizer=tokenizer)
    out = []
    for step in range(cfg.steps):
        tool = tr.score(tr.rollout(step).trajs, step).tool
        out.append(float(torch.nanmean(tool)) if bool(torch.isfinite(tool).any()) else float("nan"))
        if on_step:
            on_step(step + 1)
    return out


def _logged_steps(run_dir: Path, since: float) -> int:
    """The newest step in ``run_dir``'s metrics.jsonl written after ``since`` (0 when none yet)."""
    from slca.training.runs import read_jsonl

    p = run_dir / "metrics.jsonl"
    try:
        if p.stat().st_mtime < since:  # the previous demo's run, not yet replaced
            return 0
        return max((r["step"] for r in read_jsonl(p) if isinstance(r.get("step"), int)), default=0)
    except (OSError, ValueError):
        return 0


class _Cancelled(Exception):
    """The demo stopped: the frozen-baseline replay ends at its next step."""


def _log_tail(log: Path, n: int = 15) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def _exit_status(rc: int) -> str:
    """``exit 2``, or ``killed by SIGKILL`` for a process a signal ended (a negative return code)."""
    if rc >= 0:
        return f"exit {rc}"
    import signal

    try:
        return f"killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"killed by signal {-rc}"


def _demo_log(logs: Path, cfg: Any) -> Path:
    """A demo run's log: named after its run folder (``logs/slca_noisy.log`` for ``D/slca_noisy/``), its config beside it."""
    return logs / f"{Path(cfg.run_dir).name}.log"


def _demo_runs(cfgs: dict[str, Any], out: Path, jobs: int, baseline, *, poll: float = 0.3) -> list[float]:
    """Train each config of ``cfgs`` (label -> TrainConfig) as its own ``slca train`` process, ``jobs`` at a
    time, while a thread of this process computes ``baseline(on_step)`` (the frozen warm start); one progress
    bar each. Returns the baseline's values.

    This thread only watches: a run that fails (an error, or killed, as the kernel does on out-of-memory)
    stops the other runs and the baseline at once and the demo with the end of its log; whatever else ends
    the demo (a signal, an error) stops the runs (:class:`slca._procs.Children`)."""
    import os
    import threading

    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slca._fs import writing
    from slca._procs import Children
    from slca.training.experiments import train_process
    from slca.training.config import to_dict

    logs = out / "logs"
    with writing(logs, "the demo's folder"):  # a failed write: one line naming the file (WriteError)
        logs.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    threads = max(1, cpus // (jobs + 1))  # the runs' torch threads; this process keeps the rest
    torch.set_num_threads(max(1, cpus - jobs * threads))

    prog = Progress(TextColumn("[bold]{task.description}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    bars = {label: prog.add_task(label, total=cfg.steps) for label, cfg in cfgs.items()}
    frozen_bar = prog.add_task("warm start, no update", total=next(iter(cfgs.values())).steps)
    t0 = time.time()
    stop = threading.Event()
    result: dict[str, Any] = {}

    def on_step(k: int) -> None:
        if stop.is_set():
            raise _Cancelled()
        prog.update(frozen_bar, completed=k)

    def replay() -> None:
        try:
            result["frozen"] = baseline(on_step)
        except _Cancelled:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            result["error"] = e

    replayer = threading.Thread(target=replay, name="slca-demo-baseline", daemon=True)
    pending, running, files = list(cfgs), {}, []
    try:
        with prog, Children() as kids:
            replayer.start()
            while pending or running or replayer.is_alive():
                while pending and len(running) < jobs:
                    label = pending.pop(0)
                    log, conf = _demo_log(logs, cfgs[label]), logs / f"{Path(cfgs[label].run_dir).name}.config.json"
                    with writing(log, f"the {label} run's log"):
                        conf.write_text(json.dumps(to_dict(cfgs[label]), indent=2))
                        f = open(log, "w")
                    files.append(f)
                    running[label] = train_process(["-c", str(conf), "--overwrite"], f, threads=threads, children=kids, label=label)
                for label, p in list(running.items()):
                    rc = p.poll()
                    if rc is None:
                        continue
                    del running[label]
                    if rc != 0:
                        stop.set()
                        kids.stop()
                        log = _demo_log(logs, cfgs[label])
                        tail = _log_tail(log)
                        _fail(f"the {label} run failed ({_exit_status(rc)}); the other runs were stopped; "
                              + (f"the end of {log}:\n" + "\n".join(tail) if tail else f"its log {log} is empty"))
                for label, bar in bars.items():
                    prog.update(bar, completed=_logged_steps(Path(cfgs[label].run_dir), t0))
                if "error" in result:
                    raise result["error"]
                time.sleep(poll)
    finally:
        stop.set()
        for f in files:
            f.close()
        if replayer.is_alive():
            replayer.join(timeout=1.0)  # the replay stops at its next step; a daemon thread, it never holds the exit up
    if "error" in result:
        raise result["error"]
    return result["frozen"]


_OOD_SETS = {  # the out-of-distribution split the verdict reads (the first one logged), and how it names it
    "eval_fresh": "toolworld's fresh split: names and phrasings new to toolworld",
    M.TEST_SET: "toolworld's test split: unseen entities and phrasings",
}


def demo_verdict(runs: dict[str, Path], k: int = 4, frozen: list[float] | None = None, model: str = "default") -> list[str]:
    """Plain sentences on what the demo's one seed shows, the study's primary endpoint first: per run,
    held-out tool-task Success on new requests of the training distribution (``eval/``) at the last
    evaluation and the area under its curve over the evaluated steps
    (:func:`slca.reporting.compare.curve_auc`), each against the warm start, the paper's diagnostic
    case (parallel steps split over turns) and the training execution reward (first ``k`` steps vs
    the last ``k``, and, given ``frozen`` (:func:`frozen_tool_rewards`), the mean over all steps
    against the un-updated warm start's on the same tasks); then SLCA - GRPO on the area (the
    clean-judge pair), how each estimator's area changed under the noisy judge, the seeded results on
    ``model`` (:data:`STUDY_LINES`, else the embedded model's :data:`STUDY_LINE`), and the out-of-distribution
    split (``eval_fresh/``, else ``eval_test/``)."""
    from slca.reporting.compare import curve_auc
    from slca.reporting.report import final_eval, read_metrics

    def num(v: Any) -> float:  # a NaN is logged as null
        return float(v) if isinstance(v, (int, float)) else float("nan")

    def start_and_final(metric: M.Metric, prefix: str = M.EVAL_SET) -> tuple[float, dict[str, float]]:
        key = metric.key(set=prefix)
        first = _eval_rows(read_metrics(next(iter(runs.values()))), prefix)
        base = num(first[0].get(key)) if first and first[0].get("step") == 0 else float("nan")
        return base, {label: num(final_eval(read_metrics(d), prefix).get(key)) for label, d in runs.items()}

    lines: list[str] = []
    base, final = start_and_final(M.EVAL_TOOL_TASKS)
    split_base, split = start_and_final(M.EVAL_PARALLEL_SPLIT)
    key = M.EVAL_TOOL_TASKS.key(set=M.EVAL_SET)
    area: dict[str, float] = {}
    for label, d in runs.items():
        rows = read_metrics(d)
        evaluated = [r["step"] for r in _eval_rows(rows)]
        steps = [r["step"] for r in _eval_rows(rows) if isinstance(r.get(key), (int, float))]  # the curve's points
        area[label] = curve_auc(rows, key)
        tool = [r[M.REWARD_TOOL.name] for r in rows if isinstance(r.get(M.REWARD_TOOL.name), float)]
        trend = ""
        if len(tool) >= 2 * k:
            a, b = sum(tool[:k]) / k, sum(tool[-k:]) / k
            trend = f"; training execution reward {a:.3f} (first {k} steps) -> {b:.3f} (last {k}): {'rose' if b > a else 'did not rise'}"
        pairs = [(t, f) for t, f in zip(tool, frozen or []) if f == f]
        if pairs:
            mt, mf = sum(t for t, _ in pairs) / len(pairs), sum(f for _, f in pairs) / len(pairs)
            trend += (f"; over all {len(pairs)} steps {mt:.3f} vs {mf:.3f} for the warm start left un-updated on the same "
                      f"tasks ({mt - mf:+.3f}: {'above' if mt > mf else 'not above'} it)")
        at = f" at step {evaluated[-1]}" if evaluated else ""
        vs = f" (warm start {base:.3f})" if base == base else ""
        auc = ""
        if area[label] == area[label]:
            on = f" ({area[label] - base:+.3f} on the warm start's {base:.3f})" if base == base else ""
            auc = f"; area under its curve over steps {', '.join(map(str, steps))} {area[label]:.3f}{on}"
        sp = f"; parallel steps split over turns {split[label]:.3f} (warm start {split_base:.3f})" if split[label] == split[label] else ""
        lines.append(f"{label}: held-out tool-task Success on new requests of the training distribution {final[label]:.3f}{at}{vs}"
                     f"{auc}{sp}{trend}.")
    compared = _comparison_line(final, base, area)
    lines += compared + _noisy_judge_line(area) + ([STUDY_LINES.get(model, STUDY_LINE)] if compared else [])
    ood_set = next((s for s in _OOD_SETS if any(_eval_rows(read_metrics(d), s) for d in runs.values())), None)
    if ood_set is not None:
        ood_base, ood = start_and_final(M.EVAL_TOOL_TASKS, ood_set)
        lines += _out_of_distribution_line(ood_base, ood, _OOD_SETS[ood_set])
    return lines


_ONE_SEED = "one seed is one draw of tasks and weights, and cannot rank the estimators"


def _comparison_line(final: dict[str, float], base: float, area: dict[str, float] | None = None) -> list[str]:
    """SLCA - GRPO on this seed (the clean-judge pair, labels ``GRPO`` and ``SLCA``): on the area under the held-out
    tool-task Success curve where both have one (``area``), else on the final value (``final``; ``base``: the warm
    start's)."""
    pair = ("GRPO", "SLCA")
    if not (set(pair) <= set(final) and all(final[x] == final[x] for x in pair)):
        return []
    g, s_ = final["GRPO"], final["SLCA"]
    if max(g, s_) == 0:
        had = f" (the warm start's held-out tool-task Success was {base:.3f})" if base == base and base > 0 else ""
        return [f"Neither run solved a held-out tool-needing task at the end{had}."]
    ceiling = "; both end at 1.000, the ceiling, where nothing is left to separate them" if min(g, s_) >= 1.0 else ""
    ag, as_ = (area or {}).get("GRPO", float("nan")), (area or {}).get("SLCA", float("nan"))
    if ag == ag and as_ == as_:
        return [f"SLCA - GRPO on this seed: {as_ - ag:+.3f} on the area under the held-out tool-task Success curve ({as_:.3f} vs "
                f"{ag:.3f}), {s_ - g:+.3f} at the end ({s_:.3f} vs {g:.3f}){ceiling}; {_ONE_SEED}."]
    return [f"SLCA - GRPO on this seed: {s_ - g:+.3f} on held-out tool-task Success at the end ({s_:.3f} vs {g:.3f}){ceiling}; "
            f"{_ONE_SEED}."]


def _noisy_judge_line(area: dict[str, float]) -> list[str]:
    """How much each estimator's area under the held-out curve changed from its clean-judge arm to its noisy-judge arm."""
    arms = [(est, area.get(est, float("nan")), area.get(f"{est}, noisy judge", float("nan"))) for est in ("GRPO", "SLCA")]
    if not all(c == c and n == n for _, c, n in arms):
        return []
    each = ", ".join(f"{est} {n - c:+.3f} ({c:.3f} -> {n:.3f})" for est, c, n in arms)
    return [f"With a noisy summary judge (summary_noise {DEMO_NOISE}: the answer's grader made unreliable), each estimator's area "
            f"under the held-out tool-task Success curve moved from its clean-judge arm by: {each}; one seed, so not a "
            "measured effect of the judge."]


def _out_of_distribution_line(ood_base: float, ood: dict[str, float], what: str = _OOD_SETS[M.TEST_SET]) -> list[str]:
    """An out-of-distribution split's (``what``) tool-task Success before training (``ood_base``) and after (``ood``, by
    run label), with each run's direction (a move within 0.03 counts as none) named where the runs differ."""
    if not any(v == v for v in ood.values()):
        return []
    each = ", ".join(f"{label} {v:.3f}" for label, v in ood.items())
    deltas = {label: v - ood_base for label, v in ood.items() if v == v} if ood_base == ood_base else {}
    moves = {label: "raised it" if c > 0.03 else "lowered it" if c < -0.03 else "left it within 0.03" for label, c in deltas.items()}
    kinds = set(moves.values())
    each_move = " and ".join(f"{m} under {label} ({deltas[label]:+.3f})" for label, m in moves.items())
    how = ("" if not deltas else "RL on the training distribution left it where it was (within 0.03)" if kinds == {"left it within 0.03"}
           else f"RL on the training distribution {kinds.pop()}" if len(kinds) == 1
           else f"RL on the training distribution moved it both ways ({each_move})" if {"raised it", "lowered it"} <= kinds
           else f"RL on the training distribution {each_move}")
    low = " The warm start rarely solves these (docs/warmstart.md: unseen names and phrasings are where it fails)." if ood_base < 0.1 else ""
    return [f"Out of distribution ({what}), tool-task Success was {ood_base:.3f} "
            f"before training and {each} after{': ' + how if how else ''}.{low}"]


def _this_command() -> str:
    """The command line this process runs, as ``slca ...`` (what to type to run it again)."""
    import shlex
    import sys

    return "slca " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _check_demo_out(out: Path) -> None:
    """Refuse a demo ``--out`` that holds something other than an earlier demo (its ``logs/grpo.config.json`` or
    ``logs/slca.config.json``, or ``logs/GRPO.config.json`` / ``logs/SLCA.config.json`` as earlier demos named them)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a folder")
    entries = sorted(p.name for p in out.iterdir())
    if entries and not any((out / "logs" / f"{label}.config.json").is_file() for label in ("grpo", "slca", "GRPO", "SLCA")):
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(f"--out: {str(out)!r} holds files that are not a demo's ({shown}); slca demo writes into a new or empty "
                         "folder, or one an earlier slca demo wrote (and replaces that demo): choose another --out")


@app.command()
def demo(
    quick: bool = typer.Option(False, "--quick", help="A run of a few minutes that still trains and compares."),
    out: Path = typer.Option(Path("runs/demo"), help="Folder for the runs and the report."),
    seed: int = typer.Option(0, help="Seed shared by every run."),
    model_spec: str = typer.Option("default", "--model", "-m", help="The policy: 'default' (the embedded tiny model), 'smollm2' "
                                   "(SmolLM2-135M-Instruct, the smollm2 extra), 'smollm2-toolworld' (SmolLM2 after stage-1 SFT: its own budget, a fresh "
                                   "LoRA, 8 steps, two arms at a time; about 70 min on 2 cores, --quick about half an hour), a save_pretrained "
                                   "folder or a hub id (the embedded model's budget: a 135M model on CPU takes hours; --quick, --set lora_r=8)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a training field of every run: --set lora_r=8 (repeatable)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Runs trained at a time, each its own process (default 4: all four arms side by side, 2 for smollm2-toolworld; "
                             "1: one after the other, for a 1-core machine or a model too big to hold several times in memory)."),
) -> None:
    """Train GRPO and SLCA on toolworld side by side (same seed, same budget), each with a clean and with a noisy
    summary judge (summary_noise 0.5, the study's stage-B setting), and compare on one seed."""
    from dataclasses import replace

    from slca._fs import writing
    from slca.training.config import TrainConfig, apply_overrides, validate
    from slca.models.loading import load_policy, policy_options
    from slca.reporting.report import write_report, write_token_html
    from slca.training.samples import read_samples

    t0 = time.time()
    _quiet_loading()
    fixed = ("run_dir", "estimator", "seed", "model", "summary_noise")
    bad = [o for o in set_ if o.split("=", 1)[0].strip() in fixed]
    if bad:
        _fail(f"--set {bad[0]}: the demo sets {', '.join(fixed)} itself (use --out, --seed, --model)")

    budget, jobs = demo_budget(model_spec, quick, jobs)

    def demo_cfg(est: str, noise: float, folder: str) -> TrainConfig:
        cfg = TrainConfig(run_dir=str(out / folder), estimator=est, seed=seed, model=model_spec, eval_on_start=True, summary_noise=noise,
                          **budget)
        return validate(apply_overrides(cfg, list(set_)))

    if jobs < 1:
        _fail(f"--jobs: {jobs} (at least 1)")
    _refuse_value_errors(lambda: _check_demo_out(out))
    cfgs = {label: _refuse_value_errors(lambda arm=arm: demo_cfg(*arm)) for label, arm in DEMO_ARMS.items()}
    cfg = cfgs["GRPO"]
    what = "embedded tiny model" if model_spec == "default" else f"model {model_spec}"
    console.print(f"[bold]slca demo[/bold]: {what}, toolworld, GRPO vs SLCA, clean and noisy summary judge "
                  f"({min(jobs, len(cfgs))} run(s) at a time; logs in {out / 'logs'})")
    model, tok = _refuse_value_errors(lambda: load_policy(model_spec, **policy_options(cfg)))  # refused here, before any run starts
    # each run loads the same weights in its own process; this one replays the warm start meanwhile (the verdict's baseline)
    from slca._procs import interrupted_by, signals_raise

    try:
        with signals_raise():
            frozen = _demo_runs(cfgs, out, jobs, lambda on_step: frozen_tool_rewards(
                replace(cfg, run_dir=str(out / "frozen"), report_to=[]), model, tok, on_step))
    except KeyboardInterrupt as e:
        what, code = interrupted_by(e)
        typer.echo(f"interrupted ({what}): the demo's runs were stopped (their logs: {out / 'logs'}); a demo saves no "
                   "checkpoints, so running it again starts its runs over", err=True)
        typer.echo(f"continue: {_this_command()}", err=True)
        raise typer.Exit(code) from None
    except OSError as e:  # a write failed (WriteError, naming the file); the runs were stopped
        _fail(str(e))
    runs = {label: Path(c.run_dir) for label, c in cfgs.items()}
    wall = time.time() - t0
    verdict = demo_verdict(runs, frozen=frozen, model=model_spec)

    def write() -> Path:  # a failed write: one line naming the file
        with writing(out / "report.md", "the demo's report", after=f"the runs themselves are complete in {out}"):
            for label, d in runs.items():
                write_token_html(read_samples(d / "samples.json"), d / "tokens.html", title=f"{label} run: token-level advantages")
            return write_report(runs, out, title="slca demo: GRPO vs SLCA on toolworld, clean and noisy summary judge",
                                extra_md=f"Wall time: {wall / 60:.1f} min (seed {seed}, {'quick' if quick else 'full'} budget).\n\n"
                                + "\n".join(f"- {line}" for line in verdict))

    md = _refuse_value_errors(write)
    _print_eval_tables(runs, "slca demo", auc=True)
    for line in verdict:
        console.print(line)
    console.print(f"report: [bold]{md}[/bold]  plots: {out / 'curves.png'}  token view: {out / 'slca' / 'tokens.html'}  ({wall / 60:.1f} min)")


@app.command()
def train(
    run: Optional[Path] = typer.Argument(None, metavar="RUN_DIR", show_default=False,
                                         help="With --resume: the run folder to continue, with the config.json stored there."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON file of config fields."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a field: --set estimator=grpo (repeatable)."),
    resume: bool = typer.Option(False, help="Continue a run from its newest intact checkpoint, with its stored config (only steps and settings that "
                                "leave the result as it is may change: micro_batch_size, eval_every, save_every, report_to, ...; docs/runs.md): "
                                "slca train --resume RUN_DIR, or run_dir from -c / --set."),
    overwrite: bool = typer.Option(False, help="Replace the run in run_dir (its metrics, checkpoints and reports are deleted)."),
    help_config: bool = typer.Option(False, "--help-config", help="List every config field with its doc and default."),
) -> None:
    """Train one run (GRPO, SLCA or any registered estimator).

    An existing run folder needs --resume or --overwrite; see docs/runs.md.
    slca train --resume RUN_DIR continues a run with the config stored in it.
    """
    import os
    import shlex

    from slca._procs import watch_parent_from_env
    from slca.training.config import GROUPS, TrainConfig, config_warnings, field_docs
    from slca.reporting.report import write_report, write_token_html

    watch_parent_from_env()  # a run started by slca demo / compare stops when that process is gone, however it ended
    if help_config:
        d = TrainConfig()
        for k, doc in field_docs().items():
            if k in GROUPS:
                console.print(f"\n[bold underline]{GROUPS[k]}[/bold underline]")
            console.print(f"[bold]{k}[/bold] = {getattr(d, k)!r}\n    {doc}")
        return
    if resume and overwrite:
        _fail("--overwrite: --resume and --overwrite exclude each other")
    if run is not None and not resume:
        _fail(f"RUN_DIR: a run folder is given only with --resume (slca train --resume {run}); a new run goes in --set run_dir={run}")
    if resume:
        from slca.training.config import resume_config

        cfg = _refuse_value_errors(lambda: resume_config(run, config, set_))
    else:
        cfg = _load_cfg(config, set_)
    for warning in config_warnings(cfg):
        typer.echo(f"warning: {warning}", err=True)
    from slca._fs import WriteError, writing
    from slca._procs import interrupted_by, signals_raise

    try:
        with signals_raise():  # Ctrl-C, kill PID, a closed terminal: the same lines
            tr = _run_with_progress(cfg, cfg.estimator.upper(), resume=resume, overwrite=overwrite)
    except KeyboardInterrupt as e:
        what, code = interrupted_by(e)
        for line in interrupted_lines(cfg, what):
            typer.echo(line, err=True)
        raise typer.Exit(code) from None  # 128 + the signal, as a shell reports a process the signal stopped (130: Ctrl-C)
    except WriteError as e:  # the disk is full, a file too large, a folder read-only: what is saved stays intact
        if os.environ.get("SLCA_DEBUG"):
            raise
        held = (Path(cfg.run_dir) / "config.json").is_file()
        _fail(f"{e}" + (f"; once it can write there: {resume_command(cfg.run_dir)}" if held else ""))
    except (ValueError, OSError) as e:
        if os.environ.get("SLCA_DEBUG"):
            raise
        _fail(str(e))
    after = f"the run is complete: slca report {shlex.quote(str(cfg.run_dir))} writes it again"
    try:
        with writing(Path(cfg.run_dir) / "tokens.html", "the token page", after=after):
            write_token_html(tr.samples, Path(cfg.run_dir) / "tokens.html")
        with writing(Path(cfg.run_dir) / "report.md", "the report", after=after):
            md = write_report({cfg.estimator: cfg.run_dir}, cfg.run_dir)
    except WriteError as e:
        if os.environ.get("SLCA_DEBUG"):
            raise
        _fail(str(e))
    console.print(f"run: {cfg.run_dir}  report: {md}")


def resume_command(run_dir: str | Path) -> str:
    """The command that continues the run in ``run_dir`` with its stored config."""
    import shlex

    return f"slca train --resume {shlex.quote(str(run_dir))}"


def interrupted_lines(cfg, what: str = "Ctrl-C") -> list[str]:
    """What a user needs after ``what`` (Ctrl-C, SIGTERM, SIGHUP) stopped ``slca train``: the steps done, what is
    saved, how to resume."""
    from slca.training.runs import checkpoint_step, newest_intact_checkpoint, read_jsonl

    d = Path(cfg.run_dir)
    if not (d / "config.json").is_file():
        return [f"interrupted ({what}) before training started; nothing was written"]
    try:
        rows = read_jsonl(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []
    except ValueError:
        rows = []
    done = max((int(r["step"]) for r in rows if isinstance(r.get("step"), int)), default=0)
    ckpt = newest_intact_checkpoint(d / "checkpoints")[0]
    out = [f"interrupted ({what}): {done} of {cfg.steps} steps done (the last logged in {d / 'metrics.jsonl'})"]
    if ckpt is None:
        out.append(f"saved: no checkpoint yet (save_every={cfg.save_every}); resuming starts again from step 0")
    else:
        step = checkpoint_step(ckpt) or 0
        later = "" if done <= step else f"; step {done} is" if done == step + 1 else f"; steps {step + 1}-{done} are"
        later += " recomputed on resume" if later else ""
        out.append(f"saved: the checkpoint of step {step} ({ckpt}){later}")
    out.append(f"resume: {resume_command(d)}")
    return out


def _holds_report(d: Path) -> bool:
    """Whether ``d`` is a run folder (``metrics.jsonl``) or holds a report slca wrote (its ``report.md``)."""
    if (d / "metrics.jsonl").is_file():
        return True
    try:
        head = (d / "report.md").read_text(errors="replace")[:2000]
    except OSError:
        return False
    return "Written by slca " in head or "Command: `slca " in head


def _new_report_folder(base: Path = Path("slca-report")) -> Path:
    """``slca-report``, or ``slca-report-2``, ``-3``, ...: the first that does not exist yet."""
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One or more run folders (each with metrics.jsonl)."),
    out: Optional[Path] = typer.Option(None, help="Where to write report.md, curves.png and the token pages (default: the run folder "
                                       "for one run; for several, a new folder ./slca-report, or slca-report-2, ... if that exists)."),
) -> None:
    """Write the markdown + PNG report for one or more runs.

    One run: into its own folder, as slca train does. Several: into --out, by default a new folder
    (./slca-report, or slca-report-2, ...), so no run folder is written into unasked.
    """
    import re

    from slca.reporting.report import read_metrics, run_labels, write_report, write_token_html
    from slca.training.samples import read_samples

    for d in run_dirs:
        if not (d / "metrics.jsonl").is_file():
            _fail(f"{d}: not a run folder (no metrics.jsonl)")
        if not _refuse_value_errors(lambda: read_metrics(d)):
            _fail(f"{d / 'metrics.jsonl'}: holds no complete record")
    if out is not None and out.exists() and not out.is_dir():
        _fail(f"--out: {out} exists and is not a folder")
    if out is not None and out.is_dir() and any(out.iterdir()) and not _holds_report(out):
        _fail(f"--out: {str(out)!r} is neither a run folder nor a report slca wrote; slca report writes report.md, curves.png "
              "and token pages into a new or empty folder, a run folder or an earlier report's folder: choose another --out")
    runs = run_labels(run_dirs)  # unique even when two folders share a name
    if out is None:
        out = run_dirs[0] if len(run_dirs) == 1 else _new_report_folder()
    try:
        md = write_report(runs, out)
        for label, d in runs.items():  # token pages go with the report: tokens.html, or tokens-<label>.html for several runs
            if (d / "samples.json").exists():
                name = "tokens.html" if len(runs) == 1 else f"tokens-{re.sub(r'[^A-Za-z0-9._-]+', '-', label).strip('-')}.html"
                write_token_html(read_samples(d / "samples.json"), out / name, title=f"{label}: token-level advantages")
    except (ValueError, OSError) as e:
        _fail(str(e))
    _print_eval_tables(runs, "final metrics")
    console.print(f"report: {md}")


@app.command()
def compare(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON file of config fields shared by every run (estimator, seed, run_dir are set per run)."),
    estimators: Optional[str] = typer.Option(None, help="Comma-separated registered estimators; the first is the baseline of paired differences. Default: the registry's reference estimators (grpo,slca,gdpo)."),
    seeds: str = typer.Option("0,1,2,3,4", help="Comma-separated seeds; every estimator runs every seed."),
    out: Path = typer.Option(Path("runs/compare"), help="Folder for all runs and the report."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a config field for every run (repeatable)."),
    jobs: int = typer.Option(2, help="Runs trained at once (one torch thread each)."),
    level: float = typer.Option(0.5, help="Tool-success level for 'steps to level'."),
    title: str = typer.Option("slca compare", help="Report title."),
    overwrite: bool = typer.Option(False, help="Retrain runs in --out whose stored config differs (default: refuse)."),
) -> None:
    """Train several estimators over several seeds on the same budget and report honestly."""
    from slca.reporting.compare import write_compare_report
    from slca.training.experiments import run_compare

    from slca.core.registry import list_estimators

    est = [e.strip() for e in estimators.split(",") if e.strip()] if estimators is not None else list_estimators(reference=True)
    try:
        sds = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        _fail(f"--seeds: must be comma-separated integers, got {seeds!r}")
    if not est:
        _fail("--estimators: need at least one estimator")
    if not sds:
        _fail("--seeds: need at least one seed")
    if len(set(est)) < len(est) or len(set(sds)) < len(sds):
        _fail(f"--estimators / --seeds: each may appear once, got {est} and {sds}")
    if jobs < 1:
        _fail(f"--jobs: must be >= 1, got {jobs}")
    if not math.isfinite(level):
        _fail(f"--level: must be a finite number, got {level}")
    from slca.training.experiments import check_out, check_runs

    _refuse_value_errors(lambda: check_out(out))
    from slca.training.config import file_overrides

    shared, dropped = _refuse_value_errors(lambda: file_overrides(config, drop=("estimator", "seed", "run_dir"))) if config else ([], [])
    if dropped:
        console.print(f"note: compare sets estimator, seed and run_dir per run; {config} sets {', '.join(dropped)}, not used")
    set_ = shared + list(set_)
    cfg = _refuse_value_errors(lambda: check_runs(est, sds, out, set_, overwrite=overwrite))
    from slca.models.named import NAMED_MODELS, prepare_named

    if cfg.model in NAMED_MODELS:  # build (or convert) a named model once, before runs start in parallel
        prepare_named(cfg.model, progress=True)
    t0 = time.time()
    n = len(est) * len(sds)
    done = [0]

    def progress(spec, rc, secs):
        done[0] += 1
        status = "[green]ok[/green]" if rc == 0 else f"[red]failed ({_exit_status(rc)})[/red]"
        console.print(f"[{done[0]}/{n}] {spec.estimator} seed {spec.seed}: {status} in {secs / 60:.1f} min")

    from slca._fs import writing
    from slca._procs import interrupted_by, signals_raise

    command = _this_command()
    try:
        with signals_raise():  # Ctrl-C, kill PID, a closed terminal: every run this starts is stopped
            specs = run_compare(est, sds, out, list(set_), jobs=jobs, progress=progress, overwrite=overwrite)
    except KeyboardInterrupt as e:
        what, code = interrupted_by(e)
        typer.echo(f"interrupted ({what}): the runs still training were stopped; each keeps its newest checkpoint (logs in "
                   f"{out / 'logs'})", err=True)
        typer.echo(f"continue: {command}   (the same command: finished runs are reused, the stopped ones resumed)", err=True)
        raise typer.Exit(code) from None
    except (ValueError, RuntimeError, OSError) as e:  # OSError: a write failed (WriteError, naming the file)
        _fail(str(e))
    wall = json.loads((out / "compare.json").read_text()).get("train_wall_s", time.time() - t0)

    def write() -> Path:  # a failed write: one line naming the file (summary.json, curves_compare.png or report.md)
        with writing(out / "report.md", "the comparison's report", after=f"the runs are complete: {command} writes it again"):
            return write_compare_report(specs, out, level=level, command=command, wall_s=wall, title=title)

    md = _refuse_value_errors(write)
    console.print(f"report: [bold]{md}[/bold]")


def _check_eval_out(out: Path, suite: str) -> None:
    """Refuse to replace an ``<suite>.json`` / ``<suite>.md`` in ``out`` that is not an earlier ``slca eval``'s report."""
    j, m = out / f"{suite}.json", out / f"{suite}.md"
    ours = False
    if j.is_file():
        try:
            d = json.loads(j.read_text())
            ours = isinstance(d, dict) and d.get("suite") == suite and "metrics" in d
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise ValueError(f"--out: {str(j)!r} is not a report of slca eval; slca eval would replace it: choose another --out")
    if m.exists() and not (ours and m.read_text(errors="replace").startswith("# slca eval:")):
        raise ValueError(f"--out: {str(m)!r} is not a report of slca eval; slca eval would replace it: choose another --out")


@app.command("eval")
def eval_(
    model: str = typer.Option(..., "--model", "-m", help="A save_pretrained model folder with a chat template, a Hugging Face hub id (from_pretrained), 'default' (the embedded model) or 'smollm2' (SmolLM2-135M-Instruct, the smollm2 extra)."),
    suite: str = typer.Option(..., "--suite", help="toolworld | toucan | bfcl | tau2."),
    split: str = typer.Option("test", "--split", help="toolworld split: test (unseen names and phrasings), fresh (names and phrasings new to toolworld, never used to choose anything), train_heldout (new requests of the training distribution), test_entities, test_phrasings or heldout_tools."),
    categories: str = typer.Option("", "--categories", help="Comma-separated: BFCL categories or groups (simple, non_live, non_python, python, live, single_turn, multi_turn, all); tau2 domains (airline, retail); in-domain task kinds."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Records per BFCL category / tau2 domain / in-domain suite."),
    samples: int = typer.Option(1, "--samples", "-k", help="K rollouts per record (pass^k for k <= K)."),
    format: str = typer.Option("hermes", "--format", help="Tool-call format the model writes."),
    out: Path = typer.Option(Path("runs/eval"), "--out", help="Folder for <suite>.json and <suite>.md."),
    data: Optional[Path] = typer.Option(None, "--data", help="Rows for --suite toucan (Toucan, verl/paper or slca format)."),
    tools: str = typer.Option("", "--tools", help="Your own Python tool functions answer the --data rows' calls (--suite toucan): a module or a .py file, as slca train's tools (docs/integrations.md)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Tokens per assistant turn."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature (default 0 = greedy for K=1, 0.7 for K>1)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Conversations generated together."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    user: str = typer.Option("llm", "--user", help="tau2 user: llm (tau2's user simulator on --user-url) or scripted (offline smoke run)."),
    user_url: Optional[str] = typer.Option(None, "--user-url", help="OpenAI-compatible base URL of the tau2 user simulator, e.g. http://localhost:8000/v1."),
    user_model: Optional[str] = typer.Option(None, "--user-model", help="Model name for the tau2 user simulator on that endpoint."),
    user_max_tokens: Optional[int] = typer.Option(None, "--user-max-tokens", help="Longest tau2 user turn in tokens (default: the server's)."),
    max_steps: int = typer.Option(100, "--max-steps", help="tau2 orchestrator steps per simulation."),
) -> None:
    """Evaluate a model: in-domain (toolworld / toucan), BFCL or tau2-bench."""
    import os

    from slca.chat import list_formats
    from slca.eval import EvalConfig, GenerationConfig, run_eval

    # (option, value, what a good value is): refused before anything loads
    checks = [
        ("--samples", samples, samples >= 1, ">= 1"),
        ("--limit", limit, limit is None or limit >= 1, ">= 1"),
        ("--max-new-tokens", max_new_tokens, max_new_tokens >= 1, ">= 1"),
        ("--batch-size", batch_size, batch_size >= 1, ">= 1"),
        ("--max-steps", max_steps, max_steps >= 1, ">= 1"),
        ("--user-max-tokens", user_max_tokens, user_max_tokens is None or user_max_tokens >= 1, ">= 1"),
        ("--seed", seed, 0 <= seed < 2**32, "in [0, 2**32)"),
        ("--temperature", temperature, temperature is None or (math.isfinite(temperature) and temperature >= 0), "a finite number >= 0"),
        ("--format", format, format in list_formats(), f"one of {list_formats()}"),
        ("--user", user, user in ("llm", "scripted"), "llm or scripted"),
        ("--data", data, data is None or data.is_file() or data.is_dir(), "an existing file or a save_to_disk folder"),
        ("--out", out, not out.exists() or out.is_dir(), "a folder"),
    ]
    for name, value, ok, want in checks:
        if not ok:
            _fail(f"{name}: must be {want}, got {str(value)!r}")
    _refuse_value_errors(lambda: _check_eval_out(out, suite))
    try:
        gen = GenerationConfig(
            max_new_tokens=max_new_tokens, temperature=temperature if temperature is not None else (0.0 if samples == 1 else 0.7), batch_size=batch_size, seed=seed
        )
        cfg = EvalConfig(
            model=model, suite=suite, categories=[c.strip() for c in categories.split(",") if c.strip()], limit=limit, samples=samples, format=format,
            data=str(data) if data else None, tools=tools, split=split, gen=gen, user=user, user_base_url=user_url, user_model=user_model,
            user_api_key=os.environ.get("SLCA_USER_API_KEY"), user_max_tokens=user_max_tokens, max_steps=max_steps,
        )
        _quiet_loading()
        rep = run_eval(cfg, out)
    except (ValueError, ModuleNotFoundError, OSError) as e:  # OSError: a file not readable, a write failed (naming the file)
        _fail(str(e))
    console.print(rep.to_markdown(), soft_wrap=True, markup=False, highlight=False)  # markdown tables: never wrapped
    console.print(f"saved: [bold]{out / (suite + '.json')}[/bold], [bold]{out / (suite + '.md')}[/bold]")


@app.command("build-model")
def build_model(
    out: Path = typer.Option(..., "--out", help="Folder to write the model to (src/slca/models/shipped refreshes the shipped weights)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="The recipe folder (CHECKOUT/recipes/warmstart) or a checkout's root; "
                                          "default: the checkout slca runs from, else ./recipes/warmstart. Not in the installed package."),
    checkpoint_every: int = typer.Option(20, "--checkpoint-every", help="SFT steps between saves of the build's state "
                                         "(in .OUT.build-state beside --out); a build stopped there continues from its last save "
                                         "when run again. 0: no saves."),
    fresh: bool = typer.Option(False, "--fresh", help="Discard a saved partial build and start from nothing."),
) -> None:
    """Build the embedded default model from its recipe (demonstrations, tokenizer, SFT warm start; ~40 CPU minutes, resumable)."""
    import shutil

    from slca.models.recipe import import_recipe

    if checkpoint_every < 0:
        _fail(f"--checkpoint-every: {checkpoint_every} (0 or more)")
    try:
        warmstart = import_recipe(recipe)
    except ImportError as e:  # no recipe there (a pip install), or another 'recipes' package
        _fail(str(e))
    from slca._fs import replaceable_model_folder
    from slca._procs import interrupted_by, signals_raise

    problem = replaceable_model_folder(out)
    if problem is not None:  # before ~40 minutes of building, not after
        _fail(f"--out: {problem}")
    cfg = warmstart.BuildConfig()
    name = warmstart.fingerprint(cfg)
    tmp, state = out.parent / f".{out.name}.build", out.parent / f".{out.name}.build-state"  # build-model's own folders
    if fresh:
        shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # records the fingerprint, which load_default reads
        with signals_raise():
            rep = _refuse_value_errors(lambda: warmstart.build_default(tmp, cfg, progress=True, state_dir=state, checkpoint_every=checkpoint_every))
    except KeyboardInterrupt as e:
        what, code = interrupted_by(e)
        saved = warmstart.read_build_state(state, cfg) if (state / warmstart.STATE_FILE).is_file() else None
        typer.echo(f"interrupted ({what}): " + (f"the build's state of SFT step {saved['step']} is saved in {state}; run the same "
                   "command to continue" if saved else "no state saved yet; the build starts over when run again"), err=True)
        typer.echo(f"continue: {_this_command()}", err=True)
        raise typer.Exit(code) from None
    problem = replaceable_model_folder(out)  # again: files may have arrived there while it built
    if problem is not None:
        _fail(f"--out: {problem}; the new build is kept in {tmp}")
    if out.exists():  # an earlier build: moved aside, the new one renamed into place, then the old one removed
        import os

        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        tmp.rename(out)
    again = f", resumed at SFT step {rep.resumed_from}" if rep.resumed_from else ""
    console.print(f"built {rep.n_params / 1e6:.2f}M parameters in {rep.total_seconds / 60:.1f} min "
                  f"({rep.total_cpu_seconds / 60:.1f} min CPU{again}), fingerprint {name}: {out}")


@app.command("export-model")
def export_model(
    model: str = typer.Option(..., "--model", "-m", help="'smollm2', 'default', a model folder, a LoRA checkpoint or a hub id."),
    out: Path = typer.Option(..., "--out", help="New folder to write (save_pretrained) for transformers serve."),
    tool_calls: bool = typer.Option(False, "--tool-calls", help="Have the server parse <tool_call> blocks into OpenAI tool_calls "
                                    "(a malformed call from the model then makes transformers serve answer HTTP 500)."),
    chat_template: str = typer.Option("", "--chat-template", help="A .jinja file or inline template replacing the model's."),
) -> None:
    """Write a model as a folder for an OpenAI-compatible server (transformers serve, vLLM); see docs/environment.md."""
    from slca.models.serving import export_for_serving

    _quiet_loading()
    path = _refuse_value_errors(lambda: export_for_serving(model, out, tool_calls=tool_calls, chat_template=chat_template))
    console.print(f"saved: [bold]{path}[/bold]; serve it with: transformers serve --host 127.0.0.1 --port 8000 "
                  f"(requests name the model {str(path.resolve())!r})", soft_wrap=True)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
