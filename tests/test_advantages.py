import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slca import (
    AdvantageInputs,
    compute_advantages,
    gdpo_advantages,
    get_estimator,
    group_normalize,
    grpo_advantages,
    list_estimators,
    register_estimator,
    segment_masks,
    slca_advantages,
)
from slca.core.segments import SPAN_CALL, SPAN_THINK


# ----------------------------------------------------------------- slow reference


def _ref_normalize(rewards, groups, scale="group", eps=1e-6):
    """Loop reference of the group_normalize contract (pure Python floats)."""
    out = []
    valid_all = [r for r in rewards if not math.isnan(r)]
    if len(valid_all) >= 2:
        mu = sum(valid_all) / len(valid_all)
        bstd = math.sqrt(sum((r - mu) ** 2 for r in valid_all) / (len(valid_all) - 1))
    else:
        bstd = float("nan")
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and not math.isnan(rewards[j])]
        if math.isnan(r) or len(members) < 2:
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1))
        if scale == "group":
            a = (r - mean) / (std + eps)
        elif scale == "batch":
            a = (r - mean) / (bstd + eps)
        else:
            a = r - mean
        out.append(a if math.isfinite(a) else 0.0)
    return out


# ----------------------------------------------------------------- hand cases


def test_group_normalize_hand_case():
    # group 0: [1, 0] mean .5 std .7071 ; group 1: [2, 4, 6] mean 4 std 2 ; group 2 single
    r = torch.tensor([1.0, 0.0, 2.0, 4.0, 6.0, 9.0])
    g = [0, 0, 1, 1, 1, 2]
    a = group_normalize(r, g, eps=0.0)
    s2 = math.sqrt(0.5)
    expected = [0.5 / s2, -0.5 / s2, -1.0, 0.0, 1.0, 0.0]
    assert a.tolist() == pytest.approx(expected, abs=1e-6)


def test_group_normalize_eps_is_added_to_std():
    a = group_normalize(torch.tensor([1.0, 0.0]), [0, 0], eps=0.5)
    assert a[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 0.5), abs=1e-6)


def test_group_normalize_scales():
    r = torch.tensor([1.0, 3.0, 10.0, 20.0])
    g = torch.tensor([7, 7, 9, 9])
    none = group_normalize(r, g, scale="none")
    assert none.tolist() == pytest.approx([-1.0, 1.0, -5.0, 5.0])
    bstd = r.std().item()
    batch = group_normalize(r, g, scale="batch", eps=0.0)
    assert batch.tolist() == pytest.approx([-1 / bstd, 1 / bstd, -5 / bstd, 5 / bstd], rel=1e-5)


def test_nan_left_out_and_given_zero():
    r = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    a = group_normalize(r, [0, 0, 0, 0], eps=0.0)
    # statistics over [1, 3, 5]: mean 3 std 2
    assert a.tolist() == pytest.approx([-1.0, 0.0, 0.0, 1.0])


def test_single_valid_member_gets_zero():
    a = group_normalize(torch.tensor([1.0, float("nan"), 2.0]), [0, 0, 1])
    assert a.tolist() == [0.0, 0.0, 0.0]


def test_constant_group_gets_zero():
    a = group_normalize(torch.tensor([0.5, 0.5, 0.5]), [0, 0, 0])
    assert a.tolist() == [0.0, 0.0, 0.0]


def test_string_group_ids_like_verl_uids():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a = group_normalize(r, ["uid-b", "uid-b", "uid-a", "uid-a"])
    b = group_normalize(r, torch.tensor([1, 1, 0, 0]))
    assert torch.allclose(a, b)


def test_grpo_advantages_hand_case():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = grpo_advantages(torch.tensor([1.0, 0.0]), [0, 0], mask, eps=0.0)
    v = 0.5 / math.sqrt(0.5)
    assert torch.allclose(adv, torch.tensor([[v, v, 0.0], [-v, 0.0, 0.0]]))


