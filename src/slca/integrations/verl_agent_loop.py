"""A verl tool agent loop that writes both SLCA rewards at their token positions.

verl 0.9.1's v1 trainer (``trainer.use_v1=True``, the default) scores each
finished rollout in the agent-loop worker and stores the reward function's dict
in ``extra_fields["reward_extra_info"]``; ``AgentLoopOutput.as_dict()`` then
turns the scalar ``reward_score`` into ``rm_scores``, the estimator's
``token_level_rewards``. :class:`SLCAToolAgentLoop` is verl's ``ToolAgentLoop``
unchanged except that it returns an :class:`SLCAAgentLoopOutput`, whose
``as_dict()`` writes ``tool_reward`` and ``summary_reward`` in the layout of
:func:`slca.integrations.verl.pack_token_rewards` (with the rollout's own
``response_mask``, so the execution segment is the one the estimator sees).

Use it with an agent-loop config file (see ``examples/verl/agent_loop.yaml``)::

    - name: slca_tool_agent
      _target_: slca.integrations.verl_agent_loop.SLCAToolAgentLoop

and ``actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loop.yaml``,
``actor_rollout_ref.rollout.agent.default_agent_loop=slca_tool_agent``.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from slca.integrations.verl import SUMMARY_KEY, TOOL_KEY, pack_token_rewards

__all__ = ["SLCAAgentLoopOutput", "SLCAToolAgentLoop", "AGENT_NAME", "pad_single_token_response"]

AGENT_NAME = "slca_tool_agent"


class SLCAAgentLoopOutput(AgentLoopOutput):
    """``AgentLoopOutput`` whose ``rm_scores`` carry both tiers at their positions (a score without the
    two tiers as the summary reward: on a padded one-token response verl would put it where the
    execution reward is read)."""

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        info = (self.extra_fields or {}).get("reward_extra_info") or {}
        if self.reward_score is None:
            return out
        if TOOL_KEY in info and SUMMARY_KEY in info:
            tool, summary = float(info[TOOL_KEY]), float(info[SUMMARY_KEY])
        else:  # a reward function without the two tiers: its score is the summary reward (as on verl's layout)
            tool, summary = 0.0, float(self.reward_score)
        mask = out["response_mask"].unsqueeze(0)  # (1, T): this rollout, unpadded
        out["rm_scores"] = pack_token_rewards(
            torch.tensor([tool]), torch.tensor([summary]), mask, torch.tensor([mask.shape[1]])
        )[0]
        return out

    @classmethod
    def from_output(cls, output: AgentLoopOutput) -> "SLCAAgentLoopOutput":
        """Same fields, same "set" fields (``as_dict`` dumps only those)."""
        values = {name: getattr(output, name) for name in type(output).model_fields}
        return cls.model_construct(_fields_set=set(output.model_fields_set), **values)


def pad_single_token_response(output: AgentLoopOutput, pad_token_id: int) -> AgentLoopOutput:
    """Give a one-token response a second, masked token (the pad token, ``response_mask`` 0).

    Both rewards need a position of their own (:func:`slca.integrations.verl.pack_token_rewards`);
    verl keeps each rollout's ``rm_scores`` as long as its response, so a one-token response has
    one. The added token is outside the loss (mask 0, like a tool-response token) and comes after
    every policy token, so it changes no policy token's log-probability. Longer responses are
    returned unchanged.
    """
    if len(output.response_ids) != 1:
        return output
    output.response_ids = [*output.response_ids, int(pad_token_id)]
    output.response_mask = [*output.response_mask, 0]
    if output.response_logprobs is not None:
        output.response_logprobs = [*output.response_logprobs, 0.0]
    return output


@register(AGENT_NAME)
class SLCAToolAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` returning :class:`SLCAAgentLoopOutput` (one-token responses padded
    by one masked token, :func:`pad_single_token_response`)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        return SLCAAgentLoopOutput.from_output(pad_single_token_response(output, pad))
