"""Execution tier of the hierarchical rewards (HierR): the reward for tool tokens.

Components, each in [0, 1] (``P`` = the rollout's well-formed calls over all
tool turns, ``G`` = the gold calls over all gold steps, both as multisets):

* ``format``    -- mean over tool turns of 1 (clean), 0.5 (only text around the
  calls), 0 (a malformed call). 0 when gold needs calls and none was attempted.
* ``name_f1``   -- F1 between the multisets of call names in ``P`` and ``G``.
* ``arg_match`` -- calls of ``P`` and ``G`` with the same name are paired
  greedily by score; a pair scores ``|{k : p[k] == g[k]}| / |keys(p) U keys(g)|``
  (values compared after :func:`~slca.rewards.values.normalize`), 0 if ``p``
  violates its tool's JSON Schema; ``arg_match = sum(pair scores) / max(|P|, |G|)``.
* ``success``   -- fraction of calls in ``P`` whose execution returned ``ok``.
* ``efficiency``-- ``min(1, S / T) * U / |P|`` with ``S`` gold steps, ``T`` tool
  turns, ``U`` distinct calls: splitting a parallel step over several turns,
  extra turns and repeated calls all cost.

Lower tiers gate higher ones (a cascade): with ``c = (format, name_f1,
arg_match, success, efficiency)`` and weights ``w`` summing to 1,

    R_exec = sum_k w_k * prod_{j <= k} c_j,

so a perfect rollout scores 1, and a tier only pays to the extent that every
tier below it holds. Tasks with no gold calls (no tool needed, unservable) score
1 when the rollout makes no call and ``w_format * format`` otherwise.

Also the paper's in-domain metrics (arXiv 2609.29050, Sec. 5): Name F1,
ArgMatch, Process (fraction of gold steps completed in order) and Success
(the rollout made exactly the gold calls, all executed); :func:`eval_scores` reports the
authors' Success@0.9 (:mod:`slca.rewards.paper`) beside them.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

from slca.env.schema import ToolBox
from slca.rewards.common import Unscorable, collect_calls, gold_calls, pair_score, task_toolbox
from slca.rewards.values import normalize, normalized_call_key
from slca.types import RewardBreakdown, Task, ToolCall, Turn

__all__ = ["EVAL_SCORES", "EXECUTION_WEIGHTS", "eval_scores", "execution_reward", "in_domain_metrics", "parallel_split", "Unscorable"]

log = logging.getLogger("slca.rewards")

#: The names :func:`eval_scores` returns, in order: the paper's in-domain metrics, then the parse and split checks
#: (``parallel_split`` only for a task with a parallel step), then the authors' Success@0.9 (``paper_success``,
#: only when the final text is given).
EVAL_SCORES = ("name_f1", "arg_match", "process", "success", "parse_ok", "parallel_split", "paper_success")

#: Cascade weights (format, name_f1, arg_match, success, efficiency).
EXECUTION_WEIGHTS: dict[str, float] = {"format": 0.1, "name_f1": 0.2, "arg_match": 0.3, "success": 0.2, "efficiency": 0.2}


def _turn_format(t: Turn) -> float:
    if not t.parsed.errors:
        return 1.0
    return 0.0 if t.parsed.blocking_errors else 0.5


def _name_f1(pred: list[ToolCall], gold: list[ToolCall]) -> float:
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0
    tp = sum((Counter(c.name for c in pred) & Counter(c.name for c in gold)).values())
    return 2 * tp / (len(pred) + len(gold))


def _match(pred: list[ToolCall], gold: list[ToolCall], box: ToolBox) -> list[tuple[int, int, float]]:
    """Greedy max-score pairing of same-name calls: ``(pred index, gold index, score)``."""
    cands = sorted(
        ((pair_score(p, g, box), -gi, -pi, pi, gi) for pi, p in enumerate(pred) for gi, g in enumerate(gold) if p.name == g.name),
        reverse=True,
    )
    used_p, used_g, out = set(), set(), []
    for score, _, _, pi, gi in cands:
        if pi not in used_p and gi not in used_g:
            used_p.add(pi)
            used_g.add(gi)
            out.append((pi, gi, score))
    return out


def _arg_match(pred: list[ToolCall], gold: list[ToolCall], box: ToolBox) -> float:
    if not pred and not gold:
        return 1.0
    return sum(s for _, _, s in _match(pred, gold, box)) / max(len(pred), len(gold))


def _components(task: Task, turns: list[Turn]) -> dict[str, float]:
    ro = collect_calls(turns)
    gold = gold_calls(task)
    box = task_toolbox(task)
    pred = ro.calls
    if ro.tool_turns:
        fmt = sum(_turn_format(t) for t in ro.tool_turns) / len(ro.tool_turns)
    else:
        fmt = 0.0 if gold else 1.0
    success = sum(r.ok for r in ro.results) / len(ro.results) if ro.results else (0.0 if gold else 1.0)
    if ro.tool_turns:
        steps = max(1, len(task.gold))
        turn_eff = min(1.0, steps / len(ro.tool_turns))
        dup_eff = len({c.key() for c in pred}) / len(pred) if pred else 1.0
        eff = turn_eff * dup_eff
    else:
        eff = 1.0
    return {
        "format": fmt,
        "name_f1": _name_f1(pred, gold),
        "arg_match": _arg_match(pred, gold, box),
        "success": success,
        "efficiency": eff,
    }


def _nan(reason: str, keys: list[str]) -> RewardBreakdown:
    log.warning("reward is NaN: %s", reason)
    return RewardBreakdown(total=math.nan, components={k: math.nan for k in keys}, reason=reason)


def execution_reward(task: Task, turns: list[Turn], *, weights: dict[str, float] | None = None) -> RewardBreakdown:
    """The execution-tier reward of one rollout, in [0, 1] (NaN + reason if unscorable).

    Args:
        task: the task (its ``gold`` steps and ``tools``).
        turns: the rollout's assistant turns in order (tool turns and the final answer);
            ``turn.results[i]`` is the environment's answer to ``turn.parsed.calls[i]``.
        weights: cascade weights keyed as :data:`EXECUTION_WEIGHTS` (must sum to 1).

    Returns:
        ``RewardBreakdown(total, {format, name_f1, arg_match, success, efficiency})``.
    """
    w = dict(EXECUTION_WEIGHTS if weights is None else weights)
    if set(w) != set(EXECUTION_WEIGHTS) or abs(sum(w.values()) - 1.0) > 1e-6 or min(w.values()) < 0:
        raise ValueError(f"weights must be non-negative, keyed {list(EXECUTION_WEIGHTS)} and sum to 1, got {w}")
    try:
        comp = _components(task, turns)
    except Unscorable as e:
        return _nan(f"task {task.id!r}: {e}", list(EXECUTION_WEIGHTS))
    total, gate = 0.0, 1.0
    for k in EXECUTION_WEIGHTS:
        gate *= comp[k]
        total += w[k] * gate
    return RewardBreakdown(total=total, components=comp)


def _process(pred: list[ToolCall], task: Task) -> float:
    """Fraction of gold steps whose calls all appear, in step order, in the rollout's call sequence."""
    if not task.gold:
        return 1.0 if not pred else 0.0
    keys = [(c.name, normalize(c.arguments)) for c in pred]
    pos, done = 0, 0
    for step in task.gold:
        need = [(c.name, normalize(c.arguments)) for c in step]
        avail = list(enumerate(keys))[pos:]
        found_at = []
        for k in need:
            hit = next((i for i, kk in avail if kk == k and i not in found_at), None)
            if hit is None:
                break
            found_at.append(hit)
        if len(found_at) != len(need):
            break
        done += 1
        pos = max(found_at) + 1
    return done / len(task.gold)