def test_slca_advantages_hand_case_diagnostic_group():
    # rollout 0: redundant sequential calls (tool 0.2) but the best summary (1.0)
    model = torch.tensor([[1, 1, 0, 1, 1]] * 2)
    tool_m, sum_m = segment_masks(model)
    adv = slca_advantages(torch.tensor([0.2, 1.0]), torch.tensor([1.0, 0.2]), [0, 0], tool_m, sum_m, eps=0.0)
    v = 0.4 / math.sqrt(0.32)  # |r - mean| / std for two members 0.8 apart
    assert torch.allclose(adv, torch.tensor([[-v, -v, 0, v, v], [v, v, 0, -v, -v]]), atol=1e-5)
    # GRPO on the summed reward gives both rollouts 0: the bad tool calls are not punished
    g = grpo_advantages(torch.tensor([1.2, 1.2]), [0, 0], model)
    assert g.abs().max() == 0


def test_empty_tool_modes():
    # rollout 1 made no call: no env token, all summary
    model = torch.tensor([[1, 0, 1], [1, 1, 0], [1, 0, 1]])
    valid = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    tm, sm = segment_masks(model, valid)
    rt = torch.tensor([1.0, 0.0, 0.5])
    a_tool = group_normalize(rt, [0, 0, 0])
    rs = torch.tensor([0.0, 1.0, 0.0])
    a_sum = group_normalize(rs, [0, 0, 0])
    resp = slca_advantages(rt, rs, [0, 0, 0], tm, sm, empty_tool="response")
    mixed = 0.5 * (a_tool[1] + a_sum[1]).item()
    assert resp[1, :2].tolist() == pytest.approx([mixed] * 2)
    assert resp[0, 0].item() == pytest.approx(a_tool[0].item())
    inc = slca_advantages(rt, rs, [0, 0, 0], tm, sm, empty_tool="include")
    assert inc[1, :2].tolist() == pytest.approx([a_sum[1].item()] * 2) and inc[0, 0].item() == pytest.approx(a_tool[0].item())
    exc = slca_advantages(rt, rs, [0, 0, 0], tm, sm, empty_tool="exclude")
    # statistics over [1.0, 0.5] only
    a2 = group_normalize(torch.tensor([1.0, 0.5]), [0, 0])
    assert exc[0, 0].item() == pytest.approx(a2[0].item())
    assert exc[1, :2].tolist() == pytest.approx([a_sum[1].item()] * 2)


def test_gdpo_is_sum_of_normalised_rewards_on_all_tokens():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    rt, rs = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.0, 10.0, 5.0])
    adv = gdpo_advantages(rt, rs, [0, 0, 0], mask)
    a = group_normalize(rt, [0, 0, 0]) + group_normalize(rs, [0, 0, 0])
    assert torch.allclose(adv, a[:, None] * mask)


# ----------------------------------------------------------------- reference vs vectorised


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.one_of(st.floats(-5, 5), st.just(float("nan")))), min_size=1, max_size=16),
    st.sampled_from(["group", "batch", "none"]),
)
def test_group_normalize_matches_loop_reference(rows, scale):
    groups = [g for g, _ in rows]
    rewards = [r for _, r in rows]
    got = group_normalize(torch.tensor(rewards), groups, scale=scale).tolist()
    ref = _ref_normalize(rewards, groups, scale=scale)
    assert got == pytest.approx(ref, abs=1e-4, rel=1e-4)


def test_random_batches_match_reference():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        B = int(torch.randint(2, 40, (1,), generator=gen))
        groups = torch.randint(0, 6, (B,), generator=gen).tolist()
        r = torch.randn(B, generator=gen)
        r[torch.rand(B, generator=gen) < 0.1] = float("nan")
        got = group_normalize(r, groups).tolist()
        assert got == pytest.approx(_ref_normalize(r.tolist(), groups), abs=1e-4)


# ----------------------------------------------------------------- properties

G = 4


