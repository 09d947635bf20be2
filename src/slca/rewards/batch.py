"""Hierarchical rewards of a whole rollout batch, as (B,) tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from slca.types import Trajectory

__all__ = ["ScoredBatch", "score_batch"]


@dataclass
class ScoredBatch:
    """Per-rollout rewards of a batch.

    Attributes:
        tool: (B,) execution-tier totals (NaN = unscored).
        summary: (B,) summary-tier totals (NaN = unscored).
        components: ``"exec/<name>"`` / ``"summary/<name>"`` -> one value per
            rollout that reported that component.
        reasons: ``"<task id>: <reason>"`` for every unscored tier.
    """

    tool: torch.Tensor
    summary: torch.Tensor
    components: dict[str, list[float]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def score_batch(trajs: list[Trajectory]) -> ScoredBatch:
    """:func:`~slca.rewards.hierarchical_rewards` of every rollout (NaN + reason when unscorable)."""
    from slca.rewards import hierarchical_rewards

    tool, summ, comps, reasons = [], [], {}, []
    for t in trajs:
        e, s = hierarchical_rewards(t)
        tool.append(e.total)
        summ.append(s.total)
        for prefix, rb in (("exec", e), ("summary", s)):
            for k, v in rb.components.items():
                comps.setdefault(f"{prefix}/{k}", []).append(float(v))
            if rb.reason and math.isnan(rb.total):
                reasons.append(f"{t.task.id}: {rb.reason}")
    return ScoredBatch(torch.tensor(tool, dtype=torch.float32), torch.tensor(summ, dtype=torch.float32), comps, reasons)
