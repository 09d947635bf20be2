"""Warm-start demonstrations: toolworld tasks played against the toolworld environment.

A demonstration is a whole conversation -- the task's prompt, assistant tool
turns in the hermes format (the text the model should generate), the
environment's real answers as ``role: "tool"`` messages (``ToolResult.to_text()``,
as the rollout engine inserts them) and a final answer. Its quality varies on
both segments, each flaw drawn independently with the probability in
:class:`~.config.DemoMix`:

execution segment
    ``sequential`` (a parallel gold step made one call per turn),
    ``redundant`` (a call repeated in an extra turn),
    ``wrong_argument`` (one argument value of the last step swapped for another
    value seen for that argument; the answer then restates what the tools said);
summary segment
    ``unfaithful`` (one stated value differs from the tool result),
    ``wrong_entity`` (an entity of the request named as another one: ``In Sofia`` for Tokyo),
    ``incomplete`` (the last fact-bearing clause dropped, or no fact at all),
    ``verbose`` (filler around the answer).

The clean answer is toolworld's ``Task.reference_answer`` (it states the
task's ``answer_facts``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from slca.chat import get_format
from slca.env import toolworld
from slca.models.tokenizer import chat_template
from slca.types import Task, ToolCall, ToolResult, Turn

from .augment import replace_value, synthesize_entities
from .config import DemoMix
from .paraphrase import paraphrase_task

__all__ = ["Demonstration", "demonstrate", "make_demonstrations", "render_texts", "ArgumentPool"]

_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_ID = re.compile(r"^([A-Z]+)(\d+)$")
_CLAUSE_SPLIT = re.compile(r"(; |, (?=\S+ (?:is|at|has|trades|played))| and (?=\S))")
_FILLER_OPEN = (
    "Sure! I have looked into this for you using the available tools.",
    "Great question! Let me walk you through what I found.",
    "Thanks for asking. I checked everything carefully and here is the full picture.",
    "Of course. After going through the results in detail, here is my answer.",
)
_FILLER_CLOSE = (
    "Let me know if there is anything else I can help you with today.",
    "I hope this helps, and feel free to ask me anything else at any time.",
    "Please tell me if you would like me to check anything more for you.",
    "If you need more details, I am always happy to look things up again.",
)
_VAGUE = ("I looked that up for you.", "Here is what I found.", "Done, I checked it for you.", "I have the results now.")


@dataclass
class Demonstration:
    """One warm-start conversation and the flaws it was given."""

    task: Task
    messages: list[dict[str, Any]]
    flaws: list[str] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    """The assistant turns as a rollout records them (parsed calls and tool results), for the rewards."""

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.task.tools

    @property
    def final_text(self) -> str:
        return self.messages[-1]["content"]


class ArgumentPool:
    """Values seen for each (tool, argument) in gold calls; the source of wrong arguments."""

    def __init__(self, tasks: Iterable[Task]):
        self.values: dict[tuple[str, str], list[Any]] = {}
        for task in tasks:
            for step in task.gold:
                for c in step:
                    for k, v in c.arguments.items():
                        vals = self.values.setdefault((c.name, k), [])
                        if v not in vals:
                            vals.append(v)

    def other(self, name: str, arg: str, value: Any, rng: random.Random) -> Any | None:
        """A value seen for ``name.arg`` other than ``value``, or None if there is none."""
        choices = [v for v in self.values.get((name, arg), []) if v != value]
        return rng.choice(choices) if choices else None


def _enum_siblings(fact: str, tools: list[dict[str, Any]]) -> list[str]:
    """Other values of a response-schema ``enum`` of ``tools`` that contains ``fact``."""
    found: list[str] = []

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            enum = schema.get("enum")
            if isinstance(enum, list) and fact in enum:
                found.extend(str(v) for v in enum if v != fact)
            for v in schema.values():
                walk(v)
        elif isinstance(schema, list):
            for v in schema:
                walk(v)

    for t in tools:
        walk(t.get("function", t).get("response"))
    return found


def _perturb(fact: str, rng: random.Random, pool: list[str], tools: list[dict[str, Any]]) -> str:
    """A different value of the same kind as ``fact``: a nearby number, another id, another enum value or seen fact."""
    if _NUMBER.match(fact):
        if "." in fact:
            decimals = len(fact.split(".")[1])
            return f"{float(fact) + rng.choice([-1, 1]) * rng.randint(1, 30) / 10 ** max(decimals - 1, 0):.{decimals}f}"
        return str(int(fact) + rng.choice([-1, 1]) * rng.randint(1, 9))
    m = _ID.match(fact)
    if m:
        digits = m.group(2)
        new = digits
        while new == digits:
            new = str(rng.randint(10 ** (len(digits) - 1), 10 ** len(digits) - 1))
        return m.group(1) + new
    siblings = _enum_siblings(fact, tools)
    if siblings:
        return rng.choice(siblings)
    same_shape = [p for p in pool if p != fact and not _NUMBER.match(p) and not _ID.match(p)]
    return rng.choice(same_shape) if same_shape else fact[::-1]


def _restate(answer: str, gold_results: list[ToolResult], results: list[ToolResult]) -> str:
    """Rewrite ``answer`` (written for ``gold_results``) to state the values in ``results`` instead."""
    for g, r in zip(gold_results, results):
        if not (g.ok and isinstance(g.content, dict)):
            continue
        if not (r.ok and isinstance(r.content, dict)):
            continue
        for k, old in g.content.items():
            new = r.content.get(k)
            if new is not None and new != old and not isinstance(old, (list, dict)):
                answer = replace_value(answer, str(old), str(new))
    return answer


def _incomplete(answer: str, facts: list[str], rng: random.Random) -> str:
    parts = _CLAUSE_SPLIT.split(answer)
    clauses = parts[0::2]
    if len(clauses) >= 2 and any(f in clauses[-1] for f in facts):
        kept = "".join(p for p in parts[:-2]).rstrip(" ,;.")
        return kept + "."
    return rng.choice(_VAGUE)


def _wrong_argument(last: list[ToolCall], rng: random.Random, pool: ArgumentPool, flaws: list[str]) -> None:
    """Replace one argument of one call of ``last`` (in place) by another value seen for it."""
    j = rng.randrange(len(last))
    args = dict(last[j].arguments)
    names = [k for k, v in args.items() if isinstance(v, (str, int, float))]
    rng.shuffle(names)
    for k in names:
        v = pool.other(last[j].name, k, args[k], rng)
        if v is not None:
            args[k] = v
            last[j] = ToolCall(last[j].name, args)
            flaws.append("wrong_argument")
            break


def _turns(steps: list[list[ToolCall]], mix: DemoMix, rng: random.Random, flaws: list[str]) -> list[list[ToolCall]]:
    """The assistant's tool turns: parallel steps split (``sequential``), one call repeated (``redundant``)."""
    turns: list[list[ToolCall]] = []
    for step in steps:
        if len(step) > 1 and rng.random() < mix.sequential:
            turns.extend([c] for c in step)
            if "sequential" not in flaws:
                flaws.append("sequential")
        else:
            turns.append(step)
    if turns and rng.random() < mix.redundant:
        i = rng.randrange(len(turns))
        turns.insert(i + 1, [rng.choice(turns[i])])
        flaws.append("redundant")
    return turns