@st.composite
def slca_batches(draw):
    n_groups = draw(st.integers(1, 3))
    B = n_groups * G
    T = draw(st.integers(3, 10))
    rows = []
    for _ in range(B):
        # a tool prefix, an env span, a summary suffix (each possibly empty), then padding
        a = draw(st.integers(0, 3))
        e = draw(st.integers(0, 2)) if a else 0
        s = draw(st.integers(0, T - a - e)) if T - a - e > 0 else 0
        row = [1] * a + [0] * e + [1] * s
        row += [0] * (T - len(row))
        rows.append(row[:T])
    valid = []
    for row in rows:
        last = max([t for t, x in enumerate(row) if x], default=-1)
        valid.append([1 if t <= last else 0 for t in range(T)])
    rt = draw(st.lists(st.floats(0, 1), min_size=B, max_size=B))
    rs = draw(st.lists(st.floats(0, 1), min_size=B, max_size=B))
    gids = [i // G for i in range(B)]
    return torch.tensor(rows), torch.tensor(rt), torch.tensor(rs), gids


@settings(max_examples=150, deadline=None)
@given(slca_batches(), st.data())
def test_changing_summary_rewards_leaves_tool_tokens_unchanged(batch, data):
    model, rt, rs, gids = batch
    tm, sm = segment_masks(model)
    i = data.draw(st.integers(0, len(gids) - 1))
    rs2 = rs.clone()
    rs2[i] = data.draw(st.floats(-3, 3))
    for mode in ("response", "include", "exclude"):
        a = slca_advantages(rt, rs, gids, tm, sm, empty_tool=mode)
        b = slca_advantages(rt, rs2, gids, tm, sm, empty_tool=mode)
        assert torch.equal(a * tm, b * tm)


@settings(max_examples=150, deadline=None)
@given(slca_batches(), st.data())
def test_changing_tool_rewards_leaves_summary_tokens_unchanged(batch, data):
    model, rt, rs, gids = batch
    tm, sm = segment_masks(model)
    i = data.draw(st.integers(0, len(gids) - 1))
    rt2 = rt.clone()
    rt2[i] = data.draw(st.floats(-3, 3))
    # under the "include"/"exclude" modes locking is strict on every rollout
    for mode in ("include", "exclude"):
        a = slca_advantages(rt, rs, gids, tm, sm, empty_tool=mode)
        b = slca_advantages(rt2, rs, gids, tm, sm, empty_tool=mode)
        assert torch.equal(a * sm, b * sm)
    # under the default, strict on every rollout that has a tool segment
    has_tool = tm.any(1, keepdim=True)
    a = slca_advantages(rt, rs, gids, tm, sm)
    b = slca_advantages(rt2, rs, gids, tm, sm)
    assert torch.equal(a * sm * has_tool, b * sm * has_tool)


@settings(max_examples=100, deadline=None)
@given(slca_batches())
def test_slca_equals_grpo_when_rewards_equal_and_segments_cover(batch):
    model, rt, _, gids = batch
    tm, sm = segment_masks(model)
    # tool reward == summary reward, and GRPO on that same single reward
    g = grpo_advantages(rt, gids, model)
    # with the mean on no-call rollouts and nothing for no-answer ones: equal everywhere
    s = slca_advantages(rt, rt, gids, tm, sm, empty_tool="response", empty_summary="drop")
    assert torch.allclose(s, g, atol=1e-6)
    # the unbiased defaults give a rollout missing a segment both verdicts in full on the
    # tokens of its decision (docs/beyond.md): equal on rollouts with both segments, and
    # 2x GRPO's on a no-call rollout's tokens and on a no-answer rollout's last tool turn
    s = slca_advantages(rt, rt, gids, tm, sm)
    both = (tm.any(1) & sm.any(1)).unsqueeze(1)
    assert torch.allclose(s * both, g * both, atol=1e-6)
    no_tool = (~tm.any(1)).unsqueeze(1)
    assert torch.allclose(s * no_tool, 2 * g * no_tool, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(slca_batches(), st.randoms(use_true_random=False))
def test_permuting_within_group_permutes_advantages(batch, rnd):
    model, rt, rs, gids = batch
    tm, sm = segment_masks(model)
    perm = list(range(len(gids)))
    for g0 in range(0, len(gids), G):
        block = perm[g0 : g0 + G]
        rnd.shuffle(block)
        perm[g0 : g0 + G] = block
    p = torch.tensor(perm)
    a = slca_advantages(rt, rs, gids, tm, sm)
    b = slca_advantages(rt[p], rs[p], gids, tm[p], sm[p])
    assert torch.allclose(a[p], b, atol=1e-5)
    ga = grpo_advantages(rt + rs, gids, model)
    gb = grpo_advantages((rt + rs)[p], gids, model[p])
    assert torch.allclose(ga[p], gb, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(slca_batches())
def test_zero_outside_masks(batch):
    model, rt, rs, gids = batch
    tm, sm = segment_masks(model)
    for mode in ("response", "include", "exclude"):
        a = slca_advantages(rt, rs, gids, tm, sm, empty_tool=mode)
        assert (a * (1 - tm - sm)).abs().max() == 0
    g = grpo_advantages(rt + rs, gids, model)
    assert (g * (1 - model)).abs().max() == 0


@settings(max_examples=100, deadline=None)
@given(slca_batches(), st.data())
def test_nan_rollout_gets_zero_and_does_not_move_others(batch, data):
    model, rt, rs, gids = batch
    tm, sm = segment_masks(model)
    i = data.draw(st.integers(0, len(gids) - 1))
    rs_nan = rs.clone()
    rs_nan[i] = float("nan")
    a = slca_advantages(rt, rs_nan, gids, tm, sm, empty_tool="include")
    assert (a[i] * sm[i]).abs().max() == 0
    # others equal the advantages computed without rollout i
    keep = [j for j in range(len(gids)) if j != i]
    k = torch.tensor(keep)
    ref = slca_advantages(rt[k], rs[k], [gids[j] for j in keep], tm[k], sm[k], empty_tool="include")
    assert torch.allclose((a * sm)[k], ref * sm[k], atol=1e-5)


# ----------------------------------------------------------------- registry


def _inputs():
    model = torch.tensor([[1, 0, 1], [1, 0, 1]])
    tm, sm = segment_masks(model)
    return AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), [0, 0], model, tm, sm)


def test_registry_dispatch_matches_functions():
    inp = _inputs()
    assert {"grpo", "slca", "gdpo"} <= set(list_estimators())
    assert torch.equal(compute_advantages("slca", inp), slca_advantages(inp.tool_rewards, inp.summary_rewards, inp.group_ids, inp.tool_mask, inp.summary_mask))
    assert torch.equal(compute_advantages("grpo", inp), grpo_advantages(inp.total_rewards, inp.group_ids, inp.model_mask))


def test_registry_guards_duplicates_and_unknown():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("slca", lambda inputs, **kw: inputs.model_mask.float())
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        get_estimator("nope")
    f = get_estimator("slca")
    assert register_estimator("slca", f) is f  # idempotent


def test_registry_accepts_new_estimator():
    def zero(inputs, **kw):
        return torch.zeros_like(inputs.model_mask, dtype=torch.float32)

    register_estimator("test_zero_estimator", zero)
    assert compute_advantages("test_zero_estimator", _inputs()).abs().sum() == 0


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: group_normalize(torch.tensor([1.0, 2.0]), [0]), "group_ids has length 1, expected 2"),
        (lambda: group_normalize(torch.tensor([[1.0]]), [0]), "rewards must be a \\(B,\\)"),
        (lambda: group_normalize(torch.tensor([1.0]), [0], scale="std"), "scale must be one of"),
        (lambda: group_normalize(torch.tensor([1.0]), torch.tensor([0.5])), "group_ids as a tensor must be integer"),
        (lambda: group_normalize(torch.tensor([1.0]), [[0]]), "group_ids must be hashable"),
        (lambda: grpo_advantages(torch.tensor([1.0, 2.0]), [0, 0], torch.ones(3, 2)), "rewards has length 2, expected 3"),
        (lambda: grpo_advantages(torch.tensor([1.0]), [0], torch.tensor([[0.5]])), "response_mask must contain only 0 and 1"),
        (
            lambda: slca_advantages(torch.ones(1), torch.ones(1), [0], torch.ones(1, 2), torch.ones(1, 3)),
            "summary_mask has shape",
        ),
        (
            lambda: slca_advantages(torch.ones(1), torch.ones(1), [0], torch.ones(1, 2), torch.ones(1, 2)),
            "overlap",
        ),
        (
            lambda: slca_advantages(torch.ones(1), torch.ones(1), [0], torch.ones(1, 2), torch.zeros(1, 2), empty_tool="x"),
            "empty_tool must be one of",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------- one input contract, empty shapes

BUILTIN = list_estimators()  # before any test registers its own


def _batch(B: int = 6, T: int = 7, K: int = 2, seed: int = 0) -> dict:
    """Every input any built-in estimator reads, as torch tensors (two groups, calls and no-call rows)."""
    g = torch.Generator().manual_seed(seed)
    model = torch.ones(B, T, dtype=torch.long)
    if T >= 5:
        model[::2, 2] = 0  # a tool response in every other row
        model[:, -1] = 0  # padding
    tm, sm = segment_masks(model)
    return dict(
        tool_rewards=torch.rand(B, generator=g), summary_rewards=torch.rand(B, generator=g),
        group_ids=[i // 3 for i in range(B)], model_mask=model, tool_mask=tm, summary_mask=sm,
        tool_signatures=[i % 2 for i in range(B)], turn_rewards=torch.rand(B, K, generator=g),
        span_labels=torch.where(model.bool(), torch.tensor([SPAN_THINK, SPAN_CALL] * T)[:T], 0),  # slca_think
        extra={  # the released estimators' inputs (slca.core.paper)
            "should_no_call": torch.tensor([float(i % 3 == 1) for i in range(B)]),
            "toolpo_correct_ratio": torch.rand(B, generator=g),
            "rltr_comp": torch.tensor([float(i % 4 == 0) for i in range(B)]),
            "rltr_repeat_penalty": torch.zeros(B), "rltr_error_penalty": torch.zeros(B), "rltr_format_valid": torch.ones(B),
        },
    )


def _as(kind: str, x):
    if kind == "torch" or not isinstance(x, torch.Tensor):
        return x
    return x.numpy() if kind == "numpy" else x.tolist()


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("kind", ["numpy", "list"])
def test_every_estimator_takes_torch_numpy_and_list_inputs_alike(name, kind):
    """One input contract (AdvantageInputs converts once): numpy arrays and lists give the torch result."""
    b = _batch()
    want = compute_advantages(name, AdvantageInputs(**b))
    got = compute_advantages(name, AdvantageInputs(**{k: _as(kind, v) for k, v in b.items()}))
    assert isinstance(got, torch.Tensor) and got.shape == want.shape == (6, 7)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all() and got.abs().sum() > 0


def test_numpy_float64_rewards_reach_grpo_as_tensors():
    b = _batch()
    inp = AdvantageInputs(**{**b, "tool_rewards": b["tool_rewards"].double().numpy(), "summary_rewards": [0.0] * 6})
    assert isinstance(inp.tool_rewards, torch.Tensor) and isinstance(inp.summary_rewards, torch.Tensor)
    torch.testing.assert_close(
        compute_advantages("grpo", inp), grpo_advantages(b["tool_rewards"], b["group_ids"], b["model_mask"]),
        atol=1e-5, rtol=1e-5,
    )


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("B, T", [(0, 7), (0, 0), (6, 0)])
def test_every_estimator_defines_empty_batches_and_empty_responses(name, B, T):
    """B = 0 (no rollout) and T = 0 (no response token): an empty (B, T) result, not an error."""
    b = _batch(B=B, T=T)
    for kind in ("torch", "numpy", "list"):
        adv = compute_advantages(name, AdvantageInputs(**{k: _as(kind, v) for k, v in b.items()}))
        want = (0, 0) if kind == "list" and B == 0 else (B, T)  # a list [] has no column count: (0, 0)
        assert tuple(adv.shape) == want and adv.dtype == torch.float32


def test_group_normalize_of_an_empty_batch_is_empty():
    assert group_normalize(torch.tensor([]), []).shape == (0,)
    assert grpo_advantages([], [], torch.zeros(0, 3)).shape == (0, 3)
