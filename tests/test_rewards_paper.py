"""The authors' reward (slca.rewards.paper): hand-computed cases of every component and edge, their
reward_fn.py's own smoke cases, the judge against a real loopback server, the trainer preset."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from slca import metrics as M
from slca.rewards import Unscorable, eval_scores, score_batch, summary_reward
from slca.rewards import paper as P
from slca.rewards.execution import EVAL_SCORES
from slca.types import ParsedTurn, ParseError, Task, ToolCall, ToolResult, Trajectory, Turn

from _helpers import answer_turn, approx, tool_turn

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
G = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}}
ANSWER = "Seattle is sunny today with a temperature of 25 degrees."
BAD_JSON = ParseError("invalid_json", "tool call is not valid JSON", "<tool_call>{")


def call(name: str, **args) -> ToolCall:
    return ToolCall(name, args)


def weather(city: str) -> ToolCall:
    return call("get_weather", city=city)


def task(gold: list[list[ToolCall]], tools=(WEATHER, F, G), question: str = "What is the weather in Seattle?") -> Task:
    return Task("t", [{"role": "user", "content": question}], list(tools), gold=gold)


def turn(*calls: ToolCall, results=None, errors=()) -> Turn:
    """One tool turn (one <tool_call> block): its calls, each answered ok unless ``results`` says otherwise."""
    return tool_turn(calls, [ToolResult(True, {"ok": 1}) for _ in calls] if results is None else results, errors)


def traj(t: Task, turns: list[Turn], final: str = "") -> Trajectory:
    return Trajectory(task=t, prompt_ids=[], response_ids=[], model_mask=[], logprobs=[], turns=turns, final_text=final,
                      stop_reason="final_answer")


class FakeJudge:
    """A Judge (the protocol) that returns a fixed score and counts its calls."""

    def __init__(self, score: float | Exception):
        self.value, self.calls = score, 0

    def score(self, task, turns, final_text):
        self.calls += 1
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


# ------------------------------------------------------------------ their smoke cases (reward_fn.py, test_reward_function)

SEATTLE = task([[weather("Seattle")]])


def test_smoke_full_match_with_a_tool_response():
    """Their test 1: one correct call, a tool response, a full answer. Process 1 on every component; the
    summary is the judge's rating (their run had the judge off, summary 0: score 1.0, norm 0.5)."""
    turns = [turn(weather("Seattle"), results=[ToolResult(True, {"temperature": 25, "weather": "sunny"})]), answer_turn(ANSWER)]
    e = P.paper_process_score(SEATTLE, turns)
    assert e.total == approx(1.0) and e.components == {"format": 1.0, "name_f1": 1.0, "key_match": 1.0, "value_match": 1.0,
                                                         "parallel": 1.0, "no_call": 0.0}
    good = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=FakeJudge(0.75))
    assert good.total == 0.75 and good.components["rule_stand_in"] == 0.0
    assert P.paper_total(e, good) == approx(1.75) and P.paper_score_norm(e, good) == approx(0.875)
    assert P.paper_success(SEATTLE, turns, ANSWER, judge=FakeJudge(0.75)) == 0.0  # 0.875 < 0.9
    assert P.paper_success(SEATTLE, turns, ANSWER, judge=FakeJudge(1.0)) == 1.0
    off = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=FakeJudge(0.0))  # as their judge-off run
    assert P.paper_total(e, off) == approx(1.0) and P.paper_score_norm(e, off) == approx(0.5)


def test_smoke_missing_tool_response_gives_summary_zero():
    """Their test 2: the same call with no tool response: summary 0 before any judge is asked."""
    judge = FakeJudge(1.0)
    turns = [turn(weather("Seattle"), results=[]), answer_turn(ANSWER)]
    assert P.paper_process_score(SEATTLE, turns).total == approx(1.0)
    s = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=judge)
    assert s.total == 0.0 and s.components["no_tool_response"] == 1.0 and judge.calls == 0


