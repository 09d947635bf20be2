"""The summary tier notices an answer about the wrong entity (issue 32), and the mutation table of both tiers.

An entity the answer names must be supported by the request or a successful
tool result (not by what a tool's schema merely offers); a call the answer
reports must name what the user asked about. scripts/reward_mutations.py
measures every mistake kind on toolworld; the test runs it on a smaller sample.
(Entity extraction and support themselves: test_rewards_values.py.)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from slca.env import toolworld as tw
from slca.env.loaders import load_tasks
from slca.rewards import summary_reward
from slca.rewards.summary import answer_claims
from slca.types import ParsedTurn, Task, ToolCall, ToolResult, Turn

from _helpers import reference_summary

ROOT = Path(__file__).resolve().parents[1]
TASKS = tw.make_tasks("train", n=400, seed=5)


def task_of(task_type: str, split_tasks: list[Task] = TASKS) -> Task:
    return next(t for t in split_tasks if t.meta["task_type"] == task_type)


def answer(text: str) -> Turn:
    return Turn(text=text, parsed=ParsedTurn(content=text))


def gold_rollout(t: Task) -> list[Turn]:
    env = tw.make_env(t)
    return [Turn(text="<calls>", parsed=ParsedTurn(calls=list(s)), results=[env.call(c.name, c.arguments) for c in s]) for s in t.gold]


def score(t: Task, text: str, turns: list[Turn] | None = None):
    turns = gold_rollout(t) if turns is None else turns
    return summary_reward(t, turns + [answer(text)], text), answer_claims(t, turns, text)


# ----------------------------------------------------------- the examples


def test_a_swapped_city_loses_faithfulness_and_no_hallucination():
    t = task_of("weather")
    ref, city = t.reference_answer, t.meta["entities"][0]
    other = next(c for c in tw._CITIES if c != city)
    gold, _ = score(t, ref)
    s, c = score(t, ref.replace(city, other))
    assert gold.total == pytest.approx(1.0)
    assert c.unsupported == {"ent:" + other.lower()} and c.wrong_entity
    assert s.components["faithfulness"] < 1.0 and s.components["no_hallucination"] == 0.0 and s.total < gold.total


def test_a_currency_the_schema_merely_offers_is_not_evidence():
    """"50 USD is 58.23 EUR." for "Convert 50 GBP to EUR.": USD is only in convert_currency's enum menu."""
    t = task_of("convert")
    ref = t.reference_answer
    src = ref.split()[1]
    other = next(c for c in tw.CURRENCIES if c not in t.messages[0]["content"])
    assert any(other in t_["function"]["parameters"]["properties"]["from_currency"]["enum"] for t_ in t.tools
               if t_["function"]["name"] == "convert_currency")
    s, c = score(t, ref.replace(src, other, 1))
    assert "ent:" + other.lower() in c.unsupported
    assert s.components["no_hallucination"] == 0.0 and s.total < score(t, ref)[0].total


def test_swapping_onto_another_entity_the_request_names_is_a_misreported_call():
    """"50 EUR is 58.23 EUR." for "Convert 50 GBP to EUR.": every word is supported, but the call is about GBP."""
    t = task_of("convert")
    ref = t.reference_answer
    src, dst = ref.split()[1], ref.split()[-1].rstrip(".")
    s, c = score(t, ref.replace(src, dst, 1))
    assert c.unsupported == set() and c.misreported == (("convert_currency", (src,)),)
    assert s.components["faithfulness"] < 1.0 and s.components["no_hallucination"] == 1.0
    assert s.total < score(t, ref)[0].total


def test_a_lower_case_title_swap_is_a_misreported_call():
    t = task_of("event")
    ref, title = t.reference_answer, t.meta["entities"][0]
    other = next(x for x in tw._TITLES if x != title and x not in ref)
    s, c = score(t, ref.replace(title, other))
    assert c.misreported == (("create_event", (title,)),) and c.wrong_entity
    assert s.components["faithfulness"] < 1.0 and s.total < score(t, ref)[0].total


def test_a_name_opening_the_sentence_is_caught_through_the_call_it_reports():
    hold = tw.make_tasks("heldout_tools", n=80, seed=5)
    t = task_of("population", hold)
    ref, city = t.reference_answer, t.meta["entities"][0]  # "Lima has 1234000 people."
    assert ref.startswith(city)
    other = next(c for c in tw._CITIES if c != city)
    s, c = score(t, ref.replace(city, other))
    assert c.unsupported == set() and c.misreported == (("get_population", (city,)),)
    assert s.total < score(t, ref)[0].total == pytest.approx(1.0)


def test_an_answer_that_does_not_say_what_it_reports_costs_faithfulness_only():
    """The rule cannot tell a left-out name from a swapped lower-case one: both cost faithfulness, not no_hallucination."""
    t = task_of("weather")
    r = tw.run_gold(t)[0][0].content
    s, c = score(t, f"It is {r['temp_c']} C and {r['condition']}.")
    assert c.misreported and not c.unsupported
    assert s.components["no_hallucination"] == 1.0 and s.components["faithfulness"] == pytest.approx(2 / 3)


