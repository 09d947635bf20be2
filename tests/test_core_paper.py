"""slca.core.paper: the released estimators against the authors' own CPU tests and a loop reference.

Part 1 ports ``verl/tests/trainer/ppo/test_slca_grpo_on_cpu.py`` of ``SLCA-GRPO/SLCA-GRPO`` (commit
68539c5, Apache-2.0) case by case: the same inputs and expected values, restated against slca's
functions (``positional_segments`` for ``_extract_segments_from_mask_1d`` / ``_build_two_segment_masks``,
``present_normalize`` for ``_groupwise_normalize_with_present``, ``slca_paper_advantages`` for
``compute_slca_grpo_advantage``; their ``adv_process`` / ``adv_summary`` metrics are read off the
token advantages of each segment). Part 2 compares the three estimators with ``_ref_*``: a
loop-for-loop restatement of the released functions (dict grouping, one rollout at a time, as
their code does), on thousands of random batches. Part 3: the registry, the hosts' options and
inputs.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import slca
from slca.core.registry import AdvantageInputs, compute_advantages, get_estimator
from _released_reference import random_batch, ref_rltr, ref_slca, ref_toolpo
from slca.core.paper import (
    positional_segments,
    present_normalize,
    rltr_planner_advantages,
    slca_paper_advantages,
    toolpo_grpo_advantages,
)

PAIR_ZSCORE = float(1.0 / math.sqrt(2.0))  # a present group of two always normalises to +-1/sqrt(2)
TWO_SEGMENT_MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 1, 1, 1, 0]], dtype=torch.float32)
ONE_GROUP = np.array(["g0", "g0"])


def runs(mask_1d) -> list[tuple[int, int]]:
    """The half-open runs of 1s of a 1-D mask, read off positional_segments one run at a time (their
    ``_extract_segments_from_mask_1d``): peel the summary (last run) off until nothing is left."""
    m = torch.as_tensor(mask_1d).bool().unsqueeze(0)
    out = []
    while m.any():
        proc, summ = positional_segments(m)
        idx = summ[0].nonzero().squeeze(1)
        out.append((int(idx[0]), int(idx[-1]) + 1))
        m = proc
    return out[::-1]


def seg_adv(adv: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """(B,) the one value each row's segment carries (0 for an empty segment): their adv_process / adv_summary."""
    seg = seg.bool()
    vals = torch.where(seg, adv, torch.zeros_like(adv)).sum(1) / seg.sum(1).clamp_min(1)
    return vals


def paper(mask, process, summary, total, should_no_call=None, kl=None, w_process=1.0, w_respq=1.0, index=ONE_GROUP):
    """``compute_slca_grpo_advantage`` with their test helper's arguments; returns (advantages, adv_process, adv_summary)."""
    adv = slca_paper_advantages(
        torch.tensor(process, dtype=torch.float32), torch.tensor(summary, dtype=torch.float32), list(index), mask,
        score_total=torch.tensor(total, dtype=torch.float32),
        should_no_call=None if should_no_call is None else torch.tensor(should_no_call, dtype=torch.float32),
        kl_rewards=kl, lambda_tool=w_process, lambda_sum=w_respq,
    )
    p, s = positional_segments(mask)
    return adv, seg_adv(adv, p), seg_adv(adv, s)


def assert_no_leakage(adv, mask):
    assert (adv * (1.0 - mask)).abs().max().item() == 0.0


# --------------------------------------------------------------------------- part 1: their CPU tests, ported


class TestExtractSegments:
    def test_empty_mask(self):
        assert runs(torch.zeros(10)) == []

    def test_single_segment(self):
        assert runs([0, 0, 1, 1, 1, 0, 0]) == [(2, 5)]

    def test_multiple_segments(self):
        assert runs([1, 1, 0, 0, 1, 1, 1, 0, 1]) == [(0, 2), (4, 7), (8, 9)]

    def test_all_ones(self):
        assert runs(torch.ones(5)) == [(0, 5)]

    def test_boundary_segments(self):
        assert runs([1, 0, 1]) == [(0, 1), (2, 3)]


