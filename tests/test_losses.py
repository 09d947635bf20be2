import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca import aggregate, clipped_surrogate, kl_penalty, masked_mean, segment_masks
from slca.core.losses import AGG_MODES, token_weights


def test_clipped_surrogate_hand_cases():
    old = torch.zeros(1, 4)
    # ratios 2.0, 0.5, 1.1, 0.9 ; advantages +1, -1, +1, -1
    lp = torch.log(torch.tensor([[2.0, 0.5, 1.1, 0.9]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss = clipped_surrogate(lp, old, adv, clip_low=0.2, clip_high=0.28)
    # +A, ratio 2 -> clipped at 1.28 ; -A, ratio .5 -> min(-.5, -.8) = -.8 -> loss .8
    # +A, ratio 1.1 inside ; -A, ratio .9 inside
    assert loss.tolist()[0] == pytest.approx([-1.28, 0.8, -1.1, 0.9], abs=1e-6)


def test_clipped_surrogate_gradient_zero_when_clipped():
    lp = torch.log(torch.tensor([[2.0, 1.0]])).requires_grad_()
    loss = clipped_surrogate(lp, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]))
    loss.sum().backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] == pytest.approx(-1.0)


def test_kl_estimators_hand_values():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    d = math.log(0.25) - math.log(0.5)
    assert kl_penalty(lp, ref, kind="k1").item() == pytest.approx(-d)
    assert kl_penalty(lp, ref, kind="k2").item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(lp, ref, kind="k3").item() == pytest.approx(math.exp(d) - d - 1)
    assert kl_penalty(lp, lp, kind="k3").item() == 0.0


def test_k3_is_unbiased_estimate_of_kl():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(8, generator=gen), 0)
    q = torch.softmax(torch.randn(8, generator=gen), 0)
    true_kl = (p * (p.log() - q.log())).sum()
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    est = kl_penalty(p.log()[x][None], q.log()[x][None], kind="k3").mean()
    assert est.item() == pytest.approx(true_kl.item(), rel=0.03)


def test_aggregation_modes_hand_case():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert aggregate(x, m, "token_mean").item() == pytest.approx(8 / 5)
    assert aggregate(x, m, "seq_mean").item() == pytest.approx((1 + 4) / 2)
    assert aggregate(x, m, "token_sum_norm", max_tokens=10).item() == pytest.approx(8 / (2 * 10))
    tm = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]])
    sm = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0]])
    # tool tokens mean (1 + 4)/2 = 2.5 ; summary mean 1 ; balanced 1.75
    assert aggregate(x, m, "segment_balanced", tool_mask=tm, summary_mask=sm).item() == pytest.approx(1.75)
    # no tool token anywhere: summary only at full weight
    assert aggregate(x, m, "segment_balanced", tool_mask=torch.zeros_like(tm), summary_mask=m).item() == pytest.approx(8 / 5)


def test_segment_balanced_short_call_not_outweighed():
    # one token of tool loss vs 100 of summary loss: balanced gives them equal total weight
    x = torch.cat([torch.full((1, 1), 10.0), torch.zeros(1, 100)], 1)
    m = torch.ones(1, 101)
    tm = torch.zeros(1, 101)
    tm[0, 0] = 1
    sm = m - tm
    assert aggregate(x, m, "token_mean").item() == pytest.approx(10 / 101)
    assert aggregate(x, m, "segment_balanced", tool_mask=tm, summary_mask=sm).item() == pytest.approx(5.0)


