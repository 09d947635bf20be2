"""Tool-call formats: parse / render, malformed outputs, round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca.chat import ERROR_KINDS, get_format, list_formats
from slca.types import ToolCall

FORMATS = ["hermes", "json_list", "llama3_json", "openai"]


def keys(calls):
    return [c.key() for c in calls]


def test_list_and_unknown():
    assert list_formats() == sorted(FORMATS)
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        get_format("xml")
    fmt = get_format("hermes")
    assert get_format(fmt) is fmt


def test_hermes_parallel_with_reasoning_and_content():
    text = (
        "<think>\nTwo cities, two calls.\n</think>\n\nLet me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    p = get_format("hermes").parse(text)
    assert p.reasoning == "Two cities, two calls."
    assert p.content == "Let me check."
    assert [c.arguments["city"] for c in p.calls] == ["Paris", "Rome"]
    assert p.errors == [] and p.is_tool_turn


def test_paper_json_list_parallel():
    text = '<tool_call>\n[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]\n</tool_call>'
    p = get_format("json_list").parse(text)
    assert keys(p.calls) == keys([ToolCall("a", {"x": 1}), ToolCall("b", {})])
    assert p.errors == []


def test_llama3_parallel_and_python_tag():
    p = get_format("llama3_json").parse('<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert keys(p.calls) == keys([ToolCall("a", {"x": 1}), ToolCall("b", {})])
    assert p.errors == []


def test_openai_message_object():
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "a", "arguments": '{"x": [1, 2]}'}},
            {"id": "call_10", "type": "function", "function": {"name": "b", "arguments": {"y": "z"}}},
        ],
    }
    p = get_format("openai").parse(json.dumps(msg))
    assert [(c.id, c.name, c.arguments) for c in p.calls] == [("call_9", "a", {"x": [1, 2]}), ("call_10", "b", {"y": "z"})]
    assert p.content == "" and p.errors == []


@pytest.mark.parametrize("name", FORMATS)
def test_plain_answer_is_not_a_tool_turn(name):
    p = get_format(name).parse("The weather in Paris is sunny, 21 degrees.")
    assert p.calls == [] and p.errors == [] and not p.is_tool_turn
    assert p.content == "The weather in Paris is sunny, 21 degrees."


# (format, model output, expected error kinds in order, names of the calls that still parse)
MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>', ["invalid_json"], []),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}', ["unclosed_tag"], []),
    ("hermes", '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>', ["missing_name"], []),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>', ["arguments_not_object"], []),
    ("hermes", '<tool_call>\n{"name": "f"}\n</tool_call>', ["missing_arguments"], []),
    ("hermes", "<tool_call></tool_call>", ["empty_call"], []),
    ("hermes", '<tool_call>\n[{"name": "f", "arguments": {}}]\n</tool_call>', ["call_not_object"], []),
    ("hermes", '<tool_call>\n"f"\n</tool_call>', ["call_not_object"], []),
    ("hermes", '{"name": "f", "arguments": {}}</tool_call>', ["unmatched_tag"], []),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}}</tool_call> and then I will answer', ["text_around_calls"], ["f"]),
    ("hermes", "<think>planning the calls", ["unclosed_think"], []),
    ("hermes", '<tool_call>{"name": "", "arguments": {}}</tool_call>', ["missing_name"], []),
    ("hermes", '<tool_call>{"name": 3, "arguments": {}}</tool_call>', ["missing_name"], []),
    ("hermes", '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', ["arguments_not_object"], []),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {}}<tool_call>{"name": "g", "arguments": {}}</tool_call>',
        ["unclosed_tag"],
        ["g"],
    ),
    ("hermes", "<tool_call>{'name': 'f', 'arguments': {}}</tool_call>", ["invalid_json"], []),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call> then <tool_call>{"name": "g", "arguments": {}}</tool_call>',
        ["text_around_calls"],
        ["f", "g"],
    ),
    ("json_list", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', ["not_a_list"], []),
    ("json_list", "<tool_call>\n[]\n</tool_call>", ["empty_call"], []),
    ("json_list", '<tool_call>\n[{"name": "f", "arguments": {}}, 5]\n</tool_call>', ["call_not_object"], ["f"]),
    ("json_list", '<tool_call>\n[{"name": "f", "arguments": {}},]\n</tool_call>', ["invalid_json"], []),
    ("json_list", '<tool_call>\n[{"name": "f", "arguments": {}}]', ["unclosed_tag"], []),
    ("json_list", '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": null}]</tool_call>', ["arguments_not_object"], ["f"]),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}', ["invalid_json"], []),
    ("llama3_json", '{"name": "f", "parameters": 5}', ["arguments_not_object"], []),
    ("llama3_json", '{"parameters": {}}', ["missing_name"], []),
    ("llama3_json", 'Sure! {"name": "f", "parameters": {}}', ["text_around_calls"], ["f"]),
    ("llama3_json", "<|python_tag|>", ["empty_call"], []),
    ("llama3_json", '{"name": "f", "parameters": {}}; {"name": "g"}', ["missing_arguments"], ["f"]),
    ("llama3_json", '{"name": "f", "parameters": {}} thanks', ["text_around_calls"], ["f"]),
    (
        "openai",
        '{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1"}}]}',
        ["invalid_json"],
        [],
    ),
    ("openai", '{"role": "assistant", "tool_calls": {"function": {}}}', ["not_a_list"], []),
    ("openai", '{"role": "assistant", "tool_calls": [{"type": "function"}]}', ["call_not_object"], []),
    ("openai", '{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}', ["missing_name"], []),
    ("openai", '{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}', ["arguments_not_object"], []),
    ("openai", '{"role": "assistant", "content": "hi"', ["invalid_json"], []),
]


def test_enough_distinct_malformed_cases():
    assert len({(f, t) for f, t, _, _ in MALFORMED}) >= 20
    assert {k for _, _, kinds, _ in MALFORMED for k in kinds} == set(ERROR_KINDS)


@pytest.mark.parametrize("fmt,text,kinds,names", MALFORMED)
def test_malformed_output_gives_structured_errors(fmt, text, kinds, names):
    p = get_format(fmt).parse(text)
    assert [e.kind for e in p.errors] == kinds, p.errors
    assert [c.name for c in p.calls] == names
    for e in p.errors:
        assert e.message and isinstance(e.fragment, str)
    # an attempted call (anything but stray text) makes a tool turn the environment answers
    if any(k != "text_around_calls" for k in kinds) or names:
        assert p.is_tool_turn


CALL_SETS = [
    [ToolCall("get_weather", {"city": "Paris"})],
    [ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Zürich", "unit": "c"})],
    [ToolCall("search", {"q": 'say "hi"\n<b>', "filters": {"year": [2020, 2021], "open": True, "x": None}, "k": 3.5})],
    [ToolCall("ping", {})],
]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("calls", CALL_SETS)
def test_render_parse_round_trip(name, calls):
    fmt = get_format(name)
    p = fmt.parse(fmt.render(calls))
    assert keys(p.calls) == keys(calls) and p.errors == [] and p.is_tool_turn


@pytest.mark.parametrize("name", ["hermes", "json_list", "openai"])
def test_round_trip_with_content_and_reasoning(name):
    fmt = get_format(name)
    calls = CALL_SETS[1]
    p = fmt.parse(fmt.render(calls, content="Checking both.", reasoning="Two cities."))
    assert keys(p.calls) == keys(calls) and p.errors == []
    assert p.content == "Checking both." and p.reasoning == "Two cities."


def test_llama3_refuses_content_with_calls():
    with pytest.raises(ValueError, match="cannot carry content"):
        get_format("llama3_json").render(CALL_SETS[0], content="hi")


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=12))
_json = st.recursive(_json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)
_calls = st.lists(
    st.builds(
        ToolCall,
        name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True),
        arguments=st.dictionaries(st.text(max_size=8), _json, max_size=4),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(calls=_calls, name=st.sampled_from(FORMATS))
def test_round_trip_property(calls, name):
    fmt = get_format(name)
    p = fmt.parse(fmt.render(calls))
    assert keys(p.calls) == keys(calls) and p.errors == []
