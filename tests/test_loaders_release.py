"""The paper authors' RL preview rows through slca's task loader, unchanged (env/loaders.py).

The rows: ``tests/fixtures/slca_grpo_release/toucan_toolcall_rl.preview.jsonl``, every row of
``data/samples/toucan_toolcall_rl.preview.jsonl`` of ``SLCA-GRPO/SLCA-GRPO`` at commit 68539c5
(Apache-2.0; the fixture's README.md). Their data/README.md calls it "a 5-row preview (same schema
as the RL parquet)". The SFT preview is test_sft_release.py's.

What loads and what does not (pinned here, so that a change on either side shows):

* The three rows without a call (``subset_name`` ``irrelevant``) load unchanged. Their
  ``data_source`` is ``toucan_toolcall``, not one of :data:`~slca.env.loaders.PAPER_SOURCES`
  (the HF release's ``toucan_toolcall_v4_rl`` / ``toucan_eval_v4``, tests/fixtures/paper/), so
  ``format="auto"`` reads them as generic ``verl`` rows; ``format="paper"`` reads them too and
  keeps ``question_content`` and ``allowed_tools``. Neither reader keeps ``subset_name``.
* The two rows with calls are refused, naming ``reward_model.ground_truth.gold_tool_calls[0]``:
  their gold is a flat list of bare tool names (``["think-tool-server-think"]``), with no
  arguments. That is neither what their data/README says the RL parquet holds (the v2
  converter's nested ``[[{name, arguments}, ...], ...]``) nor v1's flat list of ``{name,
  arguments}``. Their own reward (rl/slca_grpo/reward_fn.py, ``_normalize_gold_tool_calls_nested``)
  reads such a flat list as one step of N parallel calls with no arguments (key/value scores then
  count as perfect); slca reads a bare entry where a step is expected as a one-call step, and
  checks every gold call against its schema. The loader is not changed for them: a name-only call
  cannot pass that check (the think tool requires ``thought``), and which step structure the
  names mean (one parallel step of five, or five steps) is the data's to say, not the loader's.
* The prompts carry their own tool declaration: the system message is the hermes template with
  the row's tools inside ``<tools>...</tools>`` (their verl patch ``disable_tool_schema_injection``
  keeps the chat template from declaring them again); slca passes ``tools`` to the chat template
  as well, so a rendered prompt would declare them twice.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slca.env import ToolBox, load_tasks
from slca.env.loaders import PAPER_SOURCES, RowError, detect_format, task_from_row

FIX = Path(__file__).parent / "fixtures" / "slca_grpo_release"
RL = FIX / "toucan_toolcall_rl.preview.jsonl"
GT = "reward_model.ground_truth"

THINK = "think-tool-server-think"
CALC = ["add", "sub", "mul", "div", "power", "square_root", "factorial", "log", "sin", "cos", "tan", "degrees_to_radians",
        "radians_to_degrees", "gcd", "lcm", "is_prime", "quadratic_roots"]
SHADCN = "shadcn/ui-component-reference-server-"
POKE = ["pokémcp-random-pokemon", "pokémcp-random-pokemon-from-region", "pokémcp-random-pokemon-by-type", "pokémcp-pokemon-query"]


def rows() -> list[dict]:
    return [json.loads(x) for x in RL.read_text(encoding="utf-8").splitlines() if x.strip()]


def names(tools: list[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


# ---------------------------------------------------------------- the rows as released


def test_the_fixture_is_the_released_file():
    text = RL.read_text(encoding="utf-8")
    assert len(text) == 49184 and text.count("\n") == 5  # the source's length; five rows, each ending in a newline
    rs = rows()
    assert {r["data_source"] for r in rs} == {"toucan_toolcall"} and not set(PAPER_SOURCES) & {"toucan_toolcall"}
    assert [r["reward_model"]["ground_truth"]["subset_name"] for r in rs] == ["tool_call", "irrelevant", "irrelevant", "tool_call",
                                                                             "irrelevant"]
    assert [r["extra_info"] for r in rs] == [{"need_tools_kwargs": False, "original_turn_index": i} for i in (0, 1, 0, 0, 0)]
    assert [detect_format(r) for r in rs] == ["verl"] * 5


def test_each_system_prompt_declares_the_rows_tools_in_hermes_form():
    for r in rows():
        system = r["prompt"][0]
        assert system["role"] == "system" and system["content"].startswith("You have access to the following tools:")
        block = re.search(r"<tools>\n(.*?)\n</tools>", system["content"], re.S).group(1)
        declared = [json.loads(line) for line in block.splitlines()]  # one JSON object a line
        assert declared == json.loads(r["tools"]) == json.loads(r["reward_model"]["ground_truth"]["tool_schemas"])
        assert r["reward_model"]["ground_truth"]["allowed_tools"] == names(declared)


# ---------------------------------------------------------------- the rows without a call load


def test_the_rows_without_a_call_load_as_verl_tasks_with_their_tools_and_history():
    tasks = load_tasks(RL, errors="skip")
    assert [t.id for t in tasks] == ["verl-1", "verl-2", "verl-4"]  # rows 0 and 3 (the ones with calls) are skipped
    assert [t.kind for t in tasks] == ["no_tool"] * 3 and all(t.gold == [] for t in tasks)
    assert all(t.meta["data_source"] == "toucan_toolcall" and t.meta["source"] == "verl" for t in tasks)

    hist, calc, poke = tasks
    # a decomposed multi-turn row: the earlier turn's call and result stay as hermes text in the prompt
    assert [m["role"] for m in hist.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    call = json.loads(re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", hist.messages[2]["content"], re.S).group(1))
    assert call["name"] == THINK and call["arguments"]["thought"].startswith("This is a very broad, multi-domain question")
    assert hist.messages[3]["content"].startswith("<tool_response>\nThis is a very broad, multi-domain question")
    assert hist.messages[5]["content"].startswith("Could you provide a ready‑to‑use DPIA checklist")
    assert hist.meta["extra_info"] == {"need_tools_kwargs": False, "original_turn_index": 1}
    assert names(hist.tools) == [THINK]

    assert names(calc.tools) == [f"advanced-calculator-server-{n}" for n in CALC]
    assert calc.messages[1]["content"].startswith("I'm trying to help a friend plan their career transition")
    assert names(poke.tools) == POKE  # non-ASCII names kept as they are
    assert "portfolio‑watcher.eth" in poke.messages[1]["content"]


def test_their_tool_schemas_are_checked_as_slca_checks_any_tool():
    hist, calc, _ = load_tasks(RL, errors="skip")
    box = ToolBox(calc.tools)
    assert box.argument_error("advanced-calculator-server-add", {"a": 70, "b": 72}) is None
    assert "'b' is a required property" in box.argument_error("advanced-calculator-server-add", {"a": 70})
    log = [t for t in calc.tools if t["function"]["name"] == "advanced-calculator-server-log"][0]
    assert log["function"]["parameters"]["properties"]["base"]["default"] == pytest.approx(2.718281828459045)
    assert ToolBox(hist.tools).argument_error(THINK, {"thought": "plan the migration"}) is None


def test_format_paper_reads_them_with_the_question_and_allowed_tools():
    rs = rows()
    for i in (1, 2, 4):
        t = task_from_row(rs[i], "paper", index=i)
        gt = rs[i]["reward_model"]["ground_truth"]
        assert t.id == f"toucan_toolcall-row{i}"  # no extra_info.original_idx in these rows
        assert t.meta["question"] == gt["question_content"] == t.messages[-1]["content"]
        assert t.meta["allowed_tools"] == gt["allowed_tools"] == names(t.tools)
        assert t.meta["subset"] is None and t.gold == []


# ---------------------------------------------------------------- the rows with calls do not (finding)


@pytest.mark.parametrize("fmt", ["auto", "verl", "paper"])
def test_the_rows_with_calls_are_refused_at_their_bare_name_gold(fmt):
    rs = rows()
    for i in (0, 3):
        with pytest.raises(RowError, match="not valid JSON") as e:
            task_from_row(rs[i], fmt, where=RL.name, index=i)
        assert e.value.field == f"{GT}.gold_tool_calls[0]" and e.value.row == i
    with pytest.raises(RowError) as e:
        load_tasks(RL)  # errors="raise": the first such row stops the load
    assert e.value.row == 0


def test_what_the_refused_rows_hold_and_why_no_name_only_reading_fits():
    rs = rows()
    gold0 = rs[0]["reward_model"]["ground_truth"]["gold_tool_calls"]
    gold3 = rs[3]["reward_model"]["ground_truth"]["gold_tool_calls"]
    assert gold0 == [THINK]
    assert gold3 == [SHADCN + n for n in ("search_components", "search_components", "list_shadcn_components",
                                          "get_component_examples", "get_component_examples")]
    for r, gold in ((rs[0], gold0), (rs[3], gold3)):
        assert all(isinstance(g, str) for g in gold)  # names only: no arguments anywhere in the row's gold
        assert set(gold) <= set(r["reward_model"]["ground_truth"]["allowed_tools"]) == set(names(json.loads(r["tools"])))
    # read as calls without arguments, the think call could never pass slca's gold check
    think_tools = json.loads(rs[0]["tools"])
    assert "'thought' is a required property" in ToolBox(think_tools).argument_error(THINK, {})
    # and the shadcn calls each need an argument too, except list_shadcn_components
    box = ToolBox(json.loads(rs[3]["tools"]))
    assert [box.argument_error(g, {}) is None for g in gold3] == [False, False, True, False, False]