def test_masked_mean_empty_is_zero():
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: aggregate(torch.ones(2, 2), torch.ones(2, 3)), "mask has shape"),
        (lambda: aggregate(torch.ones(2, 2), torch.ones(2, 2), "mean"), "mode must be one of"),
        (lambda: aggregate(torch.ones(2, 2), torch.ones(2, 2), "segment_balanced"), "needs tool_mask"),
        (lambda: aggregate(torch.ones(2, 2), torch.full((2, 2), 2)), "mask must contain only 0 and 1"),
        (lambda: kl_penalty(torch.ones(1, 2), torch.ones(1, 2), kind="k4"), "kind must be one of"),
        (lambda: clipped_surrogate(torch.ones(1, 2), torch.ones(1, 3), torch.ones(1, 2)), "old_logprobs has shape"),
        (lambda: clipped_surrogate(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2), clip_low=1.5), "clip_low"),
        (lambda: aggregate(torch.ones(0, 2), torch.ones(0, 2)), "empty batch"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_clipped_surrogate_stats_are_the_clipped_tokens():
    lp = torch.log(torch.tensor([[1.5, 1.0, 0.5, 1.1]]))
    old = torch.zeros(1, 4)
    adv = torch.ones(1, 4)
    loss, st = clipped_surrogate(lp, old, adv, clip_low=0.2, clip_high=0.28, return_stats=True)
    assert torch.equal(loss, clipped_surrogate(lp, old, adv, clip_low=0.2, clip_high=0.28))
    assert st.clipped.tolist() == [[True, False, True, False]]
    assert torch.allclose(st.ratio, torch.tensor([[1.5, 1.0, 0.5, 1.1]]))
    assert st.clip_frac(torch.ones(1, 4)) == 0.5
    assert st.clip_frac(torch.tensor([[1, 1, 0, 0]])) == 0.5  # only masked tokens count
    assert st.clip_frac(torch.zeros(1, 4)) == 0.0


@pytest.mark.parametrize("mode", AGG_MODES)
def test_token_weights_reproduce_aggregate(mode):
    """aggregate(x) == (x * token_weights).sum() for any x: the weights of gradient accumulation."""
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 9, generator=g) > 0.3).long()
    mask[3] = 0  # a row without policy tokens
    tool = mask * (torch.arange(9) < 4)
    summ = mask - tool
    w = token_weights(mask, mode, tool_mask=tool, summary_mask=summ, max_tokens=12)
    assert w.shape == mask.shape and bool((w[mask == 0] == 0).all())
    for _ in range(3):
        x = torch.randn(5, 9, generator=g)
        want = aggregate(x, mask, mode, tool_mask=tool, summary_mask=summ, max_tokens=12)
        assert float((x * w).sum()) == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    # slices of rows add up to the whole
    x = torch.randn(5, 9, generator=g)
    parts = sum(float((x[r] * w[r]).sum()) for r in torch.arange(5).split(2))
    assert parts == pytest.approx(float(aggregate(x, mask, mode, tool_mask=tool, summary_mask=summ, max_tokens=12)), rel=1e-5)


def test_token_weights_of_an_empty_mask_are_zero():
    for mode in AGG_MODES:
        assert not token_weights(torch.zeros(2, 3, dtype=torch.long), mode, tool_mask=torch.zeros(2, 3),
                                 summary_mask=torch.zeros(2, 3)).any(), mode


# ----------------------------------------------------------------- turn_mean: every assistant turn weighs the same


def _ref_turn_mean(x: list[list[float]], m: list[list[int]]) -> float:
    """Token loop: cut each row into its runs of 1s (its turns), average each turn, then the turns of the batch."""
    turn_means = []
    for row_x, row_m in zip(x, m):
        run: list[float] = []
        for v, on in zip(row_x, row_m):
            if on:
                run.append(v)
            elif run:
                turn_means.append(sum(run) / len(run))
                run = []
        if run:
            turn_means.append(sum(run) / len(run))
    return sum(turn_means) / len(turn_means) if turn_means else 0.0


def test_turn_mean_hand_case():
    # row 0: turns [1, 2] and [3] around one environment token, then padding; row 1: one turn [4]
    x = torch.tensor([[1.0, 2.0, 9.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]])
    assert aggregate(x, m, "turn_mean").item() == pytest.approx((1.5 + 3 + 4) / 3)
    want = torch.tensor([[1 / 6, 1 / 6, 0, 1 / 3, 0], [1 / 3, 0, 0, 0, 0]])
    torch.testing.assert_close(token_weights(m, "turn_mean"), want)
    assert aggregate(x, torch.zeros_like(m), "turn_mean").item() == 0.0


ragged = st.integers(1, 6).flatmap(
    lambda B: st.integers(1, 24).flatmap(
        lambda T: st.tuples(
            st.lists(st.lists(st.integers(0, 1), min_size=T, max_size=T), min_size=B, max_size=B),
            st.lists(st.integers(0, T), min_size=B, max_size=B),  # each row's length; the rest is padding
            st.lists(st.lists(st.floats(-10, 10), min_size=T, max_size=T), min_size=B, max_size=B),
        )
    )
)


