"""Run reports: markdown + PNG plots from metrics.jsonl, and the token-level HTML page."""

from __future__ import annotations

import functools
import json
import math
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

import slca
from slca import metrics as M
from slca.training.runs import read_metrics
from slca.training.samples import SampleGroup, SampleRollout, is_finite_number, samples_from_json

__all__ = ["read_metrics", "read_config", "write_report", "write_token_html", "md_row", "md_header", "final_eval", "eval_prefixes", "mean_of", "run_labels", "provenance", "metric_range", "smoothed", "PLOTS", "SMOOTH_K"]

PLOTS = [(p.key, p.title) for p in M.RUN_PLOTS]
"""(metric, title) of each panel of ``curves.png`` (:data:`slca.metrics.RUN_PLOTS`), one line per run."""
SMOOTH_K = 5
"""Training reward, gradient-norm and cosine curves are drawn as a trailing mean over this many steps."""


def smoothed(key: str) -> bool:
    """Whether a curve of ``key`` is drawn as a :data:`SMOOTH_K`-step trailing mean (:attr:`slca.metrics.Metric.smooth`:
    the noisy per-step training rewards, gradient norm and cosine; held-out metrics, the rolling volatility and
    contamination are drawn raw)."""
    return M.lookup(key).smooth


metric_range = M.metric_range


def run_labels(run_dirs: list[str | Path]) -> dict[str, Path]:
    """One unique label per run folder: the folder name, or as many trailing path parts as it takes
    to tell folders with one name apart (``a/seed0``, ``b/seed0``); a folder given twice gets ``#2``."""
    paths = [Path(d) for d in run_dirs]
    full = [p.resolve().parts for p in paths]
    labels: list[str] = []
    for i, parts in enumerate(full):
        k = 1
        while k < len(parts) and any(j != i and full[j][-k:] == parts[-k:] and full[j] != parts for j in range(len(full))):
            k += 1
        labels.append("/".join(parts[-k:]) if parts else str(paths[i]))
    out: dict[str, Path] = {}
    for lab, p in zip(labels, paths):
        name, n = lab, 1
        while name in out:
            n += 1
            name = f"{lab} #{n}"
        out[name] = p
    return out


def provenance() -> dict[str, str]:
    """The slca version and the git commit of the slca source (``-dirty`` with uncommitted changes; ``unknown`` outside a git checkout)."""
    src = Path(slca.__file__).resolve().parent
    commit = "unknown (not a git checkout)"
    try:
        git = ["git", "-C", str(src)]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10).stdout.strip()
            commit = head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return {"slca_version": slca.__version__, "git_commit": commit}


