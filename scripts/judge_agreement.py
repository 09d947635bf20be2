"""The summary tier's LLM judge, on a real model served on loopback, against the rule-based tier.

Usage (from the repository root; needs the ``smollm2`` and ``serve`` extras, which ``make setup-test`` installs)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/judge_agreement.py --model smollm2 --n 40 [--constrain digits] [--json out.json]

It exports ``--model`` with ``slca export-model``'s defaults into a temporary folder, serves it with
``transformers serve`` on a free loopback port (:class:`slca.models.serving.TransformersServer`) and, for
every summary-tier case of the mutation table (``scripts/reward_mutations.py``: the same tasks, seeds and
mutations), asks :class:`slca.rewards.OpenAIJudge` (greedy, ``max_tokens`` 16, one retry) to score the gold
answer and the mutated one. ``--constrain digits`` (off by default) loads the exported model's tokenizer and
sends :func:`slca.rewards.digit_logit_bias` (+100 on the one-token digits and the end token) with
``max_tokens`` 2, so the reply can only be a bare number: "7" and "10" are scores, "77" is out of range and
counted invalid (never clamped); the rubric is the same. A case counts as a *judge drop* when the judge scored both and the mutated answer
lower, as a *rule drop* when the rule-based summary reward fell (the table's own criterion). Printed per row:
cases, cases the judge scored (both answers), judge drops, rule drops, agreement (both tiers decide the same
way, over the cases the judge scored), and mean judge scores; then the judge's request counts (invalid
replies, faults), why the unscored scores failed, the judge's score histogram, wall time and CPU seconds
(this process and the server).

The judge is off by default in training (``summary_reward(..., judge=None)``); this script measures what it
would add. A judge that cannot score a case (no parsable 0-10 score after its retry) leaves that case out of
the agreement and is counted, never scored as 0.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reward_mutations import SUMMARY_ROWS, _answer, summary_cases  # noqa: E402

from slca.models.serving import TransformersServer, export_for_serving  # noqa: E402
from slca.rewards import OpenAIJudge, digit_logit_bias, summary_reward  # noqa: E402
from slca.rewards.common import Unscorable  # noqa: E402


@dataclass
class Agreement:
    """One mutation row: the rule tier's and the judge's verdicts on its cases."""

    name: str
    cases: int = 0
    scored: int = 0
    judge_drops: int = 0
    rule_drops: int = 0
    rule_drops_scored: int = 0
    agree: int = 0
    judge_gold: list[float] = field(default_factory=list)
    judge_mutated: list[float] = field(default_factory=list)

    def add(self, rule_drop: bool, gold: float | None, mutated: float | None) -> None:
        self.cases += 1
        self.rule_drops += rule_drop
        if gold is None or mutated is None:
            return
        judge_drop = mutated < gold
        self.scored += 1
        self.judge_drops += judge_drop
        self.rule_drops_scored += rule_drop
        self.agree += judge_drop == rule_drop
        self.judge_gold.append(gold)
        self.judge_mutated.append(mutated)

    def line(self) -> str:
        def share(k: int, n: int) -> str:
            return f"{k} ({k / n:.2f})" if n else "0 (-)"

        def mean(xs: list[float]) -> str:
            return f"{sum(xs) / len(xs):.2f}" if xs else "-"

        return (f"| {self.name} | {self.cases} | {self.scored} | {share(self.judge_drops, self.scored)} | "
                f"{share(self.rule_drops_scored, self.scored)} | {share(self.agree, self.scored)} | "
                f"{mean(self.judge_gold)} | {mean(self.judge_mutated)} |")


HEADER = ("| mutation | cases | judge scored | judge drops | rule drops | agreement | mean judge (gold) | mean judge (mutated) |\n"
          "|---|---|---|---|---|---|---|---|")


@dataclass
class Verdicts:
    """Every score the judge gave (the gold answers once per task) and why the others failed."""

    scores: Counter[float] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


def measure(judge: OpenAIJudge, n: int, seed: int, split: str, verdicts: Verdicts) -> dict[str, Agreement]:
    """Every summary-tier case of the mutation table, scored by the rule tier and by ``judge``."""
    rows = {k: Agreement(k) for k in SUMMARY_ROWS}
    gold_rule: dict[str, float] = {}
    gold_judge: dict[str, float | None] = {}

    def judged(task, turns, text) -> float | None:
        try:
            s = judge.score(task, turns, text)
        except Unscorable as e:
            verdicts.failures[str(e)] += 1
            return None
        verdicts.scores[s] += 1
        return s

    for name, task, gold_turns, ref, text in summary_cases(n, seed, split):
        if task.id not in gold_rule:
            gold_rule[task.id] = summary_reward(task, gold_turns + [_answer(ref)], ref).total
            gold_judge[task.id] = judged(task, gold_turns + [_answer(ref)], ref)
        rule = summary_reward(task, gold_turns + [_answer(text)], text).total
        rows[name].add(rule < gold_rule[task.id] - 1e-9, gold_judge[task.id], judged(task, gold_turns + [_answer(text)], text))
    return rows


def make_judge(base_url: str, folder: Path, constrain: str, max_tokens: int | None) -> OpenAIJudge:
    """The judge as measured: greedy, one retry; with ``constrain == "digits"`` its reply is a bare number."""
    bias = None
    if constrain == "digits":
        from transformers import AutoTokenizer

        bias = digit_logit_bias(AutoTokenizer.from_pretrained(folder))
    if max_tokens is None:
        max_tokens = 2 if bias is not None else 16
    return OpenAIJudge(base_url, str(folder), max_retries=1, max_tokens=max_tokens, logit_bias=bias, timeout=600.0, http_attempts=1)


def report(args: argparse.Namespace, judge: OpenAIJudge, rows: dict[str, Agreement], verdicts: Verdicts,
           wall: float, cpu: dict[str, float]) -> dict:
    """Print the table and the counts; return them for ``--json``."""
    tasks = max(r.cases for r in rows.values())
    print(f"judge: {args.model} via transformers serve, greedy, max_tokens {judge.max_tokens}, constrain {args.constrain}; "
          f"toolworld {args.split}, n={args.n}, seed={args.seed}: {tasks} tool-needing tasks\n")
    print(HEADER)
    for r in rows.values():
        print(r.line())
    total = Agreement("all rows")
    for r in rows.values():
        for k in ("cases", "scored", "judge_drops", "rule_drops", "rule_drops_scored", "agree"):
            setattr(total, k, getattr(total, k) + getattr(r, k))
        total.judge_gold += r.judge_gold
        total.judge_mutated += r.judge_mutated
    print(total.line())
    counts = dict(judge.metrics)
    hist = {f"{k:g}": v for k, v in sorted(verdicts.scores.items())}
    print(f"\njudge requests: {counts}\njudge scores given (score/10: count): {hist}")
    print(f"scores not given ({sum(verdicts.failures.values())}), by reason: {dict(verdicts.failures.most_common(10))}")
    print(f"wall {wall:.0f} s; CPU {cpu['script']:.0f} s (this process) + {cpu['server']:.0f} s (server)")
    return {"model": args.model, "n": args.n, "seed": args.seed, "split": args.split, "max_tokens": judge.max_tokens,
            "constrain": args.constrain, "logit_bias": judge.logit_bias, "rows": [{**r.__dict__} for r in rows.values()],
            "requests": counts, "scores": hist, "failures": dict(verdicts.failures), "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="what to serve: a named model (smollm2, default), a folder or a checkpoint")
    ap.add_argument("--n", type=int, default=40, help="toolworld tasks to draw (the tool-needing ones are used)")
    ap.add_argument("--seed", type=int, default=5, help="toolworld generator seed (the mutation table's default)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--max-tokens", type=int, default=None, help="bound on each judge reply (default 16; 2 with --constrain digits)")
    ap.add_argument("--constrain", choices=["none", "digits"], default="none",
                    help="digits: logit_bias on the model's digit and end tokens, so the reply is a bare number (default none)")
    ap.add_argument("--json", default=None, help="also write the rows and counts here")
    args = ap.parse_args()
    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    verdicts = Verdicts()
    with tempfile.TemporaryDirectory(prefix="slca-judge-") as tmp:
        folder = export_for_serving(args.model, Path(tmp) / "model")
        with TransformersServer(Path(tmp) / "server.log") as server:
            judge = make_judge(server.base_url, folder, args.constrain, args.max_tokens)
            rows = measure(judge, args.n, args.seed, args.split, verdicts)
            server_cpu = server.cpu_seconds()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = {"script": (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime), "server": server_cpu}
    out = report(args, judge, rows, verdicts, time.monotonic() - t0, cpu)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x))


if __name__ == "__main__":
    main()