class TestBuildTwoSegmentMasks:
    def test_no_segments(self):
        p, s = positional_segments(torch.zeros(2, 10))
        assert not p.any() and not s.any()

    def test_single_segment_is_summary(self):
        p, s = positional_segments(torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0, 0]]))
        assert not p[0].any()
        assert s[0, 2:5].all() and s[0, :2].sum() == 0 and s[0, 5:].sum() == 0

    def test_two_segments(self):
        p, s = positional_segments(torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0, 0]]))
        assert p[0, 1:3].all() and not p[0, 0] and p[0, 3:].sum() == 0
        assert s[0, 5:8].all() and s[0, :5].sum() == 0 and s[0, 8:].sum() == 0

    def test_three_segments(self):
        p, s = positional_segments(torch.tensor([[1, 1, 0, 0, 1, 0, 0, 1, 1, 0]]))
        assert p[0, 0:2].all() and p[0, 4:5].all() and s[0, 7:9].all()
        assert not (p[0] & s[0]).any()

    def test_masks_partition_the_response_mask(self):
        m = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 1, 0]], dtype=torch.float32)
        p, s = positional_segments(m)
        assert torch.equal(p | s, m > 0.5)

    def test_mixed_batch(self):
        p, s = positional_segments(torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0, 0, 0], [0] * 10]))
        assert p.any(1).tolist() == [True, False, False]
        assert s.any(1).tolist() == [True, True, False]


class TestGroupwiseNormalize:
    def z(self, x):
        return (x - x.mean()) / (x.std(unbiased=True) + 1e-6)

    def test_all_present(self):
        s = torch.tensor([1.0, 2.0, 3.0, 4.0])
        assert torch.allclose(present_normalize(s, ["g0"] * 4, torch.ones(4, dtype=torch.bool)), self.z(s), atol=1e-5)

    def test_partial_present(self):
        s = torch.tensor([1.0, 2.0, 3.0, 4.0])
        adv = present_normalize(s, ["g0"] * 4, torch.tensor([True, True, False, False]))
        assert torch.allclose(adv[:2], self.z(s[:2]), atol=1e-5)
        assert adv[2].item() == 0.0 and adv[3].item() == 0.0

    def test_singleton_group_is_zeroed(self):
        adv = present_normalize(torch.tensor([5.0, 10.0]), ["g0", "g1"], torch.ones(2, dtype=torch.bool))
        assert torch.equal(adv, torch.zeros(2))

    def test_count_one_after_present_filter_is_zeroed(self):
        adv = present_normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]), ["g0"] * 4, torch.tensor([True, False, False, False]))
        assert torch.equal(adv, torch.zeros(4))

    def test_nothing_present(self):
        adv = present_normalize(torch.tensor([1.0, 2.0]), ["g0"] * 2, torch.zeros(2, dtype=torch.bool))
        assert torch.equal(adv, torch.zeros(2))

    def test_multiple_groups(self):
        s = torch.tensor([1.0, 3.0, 10.0, 20.0])
        adv = present_normalize(s, ["group_a", "group_a", "group_b", "group_b"], torch.ones(4, dtype=torch.bool))
        assert torch.allclose(adv[:2], self.z(s[:2]), atol=1e-5) and torch.allclose(adv[2:], self.z(s[2:]), atol=1e-5)

    def test_uuid_string_index(self):
        s = torch.tensor([1.0, 2.0, 3.0, 4.0])
        idx = np.array(["3506fef6-0d99-4398-bc13-b4e264ede21e"] * 2 + ["abc123-def456-ghi789"] * 2)
        adv = present_normalize(s, idx, torch.ones(4, dtype=torch.bool))
        assert torch.allclose(adv[:2], self.z(s[:2]), atol=1e-5) and torch.allclose(adv[2:], self.z(s[2:]), atol=1e-5)

    def test_norm_by_std_false_is_mean_subtraction(self):
        s = torch.tensor([1.0, 2.0, 3.0, 4.0])
        adv = present_normalize(s, ["g0"] * 4, torch.ones(4, dtype=torch.bool), scale="none")
        assert torch.allclose(adv, s - s.mean(), atol=1e-6)