def test_smoke_parallel_calls_in_one_block():
    """Their test 3: two parallel calls in one block (one turn): parallel 1, process 1. Sent one per turn,
    the first block holds 1 call where the first gold step has 2: parallel 0, process 0.7."""
    t = task([[weather("Seattle"), weather("Boston")]], question="weather")
    one = [turn(weather("Seattle"), weather("Boston")), answer_turn("Seattle 25 degrees, Boston 28 degrees.")]
    e = P.paper_process_score(t, one)
    assert e.total == approx(1.0) and e.components["parallel"] == 1.0
    split = [turn(weather("Seattle")), turn(weather("Boston")), answer_turn("Seattle 25 degrees, Boston 28 degrees.")]
    e = P.paper_process_score(t, split)
    assert e.components["parallel"] == 0.0 and e.components["format"] == 1.0 and e.total == approx(0.7)


# ------------------------------------------------------------------ process components


@pytest.mark.parametrize("pred,gold,equal", [
    (10, "10", True), ("10", 10.0, True), (10, 10.0, True), ("true", True, True), (True, "1", True), ("0", False, True),
    ("false", True, False), (" Seattle ", "seattle", True), (None, None, True), (None, "None", False), ("None", None, False),
    ({"b": 2, "a": 1}, {"a": 1, "b": 2}, True), ([1, 2], [2, 1], False), ("yes", True, False), ("10.5", 10.4, False),
])
def test_loose_equal(pred, gold, equal):
    assert P.loose_equal(pred, gold) is equal


def test_format_is_valid_blocks_over_tool_turns_and_invalid_blocks_count_nowhere():
    """A turn with a blocking parse error, or calling a tool not offered, is an invalid block: its calls
    are not in P (so name F1 and the first block ignore them)."""
    t = task([[call("f", a=1)]])
    turns = [turn(call("nope")), turn(call("f", a=1), errors=[BAD_JSON]), turn(call("f", a=1)), answer_turn(ANSWER)]
    e = P.paper_process_score(t, turns)
    c = e.components
    assert c["format"] == approx(1 / 3) and c["name_f1"] == 1.0 and c["parallel"] == 1.0  # first valid block: 1 call
    assert e.total == approx(0.1 / 3 + 0.25 + 0.15 + 0.2 + 0.3)
    # text around the calls is not a blocking error: the block is valid
    chatty = turn(call("f", a=1), errors=[ParseError("text_around_calls", "text outside")])
    assert P.paper_process_score(t, [chatty]).components["format"] == 1.0


def test_greedy_pairing_in_gold_order():
    """Each gold call with arguments, in gold order, takes the unused same-name call with the highest key + value.
    gold f(a=1) takes f(a=1, b=2) (key 1/2 + value 1 > f(a=5): key 1 + value 0), leaving f(a=5) to gold
    f(a=1, b=2): key 1/2, value 0. So key = (1/2 + 1/2) / 2, value = (1 + 0) / 2 (the other pairing: key 1, value 1/2)."""
    t = task([[call("f", a=1), call("f", a=1, b=2)]])
    e = P.paper_process_score(t, [turn(call("f", a=1, b=2), call("f", a=5))])
    assert e.components["key_match"] == approx(0.5) and e.components["value_match"] == approx(0.5)
    assert e.components["name_f1"] == 1.0 and e.components["parallel"] == 1.0


