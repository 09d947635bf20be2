"""slca.env.sft: SFT rows (the paper's ShareGPT ``sft_split`` rows, Toucan rows) -> TRL's ``{"messages", "tools"}``.

Fixtures: tests/fixtures/paper/sft_split.jsonl (the dataset card's schema) and tests/fixtures/env/toucan_small.jsonl.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest

from slca.env import load_sft_examples
from slca.env.loaders import RowError
from slca.env.sft import REASONING, SFT_FORMATS, detect_sft_format, sft_example_from_row

FIX = Path(__file__).parent / "fixtures" / "paper"
ENV_FIX = Path(__file__).parent / "fixtures" / "env"


def rows(name: str, where: Path = FIX) -> list[dict]:
    return [json.loads(x) for x in (where / name).read_text().splitlines() if x.strip()]


# ---------------------------------------------------------------- the paper's rows and Toucan's


def test_sharegpt_rows_become_trl_messages_with_openai_tool_calls():
    ex = load_sft_examples(FIX / "sft_split.jsonl")
    assert len(ex) == 4
    single, parallel, chain, plain = ex
    sys_msg = single["messages"][0]
    assert sys_msg["role"] == "system" and "<tools>" not in sys_msg["content"] and not sys_msg["content"].endswith("# Tools")
    assert [t["function"]["name"] for t in single["tools"]] == ["weather-mcp-get_weather", "weather-mcp-get_forecast"]
    assert [m["role"] for m in single["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    call = single["messages"][2]
    assert call["content"] == "<think>\nI need the current weather.\n</think>"
    assert call["tool_calls"] == [{"id": call["tool_calls"][0]["id"], "type": "function",
                                   "function": {"name": "weather-mcp-get_weather", "arguments": {"city": "Paris"}}}]
    assert single["messages"][3] == {"role": "tool", "content": '{"temp": 21, "sky": "sunny"}',
                                     "name": "weather-mcp-get_weather", "tool_call_id": call["tool_calls"][0]["id"]}
    # one parallel turn: two calls in one message, two results answering them in order
    calls = parallel["messages"][2]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Rome"}, {"city": "Oslo"}]
    assert [m.get("tool_call_id") for m in parallel["messages"][3:5]] == [c["id"] for c in calls]
    assert [m["role"] for m in chain["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert chain["messages"][4]["content"] == "" and chain["messages"][-1]["content"] == "Lyon: rain, then sun."
    assert plain["messages"][-1] == {"role": "assistant", "content": "<think>\nNo tool needed.\n</think>\n\nHello!"}


def test_reasoning_can_move_to_its_field_or_be_dropped():
    row = rows("sft_split.jsonl")[0]
    field = sft_example_from_row(row, reasoning="field")["messages"]
    assert field[2]["content"] == "" and field[2]["reasoning_content"] == "I need the current weather."
    assert field[4] == {"role": "assistant", "content": "It is sunny in Paris, 21 C.", "reasoning_content": "Sunny, 21."}
    drop = sft_example_from_row(row, reasoning="drop")["messages"]
    assert drop[4] == {"role": "assistant", "content": "It is sunny in Paris, 21 C."}
    with pytest.raises(ValueError, match="reasoning must be one of"):
        sft_example_from_row(row, reasoning="inline")


def test_responses_that_do_not_match_the_calls_are_kept_without_ids():
    row = rows("sft_split.jsonl")[1]
    row["conversations"][3]["value"] = '<tool_response>\n{"both": [25, 4]}\n</tool_response>\nThanks, also Bergen?'
    msgs = sft_example_from_row(row)["messages"]
    assert msgs[3] == {"role": "tool", "content": '{"both": [25, 4]}'}
    assert msgs[4] == {"role": "user", "content": "Thanks, also Bergen?"}


@pytest.mark.parametrize("turn,value,field,match", [
    (2, "<tool_call>\n[{\"name\": \"weather-mcp-get_weather\", \"arguments\": {]\n</tool_call>", "conversations[2].value.tool_call[0]", "not valid JSON"),
    (2, "<tool_call>\n[{\"arguments\": {}}]\n</tool_call>", "conversations[2].value.tool_call[0][0].name", "needs a tool name"),
    (2, "<tool_call>\n[{\"name\": \"x\", \"arguments\": [1]}]\n</tool_call>", "conversations[2].value.tool_call[0][0].arguments", "must be an object"),
    (2, "<think>\nunfinished", "conversations[2].value", "<think> and </think> do not pair up"),
    (3, "<tool_response>\nunfinished", "conversations[3].value", "<tool_response> and </tool_response> do not pair up"),
    (2, None, "conversations[2].value", "must be a string"),
])
def test_a_bad_sharegpt_turn_names_the_field(turn, value, field, match):
    row = rows("sft_split.jsonl")[0]
    row["conversations"][turn]["value"] = value
    with pytest.raises(RowError, match=match) as e:
        load_sft_examples([row])
    assert e.value.field == field


def test_sharegpt_structure_errors_and_skip(caplog):
    good = rows("sft_split.jsonl")
    swapped = copy.deepcopy(good[0])
    swapped["conversations"][1]["from"] = "gpt"
    with pytest.raises(RowError, match="expected 'human'") as e:
        load_sft_examples([swapped])
    assert e.value.field == "conversations[1].from"
    ends_human = copy.deepcopy(good[0])
    ends_human["conversations"] = ends_human["conversations"][:4]
    with pytest.raises(RowError, match="must end with a gpt turn"):
        load_sft_examples([ends_human])
    unknown = copy.deepcopy(good[0])
    unknown["conversations"][1]["from"] = "observation"
    with pytest.raises(RowError, match="must be one of"):
        load_sft_examples([unknown])
    with pytest.raises(RowError, match="cannot tell the SFT row's format"):
        load_sft_examples([{"text": "hi"}])
    with caplog.at_level(logging.WARNING, logger="slca.env"):
        out = load_sft_examples([swapped, good[1], ends_human], errors="skip")
    assert len(out) == 1 and "skipped 2 of 3 rows" in caplog.text


def test_toucan_rows_become_trl_messages_with_parallel_calls_merged():
    ex = load_sft_examples(ENV_FIX / "toucan_small.jsonl")
    assert len(ex) == len(rows("toucan_small.jsonl", ENV_FIX))
    for e in ex:
        assert e["tools"] and e["messages"][-1]["role"] == "assistant"
        assert not any(m["role"] == "system" and "tool_declare" in m["content"] for m in e["messages"])
        for i, m in enumerate(e["messages"]):
            if m["role"] == "tool" and "tool_call_id" in m:  # a result answers a call made before it
                ids = {c["id"] for p in e["messages"][:i] for c in p.get("tool_calls", [])}
                assert m["tool_call_id"] in ids
    parallel = [m for e in ex for m in e["messages"] if len(m.get("tool_calls", [])) > 1]
    assert parallel, "the Toucan fixture has a parallel call: one assistant message with several tool_calls"


def test_sft_dataset_keeps_each_message_as_built_and_trl_renders_it():
    pytest.importorskip("datasets")
    pytest.importorskip("trl")
    from trl.data_utils import apply_chat_template

    from slca.env import sft_dataset
    from slca.models import load_default

    ex = load_sft_examples(FIX / "sft_split.jsonl")
    ds = sft_dataset(ex)
    assert [r["messages"] for r in ds] == [e["messages"] for e in ex]  # no key of one call's arguments leaks into another
    _, tok = load_default()
    text = apply_chat_template({"messages": ds[1]["messages"]}, tok, tools=json.loads(ds[1]["tools"]))["text"]
    assert text.count('"name": "weather-mcp-get_weather"') == 2 and '"arguments": {"city": "Oslo"}' in text
    assert "weather-mcp-get_weather(city: string)" in text  # the template declares the row's tool


# ---------------------------------------------------------------- the conversion rules, one by one

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def _sharegpt(system_turn=None, *turns, **cols):
    conv = ([{"from": "system", "value": system_turn}] if system_turn is not None else [])
    conv += [{"from": "human" if i % 2 == 0 else "gpt", "value": v} for i, v in enumerate(turns)]
    return {"conversations": conv, **cols}


TURNS = ("Weather in Oslo?", CALL, '<tool_response>\n{"t": 3}\n</tool_response>', "It is 3 C.")


def test_detect_sft_format_reads_the_keys():
    assert SFT_FORMATS == ("sharegpt", "toucan", "llamafactory") and REASONING == ("content", "field", "drop")
    assert detect_sft_format({"conversations": []}) == "sharegpt"
    assert detect_sft_format({"messages": []}) == "toucan"
    with pytest.raises(ValueError, match=r"cannot tell the SFT row's format from its keys \['text'\]"):
        detect_sft_format({"text": "hi"})


@pytest.mark.parametrize("kw,needle", [(dict(format="alpaca"), "format must be 'auto' or one of"),
                                       (dict(reasoning="inline"), "reasoning must be one of")])
def test_bad_options_are_refused_before_any_row(kw, needle):
    row = _sharegpt(None, *TURNS)
    with pytest.raises(ValueError, match=needle):
        sft_example_from_row(row, **kw)
    with pytest.raises(ValueError, match=needle):
        load_sft_examples([row], **kw)


def test_the_tools_block_is_cut_from_the_system_text_and_becomes_the_tools():
    system = "You help.\n\n# Tools\n<tools>\n" + json.dumps(WEATHER) + "\n</tools>\n\nCall them in <tools></tools> XML tags."
    ex = sft_example_from_row(_sharegpt(system, *TURNS))
    assert ex["tools"] == [WEATHER]
    sys_text = ex["messages"][0]["content"]
    assert sys_text.startswith("You help.") and sys_text.endswith("Call them in <tools></tools> XML tags.")
    assert "# Tools" not in sys_text and "get_weather" not in sys_text  # the heading and the block go, the prose stays
    # a JSON list in the block reads the same
    listed = sft_example_from_row(_sharegpt("<tools>\n" + json.dumps([WEATHER]) + "\n</tools>", *TURNS))
    assert listed["tools"] == [WEATHER] and listed["messages"][0]["role"] == "user"  # nothing left: no system message


def test_a_tools_column_wins_and_a_system_column_stands_for_a_system_turn():
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    system = "<tools>\n" + json.dumps(WEATHER) + "\n</tools>"
    assert sft_example_from_row(_sharegpt(system, *TURNS, tools=[other]))["tools"] == [other]
    ex = sft_example_from_row(_sharegpt(None, *TURNS, system="Be brief.\n" + system))
    assert ex["messages"][0] == {"role": "system", "content": "Be brief."} and ex["tools"] == [WEATHER]
    with pytest.raises(RowError, match="must be a string") as e:
        sft_example_from_row(_sharegpt(None, *TURNS, system=3))
    assert e.value.field == "system"


def test_a_call_object_is_a_one_call_list_and_results_pair_with_calls_in_order():
    msgs = sft_example_from_row(_sharegpt(None, *TURNS))["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    (call,) = msgs[1]["tool_calls"]
    assert call["type"] == "function" and call["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert msgs[2] == {"role": "tool", "content": '{"t": 3}', "name": "get_weather", "tool_call_id": call["id"]}
    assert msgs[3] == {"role": "assistant", "content": "It is 3 C."}


def test_text_beside_the_calls_is_the_content_and_text_beside_results_a_user_message():
    turns = ("Hi", "Let me look. " + CALL, '<tool_response>\n{"t": 3}\n</tool_response>\nAnd tomorrow?', "Same.")
    msgs = sft_example_from_row(_sharegpt(None, *turns))["messages"]
    assert msgs[1]["content"] == "Let me look." and len(msgs[1]["tool_calls"]) == 1
    assert msgs[2]["role"] == "tool" and msgs[3] == {"role": "user", "content": "And tomorrow?"}


def test_reasoning_before_a_plain_answer():
    turns = ("Hi", "<think>\nA greeting.\n</think>Hello!")
    assert sft_example_from_row(_sharegpt(None, *turns))["messages"][-1]["content"] == "<think>\nA greeting.\n</think>\n\nHello!"
    assert sft_example_from_row(_sharegpt(None, *turns), reasoning="field")["messages"][-1] == {
        "role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."}
    assert sft_example_from_row(_sharegpt(None, *turns), reasoning="drop")["messages"][-1] == {"role": "assistant", "content": "Hello!"}


def test_a_bad_row_names_where_the_row_and_the_field():
    with pytest.raises(RowError, match=r"^data.jsonl row 4: a row must be an object, got str"):
        sft_example_from_row("not a row", where="data.jsonl", index=4)
    with pytest.raises(RowError, match="must end with a gpt turn") as e:
        sft_example_from_row({"conversations": []}, where="data.jsonl", index=2)
    assert (e.value.source, e.value.row, e.value.field) == ("data.jsonl", 2, "conversations")
    with pytest.raises(RowError, match="missing") as e:
        sft_example_from_row({"conversations": None, "id": "r-9"})
    assert e.value.field == "conversations" and "(id r-9)" in str(e.value)
    with pytest.raises(RowError, match="missing") as e:
        sft_example_from_row({"conversations": [], "x": 1}, format="toucan")  # an explicit format is read as that format
    assert e.value.field == "messages"


def _toucan(*messages, **cols):
    return {"messages": list(messages), "available_tools": json.dumps([WEATHER]), **cols}


def _fc(city):
    return {"role": "assistant", "content": "", "function_call": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def test_toucan_consecutive_calls_are_one_parallel_turn_and_results_pair_by_name():
    ex = sft_example_from_row(_toucan(
        {"role": "user", "content": "Oslo and Rome?"}, _fc("Oslo"), _fc("Rome"),
        {"role": "function", "name": "get_weather", "content": '{"t": 3}'},
        {"role": "function", "name": "get_weather", "content": {"t": 20}},  # not a string: written as JSON
        {"role": "assistant", "content": "Oslo 3, Rome 20.", "reasoning_content": "Both known."}))
    msgs = ex["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = msgs[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert [m["tool_call_id"] for m in msgs[2:4]] == [c["id"] for c in calls] and msgs[3]["content"] == '{"t": 20}'
    assert msgs[4]["content"] == "<think>\nBoth known.\n</think>\n\nOslo 3, Rome 20."
    assert ex["tools"][0]["function"]["name"] == "get_weather"
    field = sft_example_from_row(_toucan(*[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": "r"}]),
                                 reasoning="field")
    assert field["messages"][-1] == {"role": "assistant", "content": "y", "reasoning_content": "r"}


def test_a_toucan_row_must_end_with_the_assistant():
    with pytest.raises(RowError, match="must end with an assistant message") as e:
        sft_example_from_row(_toucan({"role": "user", "content": "Oslo?"}, _fc("Oslo"),
                                     {"role": "function", "name": "get_weather", "content": "{}"}), format="toucan")
    assert e.value.field == "messages"
