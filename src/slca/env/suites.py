"""Task suites for training: the built-in ``toolworld`` or a task file, with their simulator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from slca.types import Task

__all__ = ["load_suite"]


def load_suite(suite: str, split: str, seed: int) -> tuple[list[Task], Callable[[Task], Any]]:
    """Tasks of a split and the simulator factory for them.

    ``suite`` is ``"toolworld"`` (its ``split``) or a JSONL/parquet task file
    (:func:`slca.env.load_tasks`; ``split`` is not used). Either way the
    simulator is toolworld's environment, which answers toolworld tools from its
    world and any other tool from the schema-guided simulator.
    """
    from slca.env import load_tasks, toolworld

    if suite == "toolworld":
        tasks = toolworld.make_tasks(split, seed=seed)
    else:
        p = Path(suite)
        if not p.exists():
            raise ValueError(f"suite {suite!r}: not 'toolworld' and no such file")
        tasks = load_tasks(p)
    return tasks, lambda task: toolworld.make_env(task, seed=seed)