def test_pairing_edges():
    # a candidate scoring 0 is not taken: it stays for a later gold call
    t = task([[call("f", x=1), call("f", y=2)]])
    c = P.paper_process_score(t, [turn(call("f", y=2))]).components
    assert c["key_match"] == approx(0.5) and c["value_match"] == approx(0.5) and c["name_f1"] == approx(2 / 3)
    # values count over the gold keys: f(a=1, c=9) for gold f(a=1, b=2): key 1/3, value 1/2
    c = P.paper_process_score(task([[call("f", a=1, b=2)]]), [turn(call("f", a=1, c=9))]).components
    assert c["key_match"] == approx(1 / 3) and c["value_match"] == approx(0.5)
    # loose values: 10 == "10", "true" == True
    c = P.paper_process_score(task([[call("f", n=10, flag=True)]]), [turn(call("f", n="10", flag="true"))]).components
    assert c["key_match"] == 1.0 and c["value_match"] == 1.0
    # gold calls without arguments are left out of key / value (1 when none has any); name F1 counts them
    c = P.paper_process_score(task([[call("g"), call("f", a=1)]]), [turn(call("f", a=1))]).components
    assert c["key_match"] == 1.0 and c["value_match"] == 1.0 and c["name_f1"] == approx(2 / 3) and c["parallel"] == 0.0
    c = P.paper_process_score(task([[call("g")]]), [turn(call("f", a=1))]).components
    assert c["key_match"] == 1.0 and c["value_match"] == 1.0 and c["name_f1"] == 0.0
    # a call without arguments for a gold call with some: key 0, value 0
    c = P.paper_process_score(task([[call("f", a=1)]]), [turn(call("f"))]).components
    assert c["key_match"] == 0.0 and c["value_match"] == 0.0


def test_a_malformed_attempt_is_not_the_no_call_path():
    """A turn whose only call failed to parse is an attempt (a tag was written): no penalty; process 0."""
    t = task([[call("f", a=1)]])
    turns = [Turn("<tool_call>{", ParsedTurn(errors=[BAD_JSON]), [ToolResult(False, error="bad json")]), answer_turn(ANSWER)]
    e = P.paper_process_score(t, turns)
    assert e.total == 0.0 and e.components["no_call"] == 0.0 and e.components["parallel"] == 0.0
    assert P.paper_inputs(t, turns)["should_no_call"] == 0.0


def test_tasks_without_gold_calls():
    """No gold call, no call made: format 0 (no tag), name F1 1, key / value 1, parallel 1 (0 == 0): process 0.9;
    summary 0 (no tool response), so their Success can never be reached on such a task. A call made: format 1,
    name 0, key / value 1, parallel 0: 0.45."""
    t = task([])
    none = [answer_turn("No tool is needed: 7 plus 5 is 12.")]
    assert P.paper_process_score(t, none).total == approx(0.9)
    s = P.paper_summary_score(t, none, none[0].text)
    assert s.total == 0.0 and s.components["no_tool_response"] == 1.0
    assert P.paper_success(t, none, none[0].text) == 0.0
    assert P.paper_process_score(t, [turn(call("f")), answer_turn(ANSWER)]).total == approx(0.45)


# ------------------------------------------------------------------ the no-call penalty, the summary gates


def test_no_call_penalty_sums_to_their_score():
    judge = FakeJudge(1.0)
    turns = [answer_turn("It is probably sunny in Seattle today.")]
    e = P.paper_process_score(SEATTLE, turns)
    s = P.paper_summary_score(SEATTLE, turns, turns[0].text, judge=judge)
    assert e.total == P.NO_CALL_PENALTY == -0.5 and e.components["no_call"] == 1.0
    assert all(v == 0.0 for k, v in e.components.items() if k != "no_call")
    assert s.total == 0.0 and all(v == 0.0 for v in s.components.values()) and judge.calls == 0
    assert P.paper_total(e, s) == -0.5 and P.paper_score_norm(e, s) == 0.0  # clamped at 0
    assert P.paper_success(SEATTLE, turns, turns[0].text) == 0.0
    assert P.paper_inputs(SEATTLE, turns) == {"should_no_call": 1.0, "toolpo_correct_ratio": 0.0, "rltr_comp": 0.0,
                                              "rltr_repeat_penalty": 0.0, "rltr_error_penalty": 0.0, "rltr_format_valid": 0.0}


