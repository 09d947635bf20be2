"""The paper's released rows (AnonymousRepository/toucan-toolcall-slca): ``rl`` / ``eval`` -> slca tasks (the ``sft_split``
ShareGPT rows -> TRL's SFT ``{"messages", "tools"}``: test_env_sft.py); the two-stage example end to end on CPU.

The fixtures (tests/fixtures/paper/, written by its make_fixtures.py) follow the dataset card's schema."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slca.env import SchemaSimulator, load_tasks
from slca.env.loaders import PAPER_SOURCES, RowError, detect_format, task_from_row

FIX = Path(__file__).parent / "fixtures" / "paper"
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
