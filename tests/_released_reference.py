"""A loop-for-loop restatement of the released estimators (``SLCA-GRPO/SLCA-GRPO`` commit 68539c5,
``verl/verl/trainer/ppo/core_algos.py``), independent of slca's code: dict grouping, one rollout at a
time, as the released functions do, with per-rollout arithmetic in float32 (as both implementations do
on float32 tensors) and exact group statistics (see slca.core.paper on the float32 statistics of the
released code). Shared by tests/test_core_paper.py and tests/test_integration_verl_paper.py.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np

F = np.float32  # per-rollout arithmetic in float32, as both implementations do on float32 tensors; statistics exact


def _ksum(kl_row, seg_row):
    return float(sum((F(k) * F(m) for k, m in zip(kl_row, seg_row)), F(0.0)))


def ref_runs(row: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for t, v in enumerate(row + [0]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            out.append((start, t))
            start = None
    return out


def ref_masks(mask: list[list[int]]):
    B, T = len(mask), len(mask[0]) if mask else 0
    proc = [[0] * T for _ in range(B)]
    summ = [[0] * T for _ in range(B)]
    pp, sp = [False] * B, [False] * B
    for i, row in enumerate(mask):
        segs = ref_runs(row)
        if not segs:
            continue
        for s, e in segs[:-1]:
            for t in range(s, e):
                proc[i][t] = 1
            pp[i] = True
        s, e = segs[-1]
        for t in range(s, e):
            summ[i][t] = 1
        sp[i] = True
    return proc, summ, pp, sp


def ref_norm(scores, index, present, norm_by_std, eps):
    """``_groupwise_normalize_with_present`` restated: dict grouping over present members, count <= 1 -> 0."""
    adv = [0.0] * len(scores)
    groups = defaultdict(list)
    for i, (s, p) in enumerate(zip(scores, present)):
        if p:
            groups[index[i]].append(i)
    for members in groups.values():
        if len(members) <= 1:
            continue
        xs = [float(scores[i]) for i in members]
        mean = math.fsum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        for i in members:
            adv[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return adv


def ref_slca(mask, index, process, summary, total, no_call, kl, w_p, w_s, norm_by_std, eps):
    proc, summ, pp, sp = ref_masks(mask)
    B, T = len(mask), len(mask[0])
    xp, xs = [], []
    for i in range(B):
        pen = no_call[i] > 0.5 or total[i] < 0
        xp.append(float(F(0.0 if pen else process[i]) + F(_ksum(kl[i], proc[i]))))
        xs.append(float(F(total[i] if pen else summary[i]) + F(_ksum(kl[i], summ[i]))))
    ap = [w_p * a for a in ref_norm(xp, index, pp, norm_by_std, eps)]
    as_ = [w_s * a for a in ref_norm(xs, index, sp, norm_by_std, eps)]
    return [[(proc[i][t] * ap[i] + summ[i][t] * as_[i]) * mask[i][t] for t in range(T)] for i in range(B)]


def ref_toolpo(mask, index, total, ratio, kl, lam, norm_by_std, eps):
    B, T = len(mask), len(mask[0])
    tot = [float(F(total[i]) + F(_ksum(kl[i], mask[i]))) for i in range(B)]  # token_level_rewards.sum(-1): the score plus the KL on every token
    groups = defaultdict(list)
    for i in range(B):
        groups[index[i]].append(i)
    glob = [0.0] * B
    for members in groups.values():
        if len(members) == 1:
            mean, std = 0.0, 1.0
        else:
            xs = [tot[i] for i in members]
            mean = math.fsum(xs) / len(xs)
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        for i in members:
            glob[i] = (tot[i] - mean) / (std + eps) if norm_by_std else tot[i] - mean
    proc, _, pp, _ = ref_masks(mask)
    at = ref_norm(ratio, index, pp, norm_by_std, eps)
    return [[(mask[i][t] * glob[i] + proc[i][t] * lam * at[i]) * mask[i][t] for t in range(T)] for i in range(B)]


def ref_rltr(mask, index, comp, rep, err, valid, kl, norm_by_std, eps):
    B, T = len(mask), len(mask[0])
    proc, _, pp, _ = ref_masks(mask)
    r = [float((F(comp[i]) + F(rep[i]) + F(err[i]) if valid[i] > 0.5 else F(-1.0)) + F(_ksum(kl[i], proc[i]))) for i in range(B)]
    a = ref_norm(r, index, pp, norm_by_std, eps)
    return [[proc[i][t] * a[i] * mask[i][t] for t in range(T)] for i in range(B)]


def random_batch(rng: random.Random):
    """Ragged masks (one-run rollouts, trailing calls, empty rows), singleton and uneven groups, ties, penalties."""
    n_groups = rng.randint(1, 4)
    sizes = [rng.choice([1, 1, 2, 3, 4, 6]) for _ in range(n_groups)]
    index = [f"uid-{g}" for g, n in enumerate(sizes) for _ in range(n)]
    B, T = len(index), rng.randint(1, 14)
    mask = []
    for _ in range(B):
        kind = rng.random()
        if kind < 0.1:
            row = [0] * T
        elif kind < 0.3:  # one run: no call, a summary only
            s = rng.randrange(T)
            e = rng.randint(s + 1, T)
            row = [1 if s <= t < e else 0 for t in range(T)]
        else:
            row = [int(rng.random() < 0.6) for _ in range(T)]
        mask.append(row)
    discrete = rng.random() < 0.5  # tied scores, as rule rewards give

    def score(lo=0.0, hi=1.0):
        return rng.choice([0.0, 0.25, 0.5, 1.0]) if discrete else rng.uniform(lo, hi)

    process = [score() for _ in range(B)]
    summary = [score() for _ in range(B)]
    total = [rng.choice([score(), -0.5, -rng.random()]) if rng.random() < 0.3 else score() for _ in range(B)]
    no_call = [float(rng.random() < 0.2) for _ in range(B)]
    use_kl = rng.random() < 0.5
    kl = [[(-rng.random() * 0.05 if use_kl and mask[i][t] else 0.0) for t in range(T)] for i in range(B)]
    return index, mask, process, summary, total, no_call, kl
