"""Copy drills: short conversations whose every assistant token is copied from the request.

A warm-start demonstration of ~280 tokens carries ~10 tokens of argument values,
so the signal that teaches a tiny model to copy a request's entity into a call is
thin. Drills concentrate it, in the chat format the policy uses:

``echo``
    "Repeat exactly: Zuvaka 2025-03-14 KLMT piano lesson" -> the same items. Pure
    induction: find each item in the request and continue it token by token.
``call``
    A toolworld train task with fresh synthetic entities (:func:`synthesize_entities`)
    and only its request and its first gold step as one hermes tool turn, without
    the system prompt (a few dozen tokens instead of ~280). It teaches *which*
    request value goes into which argument.

Drills are data for the SFT warm start only; they are mixed into the
demonstrations by :func:`~.build.build_default` (``BuildConfig.drills``).
"""

from __future__ import annotations

import random
from typing import Any

from slca.chat import get_format
from slca.env import toolworld

from .augment import pseudo_word, synthesize_entities

__all__ = ["echo_drill", "call_drill", "make_drills"]

_ECHO_PROMPTS = ("Repeat exactly: {}", "Say back: {}", "Copy this: {}", "Echo: {}")


def _item(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return pseudo_word(rng).capitalize()
    if kind == 1:
        return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVWXZ") for _ in range(rng.randint(2, 5)))
    if kind == 2:
        return f"{rng.choice((2024, 2025, 2026))}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == 3:
        return str(rng.randint(2, 999))
    if kind == 4:
        return " ".join(pseudo_word(rng) for _ in range(rng.randint(1, 2)))
    return f"{rng.choice('ABCDEFGHKLMNPRST')}{rng.choice('ABCDEFGHKLMNPRST')}{rng.randint(100, 9999)}"


def echo_drill(rng: random.Random) -> list[dict[str, Any]]:
    """A request listing 1-4 random items (names, tickers, dates, numbers, ids) and their exact repetition."""
    items = " ".join(_item(rng) for _ in range(rng.randint(1, 4)))
    return [{"role": "user", "content": rng.choice(_ECHO_PROMPTS).format(items)}, {"role": "assistant", "content": items}]


def call_drill(task, env, rng: random.Random, episode: str) -> list[dict[str, Any]] | None:
    """The request of ``task`` (entities made synthetic) and its first gold step as one tool turn; None if it has no call."""
    t = synthesize_entities(task, env, rng, episode=episode)
    if t is None or not t.gold:
        return None
    user = [m for m in t.messages if m.get("role") == "user"][-1]
    return [{"role": "user", "content": user["content"]}, {"role": "assistant", "content": get_format("hermes").render(list(t.gold[0]))}]


def make_drills(n: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """``n`` drill conversations, half echo and half call drills (seeded)."""
    rng = random.Random(f"drills-{seed}")
    out: list[list[dict[str, Any]]] = []
    tasks = [t for t in toolworld.make_tasks("train", n=max(1, n), seed=seed + 1000) if t.gold]
    i = 0
    while len(out) < n:
        if len(out) % 2 == 0:
            out.append(echo_drill(rng))
            continue
        task = tasks[i % len(tasks)]
        i += 1
        conv = call_drill(task, toolworld.make_env(task), rng, episode=f"drill-{i}")
        out.append(conv if conv is not None else echo_drill(rng))
    return out
