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

The loop also checks each rollout's segment masks against the conversation it
held (:func:`mask_check_result`, :mod:`slca.chat.maskcheck`), with the rollout's
own tokenizer and ``multi_turn.format``, and stores the result in
``extra_fields["slca_mask_check"]``; the estimator counts the batch's
mismatches and stops the run above ``SLCA_MASK_CHECK_MAX_MISMATCH``
(:func:`slca.integrations.verl.mask_check_share`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

from slca.chat import list_formats
from slca.chat.maskcheck import check_row_masks
from slca.core.segments import segment_masks
from slca.integrations.verl import AGENT_LOOP_NAME, MASK_CHECK_KEY, SUMMARY_KEY, TOOL_KEY, pack_token_rewards, turn_end_ids

__all__ = ["SLCAAgentLoopOutput", "SLCAToolAgentLoop", "AGENT_NAME", "pad_single_token_response", "mask_check_result"]

AGENT_NAME = AGENT_LOOP_NAME
# what one rollout's run saw (its messages, whether its last generation got one), kept per asyncio task: verl's
# loop runs many rollouts at once on one instance, and its own extra_fields stay as verl fills them
_ROLLOUT: ContextVar[dict[str, Any] | None] = ContextVar("slca_rollout", default=None)


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


def mask_check_result(response_ids: Sequence[int], response_mask: Sequence[int], messages: Sequence[Mapping[str, Any]] | None,
                      *, tokenizer: Any, fmt: str, last_turn_recorded: bool = True,
                      end_of_turn: Sequence[int] | None = None) -> str:
    """One rollout's mask check, as stored in ``extra_fields["slca_mask_check"]``: ``"ok"``; ``"kind: detail"`` (the
    first disagreement, :func:`slca.chat.maskcheck.check_row_masks`); or, not checked, ``"unchecked: why"``.

    verl's tool loop records no message for a turn it generated when a limit (``response_length``,
    ``max_assistant_turns``, ``max_user_turns``) ends the rollout first; that turn's tokens are left out of the
    check (``last_turn_recorded=False``) and the turns before it are checked. Not checked at all: a
    ``multi_turn.format`` slca has no parser for, no conversation, or no recorded turn.

    Args:
        response_ids, response_mask: (n,) the rollout's response and verl's mask (1 on policy tokens).
        messages: the conversation after the prompt, as the loop held it (assistant and tool messages).
        tokenizer: the rollout's tokenizer.
        fmt: ``multi_turn.format`` (verl's tool parser name).
        last_turn_recorded: whether the loop recorded a message for its last generation.
        end_of_turn: the ids that end a turn (default :func:`slca.integrations.verl.turn_end_ids` of ``tokenizer``).
    """
    if fmt not in list_formats():
        return f"unchecked: multi_turn.format {fmt!r} has no slca parser ({', '.join(list_formats())})"
    if messages is None:
        return "unchecked: no conversation"
    eot = list(turn_end_ids(tokenizer) if end_of_turn is None else end_of_turn)
    mask = torch.as_tensor(list(response_mask), dtype=torch.long).reshape(1, -1)
    tool, summary = segment_masks(mask)
    tool, summary = tool[0].tolist(), summary[0].tolist()
    if not last_turn_recorded:  # leave out the last run of policy tokens: verl kept no message for it
        policy = [i for i, m in enumerate(response_mask) if m]
        if not policy:
            return "unchecked: no turn"
        end = policy[-1]
        start = end
        while start > 0 and response_mask[start - 1]:
            start -= 1
        if not any(response_mask[:start]):
            return "unchecked: verl recorded no turn of this rollout (a limit ended it first)"
        tool[start:end + 1] = [0] * (end + 1 - start)
        summary[start:end + 1] = [0] * (end + 1 - start)
    found = check_row_masks(list(response_ids), tool, summary, _without_stop_text(messages, tokenizer, eot),
                            decode=lambda x: tokenizer.decode(x, skip_special_tokens=False), fmt=fmt, end_of_turn=eot)
    return "ok" if found is None else f"{found[0]}: {found[1]}"


def _without_stop_text(messages: Sequence[Mapping[str, Any]], tokenizer: Any, eot: Sequence[int]) -> list[Mapping[str, Any]]:
    """The messages with an assistant turn's trailing end-of-turn text removed: verl's tool parsers decode the whole
    generation, its stop token included (``"...<|im_end|>"``), where the check reads a turn without it."""
    stops = [t for t in (tokenizer.decode([i], skip_special_tokens=False) for i in eot) if t]
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(m, Mapping) and m.get("role") == "assistant" and isinstance(content, str):
            trimmed = content.rstrip()
            while any(trimmed.endswith(t) for t in stops):
                trimmed = next(trimmed[: -len(t)].rstrip() for t in stops if trimmed.endswith(t))
            m = {**m, "content": trimmed}
        out.append(m)
    return out


@register(AGENT_NAME)
class SLCAToolAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` returning :class:`SLCAAgentLoopOutput` (one-token responses padded
    by one masked token, :func:`pad_single_token_response`), each rollout's masks checked against its
    conversation (:func:`mask_check_result`)."""

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> AgentState:
        before = len(agent_data.messages)
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        seen = _ROLLOUT.get()
        if seen is not None:
            seen["messages"] = agent_data.messages  # the list the loop appends each turn to
            seen["recorded"] = len(agent_data.messages) > before  # a limit ends the rollout before the message
        return state

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        seen: dict[str, Any] = {}
        token = _ROLLOUT.set(seen)
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            _ROLLOUT.reset(token)
        messages, recorded = seen.get("messages"), bool(seen.get("recorded", True))
        after_prompt = None if messages is None else list(messages)[len(kwargs.get("raw_prompt") or []):]
        if getattr(self, "_slca_turn_ends", None) is None:
            self._slca_turn_ends = turn_end_ids(self.tokenizer)
        try:
            check = mask_check_result(output.response_ids, output.response_mask, after_prompt, tokenizer=self.tokenizer,
                                      fmt=self.tool_parser_name, last_turn_recorded=recorded, end_of_turn=self._slca_turn_ends)
        except Exception as e:  # model output never stops a rollout: the check is recorded as not made, with the reason
            check = f"unchecked: the check failed ({type(e).__name__}: {e})"
        output.extra_fields[MASK_CHECK_KEY] = check
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        return SLCAAgentLoopOutput.from_output(pad_single_token_response(output, pad))
