"""Procedural paraphrases of toolworld requests: more phrasings than the four train templates.

toolworld phrases each train task type with four request templates; the test
split uses two others. A tiny model that has seen four phrasings per task type
treats a fifth as noise (docs/warmstart.md: parse 0.99 -> 0.76 and Name F1
0.95 -> 0.66 on ``test_phrasings``). :func:`paraphrase_task` rewrites a train
task's request *template* with a small grammar of generic transformations and
fills the same slot values back in, so the entities, the gold calls, the
results and the answer stay as they were:

* **lead-ins**: a question (``What is X?``) becomes an instruction or another
  question (``Tell me X.``, ``Do you know X?``, ``Find out X.``); an instruction
  gets a politeness frame (``Please ...``, ``Can you ...?``, ``Would you ...?``,
  ``Help me ...``, ``..., please.``, ``... for me.``);
* **synonyms** for the template's own words (``weather`` -> ``forecast``,
  ``Find`` -> ``Look for``, ``book`` -> ``reserve``, ``calendar`` -> ``agenda``);
* **register**: a lowercase first letter, a dropped final stop, a trailing
  ``thanks``.

The grammar is written from the train templates only. Its lead-ins leave out
the two openings of the test templates (``Could you ...``, ``I need ...``), and a
paraphrase that equals a test template of its task type is drawn again, so the
test phrasings stay unseen (:func:`test_templates`). Slot values are never
rewritten: the rules see ``{slot}`` placeholders, not the values.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from slca.env import toolworld
from slca.types import Task

__all__ = ["paraphrase_task", "paraphrase_template", "test_templates"]

_SLOT = re.compile(r"\{(\w+)\}")

# (pattern on the template, replacements): one is applied with probability 1/2 each, first match only
_SYNONYMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"\bthe weather\b", ("the forecast", "the weather report")),
    (r"\bair quality\b", ("air pollution level", "air quality index", "AQI")),
    (r"\bstock price\b", ("share price", "stock quote", "current price")),
    (r"\bprices\b", ("quotes", "share prices")),
    (r"\bprice\b", ("quote", "value")),
    (r"\btrading at\b", ("worth", "going for")),
    (r"^Find\b", ("Look for", "Get", "Search for")),
    (r"^Search( for)?\b", ("Look for", "Hunt for")),
    (r"\bbook\b", ("reserve",)),
    (r"^Book\b", ("Reserve",)),
    (r"\brestaurant\b", ("place to eat", "eatery")),
    (r"\bcalendar\b", ("agenda", "schedule")),
    (r"^Add(?= \{title\})", ("Put",)),
    (r"^Convert\b", ("Exchange", "Turn")),
    (r"\bmy events\b", ("my appointments", "what I have")),
    (r"\bflight\b", ("plane", "flight option")),
    (r"\btell me\b", ("let me know", "say")),
)

_QUESTION = re.compile(r"^(What is|What are) (the .+)\?$")
_VERBS = ("Find", "Search", "Tell", "Convert", "Add", "Create", "Put", "Schedule", "Book", "Show", "Recommend", "Order", "Get",
          "Call", "Send", "Email", "Write", "Mail", "Play", "Start", "Change", "Compute", "Look", "Reserve", "Exchange", "Turn", "Hunt")
_INSTRUCTION = re.compile(rf"^({'|'.join(_VERBS)})\b(.*)\.$")
_ASKS = ("Tell me {x}.", "Give me {x}.", "I want to know {x}.", "Do you know {x}?", "Can you tell me {x}?",
         "Please tell me {x}.", "Find out {x}.", "Show me {x}.", "Let me know {x}.", "Quick question: what is {x}?")
_FRAMES = ("Please {v}.", "Can you {v}?", "Would you {v}?", "Go ahead and {v}.", "Hey, {v}.", "Would you kindly {v}?",
           "I would like you to {v}.")
_PLAIN_FRAMES = ("{V}, please.", "{V} for me.")  # not for a template that already says please


def _lead_in(t: str, rng: random.Random) -> str:
    q = _QUESTION.match(t)
    if q:
        return rng.choice(_ASKS).format(x=q.group(2))
    m = _INSTRUCTION.match(t)
    if m:
        v = m.group(1).lower() + m.group(2)
        frames = _FRAMES if "please" in t.lower() or "for me" in t else _FRAMES + _PLAIN_FRAMES
        return rng.choice(frames).format(v=v, V=m.group(1) + m.group(2))
    return t


def _register(t: str, rng: random.Random) -> str:
    r = rng.random()
    if r < 0.2 and t[:1].isupper() and not t.startswith("I ") and t[:1] != "{":
        t = t[0].lower() + t[1:]
    elif r < 0.35:
        t = t.rstrip(".?")
    elif r < 0.45:
        t = t + " Thanks!"
    return t


def paraphrase_template(template: str, rng: random.Random) -> str:
    """One procedural paraphrase of a request ``template`` (its ``{slots}`` kept verbatim)."""
    t = template
    for pattern, options in _SYNONYMS:
        if rng.random() < 0.5 and re.search(pattern, t):
            new = rng.choice(options)
            t = re.sub(pattern, lambda m: new[0].upper() + new[1:] if m.group(0)[:1].isupper() else new, t, count=1)
    if rng.random() < 0.7:
        t = _lead_in(t, rng)
    t = _register(t, rng)
    if sorted(_SLOT.findall(t)) != sorted(_SLOT.findall(template)):  # a rule lost or doubled a slot
        return template
    return t


def test_templates() -> dict[str, frozenset[str]]:
    """Each toolworld task type's test-split templates (a paraphrase never equals one)."""
    return {k: frozenset(v) for k, v in toolworld.request_templates("test").items()}


def _slots(template: str, request: str) -> dict[str, str] | None:
    """The slot values that fill ``template`` to give ``request`` (None if it does not match)."""
    parts = _SLOT.split(template)
    pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)" for i, p in enumerate(parts))
    m = re.fullmatch(pattern, request)
    return m.groupdict() if m else None


def paraphrase_task(task: Task, rng: random.Random, tries: int = 8) -> Task | None:
    """``task`` with its request rephrased by :func:`paraphrase_template` (the same slot values).

    Returns None when the request does not fill its ``meta["template"]`` (a task
    rewritten by hand) or no paraphrase other than the template itself and the
    task type's test templates came up in ``tries`` draws.
    """
    template, tt = task.meta.get("template"), task.meta.get("task_type")
    if not isinstance(template, str) or task.messages[-1].get("role") != "user":
        return None
    slots = _slots(template, task.messages[-1]["content"])
    if slots is None:
        return None
    banned = test_templates().get(tt, frozenset()) | {template}
    for _ in range(tries):
        new = paraphrase_template(template, rng)
        if new not in banned:
            break
    else:
        return None
    messages = [dict(m) for m in task.messages]
    messages[-1] = {**messages[-1], "content": new.format(**slots)}
    return replace(task, messages=messages, meta={**task.meta, "template": new, "paraphrased": True})
