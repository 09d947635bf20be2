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
    loop.tokenizer, loop.tool_parser_name = _Tok(pad, eos), "hermes"
    out = asyncio.run(loop.run({}))
    assert type(out) is SLCAAgentLoopOutput
    assert (out.response_ids, out.response_mask, out.response_logprobs) == ([7, want], [1, 0], [-0.3, 0.0])
    assert out.extra_fields[sv.MASK_CHECK_KEY] == "unchecked: no conversation"  # the stub kept none


def test_run_checks_the_rollout_against_the_conversation_it_kept(monkeypatch):
    """What SLCAToolAgentLoop adds to verl's run: the conversation verl's loop builds turn by turn (seen through
    ``_handle_generating_state``, its prompt left out) is read against the rollout's masks and the result stored in
    extra_fields; a generation a limit ended before its message is left out of the check. verl's run and
    generating step are stubbed (they need a rollout server); the order of calls is theirs."""
    from types import SimpleNamespace

    from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop

    tok, ids, mask, messages, _ = _hermes_rollout()
    prompt = [{"role": "system", "content": "tools"}, {"role": "user", "content": "Weather in Paris?"}]
    replies = {"all": [messages[0], messages[2]], "cut": [messages[0], None]}  # None: a limit ended it first

    def fake(which):
        async def generating(self, agent_data, sampling_params, ignore_termination=False):
            reply = replies[which][agent_data.turn]
            agent_data.turn += 1
            if reply is None:
                return AgentState.TERMINATED
            agent_data.messages.append(reply)
            if reply.get("tool_calls"):
                agent_data.messages.append(messages[1])  # the tool's answer, as _handle_processing_tools_state adds
                return AgentState.GENERATING
            return AgentState.TERMINATED

        async def run(self, sampling_params, **kwargs):
            agent = SimpleNamespace(messages=list(kwargs["raw_prompt"]), turn=0, extra_fields={})
            while await self._handle_generating_state(agent, sampling_params) == AgentState.GENERATING:
                pass
            return _output(ids, mask)

        return generating, run

    loop = object.__new__(SLCAToolAgentLoop)
    loop.tokenizer, loop.tool_parser_name = tok, "hermes"
    for which, want in (("all", "ok"), ("cut", "ok")):
        generating, run = fake(which)
        monkeypatch.setattr(ToolAgentLoop, "_handle_generating_state", generating)
        monkeypatch.setattr(ToolAgentLoop, "run", run)
        out = asyncio.run(loop.run({}, raw_prompt=prompt))
        assert out.extra_fields == {sv.MASK_CHECK_KEY: want}, which
    # the same rollouts, told the answer turn was recorded when it was not: the check names the missing turn
    generating, run = fake("cut")
    monkeypatch.setattr(ToolAgentLoop, "run", run)

    async def generating_says_recorded(self, agent_data, sampling_params, ignore_termination=False):
        state = await generating(self, agent_data, sampling_params)
        if state == AgentState.TERMINATED and len(agent_data.messages) == 4:  # prompt, call, tool: fake a message
            agent_data.messages.append({"role": "user", "content": "(not an assistant turn)"})
        return state

    monkeypatch.setattr(ToolAgentLoop, "_handle_generating_state", generating_says_recorded)
    out = asyncio.run(loop.run({}, raw_prompt=prompt))
    assert out.extra_fields[sv.MASK_CHECK_KEY].startswith("turns: the masks hold 2 run(s)")


