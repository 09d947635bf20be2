"""Beyond SLCA: the conditional summary baseline (slca_cond) and per-turn tool credit (slca_turn).

Hand-computed cases, slow loop references against the vectorised functions,
hypothesis properties (equality with SLCA where it must hold, locking), and
real rollouts / a real trainer step (the per-turn scores and signatures on
hand-built Turn objects: test_rewards_turns.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca import (
    AdvantageInputs,
    compute_advantages,
    conditional_normalize,
    list_estimators,
    segment_masks,
    slca_advantages,
    slca_cond_advantages,
    slca_turn_advantages,
    tool_turn_index,
    turn_index,
    turn_normalize,
)
from slca.core.diagnostics import contamination
from slca.rewards.turns import turn_scores

from _helpers import advantage_extras

NAN = float("nan")


# ----------------------------------------------------------------- slow references


def _mean_std(xs):
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) >= 2 else NAN
    return mu, sd


def _batch_std(rewards):
    v = [r for r in rewards if not math.isnan(r)]
    return _mean_std(v)[1] if len(v) >= 2 else NAN


def _finish(a):
    return a if math.isfinite(a) else 0.0


def _ref_norm(rewards, groups, scale="group", eps=1e-6):
    out = []
    bstd = _batch_std(rewards)
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and not math.isnan(rewards[j])]
        if math.isnan(r) or len(members) < 2:
            out.append(0.0)
            continue
        mu, sd = _mean_std(members)
        out.append(_finish((r - mu) / (sd + eps) if scale == "group" else (r - mu) / (bstd + eps) if scale == "batch" else r - mu))
    return out


def _ref_cond(rewards, groups, sigs, scale="group", eps=1e-6, cond_std="group"):
    """Loop reference of conditional_normalize."""
    out = []
    bstd = _batch_std(rewards)
    for i, r in enumerate(rewards):
        grp = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and not math.isnan(rewards[j])]
        if math.isnan(r) or len(grp) < 2:
            out.append(0.0)
            continue
        sub = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and sigs[i] is not None and sigs[j] == sigs[i] and not math.isnan(rewards[j])]
        mu_g, sd_g = _mean_std(grp)
        if len(sub) >= 2:
            mu_s, sd_s = _mean_std(sub)
            base, sd = mu_s, (sd_s if cond_std == "subgroup" else sd_g)
        else:
            base, sd = mu_g, sd_g
        out.append(_finish((r - base) / (sd + eps) if scale == "group" else (r - base) / (bstd + eps) if scale == "batch" else r - base))
    return out


def _ref_turn_index(model_row, tool_row):
    out, k, prev = [], -1, 0
    for m, t in zip(model_row, tool_row):
        if m and not prev:
            k += 1
        out.append(k if t else -1)
        prev = m
    return out


def _ref_slca_family(rt, rs, groups, model, tm, sm, *, sigs=None, rk=None, lam=1.0, scale="group", eps=1e-6, empty_tool="response",
                     empty_summary="drop"):
    """Token-by-token loop: SLCA, with a conditional summary baseline (sigs) and/or a turn term (rk)."""
    B, T = len(rt), len(model[0])
    has_tool = [any(tm[i]) for i in range(B)]
    rt_stat = [rt[i] if (empty_tool != "exclude" or has_tool[i]) else NAN for i in range(B)]
    a_tool = _ref_norm(rt_stat, groups, scale, eps)
    a_sum = _ref_cond(rs, groups, sigs, scale, eps) if sigs is not None else _ref_norm(rs, groups, scale, eps)
    K = len(rk[0]) if rk is not None else 0
    a_turn = [[0.0] * K for _ in range(B)]
    for k in range(K):
        col = _ref_norm([rk[i][k] for i in range(B)], groups, scale, eps)
        for i in range(B):
            a_turn[i][k] = col[i]
    out = []
    for i in range(B):
        ti = _ref_turn_index(model[i], tm[i])
        last = max(ti)  # the last tool turn (-1: none)
        no_answer = has_tool[i] and not any(sm[i])
        row = []
        for t in range(T):
            if tm[i][t]:
                extra = a_sum[i] if (empty_summary == "last_turn" and no_answer and ti[t] == last) else 0.0
                row.append(a_tool[i] + (lam * a_turn[i][ti[t]] if ti[t] < K else 0.0) + extra)
            elif sm[i][t] and not has_tool[i] and empty_tool == "response":
                row.append(0.5 * (a_tool[i] + a_sum[i]))
            elif sm[i][t] and not has_tool[i] and empty_tool == "both":
                row.append(a_tool[i] + a_sum[i])
            elif sm[i][t]:
                row.append(a_sum[i])
            else:
                row.append(0.0)
        out.append(row)
    return out


# ----------------------------------------------------------------- hand cases: conditional baseline


def test_conditional_normalize_hand_case():
    r = torch.tensor([1.0, 0.0, 0.5, 0.0])
    sigs = ["a", "a", "b", "b"]
    # group mean .375, unbiased std sqrt(.6875 / 3); sub-group means .5 and .25
    sd = math.sqrt(0.6875 / 3)
    got = conditional_normalize(r, [0] * 4, sigs, eps=0.0)
    assert got.tolist() == pytest.approx([0.5 / sd, -0.5 / sd, 0.25 / sd, -0.25 / sd], abs=1e-6)
    assert torch.equal(conditional_normalize(r, torch.tensor([7] * 4), sigs, eps=0.0), got)  # tensor group ids
    # full normalisation inside each sub-group: two members always +-1/sqrt(2)
    sub = conditional_normalize(r, [0] * 4, sigs, eps=0.0, cond_std="subgroup")
    h = 1 / math.sqrt(2)
    assert sub.tolist() == pytest.approx([h, -h, h, -h], abs=1e-6)


def test_conditional_normalize_falls_back_to_the_group():
    r = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.3, 0.9])
    sigs = ["a", "a", "b", None, "c", "c"]
    g = [0, 0, 0, 0, 1, 1]
    got = conditional_normalize(r, g, sigs, scale="none").tolist()
    # a: baseline .5; b and None are alone -> group mean .375; group 1: c has both -> mean .6
    assert got == pytest.approx([0.5, -0.5, 0.125, -0.375, -0.3, 0.3], abs=1e-6)
    # a NaN member does not count: "a" has one valid member left and falls back
    r2 = r.clone()
    r2[1] = NAN
    got2 = conditional_normalize(r2, g, sigs, scale="none").tolist()
    mu = (1.0 + 0.5 + 0.0) / 3
    assert got2[:4] == pytest.approx([1.0 - mu, 0.0, 0.5 - mu, 0.0 - mu], abs=1e-6)


def test_slca_cond_hand_case_failed_tools_do_not_sink_the_honest_summary():
    # rollouts 0, 1: tool calls failed (sig "fail"), summaries .2 and .4 ("could not find it");
    # rollouts 2, 3: tool calls ok (sig "ok"), summaries .9 and 1.0.
    model = torch.tensor([[1, 0, 1, 1]] * 4)
    tm, sm = segment_masks(model)
    rt, rs = torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([0.2, 0.4, 0.9, 1.0])
    sigs = ["fail", "fail", "ok", "ok"]
    slca = slca_advantages(rt, rs, [0] * 4, tm, sm, eps=0.0)
    cond = slca_cond_advantages(rt, rs, [0] * 4, sigs, tm, sm, eps=0.0)
    # SLCA: the better of the two summaries written from failed calls is still pushed down
    assert slca[1, 2] < 0
    # conditional: it is compared with the other failed-call summary only
    sd = float(rs.std())
    assert cond[:, 2].tolist() == pytest.approx([-0.1 / sd, 0.1 / sd, -0.05 / sd, 0.05 / sd], abs=1e-5)
    assert torch.equal(cond * tm, slca * tm)  # tool tokens exactly as SLCA


# ----------------------------------------------------------------- hand cases: turn credit


def test_turn_index_hand_cases():
    m = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1, 0, 0, 0]])
    valid = torch.tensor([[1] * 8 + [0], [1] * 3 + [0] * 6, [1] * 6 + [0] * 3])
    got = turn_index(m, valid)
    assert got.tolist() == [
        [0, 0, -1, 1, -1, -1, -1, -1, -1],  # two tool turns, then the summary
        [-1] * 9,  # no environment token: all summary
        [0, -1, 1, 1, -1, -1, -1, -1, -1],
    ]
    tm, _ = segment_masks(m, valid)
    assert torch.equal(tool_turn_index(m, tm), got)
    with pytest.raises(ValueError, match="tool_mask has 1 where model_mask has 0"):
        tool_turn_index(torch.tensor([[1, 0]]), torch.tensor([[1, 1]]))


def test_turn_normalize_hand_case():
    rk = torch.tensor([[1.0, 0.0, NAN], [1.0, 1.0, 0.5], [0.0, NAN, NAN], [1.0, 0.5, NAN]])
    a = turn_normalize(rk, [0, 0, 1, 1], scale="none")
    # group 0: turn 0 equal -> 0; turn 1 [0, 1] -> -.5, .5; turn 2 one member -> 0
    # group 1: turn 0 [0, 1] -> -.5, .5; turn 1 one member -> 0
    assert a.tolist() == [[0.0, -0.5, 0.0], [0.0, 0.5, 0.0], [-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]
    assert torch.equal(turn_normalize(rk, torch.tensor([4, 4, 9, 9]), scale="none"), a)
    assert turn_normalize(torch.zeros(3, 0), [0, 0, 0]).shape == (3, 0)


def test_slca_turn_hand_case_bad_second_call():
    # both rollouts: turn 0 (2 tokens), env, turn 1 (1 token), env, summary (1 token)
    model = torch.tensor([[1, 1, 0, 1, 0, 1]] * 2)
    tm, sm = segment_masks(model)
    ti = turn_index(model)
    rt, rs = torch.tensor([0.5, 1.0]), torch.tensor([0.7, 0.7])
    rk = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # same good first call; rollout 0's second call is wrong
    v = 0.25 / math.sqrt(0.125)  # |r - mean| / std of two members .5 apart = 1/sqrt(2)
    adv = slca_turn_advantages(rt, rs, rk, [0, 0], tm, sm, ti, eps=0.0)
    h = 1 / math.sqrt(2)
    assert v == pytest.approx(h)
    # turn 0: A_tool only (turn scores equal); turn 1: A_tool + A_turn; summary: 0 (equal summaries)
    assert torch.allclose(adv, torch.tensor([[-h, -h, 0, -2 * h, 0, 0], [h, h, 0, 2 * h, 0, 0]]), atol=1e-6)
    half = slca_turn_advantages(rt, rs, rk, [0, 0], tm, sm, ti, eps=0.0, turn_lambda=0.5)
    assert half[0, 3].item() == pytest.approx(-1.5 * h, abs=1e-6)
    # SLCA gives the good first call the same blame as the bad second one
    s = slca_advantages(rt, rs, [0, 0], tm, sm, eps=0.0)
    assert s[0, 0].item() == pytest.approx(s[0, 3].item())


# ----------------------------------------------------------------- batches for properties

G = 4


@st.composite
def turn_batches(draw, max_groups=3):
    """Rows of tool turns (policy run + env run), a summary, padding; per-turn rewards; signatures."""
    n_groups = draw(st.integers(1, max_groups))
    B = n_groups * G
    rows = []
    for _ in range(B):
        row = []
        for _ in range(draw(st.integers(0, 3))):
            row += [1] * draw(st.integers(1, 2)) + [0] * draw(st.integers(1, 2))
        row += [1] * draw(st.integers(0, 2))
        rows.append(row)
    T = max(max(len(r) for r in rows), 1)
    valid = [[1] * len(r) + [0] * (T - len(r)) for r in rows]
    rows = [r + [0] * (T - len(r)) for r in rows]
    reward = st.one_of(st.floats(0, 1), st.just(NAN))
    rt = draw(st.lists(reward, min_size=B, max_size=B))
    rs = draw(st.lists(reward, min_size=B, max_size=B))
    K = draw(st.integers(0, 4))
    rk = [draw(st.lists(reward, min_size=K, max_size=K)) for _ in range(B)]
    sigs = draw(st.lists(st.sampled_from(["a", "b", None]), min_size=B, max_size=B))
    gids = [i // G for i in range(B)]
    model, vm = torch.tensor(rows), torch.tensor(valid)
    return model, vm, torch.tensor(rt), torch.tensor(rs), torch.tensor(rk, dtype=torch.float32).reshape(B, K), sigs, gids


MODES = ("response", "include", "exclude", "both")
SUMMARY_MODES = ("drop", "last_turn")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", None]), st.one_of(st.floats(-5, 5), st.just(NAN))), min_size=1, max_size=16),
    st.sampled_from(["group", "batch", "none"]),
    st.sampled_from(["group", "subgroup"]),
)
def test_conditional_normalize_matches_loop_reference(rows, scale, cond_std):
    groups, sigs, rewards = [g for g, _, _ in rows], [s for _, s, _ in rows], [r for _, _, r in rows]
    got = conditional_normalize(torch.tensor(rewards), groups, sigs, scale=scale, cond_std=cond_std).tolist()
    assert got == pytest.approx(_ref_cond(rewards, groups, sigs, scale, cond_std=cond_std), abs=1e-4, rel=1e-4)


@settings(max_examples=100, deadline=None)
@given(turn_batches(), st.sampled_from(MODES), st.sampled_from(["group", "none"]), st.floats(-2, 2))
def test_vectorised_estimators_match_token_loop(batch, mode, scale, lam):
    model, vm, rt, rs, rk, sigs, gids = batch
    tm, sm = segment_masks(model, vm)
    ti = turn_index(model, vm)
    ml, tl, sl = model.tolist(), tm.tolist(), sm.tolist()
    for es in SUMMARY_MODES:
        opts = {"scale": scale, "empty_tool": mode, "empty_summary": es}
        cond = slca_cond_advantages(rt, rs, gids, sigs, tm, sm, **opts)
        ref = _ref_slca_family(rt.tolist(), rs.tolist(), gids, ml, tl, sl, sigs=sigs, **opts)
        assert cond.tolist() == [pytest.approx(r, abs=1e-4, rel=1e-4) for r in ref], es
        turn = slca_turn_advantages(rt, rs, rk, gids, tm, sm, ti, turn_lambda=lam, **opts)
        ref = _ref_slca_family(rt.tolist(), rs.tolist(), gids, ml, tl, sl, rk=rk.tolist(), lam=lam, **opts)
        assert turn.tolist() == [pytest.approx(r, abs=1e-4, rel=1e-4) for r in ref], es
    # the defaults are the unbiased options of docs/beyond.md
    torch.testing.assert_close(slca_cond_advantages(rt, rs, gids, sigs, tm, sm, scale=scale),
                               slca_cond_advantages(rt, rs, gids, sigs, tm, sm, scale=scale, empty_tool="both", empty_summary="last_turn"))


@settings(max_examples=100, deadline=None)
@given(turn_batches(), st.sampled_from(MODES), st.sampled_from(["a", "b"]))
def test_slca_cond_equals_slca_with_one_signature_or_all_distinct(batch, mode, sig):
    model, vm, rt, rs, _, _, gids = batch
    tm, sm = segment_masks(model, vm)
    ref = slca_advantages(rt, rs, gids, tm, sm, empty_tool=mode)
    one = slca_cond_advantages(rt, rs, gids, [sig] * len(gids), tm, sm, empty_tool=mode)
    assert torch.allclose(one, ref, atol=1e-6)
    distinct = slca_cond_advantages(rt, rs, gids, list(range(len(gids))), tm, sm, empty_tool=mode)
    assert torch.allclose(distinct, ref, atol=1e-6)  # every sub-group a singleton: fallback everywhere
    unknown = slca_cond_advantages(rt, rs, gids, [None] * len(gids), tm, sm, empty_tool=mode)
    assert torch.allclose(unknown, ref, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(turn_batches(), st.sampled_from(MODES))
def test_slca_turn_equals_slca_without_turn_information(batch, mode):
    model, vm, rt, rs, rk, _, gids = batch
    tm, sm = segment_masks(model, vm)
    ti = turn_index(model, vm)
    ref = slca_advantages(rt, rs, gids, tm, sm, empty_tool=mode)
    assert torch.equal(slca_turn_advantages(rt, rs, rk, gids, tm, sm, ti, turn_lambda=0.0, empty_tool=mode), ref)
    # turn rewards that are constant per (group, turn index) carry no information
    const = torch.where(torch.isnan(rk), rk, torch.full_like(rk, 0.3))
    assert torch.allclose(slca_turn_advantages(rt, rs, const, gids, tm, sm, ti, empty_tool=mode), ref, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(turn_batches(), st.data())
def test_locking_holds_for_both(batch, data):
    model, vm, rt, rs, rk, sigs, gids = batch
    tm, sm = segment_masks(model, vm)
    ti = turn_index(model, vm)
    B = len(gids)
    i = data.draw(st.integers(0, B - 1))
    has_tool = tm.any(1, keepdim=True)
    answered = sm.any(1, keepdim=True)
    # a summary reward never reaches tool tokens, except the last tool turn of a rollout that never
    # answered under empty_summary="last_turn" (the default; docs/beyond.md)
    rs2 = rs.clone()
    rs2[i] = data.draw(st.floats(-3, 3))
    for mode in MODES:
        for es, locked in (("drop", tm), ("last_turn", tm * answered)):
            o = {"empty_tool": mode, "empty_summary": es}
            a, b = slca_cond_advantages(rt, rs, gids, sigs, tm, sm, **o), slca_cond_advantages(rt, rs2, gids, sigs, tm, sm, **o)
            assert torch.equal(a * locked, b * locked)
            a, b = slca_turn_advantages(rt, rs, rk, gids, tm, sm, ti, **o), slca_turn_advantages(rt, rs2, rk, gids, tm, sm, ti, **o)
            assert torch.equal(a * locked, b * locked)
    # a tool reward or a turn reward never reaches summary tokens (of rollouts with a tool segment)
    rt2 = rt.clone()
    rt2[i] = data.draw(st.floats(-3, 3))
    rk2 = rk.clone()
    if rk.shape[1]:
        rk2[i, data.draw(st.integers(0, rk.shape[1] - 1))] = data.draw(st.floats(-3, 3))
    for mode in MODES:
        keep = sm * (has_tool if mode in ("response", "both") else 1)
        a, b = slca_cond_advantages(rt, rs, gids, sigs, tm, sm, empty_tool=mode), slca_cond_advantages(rt2, rs, gids, sigs, tm, sm, empty_tool=mode)
        assert torch.equal(a * keep, b * keep)
        a = slca_turn_advantages(rt, rs, rk, gids, tm, sm, ti, empty_tool=mode)
        b = slca_turn_advantages(rt2, rs, rk2, gids, tm, sm, ti, empty_tool=mode)
        assert torch.equal(a * keep, b * keep)
        # and nothing ever lands outside the two segments
        assert (b * (1 - tm - sm)).abs().max() == 0


@settings(max_examples=100, deadline=None)
@given(turn_batches(), st.data())
def test_a_turn_reward_moves_only_that_turn_in_its_group(batch, data):
    model, vm, rt, rs, rk, _, gids = batch
    if rk.shape[1] == 0:
        return
    tm, sm = segment_masks(model, vm)
    ti = turn_index(model, vm)
    i = data.draw(st.integers(0, len(gids) - 1))
    k = data.draw(st.integers(0, rk.shape[1] - 1))
    rk2 = rk.clone()
    rk2[i, k] = data.draw(st.floats(-3, 3))
    a = slca_turn_advantages(rt, rs, rk, gids, tm, sm, ti)
    b = slca_turn_advantages(rt, rs, rk2, gids, tm, sm, ti)
    same_group = torch.tensor([g == gids[i] for g in gids]).unsqueeze(1)
    untouched = ~(same_group & (ti == k))
    assert torch.equal(a[untouched], b[untouched])


@settings(max_examples=100, deadline=None)
@given(turn_batches(), st.randoms(use_true_random=False))
def test_permuting_within_group_permutes_advantages(batch, rnd):
    model, vm, rt, rs, rk, sigs, gids = batch
    tm, sm = segment_masks(model, vm)
    ti = turn_index(model, vm)
    perm = list(range(len(gids)))
    for g0 in range(0, len(gids), G):
        block = perm[g0 : g0 + G]
        rnd.shuffle(block)
        perm[g0 : g0 + G] = block
    p = torch.tensor(perm)
    a = slca_cond_advantages(rt, rs, gids, sigs, tm, sm)
    b = slca_cond_advantages(rt[p], rs[p], gids, [sigs[j] for j in perm], tm[p], sm[p])
    assert torch.allclose(a[p], b, atol=1e-5)
    a = slca_turn_advantages(rt, rs, rk, gids, tm, sm, ti)
    b = slca_turn_advantages(rt[p], rs[p], rk[p], gids, tm[p], sm[p], ti[p])
    assert torch.allclose(a[p], b, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(turn_batches())
def test_turn_index_matches_loop_reference(batch):
    model, vm, *_ = batch
    tm, _ = segment_masks(model, vm)
    got = turn_index(model, vm).tolist()
    assert got == [_ref_turn_index(m, t) for m, t in zip(model.tolist(), tm.tolist())]


# ----------------------------------------------------------------- registry


def _inputs(**kw):
    model = torch.tensor([[1, 0, 1, 0, 1], [1, 0, 1, 0, 1]])
    tm, sm = segment_masks(model)
    return AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), [0, 0], model, tm, sm, **kw)


def test_registry_dispatch_and_missing_inputs():
    assert {"slca_cond", "slca_turn"} <= set(list_estimators())
    with pytest.raises(ValueError, match="'slca_cond' needs AdvantageInputs.tool_signatures"):
        compute_advantages("slca_cond", _inputs())
    with pytest.raises(ValueError, match="'slca_turn' needs AdvantageInputs.turn_rewards"):
        compute_advantages("slca_turn", _inputs())
    inp = _inputs(tool_signatures=["x", "y"], turn_rewards=torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    assert torch.equal(compute_advantages("slca_cond", inp), compute_advantages("slca", inp))
    got = compute_advantages("slca_turn", inp, turn_lambda=2.0)
    ti = turn_index(inp.model_mask)
    assert torch.equal(got, slca_turn_advantages(inp.tool_rewards, inp.summary_rewards, inp.turn_rewards, [0, 0], inp.tool_mask, inp.summary_mask, ti, turn_lambda=2.0))
    # an explicit turn_index is used as given
    inp2 = _inputs(turn_rewards=torch.tensor([[1.0, 0.0], [0.0, 0.0]]), turn_index=torch.where(inp.tool_mask.bool(), 1, -1))
    assert not torch.equal(compute_advantages("slca_turn", inp2), got)
    # both keep the summary rewards off tool tokens
    assert contamination("slca_cond", inp) == 0.0 and contamination("slca_turn", inp) == 0.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: conditional_normalize(torch.ones(2), [0, 0], ["a"]), "signatures has length 1, expected 2"),
        (lambda: conditional_normalize(torch.ones(2), [0, 0], "ab"), "signatures must be a sequence"),
        (lambda: conditional_normalize(torch.ones(2), [0, 0], [["a"], ["b"]]), "signatures must be hashable"),
        (lambda: conditional_normalize(torch.ones(2), [0, 0], ["a", "b"], cond_std="x"), "cond_std must be one of"),
        (lambda: conditional_normalize(torch.ones(2), [0, 0], ["a", "b"], scale="x"), "scale must be one of"),
        (lambda: turn_normalize(torch.ones(2), [0, 0]), "turn_rewards must be a \\(B, T\\)"),
        (
            lambda: slca_turn_advantages(torch.ones(1), torch.ones(1), torch.ones(2, 1), [0], torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long)),
            "turn_rewards has 2 rows, expected 1",
        ),
        (
            lambda: slca_turn_advantages(torch.ones(1), torch.ones(1), torch.ones(1, 1), [0], torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 3, dtype=torch.long)),
            "turn_index has shape",
        ),
        (
            lambda: slca_turn_advantages(torch.ones(1), torch.ones(1), torch.ones(1, 1), [0], torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2)),
            "turn_index must be an integer tensor",
        ),
        (
            lambda: slca_turn_advantages(torch.ones(1), torch.ones(1), torch.ones(1, 1), [0], torch.ones(1, 2), torch.zeros(1, 2), torch.full((1, 2), -1)),
            "turn_index is negative on a tool token",
        ),
        (
            lambda: slca_turn_advantages(torch.ones(1), torch.ones(1), torch.ones(1, 1), [0], torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long), turn_lambda=float("inf")),
            "turn_lambda must be a finite number",
        ),
        (
            lambda: slca_cond_advantages(torch.ones(1), torch.ones(1), [0], ["a"], torch.ones(1, 2), torch.ones(1, 2)),
            "overlap",
        ),
        (lambda: advantage_extras([], ["nope"]), "cannot compute AdvantageInputs field 'nope'"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------- real rollouts, real trainer step


@pytest.fixture(scope="module")
def world():
    """A tiny Qwen2 that memorised gold demos of a chain and a parallel toolworld task (as tests/test_rollout_toolworld.py)."""
    from _tok import gold_demo_messages, memorise, tiny_qwen2

    from slca.env import toolworld
    from recipes.warmstart.tokenizer import train_tokenizer
    from slca.models.tokenizer import chat_template

    demo = gold_demo_messages

    tasks = toolworld.make_tasks("train", n=80, seed=0)
    picked = [next(t for t in tasks if t.kind == "chain" and len(t.gold) >= 2), next(t for t in tasks if t.kind == "parallel")]
    probe = train_tokenizer(["x"], vocab_size=300)
    texts = [probe.apply_chat_template(demo(t), tools=t.tools, tokenize=False, chat_template=chat_template()) for t in tasks[:40]]
    tok = train_tokenizer(texts, vocab_size=700)
    model = memorise(tiny_qwen2(len(tok), seed=2), tok, [(demo(t), t.tools) for t in picked])
    return tok, model, picked


def _answered_tool_turns(traj):
    return sum(1 for t in traj.turns if t.parsed.is_tool_turn and t.results)


@pytest.mark.slow
def test_turn_runs_line_up_with_scored_turns_on_real_rollouts(world):
    from slca.env import toolworld
    from slca.generation.rollout import RolloutConfig, generate_rollouts
    from slca.generation.batching import collate

    tok, model, tasks = world
    greedy = RolloutConfig(group_size=2, max_turns=4, max_new_tokens=96, max_total_tokens=1024, temperature=0.0, seed=0)
    res = generate_rollouts(model, tok, tasks, toolworld.make_env, greedy)
    for tr in res.trajectories:  # the gold demos: every turn a new, correct, executed gold step
        assert turn_scores(tr.task, tr.turns) == [1.0] * len(tr.task.gold)
        ti = turn_index(torch.tensor([tr.model_mask]))
        assert sorted(set(ti[0].tolist()) - {-1}) == list(range(len(tr.task.gold)))
    sigs = advantage_extras(res.trajectories, ["tool_signatures"])["tool_signatures"]
    assert sigs[0] == sigs[1] != sigs[2] == sigs[3]
    sampled = RolloutConfig(group_size=4, max_turns=3, max_new_tokens=48, max_total_tokens=600, temperature=1.5, seed=3)
    trajs = res.trajectories + generate_rollouts(model, tok, tasks, toolworld.make_env, sampled).trajectories
    batch = collate(trajs, tok.pad_token_id)
    ti = turn_index(batch.model_mask, batch.valid_mask)
    rk = advantage_extras(trajs, ["turn_rewards"])["turn_rewards"]
    runs = []
    for i, tr in enumerate(trajs):
        n_runs = len(set(ti[i].tolist()) - {-1})
        assert n_runs == _answered_tool_turns(tr)  # run k of the tool segment is tool turn k
        assert not torch.isnan(rk[i, :n_runs]).any()  # every turn in the tool segment has a score
        runs.append(n_runs)
    assert max(runs) >= 2 and min(runs) < max(runs)  # multi-turn (the chain demo) and differing tool segments


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["slca_cond", "slca_turn"])
def test_trainer_step_fills_the_inputs(tmp_path, world, estimator):
    import copy

    from slca.training.config import TrainConfig, validate
    from slca.env import toolworld
    from slca.training.trainer import Trainer

    tok, model, tasks = world
    cfg = validate(TrainConfig(run_dir=str(tmp_path / "run"), estimator=estimator, steps=1, tasks_per_step=2, group_size=3, max_turns=3,
                               max_new_tokens=48, max_total_tokens=600, temperature=1.5, minibatches=1, kl_coef=0.0, eval_every=0,
                               sample_html_every=0, diag_every=1, lr=1e-3))
    tr = Trainer(cfg, model=copy.deepcopy(model), tokenizer=tok, train_tasks=tasks, eval_tasks=[], make_env=toolworld.make_env)
    m = tr.train_step()
    assert math.isfinite(m["loss"])
    if m["rollout/no_summary_segment"] == 0:  # summary rewards stay off tool tokens (but see empty_summary="last_turn")
        assert m["adv/contamination"] == 0.0 or math.isnan(m["adv/contamination"])
    if estimator == "slca_cond":
        assert 0.0 <= m["adv/cond_subgroup_frac"] <= 1.0 and "reward/turn" not in m
    else:
        assert math.isfinite(m["reward/turn"]) and "adv/cond_subgroup_frac" not in m
