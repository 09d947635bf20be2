"""Rates of the warm-started default model on the toolworld test split.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/warmstart_report.py [--n 300] [--group 4] [--json out.json]

Loads the shipped default model (``slca.models.load_default()``), samples rollouts
with ``slca.generation.rollout.generate_rollouts`` -- greedy (one per task) and at
temperature 1 (``--group`` per task, as GRPO samples them) -- and prints the
parseable-call rate, the paper's in-domain metrics (``in_domain_metrics``), the
execution and summary rewards and the flaws the warm start was built to leave
(sequential calls on parallel tasks, redundant calls, summary components), in
total and per task kind.

Wrong entities (issue 32), over tool-needing tasks with a non-empty answer:
``summary.wrong_entity`` is the share of answers the summary reward flags
(:func:`slca.rewards.summary.answer_claims` against the rollout's own evidence:
an entity neither the request nor a result supports, or a reported call that
does not name what the user asked about); ``wrong_entity_vs_gold`` checks the
same answer against the evidence of the gold calls instead (the request and
what the right calls return), so it also counts an answer that faithfully
repeats the entity of a wrong call (``Lisovo`` for ``Lisbon``).
``--tool-tasks`` draws only tool-needing tasks (kinds single, parallel, chain).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

import torch


def _mean(xs):
    xs = [x for x in xs if not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def gold_turns(task):
    """The task's gold steps (one turn each) with the results ``toolworld.run_gold`` gives them."""
    from slca.env import toolworld
    from slca.types import ParsedTurn, Turn

    return [Turn(text="<gold>", parsed=ParsedTurn(calls=list(step)), results=list(res))
            for step, res in zip(task.gold, toolworld.run_gold(task))]


def rollout_rates(trajs) -> dict[str, float]:
    """Per-rollout indicators, averaged. Keys are documented in docs/warmstart.md."""
    from slca.rewards import execution_reward, in_domain_metrics, parallel_split, summary_reward
    from slca.rewards.summary import answer_claims

    rows = defaultdict(list)
    for t in trajs:
        tool_turns = [u for u in t.turns if u.parsed.is_tool_turn]
        bad = [u for u in tool_turns if any(e.kind != "text_around_calls" for e in u.parsed.errors)]
        needs_tools = bool(t.task.gold)
        rows["turn_parse_rate"].extend([0.0 if u in bad else 1.0 for u in tool_turns])
        if needs_tools:
            rows["parseable_call_rate"].append(float(bool(tool_turns) and not bad))
            rows["called_when_needed"].append(float(bool(tool_turns)))
        else:
            rows["no_call_when_none_needed"].append(float(not tool_turns))
        m = in_domain_metrics(t.task, t.turns)
        for k, v in m.items():
            rows[k].append(v)
        ex = execution_reward(t.task, t.turns)
        sm = summary_reward(t.task, t.turns, t.final_text)
        rows["execution_reward"].append(ex.total)
        rows["summary_reward"].append(sm.total)
        for k, v in sm.components.items():
            rows[f"summary.{k}"].append(v)
        if needs_tools and t.final_text.strip():
            rows["summary.wrong_entity"].append(float(answer_claims(t.task, t.turns, t.final_text).wrong_entity))
            rows["wrong_entity_vs_gold"].append(float(answer_claims(t.task, gold_turns(t.task), t.final_text).wrong_entity))
        rows["parallel_tasks_split_over_turns"].append(parallel_split(t.task, t.turns))
        calls = [c.key() for u in tool_turns for c in u.parsed.calls]
        if needs_tools:
            rows["redundant_call_rate"].append(float(len(calls) != len(set(calls))))
        rows["stop_final_answer"].append(float(t.stop_reason == "final_answer"))
    return {k: _mean(v) for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="test tasks")
    ap.add_argument("--group", type=int, default=4, help="samples per task at temperature 1")
    ap.add_argument("--json", default=None, help="write the rates here")
    ap.add_argument("--model-dir", default=None, help="a saved model + tokenizer to evaluate instead of load_default()")
    ap.add_argument("--modes", default="greedy,sampled", help="comma-separated: greedy, sampled")
    ap.add_argument("--split", default="test", help="toolworld split: one of slca.env.toolworld.SPLITS (test, train_heldout, test_entities, test_phrasings, heldout_tools, train)")
    ap.add_argument("--seed", type=int, default=0, help="toolworld generator seed (train split: use one the warm start did not see)")
    ap.add_argument("--tool-tasks", action="store_true", help="only tool-needing tasks (kinds single, parallel, chain)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from slca.env import toolworld
    from slca.models import load_default
    from slca.generation.rollout import RolloutConfig, generate_rollouts

    t0 = time.perf_counter()
    if args.model_dir:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model, tok = AutoModelForCausalLM.from_pretrained(args.model_dir), AutoTokenizer.from_pretrained(args.model_dir)
        model.eval()
    else:
        model, tok = load_default(progress=True)
    print(f"load_default: {time.perf_counter() - t0:.1f}s, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")
    kinds = ["single", "parallel", "chain"] if args.tool_tasks else None
    tasks = toolworld.make_tasks(args.split, n=args.n, seed=args.seed, kinds=kinds)
    out = {}
    for name, cfg in (
        ("greedy", RolloutConfig(group_size=1, temperature=0.0, max_turns=4, max_new_tokens=128, max_total_tokens=768)),
        (f"sampled_T1_G{args.group}", RolloutConfig(group_size=args.group, temperature=1.0, max_turns=4, max_new_tokens=128,
                                                    max_total_tokens=768, seed=0)),
    ):
        if name.split("_")[0] not in args.modes.split(","):
            continue
        res = []
        gen_tokens, gen_seconds = 0, 0.0
        for i in range(0, len(tasks), 32):
            r = generate_rollouts(model, tok, tasks[i : i + 32], toolworld.make_env, cfg)
            res += r.trajectories
            gen_tokens += r.gen_tokens
            gen_seconds += r.gen_seconds
        rates = rollout_rates(res)
        rates["gen_tokens_per_s"] = gen_tokens / gen_seconds
        by_kind = {k: rollout_rates([t for t in res if t.task.kind == k]) for k in toolworld.KINDS}
        out[name] = {"all": rates, "by_kind": by_kind}
        print(f"\n== {name} ({len(res)} rollouts, {gen_tokens / gen_seconds:.0f} gen tok/s)")
        for k, v in rates.items():
            print(f"  {k:34s} {v:.3f}")
        keys = ["parseable_call_rate", "success", "execution_reward", "summary_reward", "summary.wrong_entity", "wrong_entity_vs_gold"]
        print("  by kind: " + "  ".join(keys))
        for kind, r in by_kind.items():
            print(f"    {kind:11s} " + "  ".join(f"{r.get(k, float('nan')):.3f}" for k in keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
