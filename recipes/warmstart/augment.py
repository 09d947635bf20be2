"""Synthetic entities for warm-start tasks: teach copying, not memorising.

toolworld's train split draws its cities, tickers, people, titles and dates from
short lists. A tiny model trained on those lists learns to emit the list's
entries (memorisation is easier than copying) and then fails on the test
split's unseen entities. :func:`synthesize_entities` rewrites a task with fresh
pseudo-words of the same shape (a capitalised word for a city or a person, 2-5
capitals for a ticker, lowercase words for a title, any 2024-2026 date) and
small request numbers redrawn, then replays the gold calls against the same
environment so that the results, the chained arguments (a flight id found in
step 1 and booked in step 2), the reference answer and the answer facts all
follow the new values. The request phrasing is left alone.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import replace
from typing import Any

from slca.types import Task, ToolCall

__all__ = ["synthesize_entities", "pseudo_word", "varied_word", "faker_word", "faker_names", "replace_value", "ENTITY_STYLES"]

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
#: ``syllables``: consonant-vowel pseudo-words (:func:`pseudo_word`); ``varied``: names from a wider
#: syllable grammar, one in four of random letters (:func:`varied_word`); ``faker``: real-world names of
#: many locales from the ``faker`` package's lists, one in four a syllable pseudo-word (:func:`faker_word`).
ENTITY_STYLES = ("syllables", "varied", "faker")
_ONSETS = ("b", "bl", "br", "c", "ch", "cl", "cr", "d", "dr", "f", "fl", "fr", "g", "gl", "gr", "h", "j", "k", "kr", "l", "m",
           "n", "p", "ph", "pl", "pr", "qu", "r", "s", "sc", "sh", "sk", "sl", "sm", "sn", "sp", "st", "str", "t", "th", "tr",
           "v", "w", "wh", "x", "y", "z", "")
_NUCLEI = ("a", "e", "i", "o", "u", "y", "ai", "ea", "ee", "ie", "oa", "oo", "ou", "au", "ei")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "ck", "nd", "ng", "st", "x", "rn", "ld", "sk", "tt", "ff")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def pseudo_word(rng: random.Random, syllables: int | None = None) -> str:
    """A pronounceable lowercase pseudo-word of 2-3 consonant-vowel syllables (sometimes a final consonant)."""
    n = syllables or rng.choice((2, 2, 3))
    w = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n))
    return w + (rng.choice("lnrs") if rng.random() < 0.3 else "")


def varied_word(rng: random.Random) -> str:
    """A lowercase name of 1-3 syllables from a wide onset-nucleus-coda grammar, or (one in four) 4-9 random letters.

    Wider than :func:`pseudo_word`'s 14 x 5 consonant-vowel syllables: the BPE pieces of
    unseen real names (``Boston``, ``Toronto``) come up in training, and a random-letter
    name can only be predicted by copying it from the request.
    """
    if rng.random() < 0.25:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))
    n = rng.choice((1, 2, 2, 3))
    return "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) for _ in range(n)) + rng.choice(_CODAS)


@functools.cache
def faker_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Capitalised and lowercase name pools from ``faker``'s own lists (no random draws, so stable per version).

    Capitalised: every locale's first names, last names and city names; lowercase: its English
    word list. Accents are stripped; only plain ``[A-Za-z]`` words of 3-12 letters are kept,
    and every word of a toolworld *test* entity (``Toronto``, ``piano``) is left out, so the
    test split's names stay unseen. Sorted, so a seeded draw is the same in every process.
    """
    import importlib
    import pkgutil
    import unicodedata

    try:
        import faker.providers.address as address
        import faker.providers.lorem.en_US as lorem
        import faker.providers.person as person
    except ImportError as e:
        raise ImportError(f"entity_style='faker' needs the faker package ({e}): pip install -e '.[warmstart]'") from e

    from slca.env import toolworld

    def listed(provider: type, attr: str) -> list[str]:
        v = getattr(provider, attr, None)
        if v is None or isinstance(v, property) or callable(v):
            return []
        return [str(x) for x in (v.keys() if hasattr(v, "keys") else v)]

    raw: set[str] = set()
    for pkg, attrs in ((person, ("first_names", "last_names", "first_names_male", "first_names_female")), (address, ("cities", "city_names"))):
        for mod in pkgutil.iter_modules(pkg.__path__):
            provider = importlib.import_module(f"{pkg.__name__}.{mod.name}").Provider
            for attr in attrs:
                raw.update(listed(provider, attr))
    banned = {w.lower() for e in toolworld.entities("test").all() for w in e.split()}

    def keep(words, shape: str) -> tuple[str, ...]:
        plain = {unicodedata.normalize("NFKD", w).encode("ascii", "ignore").decode() for w in words}
        return tuple(sorted(w for w in plain if re.fullmatch(shape, w) and w.lower() not in banned))

    return keep(raw, r"[A-Z][a-z]{2,11}"), keep(lorem.Provider.word_list, r"[a-z]{3,12}")


def faker_word(rng: random.Random, capital: bool = True) -> str:
    """A lowercase name: from :func:`faker_names` (capitalised pool when ``capital``), or one in four a :func:`pseudo_word`."""
    if rng.random() < 0.25:
        return pseudo_word(rng)
    caps, lower = faker_names()
    return rng.choice(caps).lower() if capital else rng.choice(lower)


