"""The paper's released rows (AnonymousRepository/toucan-toolcall-slca): ``rl`` / ``eval`` -> slca tasks, ``sft_split``
ShareGPT rows and Toucan rows -> TRL's SFT ``{"messages", "tools"}``; the two-stage example end to end on CPU.

The fixtures (tests/fixtures/paper/, written by its make_fixtures.py) follow the dataset card's schema."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slca.env import SchemaSimulator, load_sft_examples, load_tasks
from slca.env.loaders import PAPER_SOURCES, RowError, detect_format, task_from_row
from slca.env.sft import sft_example_from_row

FIX = Path(__file__).parent / "fixtures" / "paper"
ENV_FIX = Path(__file__).parent / "fixtures" / "env"
ROOT = Path(__file__).parent.parent


def rows(name: str, where: Path = FIX) -> list[dict]:
    return [json.loads(x) for x in (where / name).read_text().splitlines() if x.strip()]


# ---------------------------------------------------------------- rl / eval rows -> tasks


def test_rl_and_eval_rows_load_as_paper_tasks_with_nested_parallel_steps():
    rl = load_tasks(FIX / "rl.jsonl")
    assert [detect_format(r) for r in rows("rl.jsonl")] == ["paper"] * 4
    assert [t.id for t in rl] == ["toucan_toolcall_v4_rl-101", "toucan_toolcall_v4_rl-102", "toucan_toolcall_v4_rl-103",
                                  "toucan_toolcall_v4_rl-104-t1-s1"]
    assert [t.kind for t in rl] == ["single", "parallel", "chain", "single"]
    par = rl[1].gold
    assert len(par) == 1 and [(c.name, c.arguments) for c in par[0]] == [
        ("weather-mcp-get_weather", {"city": "Rome"}), ("weather-mcp-get_weather", {"city": "Oslo"})]
    chain = rl[2].gold
    assert [[c.name for c in s] for s in chain] == [["geo-server-find_city"], ["weather-mcp-get_forecast"]]
    hist = rl[3]
    assert [m["role"] for m in hist.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert hist.meta | {"extra_info": None} == hist.meta | {
        "source": "paper", "data_source": "toucan_toolcall_v4_rl", "question": "And the forecast for 3 days?",
        "allowed_tools": ["weather-mcp-get_forecast"], "parallel_type": "single", "has_history": True, "turn_index": 1,
        "split_position": 1, "subset": "multi_turn_split", "extra_info": None}
    ev = load_tasks(FIX / "eval.jsonl")
    assert {t.meta["data_source"] for t in ev} == {"toucan_eval_v4"} and set(PAPER_SOURCES) == {"toucan_toolcall_v4_rl", "toucan_eval_v4"}
    assert [len(s) for s in ev[1].gold] == [2] and ev[1].gold[0][0].arguments == {}
    # every gold call is one the schema-guided simulator accepts
    for t in rl + ev:
        sim = SchemaSimulator(t.tools, seed=0)
        assert all(sim.call(c.name, c.arguments, episode=0).ok for s in t.gold for c in s)


def test_a_paper_row_read_as_plain_verl_keeps_the_generic_reading():
    row = rows("rl.jsonl")[1]
    t = task_from_row(row, "verl")
    assert t.meta["source"] == "verl" and [len(s) for s in t.gold] == [2]


def test_tool_schemas_stand_in_for_a_missing_tools_column():
    row = rows("rl.jsonl")[0]
    del row["tools"]
    t = task_from_row(row)
    assert [x["function"]["name"] for x in t.tools] == ["weather-mcp-get_weather", "weather-mcp-get_forecast"]


def _bad(mutate, field, match):
    row = copy.deepcopy(rows("rl.jsonl")[2])
    mutate(row)
    with pytest.raises(RowError, match=match) as e:
        load_tasks([row])
    assert e.value.field == field and e.value.row == 0
    return e.value


GT = "reward_model.ground_truth"


@pytest.mark.parametrize("mutate,field,match", [
    (lambda r: r["reward_model"]["ground_truth"].update(allowed_tools=["geo-server-find_city", "nope"]),
     f"{GT}.allowed_tools[1]", "'nope' is not among the row's tools"),
    (lambda r: r["reward_model"]["ground_truth"].update(allowed_tools=["geo-server-find_city"]),
     f"{GT}.gold_tool_calls[1][0]", "allowed_tools .* does not allow"),
    (lambda r: r["reward_model"]["ground_truth"].update(gold_tool_calls='[[{"name": "geo-server-find_city", "arguments": {}}]]'),
     f"{GT}.gold_tool_calls[0][0]", "violates its schema"),
    (lambda r: r["reward_model"]["ground_truth"].update(gold_tool_calls="[[{]]"), f"{GT}.gold_tool_calls", "not valid JSON"),
    (lambda r: r["reward_model"]["ground_truth"].update(gold_tool_calls="[[]]"), f"{GT}.gold_tool_calls[0]", "an empty step"),
    (lambda r: r["reward_model"]["ground_truth"].pop("gold_tool_calls"), f"{GT}.gold_tool_calls", "missing"),
    (lambda r: r["reward_model"]["ground_truth"].pop("allowed_tools"), f"{GT}.allowed_tools", "missing"),
    (lambda r: r["reward_model"]["ground_truth"].update(question_content=3), f"{GT}.question_content", "must be a string"),
    (lambda r: r["reward_model"]["ground_truth"].update(tool_schemas="[]"), f"{GT}.tool_schemas", "names the tools"),
    (lambda r: r["extra_info"].update(has_history="false"), "extra_info.has_history", "must be true / false"),
    (lambda r: r["extra_info"].update(turn_index=True), "extra_info.turn_index", "must be an integer"),
    (lambda r: r["extra_info"].update(parallel_type=1), "extra_info.parallel_type", "must be a string"),
])
def test_a_bad_paper_row_names_the_field(mutate, field, match):
    _bad(mutate, field, match)


def test_a_json_string_ground_truth_reads_the_same(tmp_path):
    row = rows("rl.jsonl")[1]
    row["reward_model"]["ground_truth"] = json.dumps(row["reward_model"]["ground_truth"])
    assert [len(s) for s in task_from_row(row).gold] == [2]


# ---------------------------------------------------------------- SFT rows -> TRL's messages


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


# ---------------------------------------------------------------- TRL: one environment per tool set


def test_simulator_environments_offer_each_row_its_own_tools():
    pytest.importorskip("trl")
    from slca.integrations.trl import simulator_environments, tool_method_problem

    tasks = {t.id: t for t in load_tasks(FIX / "rl.jsonl")}
    factories, env_of = simulator_environments(tasks, lambda t: SchemaSimulator(t.tools, seed=0))
    assert env_of["toucan_toolcall_v4_rl-101"] == env_of["toucan_toolcall_v4_rl-104-t1-s1"]  # the same tool set
    assert len(factories) == 3
    env = factories[env_of["toucan_toolcall_v4_rl-102"]]()
    env.reset(task_id="toucan_toolcall_v4_rl-102")
    assert json.loads(getattr(env, "weather-mcp-get_weather")(city="Rome"))["city"] == "Rome"
    assert not hasattr(env, "geo-server-find_city")
    bad = {"type": "function", "function": {"name": "flights", "parameters": {"type": "object", "properties": {"from": {}, "to": {}}}}}
    assert "['from']" in tool_method_problem(bad)


# ---------------------------------------------------------------- the example, end to end


@pytest.mark.slow
def test_two_stage_example_runs_on_the_fixtures_on_cpu(tmp_path):
    """examples/paper/two_stage.py as docs/integrations.md runs it: SFT (2 steps), SLCA-GRPO (1 step), the eval."""
    pytest.importorskip("trl")
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "paper" / "two_stage.py"), "--model", "default", "--dataset", str(FIX),
           "--output_dir", str(out), "--use_cpu", "--bf16", "false", "--report_to", "none", "--save_strategy", "no",
           "--sft_max_steps", "2", "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "4",
           "--max_completion_length", "128", "--max_tool_calling_iterations", "2", "--eval_max_new_tokens", "48",
           "--eval_max_turns", "2", "--eval_max_total_tokens", "1024", "--logging_steps", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    log = r.stdout + r.stderr
    assert "SFT: 4 rows, 2 steps" in log and "slca/tool_token_frac" in log
    report = json.loads((out / "eval" / "paper-eval.json").read_text())
    assert set(report["metrics"]) >= {"name_f1", "arg_match", "process", "success"}
    assert report["config"]["tasks"] == 3 and report["config"]["group_by"] == "subset"
