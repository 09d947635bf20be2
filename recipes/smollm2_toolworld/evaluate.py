"""The evaluation issue 42 asks of stage 1, before (``smollm2``) and after (``smollm2-toolworld``).

* toolworld, greedy, on each of :data:`SPLITS`: the split's tasks in ``make_tasks`` order from the
  first, as many as it takes to hold :data:`MIN_TOOL_TASKS` tool-needing tasks (single, parallel,
  chain; the no-tool and unservable tasks among them are run and reported too). The tasks of
  ``slca eval --suite toolworld --split S`` (the split's default size) are their prefix. Rollouts,
  simulator and scores are ``slca eval``'s (:func:`slca.eval.in_domain.run_in_domain`, the world of
  :func:`slca.env.suites.load_suite`, up to 4 assistant turns of at most 256 new tokens); the figure
  is tool-task success.
* BFCL, greedy: the first :data:`BFCL_LIMIT` records of each of :data:`BFCL_CATEGORIES` ("simple" is
  ``simple_python``, BFCL v3's simple category), as ``slca eval --suite bfcl --categories ... --limit 50``
  runs them (:func:`slca.eval.bfcl.run_bfcl`).

Each evaluation runs in its own process (``python -m recipes.smollm2_toolworld eval``) and writes
``<suite>.json`` / ``<suite>.md`` (slca eval's report) and ``summary.json`` (the figures, the model's
fingerprint, CPU and wall seconds) into its folder; a folder whose ``summary.json`` has the same settings and
model fingerprint is not run again, so the script resumes (and a rebuilt adapter is evaluated anew).
:func:`summarize` makes the before/after tables.

``train_heldout`` is the split that may choose the recipe (:mod:`.config`); the others are reported only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from slca.env import toolworld
from slca.types import Task

__all__ = ["SPLITS", "TOOL_KINDS", "MIN_TOOL_TASKS", "BFCL_CATEGORIES", "BFCL_LIMIT", "split_tasks", "evaluate", "summarize"]

SPLITS = ("train_heldout", "test", "test_entities", "test_phrasings", "heldout_tools")
"""The toolworld splits evaluated; ``train_heldout`` is the selection split."""
TOOL_KINDS = ("single", "parallel", "chain")
"""Task kinds that need a tool call."""
MIN_TOOL_TASKS = 300
"""Tool-needing tasks per split."""
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple")
"""BFCL categories (issue 42: simple, multiple, parallel, parallel_multiple, live_simple)."""
BFCL_LIMIT = 50
"""The first records of each BFCL category."""
MAX_NEW_TOKENS = 256
"""``slca eval``'s default."""


def split_tasks(split: str, min_tool_tasks: int = MIN_TOOL_TASKS, seed: int = 0) -> list[Task]:
    """The first tasks of ``split`` (``make_tasks(split, n, seed)`` order), up to and including its
    ``min_tool_tasks``-th tool-needing one; fewer when the split runs out (``train_heldout`` can)."""
    n = max(min_tool_tasks * 2, 64)
    while True:
        tasks = toolworld.make_tasks(split, n=n, seed=seed)
        tool = [i for i, t in enumerate(tasks) if t.kind in TOOL_KINDS]
        if len(tool) >= min_tool_tasks:
            return tasks[: tool[min_tool_tasks - 1] + 1]
        if len(tasks) < n:  # the split ran out
            return tasks
        n *= 2


def _fingerprint(model: str, adapter: str | None) -> str:
    """What identifies the weights evaluated (:func:`slca.models.named.model_fingerprint`; an unshipped adapter by its files)."""
    if adapter is not None:
        from slca.models.smollm2_toolworld import adapter_fingerprint

        return f"smollm2-toolworld:adapter:{adapter_fingerprint(adapter) or 'none'}"
    from slca.models.named import model_fingerprint

    return model_fingerprint(model)


def _load(model: str, adapter: str | None):
    if adapter is not None:
        from slca.models.smollm2_toolworld import load_smollm2_toolworld

        return load_smollm2_toolworld(adapter, progress=True)
    from slca.eval.runner import load_model

    return load_model(model)


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent)
    return r.stdout.strip() or "?"


