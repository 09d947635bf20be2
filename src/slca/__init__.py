"""slca: Segment-Locked Credit Assignment for tool-calling RL.

Public API; everything not re-exported here may change.
"""

import importlib

from slca.core.advantages import (
    AdvantageInputs,
    compute_advantages,
    conditional_normalize,
    gdpo_advantages,
    get_estimator,
    group_normalize,
    grpo_advantages,
    list_estimators,
    register_estimator,
    resolve_estimator,
    slca_advantages,
    slca_cond_advantages,
    slca_turn_advantages,
    turn_normalize,
)
from slca.core.losses import aggregate, clipped_surrogate, kl_penalty, masked_mean, token_weights
from slca.core.paper import positional_segments, rltr_planner_advantages, slca_paper_advantages, toolpo_grpo_advantages
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