def _swap_entity(answer: str, task: Task, rng: random.Random, entity_pool: list[str]) -> str | None:
    """``answer`` with one of the request's entities renamed as another entity of the same shape (None if none fits)."""
    named = [e for e in task.meta.get("entities", []) if isinstance(e, str) and e and replace_value(answer, e, "\0") != answer]
    if not named:
        return None
    e = rng.choice(sorted(named))
    shape = (e.isupper(), e[:1].isupper(), len(e.split()))
    others = [o for o in entity_pool if o not in named and (o.isupper(), o[:1].isupper(), len(o.split())) == shape]
    return replace_value(answer, e, rng.choice(others)) if others else None


def _summary_flaws(answer: str, task: Task, mix: DemoMix, rng: random.Random, fact_pool: list[str], flaws: list[str],
                   entity_pool: list[str] = ()) -> str:
    """The final answer with the summary flaws drawn from ``mix`` (``unfaithful``, ``wrong_entity``, ``incomplete``, ``verbose``)."""
    facts = [f for f in task.answer_facts if replace_value(answer, f, "\0") != answer]
    if facts and rng.random() < mix.unfaithful:
        f = rng.choice(facts)
        answer = replace_value(answer, f, _perturb(f, rng, fact_pool, task.tools), count=1)
        flaws.append("unfaithful")
    if mix.wrong_entity and rng.random() < mix.wrong_entity:  # no draw at 0: the other flaws' stream is unchanged
        swapped = _swap_entity(answer, task, rng, entity_pool)
        if swapped is not None:
            answer = swapped
            flaws.append("wrong_entity")
    if rng.random() < mix.incomplete:
        answer = _incomplete(answer, facts, rng)
        flaws.append("incomplete")
    if rng.random() < mix.verbose:
        answer = f"{rng.choice(_FILLER_OPEN)} {answer} {rng.choice(_FILLER_CLOSE)}"
        flaws.append("verbose")
    return answer


