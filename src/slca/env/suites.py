"""Task suites for training and evaluation: the built-in ``toolworld`` or a task file, with their simulator."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slca.env import python_tools, toolworld
from slca.env.loaders import fit_prompts, load_tasks, split_tasks
from slca.types import Task

__all__ = ["fit_suites", "load_suite", "load_suites"]

log = logging.getLogger("slca.env")


def load_suite(suite: str, split: str, seed: int, tools: str = "") -> tuple[list[Task], Callable[[Task], Any]]:
    """Tasks of a split and the simulator factory for them: the one loader of ``slca train``
    (``suite``, ``eval_suite``) and of ``slca eval``'s in-domain suites (``--suite toolworld
    --split``, ``--suite toucan --data``), so a task runs against the same world in both.

    ``suite`` is ``"toolworld"`` (its ``split``) or anything
    :func:`slca.env.load_tasks` reads: a JSONL / JSON / parquet file or a
    ``datasets`` ``save_to_disk`` folder (``split`` is not used). Either way the
    simulator is toolworld's environment (:func:`slca.env.toolworld.make_env`),
    which answers toolworld tools from its world (toolworld tasks saved to a file
    included) and any other tool from the schema-guided simulator.

    ``tools`` (an import path or ``.py`` file, :mod:`slca.env.python_tools`): the
    user's own tool functions answer the calls instead, and the file's rows take
    their tool schemas from the functions.
    """
    if tools:
        if suite == "toolworld":
            raise ValueError("tools: your own tool functions need a task file as the suite, not 'toolworld'")
        functions = python_tools.load_tool_functions(tools)
        return python_tools.load_python_tasks(suite, functions), python_tools.python_env(functions)
    if suite == "toolworld":
        tasks = toolworld.make_tasks(split, seed=seed)  # the split's default size
    else:
        p = Path(suite)
        if not p.exists():
            raise ValueError(f"suite {suite!r}: not 'toolworld' and no such file or folder")
        tasks = load_tasks(p)
    return tasks, lambda task: toolworld.make_env(task, seed=seed)


def load_suites(suite: str, seed: int, *, eval_suite: str = "", eval_fraction: float = 0.0, eval_split: str = "train_heldout",
                ood_splits: Sequence[str] = (), tools: str = "") -> tuple[list[Task], list[Task], dict[str, list[Task]], Callable[[Task], Any]]:
    """Training tasks, held-out evaluation tasks, out-of-distribution sets and the simulator factory of a run.

    Held-out tasks (logged as ``eval/*``): ``eval_suite`` (loaded like ``suite``)
    if given, else an ``eval_fraction`` share of a file suite
    (:func:`slca.env.loaders.split_tasks`), else toolworld's ``eval_split``
    (default ``train_heldout``: new requests of the training distribution) for
    toolworld, else none (a warning says so). ``ood_splits``: toolworld splits
    evaluated beside it (``{split: tasks}``, logged as ``eval_<split>/*``); for a
    file suite they are not evaluated (a warning says so). ``tools``: the user's
    tool functions for the suite and ``eval_suite`` (:func:`load_suite`).
    """
    if eval_suite and eval_fraction:
        raise ValueError("give eval_suite or eval_fraction, not both")
    train, make_env = load_suite(suite, "train", seed, tools)
    if eval_suite:
        held = load_suite(eval_suite, "test", seed, tools)[0]
    elif eval_fraction:
        if suite == "toolworld":
            raise ValueError("eval_fraction is for a file suite; toolworld evaluates on its own held-out splits (eval_split)")
        train, held = split_tasks(train, eval_fraction, seed)
    elif suite == "toolworld":
        held = load_suite(suite, eval_split, seed)[0]
    else:
        held = []
        log.warning("suite %s has no held-out evaluation (set eval_suite or eval_fraction): eval metrics will be missing", suite)
    ood: dict[str, list[Task]] = {}
    if suite == "toolworld":
        ood = {s: load_suite(suite, s, seed)[0] for s in ood_splits}
    elif ood_splits:
        log.warning("ood_splits %s are toolworld splits: not evaluated for suite %s", list(ood_splits), suite)
    return train, held, ood, make_env


def fit_suites(train: list[Task], held: list[Task], tokenizer: Any, max_total_tokens: int, *, suite: str,
               eval_suite: str = "") -> tuple[list[Task], list[Task]]:
    """Loaded tasks whose prompt leaves room to generate (:func:`slca.env.loaders.fit_prompts`); toolworld's own are kept as they are."""
    if suite != "toolworld":
        train = fit_prompts(train, tokenizer, max_total_tokens, what=f"training tasks of {suite}")
    if held and (eval_suite or suite != "toolworld"):
        held = fit_prompts(held, tokenizer, max_total_tokens, what="held-out tasks")
    return train, held
