"""Per-turn execution scores and tool-outcome signatures (slca.rewards.turns), the inputs of ``slca_turn`` and
``slca_cond`` (the estimators themselves: test_beyond.py)."""

from __future__ import annotations

import math

import pytest
import torch

from slca.rewards.turns import subgroup_fraction, tool_signature, tool_signatures, turn_reward_matrix, turn_rewards, turn_scores
from slca.types import ParsedTurn, ParseError, Task, ToolCall, ToolResult, Trajectory, Turn


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]},
    },
}


TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}


def _task(gold):
    return Task(id="t", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER, TIME], gold=gold)


def _turn(calls, oks=None, errors=()):
    oks = [True] * len(calls) if oks is None else oks
    res = [ToolResult(ok=o, content={"x": 1} if o else None, error=None if o else "boom") for o in oks]
    res += [ToolResult(ok=False, error="parse") for e in errors if e.kind != "text_around_calls"]
    return Turn(text="", parsed=ParsedTurn(calls=list(calls), errors=list(errors)), results=res)


def W(city, **kw):
    return ToolCall("get_weather", {"city": city, **kw})


def test_turn_scores_hand_cases():
    task = _task([[W("Paris"), W("Rome")], [ToolCall("get_time", {"city": "Paris"})]])
    final = Turn(text="done", parsed=ParsedTurn(content="done"))
    # a parallel first turn with both calls, then the time call: all new, correct, ok
    assert turn_scores(task, [_turn([W("Paris"), W("Rome")]), _turn([ToolCall("get_time", {"city": "Paris"})]), final]) == [1.0, 1.0]
    # a repeated call earns nothing the second time; value normalisation ("  paris ") counts as the same call
    assert turn_scores(task, [_turn([W("Paris")]), _turn([W("  paris "), W("Rome")])]) == [1.0, 0.5]
    # wrong tool / wrong city: 0; half the argument keys right: .5 (extra key "unit")
    assert turn_scores(task, [_turn([ToolCall("get_time", {"city": "Oslo"})])]) == [0.0]
    assert turn_scores(task, [_turn([W("Paris", unit="c")])]) == [0.5]
    # a failed call scores 0 and does not use up the gold call: the retry is credited
    assert turn_scores(task, [_turn([W("Paris")], oks=[False]), _turn([W("Paris")])]) == [0.0, 1.0]
    # a blocking parse error counts in the denominator, text around calls does not
    bad = ParseError(kind="invalid_json", message="x")
    text = ParseError(kind="text_around_calls", message="x")
    assert turn_scores(task, [_turn([W("Paris")], errors=[bad])]) == [0.5]
    assert turn_scores(task, [_turn([W("Paris")], errors=[text])]) == [1.0]
    # an error-only tool turn scores 0
    assert turn_scores(task, [_turn([], errors=[bad])]) == [0.0]
    # schema violation (city must be a string): 0
    assert turn_scores(task, [_turn([ToolCall("get_weather", {"city": 3})])]) == [0.0]
    # a tool turn that was never answered: NaN (it lies in the summary segment anyway)
    cut = Turn(text="", parsed=ParsedTurn(calls=[W("Rome")]))
    s = turn_scores(task, [_turn([W("Paris")]), cut])
    assert s[0] == 1.0 and math.isnan(s[1])
    # no gold call (a no-tool task): every call scores 0; no tool turn -> []
    assert turn_scores(_task([]), [_turn([W("Paris")])]) == [0.0]
    assert turn_scores(task, [final]) == []
    # invalid tool schemas: unscorable -> NaN per tool turn
    broken = Task(id="b", messages=[], tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}], gold=[])
    assert all(math.isnan(x) for x in turn_scores(broken, [_turn([ToolCall("f", {})])]))
    with pytest.raises(ValueError, match="turns\\[0\\] must be a Turn"):
        turn_scores(task, ["x"])


def test_tool_signature():
    a = [_turn([W("Paris"), W("Rome")]), _turn([ToolCall("get_time", {"city": "Paris"})], oks=[False])]
    b = [_turn([ToolCall("get_time", {"city": "PARIS"})], oks=[False]), _turn([W("Rome"), W("paris")])]
    assert tool_signature(a) == tool_signature(b)  # same calls and outcomes, other order / case
    c = [_turn([W("Paris"), W("Rome")]), _turn([ToolCall("get_time", {"city": "Paris"})])]
    assert tool_signature(a) != tool_signature(c)  # the time call succeeded here
    assert tool_signature([Turn(text="hi", parsed=ParsedTurn(content="hi"))]) == ()
    hash(tool_signature(a))


def test_turn_reward_matrix_and_subgroup_fraction():
    m = turn_reward_matrix([[1.0, 0.5], [], [0.0]])
    assert m.shape == (3, 2) and m[0].tolist() == [1.0, 0.5] and torch.isnan(m[1]).all() and torch.isnan(m[2, 1])
    assert turn_reward_matrix([[], []]).shape == (2, 0)
    # group 0: a, a, b -> the two a's change baseline; group 1: all c -> equals SLCA, counts 0
    assert subgroup_fraction([0, 0, 0, 1, 1], ["a", "a", "b", "c", "c"]) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="per_rollout is empty"):
        turn_reward_matrix([])


def test_tool_signature_leaves_out_unanswered_calls():
    cut = Turn(text="", parsed=ParsedTurn(calls=[W("Rome")]))  # the rollout stopped before the environment answered
    assert tool_signature([cut]) == ()
    assert tool_signature([_turn([W("Paris")]), cut]) == tool_signature([_turn([W("Paris")])])
    with pytest.raises(ValueError, match="turns must be a list of Turn"):
        tool_signature("turns")  # type: ignore[arg-type]


def test_subgroup_fraction_edge_cases():
    assert math.isnan(subgroup_fraction([], []))
    assert subgroup_fraction([0, 0, 0], [None, None, "a"]) == 0.0  # an unknown signature never shares a baseline
    assert subgroup_fraction([0, 0], ["a", "a"]) == 0.0  # the whole group: the baseline is the group's
    with pytest.raises(ValueError, match=r"group_ids \(2\) and signatures \(1\) differ in length"):
        subgroup_fraction([0, 0], ["a"])


def test_estimator_inputs_from_trajectories():
    task = _task([[W("Paris")], [ToolCall("get_time", {"city": "Paris"})]])
    answer = Turn(text="done", parsed=ParsedTurn(content="done"))
    rollouts = [[_turn([W("Paris")]), _turn([ToolCall("get_time", {"city": "Paris"})]), answer], [_turn([W("Rome")]), answer], [answer]]
    trajs = [Trajectory(task=task, prompt_ids=[1], response_ids=[], model_mask=[], logprobs=[], turns=turns, final_text="done",
                        stop_reason="final_answer") for turns in rollouts]
    assert tool_signatures(trajs) == [tool_signature(t) for t in rollouts]
    m = turn_rewards(trajs)
    assert m.shape == (3, 2) and m.dtype == torch.float32
    assert m[0].tolist() == [1.0, 1.0] and m[1, 0] == 0.0 and torch.isnan(m[1, 1]) and torch.isnan(m[2]).all()
