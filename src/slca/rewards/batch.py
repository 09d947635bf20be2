"""Hierarchical rewards of a whole rollout batch, as (B,) tensors."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from slca import metrics as M
from slca.env.python_tools import import_module_ref
from slca.rewards.hierarchical import hierarchical_rewards
from slca.types import RewardBreakdown, Trajectory

__all__ = ["REWARD_PRESETS", "RewardComponents", "ScoredBatch", "reward_problem", "score_batch", "user_reward"]

REWARD_PRESETS = ("slca", "paper")
"""The rewards :func:`score_batch` gives: ``"slca"``, slca's hierarchical tiers
(:func:`slca.rewards.hierarchical_rewards`); ``"paper"``, the authors' released reward
(:func:`slca.rewards.paper.paper_rewards`: their process score on the tool tier, their summary
score on the summary tier; docs/environment.md)."""


@dataclass(frozen=True)
class RewardComponents:
    """The named components of both reward tiers over a batch (each rollout's
    :attr:`RewardBreakdown.components <slca.types.RewardBreakdown>`, gathered by name).

    Attributes:
        execution: component name -> one value per rollout that reported it (execution tier).
        summary: the same for the summary tier.
    """

    execution: dict[str, list[float]] = field(default_factory=dict)
    summary: dict[str, list[float]] = field(default_factory=dict)

    def add(self, execution: RewardBreakdown, summary: RewardBreakdown) -> None:
        """Append one rollout's components of both tiers."""
        for into, rb in ((self.execution, execution), (self.summary, summary)):
            for k, v in rb.components.items():
                into.setdefault(k, []).append(float(v))

    def by_metric(self) -> Iterator[tuple[str, list[float]]]:
        """``(metric key, values)`` for every execution component (``reward/exec/<name>``), then every
        summary component (``reward/summary/<name>``): the keys they are logged under (:mod:`slca.metrics`)."""
        for family, comps in ((M.REWARD_EXEC, self.execution), (M.REWARD_SUMMARY_PART, self.summary)):
            for k, v in comps.items():
                yield family.key(component=k), v


@dataclass
class ScoredBatch:
    """Per-rollout rewards of a batch.

    Attributes:
        tool: (B,) execution-tier totals (NaN = unscored).
        summary: (B,) summary-tier totals (NaN = unscored).
        components: the components of both tiers, by name.
        reasons: ``"<task id>: <reason>"`` for every unscored tier.
    """

    tool: torch.Tensor
    summary: torch.Tensor
    components: RewardComponents = field(default_factory=RewardComponents)
    reasons: list[str] = field(default_factory=list)


def _tier(ref: str, task_id: str, which: str, v: Any) -> RewardBreakdown:
    """One tier of a user reward function's answer: a number, None (unscored) or a RewardBreakdown."""
    if isinstance(v, RewardBreakdown):
        return v
    if v is None:
        return RewardBreakdown(float("nan"), reason=f"reward {ref!r} returned None for the {which} tier")
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise ValueError(f"reward {ref!r} returned {v!r} as the {which} reward of task {task_id!r}: give a finite number, "
                         "None (unscored) or a RewardBreakdown")
    return RewardBreakdown(float(v))


@functools.lru_cache(maxsize=8)
def user_reward(ref: str) -> Callable[[Trajectory], tuple[RewardBreakdown, RewardBreakdown]]:
    """A reward function the user names, as the two tiers :func:`score_batch` takes.

    ``ref`` is ``"my_pkg.rewards:fn"`` or ``"path/to/rewards.py:fn"``. ``fn(trajectory)`` gets one
    :class:`~slca.types.Trajectory` (``.task`` with its ``gold`` and ``answer_facts``, ``.turns`` with the parsed
    calls and their results, ``.final_text``, ``.stop_reason``) and returns ``(execution, summary)``, each a finite
    number, None (that tier unscored for this rollout: its advantage is 0, the reason is printed) or a
    :class:`~slca.types.RewardBreakdown`. Anything else, or an exception, stops the run with an error naming the
    function and the task: a reward bug is not a property of the rollout.

    Resolved once per process (cached by ``ref``): a ``.py`` file is executed once, not at every step.
    """
    module_ref, sep, attr = ref.partition(":")
    if not sep or not attr:
        raise ValueError(f"reward {ref!r}: one of {list(REWARD_PRESETS)}, or your function as 'module:function' or 'file.py:function'")
    fn = getattr(import_module_ref(module_ref, ref, "reward"), attr, None)
    if not callable(fn):
        raise ValueError(f"reward {ref!r}: {module_ref!r} has no function {attr!r}")

    def tiers(t: Trajectory) -> tuple[RewardBreakdown, RewardBreakdown]:
        try:
            out = fn(t)
        except Exception as e:
            raise RuntimeError(f"reward {ref!r} raised on task {t.task.id!r}: {type(e).__name__}: {e}") from e
        if not isinstance(out, tuple) or len(out) != 2:
            raise ValueError(f"reward {ref!r} returned {type(out).__name__} for task {t.task.id!r}: give a pair (execution, summary)")
        return _tier(ref, t.task.id, "execution", out[0]), _tier(ref, t.task.id, "summary", out[1])

    return tiers


def reward_problem(reward: str) -> str | None:
    """Why ``reward`` (a preset or a user function reference) cannot be used (None: it can)."""
    if reward in REWARD_PRESETS:
        return None
    try:
        user_reward(reward)
    except ValueError as e:
        return str(e).removeprefix(f"reward {reward!r}: ")
    return None


def score_batch(trajs: list[Trajectory], *, reward: str = "slca") -> ScoredBatch:
    """The two reward tiers of every rollout (NaN + reason when unscorable).

    ``reward`` names the preset (:data:`REWARD_PRESETS`): ``"slca"`` (default),
    :func:`~slca.rewards.hierarchical.hierarchical_rewards`; ``"paper"``, :func:`~slca.rewards.paper.paper_rewards`
    (no judge is served here: slca's rule summary tier stands in for the authors' judge); or the user's own
    function, ``"module:function"`` / ``"file.py:function"`` (:func:`user_reward`).
    """
    from slca.rewards.paper import paper_rewards

    if reward in REWARD_PRESETS:
        tiers = hierarchical_rewards if reward == "slca" else paper_rewards
    else:
        tiers = user_reward(reward)
    tool, summ, comps, reasons = [], [], RewardComponents(), []
    for t in trajs:
        e, s = tiers(t)
        tool.append(e.total)
        summ.append(s.total)
        comps.add(e, s)
        reasons += [f"{t.task.id}: {rb.reason}" for rb in (e, s) if rb.reason and math.isnan(rb.total)]
    return ScoredBatch(torch.tensor(tool, dtype=torch.float32), torch.tensor(summ, dtype=torch.float32), comps, reasons)