@pytest.mark.parametrize("final,short", [("Done.", True), ("123456789", True), ("   12345678   ", True), ("1234567890", False)])
def test_a_final_response_under_10_characters_scores_zero(final, short):
    judge = FakeJudge(1.0)
    turns = [turn(weather("Seattle")), answer_turn(final)]
    s = P.paper_summary_score(SEATTLE, turns, final, judge=judge)
    assert s.components["short_answer"] == float(short) and s.total == (0.0 if short else 1.0) and judge.calls == (0 if short else 1)


def test_without_a_judge_the_rule_tier_stands_in():
    turns = [turn(weather("Seattle"), results=[ToolResult(True, {"temperature": 25, "weather": "sunny"})]), answer_turn(ANSWER)]
    s = P.paper_summary_score(SEATTLE, turns, ANSWER)
    assert s.components["rule_stand_in"] == 1.0 and s.total == summary_reward(SEATTLE, turns, ANSWER).total
    assert s.components["response_quality"] == s.total


def test_a_failed_judge_is_nan_or_their_failure_score(caplog):
    turns = [turn(weather("Seattle")), answer_turn(ANSWER)]
    with caplog.at_level(logging.WARNING, logger="slca.rewards"):
        s = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=FakeJudge(Unscorable("endpoint down")))
    assert math.isnan(s.total) and "judge failed: endpoint down" in s.reason and s.components["judge_failed"] == 1.0
    assert any("NaN" in r.message for r in caplog.records)
    s = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=FakeJudge(Unscorable("x")), judge_failure_score=0.0)
    assert s.total == 0.0 and s.components["judge_failed"] == 1.0
    with pytest.raises(ValueError, match="expected a score in"):
        P.paper_summary_score(SEATTLE, turns, ANSWER, judge=FakeJudge(4.0))
    with pytest.raises(ValueError, match="judge_failure_score"):
        P.paper_summary_score(SEATTLE, turns, ANSWER, judge_failure_score=math.nan)


def test_a_task_without_tools_cannot_be_scored():
    t = task([[weather("Seattle")]], tools=())
    turns = [turn(weather("Seattle")), answer_turn(ANSWER)]
    e, s = P.paper_rewards(traj(t, turns, ANSWER))
    assert math.isnan(e.total) and "offers no tools" in e.reason and math.isnan(s.total)
    assert all(math.isnan(v) for v in P.paper_inputs(t, turns).values())
    assert math.isnan(P.paper_success(t, turns, ANSWER))


# ------------------------------------------------------------------ their judge


def test_parse_rating():
    assert P.parse_rating("<response><response_quality><reasoning>ok</reasoning><rating> Very Poor </rating>"
                          "</response_quality></response>") == "very poor"
    assert P.parse_rating("<RESPONSE_QUALITY>\n<rating>good</rating>\n</RESPONSE_QUALITY>") == "good"
    assert P.parse_rating("<response_quality><rating>great</rating></response_quality>") is None
    assert P.parse_rating("<rating>good</rating>") is None  # outside <response_quality>
    assert [(r - 1) / 4 for r in P.RATINGS.values()] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_paper_judge_on_a_loopback_server(judge_server):
    url, replies, seen = judge_server
    reply = "<response>\n  <response_quality>\n    <reasoning>Uses the result.</reasoning>\n    <rating>Good</rating>\n  </response_quality>\n</response>"
    replies += [("content", reply)]
    judge = P.PaperJudge(url, "judge-model")
    turns = [turn(weather("Seattle"), results=[ToolResult(True, {"temperature": 25, "weather": "sunny"})]), answer_turn(ANSWER)]
    s = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=judge)
    assert s.total == 0.75 and s.components["rule_stand_in"] == 0.0
    (body,) = seen
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and len(body["messages"]) == 1
    msg = body["messages"][0]
    assert msg["role"] == "user" and msg["content"] == P.paper_judge_messages(SEATTLE, turns, ANSWER)[0]["content"]
    assert "```\nWhat is the weather in Seattle?\n```" in msg["content"] and f"```\n{ANSWER}\n```" in msg["content"]
    assert '[Tool Response 1]\n{"temperature": 25, "weather": "sunny"}' in msg["content"]
    assert "<rating><!-- one of: very poor, poor, acceptable, good, excellent --></rating>" in msg["content"]
    # a reply without a rating is not asked again (max_retries 0): NaN with the reason, or their failure score
    replies += [("content", "It is good."), ("content", "<rating>good</rating>")]
    s = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=judge)
    assert math.isnan(s.total) and "has no rating" in s.reason and judge.metrics["invalid_output"] == 1
    s = P.paper_summary_score(SEATTLE, turns, ANSWER, judge=judge, judge_failure_score=0.0)
    assert s.total == 0.0 and s.components["judge_failed"] == 1.0 and len(seen) == 3


