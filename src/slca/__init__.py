"""slca: Segment-Locked Credit Assignment for tool-calling RL.

Public API; everything not re-exported here may change.
"""

import importlib

from slca.core import registry as _registry
from slca.core.advantages import gdpo_advantages, group_normalize, grpo_advantages, slca_advantages
from slca.core.beyond import conditional_normalize, slca_cond_advantages, slca_turn_advantages, turn_normalize
from slca.core.losses import aggregate, clipped_surrogate, kl_penalty, masked_mean, token_weights
from slca.core.paper import positional_segments, rltr_planner_advantages, slca_paper_advantages, toolpo_grpo_advantages
from slca.core.registry import (
    AdvantageInputs,
    compute_advantages,
    get_estimator,
    list_estimators,
    register_estimator,
    resolve_estimator,
)
from slca.core.segments import environment_mask, segment_masks, tool_turn_index, turn_index
from slca.types import (
    ParsedTurn,
    ParseError,
    RewardBreakdown,
    Task,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
    Turn,
)

__version__ = "0.1.0"

# The estimators' optional inputs that the rewards layer computes (slca_cond, slca_turn and the released
# estimators read them; slca.core.registry.InputSpec). core imports nothing above it, so the package root,
# which stands above every layer, registers them; each function is imported on first use, so `import slca`
# does not load the rewards.
_REWARD_INPUTS = (
    ("slca.rewards.turns", "tool_signatures", "one hashable per rollout, e.g. slca.rewards.turns.tool_signature(turns)"),
    ("slca.rewards.turns", "turn_rewards", "(B, K) per-turn scores, e.g. slca.rewards.turns.turn_scores per rollout"),
    ("slca.rewards.paper", "should_no_call", "(B,) 0/1: the task needed a call and the rollout made none (the released penalty guard)"),
    ("slca.rewards.paper", "toolpo_correct_ratio", "(B,) ToolPO's sum C(a^call) / |gold calls|: strictly correct calls, matched one to one"),
    ("slca.rewards.paper", "rltr_comp", "(B,) RLTR's completeness reward in [0, 1]"),
    ("slca.rewards.paper", "rltr_repeat_penalty", "(B,) RLTR's penalty for consecutive repeated calls, <= 0"),
    ("slca.rewards.paper", "rltr_error_penalty", "(B,) RLTR's penalty for invalid calls, <= 0"),
    ("slca.rewards.paper", "rltr_format_valid", "(B,) 0/1: RLTR's format check (an invalid trajectory scores -1)"),
)
for _module, _name, _doc in _REWARD_INPUTS:
    _registry.register_input(_registry.InputSpec(_name, _doc, f"{_module}:{_name}"))
del _module, _name, _doc

__all__ = [
    "AdvantageInputs",
    "ParseError",
    "ParsedTurn",
    "RewardBreakdown",
    "RolloutConfig",
    "Task",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "TrainConfig",
    "Trajectory",
    "Turn",
    "aggregate",
    "clipped_surrogate",
    "compute_advantages",
    "conditional_normalize",
    "encode_conversation",
    "environment_mask",
    "gdpo_advantages",
    "generate_rollouts",
    "get_estimator",
    "get_format",
    "group_normalize",
    "grpo_advantages",
    "kl_penalty",
    "list_estimators",
    "masked_mean",
    "positional_segments",
    "register_estimator",
    "resolve_estimator",
    "rltr_planner_advantages",
    "segment_masks",
    "slca_advantages",
    "slca_cond_advantages",
    "slca_paper_advantages",
    "slca_turn_advantages",
    "token_weights",
    "toolpo_grpo_advantages",
    "tool_turn_index",
    "train",
    "turn_index",
    "turn_normalize",
]


_LAZY = {
    "encode_conversation": "slca.chat",
    "get_format": "slca.chat",
    "generate_rollouts": "slca.generation.rollout",
    "RolloutConfig": "slca.generation.rollout",
    "TrainConfig": "slca.training.config",
    "train": "slca.training.trainer",
}


def __getattr__(name: str):
    # Lazily exposed parts that pull heavier imports (transformers, the environment).
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'slca' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