class TestSLCAGRPOAdvantage:
    def test_registry_registration(self):
        assert "slca_paper" in slca.list_estimators()
        assert get_estimator("slca_paper").fn.__module__ == "slca.core.paper"

    def test_basic_two_segment(self):
        m = TWO_SEGMENT_MASK
        adv, ap, as_ = paper(m, [0.8, 0.4], [0.9, 0.5], [0.6, 0.3])
        assert_no_leakage(adv, m)
        assert torch.allclose(ap, torch.tensor([PAIR_ZSCORE, -PAIR_ZSCORE]), atol=1e-5)
        assert torch.allclose(as_, torch.tensor([PAIR_ZSCORE, -PAIR_ZSCORE]), atol=1e-5)
        assert torch.allclose(adv[0, 1:3], ap[0].expand(2), atol=1e-6)
        assert torch.allclose(adv[0, 5:8], as_[0].expand(3), atol=1e-6)
        assert torch.allclose(adv[1, 0:2], ap[1].expand(2), atol=1e-6)
        assert torch.allclose(adv[1, 6:9], as_[1].expand(3), atol=1e-6)

    def test_summary_only(self):
        m = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1, 1, 0]], dtype=torch.float32)
        adv, ap, as_ = paper(m, [1.0, 0.5], [0.8, 0.6], [0.6, 0.4])
        assert_no_leakage(adv, m)
        assert torch.equal(ap, torch.zeros(2))  # no process segment anywhere, though process scores differ
        assert torch.allclose(as_, torch.tensor([PAIR_ZSCORE, -PAIR_ZSCORE]), atol=1e-5)
        assert adv[0, 2:5].abs().sum() > 0 and adv[1, 5:9].abs().sum() > 0

    def test_lone_process_segment_hits_count_guard(self):
        m = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
        adv, ap, as_ = paper(m, [0.9, 0.1], [0.9, 0.5], [0.6, 0.3])
        assert torch.equal(ap, torch.zeros(2))
        assert adv[0, 1:3].abs().sum().item() == 0.0
        assert torch.allclose(as_, torch.tensor([PAIR_ZSCORE, -PAIR_ZSCORE]), atol=1e-5)
        assert adv[0, 5:8].abs().sum() > 0

    def test_negative_score_penalty_guard(self):
        m = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 0, 0]] * 2, dtype=torch.float32)
        adv, ap, as_ = paper(m, [0.9, 0.3], [0.8, 0.4], [-0.5, 0.5])  # sample 0 looks better but scored negative
        assert_no_leakage(adv, m)
        assert ap[0] < 0 < ap[1] and as_[0] < 0 < as_[1]
        assert torch.allclose(ap, torch.tensor([-PAIR_ZSCORE, PAIR_ZSCORE]), atol=1e-5)

    def test_should_no_call_penalty_guard(self):
        m = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 0, 0]] * 2, dtype=torch.float32)
        adv, ap, _ = paper(m, [0.9, 0.3], [0.8, 0.4], [0.2, 0.5], should_no_call=[1.0, 0.0])
        assert_no_leakage(adv, m)
        assert ap[0] < 0 < ap[1]

    def test_kl_is_folded_into_segment_scores(self):
        m = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0, 0]] * 2, dtype=torch.float32)
        kl = torch.zeros_like(m)
        kl[0, 1:3] = -0.1  # a KL penalty on sample 0's process tokens
        _, ap, as_ = paper(m, [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], kl=kl)
        assert torch.allclose(ap, torch.tensor([-PAIR_ZSCORE, PAIR_ZSCORE]), atol=1e-5)
        assert torch.allclose(as_, torch.zeros(2), atol=1e-6)

    def test_no_learnable_tokens(self):
        m = torch.zeros(2, 10)
        adv, ap, as_ = paper(m, [0.5, 0.5], [0.5, 0.5], [0.5, 0.5])
        assert adv.abs().sum().item() == 0.0 and ap.abs().sum().item() == 0.0 and as_.abs().sum().item() == 0.0


class TestSegmentWeighting:
    def run(self, w_process, w_respq):
        return paper(TWO_SEGMENT_MASK, [0.8, 0.4], [0.9, 0.5], [0.6, 0.3], w_process=w_process, w_respq=w_respq)

    def test_unit_weights_are_the_identity(self):
        a, ap, _ = self.run(1.0, 1.0)
        b, bp, _ = self.run(1.0, 1.0)
        assert torch.equal(a, b) and torch.equal(ap, bp)

    def test_weights_scale_advantages_linearly(self):
        base, bp, bs = self.run(1.0, 1.0)
        scaled, sp, ss = self.run(2.0, 3.0)
        assert bp.abs().sum() > 0 and bs.abs().sum() > 0
        assert torch.allclose(sp, 2.0 * bp, atol=1e-6) and torch.allclose(ss, 3.0 * bs, atol=1e-6)
        assert torch.allclose(scaled[0, 1:3], 2.0 * base[0, 1:3], atol=1e-6)
        assert torch.allclose(scaled[0, 5:8], 3.0 * base[0, 5:8], atol=1e-6)

    def test_zero_process_weight_silences_the_process_segment(self):
        adv, ap, as_ = self.run(0.0, 1.0)
        assert torch.equal(ap, torch.zeros(2))
        assert adv[0, 1:3].abs().sum().item() == 0.0 and adv[1, 0:2].abs().sum().item() == 0.0
        assert as_.abs().sum() > 0 and adv[0, 5:8].abs().sum() > 0


