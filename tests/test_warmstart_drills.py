"""recipes/warmstart/drills.py: copy drills, short conversations whose every assistant token is copied from the request.

An echo drill repeats the request's items exactly; a call drill's tool call takes its arguments from its
own (synthetic) request; ``make_drills`` is seeded.
"""

from __future__ import annotations

import random

from recipes.warmstart.drills import call_drill, echo_drill, make_drills


def test_echo_drill_repeats_the_request_items():
    rng = random.Random(0)
    for _ in range(50):
        user, asst = echo_drill(rng)
        assert user["role"] == "user" and asst["role"] == "assistant"
        assert user["content"].endswith(": " + asst["content"])


def test_call_drill_arguments_come_from_the_request():
    from slca.chat import get_format
    from slca.env import toolworld

    rng = random.Random(1)
    tasks = [t for t in toolworld.make_tasks("train", n=60) if t.gold and t.kind == "single"]
    seen = 0
    for i, t in enumerate(tasks[:20]):
        conv = call_drill(t, toolworld.make_env(t), rng, episode=f"t{i}")
        if conv is None:
            continue
        seen += 1
        calls = get_format("hermes").parse(conv[1]["content"]).calls
        assert calls and conv[0]["content"] != t.messages[-1]["content"]  # fresh entities
        for c in calls:
            for v in c.arguments.values():
                if isinstance(v, str) and v.isalpha() and v[0].isupper() and len(v) > 3:
                    assert v in conv[0]["content"]
    assert seen >= 10
    drills = make_drills(10, seed=3)
    assert len(drills) == 10 and drills == make_drills(10, seed=3)
