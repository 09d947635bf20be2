"""Reasoning as its own segment (slca_think) and calls inside text (span segmentation): the core math.

slca_think with the reasoning reward inherited equals slca bit for bit on random batches; on rows that have reasoning
the three routes (slca, slca_think inherited, slca_think with its own reasoning reward) differ as they should; the span
segments against a token-loop reference. Labels from real token ids: test_spans.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca import AdvantageInputs, compute_advantages, segment_masks, slca_advantages
from slca.core.beyond import slca_think_advantages
from slca.core.registry import InputSpec, fill_inputs, get_estimator, register_estimator
from slca.core.segments import SPAN_CALL, SPAN_NONE, SPAN_TEXT, SPAN_THINK, span_segment_masks, think_mask

NAN = float("nan")
G = 4
MODES = ("response", "include", "exclude", "both")


@st.composite
def labelled_batches(draw, max_groups=3):
    """Rows of tool turns (policy run + environment run), a summary and padding; a span label on every policy token."""
    n_groups = draw(st.integers(1, max_groups))
    B = n_groups * G
    rows, labels = [], []
    for _ in range(B):
        row, lab = [], []
        for _ in range(draw(st.integers(0, 3)) + 1):  # each run: policy tokens, then (but for the last) environment tokens
            n = draw(st.integers(1, 4))
            row += [1] * n
            lab += draw(st.lists(st.sampled_from([SPAN_TEXT, SPAN_THINK, SPAN_CALL]), min_size=n, max_size=n))
            k = draw(st.integers(0, 2))
            row += [0] * k
            lab += [SPAN_NONE] * k
        rows.append((row, lab))
    T = max(len(r) for r, _ in rows)
    model = torch.tensor([r + [0] * (T - len(r)) for r, _ in rows])
    valid = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r, _ in rows])
    span = torch.tensor([lab + [SPAN_NONE] * (T - len(lab)) for _, lab in rows], dtype=torch.int8)
    reward = st.one_of(st.floats(0, 1), st.just(NAN))
    r = [torch.tensor(draw(st.lists(reward, min_size=B, max_size=B))) for _ in range(3)]
    return model, valid, span, r[0], r[1], r[2], [i // G for i in range(B)]


@settings(max_examples=150, deadline=None)
@given(labelled_batches(), st.sampled_from(MODES), st.sampled_from(["drop", "last_turn"]), st.sampled_from(["group", "batch", "none"]))
def test_inherited_reasoning_reward_is_slca_bit_for_bit(batch, mode, es, scale):
    model, valid, span, rt, rs, _, gids = batch
    for tm, sm in (segment_masks(model, valid), span_segment_masks(*segment_masks(model, valid), span)):
        opts = {"scale": scale, "empty_tool": mode, "empty_summary": es}
        ref = slca_advantages(rt, rs, gids, tm, sm, **opts)
        th = think_mask(tm, span)
        assert torch.equal(slca_think_advantages(rt, rs, gids, tm, sm, th, **opts), ref)
        # a reasoning reward that is the call tier's reward, given: the reasoning route runs, same bits
        assert torch.equal(slca_think_advantages(rt, rs, gids, tm, sm, th, think_rewards=rt.clone(), **opts), ref)
        inputs = AdvantageInputs(rt, rs, gids, model, tm, sm, span_labels=span)
        assert torch.equal(compute_advantages("slca_think", inputs, **opts), compute_advantages("slca", inputs, **opts))


@settings(max_examples=100, deadline=None)
@given(labelled_batches(), st.sampled_from(MODES), st.sampled_from(["drop", "last_turn"]))
def test_the_reasoning_tier_moves_reasoning_tokens_only(batch, mode, es):
    """Against a token loop: reasoning tokens of the execution segment get the reasoning tier's advantage in place of
    the call tier's; every other token keeps slca's."""
    model, valid, span, rt, rs, rk, gids = batch
    tm, sm = segment_masks(model, valid)
    th = think_mask(tm, span)
    opts = {"empty_tool": mode, "empty_summary": es}
    base = slca_advantages(rt, rs, gids, tm, sm, **opts)
    got = slca_think_advantages(rt, rs, gids, tm, sm, th, think_rewards=rk, **opts)
    # the reasoning tier routed as slca routes the call tier (empty_tool's statistics included): its tool-token values
    as_tool = slca_advantages(rk, rs, gids, tm, sm, **opts)
    for i in range(model.shape[0]):
        for t in range(model.shape[1]):
            want = as_tool[i, t] if th[i, t] else base[i, t]
            assert got[i, t].item() == pytest.approx(want.item(), abs=1e-6), (i, t)


def test_the_three_routes_differ_on_rows_that_think():
    """Two rollouts of one group; each has a tool turn (reasoning, then the call) and an answer. The first reasoned
    well (reasoning reward 1) but called badly (execution 0), the second the other way round."""
    L = SPAN_THINK, SPAN_THINK, SPAN_CALL, SPAN_CALL, SPAN_NONE, SPAN_TEXT
    model = torch.tensor([[1, 1, 1, 1, 0, 1]] * 2)
    span = torch.tensor([L] * 2, dtype=torch.int8)
    tm, sm = segment_masks(model)
    rt, rs, rk = torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    h = 1 / math.sqrt(2)
    slca = slca_advantages(rt, rs, [0, 0], tm, sm, eps=0.0)
    inherited = slca_think_advantages(rt, rs, [0, 0], tm, sm, think_mask(tm, span), eps=0.0)
    own = slca_think_advantages(rt, rs, [0, 0], tm, sm, think_mask(tm, span), think_rewards=rk, eps=0.0)
    assert torch.allclose(slca, torch.tensor([[-h, -h, -h, -h, 0, 0], [h, h, h, h, 0, 0]]))
    assert torch.equal(inherited, slca)  # inherited: the reasoning is blamed with its call
    assert torch.allclose(own, torch.tensor([[h, h, -h, -h, 0, 0], [-h, -h, h, h, 0, 0]]))  # own tier: opposite signs
    # span segmentation on the same rows moves nothing: no text in the tool turn
    assert [torch.equal(a, b) for a, b in zip(span_segment_masks(tm, sm, span), (tm, sm))] == [True, True]


def test_reasoning_in_the_summary_turn_stays_summary():
    model = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 0, 1, 1]])
    span = torch.tensor([[SPAN_CALL, SPAN_CALL, 0, SPAN_THINK, SPAN_TEXT]] * 2, dtype=torch.int8)
    tm, sm = segment_masks(model)
    assert not think_mask(tm, span).any()
    inputs = AdvantageInputs([0.0, 1.0], [1.0, 0.0], [0, 0], model, tm, sm, span_labels=span)
    assert torch.equal(compute_advantages("slca_think", inputs), compute_advantages("slca", inputs))


def test_span_segments_hand_case_and_loop_reference():
    # turn 0: text, call, text; env; turn 1: text only (no call: stays execution); env; answer
    model = torch.tensor([[1, 1, 1, 0, 1, 1, 0, 1]])
    span = torch.tensor([[SPAN_TEXT, SPAN_CALL, SPAN_TEXT, 0, SPAN_TEXT, SPAN_TEXT, 0, SPAN_TEXT]], dtype=torch.int8)
    tm, sm = span_segment_masks(*segment_masks(model), span)
    assert tm.tolist() == [[0, 1, 0, 0, 1, 1, 0, 0]] and sm.tolist() == [[1, 0, 1, 0, 0, 0, 0, 1]]


@settings(max_examples=150, deadline=None)
@given(labelled_batches())
def test_span_segments_match_a_token_loop(batch):
    model, valid, span, *_ = batch
    tm, sm = segment_masks(model, valid)
    got_t, got_s = span_segment_masks(tm, sm, span)
    assert got_t.dtype == tm.dtype and torch.equal(got_t + got_s, tm + sm) and not (got_t.bool() & got_s.bool()).any()
    for i in range(model.shape[0]):
        t = 0
        T = model.shape[1]
        while t < T:
            if not tm[i, t]:
                t += 1
                continue
            s = t
            while t < T and tm[i, t]:
                t += 1
            has_call = any(int(span[i, k]) == SPAN_CALL for k in range(s, t))
            for k in range(s, t):
                moved = has_call and int(span[i, k]) == SPAN_TEXT
                assert (int(got_t[i, k]), int(got_s[i, k])) == ((0, 1) if moved else (1, 0)), (i, k)


def test_empty_shapes_and_bad_labels():
    z = torch.zeros(2, 0, dtype=torch.long)
    tm, sm = span_segment_masks(z, z, z)
    assert tm.shape == (2, 0) and sm.shape == (2, 0)
    m = torch.tensor([[1, 1]])
    with pytest.raises(ValueError, match="span_labels must hold 0..3"):
        span_segment_masks(m, 0 * m, torch.tensor([[1, 7]]))
    with pytest.raises(ValueError, match="integer tensor"):
        think_mask(m, torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="0 \\(not a policy token\\) on a tool-segment token"):
        think_mask(m, torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="think_mask has 1 outside tool_mask"):
        slca_think_advantages([0.0], [0.0], [0], torch.tensor([[1, 0]]), torch.tensor([[0, 1]]), torch.tensor([[0, 1]]))
    inputs = AdvantageInputs([0.0], [0.0], [0], m, m, 0 * m)
    with pytest.raises(ValueError, match="needs AdvantageInputs.span_labels"):
        compute_advantages("slca_think", inputs)


def test_a_user_reasoning_reward_is_an_input_declared_as_others(monkeypatch):
    """The reasoning reward travels as the input ``think_rewards``: an estimator that declares it (with how to compute
    it from the rollouts) gets it filled by every host's input machinery; span_labels, set by the host, is kept."""

    def thought_length(trajectories):
        return torch.tensor([float(t) for t in trajectories])

    from slca.core import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test (docs/beyond.md
    monkeypatch.setattr(registry, "_INPUTS", dict(registry._INPUTS))  # registers its own think_rewards)
    spec = get_estimator("slca_think")

    @register_estimator("test_think_judged", needs=("span_labels", InputSpec("think_rewards", "(B,) test reasoning reward", thought_length)),
                        options=spec.options)
    def judged(inputs, **options):
        return spec.fn(inputs, **options)

    model = torch.tensor([[1, 1, 0, 1]] * 2)
    span = torch.tensor([[SPAN_THINK, SPAN_CALL, 0, SPAN_TEXT]] * 2, dtype=torch.int8)
    tm, sm = segment_masks(model)
    inputs = fill_inputs(AdvantageInputs([0.0, 1.0], [0.0, 0.0], [0, 0], model, tm, sm, span_labels=span), "test_think_judged", [1, 0])
    assert inputs.span_labels is span and inputs.get("think_rewards").tolist() == [1.0, 0.0]
    adv = compute_advantages("test_think_judged", inputs, eps=0.0)
    h = 1 / math.sqrt(2)
    assert torch.allclose(adv, torch.tensor([[h, -h, 0, 0], [-h, h, 0, 0]]))