def replace_value(text: str, old: str, new: str, count: int = 0) -> str:
    """Replace ``old`` where it stands as a whole value (not inside a word, date, id or longer number)."""
    return re.sub(rf"(?<![\w.:\-]){re.escape(old)}(?![\w:\-]|\.\d)", lambda _: new, text, count=count)


def _like(entity: str, rng: random.Random, style: str = "syllables") -> str:
    """A fresh value shaped like ``entity``."""
    if _DATE.fullmatch(entity):
        return f"{rng.choice((2024, 2025, 2026))}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if re.fullmatch(r"[A-Z]{2,5}", entity):
        return "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVWXZ") for _ in range(rng.randint(2, 5)))
    words = entity.split()
    if style == "faker":
        new = [_word(functools.partial(faker_word, capital=o[:1].isupper()), rng) for o in words]
    else:
        word = varied_word if style == "varied" else pseudo_word
        new = [_word(word, rng) for _ in words]
    return " ".join(w.capitalize() if o[:1].isupper() else w for w, o in zip(new, words))


_RUDE = ("fuck", "shit", "cunt", "dick", "piss", "cock", "nigg", "fag", "slut", "whor")


def _word(word, rng: random.Random) -> str:
    w = word(rng)
    while len(w) < 2 or any(r in w for r in _RUDE):
        w = word(rng)
    return w


def _map_value(v: Any, mapping: dict[Any, Any]) -> Any:
    key = (type(v).__name__, v) if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None
    return mapping.get(key, v) if key is not None else v


def synthesize_entities(task: Task, env, rng: random.Random, episode: str | int = "synth", style: str = "syllables") -> Task | None:
    """``task`` with its entities, dates and small request numbers replaced by fresh values.

    Args:
        task: a toolworld task (``meta["entities"]``, ``reference_answer``).
        env: the environment its gold calls run against (pure functions of the arguments).
        rng: draws the new values.
        episode: simulator episode used for the replay.
        style: one of :data:`ENTITY_STYLES` (how a new name is drawn).

    Returns:
        The rewritten task, or None when it cannot be rewritten consistently
        (a replayed call fails, or a value to rewrite is not found verbatim).
    """
    if style not in ENTITY_STYLES:
        raise ValueError(f"style must be one of {ENTITY_STYLES}, got {style!r}")
    request = task.messages[-1]["content"]
    answer = task.reference_answer
    if task.messages[-1].get("role") != "user" or answer is None:
        return None
    entities = [e for e in task.meta.get("entities", []) if isinstance(e, str) and e]
    entities += sorted(set(_DATE.findall(request)))
    text_map: dict[str, str] = {}
    for e in sorted(set(entities), key=lambda e: (-len(e), e)):  # longest first; ties by text (a set's order varies per process)
        new = _like(e, rng, style)
        while new in text_map.values() or new == e:
            new = _like(e, rng, style)
        text_map[e] = new
    # Request numbers that are call arguments (amounts, party sizes) are redrawn in their range.
    arg_map: dict[Any, Any] = {("str", k): v for k, v in text_map.items()}
    for step in task.gold:
        for c in step:
            for v in c.arguments.values():
                if type(v) is int and ("int", v) not in arg_map and replace_value(request, str(v), "\0") != request:
                    arg_map[("int", v)] = rng.randint(2, 12) if v <= 12 else rng.randint(13, 999)
    num_map = {str(k[1]): str(v) for k, v in arg_map.items() if k[0] == "int"}

    old_results = [[env.call(c.name, c.arguments, episode=f"{episode}-old") for c in step] for step in task.gold]
    gold: list[list[ToolCall]] = []
    result_map: dict[str, str] = {}
    for step, olds in zip(task.gold, old_results):
        new_step = []
        for c, old in zip(step, olds):
            args = {k: _map_value(v, arg_map) for k, v in c.arguments.items()}
            r = env.call(c.name, args, episode=episode)
            if not (r.ok and old.ok):
                return None
            new_step.append(ToolCall(c.name, args, c.id))
            if isinstance(old.content, dict) and isinstance(r.content, dict):
                for k, ov in old.content.items():
                    nv = r.content.get(k)
                    if not isinstance(ov, (dict, list)) and nv is not None and nv != ov:
                        # later steps take earlier results as arguments (chains)
                        arg_map.setdefault((type(ov).__name__, ov), nv)
                        result_map.setdefault(str(ov), str(nv))
        gold.append(new_step)

    def rewrite(text: str) -> str:
        for old, new in text_map.items():
            text = re.sub(rf"(?<!\w){re.escape(old)}(?!\w)", lambda _: new, text)
        for old, new in {**num_map, **result_map}.items():
            if old not in text_map.values():
                text = replace_value(text, old, new)
        return text

    new_request = rewrite(request)
    if any(replace_value(new_request, old, "\0") != new_request for old in text_map):
        return None
    messages = [dict(m) for m in task.messages]
    messages[-1] = {**messages[-1], "content": new_request}
    meta = {**task.meta, "entities": [text_map.get(e, e) for e in task.meta.get("entities", [])], "synthetic_entities": True}
    facts = [rewrite(f) for f in task.answer_facts]
    return replace(task, id=task.id + "-synth", messages=messages, gold=gold, answer_facts=facts, meta=meta,
                   reference_answer=rewrite(answer))
