"""Summary tier of the hierarchical rewards (HierR): the reward for summary tokens.

The final answer is checked against the **evidence** the rollout actually had:
the user's request (user and system messages), its successful tool results
(string and number leaves, and the words of their keys: ``temp_c`` supports
the unit ``C``), the descriptions of the tools those results came from
(``Latest price of a stock in USD``) and -- for tasks without gold calls only --
``task.answer_facts``. What a tool's parameter schema merely offers (an
``enum`` menu such as ``"USD"|"EUR"``) or an uncalled tool's description says
is not evidence. The answer's **claims** are:

* its checkable values: numbers, dates, clock times, scores, ids
  (:func:`~slca.rewards.values.extract_values`), supported when the evidence
  holds the same value;
* its entities: runs of capitalised words not opening a sentence (``Lisbon``,
  ``Golden Fork``), all-caps codes anywhere (``GBP``, ``AAPL``) and a unit
  letter after a number (``14 C``) (:func:`~slca.rewards.values.extract_entities`),
  supported when every word of the entity is a word of the evidence (case-insensitive);
* one claim per call the answer reports -- it states a value found in that
  call's arguments or result and in no other call's -- that it is about what
  the user named: the call's name-like string arguments (letters only, at most
  four words) that the request names (``city="Lisbon"``, ``title="dentist"``,
  ``from_currency="GBP"``) must appear in the answer, else the call is
  *misreported*. This catches swaps the entity check cannot see: a lower-case
  title (``I added yoga on ...`` for "Add dentist ..."), a name opening a
  sentence (``Lisbon has ...``), an entity swapped for another one the request
  also names (``50 EUR is 58.23 EUR`` for "Convert 50 GBP to EUR"). It cannot
  tell such a swap from an answer that only leaves the name out, so a
  misreported call costs faithfulness but not ``no_hallucination``.

Components, each in [0, 1]:

* ``faithfulness``    -- claims that hold / claims (1 when the answer makes none).
* ``completeness``    -- fraction of ``task.answer_facts`` the answer states
  (numbers compared numerically, words case-insensitively on word boundaries).
  Refusal tasks (``Task.refusal``; by default kind ``unservable``): 1 if the answer
  says it cannot help, else 0. Tasks without facts: 1 for a non-empty answer.
* ``no_hallucination``-- 1 if every stated value and entity is supported and the
  answer states no categorical word (an ``enum`` value of an offered tool's
  response schema, e.g. ``sunny``) that the evidence lacks; else 0.
* ``concision``       -- 1 up to ``B`` words, then ``max(0, 1 - (n - B) / (2B))``,
  with ``B = max(12, 2 * words(reference answer))`` (``B = 12 + 8 * #facts`` without one).

    R_sum = 0.3 faithfulness + 0.4 completeness + 0.2 no_hallucination + 0.1 concision

An empty answer scores 0. An optional judge (off by default) mixes in:
``R = (1 - λ) R_sum + λ judge``; a judge that fails makes the reward NaN with
the reason logged (never a silent 0). :func:`answer_claims` returns the claims
and the unsupported ones, for diagnostics.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from slca.rewards.common import RolloutCalls, Unscorable, collect_calls
from slca.rewards.values import contains_phrase, entity_supported, extract_entities, extract_values, leaf_tokens, leaf_values, tokens
from slca.types import RewardBreakdown, Task, Turn

__all__ = ["SUMMARY_WEIGHTS", "summary_reward", "REFUSAL_MARKERS", "AnswerClaims", "answer_claims"]

log = logging.getLogger("slca.rewards")

SUMMARY_WEIGHTS: dict[str, float] = {"faithfulness": 0.3, "completeness": 0.4, "no_hallucination": 0.2, "concision": 0.1}
REFUSAL_MARKERS = ("cannot", "can't", "can not", "unable", "not able", "sorry", "no tool", "not possible")


def _fact_stated(fact: str, text: str, stated: set[str]) -> bool:
    vals = extract_values(fact)
    if vals and vals <= stated:
        return True
    return re.search(r"(?<!\w)" + re.escape(fact.casefold()) + r"(?!\w)", text.casefold()) is not None


def _enum_words(task: Task) -> set[str]:
    """The categorical words of the task's tools: string ``enum`` values of their response schemas (``sunny``)."""
    words: set[str] = set()

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            for v in schema.get("enum", []):
                if isinstance(v, str) and v.isalpha() and len(v) >= 3:
                    words.add(v.casefold())
            for v in schema.values():
                walk(v)
        elif isinstance(schema, list):
            for v in schema:
                walk(v)

    for t in task.tools:
        walk(t.get("function", t).get("response"))
    return words