def evaluate(model: str, suite: str, out_dir: str | Path, *, split: str = "train_heldout", adapter: str | None = None,
             min_tool_tasks: int = MIN_TOOL_TASKS, categories: tuple[str, ...] = BFCL_CATEGORIES, bfcl_limit: int = BFCL_LIMIT,
             max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = 8, progress: bool = True) -> dict[str, Any]:
    """Evaluate ``model`` (a named model or folder, or SmolLM2 plus the adapter in ``adapter``) on ``suite``
    (``toolworld``: ``split``; ``bfcl``: ``categories``); returns and writes ``out_dir/summary.json``."""
    from slca.eval.agent import GenerationConfig, PolicyAgent

    out = Path(out_dir)
    settings = {"model": model, "adapter": adapter, "suite": suite, "split": split if suite == "toolworld" else None,
                "min_tool_tasks": min_tool_tasks if suite == "toolworld" else None,
                "categories": list(categories) if suite == "bfcl" else None, "bfcl_limit": bfcl_limit if suite == "bfcl" else None,
                "max_new_tokens": max_new_tokens, "temperature": 0.0}
    fp = _fingerprint(model, adapter)
    done = out / "summary.json"
    if done.is_file():
        prev = json.loads(done.read_text())
        if prev.get("settings") == settings and prev.get("model_fingerprint") == fp:
            return prev  # done already, on these weights
    if suite not in ("toolworld", "bfcl"):
        raise ValueError(f"suite must be toolworld or bfcl, got {suite!r}")
    if suite == "toolworld":
        from slca.env.suites import load_suite

        tasks = split_tasks(split, min_tool_tasks)
        make_env = load_suite("toolworld", split, 0)[1]  # slca eval's world for the split (seed 0)
    else:
        from slca.eval.bfcl import resolve_categories

        resolve_categories(list(categories))
    t0, c0 = time.perf_counter(), time.process_time()
    m, tok = _load(model, adapter)
    label = "smollm2-toolworld" if adapter is not None else model
    agent = PolicyAgent(m, tok, "hermes", GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, batch_size=batch_size))
    if suite == "toolworld":
        from slca.eval.in_domain import run_in_domain

        report = run_in_domain(agent, tasks, make_env, suite="toolworld", max_turns=4, progress=progress, model_label=label)
        report.config["split"] = split
    else:
        from slca.eval.bfcl import run_bfcl

        report = run_bfcl(agent, list(categories), limit=bfcl_limit, progress=progress, model_label=label)
    report.config.update({"generated_tokens": agent.generated_tokens, "max_new_tokens": max_new_tokens, "temperature": 0.0})
    report.save(out)
    summary: dict[str, Any] = {"settings": settings, "model_fingerprint": fp, "metrics": report.metrics, "groups": report.groups,
                               "counts": report.counts, "cpu_seconds": round(time.process_time() - c0, 1),
                               "seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
                               "load_1min_after": round(os.getloadavg()[0], 2), "generated_tokens": agent.generated_tokens,
                               "commit": _commit(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if suite == "toolworld":
        kinds = [k for k in TOOL_KINDS if k in report.counts]
        n_tool = sum(report.counts[k] for k in kinds)
        summary.update(tasks=len(tasks), tool_tasks=n_tool,
                       tool_task_success=sum(report.groups[k]["success"] * report.counts[k] for k in kinds) / n_tool if n_tool else None)
    tmp = done.with_name("summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, done)
    return summary


def _fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def _seconds(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _bfcl_record(root: Path, stage: str, evals: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """A stage's BFCL figures and where they come from: this recipe's evaluation (``<stage>/bfcl/summary.json``), else
    ``slca eval --suite bfcl``'s report in that folder (``bfcl.json``, the same rollouts and checker), else, after SFT,
    study 42's evaluation of the shipped model by that command (``../study42/sft/bfcl``, the RL runs' start)."""
    if f"{stage}/bfcl" in evals:
        return evals[f"{stage}/bfcl"], f"`{stage}/bfcl/summary.json`"
    places = [root / stage / "bfcl"] + ([root.parent / "study42" / "sft" / "bfcl"] if stage == "after" else [])
    for d in places:
        if (d / "bfcl.json").is_file():
            rec = json.loads((d / "bfcl.json").read_text())
            return rec, f"`slca eval` in `{os.path.relpath(d, root)}` (`{rec['config'].get('model_fingerprint', '?')}`)"
    return {}, "not measured"


def summarize(results: str | Path) -> str:
    """``results/summary.md`` (and ``summary.json``): the build and every evaluation under ``results/{before,after}``."""
    root = Path(results)
    evals: dict[str, dict[str, Any]] = {}
    for p in sorted(root.glob("*/*/summary.json")):
        evals[f"{p.parent.parent.name}/{p.parent.name}"] = json.loads(p.read_text())
    build = json.loads((root / "build.json").read_text()) if (root / "build.json").is_file() else None
    lines = ["# SmolLM2-135M-Instruct as a toolworld tool caller: stage 1 (issue 42)", "",
             "Written by `python -m recipes.smollm2_toolworld summary` from the records in this folder. Greedy, "
             f"{MAX_NEW_TOKENS} new tokens a turn. `train_heldout` is the only split that may choose the recipe; the others "
             "are reported, never used to choose.", ""]
    if build is not None:
        t = build["train"]
        lines += ["## Build", "", f"- fingerprint `{build['fingerprint']}`, recipe version {build['recipe_version']}, base "
                  f"`{build['base']['fingerprint']}` (GGUF sha256 `{build['base']['gguf_sha256'][:16]}`)",
                  f"- data: {build['data']['examples']} demonstrations of the toolworld train split (digest "
                  f"`{build['data']['digest'][:16]}`), {build['data']['train_heldout_overlap']} train_heldout requests among them",
                  f"- LoRA r {build['config']['lora_r']} on {', '.join(build['config']['lora_target_modules'])}: "
                  f"{build['adapter']['parameters']:,} parameters, {build['adapter'].get('bytes', 0) / 2**20:.1f} MiB",
                  f"- {t['steps']} steps, {t['tokens']:,} tokens: **{t['cpu_seconds']:,.0f} CPU s** ({t['seconds']:,.0f} s wall, "
                  f"{t['threads']} threads); loss {t['first_loss']:.3f} -> {t['last_loss']:.3f}", ""]
    lines += ["## toolworld: tool-task success", "", "| split | tool tasks | before (smollm2) | after (smollm2-toolworld) | after: all tasks | before CPU s | after CPU s |",
              "|---|---|---|---|---|---|---|"]
    for split in SPLITS:
        b, a = evals.get(f"before/toolworld-{split}"), evals.get(f"after/toolworld-{split}")
        n = (a or b or {}).get("tool_tasks")
        lines.append(f"| `{split}`{' (selection)' if split == 'train_heldout' else ''} | {_fmt(n)} | {_fmt((b or {}).get('tool_task_success'))} "
                     f"| {_fmt((a or {}).get('tool_task_success'))} | {_fmt(((a or {}).get('metrics') or {}).get('success'))} "
                     f"| {_seconds((b or {}).get('cpu_seconds'))} | {_seconds((a or {}).get('cpu_seconds'))} |")
    lines += ["", "## BFCL: accuracy, first records of each category", "", "| category | before | after |", "|---|---|---|"]
    (b, b_from), (a, a_from) = _bfcl_record(root, "before", evals), _bfcl_record(root, "after", evals)
    for c in BFCL_CATEGORIES:
        def acc(e: dict[str, Any]) -> str:
            g = (e.get("groups") or {}).get(c)
            return "-" if g is None else f"{g.get('accuracy', float('nan')):.3f} ({e['counts'].get(c)})"
        lines.append(f"| {c} | {acc(b)} | {acc(a)} |")
    lines += ["", f"Before: {b_from}. After: {a_from}."]
    lines += ["", "## Runs", "", "| evaluation | model fingerprint | CPU s | wall s | when | commit |", "|---|---|---|---|---|---|"]
    lines += [f"| {k} | `{v['model_fingerprint']}` | {v['cpu_seconds']} | {v['seconds']} | {v['when']} | {v['commit']} |" for k, v in evals.items()]
    text = "\n".join(lines) + "\n"
    (root / "summary.md").write_text(text)
    (root / "summary.json").write_text(json.dumps({"build": build, "evaluations": evals}, indent=1))
    return text
