import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca import environment_mask, segment_masks


def _ref_segments(model, valid=None):
    """Slow per-row loop reference of the segment contract."""
    B, T = len(model), len(model[0])
    tool = [[0] * T for _ in range(B)]
    summ = [[0] * T for _ in range(B)]
    for b in range(B):
        if valid is None:
            last_model = max([t for t in range(T) if model[b][t]], default=-1)
            v = [1 if t <= last_model else 0 for t in range(T)]
        else:
            v = valid[b]
        env = [t for t in range(T) if v[t] and not model[b][t]]
        boundary = env[-1] if env else -1
        for t in range(T):
            if model[b][t]:
                (tool if t < boundary else summ)[b][t] = 1
    return tool, summ


def test_hand_case_two_turns_and_padding():
    # call(2) env(2) call(1) env(1) answer(2) pad(2)
    m = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 0, 0]])
    tool, summ = segment_masks(m)
    assert tool.tolist() == [[1, 1, 0, 0, 1, 0, 0, 0, 0, 0]]
    assert summ.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1, 0, 0]]
    assert environment_mask(m).tolist() == [[0, 0, 1, 1, 0, 1, 0, 0, 0, 0]]


def test_no_environment_token_is_all_summary():
    m = torch.tensor([[1, 1, 1, 0, 0]])
    tool, summ = segment_masks(m)
    assert tool.sum() == 0
    assert summ.tolist() == [[1, 1, 1, 0, 0]]


def test_valid_mask_tells_env_from_padding():
    # the rollout stopped right after a tool response (max turns): trailing env tokens
    m = torch.tensor([[1, 1, 0, 0, 0]])
    v = torch.tensor([[1, 1, 1, 1, 0]])
    tool, summ = segment_masks(m, v)
    assert tool.tolist() == [[1, 1, 0, 0, 0]] and summ.sum() == 0
    # without valid_mask the trailing zeros are padding: all summary
    tool2, summ2 = segment_masks(m)
    assert tool2.sum() == 0 and summ2.tolist() == [[1, 1, 0, 0, 0]]


def test_dtype_is_preserved():
    for dt in (torch.bool, torch.int64, torch.float32):
        tool, summ = segment_masks(torch.tensor([[1, 0, 1]], dtype=dt))
        assert tool.dtype == dt and summ.dtype == dt


masks = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 12).flatmap(
        lambda T: st.lists(st.lists(st.integers(0, 1), min_size=T, max_size=T), min_size=B, max_size=B)
    )
)


@settings(max_examples=200, deadline=None)
@given(masks)
def test_matches_loop_reference_and_partitions_policy_tokens(m):
    t = torch.tensor(m)
    tool, summ = segment_masks(t)
    rt, rs = _ref_segments(m)
    assert tool.tolist() == rt and summ.tolist() == rs
    assert torch.equal(tool + summ, t)
    assert not (tool.bool() & summ.bool()).any()


@settings(max_examples=100, deadline=None)
@given(masks, st.data())
def test_with_valid_mask_matches_reference(m, data):
    t = torch.tensor(m)
    # valid >= model, anything else drawn
    extra = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 1), min_size=t.shape[1], max_size=t.shape[1]), min_size=t.shape[0], max_size=t.shape[0])))
    v = (t.bool() | extra.bool()).long()
    tool, summ = segment_masks(t, v)
    rt, rs = _ref_segments(m, v.tolist())
    assert tool.tolist() == rt and summ.tolist() == rs


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.tensor([1, 0, 1]),), "model_mask must be a \\(B, T\\)"),
        ((torch.tensor([[1, 2, 0]]),), "model_mask must contain only 0 and 1"),
        ((torch.tensor([[1, 0]]), torch.tensor([[1, 1, 1]])), "valid_mask has shape"),
        ((torch.tensor([[1, 0]]), torch.tensor([[0, 1]])), "policy tokens must be valid"),
        ((torch.tensor([[1.0, float("nan")]]),), "NaN"),
    ],
)
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        segment_masks(*args)


@pytest.mark.parametrize("B, T", [(0, 3), (0, 0), (3, 0)])
@pytest.mark.parametrize("dt", [torch.bool, torch.int64, torch.float32])
@pytest.mark.parametrize("with_valid", [False, True])
def test_empty_batch_and_empty_responses_give_empty_masks(B, T, dt, with_valid):
    """B = 0 or T = 0 (a batch of no rollouts, or of zero response columns): empty masks of the same shape."""
    from slca import turn_index

    m = torch.zeros(B, T, dtype=dt)
    v = torch.zeros(B, T, dtype=dt) if with_valid else None
    tool, summ = segment_masks(m, v)
    assert tool.shape == summ.shape == (B, T) and tool.dtype == summ.dtype == dt
    assert environment_mask(m, v).shape == (B, T)
    assert turn_index(m, v).shape == (B, T)