@dataclass
class _Evidence:
    """What the rollout saw: ``values`` (as :func:`extract_values` writes them), ``tokens`` (case-folded
    words, for entities and categorical words) and ``request`` (the user and system messages' text)."""

    values: set[str]
    tokens: set[str]
    request: str


def _request_text(task: Task) -> str:
    """The text of the task's user and system messages, one per line."""
    return "\n".join(m["content"] for m in task.messages if m.get("role") in ("user", "system") and isinstance(m.get("content"), str))


def _evidence(task: Task, ro: RolloutCalls) -> _Evidence:
    """The evidence an answer is checked against (the module docstring): request, successful results with
    their keys, the descriptions of the tools that gave them, and ``answer_facts`` for tasks without gold."""
    request = _request_text(task)
    values, _ = leaf_values(request)
    toks = set(tokens(request))
    by_name = {t.get("function", t).get("name"): t.get("function", t) for t in task.tools}
    for c, r in zip(ro.calls, ro.results):
        if not r.ok:
            continue
        values |= leaf_values(r.content)[0]
        toks |= leaf_tokens(r.content, keys=True)
        desc = by_name.get(c.name, {}).get("description")
        if isinstance(desc, str):
            toks |= set(tokens(desc))
    # Facts count as evidence only where no tool produces them (e.g. "7 plus 5 is 12");
    # otherwise a value the rollout never saw is unsupported even if it happens to be right.
    for f in task.answer_facts if not task.gold else []:
        values |= leaf_values(f)[0]
        toks |= set(tokens(f))
    return _Evidence(values, toks, request)


