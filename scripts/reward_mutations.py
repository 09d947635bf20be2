"""The mutation table of both reward tiers: how often a mistake a user would notice lowers the reward.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/reward_mutations.py --n 600 --seed 5 [--split train] [--json out.json]

For every tool-needing toolworld task of the sample, the gold calls run through
``toolworld.make_env`` (one turn per gold step) and the reference answer is the
final text; that gold rollout's rewards are the baseline. Each row applies one
kind of mistake to the gold rollout -- to the answer (summary tier, scored by
``summary_reward``) or to the calls (execution tier, scored by
``execution_reward``) -- and counts a case as *dropped* when the mutated reward
is strictly below the gold reward of the same task. A row only counts the tasks
it applies to (a task whose answer names no unit has no wrong-unit case).
Deterministic for a given ``--n``, ``--seed`` and ``--split``.

Rows (summary tier): ``wrong entity`` (one request entity -- city, ticker,
person, event title, team, currency, cuisine -- swapped everywhere in the answer
for another of the same class), ``wrong number``, ``wrong unit or currency``
(one currency code or temperature unit swapped), ``dropped fact`` (one answer
fact deleted), ``invented fact`` (an extra sentence with an unsupported value or
entity), ``filler`` (neutral padding until the answer is over its concision
budget ``B``: the reward is meant to drop only past ``B``), ``refusal`` (a
refusal where an answer was due). Execution tier: ``wrong argument`` (one
argument value of one call swapped for another value seen for it), ``wrong
tool`` (one call made to another tool with the same arguments), ``redundant
call`` (one call repeated in an extra turn), ``split parallel step`` (the calls
of a parallel gold step made one per turn).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from slca.env import toolworld as tw
from slca.models import import_recipe
from slca.rewards import execution_reward, summary_reward
from slca.types import ParsedTurn, RewardBreakdown, Task, ToolCall, Turn

_warmstart = import_recipe()  # recipes/warmstart of this checkout: the demonstrations' value swaps and argument pool
replace_value, ArgumentPool = _warmstart.augment.replace_value, _warmstart.demos.ArgumentPool

# entity classes of toolworld (the script's knowledge of the world; the reward has none)
CLASSES: dict[str, list[str]] = {
    "city": tw._CITIES, "symbol": tw._SYMBOLS, "person": tw._PEOPLE, "title": tw._TITLES, "team": tw._TEAMS,
    "currency": tw.CURRENCIES, "cuisine": tw.CUISINES,
}
_NUM = re.compile(r"(?<![\w.:\-+])\d+(?:\.\d+)?(?![\w:\-]|\.\d)")
_FILLER = "Hope this helps, and let me know if there is anything else you would like me to look into."
_REFUSAL = "Sorry, I cannot help with that request."


def _turns(task: Task, steps: list[list[ToolCall]], episode: str) -> list[Turn]:
    """``steps`` (one assistant turn each) executed in a fresh environment of ``task``."""
    env = tw.make_env(task)
    return [Turn(text="<calls>", parsed=ParsedTurn(calls=list(s)), results=[env.call(c.name, c.arguments, episode=episode) for c in s])
            for s in steps]


def _answer(text: str) -> Turn:
    return Turn(text=text, parsed=ParsedTurn(content=text))


def _word_re(s: str) -> re.Pattern:
    return re.compile(rf"(?<![\w-]){re.escape(s)}(?![\w-])")


def request_entities(task: Task) -> list[tuple[str, str]]:
    """``(class, entity)`` for each entity of the task's request: its ``meta["entities"]`` plus the currency codes
    and cuisines it names."""
    req = task.messages[-1]["content"]
    out: list[tuple[str, str]] = []
    for cls, pool in CLASSES.items():
        for e in pool:
            if _word_re(e).search(req) and (cls in ("currency", "cuisine") or e in task.meta.get("entities", [])):
                out.append((cls, e))
    return out


# ------------------------------------------------------------------ summary-tier mutations: answer -> answer | None


def wrong_entity(task: Task, answer: str, rng: random.Random) -> str | None:
    """One request entity the answer names, swapped everywhere for another of its class."""
    named = [(c, e) for c, e in request_entities(task) if _word_re(e).search(answer)]
    if not named:
        return None
    cls, e = rng.choice(named)
    new = rng.choice([x for x in CLASSES[cls] if x != e])
    return _word_re(e).sub(lambda _: new, answer)


def wrong_number(task: Task, answer: str, rng: random.Random) -> str | None:
    """One number of the answer (not inside a date, time, score or id) changed."""
    spots = list(_NUM.finditer(answer))
    if not spots:
        return None
    m = rng.choice(spots)
    tok = m.group(0)
    if "." in tok:
        places = len(tok.split(".")[1])
        step = rng.randint(1, 9) * 10 ** -places * rng.choice([-1, 1]) + rng.choice([-1, 1])
        new = f"{max(0.0, float(tok) + step):.{places}f}"
    else:
        new = str(max(0, int(tok) + rng.choice([-3, -2, -1, 1, 2, 3])))
    if new == tok:
        new = str(int(float(tok)) + 5)
    return answer[: m.start()] + new + answer[m.end():]


def wrong_unit(task: Task, answer: str, rng: random.Random) -> str | None:
    """One currency code or temperature unit of the answer swapped for another."""
    spots = [(m, [c for c in tw.CURRENCIES if c != m.group(0)]) for c in tw.CURRENCIES for m in _word_re(c).finditer(answer)]
    spots += [(m, ["F"]) for m in re.finditer(r"(?<=\d )C(?![\w])", answer)]
    if not spots:
        return None
    m, alternatives = rng.choice(sorted(spots, key=lambda s: s[0].start()))
    return answer[: m.start()] + rng.choice(alternatives) + answer[m.end():]


def dropped_fact(task: Task, answer: str, rng: random.Random) -> str | None:
    """One of ``task.answer_facts`` deleted wherever the answer states it."""
    facts = [f for f in task.answer_facts if replace_value(answer, f, "\0") != answer]
    if not facts:
        return None
    out = replace_value(answer, rng.choice(facts), "")
    return re.sub(r"\s+([.,;)])", r"\1", re.sub(r" {2,}", " ", out)).strip()


def invented_fact(task: Task, answer: str, rng: random.Random) -> str | None:
    """The answer plus one sentence stating an unsupported value, entity or both."""
    req = task.messages[-1]["content"]
    city = rng.choice([c for c in tw._CITIES if c not in req and c not in answer])
    n = rng.randint(2, 400)
    sentence = rng.choice([
        f"Also, the rate in {city} is {n}.",           # value and entity
        f"There is also a fee of {n} on top.",         # value only
        f"A similar offer exists in {city}.",          # entity only
        f"The reference number is ZX{n:03d}.",         # an id
    ])
    return f"{answer} {sentence}"


def filler(task: Task, answer: str, rng: random.Random) -> str | None:
    """The answer padded with neutral filler until it is over its concision budget (by 1 to B words)."""
    ref = task.reference_answer if task.reference_answer is not None else answer
    budget = max(12, 2 * len(ref.split()))
    target = budget + rng.randint(1, budget)
    words = answer.split()
    pad = _FILLER.split()
    i = 0
    while len(words) < target:
        words.append(pad[i % len(pad)])
        i += 1
    return " ".join(words)


def refusal(task: Task, answer: str, rng: random.Random) -> str | None:
    """A refusal instead of the answer."""
    return _REFUSAL


# -------------------------------------------------------------- execution-tier mutations: steps -> steps | None


def wrong_argument(task: Task, steps: list[list[ToolCall]], rng: random.Random, pool: ArgumentPool) -> list[list[ToolCall]] | None:
    """One argument value of one call swapped for another value seen for that argument."""
    spots = [(i, j, k) for i, s in enumerate(steps) for j, c in enumerate(s) for k in c.arguments
             if pool.other(c.name, k, c.arguments[k], random.Random(0)) is not None]
    if not spots:
        return None
    i, j, k = rng.choice(spots)
    c = steps[i][j]
    new = [list(s) for s in steps]
    new[i][j] = ToolCall(c.name, {**c.arguments, k: pool.other(c.name, k, c.arguments[k], rng)})
    return new


def wrong_tool(task: Task, steps: list[list[ToolCall]], rng: random.Random, pool: ArgumentPool) -> list[list[ToolCall]] | None:
    """One call made to another tool (an offered one when there is one) with the same arguments."""
    i = rng.randrange(len(steps))
    j = rng.randrange(len(steps[i]))
    c = steps[i][j]
    offered = [t["function"]["name"] for t in task.tools if t["function"]["name"] != c.name]
    names = offered or [n for n in tw.FUNCTIONS if n != c.name]
    new = [list(s) for s in steps]
    new[i][j] = ToolCall(rng.choice(names), dict(c.arguments))
    return new


def redundant_call(task: Task, steps: list[list[ToolCall]], rng: random.Random, pool: ArgumentPool) -> list[list[ToolCall]] | None:
    """One call repeated in an extra turn right after its step."""
    i = rng.randrange(len(steps))
    new = [list(s) for s in steps]
    new.insert(i + 1, [rng.choice(steps[i])])
    return new


def split_parallel(task: Task, steps: list[list[ToolCall]], rng: random.Random, pool: ArgumentPool) -> list[list[ToolCall]] | None:
    """The calls of every parallel step made one per turn."""
    if all(len(s) == 1 for s in steps):
        return None
    return [[c] for s in steps for c in s]


SUMMARY_ROWS: dict[str, Callable] = {
    "wrong entity": wrong_entity, "wrong number": wrong_number, "wrong unit or currency": wrong_unit,
    "dropped fact": dropped_fact, "invented fact": invented_fact, "filler": filler, "refusal": refusal,
}
EXECUTION_ROWS: dict[str, Callable] = {
    "wrong argument": wrong_argument, "wrong tool": wrong_tool, "redundant call": redundant_call,
    "split parallel step": split_parallel,
}


@dataclass
class Row:
    """One mutation kind: how many cases it made, how many lowered the reward, the mean rewards, the misses."""

    tier: str
    name: str
    cases: int = 0
    dropped: int = 0
    gold_sum: float = 0.0
    mutated_sum: float = 0.0
    by_type: dict[str, list[int]] = field(default_factory=dict)
    component_drops: dict[str, int] = field(default_factory=dict)
    misses: list[dict[str, Any]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.dropped / self.cases if self.cases else float("nan")

    def add(self, task: Task, gold: RewardBreakdown, mutated: RewardBreakdown, example: Any) -> None:
        for k, v in mutated.components.items():
            self.component_drops[k] = self.component_drops.get(k, 0) + (v < gold.components[k] - 1e-9)
        gold, mutated = gold.total, mutated.total
        drop = mutated < gold - 1e-9
        self.cases += 1
        self.dropped += drop
        self.gold_sum += gold
        self.mutated_sum += mutated
        t = self.by_type.setdefault(task.meta["task_type"], [0, 0])
        t[0] += 1
        t[1] += drop
        if not drop and len(self.misses) < 50:
            self.misses.append({"task": task.id, "task_type": task.meta["task_type"], "request": task.messages[-1]["content"],
                                "mutated": example,
                                "gold_reward": round(gold, 4), "mutated_reward": round(mutated, 4)})


def summary_cases(n: int = 600, seed: int = 5, split: str = "train") -> Iterator[tuple[str, Task, list[Turn], str, str]]:
    """``(row, task, gold_turns, reference_answer, mutated_answer)`` for every summary-tier case of the table, in
    its order (the same tasks, seeds and mutations as :func:`mutation_table`)."""
    for i, task in enumerate(t for t in tw.make_tasks(split, n=n, seed=seed) if t.gold):
        ref = task.reference_answer
        gold_turns = _turns(task, task.gold, f"gold-{i}")
        for name, mutate in SUMMARY_ROWS.items():
            text = mutate(task, ref, random.Random(f"{seed}|{task.id}|{name}"))
            if text is not None and text != ref:
                yield name, task, gold_turns, ref, text


def mutation_table(n: int = 600, seed: int = 5, split: str = "train") -> list[Row]:
    """Every row of the table over the tool-needing tasks among ``toolworld.make_tasks(split, n, seed)``."""
    rows = {k: Row("summary", k) for k in SUMMARY_ROWS} | {k: Row("execution", k) for k in EXECUTION_ROWS}
    gold_s: dict[str, RewardBreakdown] = {}
    for name, task, gold_turns, ref, text in summary_cases(n, seed, split):
        if task.id not in gold_s:
            gold_s[task.id] = summary_reward(task, gold_turns + [_answer(ref)], ref)
        rows[name].add(task, gold_s[task.id], summary_reward(task, gold_turns + [_answer(text)], text), text)
    tasks = [t for t in tw.make_tasks(split, n=n, seed=seed) if t.gold]
    pool = ArgumentPool(tasks)
    for i, task in enumerate(tasks):
        gold_e = execution_reward(task, _turns(task, task.gold, f"gold-{i}"))
        for name, mutate in EXECUTION_ROWS.items():
            steps = mutate(task, [list(s) for s in task.gold], random.Random(f"{seed}|{task.id}|{name}"), pool)
            if steps is not None:
                turns = _turns(task, steps, f"mut-{i}")
                rows[name].add(task, gold_e, execution_reward(task, turns), [[(c.name, c.arguments) for c in s] for s in steps])
    return list(rows.values())


def markdown(rows: list[Row]) -> str:
    """The table as markdown: tier, mutation, cases, reward drops (share), mean gold and mutated reward, and the
    components that dropped most often."""
    lines = ["| tier | mutation | cases | reward drops | mean gold | mean mutated | components that dropped (cases) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        comps = ", ".join(f"{k} {v}" for k, v in sorted(r.component_drops.items(), key=lambda kv: -kv[1]) if v)
        lines.append(f"| {r.tier} | {r.name} | {r.cases} | {r.dropped} ({r.share:.3f}) | {r.gold_sum / max(1, r.cases):.3f} | "
                     f"{r.mutated_sum / max(1, r.cases):.3f} | {comps} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=600, help="toolworld tasks to draw (the tool-needing ones are used)")
    ap.add_argument("--seed", type=int, default=5, help="toolworld generator seed")
    ap.add_argument("--split", default="train", choices=tw.SPLITS)
    ap.add_argument("--json", default=None, help="also write the rows (with per-task-type counts and a few misses) here")
    ap.add_argument("--misses", action="store_true", help="print the per-task-type counts and a few cases that did not drop")
    args = ap.parse_args()
    rows = mutation_table(args.n, args.seed, args.split)
    n_tasks = max(r.cases for r in rows if r.name == "refusal")
    print(f"toolworld {args.split}, n={args.n}, seed={args.seed}: {n_tasks} tool-needing tasks\n")
    print(markdown(rows))
    if args.misses:
        for r in rows:
            if r.dropped < r.cases:
                print(f"\n{r.tier} / {r.name}: by task type (cases, dropped) {r.by_type}")
                for m in r.misses[:5]:
                    print("   ", m)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r.__dict__, "share": r.share} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
