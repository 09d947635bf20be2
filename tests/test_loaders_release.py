"""The paper authors' RL preview rows through slca's task loader, unchanged (env/loaders.py).

The rows: ``tests/fixtures/slca_grpo_release/toucan_toolcall_rl.preview.jsonl``, every row of
``data/samples/toucan_toolcall_rl.preview.jsonl`` of ``SLCA-GRPO/SLCA-GRPO`` at commit 68539c5
(Apache-2.0; the fixture's README.md). Their data/README.md calls it "a 5-row preview (same schema
as the RL parquet)". The SFT preview is test_sft_release.py's.

What the rows are, and how slca reads them (pinned here, so that a change on either side shows):

* ``data_source`` is ``toucan_toolcall``, what both of their converters write
  (``data/convert_toucan_to_verl.py`` and ``_v2.py``); it is in
  :data:`~slca.env.loaders.CONVERTER_SOURCES`, so ``format="auto"`` reads the rows as ``paper`` rows
  (``question_content``, ``allowed_tools``, ``ground_truth.subset_name``,
  ``extra_info.original_turn_index`` kept in ``meta``).
* The gold is v1's: a flat list of bare tool names (``["think-tool-server-think"]``), no arguments.
  slca reads it as their reward does (``rl/slca_grpo/reward_fn.py``,
  ``_normalize_gold_tool_calls_nested``): a flat list is ONE step of parallel calls, a bare name a
  call ``{"name": item}`` whose arguments are not given. Such a call is ``ToolCall(name, {})``, listed
  in ``meta["name_only_gold"]``, checked by name but not against its schema (the think tool
  requires ``thought``). Their reward skips gold calls without arguments in its key / value match
  (``gold_with_args``) and so does slca's ``paper`` reward; slca's execution tier compares the
  rollout's arguments with ``{}`` (pinned below: its ``arg_match`` is 0 for such a call).
* The system message is nothing but v1's tool declaration (hermes ``<tools>`` block of the row's
  tools, "You have access to the following tools: ... Use them when appropriate ..."); their verl
  patch ``disable_tool_schema_injection`` keeps the chat template from declaring the tools again.
  slca passes ``tools`` to the chat template, so the loader drops that message
  (``meta["tool_declare_dropped"]``) rather than declare the tools twice.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from _helpers import tool_turn

from slca.env import ToolBox, load_tasks
from slca.env.loaders import CONVERTER_SOURCES, PAPER_SOURCES, RowError, detect_format, save_tasks, task_from_row
from slca.rewards.execution import execution_reward
from slca.rewards.paper import paper_process_score
from slca.types import ToolCall, ToolResult

FIX = Path(__file__).parent / "fixtures" / "slca_grpo_release"
RL = FIX / "toucan_toolcall_rl.preview.jsonl"
GT = "reward_model.ground_truth"

THINK = "think-tool-server-think"
CALC = ["add", "sub", "mul", "div", "power", "square_root", "factorial", "log", "sin", "cos", "tan", "degrees_to_radians",
        "radians_to_degrees", "gcd", "lcm", "is_prime", "quadratic_roots"]
SHADCN = "shadcn/ui-component-reference-server-"
POKE = ["pokémcp-random-pokemon", "pokémcp-random-pokemon-from-region", "pokémcp-random-pokemon-by-type", "pokémcp-pokemon-query"]
SHADCN_GOLD = [SHADCN + n for n in ("search_components", "search_components", "list_shadcn_components", "get_component_examples",
                                    "get_component_examples")]


def rows() -> list[dict]:
    return [json.loads(x) for x in RL.read_text(encoding="utf-8").splitlines() if x.strip()]


def names(tools: list[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def gold_names(task) -> list[list[str]]:
    return [[c.name for c in step] for step in task.gold]


# ---------------------------------------------------------------- the rows as released


def test_the_fixture_is_the_released_file():
    text = RL.read_text(encoding="utf-8")
    assert len(text) == 49184 and text.count("\n") == 5  # the source's length; five rows, each ending in a newline
    rs = rows()
    assert {r["data_source"] for r in rs} == {"toucan_toolcall"}
    assert CONVERTER_SOURCES == ("toucan_toolcall",) and not set(PAPER_SOURCES) & set(CONVERTER_SOURCES)
    assert [r["reward_model"]["ground_truth"]["subset_name"] for r in rs] == ["tool_call", "irrelevant", "irrelevant", "tool_call",
                                                                             "irrelevant"]
    assert [r["extra_info"] for r in rs] == [{"need_tools_kwargs": False, "original_turn_index": i} for i in (0, 1, 0, 0, 0)]
    assert [r["reward_model"]["ground_truth"]["gold_tool_calls"] for r in rs] == [[THINK], [], [], SHADCN_GOLD, []]
    assert [detect_format(r) for r in rs] == ["paper"] * 5


def test_each_system_prompt_declares_the_rows_tools_in_hermes_form():
    for r in rows():
        system = r["prompt"][0]
        assert system["role"] == "system" and system["content"].startswith("You have access to the following tools:")
        assert system["content"].endswith("Use them when appropriate to help answer the user's questions.")
        block = re.search(r"<tools>\n(.*?)\n</tools>", system["content"], re.S).group(1)
        declared = [json.loads(line) for line in block.splitlines()]  # one JSON object a line
        assert declared == json.loads(r["tools"]) == json.loads(r["reward_model"]["ground_truth"]["tool_schemas"])
        assert r["reward_model"]["ground_truth"]["allowed_tools"] == names(declared)


# ---------------------------------------------------------------- every row loads, as the paper's rows


def test_every_row_loads_unchanged_as_a_paper_task():
    tasks = load_tasks(RL)  # errors="raise": no row is refused
    assert [t.id for t in tasks] == [f"toucan_toolcall-row{i}" for i in range(5)]  # no extra_info.original_idx in these rows
    assert [t.kind for t in tasks] == ["single", "no_tool", "no_tool", "parallel", "no_tool"]
    assert [gold_names(t) for t in tasks] == [[[THINK]], [], [], [SHADCN_GOLD], []]
    assert [[len(s) for s in t.gold] for t in tasks] == [[1], [], [], [5], []]  # the flat list of five: ONE parallel step
    assert all(c.arguments == {} for t in tasks for s in t.gold for c in s)
    assert [t.meta.get("name_only_gold") for t in tasks] == [[[0, 0]], None, None, [[0, i] for i in range(5)], None]
    for t, r in zip(tasks, rows()):
        gt = r["reward_model"]["ground_truth"]
        assert t.meta["source"] == "paper" and t.meta["data_source"] == "toucan_toolcall"
        assert t.meta["subset_name"] == t.meta["subset"] == gt["subset_name"]
        assert t.meta["original_turn_index"] == r["extra_info"]["original_turn_index"]
        assert t.meta["extra_info"] == r["extra_info"]
        assert t.meta["question"] == gt["question_content"] == t.messages[-1]["content"]
        assert t.meta["allowed_tools"] == gt["allowed_tools"] == names(t.tools)
        assert t.tools == json.loads(r["tools"])
        assert t.meta["tool_declare_dropped"] is True and t.messages == r["prompt"][1:]  # only the declaration is gone
    assert [[t.id for t in load_tasks(RL, fmt)] for fmt in ("paper", "auto")] == [[t.id for t in tasks]] * 2


def test_the_prompts_their_tools_and_the_decomposed_multi_turn_row():
    think, hist, calc, shadcn, poke = load_tasks(RL)
    assert think.messages == [{"role": "user", "content": think.meta["question"]}]
    assert think.messages[0]["content"].startswith("I need to develop a detailed, step‑by‑step migration strategy")
    # a decomposed multi-turn row: the earlier turn's call and result stay as hermes text in the prompt
    assert [m["role"] for m in hist.messages] == ["user", "assistant", "user", "assistant", "user"]
    call = json.loads(re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", hist.messages[1]["content"], re.S).group(1))
    assert call["name"] == THINK and call["arguments"]["thought"].startswith("This is a very broad, multi-domain question")
    assert hist.messages[2]["content"].startswith("<tool_response>\nThis is a very broad, multi-domain question")
    assert hist.messages[4]["content"].startswith("Could you provide a ready‑to‑use DPIA checklist")
    assert names(hist.tools) == [THINK]
    assert names(calc.tools) == [f"advanced-calculator-server-{n}" for n in CALC]
    assert calc.messages[0]["content"].startswith("I'm trying to help a friend plan their career transition")
    assert shadcn.messages[0]["content"].startswith("I'm building a file upload feature for my project dashboard")
    assert names(shadcn.tools) == [SHADCN + n for n in ("list_shadcn_components", "get_component_details",
                                                         "get_component_examples", "search_components")]
    assert names(poke.tools) == POKE  # non-ASCII names kept as they are
    assert "portfolio‑watcher.eth" in poke.messages[0]["content"]


def test_their_tool_schemas_are_checked_as_slca_checks_any_tool():
    _, hist, calc, _, _ = load_tasks(RL)
    box = ToolBox(calc.tools)
    assert box.argument_error("advanced-calculator-server-add", {"a": 70, "b": 72}) is None
    assert "'b' is a required property" in box.argument_error("advanced-calculator-server-add", {"a": 70})
    log = [t for t in calc.tools if t["function"]["name"] == "advanced-calculator-server-log"][0]
    assert log["function"]["parameters"]["properties"]["base"]["default"] == pytest.approx(2.718281828459045)
    assert ToolBox(hist.tools).argument_error(THINK, {"thought": "plan the migration"}) is None


def test_a_name_only_gold_call_is_checked_by_name_not_against_its_schema():
    think, _, _, shadcn, _ = load_tasks(RL)
    # {} breaks both schemas: a name-only call is not a call without arguments, so it is not checked as one
    assert "'thought' is a required property" in ToolBox(think.tools).argument_error(THINK, {})
    box = ToolBox(shadcn.tools)
    assert [box.argument_error(n, {}) is None for n in SHADCN_GOLD] == [False, False, True, False, False]
    # but its name is: a tool not offered, or not allowed, is refused naming the call
    row = rows()[0]
    row["reward_model"]["ground_truth"]["gold_tool_calls"] = ["think"]
    with pytest.raises(RowError, match="a bare tool name, its arguments not given.*unknown tool 'think'") as e:
        task_from_row(row, where=RL.name)
    assert e.value.field == f"{GT}.gold_tool_calls[0]"
    row = rows()[3]
    row["reward_model"]["ground_truth"]["allowed_tools"] = [SHADCN + "search_components"]
    with pytest.raises(RowError, match="which allowed_tools .* does not allow") as e:
        task_from_row(row)
    assert e.value.field == f"{GT}.gold_tool_calls[2]"  # list_shadcn_components, the first call not allowed


def test_a_name_only_call_scores_by_name_in_the_paper_reward_and_not_in_the_execution_tier():
    think = load_tasks(RL)[0]
    made = ToolCall(THINK, {"thought": "Outline the migration phases and the GDPR / PCI-DSS checks."})
    turns = [tool_turn([made], [ToolResult(True, "ok")])]
    paper = paper_process_score(think, turns)  # their reward's rules: key / value match skip gold without arguments
    assert paper.total == pytest.approx(1.0)
    assert {k: paper.components[k] for k in ("name_f1", "key_match", "value_match", "parallel")} == dict.fromkeys(
        ("name_f1", "key_match", "value_match", "parallel"), 1.0)
    ex = execution_reward(think, turns)  # slca's tier reads {} as "no arguments": the call's arguments cannot match
    assert ex.components["name_f1"] == 1.0 and ex.components["arg_match"] == 0.0


def test_format_verl_refuses_a_flat_list_of_names_with_the_reason():
    rs = rows()
    for i in (0, 3):
        with pytest.raises(RowError, match="a bare tool name .* where a step is expected") as e:
            task_from_row(rs[i], "verl", where=RL.name, index=i)
        assert e.value.field == f"{GT}.gold_tool_calls[0]" and e.value.row == i
        assert "not valid JSON" not in str(e.value) and "format 'paper'" in str(e.value)
    for i in (1, 2, 4):  # without gold, the generic reader reads the row as it is (its declaration kept)
        t = task_from_row(rs[i], "verl", index=i)
        assert t.meta["source"] == "verl" and t.gold == [] and t.messages == rs[i]["prompt"]


# ---------------------------------------------------------------- hand-made rows: the gold shapes their reward reads


def _shadcn(gold) -> dict:
    row = copy.deepcopy(rows()[3])
    row["reward_model"]["ground_truth"]["gold_tool_calls"] = gold
    return row


def test_a_flat_list_of_a_call_and_a_name_is_one_step_of_two():
    search = {"name": SHADCN + "search_components", "arguments": {"query": "file upload"}}
    for gold in ([search, SHADCN + "list_shadcn_components"], json.dumps([search, SHADCN + "list_shadcn_components"])):
        t = task_from_row(_shadcn(gold))
        assert [[(c.name, c.arguments) for c in s] for s in t.gold] == [
            [(SHADCN + "search_components", {"query": "file upload"}), (SHADCN + "list_shadcn_components", {})]]
        assert t.kind == "parallel" and t.meta["name_only_gold"] == [[0, 1]]
    # the call with arguments is checked against its schema, as any gold call
    with pytest.raises(RowError, match="violates its schema.*'query' is a required property") as e:
        task_from_row(_shadcn([{"name": SHADCN + "search_components", "arguments": {}}, SHADCN + "list_shadcn_components"]))
    assert e.value.field == f"{GT}.gold_tool_calls[0]"


def test_nested_gold_takes_names_and_calls_in_its_steps():
    t = task_from_row(_shadcn([[SHADCN + "search_components", SHADCN + "list_shadcn_components"],
                               [{"name": SHADCN + "get_component_examples", "arguments": {"componentName": "input"}}]]))
    assert gold_names(t) == [[SHADCN + "search_components", SHADCN + "list_shadcn_components"], [SHADCN + "get_component_examples"]]
    assert t.kind == "chain" and t.meta["name_only_gold"] == [[0, 0], [0, 1]] and t.gold[1][0].arguments == {"componentName": "input"}


@pytest.mark.parametrize("gold,field,match", [
    ([SHADCN + "search_components", 3], f"{GT}.gold_tool_calls[1]", "must be a call object, a tool name or a step"),
    ([SHADCN + "search_components", [SHADCN + "search_components"]], f"{GT}.gold_tool_calls[1]", "must be a call object or a tool name"),
    ([[SHADCN + "search_components"], SHADCN + "list_shadcn_components"], f"{GT}.gold_tool_calls[1]",
     "must be a step .* like step 0.* does not drop a gold step"),
    ([[SHADCN + "search_components"], []], f"{GT}.gold_tool_calls[1]", "an empty step"),
    ([[SHADCN + "search_components", None]], f"{GT}.gold_tool_calls[0][1]", "must be a call object or a tool name"),
    ([""], f"{GT}.gold_tool_calls[0]", "a call needs a tool name"),
    ("[" + SHADCN + "search_components]", f"{GT}.gold_tool_calls", "not valid JSON"),
])
def test_a_gold_shape_their_reward_would_drop_silently_is_refused_naming_the_field(gold, field, match):
    with pytest.raises(RowError, match=match) as e:
        load_tasks([_shadcn(gold)])
    assert e.value.field == field and e.value.row == 0 and e.value.source == "rows"


def test_name_only_gold_survives_save_and_load(tmp_path):
    tasks = load_tasks(RL)
    for fmt in ("slca", "verl"):
        back = load_tasks(save_tasks(tasks, tmp_path / f"tasks.{fmt}.jsonl", format=fmt))
        assert [gold_names(t) for t in back] == [gold_names(t) for t in tasks]
        assert [t.meta.get("name_only_gold") for t in back] == [t.meta.get("name_only_gold") for t in tasks]
    line = json.loads((tmp_path / "tasks.slca.jsonl").read_text(encoding="utf-8").splitlines()[3])
    assert json.loads(line["gold"]) == [SHADCN_GOLD]  # written as bare names inside one step


# ---------------------------------------------------------------- hand-made rows: the converters' system prompts


def test_v2s_tool_definitions_are_cut_and_its_instructions_kept():
    row = rows()[2]
    body = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in json.loads(row["tools"]))
    head = ("You are a helpful assistant.\n\n# Instructions\nAnswer the user's question and output your thinking process "
            "within the <think> and </think> tags.")
    row["prompt"][0]["content"] = f"{head}\n\n# Tool Definitions\n<tools>{body}\n</tools>"
    t = task_from_row(row)
    assert t.messages[0] == {"role": "system", "content": head} and t.meta["tool_declare_dropped"] is True
    assert t.messages[1:] == row["prompt"][1:]


def test_a_system_prompt_that_is_not_exactly_the_converters_is_kept():
    row = rows()[2]
    row["prompt"][0]["content"] = "Be brief. " + row["prompt"][0]["content"]
    t = task_from_row(row)
    assert t.messages == row["prompt"] and "tool_declare_dropped" not in t.meta
    row = rows()[2]  # the block declares other tools than the row offers
    row["prompt"][0]["content"] = row["prompt"][0]["content"].replace("advanced-calculator-server-add", "advanced-calculator-server-plus")
    t = task_from_row(row)
    assert t.messages == row["prompt"] and "tool_declare_dropped" not in t.meta
    row = rows()[2]  # without the tools column, ground_truth.tool_schemas is what the declaration is compared with
    row["tools"] = None
    assert task_from_row(row).messages == row["prompt"][1:]

