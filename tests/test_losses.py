import math

import pytest
import torch

from slca import aggregate, clipped_surrogate, kl_penalty, masked_mean


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


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean", "token_sum_norm", "segment_balanced"])
def test_token_weights_reproduce_aggregate(mode):
    """aggregate(x) == (x * token_weights).sum() for any x: the weights of gradient accumulation."""
    from slca.core.losses import token_weights

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
    from slca.core.losses import token_weights

    assert not token_weights(torch.zeros(2, 3, dtype=torch.long)).any()
