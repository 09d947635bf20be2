"""slca's own reward preset: the two tiers of a finished rollout (HierR, arXiv 2609.29050).

The execution tier (:func:`slca.rewards.execution.execution_reward`) scores the tool segment, the
summary tier (:func:`slca.rewards.summary.summary_reward`) the answer; :func:`slca.rewards.batch.score_batch`
scores a batch with them (``reward="slca"``).
"""

from __future__ import annotations

from slca.rewards.execution import execution_reward
from slca.rewards.summary import summary_reward
from slca.types import RewardBreakdown, Trajectory

__all__ = ["hierarchical_rewards"]


def hierarchical_rewards(traj: Trajectory, *, judge=None, judge_weight: float = 0.5) -> tuple[RewardBreakdown, RewardBreakdown]:
    """``(execution_reward, summary_reward)`` of a finished rollout."""
    return (
        execution_reward(traj.task, traj.turns),
        summary_reward(traj.task, traj.turns, traj.final_text, judge=judge, judge_weight=judge_weight),
    )
