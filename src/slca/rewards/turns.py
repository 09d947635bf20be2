"""Per-turn execution scores and tool-outcome signatures (inputs of ``slca_turn`` / ``slca_cond``).

Two known limits of SLCA (arXiv 2609.29050) need more than one scalar per tool
segment (see ``docs/beyond.md``):

* :func:`turn_scores` -- one execution score per tool turn, for temporal credit
  inside the tool segment (MT-GRPO-style turn-level rewards, arXiv 2505.11821);
* :func:`tool_signature` -- what the tool segment produced, so that a summary is
  compared only with summaries written from the same tool outcome.

Definitions (``C_k`` = the well-formed calls of tool turn ``k``, ``E_k`` its
blocking parse errors, ``r(c)`` the environment's answer to call ``c``):

Turn score. Gold calls form a multiset ``R`` of *remaining* calls, initially all
calls of all gold steps. Turns are visited in order and, inside a turn, calls in
order. Call ``c`` is credited

    ``s(c) = max_{g in R, g.name = c.name} match(c, g) * [r(c).ok]``

where ``match`` is the execution tier's pair score (fraction of argument keys
whose normalised values agree; 0 if ``c`` violates its tool's JSON Schema), and
the maximising ``g`` (first in gold order on ties) is removed from ``R`` when
``s(c) > 0``. So a correct call scores 1 once; repeating it in a later turn
scores 0 (the gold call was already made), as does a call of a wrong tool, a
failed call, or any call on a task whose gold has no call. The turn's score is

    ``S_k = sum_{c in C_k} s(c) / (|C_k| + |E_k|)``  in [0, 1],

i.e. the fraction of what the turn attempted that was a new, correct, executed
gold call (with partial credit for partly right arguments). A tool turn whose
calls were not all answered (the rollout was cut) scores NaN, and so do all
turns of a rollout whose task cannot be scored (invalid tool schemas).

Signature. ``sig = sorted multiset of (normalised call key, ok)`` over every
answered call of every tool turn: two rollouts share a signature exactly when
they made the same calls (up to order and value normalisation) with the same
success, so their summaries were written from the same tool results.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from slca.rewards.common import Unscorable, check_turns, gold_calls, pair_score, task_toolbox
from slca.rewards.values import normalized_call_key
from slca.types import Task, Trajectory, Turn

__all__ = ["turn_scores", "tool_signature", "tool_signatures", "turn_reward_matrix", "turn_rewards", "subgroup_fraction"]


def turn_scores(task: Task, turns: list[Turn]) -> list[float]:
    """Execution score ``S_k`` of each tool turn of one rollout (module docstring).

    Args:
        task: the task (its ``gold`` steps and ``tools``).
        turns: the rollout's assistant turns in order; non-tool turns (the final
            answer) are skipped.

    Returns:
        One float in [0, 1] (or NaN) per tool turn, in order: element ``k``
        belongs to the ``k``-th tool turn, i.e. the ``k``-th policy-token run of
        the tool segment (:func:`slca.core.segments.turn_index`).

    Example (gold: one call ``f(x=1)``; turn 0 calls it, turn 1 repeats it):
        ``turn_scores(task, [t0, t1]) == [1.0, 0.0]``
    """
    check_turns(turns)
    tool_turns = [t for t in turns if t.parsed.is_tool_turn]
    try:
        remaining = list(gold_calls(task))
        box = task_toolbox(task)
    except Unscorable:
        return [math.nan] * len(tool_turns)
    out: list[float] = []
    for t in tool_turns:
        calls = t.parsed.calls
        if len(t.results) < len(calls):
            out.append(math.nan)
            continue
        credit = 0.0
        for c, r in zip(calls, t.results):
            best, best_j = 0.0, -1
            for j, g in enumerate(remaining):
                if g.name == c.name:
                    s = pair_score(c, g, box)
                    if s > best:
                        best, best_j = s, j
            if r.ok and best > 0:
                credit += best
                remaining.pop(best_j)
        out.append(credit / (len(calls) + len(t.parsed.blocking_errors)))
    return out


def tool_signature(turns: list[Turn]) -> tuple[tuple[str, bool], ...]:
    """The tool outcome of one rollout: sorted ``(normalized_call_key, ok)`` over its answered calls.

    Hashable; ``()`` for a rollout that made no (answered) call.
    """
    check_turns(turns)
    sig = []
    for t in turns:
        if not t.parsed.is_tool_turn:
            continue
        for c, r in zip(t.parsed.calls, t.results):
            sig.append((normalized_call_key(c), bool(r.ok)))
    return tuple(sorted(sig))


def turn_reward_matrix(per_rollout: list[list[float]]) -> torch.Tensor:
    """Stack per-rollout turn scores into a (B, K) tensor, NaN-padded.

    Args:
        per_rollout: B lists, e.g. ``[turn_scores(t.task, t.turns) for t in trajectories]``.

    Returns:
        (B, K) float32 with ``K = max(len)`` (0 when no rollout has a tool turn);
        entry ``(i, k)`` is NaN when rollout ``i`` has no turn ``k``.
    """
    if not per_rollout:
        raise ValueError("per_rollout is empty: pass one list of turn scores per rollout")
    K = max(len(x) for x in per_rollout)
    out = torch.full((len(per_rollout), K), math.nan, dtype=torch.float32)
    for i, xs in enumerate(per_rollout):
        if xs:
            out[i, : len(xs)] = torch.tensor(xs, dtype=torch.float32)
    return out


def subgroup_fraction(group_ids: list, signatures: list) -> float:
    """Share of rollouts whose ``slca_cond`` summary baseline is not the whole group's.

    Those are the rollouts whose (group, signature) sub-group has at least two
    members but is not the whole group (NaN rewards ignored here). 0 means
    ``slca_cond`` equals ``slca`` on that batch.
    """
    if len(group_ids) != len(signatures):
        raise ValueError(f"group_ids ({len(group_ids)}) and signatures ({len(signatures)}) differ in length")
    if not group_ids:
        return math.nan
    n = Counter((g, s) for g, s in zip(group_ids, signatures) if s is not None)
    g_size = Counter(group_ids)
    hits = sum(1 for g, s in zip(group_ids, signatures) if s is not None and n[(g, s)] >= 2 and n[(g, s)] < g_size[g])
    return hits / len(group_ids)


def tool_signatures(trajectories: list[Trajectory]) -> list[tuple[tuple[str, bool], ...]]:
    """:func:`tool_signature` of every rollout (the ``tool_signatures`` estimator input)."""
    return [tool_signature(t.turns) for t in trajectories]


def turn_rewards(trajectories: list[Trajectory]) -> torch.Tensor:
    """(B, K) :func:`turn_reward_matrix` of :func:`turn_scores` (the ``turn_rewards`` estimator input)."""
    return turn_reward_matrix([turn_scores(t.task, t.turns) for t in trajectories])
