"""Execution tier of the hierarchical rewards (slca.rewards.execution): the cascade on hand-scored rollouts,
the paper's in-domain metrics, the parallel-split diagnostic and the evaluation scores."""

from __future__ import annotations

import math

import pytest

from slca.rewards import execution_reward, in_domain_metrics, summary_reward
from slca.rewards.execution import EVAL_SCORES, EXECUTION_WEIGHTS, eval_scores, parallel_split
from slca.types import ParseError, Task, ToolCall, ToolResult

from _helpers import answer_turn as answer
from _helpers import run_steps as run
from _helpers import approx, task_of, tool_turn


# ------------------------------------------------------------------ execution tiers


def test_single_perfect_and_wrong_argument():
    t = task_of("weather")
    (g,) = t.gold[0]
    assert execution_reward(t, run(t, [[g]])).total == approx(1.0)
    wrong = ToolCall("get_weather", {"city": "Atlantis", "date": g.arguments["date"]})
    r = execution_reward(t, run(t, [[wrong]]))
    # format 1, names 1, args 1/2, executed 1, efficient 1 -> .1 + .2 + .3*.5 + .2*.5 + .2*.5
    assert r.components["arg_match"] == approx(0.5)
    assert r.total == approx(0.65)
    m = in_domain_metrics(t, run(t, [[wrong]]))
    assert m == {"name_f1": 1.0, "arg_match": 0.5, "process": 0.0, "success": 0.0}


def test_argument_values_are_normalised():
    t = task_of("weather")
    (g,) = t.gold[0]
    loose = ToolCall("get_weather", {"city": "  " + g.arguments["city"].upper() + " ", "date": g.arguments["date"]})
    turns = [tool_turn([loose], [ToolResult(ok=True, content={})])]
    assert execution_reward(t, turns).components["arg_match"] == approx(1.0)
    c = task_of("convert")
    (gc,) = c.gold[0]
    as_text = ToolCall(gc.name, {**gc.arguments, "amount": f"{gc.arguments['amount']}.0"})
    # "50.0" is numerically equal but breaks the schema (amount must be a number): the pair scores 0
    assert execution_reward(c, [tool_turn([as_text], [ToolResult(ok=False, error="x")])]).components["arg_match"] == 0.0
    as_float = ToolCall(gc.name, {**gc.arguments, "amount": float(gc.arguments["amount"])})
    assert execution_reward(c, [tool_turn([as_float], [ToolResult(ok=True, content={})])]).components["arg_match"] == 1.0


def test_format_tier_gates_everything():
    t = task_of("weather")
    (g,) = t.gold[0]
    bad = ParseError("invalid_json", "could not parse", '{"name": get_weather')
    only_bad = [tool_turn([], [ToolResult(ok=False, error="parse error")], errors=[bad])]
    r = execution_reward(t, only_bad)
    assert r.components["format"] == 0.0 and r.total == 0.0
    retry = only_bad + run(t, [[g]])
    r = execution_reward(t, retry)
    # format .5 (one clean turn of two); efficiency 1/2 turns -> .05 + .1 + .15 + .1 + .2*.5*.5*... see cascade
    assert r.components == {"format": 0.5, "name_f1": 1.0, "arg_match": 1.0, "success": 1.0, "efficiency": 0.5}
    assert r.total == approx(0.1 * 0.5 + 0.2 * 0.5 + 0.3 * 0.5 + 0.2 * 0.5 + 0.2 * 0.25)
    chatty = [tool_turn([g], [ToolResult(ok=True, content={})], errors=[ParseError("text_around_calls", "text outside")])]
    assert execution_reward(t, chatty).components["format"] == 0.5


def test_no_attempt_on_a_tool_task_scores_zero():
    t = task_of("stock")
    r = execution_reward(t, [answer("I think it is 100 USD.")])
    assert r.total == 0.0 and r.components["format"] == 0.0
    assert in_domain_metrics(t, [answer("x")]) == {"name_f1": 0.0, "arg_match": 0.0, "process": 0.0, "success": 0.0}


def test_wrong_tool_name():
    t = task_of("weather")
    (g,) = t.gold[0]
    r = execution_reward(t, run(t, [[ToolCall("get_air_quality", {"city": g.arguments["city"]})]]) if "get_air_quality" in
                         {x["function"]["name"] for x in t.tools} else [tool_turn([ToolCall("get_air_quality", {"city": "x"})],
                                                                                 [ToolResult(ok=False, error="unknown")])])
    assert r.components["name_f1"] == 0.0 and r.total == approx(0.1)


def test_missing_parallel_call():
    t = task_of("weather2")
    a, _ = t.gold[0]
    r = execution_reward(t, run(t, [[a]]))
    # names 2/3, args 1/2 (one of two gold calls), executed 1, efficient 1
    assert r.components["name_f1"] == approx(2 / 3) and r.components["arg_match"] == approx(0.5)
    assert r.total == approx(0.1 + 0.2 * 2 / 3 + 0.3 * (2 / 3 * 0.5) + 0.2 * (1 / 3) + 0.2 * (1 / 3))


