"""recipes/warmstart/augment.py: synthetic entities for warm-start tasks, to teach copying rather than memorising.

A task rewritten with fresh entities (in each style: syllables, varied, faker) is still a real task: its gold
calls run and a clean demonstration of it gets full execution and summary rewards. The varied words reach
letters the syllable words never use; faker's name pools leave out every test entity and draw the same in
every process. Scored with the real rewards, as the demonstrations are (tests/test_warmstart_demos.py).
"""

from __future__ import annotations

import random
import re

import pytest

from recipes.warmstart.augment import ENTITY_STYLES, faker_names, faker_word, synthesize_entities, varied_word
from recipes.warmstart.config import DemoMix
from recipes.warmstart.demos import ArgumentPool, demonstrate
from slca.env import toolworld
from slca.rewards import execution_reward, summary_reward

from _helpers import NO_FLAWS, demo_rewards, reference_summary

NONE = NO_FLAWS
CLEAN = DemoMix(**NONE)


@pytest.fixture(scope="module")
def tasks():
    return toolworld.make_tasks("train", n=150, seed=3)


@pytest.fixture(scope="module")
def tasks_seed4():
    return toolworld.make_tasks("train", n=300, seed=4)


_rewards = demo_rewards


def test_synthetic_entities_rewrite_request_gold_results_and_answer_consistently(tasks):
    from recipes.warmstart.augment import synthesize_entities

    rng = random.Random(5)
    n_synth = 0
    for i, t in enumerate(tasks):
        s = synthesize_entities(t, toolworld.make_env(t), rng, episode=i)
        assert s is not None, t.id
        for e in t.meta["entities"]:
            if e in t.messages[-1]["content"] and t.kind not in ("unservable",):
                assert e not in s.messages[-1]["content"].split(), (e, s.messages[-1]["content"])
        n_synth += s.messages != t.messages
        # The rewritten task is a real task: its gold runs, and a clean demo of it scores full rewards.
        d = demonstrate(s, toolworld.make_env(s), DemoMix(**NONE), random.Random(0), ArgumentPool([s]), [], episode=i)
        ex, sm = _rewards(d)
        assert ex == pytest.approx(1.0) and sm.total == pytest.approx(reference_summary(s)), (s.messages, d.final_text, sm)
    assert n_synth > 0.7 * len(tasks)


@pytest.mark.parametrize("style", ENTITY_STYLES)
def test_each_entity_style_rewrites_tasks_that_still_score_full(tasks_seed4, style):
    rng = random.Random(5)
    names = set()
    for i, t in enumerate(tasks_seed4[:120]):
        s = synthesize_entities(t, toolworld.make_env(t), rng, episode=i, style=style)
        assert s is not None, t.id
        names.update(e for e in s.meta["entities"] if e[:1].isupper() and not e.isupper())
        d = demonstrate(s, toolworld.make_env(s), CLEAN, random.Random(0), ArgumentPool([s]), [], episode=i)
        assert execution_reward(s, d.turns).total == pytest.approx(1.0)
        assert summary_reward(s, d.turns, d.final_text).total == pytest.approx(reference_summary(s)), (s.messages, d.final_text)
    assert len(names) > 50
    with pytest.raises(ValueError, match="style"):
        synthesize_entities(tasks_seed4[0], toolworld.make_env(tasks_seed4[0]), rng, style="runic")


def test_varied_words_reach_letters_the_syllable_words_never_use():
    rng = random.Random(0)
    words = [varied_word(rng) for _ in range(2000)]
    assert all(w.isalpha() and w.islower() and len(w) >= 1 for w in words)
    letters = set("".join(words))
    assert set("cjqwxy") <= letters  # pseudo_word draws from bdfgklmnprstvz + aeiou only
    assert len(set(words)) > 1800


def test_faker_names_leave_out_every_test_entity_and_draw_the_same_in_every_process():
    caps, lower = faker_names()
    assert len(caps) > 20_000 and len(lower) > 500
    assert all(re.fullmatch(r"[A-Z][a-z]{2,11}", w) for w in caps) and all(re.fullmatch(r"[a-z]{3,12}", w) for w in lower)
    assert list(caps) == sorted(caps)
    test_words = {w.lower() for e in toolworld.entities("test").all() for w in e.split()}
    assert {"toronto", "boston", "zurich", "piano", "yoga"} <= test_words  # words faker's own lists hold
    assert not test_words & ({w.lower() for w in caps} | set(lower))
    assert "Lisbon" in toolworld.entities("test").cities and "Berlin" in toolworld.entities("train").cities
    a = [faker_word(random.Random(3)) for _ in range(5)]
    assert a == [faker_word(random.Random(3)) for _ in range(5)]
    rng = random.Random(0)
    drawn = [faker_word(rng) for _ in range(400)]
    assert sum(w.capitalize() in caps for w in drawn) > 250  # three in four from the pool, the rest pseudo-words
    with pytest.raises(ValueError, match="split"):
        toolworld.entities("validation")
