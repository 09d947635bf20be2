"""In-domain evaluation: toolworld's test split and loaded Toucan / paper-format rows.

Rollouts come from the project's rollout engine
(:func:`slca.generation.rollout.generate_rollouts`) against each task's simulator. The
tasks and their simulator factory come from the loader ``slca train`` uses
(:func:`slca.env.suites.load_suite`): toolworld's own world for toolworld tools
(its splits, or toolworld tasks saved to a file), the schema-guided simulator
for any other tool (loaded rows). Every rollout is scored by
:func:`slca.rewards.eval_scores`, the scoring the trainer's held-out sets
(``eval*/*``) use too. The report gives the paper's in-domain metrics
(:func:`slca.rewards.in_domain_metrics`):

* ``name_f1``: F1 between the multisets of called and gold tool names;
* ``arg_match``: agreement of the arguments of matched calls with the gold ones;
* ``process``: the fraction of gold steps whose calls all appear, in step order,
  in the rollout's call sequence (1 for a no-tool task answered without a call);
* ``success``: 1 when the normalised calls equal the gold calls and all executed;
* ``paper_success``: the authors' Success@0.9 (:func:`slca.rewards.paper.paper_success`: their
  process and summary scores average at least 0.9), slca's rule summary tier standing in for
  their LLM judge.

Each record also holds ``parse_ok`` (no turn had a parse error) and, for a
task with a parallel step, ``parallel_split`` (1 when its calls were spread over
more turns than it has steps). The metrics are reported overall and per group, with ``pass^k`` on ``success`` when K > 1
samples per task. Groups are task kinds (``Task.kind``) for toolworld and the
Toucan subsets (``single-turn-original``, ``single-turn-diversify``,
``irrelevant``, ``multi-turn``; ``meta["subset"]``, the kind for rows without
one) for ``--suite toucan``, as the paper reports its in-domain table.
"""

from __future__ import annotations

import logging
from typing import Callable

from rich.progress import Progress

from slca.env.loaders import prompt_lengths
from slca.eval.agent import PolicyAgent
from slca.eval.report import Record, SuiteReport, group_means, mean, pass_k
from slca.generation.rollout import RolloutConfig, generate_rollouts
from slca.rewards import eval_scores
from slca.types import Task

__all__ = ["GROUPINGS", "METRICS", "group_of", "run_in_domain"]

METRICS = ("name_f1", "arg_match", "process", "success", "paper_success")
GROUPINGS = ("kind", "subset")

log = logging.getLogger("slca.eval")


def group_of(task: Task, group_by: str) -> str:
    """A task's report group: its kind, or its Toucan subset (its kind when it has none)."""
    if group_by == "kind":
        return task.kind
    if group_by == "subset":
        return str(task.meta.get("subset") or task.kind)
    raise ValueError(f"group_by must be one of {GROUPINGS}, got {group_by!r}")


def run_in_domain(
    agent: PolicyAgent,
    tasks: list[Task],
    make_env: Callable[[Task], object],
    *,
    suite: str,
    samples: int = 1,
    max_turns: int = 4,
    max_total_tokens: int = 2048,
    progress: bool = True,
    model_label: str = "",
    group_by: str | None = None,
) -> SuiteReport:
    """Roll out every task ``samples`` times and report the in-domain metrics.

    ``group_by``: ``"kind"`` or ``"subset"`` (see :func:`group_of`); default
    ``"subset"`` for ``suite="toucan"``, ``"kind"`` otherwise. A task whose
    prompt alone reaches ``max_total_tokens`` cannot generate anything and
    scores as a failure; the report's notes and a warning say how many there were.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not tasks:
        raise ValueError("no tasks to evaluate")
    group_by = group_by or ("subset" if suite == "toucan" else "kind")
    group_of(tasks[0], group_by)  # refuse a bad group_by before any rollout
    g = agent.gen
    cfg = RolloutConfig.of(g, group_size=samples, max_turns=max_turns, max_total_tokens=max_total_tokens, format=agent.format_name,
                           chat_template=agent.chat_template)
    too_long = sum(n >= max_total_tokens for n in prompt_lengths(tasks, agent.tokenizer, chat_template=agent.chat_template))
    if too_long:
        log.warning("%s: %d of %d prompts reach max_total_tokens=%d and score as failures", suite, too_long, len(tasks), max_total_tokens)

    records: list[Record] = []
    bs = max(1, g.batch_size // samples)
    with Progress(disable=not progress, transient=True) as bar:
        bid = bar.add_task(f"{suite} tasks", total=len(tasks))
        for start in range(0, len(tasks), bs):
            chunk = tasks[start : start + bs]
            res = generate_rollouts(agent.model, agent.tokenizer, chunk, make_env, cfg)
            agent.generated_tokens += res.gen_tokens
            for i, traj in enumerate(res.trajectories):
                task = chunk[traj.group_id]
                scores = eval_scores(task, traj.turns, final_text=traj.final_text)
                records.append(Record(task.id, group_of(task, group_by), i % samples, scores, None,
                                      {"stop_reason": traj.stop_reason, "final_text": traj.final_text, "kind": task.kind}))
            bar.advance(bid, len(chunk))
    groups, counts = group_means(records, METRICS)
    metrics = {k: mean(r.scores[k] for r in records) for k in METRICS}
    metrics.update(pass_k(records, "success", range(2, samples + 1)))
    return SuiteReport(
        suite=suite,
        model=model_label,
        metrics=metrics,
        groups=groups,
        counts=counts,
        samples=samples,
        records=records,
        config={"tasks": len(tasks), "max_turns": max_turns, "format": agent.format_name, "temperature": g.temperature,
                "group_by": group_by, "prompts_too_long": too_long},
        notes=[f"metrics: slca.rewards.eval_scores per rollout, averaged; groups are task {'kinds' if group_by == 'kind' else 'subsets'}"]
        + ([f"{too_long} of {len(tasks)} prompts reach max_total_tokens={max_total_tokens}: no room to generate, scored as failures"] if too_long else []),
    )
