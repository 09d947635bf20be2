"""Hierarchical rewards of a whole rollout batch, as (B,) tensors."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from slca import metrics as M
from slca.rewards.hierarchical import hierarchical_rewards
from slca.types import RewardBreakdown, Trajectory

__all__ = ["REWARD_PRESETS", "RewardComponents", "ScoredBatch", "score_batch"]

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


def score_batch(trajs: list[Trajectory], *, reward: str = "slca") -> ScoredBatch:
    """The two reward tiers of every rollout (NaN + reason when unscorable).

    ``reward`` names the preset (:data:`REWARD_PRESETS`): ``"slca"`` (default),
    :func:`~slca.rewards.hierarchical.hierarchical_rewards`; ``"paper"``, :func:`~slca.rewards.paper.paper_rewards`
    (no judge is served here: slca's rule summary tier stands in for the authors' judge).
    """
    from slca.rewards.paper import paper_rewards

    if reward not in REWARD_PRESETS:
        raise ValueError(f"reward must be one of {REWARD_PRESETS}, got {reward!r}")
    tiers = hierarchical_rewards if reward == "slca" else paper_rewards
    tool, summ, comps, reasons = [], [], RewardComponents(), []
    for t in trajs:
        e, s = tiers(t)
        tool.append(e.total)
        summ.append(s.total)
        comps.add(e, s)
        reasons += [f"{t.task.id}: {rb.reason}" for rb in (e, s) if rb.reason and math.isnan(rb.total)]
    return ScoredBatch(torch.tensor(tool, dtype=torch.float32), torch.tensor(summ, dtype=torch.float32), comps, reasons)