# --------------------------------------------------------------------------- part 2: a loop reference of the released code


def _close(got: torch.Tensor, want: list[list[float]]) -> bool:
    return torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_slca_paper_equals_the_released_loop_on_random_batches(seed):
    rng = random.Random(seed)
    for _ in range(600):
        index, mask, process, summary, total, no_call, kl = random_batch(rng)
        w_p, w_s = rng.choice([1.0, 1.0, 0.0, 2.0, 0.5]), rng.choice([1.0, 1.0, 3.0, 0.25])
        norm_by_std = rng.random() < 0.8
        want = ref_slca(mask, index, process, summary, total, no_call, kl, w_p, w_s, norm_by_std, 1e-6)
        got = slca_paper_advantages(
            torch.tensor(process), torch.tensor(summary), index, torch.tensor(mask), score_total=torch.tensor(total),
            should_no_call=torch.tensor(no_call), kl_rewards=torch.tensor(kl), lambda_tool=w_p, lambda_sum=w_s,
            scale="group" if norm_by_std else "none",
        )
        assert got.dtype == torch.float32 and got.shape == (len(mask), len(mask[0]))
        assert _close(got, want), (index, mask, process, summary, total, no_call)


@pytest.mark.parametrize("seed", range(2))
def test_toolpo_grpo_equals_the_released_loop_on_random_batches(seed):
    rng = random.Random(100 + seed)
    for _ in range(600):
        index, mask, _, _, total, _, kl = random_batch(rng)
        ratio = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in index]
        lam, norm_by_std = rng.choice([1.0, 0.5, 0.0, 2.0]), rng.random() < 0.8
        want = ref_toolpo(mask, index, total, ratio, kl, lam, norm_by_std, 1e-6)
        got = toolpo_grpo_advantages(torch.tensor(total), torch.tensor(ratio), index, torch.tensor(mask),
                                     kl_rewards=torch.tensor(kl), toolpo_lambda=lam, scale="group" if norm_by_std else "none")
        assert _close(got, want), (index, mask, total, ratio)


@pytest.mark.parametrize("seed", range(2))
def test_rltr_planner_equals_the_released_loop_on_random_batches(seed):
    rng = random.Random(200 + seed)
    for _ in range(600):
        index, mask, _, _, _, _, kl = random_batch(rng)
        comp = [rng.choice([0.0, 1.0, 2 / 3]) for _ in index]
        rep = [-0.1 * rng.randint(0, 3) for _ in index]
        err = [-0.2 * rng.randint(0, 2) for _ in index]
        valid = [float(rng.random() < 0.8) for _ in index]
        norm_by_std = rng.random() < 0.8
        want = ref_rltr(mask, index, comp, rep, err, valid, kl, norm_by_std, 1e-6)
        got = rltr_planner_advantages(torch.tensor(comp), torch.tensor(rep), torch.tensor(err), torch.tensor(valid), index,
                                      torch.tensor(mask), kl_rewards=torch.tensor(kl), scale="group" if norm_by_std else "none")
        assert _close(got, want), (index, mask, comp, rep, err, valid)


def test_toolpo_singleton_group_keeps_its_raw_score_as_verl_does():
    adv = toolpo_grpo_advantages(torch.tensor([0.7, 1.0, 0.0]), torch.zeros(3), ["a", "b", "b"], torch.ones(3, 2))
    assert torch.allclose(adv[0], torch.tensor(0.7 / (1 + 1e-6)))
    assert torch.allclose(adv[1:, 0], torch.tensor([PAIR_ZSCORE, -PAIR_ZSCORE]), atol=1e-5)