@settings(max_examples=300, deadline=None)
@given(ragged)
def test_turn_mean_matches_the_token_loop_reference(case):
    bits, lengths, values = case
    m = [[b if t < n else 0 for t, b in enumerate(row)] for row, n in zip(bits, lengths)]
    x = torch.tensor(values, dtype=torch.float64)
    mask = torch.tensor(m)
    want = _ref_turn_mean(values, m)
    assert float(aggregate(x, mask, "turn_mean")) == pytest.approx(want, rel=1e-9, abs=1e-12)
    # the same as a weighted sum: the weights of gradient accumulation (float32)
    w = token_weights(mask, "turn_mean")
    assert float((x * w.double()).sum()) == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert bool((w[mask == 0] == 0).all())
    assert float(w.sum()) == pytest.approx(1.0 if any(map(any, m)) else 0.0, rel=1e-5)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 4), st.randoms(use_true_random=False))
def test_turn_mean_reduces_to_seq_mean_and_to_token_mean(B, n, turns, rnd):
    """One turn per rollout: ``seq_mean``. Every turn of one length: ``token_mean``."""
    gen = torch.Generator().manual_seed(rnd.randrange(2**31))
    one_turn = torch.zeros(B, 30, dtype=torch.long)
    for i in range(B):
        one_turn[i, : rnd.randint(1, 30)] = 1
    x = torch.randn(B, 30, generator=gen, dtype=torch.float64)
    assert float(aggregate(x, one_turn, "turn_mean")) == pytest.approx(float(aggregate(x, one_turn, "seq_mean")), rel=1e-9)
    even = torch.zeros(B, turns * (n + 2), dtype=torch.long)  # rows of 1..turns turns of n tokens, 2 environment tokens apart
    for i in range(B):
        for k in range(rnd.randint(1, turns)):
            even[i, k * (n + 2) : k * (n + 2) + n] = 1
    x = torch.randn(even.shape, generator=gen, dtype=torch.float64)
    assert float(aggregate(x, even, "turn_mean")) == pytest.approx(float(aggregate(x, even, "token_mean")), rel=1e-9)


# ----------------------------------------------------------------- docs/training.md: a long multi-turn rollout vs a short one

def loss_agg_table(max_tokens: int = 400) -> dict[str, list[list[Fraction]]]:
    """Each mode's weights for the batch of docs/training.md's table, by :func:`token_weights`.

    Row 0: a 3-turn rollout, call (100 tokens), tool answer (20), call (100), tool answer (20), answer (100);
    row 1: a 1-turn rollout, answer (50). Returns, per mode, the cells of the table: the distinct weights of one
    token of the long rollout (calls first), of the short one, the weight of each rollout, and the long : short
    ratio per token and per rollout.
    """
    T = 340
    model, valid = torch.zeros(2, T, dtype=torch.long), torch.zeros(2, T, dtype=torch.long)
    for a in (0, 120, 240):
        model[0, a : a + 100] = 1
    valid[0] = 1
    model[1, :50] = valid[1, :50] = 1
    tool, summary = segment_masks(model, valid)
    table = {}
    for mode in AGG_MODES:
        w = token_weights(model, mode, tool_mask=tool, summary_mask=summary, max_tokens=max_tokens).double()

        def frac(v):
            return Fraction(float(v)).limit_denominator(10_000)

        long_tok = [frac(w[0, tool[0].bool()][0]), frac(w[0, summary[0].bool()][0])]
        long_tok = long_tok[:1] if long_tok[0] == long_tok[1] else long_tok
        short_tok = frac(w[1, 0])
        table[mode] = [long_tok, [short_tok], [frac(w[0].sum())], [frac(w[1].sum())],
                       [t / short_tok for t in long_tok], [frac(w[0].sum() / w[1].sum())]]
    return table


def test_docs_loss_agg_table_is_what_token_weights_give():
    """The table of docs/training.md, "Loss aggregation", holds what :func:`loss_agg_table` computes (a mismatch
    prints the computed cells)."""
    doc = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    section = doc.split("\n## Loss aggregation", 1)[1].split("\n## ", 1)[0]
    rows = {r[0].strip("` "): r[1:] for r in (line.strip().strip("|").split("|") for line in section.splitlines()
                                              if re.match(r"\|\s*`\w+`\s*\|", line.strip()))}
    want = loss_agg_table()
    assert set(rows) == set(want), sorted(set(rows) ^ set(want))  # one row per mode
    for mode, cells in want.items():
        got = [[Fraction(v) for v in re.findall(r"\d+(?:/\d+)?", c)] for c in rows[mode][: len(cells)]]
        shown = [[str(v) for v in c] for c in cells]
        assert len(got) == len(cells), (mode, shown, rows[mode])
        for g, w in zip(got, cells):
            assert len(g) == len(w), (mode, shown, rows[mode])
            assert all(float(a) == pytest.approx(float(b), rel=1e-4) for a, b in zip(g, w)), (mode, shown, rows[mode])
