"""The warm start's request paraphrases (recipes/warmstart/paraphrase.py; the entity styles, augment.py's:
tests/test_warmstart_augment.py)."""

from __future__ import annotations

import random
import re
from dataclasses import asdict, replace

import pytest

from recipes.warmstart import BuildConfig, DemoMix
from recipes.warmstart.build import _fingerprinted
from recipes.warmstart.demos import ArgumentPool, demonstrate, make_demonstrations
from recipes.warmstart.paraphrase import paraphrase_task, paraphrase_template
from recipes.warmstart.paraphrase import test_templates as _test_templates
from slca.env import toolworld
from slca.rewards import execution_reward, summary_reward

from _helpers import NO_FLAWS, reference_summary

CLEAN = DemoMix(**NO_FLAWS)


@pytest.fixture(scope="module")
def tasks():
    return toolworld.make_tasks("train", n=300, seed=4)


def test_a_paraphrase_keeps_every_slot_value_and_the_task_scores_full(tasks):
    rng = random.Random(0)
    changed = 0
    for i, t in enumerate(tasks):
        p = paraphrase_task(t, rng)
        if p is None:  # eight draws gave only the template itself (a template few rules apply to)
            continue
        old, new = t.messages[-1]["content"], p.messages[-1]["content"]
        changed += old != new
        # every entity, date and number of the request is still there, verbatim
        for value in t.meta["entities"] + re.findall(r"\d[\d-]*", old):
            assert value in new, (value, old, new)
        assert p.gold == t.gold and p.reference_answer == t.reference_answer and p.answer_facts == t.answer_facts
        assert p.meta["template"] != t.meta["template"] and p.meta["paraphrased"]
        d = demonstrate(p, toolworld.make_env(p), CLEAN, random.Random(0), ArgumentPool([p]), [], episode=i)
        assert execution_reward(p, d.turns).total == pytest.approx(1.0)
        assert summary_reward(p, d.turns, d.final_text).total == pytest.approx(reference_summary(p))
    assert changed >= 0.95 * len(tasks)


def test_no_paraphrase_is_a_test_phrasing(tasks):
    banned = _test_templates()
    assert set(banned) >= {t.meta["task_type"] for t in tasks}
    rng = random.Random(1)
    seen: dict[str, set[str]] = {}
    for _ in range(6):
        for t in tasks:
            p = paraphrase_task(t, rng)
            if p is None:
                continue
            assert p.meta["template"] not in banned[t.meta["task_type"]]
            seen.setdefault(t.meta["task_type"], set()).add(p.meta["template"])
            # the grammar's lead-ins leave out the two openings of the test templates (one train template has one)
            if p.meta["template"].startswith(("Could you", "I need")):
                assert t.meta["template"].startswith(("Could you", "I need")), (t.meta["template"], p.meta["template"])
    # many phrasings per task type, not four
    assert min(len(v) for v in seen.values()) >= 10, {k: len(v) for k, v in seen.items()}


def test_a_paraphrase_never_loses_or_doubles_a_slot():
    rng = random.Random(2)
    for template in ("Find a {cuisine} restaurant in {city}.", "Search for {cuisine} food in {city}.", "Add {a} and {b}.",
                     "What is the weather in {city1} and {city2} on {date}?", "Play some music."):
        for _ in range(200):
            new = paraphrase_template(template, rng)
            assert sorted(re.findall(r"\{\w+\}", new)) == sorted(re.findall(r"\{\w+\}", template)), (template, new)


def test_a_request_that_does_not_fill_its_template_is_left_alone(tasks):
    t = tasks[0]
    hand_written = replace(t, messages=[{"role": "user", "content": "Something else entirely."}])
    assert paraphrase_task(hand_written, random.Random(0)) is None


def test_paraphrase_draws_do_not_change_the_other_draws():
    # paraphrases use their own random stream: the flaws and the synthetic entities stay those of the recipe without them
    base = make_demonstrations(80, DemoMix(), seed=0, synthetic=0.8)
    para = make_demonstrations(80, DemoMix(), seed=0, synthetic=0.8, paraphrase=1.0)
    assert [d.flaws for d in base] == [d.flaws for d in para]
    assert [d.messages[1:] for d in base] == [d.messages[1:] for d in para]
    assert sum(a.messages[0] != b.messages[0] for a, b in zip(base, para)) > 70
    with pytest.raises(ValueError, match="paraphrase"):
        make_demonstrations(5, DemoMix(), paraphrase=-0.1)


def test_a_later_field_at_its_neutral_value_leaves_the_fingerprint_as_before_it():
    off = BuildConfig(entity_style="syllables", paraphrase=0.0, mix=replace(DemoMix(), wrong_entity=0.0))
    d = _fingerprinted(asdict(off))
    assert "paraphrase" not in d and "entity_style" not in d and "wrong_entity" not in d["mix"]
    on = _fingerprinted(asdict(replace(off, paraphrase=0.5, mix=replace(off.mix, wrong_entity=0.1))))
    assert on["paraphrase"] == 0.5 and on["mix"]["wrong_entity"] == 0.1
    assert asdict(off)["paraphrase"] == 0.0  # the config itself is not changed
