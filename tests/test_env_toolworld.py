"""The built-in toolworld suite: tools, generator, splits, and the world it runs in."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from slca.env import PythonSimulator, toolworld as tw
from slca.types import Task

from _helpers import check_calls


@pytest.fixture(scope="module")
def train():
    return tw.make_tasks("train", n=1500, seed=0)


@pytest.fixture(scope="module")
def test():
    return tw.make_tasks("test", n=600, seed=0)


@pytest.fixture(scope="module")
def heldout():
    return tw.make_tasks("heldout_tools", n=200, seed=0)


def _names(tools):
    return {t["function"]["name"] for t in tools}


def test_tool_inventory():
    domains = Counter(t["function"]["x-domain"] for t in tw.TOOLS)
    assert len(tw.TOOLS) >= 10 and len(domains) >= 4
    assert not _names(tw.TOOLS) & _names(tw.HELDOUT_TOOLS)
    assert not {t["function"]["x-domain"] for t in tw.HELDOUT_TOOLS} & set(domains)


def test_generator_is_deterministic_and_seeded():
    a, b = tw.make_tasks("train", n=50, seed=3), tw.make_tasks("train", n=50, seed=3)
    assert [(t.messages, t.gold, t.answer_facts) for t in a] == [(t.messages, t.gold, t.answer_facts) for t in b]
    c = tw.make_tasks("train", n=50, seed=4)
    assert [t.messages for t in a] != [t.messages for t in c]
    assert len({t.id for t in a + c}) == 100


def test_every_kind_present_and_parallel_most_common(train, test):
    for tasks in (train, test):
        counts = Counter(t.kind for t in tasks)
        assert set(counts) == set(tw.KINDS)
        assert counts.most_common(1)[0][0] == "parallel"
    for t in train:
        if t.kind == "parallel":
            assert len(t.gold) == 1 and len(t.gold[0]) >= 2
        elif t.kind == "chain":
            assert len(t.gold) >= 2 and all(len(s) == 1 for s in t.gold)
        elif t.kind == "single":
            assert len(t.gold) == 1 and len(t.gold[0]) == 1
        else:
            assert t.gold == []


def _slot_values(t: Task) -> set[str]:
    return set(t.meta["entities"])


def test_train_and_test_disjoint_in_entities_and_phrasing(train, test):
    train_ents = set().union(*map(_slot_values, train))
    test_ents = set().union(*map(_slot_values, test))
    assert train_ents and test_ents and not train_ents & test_ents
    train_tpl = {t.meta["template"] for t in train}
    test_tpl = {t.meta["template"] for t in test}
    assert not train_tpl & test_tpl
    assert not {t.messages[0]["content"] for t in train} & {t.messages[0]["content"] for t in test}
    # every template of either split is used, so the disjointness is not vacuous
    assert len(train_tpl) >= 60 and len(test_tpl) >= 30


def test_heldout_uses_only_heldout_tools(train, test, heldout):
    held = _names(tw.HELDOUT_TOOLS)
    for t in train + test:
        assert not _names(t.tools) & held
    for t in heldout:
        assert _names(t.tools) <= held
        assert {c.name for s in t.gold for c in s} <= held
    assert {t.kind for t in heldout} >= {"single", "parallel"}


def test_gold_is_schema_valid_and_offered(train, test, heldout):
    for t in train + test + heldout:
        check_calls(t.tools, t.gold, where=t.id)
        offered = _names(t.tools)
        assert {c.name for s in t.gold for c in s} <= offered
        assert len(t.tools) <= 4
        if t.kind == "unservable":
            assert t.refusal is True


def test_the_generators_direct_calls_give_the_tasks_of_a_checking_simulator(monkeypatch):
    """The generator runs a draw's gold calls on the tools' functions directly (toolworld._GoldProbe, for speed); through
    a PythonSimulator, which checks each argument and result against the schemas and runs each call under a deadline,
    every split gives the same tasks, the requests train_heldout leaves out included."""
    fast = {split: tw.make_tasks(split, seed=3) for split in tw.SPLITS}
    fast_seen = tw._seen_requests(3)
    checked = []

    def checking_probe():
        sim = PythonSimulator(tw._all_tools_box(), tw.FUNCTIONS)
        checked.append(sim)
        return sim

    monkeypatch.setattr(tw, "_probe", checking_probe)
    tw._seen_requests.cache_clear()
    try:
        assert tw._seen_requests(3) == fast_seen
        for split in tw.SPLITS:
            assert tw.make_tasks(split, seed=3) == fast[split], split
    finally:
        tw._seen_requests.cache_clear()
    calls = sum(sim.metrics["calls"] for sim in checked)
    assert calls > 10_000 and not any(sim.metrics["invalid_arguments"] or sim.metrics["invalid_output"] for sim in checked)


def test_answer_facts_come_from_the_env_results(train):
    for t in train[:400]:
        results = tw.run_gold(t)
        assert all(r.ok for step in results for r in step)
        text = json.dumps([r.content for step in results for r in step])
        for fact in t.answer_facts:
            assert fact in t.reference_answer
            if t.kind != "no_tool":
                assert fact in text, (t.id, fact, text)


def test_chain_feeds_results_forward(train):
    chains = [t for t in train if t.kind == "chain"]
    assert chains
    for t in chains:
        env = tw.make_env(t)
        (a,), (b,) = t.gold
        if t.meta["task_type"] == "event_list":  # a state dependency: the listing must come after the creation
            before = env.call(b.name, b.arguments, episode="early").content["events"]
            env.call(a.name, a.arguments, episode="late")
            after = env.call(b.name, b.arguments, episode="late").content["events"]
            assert a.arguments["title"] in after and a.arguments["title"] not in before
            continue
        first = env.call(a.name, a.arguments, episode=1)
        assert any(v in b.arguments.values() for v in first.content.values())


def test_make_env_state_is_per_episode():
    t = next(t for t in tw.make_tasks("train", n=300) if t.meta["task_type"] == "flight_book")
    tools = t.tools + [x for x in tw.TOOLS if x["function"]["name"] == "get_booking"]
    env = tw.make_env(Task(id="x", messages=t.messages, tools=tools, gold=t.gold))
    assert isinstance(env, PythonSimulator)
    flight = env.call("search_flights", t.gold[0][0].arguments, episode="a").content
    booked = env.call("book_flight", {"flight_id": flight["flight_id"], "passenger": "Ann"}, episode="a")
    look = env.call("get_booking", {"booking_id": booked.content["booking_id"]}, episode="a")
    assert look.ok and look.content["passenger"] == "Ann" and look.content["flight_id"] == flight["flight_id"]
    other = env.call("get_booking", {"booking_id": booked.content["booking_id"]}, episode="b")
    assert not other.ok and "no booking" in other.error


def test_make_env_rejects_bad_calls_readably(train):
    env = tw.make_env(train[0])
    r = env.call("get_weather", {"city": "Paris"})
    assert not r.ok and "date" in r.error and "required" in r.error
    r = env.call("get_weather", {"city": "Paris", "date": "tomorrow"})
    assert not r.ok and "date" in r.error
    r = env.call("teleport", {})
    assert not r.ok and "unknown tool" in r.error


def test_make_env_falls_back_to_schema_simulator_for_foreign_tools():
    from slca.env import SchemaSimulator

    foreign = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    env = tw.make_env(Task(id="f", messages=[], tools=[foreign]), seed=5)
    assert isinstance(env, SchemaSimulator) and env.seed == 5
    assert env.call("ping", {}).ok


def test_bad_split_and_n():
    with pytest.raises(ValueError, match="split"):
        tw.make_tasks("dev")
    with pytest.raises(ValueError, match="n must"):
        tw.make_tasks("train", n=-1)


def test_kinds_filter():
    tasks = tw.make_tasks("train", n=50, kinds=["parallel"])
    assert {t.kind for t in tasks} == {"parallel"}
    mixed = tw.make_tasks("test", n=200, kinds=("chain", "no_tool"))
    assert {t.kind for t in mixed} == {"chain", "no_tool"}
    with pytest.raises(ValueError, match="kinds"):
        tw.make_tasks("heldout_tools", kinds=["chain"])
    with pytest.raises(ValueError, match="kinds"):
        tw.make_tasks("train", kinds="parallel")


# ------------------------------------------------ held-out splits of the training distribution and the diagnostic cells


@pytest.fixture(scope="module")
def train_heldout():
    return tw.make_tasks("train_heldout", seed=0)


def _requests(tasks):
    return [t.messages[0]["content"] for t in tasks]


def test_train_heldout_is_new_requests_of_the_training_distribution(train, train_heldout):
    """Train entities and phrasings, no request of the warm start's demonstrations or of seed 0's RL pool, none twice."""
    n_demo, demo_seed = tw.WARMSTART_DEMOS
    seen = set(_requests(tw.make_tasks("train", n=n_demo, seed=demo_seed))) | set(_requests(tw.make_tasks("train", seed=0)))
    held = _requests(train_heldout)
    assert len(held) == 600 and len(set(held)) == len(held) and not set(held) & seen
    train_ents, train_tpl = set().union(*map(_slot_values, train)), {t.meta["template"] for t in train}
    assert set().union(*map(_slot_values, train_heldout)) <= train_ents
    assert {t.meta["template"] for t in train_heldout} <= train_tpl
    kinds = Counter(t.kind for t in train_heldout)
    assert sum(bool(t.gold) for t in train_heldout) >= 300  # the study's 300 tool-needing tasks are there
    assert kinds.most_common(1)[0][0] == "parallel" and {"single", "chain", "no_tool"} <= set(kinds)
    # usual proportions among the kinds that are not exhausted (single 0.25, parallel 0.35, chain 0.2 of the draws)
    tool = kinds["single"] + kinds["parallel"] + kinds["chain"]
    assert abs(kinds["parallel"] / tool - 0.35 / 0.8) < 0.06 and abs(kinds["single"] / tool - 0.25 / 0.8) < 0.06
    assert _requests(tw.make_tasks("train_heldout", n=50, seed=0)) == held[:50]  # deterministic, n is a prefix


def test_train_heldout_excludes_the_rl_pool_of_its_own_seed():
    pool = set(_requests(tw.make_tasks("train", seed=7)))
    held = tw.make_tasks("train_heldout", n=300, seed=7)
    assert not set(_requests(held)) & pool and all(t.meta["split"] == "train_heldout" for t in held)


def test_warmstart_demos_constant_matches_the_build_config():
    import json as _json
    from importlib import resources

    from recipes.warmstart.config import BuildConfig

    assert (BuildConfig().n_tasks, BuildConfig().data_seed) == tw.WARMSTART_DEMOS
    shipped = _json.loads((resources.files("slca.models") / "shipped" / "slca_build.json").read_text())
    cfg = shipped.get("config", shipped)
    assert (cfg["n_tasks"], cfg["data_seed"]) == tw.WARMSTART_DEMOS


def test_diagnostic_cells_cross_the_two_axes(train, test):
    ents = {s: set().union(*map(_slot_values, ts)) for s, ts in (("train", train), ("test", test))}
    tpls = {s: {t.meta["template"] for t in ts} for s, ts in (("train", train), ("test", test))}
    for split, (e, p) in {"test_entities": ("test", "train"), "test_phrasings": ("train", "test")}.items():
        tasks = tw.make_tasks(split, n=300, seed=0)
        assert set().union(*map(_slot_values, tasks)) <= ents[e] and {t.meta["template"] for t in tasks} <= tpls[p], split
        assert not set(_requests(tasks)) & set(_requests(train)), split
        assert {t.kind for t in tasks} >= {"single", "parallel", "chain"}


def test_request_templates_are_the_templates_a_split_draws(train, test):
    tr, te = tw.request_templates("train"), tw.request_templates("test")
    assert set(tr) == set(te) and all(len(v) == 4 for v in tr.values()) and all(len(v) == 2 for v in te.values())
    assert all(not set(tr[k]) & set(te[k]) for k in tr)  # train and test phrasings are disjoint
    for split, tasks, table in (("train", train, tr), ("test", test, te)):
        assert all(t.meta["template"] in table[t.meta["task_type"]] for t in tasks), split
    assert tw.request_templates("test_phrasings") == te and tw.request_templates("test_entities") == tr
    assert set(tw.request_templates("heldout_tools")).isdisjoint(tr)
    with pytest.raises(ValueError, match="split"):
        tw.request_templates("dev")