# ------------------------------------------------------------------ the baselines' estimator inputs


def _inputs(t: Task, turns: list[Turn]) -> dict[str, float]:
    tr = [traj(t, turns, ANSWER)]
    out = {}
    for name in ("should_no_call", "toolpo_correct_ratio", "rltr_comp", "rltr_repeat_penalty", "rltr_error_penalty", "rltr_format_valid"):
        v = getattr(P, name)(tr)
        assert v.shape == (1,) and v.dtype == torch.float32
        out[name] = float(v[0])
    assert out == pytest.approx(P.paper_inputs(t, turns), nan_ok=True)
    return out


def test_toolpo_correct_ratio_is_a_strict_one_to_one_match():
    t = task([[call("f", a=1, b="x"), call("f", a=2)]])
    assert _inputs(t, [turn(call("f", a="1", b=" X ", c=0), call("f", a=2.0))])["toolpo_correct_ratio"] == 1.0  # extra keys allowed
    assert _inputs(t, [turn(call("f", a=1), call("f", a=2))])["toolpo_correct_ratio"] == 0.5  # gold key b missing
    assert _inputs(task([[call("f", a=1), call("f", a=1)]]), [turn(call("f", a=1))])["toolpo_correct_ratio"] == 0.5  # one to one
    assert _inputs(task([[call("g")]]), [turn(call("g"))])["toolpo_correct_ratio"] == 1.0  # no arguments: the name alone
    assert _inputs(task([]), [answer_turn(ANSWER)])["toolpo_correct_ratio"] == 1.0  # no gold call
    malformed = [Turn("<tool_call>{", ParsedTurn(errors=[BAD_JSON]), [ToolResult(False, error="x")])]
    assert _inputs(t, malformed)["toolpo_correct_ratio"] == 0.0  # no (valid) prediction


def test_rltr_terms():
    t = task([[call("f", a=1)], [call("g")]])
    good = _inputs(t, [turn(call("f", a=1)), turn(call("g")), answer_turn(ANSWER)])
    assert good == {"should_no_call": 0.0, "toolpo_correct_ratio": 1.0, "rltr_comp": 1.0, "rltr_repeat_penalty": 0.0,
                    "rltr_error_penalty": 0.0, "rltr_format_valid": 1.0}
    # consecutive repeats (same name, equal arguments), within a turn and across turns; g() in between breaks a run
    rep = _inputs(t, [turn(call("f", a=1), call("f", a=1)), turn(call("f", a=1)), turn(call("g")), turn(call("f", a=1))])
    assert rep["rltr_repeat_penalty"] == pytest.approx(-0.2) and rep["rltr_comp"] == 1.0
    # invalid blocks: a malformed turn, a tool not offered
    bad = _inputs(t, [turn(call("f", a=1), errors=[BAD_JSON]), turn(call("nope")), turn(call("f", a=1))])
    assert bad["rltr_error_penalty"] == pytest.approx(-0.4) and bad["rltr_format_valid"] == 0.0 and bad["rltr_comp"] == 0.0  # g never made
    assert _inputs(task([]), [answer_turn(ANSWER)])["rltr_format_valid"] == 1.0  # no block: valid


