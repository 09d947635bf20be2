"""Building blocks the reward tiers share: a rollout's calls and results, a task's gold and tools, pair scores."""

from __future__ import annotations

from dataclasses import dataclass

from slca.env.schema import ToolBox
from slca.rewards.values import normalize
from slca.types import Task, ToolCall, ToolResult, Turn

__all__ = ["Unscorable", "RolloutCalls", "check_turns", "collect_calls", "gold_calls", "task_toolbox", "pair_score"]


class Unscorable(ValueError):
    """The rollout's data do not allow a score (the reward becomes NaN with this reason)."""


@dataclass
class RolloutCalls:
    """A rollout's tool turns, their well-formed calls in order and the result of each call."""

    tool_turns: list[Turn]
    calls: list[ToolCall]
    results: list[ToolResult]


def check_turns(turns: list[Turn]) -> None:
    """ValueError unless ``turns`` is a list of :class:`Turn` (naming the bad index)."""
    if not isinstance(turns, list):
        raise ValueError(f"turns must be a list of Turn, got {type(turns).__name__}")
    for i, t in enumerate(turns):
        if not isinstance(t, Turn):
            raise ValueError(f"turns[{i}] must be a Turn, got {type(t).__name__}")


def collect_calls(turns: list[Turn]) -> RolloutCalls:
    """Tool turns, their well-formed calls in order and the result of each call.

    ``turn.results[i]`` answers ``turn.parsed.calls[i]``; extra results (answers
    to malformed fragments) may follow and are ignored. A turn with fewer
    results than calls raises :class:`Unscorable`.
    """
    check_turns(turns)
    tool_turns, calls, results = [], [], []
    for i, t in enumerate(turns):
        if not t.parsed.is_tool_turn:
            continue
        tool_turns.append(t)
        if len(t.results) < len(t.parsed.calls):
            raise Unscorable(f"turn {i} has {len(t.parsed.calls)} calls but {len(t.results)} results")
        calls.extend(t.parsed.calls)
        results.extend(t.results[: len(t.parsed.calls)])
    return RolloutCalls(tool_turns, calls, results)


def gold_calls(task: Task) -> list[ToolCall]:
    """Every gold call of the task, steps in order (ValueError naming a step that holds a non-call)."""
    for s, step in enumerate(task.gold):
        for c in step:
            if not isinstance(c, ToolCall):
                raise ValueError(f"task {task.id!r}: gold step {s} holds {type(c).__name__}, expected ToolCall")
    return [c for step in task.gold for c in step]


def task_toolbox(task: Task) -> ToolBox:
    """The task's tools as a :class:`ToolBox`; :class:`Unscorable` when their schemas are invalid."""
    try:
        return ToolBox(task.tools)
    except ValueError as e:
        raise Unscorable(f"task {task.id!r} has invalid tools: {e}") from e


def pair_score(p: ToolCall, g: ToolCall, box: ToolBox) -> float:
    """How well call ``p`` matches gold call ``g`` (same name assumed): the share of argument keys
    whose normalised values agree; 0 when ``p`` violates its tool's JSON Schema."""
    if box.argument_error(p.name, p.arguments) is not None:
        return 0.0
    keys = set(p.arguments) | set(g.arguments)
    if not keys:
        return 1.0
    same = sum(1 for k in keys if k in p.arguments and k in g.arguments and normalize(p.arguments[k]) == normalize(g.arguments[k]))
    return same / len(keys)
