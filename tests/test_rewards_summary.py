"""Summary tier of the hierarchical rewards (slca.rewards.summary): facts, evidence, concision, the judge and
the claims of an answer (entities swapped for others: test_rewards_entities.py)."""

from __future__ import annotations

import math

import pytest

from slca.env import toolworld as tw
from slca.rewards import Unscorable, summary_reward
from slca.rewards.summary import REFUSAL_MARKERS, SUMMARY_WEIGHTS, AnswerClaims, answer_claims
from slca.types import Task, ToolCall, ToolResult

from _helpers import answer_turn as answer
from _helpers import run_steps as run
from _helpers import approx, task_of, tool_turn


STOCK = {
    "type": "function",
    "function": {"name": "get_price", "description": "Latest price of a stock in USD.",
                 "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]}},
}


def _stock_task(**kw) -> Task:
    return Task(id="s", messages=[{"role": "user", "content": "What does ACME trade at?"}], tools=[STOCK],
                gold=[[ToolCall("get_price", {"ticker": "ACME"})]], **kw)


# ------------------------------------------------------------------ summary tiers


def test_summary_wrong_categorical_value_is_a_hallucination():
    t = task_of("weather")
    env_result = tw.run_gold(t)[0][0].content
    other = next(c for c in tw.CONDITIONS if c != env_result["condition"])
    text = f"It is {env_result['temp_c']} C and {other} in {env_result['city']}."
    s = summary_reward(t, run(t, t.gold), text)
    assert s.components == {"faithfulness": 1.0, "completeness": 0.5, "no_hallucination": 0.0, "concision": 1.0}
    assert s.total == approx(0.3 + 0.2 + 0.1)


def test_summary_values_only_count_when_the_rollout_saw_them():
    """A value stated without the tool call that produces it is unsupported, even when it is right."""
    t = task_of("stock")
    ref = t.reference_answer
    no_call = summary_reward(t, [answer(ref)], ref)  # "AAPL trades at 123 USD.": the ticker is the user's, 123 and USD are not seen
    claims = answer_claims(t, [answer(ref)], ref)
    assert claims.unsupported == {"num:" + t.answer_facts[0], "ent:usd"} and claims.entities - claims.unsupported == {"ent:" + t.meta["entities"][0].lower()}
    assert no_call.components["faithfulness"] == approx(1 / 3) and no_call.components["no_hallucination"] == 0.0
    assert no_call.components["completeness"] == 1.0
    wrong_price = ref.replace(t.answer_facts[0], str(int(t.answer_facts[0]) + 3))
    s = summary_reward(t, run(t, t.gold, wrong_price), wrong_price)
    assert s.components["completeness"] == 0.0 and s.components["faithfulness"] < 1.0


def test_concision():
    t = task_of("weather")
    ref = t.reference_answer
    budget = max(12, 2 * len(ref.split()))
    long = ref + " " + " ".join(["really"] * (2 * budget))
    n = len(long.split())
    s = summary_reward(t, run(t, t.gold), long)
    assert s.components["concision"] == approx(max(0.0, 1 - (n - budget) / (2 * budget)))
    assert s.total < summary_reward(t, run(t, t.gold), ref).total


def test_empty_summary_scores_zero():
    t = task_of("weather")
    s = summary_reward(t, run(t, t.gold), "   ")
    assert s.total == 0.0 and s.reason is None


def test_judge_mixes_in():
    t = task_of("weather")
    ref = t.reference_answer

    class Fixed:
        def score(self, task, turns, final_text):
            return 0.0

    s = summary_reward(t, run(t, t.gold), ref, judge=Fixed(), judge_weight=0.25)
    assert s.components["judge"] == 0.0 and s.total == approx(0.75)


# ------------------------------------------------------------------ evidence


def test_only_a_successful_result_is_evidence():
    t = _stock_task()
    call = ToolCall("get_price", {"ticker": "ACME"})
    text = "ACME trades at 31.5 USD."
    seen = answer_claims(t, [tool_turn([call], [ToolResult(ok=True, content={"price": 31.5})])], text)
    assert seen.unsupported == set() and seen.values == {"num:31.5"}
    failed = answer_claims(t, [tool_turn([call], [ToolResult(ok=False, content={"price": 31.5}, error="boom")])], text)
    assert "num:31.5" in failed.unsupported


def test_a_called_tools_description_is_evidence_an_uncalled_ones_is_not():
    """"USD" is in get_price's description: supported once get_price answered, not before."""
    t = _stock_task()
    text = "ACME trades at 31.5 USD."
    called = answer_claims(t, [tool_turn([ToolCall("get_price", {"ticker": "ACME"})], [ToolResult(ok=True, content=31.5)])], text)
    assert "ent:usd" not in called.unsupported
    assert "ent:usd" in answer_claims(t, [], text).unsupported


def test_answer_claims_raises_unscorable_on_an_unanswered_call():
    t = _stock_task()
    with pytest.raises(Unscorable, match="1 calls but 0 results"):
        answer_claims(t, [tool_turn([ToolCall("get_price", {"ticker": "ACME"})])], "ACME is 3.")


def test_claim_counts():
    c = AnswerClaims(values=frozenset({"num:3"}), entities=frozenset({"ent:paris"}), unsupported=frozenset({"ent:paris"}),
                     misreported=(("get_weather", ("Rome",)),), categorical=frozenset())
    assert (c.n_claims, c.n_wrong, c.wrong_entity) == (3, 2, True)
    only_value = AnswerClaims(frozenset({"num:3"}), frozenset(), frozenset({"num:3"}), (), frozenset())
    assert (only_value.n_claims, only_value.n_wrong, only_value.wrong_entity) == (1, 1, False)


# ------------------------------------------------------------------ completeness and concision


def test_refusal_follows_task_refusal_not_only_the_kind():
    assert SUMMARY_WEIGHTS == {"faithfulness": 0.3, "completeness": 0.4, "no_hallucination": 0.2, "concision": 0.1}
    no = "Sorry, I cannot do that."
    assert any(m in no.casefold() for m in REFUSAL_MARKERS)
    refuse = Task(id="r", messages=[{"role": "user", "content": "Book me a taxi."}], tools=[], kind="single", refusal=True)
    assert summary_reward(refuse, [answer(no)], no).components["completeness"] == 1.0
    assert summary_reward(refuse, [answer("Done.")], "Done.").components["completeness"] == 0.0
    serve = Task(id="u", messages=[{"role": "user", "content": "Hi."}], tools=[], kind="unservable", refusal=False)
    assert summary_reward(serve, [answer("Hello.")], "Hello.").components["completeness"] == 1.0  # no facts: any answer


def test_concision_budget_without_a_reference_answer():
    """B = 12 + 8 * #facts without a reference answer: full marks up to B words, 0 from 3B on."""
    t = Task(id="c", messages=[{"role": "user", "content": "Say hi."}], tools=[], kind="no_tool", answer_facts=["hi"])
    budget = 20
    for n, want in ((budget, 1.0), (3 * budget, 0.0), (4 * budget, 0.0)):
        text = " ".join(["hi"] * n)
        assert summary_reward(t, [answer(text)], text).components["concision"] == approx(want), n


# ------------------------------------------------------------------ the judge


class _Judge:
    def __init__(self, value):
        self.value = value

    def score(self, task, turns, final_text):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_a_judge_that_cannot_score_makes_the_reward_nan_with_its_reason():
    t = task_of("weather")
    s = summary_reward(t, run(t, t.gold), t.reference_answer, judge=_Judge(Unscorable("endpoint down")))
    assert math.isnan(s.total) and math.isnan(s.components["judge"]) and "judge failed: endpoint down" in s.reason
    assert s.components["faithfulness"] == 1.0  # the rule-based components are kept


def test_a_judge_score_out_of_range_and_a_bad_weight_are_refused():
    t = task_of("weather")
    turns = run(t, t.gold)
    with pytest.raises(ValueError, match="judge returned 1.5"):
        summary_reward(t, turns, t.reference_answer, judge=_Judge(1.5))
    with pytest.raises(ValueError, match="judge_weight must be in"):
        summary_reward(t, turns, t.reference_answer, judge=_Judge(1.0), judge_weight=1.5)
    empty = summary_reward(t, turns, "  ", judge=_Judge(1.0))
    assert empty.total == 0.0 and empty.components["judge"] == 0.0  # an empty answer scores 0, the judge is not asked
