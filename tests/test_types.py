"""The typed containers every part of slca shares (slca.types): calls, results, tool schemas, parse errors,
tasks, turns and trajectories, and the checks their constructors make."""

from __future__ import annotations

import json

import pytest

from slca.types import (
    NON_BLOCKING_ERRORS,
    STOP_REASONS,
    ParsedTurn,
    ParseError,
    RewardBreakdown,
    Task,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
    Turn,
    call_key,
)

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                 "response": {"type": "object"}, "x-domain": "travel", "x-stateful": True},
}


def test_call_key_is_order_independent_and_keeps_unicode():
    assert call_key("f", {"b": 1, "a": "São"}) == call_key("f", {"a": "São", "b": 1}) == 'f{"a": "São", "b": 1}'
    assert call_key("f", {"a": 1}) != call_key("g", {"a": 1})


def test_tool_call_equality_hash_and_openai_form():
    a, b = ToolCall("f", {"x": 1, "y": [1, 2]}), ToolCall("f", {"y": [1, 2], "x": 1})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1 and a.key() == call_key("f", {"x": 1, "y": [1, 2]})
    assert ToolCall("f") == ToolCall("f", {}) and ToolCall("f").arguments == {}
    o = ToolCall("get_weather", {"city": "Zürich"}).to_openai(3)
    assert o == {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
    assert ToolCall("f", {}, id="abc").to_openai(3)["id"] == "abc"
    assert json.loads(o["function"]["arguments"]) == {"city": "Zürich"}


def test_tool_result_text():
    assert ToolResult(ok=True, content="plain").to_text() == "plain"
    assert json.loads(ToolResult(ok=True, content={"temp_c": 14}).to_text()) == {"temp_c": 14}
    assert ToolResult(ok=True, content=None).to_text() == "null"
    assert json.loads(ToolResult(ok=False, error="unknown tool 'x'").to_text()) == {"error": "unknown tool 'x'"}


def test_tool_spec_from_and_to_openai():
    s = ToolSpec.from_openai(WEATHER)
    assert (s.name, s.description, s.domain, s.stateful) == ("get_weather", "Weather in a city.", "travel", True)
    assert s.response == {"type": "object"} and s.parameters["required"] == ["city"]
    assert s.to_openai() == {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                               "parameters": WEATHER["function"]["parameters"]}}  # no private keys
    bare = ToolSpec.from_openai({"name": "ping"})  # the function dict alone
    assert bare.parameters == {"type": "object", "properties": {}} and (bare.domain, bare.stateful, bare.response) == ("", False, None)


@pytest.mark.parametrize("d,msg", [({"type": "function", "function": {"description": "x"}}, "got keys \\['description'\\]"),
                                   ({"function": "get_weather"}, r"\(got a str\)")])
def test_tool_spec_needs_a_name(d, msg):
    with pytest.raises(ValueError, match="tool schema needs a 'name' .*" + msg):
        ToolSpec.from_openai(d)


def test_parse_errors_and_tool_turns():
    text = ParseError("text_around_calls", "text outside the calls")
    bad = ParseError("invalid_json", "could not parse", '{"name": ')
    assert NON_BLOCKING_ERRORS == {"text_around_calls"}
    assert not text.blocking and bad.blocking
    assert not ParsedTurn(content="hi").is_tool_turn
    assert not ParsedTurn(content="hi", errors=[text]).is_tool_turn  # text alone is not an attempted call
    assert ParsedTurn(errors=[text, bad]).is_tool_turn and ParsedTurn(errors=[text, bad]).blocking_errors == [bad]
    assert ParsedTurn(calls=[ToolCall("f")], errors=[text]).is_tool_turn


def _task(**kw):
    return Task(id="t", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], **kw)


def test_task_refusal_defaults_to_the_kind():
    assert _task(kind="unservable").refusal is True and _task().refusal is False
    assert _task(kind="single", refusal=True).refusal is True and _task(kind="unservable", refusal=False).refusal is False
    assert [s.name for s in _task().tool_specs] == ["get_weather"]
    assert _task().gold == [] and _task().reference_answer is None


@pytest.mark.parametrize("kw,err,msg", [
    ({"meta": {"reference_answer": "x"}}, ValueError, r"task 't': meta\['reference_answer'\] is a Task field now: pass reference_answer= instead"),
    ({"meta": {"refusal": True, "split": "train"}}, ValueError, r"meta\['refusal'\] is a Task field now"),
    ({"reference_answer": 3}, TypeError, "reference_answer must be a string or None, got int"),
    ({"refusal": "yes"}, TypeError, "refusal must be True, False or None, got 'yes'"),
])
def test_task_refuses_bad_fields(kw, err, msg):
    with pytest.raises(err, match=msg):
        _task(**kw)


def _traj(**kw):
    args = dict(task=_task(), prompt_ids=[1], response_ids=[5, 6, 7], model_mask=[1, 0, 1], logprobs=[-0.1, 0.0, -0.2], turns=[],
                final_text="", stop_reason="final_answer")
    return Trajectory(**{**args, **kw})


def test_trajectory_checks_its_lengths_and_stop_reason():
    assert _traj().group_id == 0 and _traj().messages == []
    assert set(STOP_REASONS) == {"final_answer", "max_turns", "max_tokens", "eos"}
    for bad in ({"model_mask": [1, 0]}, {"logprobs": [0.0]}):
        with pytest.raises(ValueError, match=r"response_ids \(3\), model_mask \(\d\) and logprobs \(\d\) must have the same length"):
            _traj(**bad)
    with pytest.raises(ValueError, match="stop_reason must be one of .* got 'timeout'"):
        _traj(stop_reason="timeout")


def test_trajectory_calls_are_the_tool_turns_calls():
    f, g = ToolCall("f"), ToolCall("g", {"a": 1})
    turns = [Turn("<c>", ParsedTurn(calls=[f, g])), Turn("<bad>", ParsedTurn(errors=[ParseError("invalid_json", "x")])),
             Turn("done", ParsedTurn(content="done"))]
    assert _traj(turns=turns).calls == [[f, g], []]  # an error-only turn is a tool turn without calls


def test_reward_breakdown_defaults():
    rb = RewardBreakdown(0.5)
    assert rb.components == {} and rb.reason is None
    assert RewardBreakdown(0.5).components is not rb.components
