"""Hierarchical rewards (HierR, arXiv 2609.29050): an execution tier for tool tokens
and a summary tier for summary tokens, each a total with named components.

Two presets (:data:`REWARD_PRESETS`): slca's own tiers (:func:`hierarchical_rewards`, :mod:`slca.rewards.hierarchical`) and the
authors' released reward (:mod:`slca.rewards.paper`, :func:`paper_rewards`).

A rollout that cannot be scored gets a NaN total with its reason (logged on the
``slca.rewards`` logger); the advantage functions give NaN rewards advantage 0.
"""

from __future__ import annotations

from slca.rewards.batch import REWARD_PRESETS, RewardComponents, ScoredBatch, score_batch
from slca.rewards.execution import EVAL_SCORES, EXECUTION_WEIGHTS, Unscorable, eval_scores, execution_reward, in_domain_metrics, parallel_split
from slca.rewards.hierarchical import hierarchical_rewards
from slca.rewards.judges import Judge, OpenAIJudge, RewardModelJudge, digit_logit_bias
from slca.rewards.messages import turns_from_messages
from slca.rewards.paper import PaperJudge, paper_process_score, paper_rewards, paper_success, paper_summary_score
from slca.rewards.summary import REFUSAL_MARKERS, SUMMARY_WEIGHTS, summary_reward

__all__ = [
    "EVAL_SCORES",
    "EXECUTION_WEIGHTS",
    "Judge",
    "OpenAIJudge",
    "PaperJudge",
    "RewardModelJudge",
    "REFUSAL_MARKERS",
    "REWARD_PRESETS",
    "RewardComponents",
    "SUMMARY_WEIGHTS",
    "Unscorable",
    "ScoredBatch",
    "digit_logit_bias",
    "eval_scores",
    "execution_reward",
    "hierarchical_rewards",
    "in_domain_metrics",
    "paper_process_score",
    "paper_rewards",
    "paper_success",
    "paper_summary_score",
    "parallel_split",
    "score_batch",
    "summary_reward",
    "turns_from_messages",
]