def test_estimator_inputs_of_a_batch_keep_their_rows_and_nan():
    rows = [traj(SEATTLE, [answer_turn(ANSWER)], ANSWER), traj(task([[weather("Seattle")]], tools=()), [turn(weather("Seattle"))], ""),
            traj(SEATTLE, [turn(weather("Seattle")), answer_turn(ANSWER)], ANSWER)]
    out = P.should_no_call(rows)
    assert out.shape == (3,) and out[0] == 1.0 and math.isnan(out[1]) and out[2] == 0.0
    assert P.rltr_comp(rows)[2] == 1.0 and P.toolpo_correct_ratio([]).shape == (0,)


# ------------------------------------------------------------------ the preset: score_batch, evaluation, the trainer


def test_score_batch_paper_preset():
    rows = [traj(SEATTLE, [answer_turn("It is sunny, I think.")], "It is sunny, I think."),
            traj(SEATTLE, [turn(weather("Seattle")), answer_turn(ANSWER)], ANSWER)]
    sb = score_batch(rows, reward="paper")
    assert sb.tool.tolist() == [-0.5, 1.0] and sb.summary[0] == 0.0
    assert sb.components.execution["no_call"] == [1.0, 0.0] and sb.components.summary["rule_stand_in"] == [0.0, 1.0]
    assert "key_match" in sb.components.execution and "arg_match" not in sb.components.execution
    assert "arg_match" in score_batch(rows).components.execution  # the default is slca's
    with pytest.raises(ValueError, match=r"reward 'nope': one of \['slca', 'paper'\], or your function"):
        score_batch(rows, reward="nope")


def test_eval_scores_add_paper_success_beside_success():
    turns = [turn(weather("Seattle"), results=[ToolResult(True, {"temperature": 25, "weather": "sunny"})]), answer_turn(ANSWER)]
    plain = eval_scores(SEATTLE, turns)
    both = eval_scores(SEATTLE, turns, final_text=ANSWER)
    assert "paper_success" not in plain and both == {**plain, "paper_success": P.paper_success(SEATTLE, turns, ANSWER)}
    assert list(both) == [k for k in EVAL_SCORES if k != "parallel_split"] and both["paper_success"] == 1.0
    assert M.EVAL_IN_DOMAIN["paper_success"].key(set="eval") == "eval/paper_success"
    assert M.metric_range("reward/tool")[0] == P.NO_CALL_PENALTY  # the paper preset's tool tier reaches -0.5


@pytest.mark.slow
def test_trainer_one_step_with_the_paper_reward(tmp_path):
    from recipes.warmstart.build import make_model
    from recipes.warmstart.config import ModelSize
    from recipes.warmstart.tokenizer import train_tokenizer

    from slca.env import toolworld
    from slca.training.config import TrainConfig, validate
    from slca.training.trainer import train

    tasks = toolworld.make_tasks("train", n=12, seed=0)
    tok = train_tokenizer([m["content"] for t in tasks for m in t.messages] * 3 + [json.dumps(t.tools) for t in tasks[:3]], vocab_size=400)
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "run"), reward="paper", steps=1, tasks_per_step=2, group_size=2, max_turns=1,
                               max_new_tokens=8, minibatches=1, eval_tasks=2, save_every=0, sample_html_every=0, diag_every=0,
                               report_to=["none"], ood_splits=["none"]))
    tiny = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                     max_position_embeddings=1024)
    train(cfg, model=make_model(tiny, tok, seed=0), tokenizer=tok, train_tasks=tasks, eval_tasks=toolworld.make_tasks("test", n=2, seed=0),
          make_env=lambda t: toolworld.make_env(t, seed=0))
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["reward"] == "paper"
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert {"reward/exec/key_match", "reward/exec/parallel", "reward/exec/no_call", "reward/summary/rule_stand_in"} <= set(row)
    assert "reward/exec/arg_match" not in row and -0.5 <= row["reward/tool"] <= 1.0
    assert 0.0 <= row["eval/paper_success"] <= 1.0 and 0.0 <= row["eval/success"] <= 1.0
