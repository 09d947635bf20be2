"""slca.fastpath.sampling against torch.multinomial: the same tokens and the same generator state afterwards."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import slca.fastpath.sampling as S
from slca.fastpath.sampling import available, multinomial_one


def pair(seed: int, skip: int = 0) -> tuple[torch.Generator, torch.Generator]:
    """Two generators in the same state, ``skip`` float draws past ``manual_seed(seed)``."""
    gs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for g in gs:
        torch.rand(skip, generator=g)
    return gs


def same(g1: torch.Generator, g2: torch.Generator) -> bool:
    return torch.equal(g1.get_state(), g2.get_state()) and torch.rand(3, generator=g1).equal(torch.rand(3, generator=g2))


def probs(shape, seed, sharp=3.0):
    return torch.softmax(torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * sharp, -1)


def test_the_bulk_path_is_in_use_on_this_torch():
    assert available()


@pytest.fixture(autouse=True)
def bulk_always(monkeypatch):
    """Small inputs go to torch.multinomial (faster below ~2,000 entries); the tests exercise the bulk path on all."""
    monkeypatch.setattr(S, "_MIN_ENTRIES", 1)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (2, 311), (5, 624), (3, 1000), (32, 1536), (64, 50)])
@pytest.mark.parametrize("skip", [0, 1, 623, 624, 1000])
def test_tokens_and_state_equal_torch(shape, skip):
    for seed in range(4):
        p = probs(shape, seed)
        g1, g2 = pair(100 + seed, skip)
        want = torch.multinomial(p, 1, generator=g1).squeeze(-1)
        got = multinomial_one(p, g2)
        assert got.dtype == torch.long and got.shape == (shape[0],)
        assert torch.equal(want, got)
        assert same(g1, g2)


def test_many_steps_in_a_row_like_a_rollout():
    g1, g2 = pair(7)
    for step in range(40):
        p = probs((16, 300), step, sharp=1.0 + step % 5)
        assert torch.equal(torch.multinomial(p, 1, generator=g1).squeeze(-1), multinomial_one(p, g2)), step
    assert same(g1, g2)


def test_zeros_from_top_p_and_unnormalised_weights():
    p = probs((8, 400), 3)
    p[:, ::2] = 0  # top-p truncation leaves exact zeros
    p[3] = 0
    p[3, 17] = 5.0  # one token left in a row, weights not summing to one
    g1, g2 = pair(11, 5)
    want = torch.multinomial(p, 1, generator=g1).squeeze(-1)
    got = multinomial_one(p, g2)
    assert torch.equal(want, got) and got[3] == 17
    assert (got % 2 == 1).all()  # never a zero-weight token
    assert same(g1, g2)


def test_default_generator_is_used_when_none_given():
    p = probs((4, 100), 0)
    st = torch.default_generator.get_state()
    want = torch.multinomial(p, 1).squeeze(-1)
    after = torch.default_generator.get_state()
    torch.default_generator.set_state(st)
    assert torch.equal(multinomial_one(p), want)
    assert torch.equal(torch.default_generator.get_state(), after)


def test_distribution_is_the_categorical_one():
    """Not just equal to torch: frequencies match the probabilities (chi-square, 3 categories)."""
    p = torch.tensor([[0.2, 0.5, 0.3]]).expand(20000, 3).contiguous()
    tok = multinomial_one(p, torch.Generator().manual_seed(0))
    counts = torch.bincount(tok, minlength=3).double()
    expected = p[0].double() * len(tok)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # p = 0.001 at 2 degrees of freedom


@pytest.mark.parametrize("bad", ["nan", "inf", "negative", "zero_row"])
def test_invalid_probabilities_raise_torchs_error(bad):
    p = probs((3, 20), 0)
    if bad == "nan":
        p[1, 2] = float("nan")
    elif bad == "inf":
        p[0, 0] = float("inf")
    elif bad == "negative":
        p[2, 3] = -0.1
    else:
        p[1] = 0
    g1, g2 = pair(1)
    with pytest.raises(RuntimeError) as want:
        torch.multinomial(p, 1, generator=g1)
    with pytest.raises(RuntimeError) as got:
        multinomial_one(p, g2)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("case", ["float64", "1d", "grad", "noncontiguous"])
def test_other_inputs_fall_back_to_torch(case):
    p = probs((4, 64), 2)
    if case == "float64":
        p = p.double()
    elif case == "1d":
        p = p[0]
    elif case == "grad":
        p = p.clone().requires_grad_(True)
    else:
        p = probs((64, 4), 2).t()  # torch draws a transposed input in memory order
        assert not p.is_contiguous()
    g1, g2 = pair(3)
    want = torch.multinomial(p, 1, generator=g1).squeeze(-1)
    assert torch.equal(multinomial_one(p, g2), want)
    assert same(g1, g2)


def test_near_ties_are_decided_by_the_c_librarys_log1p(monkeypatch):
    """Two candidates with equal weight: the row is recomputed with math.log1p, and still equals torch."""
    calls = []
    real = math.log1p
    monkeypatch.setattr(S.math, "log1p", lambda x: calls.append(1) or real(x))
    monkeypatch.setattr(S, "_MARGIN", 1.0)  # every row counts as a near tie: all go through the exact path
    p = probs((6, 50), 4)
    g1, g2 = pair(9)
    assert torch.equal(torch.multinomial(p, 1, generator=g1).squeeze(-1), multinomial_one(p, g2))
    assert len(calls) == 6 * 50
    assert same(g1, g2)


def test_small_inputs_go_to_torch(monkeypatch):
    monkeypatch.setattr(S, "_MIN_ENTRIES", 2048)
    calls = []
    monkeypatch.setattr(S, "_sample", lambda *a: calls.append(1))
    g1, g2 = pair(4)
    p = probs((2, 1000), 1)
    assert torch.equal(multinomial_one(p, g2), torch.multinomial(p, 1, generator=g1).squeeze(-1))
    assert calls == [] and same(g1, g2)


def test_a_torch_that_draws_differently_is_detected(monkeypatch):
    """The self-check fails (here: the draws assigned in reverse order) and every call goes to torch.multinomial."""
    real = S._draw_uniforms
    monkeypatch.setattr(S, "_draw_uniforms", lambda bg, n: real(bg, n)[::-1].copy())
    monkeypatch.setattr(S, "_status", None)
    assert not available()
    p = probs((4, 64), 5)
    g1, g2 = pair(2)
    assert torch.equal(multinomial_one(p, g2), torch.multinomial(p, 1, generator=g1).squeeze(-1))
    assert same(g1, g2)


def test_uniforms_are_torchs_doubles():
    """The uniforms behind the draws are torch's: its float64 exponential_ is -log1p(-u) through the C library."""
    g1, g2 = pair(5, 3)
    q = torch.empty(2000, dtype=torch.float64).exponential_(generator=g1).numpy()
    stream = S._Stream()
    stream.load(g2)
    u = S._draw_uniforms(stream.bg, 2000)
    assert ((u >= 0) & (u < 1)).all()
    assert np.array_equal(np.array([-math.log1p(-x) for x in u]), q)
