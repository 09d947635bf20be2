"""Run reports: markdown + PNG plots from metrics.jsonl, and the token-level HTML page."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["read_metrics", "write_report", "write_token_html", "final_eval", "PLOTS"]

# (metric, title) pairs; each becomes one panel, one line per run
PLOTS = [
    ("reward/tool", "execution reward (train)"),
    ("reward/summary", "summary reward (train)"),
    ("eval/success", "held-out Success"),
    ("eval/reward_tool", "held-out execution reward"),
    ("grad/cosine_tool_summary", "cosine(tool grad, summary grad)"),
    ("grad/volatility", "grad-norm volatility (rolling CV)"),
    ("adv/contamination", "advantage contamination"),
    ("grad/norm", "gradient norm (pre-clip)"),
]


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        raise ValueError(f"{str(p)!r} does not exist: is {str(run_dir)!r} a run folder?")
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["step"] + 1)
            ys.append(float(v))
    return xs, ys


def _smooth(y: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(y)):
        w = y[max(0, i - k + 1) : i + 1]
        out.append(sum(w) / len(w))
    return out


def final_eval(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The last record's eval/* metrics."""
    for r in reversed(rows):
        ev = {k: v for k, v in r.items() if k.startswith("eval/")}
        if ev:
            return ev
    return {}


def _mean_of(rows: list[dict[str, Any]], key: str) -> float:
    v = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sum(v) / len(v) if v else float("nan")


def write_report(runs: dict[str, str | Path], out_dir: str | Path, title: str = "slca run report", extra_md: str = "") -> Path:
    """Markdown report + one PNG of all panels comparing ``runs`` ({label: run_dir})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {label: read_metrics(d) for label, d in runs.items()}
    fig, axes = plt.subplots(2, 4, figsize=(18, 7))
    for ax, (key, ttl) in zip(axes.flat, PLOTS):
        for label, rows in data.items():
            xs, ys = _series(rows, key)
            if not xs:
                continue
            smooth = key.startswith(("reward/", "grad/norm", "grad/cos"))
            ax.plot(xs, _smooth(ys) if smooth else ys, marker="" if len(xs) > 12 else "o", label=label)
        ax.set_title(ttl, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.tight_layout()
    png = out / "curves.png"
    fig.savefig(png, dpi=90)
    plt.close(fig)

    keys = ["eval/success", "eval/name_f1", "eval/arg_match", "eval/process", "eval/reward_tool", "eval/reward_summary", "eval/parse_ok"]
    lines = [f"# {title}", "", "## Final held-out metrics", "", "| run | " + " | ".join(k.split("/")[1] for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for label, rows in data.items():
        ev = final_eval(rows)
        lines.append(f"| {label} | " + " | ".join(f"{ev.get(k, float('nan')):.3f}" for k in keys) + " |")
    diag = ["grad/cosine_tool_summary", "grad/volatility", "adv/contamination", "perf/gen_tokens_per_s", "perf/train_tokens_per_s"]
    lines += ["", "## Diagnostics (mean over steps)", "", "| run | " + " | ".join(diag) + " |", "|---" * (len(diag) + 1) + "|"]
    for label, rows in data.items():
        lines.append(f"| {label} | " + " | ".join(f"{_mean_of(rows, k):.3f}" for k in diag) + " |")
    lines += ["", "![curves](curves.png)", ""]
    if extra_md:
        lines += [extra_md, ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md


def _color(a: float, scale: float) -> str:
    x = max(-1.0, min(1.0, a / scale)) if scale > 0 else 0.0
    if x >= 0:
        return f"rgba(22,163,74,{0.12 + 0.75 * x:.2f})"
    return f"rgba(220,38,38,{0.12 + 0.75 * -x:.2f})"


def write_token_html(samples: list[dict[str, Any]], out_path: str | Path, title: str = "token-level advantages", estimators: tuple[str, ...] = ("grpo", "slca")) -> Path:
    """One page: for each recorded group, every rollout's tokens coloured by the
    advantage each estimator gives them, side by side (green +, red -, grey =
    environment tokens). Tool-segment tokens carry a blue underline, summary
    tokens a purple one."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>" + esc(title) + "</title><style>",
        "body{font-family:system-ui,sans-serif;margin:20px;max-width:1600px}",
        ".grid{display:grid;grid-template-columns:repeat(%d,1fr);gap:12px}" % len(estimators),
        ".tok{font-family:monospace;font-size:12px;white-space:pre-wrap;padding:1px 0}",
        ".env{background:#e5e7eb;color:#6b7280}.tool{border-bottom:2px solid #2563eb}.summ{border-bottom:2px solid #9333ea}",
        ".roll{border:1px solid #ddd;border-radius:6px;padding:8px;margin:6px 0;line-height:1.7}",
        "h3{margin-bottom:4px} .meta{color:#555;font-size:13px}",
        "</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        "<p class='meta'>Green = positive advantage, red = negative (intensity = magnitude, same scale across columns); "
        "grey = environment (tool-response) tokens, which get no advantage. Blue underline = execution segment, purple = summary segment. "
        "Each group is shown under every estimator: the same tokens and rewards, different credit.</p>",
    ]
    for gi, s in enumerate(samples):
        scale = max((abs(x) for r in s["rollouts"] for e in estimators for x in r["adv"].get(e, [])), default=1.0) or 1.0
        parts.append(f"<h2 id='g{gi}'>step {s['step']} &middot; task {esc(str(s['task']))} ({esc(str(s.get('kind', '')))})</h2>")
        parts.append(f"<details><summary class='meta'>prompt</summary><pre>{esc(s.get('prompt', ''))}</pre></details>")
        parts.append("<div class='grid'>" + "".join(f"<h3>{esc(e.upper())}</h3>" for e in estimators) + "</div>")
        for ri, r in enumerate(s["rollouts"]):
            parts.append(f"<p class='meta'>rollout {ri}: execution reward {r['tool_reward']:.3f}, summary reward {r['summary_reward']:.3f}, stop: {esc(r['stop_reason'])}</p><div class='grid'>")
            for e in estimators:
                adv = r["adv"].get(e, [])
                spans = []
                for t, tok in enumerate(r["tokens"]):
                    a = adv[t] if t < len(adv) else 0.0
                    if not r["model_mask"][t]:
                        spans.append(f"<span class='tok env'>{esc(tok)}</span>")
                        continue
                    seg = "tool" if r["tool_mask"][t] else "summ"
                    spans.append(f"<span class='tok {seg}' style='background:{_color(a, scale)}' title='{e} A={a:+.3f}'>{esc(tok)}</span>")
                parts.append(f"<div class='roll' data-estimator='{esc(e)}'>" + "".join(spans) + "</div>")
            parts.append("</div>")
    parts.append("</body></html>")
    p = Path(out_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(parts))
    return p