def demonstrate(task: Task, env, mix: DemoMix, rng: random.Random, pool: ArgumentPool, fact_pool: list[str],
                episode: str | int = "demo", entity_pool: list[str] = ()) -> Demonstration:
    """Play ``task`` against ``env`` with flaws drawn from ``mix``; returns the conversation.

    Args:
        task: a toolworld task (``gold`` steps, ``answer_facts`` and ``reference_answer``).
        env: its simulator (``toolworld.make_env(task)``): results are real.
        mix: flaw probabilities.
        rng: draws the flaws.
        pool: argument values for ``wrong_argument``.
        fact_pool: fact strings of other tasks (replacement values for ``unfaithful``).
        episode: simulator episode of this demonstration.
        entity_pool: entities of other tasks (replacement names for ``wrong_entity``).
    """
    hermes = get_format("hermes")
    answer = task.reference_answer
    if answer is None:
        raise ValueError(f"task {task.id!r} has no reference_answer to demonstrate")
    flaws: list[str] = []
    steps = [list(s) for s in task.gold]
    if steps and rng.random() < mix.wrong_argument:
        _wrong_argument(steps[-1], rng, pool, flaws)
    turns = _turns(steps, mix, rng, flaws)

    messages: list[dict[str, Any]] = [dict(m) for m in task.messages]
    results_by_call: dict[str, ToolResult] = {}
    played: list[Turn] = []
    for calls in turns:
        text = hermes.render(calls)
        messages.append({"role": "assistant", "content": text})
        results = [env.call(c.name, c.arguments, episode=episode) for c in calls]
        played.append(Turn(text=text, parsed=hermes.parse(text), results=results))
        for c, r in zip(calls, results):
            results_by_call.setdefault(c.key(), r)
            messages.append({"role": "tool", "content": r.to_text()})
    if "wrong_argument" in flaws:
        gold_results = [env.call(c.name, c.arguments, episode=f"{episode}-gold") for step in task.gold for c in step]
        actual = [results_by_call[c.key()] for step in steps for c in step]
        answer = _restate(answer, gold_results, actual)
    answer = _summary_flaws(answer, task, mix, rng, fact_pool, flaws, entity_pool)
    messages.append({"role": "assistant", "content": answer})
    played.append(Turn(text=answer, parsed=hermes.parse(answer)))
    return Demonstration(task, messages, flaws, played)


def make_demonstrations(n_tasks: int, mix: DemoMix, seed: int = 0, split: str = "train", synthetic: float = 0.0, *,
                        entity_style: str = "syllables", paraphrase: float = 0.0) -> list[Demonstration]:
    """Demonstrations for ``n_tasks`` toolworld tasks of ``split`` (one per task), seeded.

    ``synthetic`` is the probability that a task's entities are first replaced
    by fresh names drawn in ``entity_style`` (:func:`~.augment.synthesize_entities`);
    ``paraphrase`` the probability that its request is then rephrased
    (:func:`~.paraphrase.paraphrase_task`, its own random stream per task, so the
    other draws do not depend on it).
    """
    for name, p in (("synthetic", synthetic), ("paraphrase", paraphrase)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
    rng = random.Random(seed)
    tasks = []
    for i, t in enumerate(toolworld.make_tasks(split, n=n_tasks, seed=seed)):
        if rng.random() < synthetic:
            t = synthesize_entities(t, toolworld.make_env(t), rng, episode=f"synth-{i}", style=entity_style) or t
        if paraphrase:
            prng = random.Random(f"paraphrase-{seed}-{i}")
            if prng.random() < paraphrase:
                t = paraphrase_task(t, prng) or t
        tasks.append(t)
    pool = ArgumentPool(tasks)
    fact_pool = sorted({f for t in tasks for f in t.answer_facts})
    entity_pool = sorted({e for t in tasks for e in t.meta.get("entities", []) if isinstance(e, str) and e})
    return [demonstrate(t, toolworld.make_env(t), mix, rng, pool, fact_pool, episode=f"demo-{i}", entity_pool=entity_pool)
            for i, t in enumerate(tasks)]


def render_texts(demos: Iterable[Demonstration]) -> Iterable[str]:
    """Each demonstration rendered with the project's chat template (tokenizer training text)."""
    template = chat_template()
    for d in demos:
        yield render_jinja_template([d.messages], tools=d.tools, chat_template=template)[0][0]