def _hermes_rollout():
    """A two-turn rollout on the embedded tokenizer, and the conversation verl's ToolAgentLoop holds for it: its
    hermes parser's content and calls, the message built as ``_build_assistant_message`` builds it."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionCallSchema, OpenAIFunctionParsedSchema

    from test_integration_verl import _default_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(_default_tokenizer_dir())
    parser = ToolParser.get_tool_parser("hermes", tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def message(ids):
        content, calls = asyncio.run(parser.extract_tool_calls(ids, []))
        m = {"role": "assistant", "content": content}
        if calls:
            m["tool_calls"] = [{"type": "function", "function": OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
                OpenAIFunctionParsedSchema(name=c.name, arguments=c.arguments))[0].model_dump()} for c in calls]
        return m

    call = tok('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
               add_special_tokens=False)["input_ids"] + [end]
    env = tok('\n<|im_start|>user\n<tool_response>\n{"t": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
              add_special_tokens=False)["input_ids"]
    ans = tok("It is 21 degrees in Paris.", add_special_tokens=False)["input_ids"] + [end]
    messages = [message(call), {"role": "tool", "content": '{"t": 21}'}, message(ans)]
    assert messages[0]["content"] == "<|im_end|>" and messages[2]["content"].endswith("<|im_end|>")  # verl keeps the stop text
    return tok, call + env + ans, [1] * len(call) + [0] * len(env) + [1] * len(ans), messages, len(call)


def test_mask_check_reads_the_conversation_verls_tool_loop_holds():
    """slca_tool_agent's per-rollout check (slca.chat.maskcheck with the rollout's tokenizer and multi_turn.format):
    "ok" on agreeing masks; a boundary moved by one token, or a call the conversation does not hold, is named; a
    generation a limit ended before verl recorded it is left out; a format without an slca parser or no
    conversation is left unchecked."""
    from slca.integrations.verl_agent_loop import mask_check_result

    tok, ids, mask, messages, n_call = _hermes_rollout()
    assert mask_check_result(ids, mask, messages, tokenizer=tok, fmt="hermes") == "ok"
    shifted = list(mask)
    shifted[n_call] = 1  # the first environment token inside the call's segment
    assert mask_check_result(ids, shifted, messages, tokenizer=tok, fmt="hermes").startswith("boundary: turn 0")
    other = [{**messages[0], "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
             *messages[1:]]
    assert mask_check_result(ids, mask, other, tokenizer=tok, fmt="hermes").startswith("call: turn 0")
    assert mask_check_result(ids, mask, messages[:1], tokenizer=tok, fmt="hermes").startswith("turns: ")
    # a limit ended the rollout before verl recorded its last turn: the turns before it are still checked
    assert mask_check_result(ids, mask, messages[:2], tokenizer=tok, fmt="hermes", last_turn_recorded=False) == "ok"
    assert mask_check_result(ids, shifted, messages[:2], tokenizer=tok, fmt="hermes",
                             last_turn_recorded=False).startswith("boundary: turn 0")
    one = mask[:n_call] + [0] * (len(mask) - n_call)  # only the call turn, unrecorded: nothing to check
    assert mask_check_result(ids, one, [], tokenizer=tok, fmt="hermes", last_turn_recorded=False).startswith("unchecked: ")
    assert mask_check_result(ids, mask, messages, tokenizer=tok, fmt="gpt-oss").startswith("unchecked: multi_turn.format")
    assert mask_check_result(ids, mask, None, tokenizer=tok, fmt="hermes") == "unchecked: no conversation"


def test_the_estimator_counts_the_checks_and_stops_above_the_threshold(monkeypatch):
    """Under verl the check's results travel with the rows (extra_fields, read from the trainer); the estimator
    counts the mismatches (unchecked rows are rows, not mismatches), logs the share in the v1 trainer's metrics and
    raises MaskMismatchError naming the rows above SLCA_MASK_CHECK_MAX_MISMATCH (default 0.1)."""
    import numpy as np

    from slca.chat import MaskMismatchError

    uids = np.array(["a", "a", "b", "b"], dtype=object)
    ok = np.array(["ok", "unchecked: no conversation", "ok", "ok"], dtype=object)
    assert sv.mask_check_share(ok, uids) == 0.0
    bad = np.array(["ok", "ok", "call: turn 0 decodes to 'x'", "ok"], dtype=object)
    with pytest.raises(MaskMismatchError, match=r"1 of 4 rollouts \(25%.*rollout 2 \(uid b\): call: turn 0"):
        sv.mask_check_share(bad, uids)
    monkeypatch.setenv(sv.MASK_CHECK_ENV, "1.0")
    assert sv.mask_check_share(bad, uids) == 0.25  # 1.0 counts only
    monkeypatch.setenv(sv.MASK_CHECK_ENV, "half")
    with pytest.raises(ValueError, match=r"SLCA_MASK_CHECK_MAX_MISMATCH='half': a share in \[0, 1\]"):
        sv.mask_check_share(bad, uids)
    # through verl's own compute_advantage, the rows' checks reach the estimator with the batch
    monkeypatch.delenv(sv.MASK_CHECK_ENV)
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[:, 2:3] = 0
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.zeros(4, 5), "response_mask": mask},
                               non_tensors={"uid": uids, sv.MASK_CHECK_KEY: bad})
    with pytest.raises(MaskMismatchError, match=r"rollout 2 \(uid b\)"):
        compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca"))
    data.non_tensor_batch[sv.MASK_CHECK_KEY] = ok
    compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca"))
