"""Input checks shared by the tensor functions (slca._checks): shapes, masks and group ids, every failure naming
the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index


def test_as_2d_accepts_tensors_and_nested_lists():
    t = torch.zeros(2, 3)
    assert as_2d("x", t) is t
    assert as_2d("x", [[1, 0], [0, 1]]).shape == (2, 2)
    assert as_2d("x", []).shape == (0, 0)  # no rows, so no columns either
    assert as_2d("x", torch.zeros(3, 0)).shape == (3, 0)  # an empty response is a valid shape
    assert as_2d("x", torch.zeros(0, 4)).shape == (0, 4)


@pytest.mark.parametrize("x,kw,msg", [
    (torch.zeros(3), {}, r"model_mask must be a \(B, T\) tensor, got shape \(3,\)"),
    (torch.zeros(1, 2, 3), {}, r"got shape \(1, 2, 3\)"),
    ([[1, 2], [3]], {}, r"model_mask must be a \(B, T\) tensor, got list"),
    ("ab", {}, r"model_mask must be a \(B, T\) tensor, got str"),
    (torch.zeros(0, 4), {"nonempty": True}, r"model_mask is an empty batch \(B=0\)"),
    ([], {"nonempty": True}, "empty batch"),
])
def test_as_2d_refuses_naming_the_argument(x, kw, msg):
    with pytest.raises(ValueError, match=msg):
        as_2d("model_mask", x, **kw)


def test_as_1d_gives_floats_of_the_expected_length():
    r = as_1d("rewards", [1, 0, 1])
    assert r.dtype == torch.float32 and r.tolist() == [1.0, 0.0, 1.0]
    assert as_1d("rewards", torch.tensor([1, 2]), 2).dtype == torch.float32  # integers become floats
    d = torch.tensor([0.5], dtype=torch.float64)
    assert as_1d("rewards", d) is d  # floating tensors are kept as they are
    assert as_1d("rewards", [], 0).shape == (0,)


@pytest.mark.parametrize("x,n,msg", [
    (torch.zeros(2, 2), None, r"rewards must be a \(B,\) tensor, got shape \(2, 2\)"),
    ([1.0, 2.0], 3, "rewards has length 2, expected 3 \\(one value per rollout\\)"),
    (["a", "b"], None, r"rewards must be a \(B,\) tensor of numbers, got list"),
])
def test_as_1d_refuses_naming_the_argument(x, n, msg):
    with pytest.raises(ValueError, match=msg):
        as_1d("rewards", x, n)


def test_check_mask_accepts_0_1_of_any_dtype_and_returns_bool():
    b = torch.tensor([True, False])
    assert check_mask("m", b) is b
    for m in (torch.tensor([[1, 0]]), torch.tensor([[1.0, 0.0]])):
        out = check_mask("m", m)
        assert out.dtype == torch.bool and out.tolist() == [[True, False]]


def test_check_mask_names_the_bad_values():
    with pytest.raises(ValueError, match=r"tool_mask must contain only 0 and 1, found \[2\]"):
        check_mask("tool_mask", torch.tensor([0, 1, 2, 2]))
    with pytest.raises(ValueError, match=r"found \[-1.0, 0.5\]"):
        check_mask("tool_mask", torch.tensor([0.5, -1.0, 1.0]))
    with pytest.raises(ValueError, match="tool_mask must contain only 0 and 1, found NaN"):
        check_mask("tool_mask", torch.tensor([1.0, float("nan")]))


def test_check_same_shape_names_both_arguments():
    check_same_shape(a=torch.zeros(2, 3), b=torch.ones(2, 3), c=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"summary_mask has shape \(2, 4\), expected \(2, 3\) \(the shape of tool_mask\)"):
        check_same_shape(tool_mask=torch.zeros(2, 3), model_mask=torch.zeros(2, 3), summary_mask=torch.zeros(2, 4))


def test_group_index_maps_any_ids_to_dense_indices():
    idx, g = group_index(["q7", "q2", "q7", "q9"], 4)  # in order of first appearance
    assert idx.tolist() == [0, 1, 0, 2] and g == 3 and idx.dtype == torch.long
    idx, g = group_index(torch.tensor([5, 3, 5]), 3)  # a tensor: sorted ids
    assert idx.tolist() == [1, 0, 1] and g == 2
    idx, g = group_index(np.array(["a", "b", "a"], dtype=object), 3)  # verl's string uids
    assert idx.tolist() == [0, 1, 0] and g == 2
    assert group_index((1, 1), 2)[1] == 1
    idx, g = group_index([], 0)
    assert idx.tolist() == [] and g == 0


@pytest.mark.parametrize("ids,msg", [
    (torch.zeros(2, 2, dtype=torch.long), r"group_ids must be 1-D, got shape \(2, 2\)"),
    (torch.tensor([0.0, 1.0]), "group_ids as a tensor must be integer, got torch.float32"),
    (torch.tensor([True, False]), "must be integer, got torch.bool"),
    (torch.tensor([0, 0, 1]), r"group_ids has length 3, expected 2 \(one id per rollout\)"),
    ([0], "group_ids has length 1, expected 2"),
    ("ab", "group_ids must be a 1-D tensor or a sequence of ids, got str"),
    (7, "got int"),
    ([[0], [1]], "group_ids must be hashable, got list"),
])
def test_group_index_refuses_naming_the_problem(ids, msg):
    with pytest.raises(ValueError, match=msg):
        group_index(ids, 2)