def _string_leaves(obj: Any) -> list[str]:
    """Every string leaf of a JSON-like object, in order."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _string_leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in _string_leaves(v)]
    return []


# a string argument that names something: words of letters only, at most four ("Lisbon", "GBP", "piano lesson")
_NAME_LIKE = re.compile(r"^[^\W\d_]+(?:[ '’-][^\W\d_]+){0,3}$")


def _misreported_calls(ro: RolloutCalls, ev: _Evidence, text: str, stated: set[str]) -> list[tuple[str, tuple[str, ...]]]:
    """``(tool name, missing arguments)`` for each call the answer reports without naming what the user
    asked about (the module docstring's third kind of claim)."""
    per_call = [leaf_values(c.arguments)[0] | leaf_values(r.content)[0] if r.ok else set() for c, r in zip(ro.calls, ro.results)]
    owners: dict[str, int] = {}
    for vals in per_call:
        for v in vals:
            owners[v] = owners.get(v, 0) + 1
    out = []
    for c, r, vals in zip(ro.calls, ro.results, per_call):
        if not r.ok or not any(owners[v] == 1 for v in vals & stated):
            continue
        missing = tuple(a for a in _string_leaves(c.arguments)
                        if _NAME_LIKE.match(a.strip()) and contains_phrase(ev.request, a) and not contains_phrase(text, a))
        if missing:
            out.append((c.name, missing))
    return out


@dataclass(frozen=True)
class AnswerClaims:
    """What a final answer claims and which claims the rollout's evidence does not support.

    ``values`` and ``entities`` are the answer's checkable values and entities
    (:func:`~slca.rewards.values.extract_values`, :func:`~slca.rewards.values.extract_entities`);
    ``unsupported`` the ones the evidence lacks; ``misreported`` the calls the answer
    reports without naming what the user asked about, as ``(tool name, missing
    arguments)``; ``categorical`` the response-schema ``enum`` words it states that
    the evidence lacks.
    """

    values: frozenset[str]
    entities: frozenset[str]
    unsupported: frozenset[str]
    misreported: tuple[tuple[str, tuple[str, ...]], ...]
    categorical: frozenset[str]

    @property
    def n_claims(self) -> int:
        """Stated values and entities, plus one claim per reported call ("this is about X")."""
        return len(self.values) + len(self.entities) + len(self.misreported)

    @property
    def n_wrong(self) -> int:
        """Claims that do not hold: unsupported values and entities, misreported calls."""
        return len(self.unsupported) + len(self.misreported)

    @property
    def wrong_entity(self) -> bool:
        """The answer names an entity the evidence lacks, or reports a call about something the user did not name."""
        return any(c.startswith("ent:") for c in self.unsupported) or bool(self.misreported)


def answer_claims(task: Task, turns: list[Turn], final_text: str) -> AnswerClaims:
    """The claims of ``final_text`` checked against the rollout's evidence (the rule in the module docstring).

    Raises :class:`Unscorable` when a tool turn lacks results.
    """
    ro = collect_calls(turns)
    ev = _evidence(task, ro)
    text = final_text.strip()
    stated = extract_values(text)
    entities = extract_entities(text)
    unsupported = {v for v in stated if v not in ev.values} | {e for e in entities if not entity_supported(e, ev.tokens)}
    said = set(re.findall(r"[^\W\d_]+", text.casefold()))
    return AnswerClaims(
        values=frozenset(stated),
        entities=frozenset(entities),
        unsupported=frozenset(unsupported),
        misreported=tuple(_misreported_calls(ro, ev, text, stated)),
        categorical=frozenset((said & _enum_words(task)) - ev.tokens),
    )


def _components(task: Task, turns: list[Turn], final_text: str) -> dict[str, float]:
    claims = answer_claims(task, turns, final_text)
    text = final_text.strip()
    n = claims.n_claims
    faith = (n - claims.n_wrong) / n if n else 1.0
    low = text.casefold()
    if task.refusal:
        complete = float(any(m in low for m in REFUSAL_MARKERS))
    elif task.answer_facts:
        complete = sum(_fact_stated(f, text, set(claims.values)) for f in task.answer_facts) / len(task.answer_facts)
    else:
        complete = 1.0
    no_hall = float(not claims.unsupported and not claims.categorical)
    words = len(text.split())
    ref = task.reference_answer
    budget = max(12, 2 * len(ref.split())) if ref is not None and ref.strip() else 12 + 8 * len(task.answer_facts)
    concise = 1.0 if words <= budget else max(0.0, 1.0 - (words - budget) / (2 * budget))
    return {"faithfulness": faith, "completeness": complete, "no_hallucination": no_hall, "concision": concise}


def summary_reward(
    task: Task,
    turns: list[Turn],
    final_text: str,
    *,
    judge: Any | None = None,
    judge_weight: float = 0.5,
) -> RewardBreakdown:
    """The summary-tier reward of one rollout, in [0, 1] (NaN + reason if unscorable).

    Args:
        task: the task (``answer_facts``, ``reference_answer``, ``refusal``).
        turns: the rollout's assistant turns with their tool results.
        final_text: the final answer the user reads.
        judge: optional object with ``score(task, turns, final_text) -> float in [0, 1]``
            (e.g. :class:`slca.rewards.OpenAIJudge`); off by default.
        judge_weight: λ, the judge's share of the total.

    Returns:
        ``RewardBreakdown(total, {faithfulness, completeness, no_hallucination, concision[, judge]})``.
    """
    if not isinstance(final_text, str):
        raise ValueError(f"final_text must be a str, got {type(final_text).__name__}")
    if not 0.0 <= judge_weight <= 1.0:
        raise ValueError(f"judge_weight must be in [0, 1], got {judge_weight}")
    keys = list(SUMMARY_WEIGHTS) + (["judge"] if judge is not None else [])
    if not final_text.strip():
        return RewardBreakdown(total=0.0, components={k: 0.0 for k in keys})
    try:
        comp = _components(task, turns, final_text)
    except Unscorable as e:
        reason = f"task {task.id!r}: {e}"
        log.warning("reward is NaN: %s", reason)
        return RewardBreakdown(total=math.nan, components={k: math.nan for k in keys}, reason=reason)
    total = sum(SUMMARY_WEIGHTS[k] * comp[k] for k in SUMMARY_WEIGHTS)
    if judge is not None:
        try:
            j = float(judge.score(task, turns, final_text))
        except Unscorable as e:
            reason = f"task {task.id!r}: judge failed: {e}"
            log.warning("reward is NaN: %s", reason)
            return RewardBreakdown(total=math.nan, components={**comp, "judge": math.nan}, reason=reason)
        if not 0.0 <= j <= 1.0:
            raise ValueError(f"judge returned {j}, expected a score in [0, 1]")
        comp["judge"] = j
        total = (1 - judge_weight) * total + judge_weight * j
    return RewardBreakdown(total=total, components=comp)

