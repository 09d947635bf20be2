"""Building blocks the reward tiers share (slca.rewards.common): a rollout's calls and results, a task's gold
calls and toolbox, and the score of a pair of calls."""

from __future__ import annotations

import pytest

from slca.env.schema import ToolBox
from slca.rewards.common import Unscorable, check_turns, collect_calls, gold_calls, pair_score, task_toolbox
from slca.types import ParseError, Task, ToolCall, ToolResult

from _helpers import answer_turn, tool_turn

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
    },
}
OK = ToolResult(ok=True, content={"temp_c": 14})


def _task(gold=(), tools=(WEATHER,)) -> Task:
    return Task(id="t1", messages=[{"role": "user", "content": "weather?"}], tools=list(tools), gold=[list(s) for s in gold])


def W(city, **kw):
    return ToolCall("get_weather", {"city": city, **kw})


def test_unscorable_is_a_value_error():
    assert issubclass(Unscorable, ValueError)


def test_check_turns_names_what_is_wrong():
    check_turns([answer_turn("hi")])
    check_turns([])
    with pytest.raises(ValueError, match="turns must be a list of Turn, got tuple"):
        check_turns((answer_turn("hi"),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"turns\[1\] must be a Turn, got dict"):
        check_turns([answer_turn("hi"), {"role": "assistant"}])  # type: ignore[list-item]


def test_collect_calls_gathers_tool_turns_in_order():
    bad = ParseError("invalid_json", "could not parse")
    turns = [
        tool_turn([W("Paris"), W("Rome")], [OK, ToolResult(ok=False, error="boom")]),
        answer_turn("thinking aloud"),  # not a tool turn: skipped
        tool_turn([], [ToolResult(ok=False, error="parse error")], errors=[bad]),  # an attempted call: a tool turn, no call
        tool_turn([W("Oslo")], [OK, ToolResult(ok=False, error="answer to a malformed fragment")]),  # extra result ignored
    ]
    ro = collect_calls(turns)
    assert ro.tool_turns == [turns[0], turns[2], turns[3]]
    assert ro.calls == [W("Paris"), W("Rome"), W("Oslo")]
    assert [r.ok for r in ro.results] == [True, False, True]


def test_collect_calls_refuses_a_turn_with_fewer_results_than_calls():
    with pytest.raises(Unscorable, match="turn 1 has 2 calls but 1 results"):
        collect_calls([answer_turn("x"), tool_turn([W("Paris"), W("Rome")], [OK])])
    with pytest.raises(ValueError, match="turns must be a list"):
        collect_calls("turns")  # type: ignore[arg-type]


def test_gold_calls_flattens_the_steps_and_names_a_bad_step():
    assert gold_calls(_task([[W("Paris"), W("Rome")], [W("Oslo")]])) == [W("Paris"), W("Rome"), W("Oslo")]
    assert gold_calls(_task()) == []
    bad = _task([[W("Paris")], [{"name": "get_weather"}]])
    with pytest.raises(ValueError, match="task 't1': gold step 1 holds dict, expected ToolCall"):
        gold_calls(bad)


def test_task_toolbox_and_invalid_tools():
    assert isinstance(task_toolbox(_task()), ToolBox)
    broken = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(Unscorable, match="task 't1' has invalid tools"):
        task_toolbox(_task(tools=[broken]))


def test_pair_score_is_the_share_of_agreeing_keys():
    box = task_toolbox(_task())
    g = W("Paris", days=2)
    assert pair_score(W(" paris ", days=2), g, box) == 1.0  # values compared normalised
    assert pair_score(W("Rome", days=2), g, box) == 0.5
    assert pair_score(W("Paris"), g, box) == 0.5  # a key of one side only disagrees
    assert pair_score(W("Paris", days=2), W("Paris"), box) == 0.5
    assert pair_score(W("Paris", days="two"), g, box) == 0.0  # breaks the schema (days must be an integer)
    empty = task_toolbox(_task(tools=[{"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]))
    assert pair_score(ToolCall("ping", {}), ToolCall("ping", {}), empty) == 1.0