def read_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``config.json`` (None when the folder has none)."""
    p = Path(run_dir) / "config.json"
    if not p.exists():
        return None
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{str(p)!r}: expected a JSON object of config fields")
    return cfg


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _smooth(y: list[float], k: int = SMOOTH_K) -> list[float]:
    """Trailing mean over the last ``k`` points (fewer at the start)."""
    out = []
    for i in range(len(y)):
        w = y[max(0, i - k + 1) : i + 1]
        out.append(sum(w) / len(w))
    return out


def eval_prefixes(rows: list[dict[str, Any]]) -> list[str]:
    """The evaluation sets of a run, in order: ``eval`` (the held-out set) first, then ``eval_<split>`` (out of distribution)."""
    return M.eval_sets_of(k for r in rows for k in r)


def final_eval(rows: list[dict[str, Any]], prefix: str = M.EVAL_SET) -> dict[str, float]:
    """The last record's ``<prefix>/*`` metrics (default the held-out set's, ``eval/*``)."""
    for r in reversed(rows):
        ev = {k: v for k, v in r.items() if k.startswith(prefix + "/")}
        if ev:
            return ev
    return {}


def mean_of(rows: list[dict[str, Any]], key: str) -> float:
    """Mean of ``key`` over the rows where it is a finite number (NaN when none is)."""
    v = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sum(v) / len(v) if v else float("nan")


def _fmt3(v: Any) -> str:
    """A number to 3 decimals; ``nan`` for a missing one (NaN is logged as null)."""
    return f"{v:.3f}" if isinstance(v, (int, float)) else "nan"


def _md_cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def md_row(cells: Sequence[Any]) -> str:
    """One row of a markdown table, each cell as ``str`` gives it (escape text from a run with ``_md_cell`` first)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def md_header(columns: Sequence[str]) -> list[str]:
    """A markdown table's header row and its separator."""
    return [md_row(columns), "|---" * len(columns) + "|"]


def _config_md(configs: dict[str, dict[str, Any] | None]) -> list[str]:
    have = {k: v for k, v in configs.items() if v is not None}
    lines = ["## Config", ""]
    missing = [k for k, v in configs.items() if v is None]
    if missing:
        lines += [f"No config.json in the run folder of: {', '.join(missing)}.", ""]
    if not have:
        return lines
    fields = list(dict.fromkeys(f for c in have.values() for f in c))
    if len(have) > 1:
        differ = [f for f in fields if len({json.dumps(c.get(f), sort_keys=True) for c in have.values()}) > 1]
        if differ:
            lines += ["Fields that differ between runs:", "", *md_header(["field", *map(_md_cell, have)])]
            lines += [md_row([f, *(_md_cell(json.dumps(c.get(f))) for c in have.values())]) for f in differ]
        else:
            lines += ["Every run has the same config."]
        lines.append("")
    for label, c in have.items():
        lines += [f"<details><summary>{_md_cell(label)}: every field</summary>", "", "```json", json.dumps(c, indent=2, sort_keys=True), "```", "", "</details>", ""]
    return lines


def write_report(runs: dict[str, str | Path], out_dir: str | Path, title: str = "slca run report", extra_md: str = "") -> Path:
    """Markdown report + one PNG of all panels comparing ``runs`` ({label: run_dir}).

    The markdown records the slca version and git commit that wrote it and each
    run's config (``config.json``; the fields that differ between runs first).
    Steps on the plots are the ``step`` values of ``metrics.jsonl``; training
    curves are a :data:`SMOOTH_K`-step trailing mean (said in each panel title).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {label: read_metrics(d) for label, d in runs.items()}
    configs = {label: read_config(d) for label, d in runs.items()}
    fig, axes = plt.subplots(2, 5, figsize=(23, 7.5))
    logged = {k for rows in data.values() for r in rows for k in r}
    for ax, (key, ttl) in zip(axes.flat, [(p.key, p.title) for p in M.with_logged_ood_split(M.RUN_PLOTS, logged)]):
        for label, rows in data.items():
            xs, ys = _series(rows, key)
            if not xs:
                continue
            ax.plot(xs, _smooth(ys) if smoothed(key) else ys, marker="" if len(xs) > 12 else "o", label=label)
        ax.set_title(ttl + (f"\n{SMOOTH_K}-step trailing mean" if smoothed(key) else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if M.lookup(key) is M.EVAL_TOOL_TASKS:  # the in- and out-of-distribution panels on one scale, so their gap shows
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    legend_ax = next((ax for ax in axes.flat if ax.lines), None)
    if legend_ax is not None:
        legend_ax.legend()
    fig.tight_layout()
    png = out / "curves.png"
    fig.savefig(png, dpi=90)
    plt.close(fig)

    prov = provenance()
    keys = [m.in_set for m in M.RUN_FINAL]
    lines = [f"# {title}", "", f"Written by slca {prov['slca_version']}, commit `{prov['git_commit']}`.", ""]
    prefixes = list(dict.fromkeys(p for rows in data.values() for p in eval_prefixes(rows)))
    for prefix in prefixes or [M.EVAL_SET]:
        what = "held-out set (eval/*)" if prefix == M.EVAL_SET else f"out of distribution: toolworld split {prefix[len('eval_'):]} ({prefix}/*)"
        lines += [f"## Final metrics, {what}", "", *md_header(["run", *keys])]
        for label, rows in data.items():
            ev = final_eval(rows, prefix)
            lines.append(md_row([_md_cell(label), *(_fmt3(ev.get(m.key(set=prefix))) for m in M.RUN_FINAL)]))
        lines.append("")
    diag = [m.name for m in M.RUN_DIAGNOSTICS]
    lines += ["## Diagnostics (mean over steps)", "", *md_header(["run", *diag])]
    for label, rows in data.items():
        lines.append(md_row([_md_cell(label), *(f"{mean_of(rows, k):.3f}" for k in diag)]))
    lines += ["", "![curves](curves.png)", "",
              f"Steps are the `step` values in each run's metrics.jsonl. Panels titled '{SMOOTH_K}-step trailing mean' "
              f"(training rewards, gradient norm and cosine) show the mean of the last {SMOOTH_K} steps; the others show raw values.", ""]
    if extra_md:
        lines += [extra_md, ""]
    lines += _config_md(configs)
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md


def _color(a: float, scale: float) -> str:
    x = max(-1.0, min(1.0, a / scale)) if scale > 0 else 0.0
    if x >= 0:
        return f"rgba(22,163,74,{0.12 + 0.75 * x:.2f})"
    return f"rgba(220,38,38,{0.12 + 0.75 * -x:.2f})"


def _token_runs(r: SampleRollout, adv: list[float], scale: float) -> list[dict[str, Any]]:
    """A rollout's tokens cut into runs of one kind (env / tool / summ) and one advantage (to 3 decimals)."""
    runs: list[dict[str, Any]] = []
    for t, tok in enumerate(r.tokens):
        a = float(adv[t]) if t < len(adv) else 0.0
        kind = "env" if not r.model_mask[t] else ("tool" if r.tool_mask[t] else "summ")
        key = (kind, None if kind == "env" else round(a, 3))
        if not runs or runs[-1]["key"] != key:
            runs.append({"key": key, "kind": kind, "adv": a, "tokens": []})
        runs[-1]["tokens"].append({"text": tok if isinstance(tok, str) else str(tok), "adv": a, "color": _color(a, scale)})
    return runs


def _fmt(x: Any, spec: str) -> str:
    return format(x, spec) if is_finite_number(x) else ("n/a" if isinstance(x, float) else str(x))


@functools.lru_cache(maxsize=1)
def _templates():
    env = jinja2.Environment(loader=jinja2.PackageLoader("slca.reporting", "templates"), autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["num"] = lambda x: _fmt(x, ".3f")
    env.filters["signed"] = lambda x: _fmt(x, "+.3f")
    return env


def write_token_html(samples: Sequence[SampleGroup] | Any, out_path: str | Path, title: str = "token-level advantages",
                     estimators: Sequence[str] | None = None) -> Path:
    """One page: for each recorded group, every rollout's tokens coloured by the
    advantage each estimator gives them, side by side (green +, red -, grey =
    environment tokens). Tool-segment tokens carry a blue underline, summary
    tokens a purple one; each run of tokens with one advantage ends in a box
    with that number, and each column starts with the mean advantage on the
    execution and summary segments. ``samples`` are the recorded groups
    (:class:`~slca.training.samples.SampleGroup`, or their JSON layout as read from
    ``samples.json``, checked by :func:`~slca.training.samples.samples_from_json`).
    ``estimators`` default to those the samples recorded. Rendered by a jinja2
    template with autoescape: every value from ``samples`` is escaped."""
    if not (isinstance(samples, (list, tuple)) and all(isinstance(g, SampleGroup) for g in samples)):
        samples = samples_from_json(samples)
    if estimators is None:  # the estimators the run recorded (the registry's reference estimators)
        estimators = samples[0].estimators() if samples else []
    groups = [_group_view(g, estimators) for g in samples]
    page = _templates().get_template("tokens.html.jinja").render(title=title, estimators=list(estimators), groups=groups)
    p = Path(out_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(page)
    return p


def _group_view(g: SampleGroup, estimators: Sequence[str]) -> dict[str, Any]:
    """What the page template shows of one group: per rollout one column of token runs per estimator."""
    scale = max((abs(float(x)) for r in g.rollouts for e in estimators for x in r.adv.get(e, [])), default=1.0) or 1.0
    rolls = []
    for r in g.rollouts:
        cols = [{"estimator": e, "runs": _token_runs(r, r.adv.get(e, []), scale), "mean_tool": r.segment_mean(e, True),
                 "mean_summary": r.segment_mean(e, False)} for e in estimators]
        rolls.append({"tool_reward": r.tool_reward, "summary_reward": r.summary_reward, "stop_reason": r.stop_reason, "columns": cols})
    return {"step": g.step, "task": g.task, "kind": g.kind, "prompt": g.prompt, "rollouts": rolls}
