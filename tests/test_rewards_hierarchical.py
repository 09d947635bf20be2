"""slca's reward preset, both tiers of a finished rollout (slca.rewards.hierarchical)."""

from __future__ import annotations

import slca.rewards
from slca.rewards.hierarchical import hierarchical_rewards
from slca.types import Trajectory

from _helpers import approx, task_of
from _helpers import run_steps as run


def test_hierarchical_rewards_on_a_trajectory():
    t = task_of("stock2")
    turns = run(t, t.gold, t.reference_answer)
    traj = Trajectory(task=t, prompt_ids=[1], response_ids=[2, 3], model_mask=[1, 0], logprobs=[0.0, 0.0], turns=turns,
                      final_text=t.reference_answer, stop_reason="final_answer")
    e, s = hierarchical_rewards(traj)
    assert e.total == approx(1.0) and s.total == approx(1.0)
    assert slca.rewards.hierarchical_rewards is hierarchical_rewards  # re-exported from the package
