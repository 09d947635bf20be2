"""Turns from an OpenAI-style message list (slca.rewards.messages), for conversations produced elsewhere
(TRL, verl, logs)."""

from __future__ import annotations

import pytest

from slca.env import toolworld as tw
from slca.rewards import execution_reward, summary_reward
from slca.rewards.messages import tool_result, turns_from_messages
from slca.types import ToolCall, ToolResult

TASKS = tw.make_tasks("train", n=300, seed=2)


def test_scoring_an_openai_message_list():
    from slca.rewards import turns_from_messages

    t = next(t for t in TASKS if t.kind == "chain")
    env = tw.make_env(t)
    msgs = list(t.messages)
    for i, step in enumerate(t.gold):
        msgs.append({"role": "assistant", "content": "", "tool_calls": [c.to_openai(j) for j, c in enumerate(step)]})
        msgs += [{"role": "tool", "tool_call_id": f"call_{j}", "content": env.call(c.name, c.arguments).to_text()} for j, c in enumerate(step)]
    msgs.append({"role": "assistant", "content": t.reference_answer})
    turns, final = turns_from_messages(msgs)
    assert final == t.reference_answer and len(turns) == len(t.gold) + 1
    assert execution_reward(t, turns).total == pytest.approx(1.0)
    assert summary_reward(t, turns, final).total == pytest.approx(1.0)
    # a failed call and malformed arguments are read back as such
    bad = t.messages + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "x", "arguments": "{oops"}},
                                                            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": '{"error": "invalid arguments"}'},
    ]
    turns, final = turns_from_messages(bad)
    assert final == "" and turns[0].parsed.errors[0].kind == "invalid_json"
    assert turns[0].results == [ToolResult(ok=False, error="invalid arguments")]
    assert execution_reward(t, turns).components["format"] == 0.0


@pytest.mark.parametrize("content,want", [
    ('{"error": "unknown tool"}', ToolResult(ok=False, error="unknown tool")),
    ({"error": 404}, ToolResult(ok=False, error="404")),
    ('{"error": "x", "code": 3}', ToolResult(ok=True, content={"error": "x", "code": 3})),  # not the error key alone
    ('{"temp_c": 14}', ToolResult(ok=True, content={"temp_c": 14})),
    ("[1, 2]", ToolResult(ok=True, content=[1, 2])),
    ("It is sunny.", ToolResult(ok=True, content="It is sunny.")),  # not JSON: stays text
    ({"a": 1}, ToolResult(ok=True, content={"a": 1})),
])
def test_tool_result(content, want):
    assert tool_result(content) == want


@pytest.mark.parametrize("r", [ToolResult(ok=True, content={"a": [1, "x"]}), ToolResult(ok=False, error="boom"),
                               ToolResult(ok=True, content="plain text")])
def test_tool_result_inverts_to_text(r):
    assert tool_result(r.to_text()) == r


def _assistant(*calls, content=""):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def _fn(name, arguments, id_="c0"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_turns_from_messages_reads_calls_results_and_the_final_answer():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        _assistant(_fn("get_weather", '{"city": "Paris"}', "a"), _fn("get_weather", {"city": "Rome"}, "b")),
        {"role": "tool", "tool_call_id": "a", "content": '{"temp_c": 14}'},
        {"role": "tool", "tool_call_id": "b", "content": '{"error": "no data"}'},
        _assistant(_fn("ping", "  ")),  # blank arguments: an empty object
        {"role": "tool", "content": "pong"},
        {"role": "assistant", "content": "Paris is 14 C."},
    ]
    turns, final = turns_from_messages(msgs)
    assert final == "Paris is 14 C." and len(turns) == 3
    assert turns[0].parsed.calls == [ToolCall("get_weather", {"city": "Paris"}, "a"), ToolCall("get_weather", {"city": "Rome"}, "b")]
    assert turns[0].results == [ToolResult(ok=True, content={"temp_c": 14}), ToolResult(ok=False, error="no data")]
    assert turns[1].parsed.calls == [ToolCall("ping", {}, "c0")] and turns[1].results == [ToolResult(ok=True, content="pong")]
    assert not turns[2].parsed.is_tool_turn and turns[2].text == "Paris is 14 C."


def test_a_conversation_that_ends_on_a_call_has_no_final_answer():
    turns, final = turns_from_messages([{"role": "user", "content": "hi"}, _assistant(_fn("ping", "{}"))])
    assert final == "" and turns[0].parsed.is_tool_turn and turns[0].results == []
    assert turns_from_messages([{"role": "user", "content": "hi"}]) == ([], "")


def test_malformed_calls_become_parse_errors_of_the_turn():
    turns, _ = turns_from_messages([_assistant(_fn("f", "{oops"), _fn("g", "[1, 2]"), {"function": {"arguments": "{}"}},
                                               _fn("ok", '{"x": 1}'))])
    (t,) = turns
    assert [e.kind for e in t.parsed.errors] == ["invalid_json", "arguments_not_object", "arguments_not_object"]
    assert t.parsed.errors[0].fragment == "{oops"
    assert t.parsed.calls == [ToolCall("ok", {"x": 1}, "c0")]


def test_bad_message_lists_are_refused_naming_the_message():
    with pytest.raises(ValueError, match=r"messages\[1\] must be a chat message with a 'role'"):
        turns_from_messages([{"role": "user", "content": "hi"}, {"content": "no role"}])
    with pytest.raises(ValueError, match=r"messages\[0\] must be a chat message"):
        turns_from_messages(["hello"])
    with pytest.raises(ValueError, match=r"messages\[1\] is a tool message before any assistant message"):
        turns_from_messages([{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}])
