"""Summary tier of the hierarchical rewards (HierR): the reward for summary tokens.

The final answer is scored against the evidence the rollout actually had:
its successful tool results, the user's request, the tools as the model saw
them, and -- for tasks without gold calls only -- ``task.answer_facts``.
Components, each in [0, 1]:

* ``faithfulness``    -- ``|stated ∩ evidence| / |stated|`` over the checkable
  values the answer states (numbers, dates, times, scores, ids; see
  :func:`~slca.rewards.values.extract_values`); 1 when it states none.
* ``completeness``    -- fraction of ``task.answer_facts`` the answer states
  (numbers compared numerically, words case-insensitively on word boundaries).
  Refusal tasks (``meta["refusal"]`` or kind ``unservable``): 1 if the answer
  says it cannot help, else 0. Tasks without facts: 1 for a non-empty answer.
* ``no_hallucination``-- 1 if the answer states no unsupported value and no
  categorical word (an ``enum`` value of an offered tool's response schema, e.g.
  ``sunny``) that the evidence (here also the tools' descriptions and parameter
  schemas, which the model was shown) does not contain; else 0.
* ``concision``       -- 1 up to ``B`` words, then ``max(0, 1 - (n - B) / (2B))``,
  with ``B = max(12, 2 * words(reference answer))`` (``B = 12 + 8 * #facts`` without one).

    R_sum = 0.3 faithfulness + 0.4 completeness + 0.2 no_hallucination + 0.1 concision

An empty answer scores 0. An optional judge (off by default) mixes in:
``R = (1 - λ) R_sum + λ judge``; a judge that fails makes the reward NaN with
the reason logged (never a silent 0).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from slca.rewards.common import Unscorable, collect_calls
from slca.rewards.values import extract_values, leaf_values
from slca.types import RewardBreakdown, Task, Turn

__all__ = ["SUMMARY_WEIGHTS", "summary_reward", "REFUSAL_MARKERS"]

log = logging.getLogger("slca.rewards")

SUMMARY_WEIGHTS: dict[str, float] = {"faithfulness": 0.3, "completeness": 0.4, "no_hallucination": 0.2, "concision": 0.1}
REFUSAL_MARKERS = ("cannot", "can't", "can not", "unable", "not able", "sorry", "no tool", "not possible")


def _is_refusal_task(task: Task) -> bool:
    return bool(task.meta.get("refusal", task.kind == "unservable"))


def _fact_stated(fact: str, text: str, stated: set[str]) -> bool:
    vals = extract_values(fact)
    if vals and vals <= stated:
        return True
    return re.search(r"(?<!\w)" + re.escape(fact.casefold()) + r"(?!\w)", text.casefold()) is not None


def _enum_words(task: Task) -> set[str]:
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


def _evidence(task: Task, turns: list[Turn]) -> tuple[set[str], set[str]]:
    ro = collect_calls(turns)
    values: set[str] = set()
    words: set[str] = set()
    for r in ro.results:
        if r.ok:
            v, w = leaf_values(r.content)
            values |= v
            words |= w
    for m in task.messages:
        if m.get("role") in ("user", "system") and isinstance(m.get("content"), str):
            v, w = leaf_values(m["content"])
            values |= v
            words |= w
    for t in task.tools:  # what the model was shown of each tool (not its response schema)
        fn = t.get("function", t)
        words |= leaf_values([fn.get("description", ""), fn.get("parameters", {})])[1]
    # Facts count as evidence only where no tool produces them (e.g. "7 plus 5 is 12");
    # otherwise a value the rollout never saw is unsupported even if it happens to be right.
    for f in task.answer_facts if not task.gold else []:
        v, w = leaf_values(f)
        values |= v
        words |= w
    return values, words


def _components(task: Task, turns: list[Turn], final_text: str) -> dict[str, float]:
    values, words = _evidence(task, turns)
    text = final_text.strip()
    stated = extract_values(text)
    supported = {v for v in stated if v in values}
    faith = len(supported) / len(stated) if stated else 1.0
    low = text.casefold()
    if _is_refusal_task(task):
        complete = float(any(m in low for m in REFUSAL_MARKERS))
    elif task.answer_facts:
        complete = sum(_fact_stated(f, text, stated) for f in task.answer_facts) / len(task.answer_facts)
    else:
        complete = 1.0
    said = set(re.findall(r"[a-z]+", low))
    bad_words = (said & _enum_words(task)) - words
    no_hall = float(len(supported) == len(stated) and not bad_words)
    n = len(text.split())
    ref = task.meta.get("reference_answer")
    budget = max(12, 2 * len(ref.split())) if isinstance(ref, str) and ref.strip() else 12 + 8 * len(task.answer_facts)
    concise = 1.0 if n <= budget else max(0.0, 1.0 - (n - budget) / (2 * budget))
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
        task: the task (``answer_facts``, ``meta["reference_answer"]``, ``meta["refusal"]``).
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

