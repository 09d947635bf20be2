"""The paper authors' SFT preview rows through slca's SFT reader, unchanged (env/sft.py, format ``llamafactory``).

The rows: ``tests/fixtures/slca_grpo_release/toucan_toolcall_sft.preview.jsonl``, every row of
``data/samples/toucan_toolcall_sft.preview.jsonl`` of ``SLCA-GRPO/SLCA-GRPO`` at commit 68539c5
(Apache-2.0; the fixture's README.md). Their data/README.md: "same schema as the materialised
JSON" that LLaMA-Factory reads (``data/convert_sft_parquet_to_json.py`` writes it from the HF
parquet's ShareGPT ``conversations``, which slca reads too: test_env_sft.py).

The shape: a row is ``uuid``, ``subset_name``, ``question``, ``target_tools``, ``tools`` (a JSON
string) and ``messages`` (a JSON string) whose roles are ``user`` / ``assistant`` / ``tool_call`` /
``tool_response`` (``data/dataset_info.json``: ``function_tag`` ``tool_call``, ``observation_tag``
``tool_response``). A ``tool_call``'s content is a Python-literal dict (``{'name': ..., 'arguments':
'<JSON>'}``, ``str(dict)`` in their converter, not JSON); parallel calls are consecutive
``tool_call`` messages, each answered by one ``tool_response`` in order; the text of the turn that
makes calls is an ``assistant`` message right before them. slca's ``llamafactory`` reader
(picked by ``format="auto"`` from the two roles) turns each row into TRL's ``{"messages", "tools"}``:
one assistant message per call turn (its text as content, its calls as OpenAI ``tool_calls``) and a
``tool`` message per response with the ``name`` and ``tool_call_id`` of the call it answers.

:func:`demonstration` reads the rows independently of slca (``ast.literal_eval`` on each call, as
their converter's ``_parse_json_or_pyliteral`` would), so the reader's output is checked against
the rows themselves.

Two things the rows do not share with their tools: their published converter writes no
``assistant`` message for a ``gpt`` turn that makes calls (it keeps only the first ``<tool_call>``
block's calls and drops the turn's text), while every preview row has that text as an ``assistant``
message right before the calls; and LLaMA-Factory's ``sharegpt`` converter wants user / observation
and assistant / function tags to alternate, which ``assistant`` then ``tool_call`` does not ("Invalid
role tag"). slca reads the rows as they are: that text is the content of the call turn.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from slca.env import ToolBox, load_sft_examples, load_tasks
from slca.env.loaders import RowError, detect_format, parse_target_tools
from slca.env.sft import SFT_FORMATS, detect_sft_format, sft_example_from_row

SFT = Path(__file__).parent / "fixtures" / "slca_grpo_release" / "toucan_toolcall_sft.preview.jsonl"


def rows() -> list[dict]:
    return [json.loads(x) for x in SFT.read_text(encoding="utf-8").splitlines() if x.strip()]


def demonstration(row: dict) -> tuple[list[list[tuple[str, dict]]], list[str], list[str]]:
    """``(call turns, tool responses, assistant texts)`` of a row, read as their converter writes it:
    consecutive ``tool_call`` messages are one turn of parallel calls; each call is a Python literal
    whose ``arguments`` is a JSON string."""
    turns: list[list[tuple[str, dict]]] = []
    responses, texts = [], []
    prev = None
    for m in json.loads(row["messages"]):
        if m["role"] == "tool_call":
            with pytest.raises(json.JSONDecodeError):
                json.loads(m["content"])  # not JSON: single-quoted keys
            call = ast.literal_eval(m["content"])
            args = json.loads(call["arguments"])
            if prev == "tool_call":
                turns[-1].append((call["name"], args))
            else:
                turns.append([(call["name"], args)])
        elif m["role"] == "tool_response":
            responses.append(m["content"])
        elif m["role"] == "assistant":
            texts.append(m["content"])
        prev = m["role"]
    return turns, responses, texts


def calls_of(example: dict) -> list[list[tuple[str, dict]]]:
    return [[(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            for m in example["messages"] if m.get("tool_calls")]


def tool_messages(example: dict) -> list[dict]:
    return [m for m in example["messages"] if m["role"] == "tool"]


# ---------------------------------------------------------------- the rows as released


def test_the_fixture_is_the_released_file():
    text = SFT.read_text(encoding="utf-8")
    assert len(text) == 46410 and text.count("\n") == 5
    rs = rows()
    assert [sorted(r) for r in rs] == [["messages", "question", "subset_name", "target_tools", "tools", "uuid"]] * 5
    assert {r["subset_name"] for r in rs} == {"single-turn-diversify"}
    assert [r["uuid"][:8] for r in rs] == ["05f7077a", "c86ca26c", "47cc971d", "b503f410", "a1a233ff"]


def test_every_row_loads_unchanged_and_auto_picks_llamafactory():
    assert SFT_FORMATS == ("sharegpt", "toucan", "llamafactory")
    rs = rows()
    assert [detect_sft_format(r) for r in rs] == ["llamafactory"] * 5  # the keys say toucan; the roles say otherwise
    ex = load_sft_examples(SFT)  # errors="raise": no row is refused
    assert len(ex) == 5 and ex == load_sft_examples(SFT, format="llamafactory")
    assert [sft_example_from_row(r) for r in rs] == ex
    for e, r in zip(ex, rs):
        assert sorted(e) == ["messages", "tools"] and e["tools"] == json.loads(r["tools"])
        ToolBox(e["tools"])  # the tools column passes slca's schema checks as it is


def test_the_task_loader_refuses_them_naming_the_sft_reader():
    rs = rows()
    assert [detect_format(r) for r in rs] == ["toucan"] * 5  # messages + subset_name / target_tools
    with pytest.raises(ValueError, match="none of its 5 rows is valid"):
        load_tasks(SFT, errors="skip")
    with pytest.raises(RowError, match="got 'tool_call': .* a demonstration rather than a task; .*load_sft_examples "
                                       "\\(format 'llamafactory'\\)") as e:
        load_tasks(SFT)
    assert e.value.field == "messages[2].role" and e.value.row == 0


# ---------------------------------------------------------------- what the rows demonstrate


def test_the_parallel_weather_then_calculator_demonstration():
    r = rows()[0]
    roles = [m["role"] for m in json.loads(r["messages"])]
    assert roles == ["user", "assistant", "tool_call", "tool_call", "tool_response", "tool_response", "assistant",
                     "tool_call", "tool_response", "tool_call", "tool_response", "assistant"]
    turns, responses, texts = demonstration(r)
    assert [len(t) for t in turns] == [2, 1, 1]  # one parallel step of two, then two single steps
    assert turns == [
        [("united-states-weather-get_current_weather", {"location": "42.3601,-71.0589"}),
         ("united-states-weather-get_current_weather", {"location": "41.8781,-87.6298"})],
        [("advanced-calculator-server-add", {"a": 70, "b": 72})],
        [("advanced-calculator-server-div", {"a": 142, "b": 2})],
    ]
    assert "**Station:** KBOS" in responses[0] and "**Temperature:** 69.8°F (21.0°C)" in responses[0]
    assert "**Station:** KMDW" in responses[1] and "**Temperature:** 71.6°F (22.0°C)" in responses[1]
    assert responses[2:] == ["142", "71.0"]
    assert texts[-1].startswith("## Cross-Country Bike Race Weather Summary") and "71.0°F" in texts[-1]
    # target_tools names the add call but not the div call the demonstration also makes
    assert parse_target_tools(r["target_tools"]) == ["get_current_weather", "add"]

    ex = sft_example_from_row(r)
    msgs = ex["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    assert msgs[0] == {"role": "user", "content": r["question"]}
    assert calls_of(ex) == turns
    # the text before the calls is the content of the turn that makes them; a call turn without text has none
    assert [m["content"] for m in msgs if m.get("tool_calls")] == [texts[0], texts[1], ""]
    assert msgs[-1] == {"role": "assistant", "content": texts[2]}
    weather = msgs[1]["tool_calls"]
    assert [c["id"] for c in weather] == ["call_2_0", "call_3_0"] and all(c["type"] == "function" for c in weather)
    assert [(m["content"], m["name"], m["tool_call_id"]) for m in tool_messages(ex)] == [
        (responses[0], "united-states-weather-get_current_weather", "call_2_0"),
        (responses[1], "united-states-weather-get_current_weather", "call_3_0"),
        ("142", "advanced-calculator-server-add", "call_7_0"),
        ("71.0", "advanced-calculator-server-div", "call_9_0")]


def test_the_other_demonstrations_calls_and_results():
    rs = rows()
    got = [demonstration(r) for r in rs[1:]]
    assert [[len(t) for t in turns] for turns, _, _ in got] == [[1, 1], [1, 1], [1], [1]]
    (think, now), t_resp = got[0][0], got[0][1]
    assert think[0][0] == "think-mcp-server-think" and think[0][1]["thought"].startswith("The user is asking for help with stage")
    assert now == [("server-time-get_current_time", {})]
    assert t_resp == ["Great thinking.", '{\n  "currentTime": "2025-08-29 08:07:38"\n}']
    assert got[1][0] == [[("super-shell-get_whitelist", {})],
                         [("super-shell-add_to_whitelist", {"command": "blastn", "securityLevel": "requires_approval",
                                                            "description": "BLAST nucleotide sequence database query program"})]]
    assert json.loads(got[1][1][0])[-1] == {"command": "sudo", "securityLevel": "forbidden",
                                            "description": "Execute a command as another user"}
    assert got[2][0] == [[("flux-imagegen-server-generateImageUrl",
                           {"prompt": "A sleek wind turbine farm glistening under a bright sunrise", "enhance": True})]]
    assert json.loads(got[2][1][0])["seed"] == 925377
    assert got[3][0] == [[("context7-resolve-library-id", {"libraryName": "OpenCV"})]]
    assert "- Context7-compatible library ID: /opencv/opencv" in got[3][1][0]

    ex = [sft_example_from_row(r) for r in rs[1:]]
    assert [[m["role"] for m in e["messages"]] for e in ex] == [
        ["user", "assistant", "tool", "assistant", "tool", "assistant"],
        ["user", "assistant", "tool", "assistant", "tool", "assistant"],
        ["user", "assistant", "tool", "assistant"],
        ["user", "assistant", "tool", "assistant"]]
    for e, (turns, responses, texts) in zip(ex, got):
        assert calls_of(e) == turns
        assert [m["content"] for m in tool_messages(e)] == responses
        assert [m["name"] for m in tool_messages(e)] == [name for t in turns for name, _ in t]
        assert [m["tool_call_id"] for m in tool_messages(e)] == [c["id"] for m in e["messages"] for c in m.get("tool_calls", [])]
    # the stage row's second call turn has no text before it; the whitelist row's has
    assert [m["content"] for m in ex[0]["messages"] if m.get("tool_calls")][1] == ""
    assert [m["content"] for m in ex[1]["messages"] if m.get("tool_calls")] == got[1][2][:2]
    assert ex[1]["messages"][3]["content"].startswith("`blastn` is **not** currently whitelisted.")
    assert ex[3]["messages"][-1]["content"].startswith("## **Selected Library ID: `/opencv/opencv`**")


def test_every_demonstrated_call_fits_its_rows_tool_schemas_and_targets():
    for r, e in zip(rows(), load_sft_examples(SFT)):
        box = ToolBox(e["tools"])
        calls = [c for t in calls_of(e) for c in t]
        assert len(calls) == len(tool_messages(e))  # one result per call
        assert all(box.argument_error(name, args) is None for name, args in calls), r["uuid"]
        offered = [t["function"]["name"] for t in e["tools"]]
        # every bare target name is the suffix of exactly one offered server-prefixed tool
        assert all(sum(n.endswith("-" + t) for n in offered) == 1 for t in parse_target_tools(r["target_tools"]))


def test_reasoning_in_an_assistant_text_is_placed_as_asked():
    row = {"messages": [{"role": "user", "content": "Time?"},
                        {"role": "assistant", "content": "<think>\nuse the clock\n</think>\n\nChecking."},
                        {"role": "tool_call", "content": "{'name': 'now', 'arguments': '{}'}"},
                        {"role": "tool_response", "content": "08:07"}, {"role": "assistant", "content": "It is 08:07."}]}
    assert sft_example_from_row(row)["messages"][1]["content"] == "<think>\nuse the clock\n</think>\n\nChecking."
    field = sft_example_from_row(row, reasoning="field")["messages"][1]
    assert field["content"] == "Checking." and field["reasoning_content"] == "use the clock" and field["tool_calls"]
    assert "reasoning_content" not in sft_example_from_row(row, reasoning="drop")["messages"][1]


# ---------------------------------------------------------------- hand-made rows: what is read, what is refused


def _row(*messages: dict, **cols) -> dict:
    return {"messages": json.dumps(list(messages)), **cols}


USER = {"role": "user", "content": "Weather in Rome and Oslo?"}
RESULT = {"role": "tool_response", "content": "{\"temp\": 21}"}
DONE = {"role": "assistant", "content": "Rome 21, Oslo 12."}


def test_json_calls_a_list_of_calls_and_a_system_message_are_read_too():
    ex = sft_example_from_row(_row(
        {"role": "system", "content": "Be brief."}, USER,
        {"role": "tool_call", "content": '{"name": "get_weather", "arguments": {"city": "Rome"}}'},
        {"role": "tool_call", "content": "[{'name': 'get_weather', 'arguments': {'city': 'Oslo'}}]"},
        RESULT, {"role": "tool_response", "content": "12"}, DONE))
    assert [m["role"] for m in ex["messages"]] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert calls_of(ex) == [[("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})]]
    assert [m["tool_call_id"] for m in tool_messages(ex)] == ["call_2_0", "call_3_0"] and ex["tools"] == []


@pytest.mark.parametrize("bad,field,match", [
    ("{'name': 'get_weather', 'arguments': '{\"city\": \"Rome\"}'", "messages[1].content",
     "must be a call .* as JSON or as a Python literal; it is neither \\(SyntaxError"),
    ("__import__('os').system('echo unsafe')", "messages[1].content", "it is neither \\(ValueError: malformed node"),
    ("get_weather(city='Rome')", "messages[1].content", "it is neither"),
    ("{'a': " * 500 + "1" + "}" * 500, "messages[1].content", "it is neither \\("),
    ("{'name': 'get_weather', 'arguments': " + "{'a': " * 150 + "1" + "}" * 151, "messages[1].content", "nested deeper than 100"),
    ("{'arguments': '{}'}", "messages[1].content.name", "a call needs a tool name"),
    ("{'name': 'get_weather', 'arguments': '{city: Rome}'}", "messages[1].content.arguments", "not valid JSON"),
    ("{'name': 'get_weather', 'arguments': {'city', 'Rome'}}", "messages[1].content", "not a JSON value"),
    ("{'name': 'get_weather', 'arguments': '[1]'}", "messages[1].content.arguments", "must be an object, got list"),
])
def test_a_malformed_call_names_the_row_and_field(bad, field, match):
    rows_ = [_row(USER, {"role": "tool_call", "content": bad}, RESULT, DONE, uuid="edge-1")]
    with pytest.raises(RowError, match=match) as e:
        load_sft_examples(rows_)
    assert e.value.field == field and e.value.row == 0 and e.value.source == "rows"
    assert "(id edge-1)" in str(e.value)


@pytest.mark.parametrize("messages,field,match", [
    ([USER, {"role": "assistant", "content": "Let me see."}, RESULT, DONE], "messages[2].role", "a tool_response with no call"),
    ([USER, RESULT, DONE], "messages[1].role", "a tool_response with no call"),
    ([USER, {"role": "tool_call", "content": "{'name': 'get_weather', 'arguments': '{}'}"}, RESULT, RESULT, DONE],
     "messages[3].role", "a tool_response with no call"),  # two answers to one call
    ([USER, {"role": "tool_call", "content": "{'name': 'a', 'arguments': '{}'}"}, {"role": "user", "content": "never mind"},
      RESULT, DONE], "messages[3].role", "a tool_response with no call"),  # a user turn in between: nothing to answer
    ([USER, {"role": "observation", "content": "x"}, DONE], "messages[1].role", "must be one of .*'tool_call', 'tool_response'"),
    ([USER, {"role": "system", "content": "late"}, DONE], "messages[1].role", "a system message must come first"),
    ([USER, {"role": "tool_call", "content": None}, DONE], "messages[1].content", "must be a string"),
    ([USER, {"role": "tool_call", "content": "{'name': 'a', 'arguments': '{}'}"}, RESULT], "messages",
     "must end with an assistant or tool_call message"),
])
def test_a_broken_conversation_names_the_row_and_field(messages, field, match):
    with pytest.raises(RowError, match=match) as e:
        sft_example_from_row(_row(*messages), format="llamafactory", where="edge.jsonl", index=7)
    assert e.value.field == field and e.value.row == 7 and e.value.source == "edge.jsonl"


def test_errors_skip_leaves_a_bad_row_out():
    good = rows()[3]
    bad = _row(USER, RESULT, DONE)
    assert load_sft_examples([good, bad], errors="skip") == [sft_example_from_row(good)]