def test_rltr_summary_tokens_get_nothing():
    m = torch.tensor([[1, 0, 1], [1, 0, 1]])
    adv = rltr_planner_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2), torch.zeros(2), torch.ones(2), [0, 0], m)
    assert adv[:, 2].abs().sum() == 0 and adv[0, 0] > 0 > adv[1, 0]


# --------------------------------------------------------------------------- part 3: where slca's own SLCA differs, and the registry


def test_a_rollout_that_ends_on_a_call_differs_from_slca():
    """Stopped at max_turns: call, tool response, call, tool response. Positional: the last call is the summary;
    slca's environment boundary: both calls are tool tokens and the summary is empty."""
    m = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 0, 1, 0]])
    valid = torch.ones_like(m)
    tool, summ = slca.segment_masks(m, valid)
    p, s = positional_segments(m)
    assert summ.sum() == 0 and tool.sum() == 6
    assert s[:, 3].all() and p[:, :2].all()


def test_unknown_scale_and_unscored_rollouts():
    with pytest.raises(ValueError, match="batch scaling"):
        present_normalize(torch.ones(2), [0, 0], torch.ones(2, dtype=torch.bool), scale="batch")
    # a NaN (unscorable) score is left out and gets 0, not spread over its group
    adv = present_normalize(torch.tensor([1.0, float("nan"), 0.0]), [0, 0, 0], torch.ones(3, dtype=torch.bool))
    assert adv[1] == 0 and torch.allclose(adv[[0, 2]], torch.tensor([PAIR_ZSCORE, -PAIR_ZSCORE]), atol=1e-5)


def _inputs(**extra):
    m = TWO_SEGMENT_MASK
    p, s = positional_segments(m)
    return AdvantageInputs(torch.tensor([0.8, 0.4]), torch.tensor([0.9, 0.5]), ["g", "g"], m, p.float(), s.float(), extra=extra)


def test_registered_estimators_need_their_inputs_and_check_options():
    with pytest.raises(ValueError, match="should_no_call"):
        compute_advantages("slca_paper", _inputs())
    with pytest.raises(ValueError, match="toolpo_correct_ratio"):
        compute_advantages("toolpo_grpo", _inputs())
    with pytest.raises(ValueError, match="rltr_comp"):
        compute_advantages("rltr_planner", _inputs())
    with pytest.raises(ValueError, match="scale"):
        compute_advantages("slca_paper", _inputs(should_no_call=torch.zeros(2)), scale="batch")
    with pytest.raises(ValueError, match="no option 'toolpo_lambda'"):
        compute_advantages("slca_paper", _inputs(should_no_call=torch.zeros(2)), toolpo_lambda=1.0)


def test_registered_slca_paper_reads_the_weighted_total_unless_a_host_gives_score_total():
    base = compute_advantages("slca_paper", _inputs(should_no_call=torch.zeros(2)), lambda_tool=2.0)
    want = slca_paper_advantages(torch.tensor([0.8, 0.4]), torch.tensor([0.9, 0.5]), ["g", "g"], TWO_SEGMENT_MASK,
                                 score_total=torch.tensor([1.7, 0.9]), should_no_call=torch.zeros(2), lambda_tool=2.0)
    assert torch.equal(base, want)
    guarded = compute_advantages("slca_paper", _inputs(should_no_call=torch.zeros(2), score_total=torch.tensor([-0.5, 0.9])))
    assert guarded[0, 1] < 0 < guarded[1, 0]  # the negative total zeroed rollout 0's process score


def test_registered_baselines_equal_their_functions():
    r = torch.tensor([1.0, 0.0])
    toolpo = compute_advantages("toolpo_grpo", _inputs(toolpo_correct_ratio=r), toolpo_lambda=0.5)
    assert torch.equal(toolpo, toolpo_grpo_advantages(torch.tensor([1.7, 0.9]), r, ["g", "g"], TWO_SEGMENT_MASK, toolpo_lambda=0.5))
    z = torch.zeros(2)
    rltr = compute_advantages("rltr_planner", _inputs(rltr_comp=r, rltr_repeat_penalty=z, rltr_error_penalty=z,
                                                      rltr_format_valid=torch.ones(2)))
    assert torch.equal(rltr, rltr_planner_advantages(r, z, z, torch.ones(2), ["g", "g"], TWO_SEGMENT_MASK))
