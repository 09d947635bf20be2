"""slca.integrations.verl_agent_loop: verl's tool agent loop writing both SLCA rewards at their token positions.

Runs in the verl environment (.venv-verl; the verl line of ``make test``).
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.verl
torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from slca.integrations import verl as sv  # noqa: E402
from slca.integrations.verl_agent_loop import (  # noqa: E402
    AGENT_NAME,
    SLCAAgentLoopOutput,
    SLCAToolAgentLoop,
    pad_single_token_response,
)

from test_integration_verl import random_batch, reference  # noqa: E402


def test_agent_loop_output_writes_both_tiers_and_dispatch_reads_them():
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics

    from slca.integrations.verl_agent_loop import SLCAAgentLoopOutput

    mask, lengths, r_tool, r_sum, uids = random_batch(5)
    rows = []
    for i in range(mask.shape[0]):
        n = int(lengths[i])
        out = SLCAAgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=list(range(10, 10 + n)),
                                  response_mask=mask[i, :n].tolist(), metrics=AgentLoopMetrics())
        out = SLCAAgentLoopOutput.from_output(out)
        out.reward_score = float(r_tool[i] + r_sum[i])  # what verl's reward loop sets ...
        out.extra_fields["reward_extra_info"] = {"tool_reward": float(r_tool[i]), "summary_reward": float(r_sum[i])}
        rows.append(out.as_dict()["rm_scores"])
    rm = torch.zeros(mask.shape)
    for i, r in enumerate(rows):
        rm[i, : len(r)] = r
    assert torch.allclose(rm.sum(1), r_tool + r_sum)
    data = DataProto.from_dict(tensors={"token_level_rewards": rm, "response_mask": mask}, non_tensors={"uid": uids})
    got = compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca")).batch["advantages"]
    torch.testing.assert_close(got, reference(mask, r_tool, r_sum, uids))


def test_agent_loop_pads_a_one_token_response():
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics

    from slca.integrations.verl_agent_loop import SLCAAgentLoopOutput, pad_single_token_response

    out = SLCAAgentLoopOutput(prompt_ids=[1, 2], response_ids=[7], response_mask=[1], response_logprobs=[-0.5],
                              metrics=AgentLoopMetrics())
    out = SLCAAgentLoopOutput.from_output(pad_single_token_response(out, pad_token_id=0))
    out.reward_score = 0.9
    out.extra_fields["reward_extra_info"] = {"tool_reward": 1.0, "summary_reward": -0.1}
    d = out.as_dict()
    assert d["responses"].tolist() == [7, 0] and d["response_mask"].tolist() == [0 + 1, 0]
    assert d["rollout_log_probs"].tolist() == [-0.5, 0.0]
    t, s = sv.unpack_token_rewards(d["rm_scores"].unsqueeze(0), d["response_mask"].unsqueeze(0))
    assert t.item() == pytest.approx(1.0) and s.item() == pytest.approx(-0.1)
    # a reward function without the two tiers (verl's own score only): the score is the summary reward, also on
    # the padded row (verl would put it on the pad token, where the execution reward is read)
    out = SLCAAgentLoopOutput(prompt_ids=[1, 2], response_ids=[7], response_mask=[1], metrics=AgentLoopMetrics())
    out = SLCAAgentLoopOutput.from_output(pad_single_token_response(out, pad_token_id=0))
    out.reward_score = 0.9
    d = out.as_dict()
    t, s = sv.unpack_token_rewards(d["rm_scores"].unsqueeze(0), d["response_mask"].unsqueeze(0))
    assert t.item() == 0.0 and s.item() == pytest.approx(0.9) and d["rm_scores"].sum().item() == pytest.approx(0.9)


def _output(response_ids, mask, logprobs=None, cls=AgentLoopOutput):
    return cls(prompt_ids=[1, 2], response_ids=list(response_ids), response_mask=list(mask), response_logprobs=logprobs,
               metrics=AgentLoopMetrics())


def test_the_agent_loop_is_registered_under_its_name():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert AGENT_NAME == "slca_tool_agent"
    assert _agent_loop_registry[AGENT_NAME] == {"_target_": "slca.integrations.verl_agent_loop.SLCAToolAgentLoop"}


def test_longer_responses_are_not_padded():
    out = _output([7, 8, 9], [1, 0, 1], [-0.1, 0.0, -0.2])
    assert pad_single_token_response(out, pad_token_id=0) is out
    assert (out.response_ids, out.response_mask, out.response_logprobs) == ([7, 8, 9], [1, 0, 1], [-0.1, 0.0, -0.2])
    one = pad_single_token_response(_output([7], [1]), pad_token_id=5)  # no log-probs: none added
    assert (one.response_ids, one.response_mask, one.response_logprobs) == ([7, 5], [1, 0], None)


def test_from_output_keeps_every_field_and_which_were_set():
    base = _output([7, 8], [1, 1], [-0.5, -0.25])
    out = SLCAAgentLoopOutput.from_output(base)
    assert type(out) is SLCAAgentLoopOutput and out.model_fields_set == base.model_fields_set
    assert all(getattr(out, n) == getattr(base, n) for n in type(base).model_fields)


def test_without_a_score_there_are_no_reward_tokens():
    out = SLCAAgentLoopOutput.from_output(_output([7, 8], [1, 1]))
    out.extra_fields["reward_extra_info"] = {"tool_reward": 1.0, "summary_reward": 0.5}
    assert "rm_scores" not in out.as_dict()  # verl's reward loop sets reward_score; until then nothing is written


def test_both_tiers_land_on_their_segments():
    out = SLCAAgentLoopOutput.from_output(_output([7, 8, 9, 10, 11], [1, 1, 0, 1, 1]))  # call, tool response, answer
    out.reward_score = 1.5
    out.extra_fields["reward_extra_info"] = {"tool_reward": 1.0, "summary_reward": 0.5}
    d = out.as_dict()
    assert d["rm_scores"].shape == d["response_mask"].shape and float(d["rm_scores"].sum()) == pytest.approx(1.5)
    t, s = sv.unpack_token_rewards(d["rm_scores"].unsqueeze(0), d["response_mask"].unsqueeze(0))
    assert (t.item(), s.item()) == (pytest.approx(1.0), pytest.approx(0.5))


class _Tok:
    def __init__(self, pad_token_id, eos_token_id):
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id


@pytest.mark.parametrize("pad,eos,want", [(0, 2, 0), (None, 2, 2)])
def test_run_returns_slca_output_padded_with_the_pad_token_or_else_eos(monkeypatch, pad, eos, want):
    """SLCAToolAgentLoop.run is verl's ToolAgentLoop.run (stubbed here) plus the padding and the output class."""
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    async def verls_run(self, sampling_params, **kwargs):
        return _output([7], [1], [-0.3])

    monkeypatch.setattr(ToolAgentLoop, "run", verls_run)
    loop = object.__new__(SLCAToolAgentLoop)  # verl's constructor wants a running rollout server
    loop.tokenizer = _Tok(pad, eos)
    out = asyncio.run(loop.run({}))
    assert type(out) is SLCAAgentLoopOutput
    assert (out.response_ids, out.response_mask, out.response_logprobs) == ([7, want], [1, 0], [-0.3, 0.0])
