"""Hierarchical rewards of a whole rollout batch (slca.rewards.batch): both tiers as (B,) tensors, their
components gathered by name, and the reasons of unscored rollouts."""

from __future__ import annotations

import math

import torch

from slca.env import toolworld
from slca.rewards.batch import RewardComponents, score_batch
from slca.types import RewardBreakdown, Trajectory

from _helpers import run_steps, tool_turn


def test_reward_components_are_gathered_per_tier_and_named_as_logged():
    c = RewardComponents()
    c.add(RewardBreakdown(0.5, {"format": 1.0, "success": 0.0}), RewardBreakdown(1.0, {"faithfulness": 1.0}))
    c.add(RewardBreakdown(1.0, {"format": 1.0, "success": 1.0}), RewardBreakdown(0.0, {"faithfulness": 0.0}))
    assert c.execution == {"format": [1.0, 1.0], "success": [0.0, 1.0]} and c.summary == {"faithfulness": [1.0, 0.0]}
    assert list(c.by_metric()) == [("reward/exec/format", [1.0, 1.0]), ("reward/exec/success", [0.0, 1.0]),
                                   ("reward/summary/faithfulness", [1.0, 0.0])]


def test_score_batch_fills_both_tiers():
    from slca.env import toolworld
    from slca.types import Trajectory

    task = toolworld.make_tasks("train", n=1, seed=0)[0]
    sb = score_batch([Trajectory(task=task, prompt_ids=[], response_ids=[], model_mask=[], logprobs=[], turns=[], final_text="",
                                 stop_reason="final_answer")])
    assert set(sb.components.execution) == {"format", "name_f1", "arg_match", "success", "efficiency"}
    assert set(sb.components.summary) == {"faithfulness", "completeness", "no_hallucination", "concision"}
    assert all(len(v) == 1 for _, v in sb.components.by_metric())


def _traj(task, turns, final):
    return Trajectory(task=task, prompt_ids=[], response_ids=[], model_mask=[], logprobs=[], turns=turns, final_text=final,
                      stop_reason="final_answer")


def test_score_batch_keeps_the_order_and_gives_an_unscored_rollout_nan_and_a_reason():
    task = next(t for t in toolworld.make_tasks("train", n=40, seed=0) if t.kind == "single")
    (g,) = task.gold[0]
    good = _traj(task, run_steps(task, task.gold, task.reference_answer), task.reference_answer)
    lost = _traj(task, [tool_turn([g])], "It is 20 C.")  # the engine lost the tool result
    sb = score_batch([good, lost, good])
    assert sb.tool.dtype == sb.summary.dtype == torch.float32 and sb.tool.shape == sb.summary.shape == (3,)
    assert sb.tool[0] == sb.tool[2] == 1.0 and math.isnan(sb.tool[1]) and math.isnan(sb.summary[1])
    assert len(sb.reasons) == 2 and all(r.startswith(f"{task.id}: ") and "1 calls but 0 results" in r for r in sb.reasons)
    assert len(sb.components.execution["format"]) == 3 and math.isnan(sb.components.execution["format"][1])


def test_score_batch_of_no_rollouts_is_empty():
    sb = score_batch([])
    assert sb.tool.shape == sb.summary.shape == (0,) and sb.reasons == [] and list(sb.components.by_metric()) == []


def test_reward_components_keep_only_the_components_a_rollout_reports():
    c = RewardComponents()
    c.add(RewardBreakdown(1.0, {"format": 1.0}), RewardBreakdown(0.5, {"faithfulness": 0.5, "judge": 1}))
    c.add(RewardBreakdown(0.0, {"format": 0.0}), RewardBreakdown(0.0, {"faithfulness": 0.0}))
    assert c.summary == {"faithfulness": [0.5, 0.0], "judge": [1.0]} and isinstance(c.summary["judge"][0], float)
    assert dict(c.by_metric())["reward/summary/judge"] == [1.0]
