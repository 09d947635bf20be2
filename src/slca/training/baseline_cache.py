"""The evaluation before any update, shared between runs that would compute the same one.

Every run of a comparison evaluates its policy at step 0 (``eval_on_start``):
the runs of one seed start from the same weights and evaluate the same tasks the
same way, so the estimators' step-0 evaluations are one computation done once per
estimator. On a real model that is most of a run's cost (SmolLM2-135M: about an
hour of CPU per 350 tasks). With the environment variable ``SLCA_BASELINE_CACHE``
naming a folder, :func:`cached_baseline` keeps each step-0 evaluation there under a
key of everything it depends on, and a run whose key is there reads it instead of
recomputing it. ``slca compare`` sets the variable to ``<out>/baseline_cache`` for
its runs (unless it is set already).

The key (:func:`baseline_key`) hashes: every parameter and buffer of the policy
(bytes, dtype, shape, name; with LoRA the adapters too), the evaluated tasks (in
full, per set), the evaluation's rollout settings (greedy or sampled, and the seed
a sampled one uses), the tool-call format, the slca source (every ``.py`` file of
the package: a changed scorer is a new key), and the torch, transformers and peft
versions. A damaged or unreadable entry is recomputed and rewritten; a folder that
cannot be written is reported once and the run goes on without the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import torch

from slca.training.runs import write_atomic
from slca.types import Task

__all__ = ["BASELINE_CACHE_ENV", "baseline_key", "cached_baseline"]

BASELINE_CACHE_ENV = "SLCA_BASELINE_CACHE"
log = logging.getLogger("slca.train")


@lru_cache(maxsize=1)
def _source_hash() -> str:
    """sha256 over the slca package's Python files (relative path and bytes, in path order)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _versions() -> str:
    out = [f"torch={torch.__version__}"]
    for mod in ("transformers", "peft"):
        try:
            out.append(f"{mod}={__import__(mod).__version__}")
        except ImportError:
            out.append(f"{mod}=none")
    return ",".join(out)


def _task_text(t: Task) -> str:
    return json.dumps(dataclasses.asdict(t), sort_keys=True, default=repr)


def baseline_key(model: torch.nn.Module, task_sets: dict[str, list[Task]], settings: dict[str, Any]) -> str:
    """The cache key of an evaluation of ``model`` on ``task_sets`` (set name -> tasks) under ``settings``
    (JSON-serialisable: the rollout configuration and anything else the evaluation reads); 64 hex digits."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    for name in sorted(task_sets):
        h.update(f"set {name}\0".encode())
        for task in task_sets[name]:
            h.update(_task_text(task).encode() + b"\0")
    h.update(json.dumps(settings, sort_keys=True, default=repr).encode())
    h.update(_source_hash().encode() + _versions().encode())
    return h.hexdigest()


def cached_baseline(evaluate: Callable[[], dict[str, float]], key: Callable[[], str], folder: str | None = None) -> tuple[dict[str, float], str | None]:
    """``evaluate()``, or its stored result under ``key()`` in ``folder`` (default: ``$SLCA_BASELINE_CACHE``;
    none: no cache, ``evaluate()`` as it is). Returns the metrics and the entry's path when they were read from
    the cache (None when computed)."""
    folder = folder if folder is not None else os.environ.get(BASELINE_CACHE_ENV, "")
    if not folder:
        return evaluate(), None
    path = Path(folder) / f"{key()}.json"
    try:
        stored = json.loads(path.read_text())["metrics"]
        if isinstance(stored, dict) and all(isinstance(v, (int, float)) for v in stored.values()):
            return {k: float(v) for k, v in stored.items()}, str(path)
        log.warning("%s: not a stored step-0 evaluation; recomputing it", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: unreadable (%s); recomputing it", path, e)
    metrics = evaluate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"metrics": metrics}, indent=1))
    except OSError as e:
        log.warning("step-0 evaluation not cached: %s cannot be written (%s)", path, e)
    return metrics, None