def test_schema_invalid_call_and_failed_execution():
    t = task_of("weather")
    (g,) = t.gold[0]
    invalid = ToolCall("get_weather", {"city": g.arguments["city"], "date": "tomorrow"})
    r = execution_reward(t, run(t, [[invalid]]))
    assert r.components["arg_match"] == 0.0 and r.components["success"] == 0.0
    assert r.total == approx(0.3)
    failed = execution_reward(t, [tool_turn([g], [ToolResult(ok=False, error="service down")])])
    assert failed.components["success"] == 0.0 and failed.total == approx(0.6)


def test_redundant_repeat_costs_efficiency_and_precision():
    t = task_of("stock")
    (g,) = t.gold[0]
    r = execution_reward(t, run(t, [[g, g]]))
    assert r.components["efficiency"] == approx(0.5) and r.components["name_f1"] == approx(2 / 3)
    assert r.total == approx(0.1 + 0.2 * 2 / 3 + 0.3 * 1 / 3 + 0.2 * 1 / 3 + 0.2 * 1 / 6)
    assert in_domain_metrics(t, run(t, [[g, g]]))["success"] == 0.0


def test_chain_rewards_and_process():
    t = task_of("flight_book")
    (a,), (b,) = t.gold
    full = run(t, [[a], [b]], t.reference_answer)
    assert execution_reward(t, full).total == approx(1.0)
    assert summary_reward(t, full, t.reference_answer).total == approx(1.0)
    half = run(t, [[a]])
    m = in_domain_metrics(t, half)
    assert m["process"] == 0.5 and m["success"] == 0.0
    guessed = ToolCall("book_flight", {"flight_id": "FL000", "passenger": b.arguments["passenger"]})
    one_turn = run(t, [[a, guessed]])  # books before seeing the search result
    r = execution_reward(t, one_turn)
    assert r.components["arg_match"] == approx((1 + 0.5) / 2) and r.components["efficiency"] == 1.0
    assert in_domain_metrics(t, one_turn)["process"] == 0.5


# ------------------------------------------------------------------ the cascade's weights


def test_the_weights_are_the_cascade_order_and_sum_to_one():
    assert list(EXECUTION_WEIGHTS) == ["format", "name_f1", "arg_match", "success", "efficiency"]
    assert sum(EXECUTION_WEIGHTS.values()) == approx(1.0)


def test_custom_weights_weigh_the_gated_tiers():
    """All weight on the first tier pays format alone; all weight on the last pays the product of every tier."""
    t = task_of("weather2")
    a, _ = t.gold[0]
    turns = run(t, [[a]])  # half the parallel step: every component below 1 except format, success, efficiency
    comp = execution_reward(t, turns).components
    only = {k: 0.0 for k in EXECUTION_WEIGHTS}
    assert execution_reward(t, turns, weights={**only, "format": 1.0}).total == approx(comp["format"])
    assert execution_reward(t, turns, weights={**only, "efficiency": 1.0}).total == approx(math.prod(comp.values()))


@pytest.mark.parametrize("weights", [
    {**EXECUTION_WEIGHTS, "format": 0.2},  # sums to 1.1
    {**EXECUTION_WEIGHTS, "format": -0.1, "name_f1": 0.4},  # negative
    {**EXECUTION_WEIGHTS, "extra": 0.0},  # an unknown key
])
def test_bad_weights_are_refused(weights):
    with pytest.raises(ValueError, match="weights must be non-negative"):
        execution_reward(task_of("weather"), [], weights=weights)


# ------------------------------------------------------------------ in-domain metrics, split, eval scores


def test_process_counts_gold_steps_completed_in_order():
    """A chain's calls made in reverse order: every call made and executed (success), but only the first gold
    step is completed before the second (process 1/2)."""
    t = task_of("flight_book")
    (a,), (b,) = t.gold
    ok = ToolResult(ok=True, content={})
    reverse = [tool_turn([b], [ok]), tool_turn([a], [ok])]
    m = in_domain_metrics(t, reverse)
    assert m["success"] == 1.0 and m["process"] == 0.5
    assert in_domain_metrics(t, [tool_turn([a], [ok]), tool_turn([b], [ok])])["process"] == 1.0


def test_parallel_split_flags_a_parallel_step_sent_over_several_turns():
    t = task_of("weather2")
    a, b = t.gold[0]
    assert parallel_split(t, run(t, [[a, b]], "done")) == 0.0
    assert parallel_split(t, run(t, [[a], [b]], "done")) == 1.0
    single = task_of("weather")
    assert math.isnan(parallel_split(single, run(single, single.gold)))  # no parallel step: nothing to split
    assert math.isnan(parallel_split(task_of("add"), [answer("12")]))


def test_eval_scores_names_and_parse_ok():
    par = task_of("weather2")
    scores = eval_scores(par, run(par, par.gold, par.reference_answer), final_text=par.reference_answer)
    assert list(scores) == list(EVAL_SCORES) and all(v == 1.0 for k, v in scores.items() if k != "parallel_split")
    assert scores["parallel_split"] == 0.0
    single = task_of("weather")
    (g,) = single.gold[0]
    # no parallel step: no split figure; no final text: no paper_success
    assert list(eval_scores(single, run(single, single.gold))) == [k for k in EVAL_SCORES if k not in ("parallel_split", "paper_success")]
    chatty = [tool_turn([g], [ToolResult(ok=True, content={})], errors=[ParseError("text_around_calls", "text outside")])]
    s = eval_scores(single, chatty)
    assert s["parse_ok"] == 0.0 and s["success"] == 1.0  # any parse error, blocking or not