def in_domain_metrics(task: Task, turns: list[Turn]) -> dict[str, float]:
    """The paper's in-domain metrics of one rollout: ``name_f1``, ``arg_match``, ``process``, ``success``.

    ``success`` is 1 when the multiset of normalised calls equals the gold one
    and every call executed; all values are NaN (reason logged) if unscorable.
    """
    keys = ["name_f1", "arg_match", "process", "success"]
    try:
        ro = collect_calls(turns)
        gold = gold_calls(task)
        box = task_toolbox(task)
    except Unscorable as e:
        log.warning("in-domain metrics are NaN: task %r: %s", task.id, e)
        return {k: math.nan for k in keys}
    pred = ro.calls
    same = Counter(map(normalized_call_key, pred)) == Counter(map(normalized_call_key, gold))
    return {
        "name_f1": _name_f1(pred, gold),
        "arg_match": _arg_match(pred, gold, box),
        "process": _process(pred, task),
        "success": float(same and all(r.ok for r in ro.results)),
    }


def parallel_split(task: Task, turns: list[Turn]) -> float:
    """The paper's diagnostic case: did a rollout split a parallel step over turns?

    For a task with a gold step of two or more independent calls: 1.0 when the
    rollout made more tool-calling turns than the task has gold steps (e.g. the
    calls of one parallel step sent one per turn), else 0.0. NaN for any other
    task (nothing to split). Averaged over rollouts it is the share of parallel
    tasks split over turns.
    """
    if not any(len(step) > 1 for step in task.gold):
        return math.nan
    return float(sum(t.parsed.is_tool_turn for t in turns) > len(task.gold))


def eval_scores(task: Task, turns: list[Turn], final_text: str | None = None) -> dict[str, float]:
    """Every score of one evaluation rollout (:data:`EVAL_SCORES`): the one scoring that
    ``slca eval``'s in-domain suites (:func:`slca.eval.in_domain.run_in_domain`, per record)
    and the trainer's held-out sets (:meth:`slca.training.trainer.Trainer.evaluate_on`, ``eval*/*``) share.

    :func:`in_domain_metrics` (``name_f1``, ``arg_match``, ``process``, ``success``; NaN when
    unscorable), ``parse_ok`` (1.0 when no turn had a parse error) and, only for a task with a
    parallel step, :func:`parallel_split` (a set without one has no such figure). Averaged over the
    rollouts of one task kind, ``success`` is that kind's success. Given the rollout's
    ``final_text``, also ``paper_success``: the authors' Success@0.9
    (:func:`slca.rewards.paper.paper_success`, with slca's rule summary tier standing in for their
    LLM judge), reported beside slca's ``success``, which it does not change.
    """
    scores = {**in_domain_metrics(task, turns), "parse_ok": float(all(not t.parsed.errors for t in turns))}
    split = parallel_split(task, turns)
    if not math.isnan(split):
        scores["parallel_split"] = split
    if final_text is not None:
        from slca.rewards.paper import paper_success  # paper.py builds on this module

        scores["paper_success"] = paper_success(task, turns, final_text)
    return scores