def test_an_entity_only_a_wrong_call_returned_is_supported_by_that_result():
    """The summary tier checks the answer against what the rollout saw; the execution tier judges the call."""
    t = task_of("weather")
    (g,) = t.gold[0]
    other = next(c for c in tw._CITIES if c != g.arguments["city"])
    wrong = ToolCall("get_weather", {**g.arguments, "city": other})
    env = tw.make_env(t)
    turns = [Turn(text="<calls>", parsed=ParsedTurn(calls=[wrong]), results=[env.call(wrong.name, wrong.arguments)])]
    r = turns[0].results[0].content
    s, c = score(t, f"In {other} on {r['date']} it is {r['temp_c']} C and {r['condition']}.", turns)
    assert c.unsupported == set() and c.misreported == ()
    assert s.components["faithfulness"] == s.components["no_hallucination"] == 1.0  # completeness: the gold facts are not stated


def test_no_tool_and_unservable_answers_keep_their_scores():
    for name in ("greet", "add", "taxi", "email"):
        t = task_of(name)
        s, c = score(t, t.reference_answer, [])
        assert s.total == pytest.approx(1.0) and c.n_wrong == 0, (name, c)
    t = task_of("greet")
    other = next(p for p in tw._PEOPLE if p not in t.messages[0]["content"])
    s, c = score(t, f"Hello {other}! How can I help you today?", [])
    assert c.unsupported == {"ent:" + other.lower()} and s.total < 1.0


# ------------------------------------------------------------------- Toucan rows


def _toucan_rollout(t: Task) -> list[Turn]:
    res = iter(t.meta["gold_results"])
    return [Turn(text="<calls>", parsed=ParsedTurn(calls=list(s)), results=[ToolResult(ok=True, content=next(res)) for _ in s])
            for s in t.gold]


def test_toucan_rows_take_entities_from_the_request_and_results_not_the_schemas():
    rows = {t.id[-4:]: t for t in load_tasks(ROOT / "tests/fixtures/env/toucan_small.jsonl")}
    t = rows["a002"]  # "... its main competitors are Stripe and Adyen; Ana Ruiz is a staff engineer there."
    turns = _toucan_rollout(t)
    ref = t.reference_answer
    base = answer_claims(t, turns, ref)
    swapped = answer_claims(t, turns, ref.replace("Adyen", "Square"))
    assert swapped.unsupported - base.unsupported == {"ent:square"}
    t = rows["a003"]  # weather for Denver and Boston; get_alerts offers a two-letter state code it was never called for
    turns = _toucan_rollout(t)
    s = summary_reward(t, turns, "Denver is 18 today and Boston 12; no alerts in CO.")
    c = answer_claims(t, turns, "Denver is 18 today and Boston 12; no alerts in CO.")
    assert c.unsupported == {"ent:co"} and s.components["no_hallucination"] == 0.0
    c = answer_claims(t, turns, "Denver is 18 today and Austin 12.")
    assert c.unsupported == {"ent:austin"}


# --------------------------------------------------------------- the mutation table


def _load_script():
    spec = importlib.util.spec_from_file_location("reward_mutations", ROOT / "scripts" / "reward_mutations.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def table():
    return {r.name: r for r in _load_script().mutation_table(n=160, seed=5)}


def test_every_mutation_lowers_the_reward(table):
    """Every row above 0.95 (the wrong-unit row on flight tasks excepted: see the next test)."""
    assert len(table) == 11
    for name, r in table.items():
        assert r.cases >= 20, (name, r.cases)
        if name == "wrong unit or currency":
            continue
        assert r.share > 0.95, (name, r.share, r.misses)


def test_the_wrong_unit_row_misses_only_where_the_gold_currency_is_itself_unsupported(table):
    """On flight tasks no tool names the currency, so the gold "costs 314 USD" already pays for it and any other
    code is no worse (docs/environment.md); elsewhere the row is above 0.95."""
    r = table["wrong unit or currency"]
    flight_cases, flight_drops = r.by_type.get("flight", [0, 0])
    assert flight_cases > 0 and flight_drops == 0
    rest = (r.dropped - flight_drops) / (r.cases - flight_cases)
    assert rest > 0.95, (rest, r.misses)
    for m in r.misses:
        if m["task_type"] == "flight":
            assert m["gold_reward"] == m["mutated_reward"] == pytest.approx(0.75), m


def test_the_table_is_deterministic():
    mod = _load_script()
    a = [(r.name, r.cases, r.dropped) for r in mod.mutation_table(n=40, seed=7)]
    b = [(r.name, r.cases, r.dropped) for r in mod.mutation_table(n=40, seed=7)]
    assert a == b


def test_the_gold_baseline_is_the_reference(table):
    r = table["refusal"]  # applies to every tool-needing task
    assert r.gold_sum / r.cases < 1.0  # flight references score 0.75
    for t in [t for t in tw.make_tasks("train", n=160, seed=5) if t.gold][:30]:
        s, _ = score(t, t.reference_answer)
        assert s.total == pytest.approx(reference_summary(t))
