"""The released estimators (slca_paper, toolpo_grpo, rltr_planner) through verl's own registry.

``SLCA_ESTIMATOR=<name>`` with ``algorithm.adv_estimator=slca``: verl's ``get_adv_estimator_fn("slca")``
dispatches to slca's registry, the inputs come from ``non_tensor_batch`` (verl's reward_extra_info, as
:func:`slca.integrations.verl.compute_score` writes them), and the advantages must equal the loop
restatement of the released ``core_algos.py`` (tests/_released_reference.py) on random batches.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

pytestmark = pytest.mark.verl
torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from _released_reference import random_batch, ref_rltr, ref_slca, ref_toolpo  # noqa: E402
from slca.integrations import verl as sv  # noqa: E402


def _run(monkeypatch, name, mask, index, tool, summary, extra, *, norm_by_std=True, options=""):
    monkeypatch.setenv("SLCA_ESTIMATOR", name)
    monkeypatch.setenv("SLCA_ESTIMATOR_OPTIONS", options)
    if not options:
        monkeypatch.delenv("SLCA_ESTIMATOR_OPTIONS")
    m = torch.tensor(mask, dtype=torch.long)
    B, T = m.shape
    ntb = {"tool_reward": np.asarray(tool, dtype=np.float32), "summary_reward": np.asarray(summary, dtype=np.float32),
           **{k: np.asarray(v, dtype=np.float32) for k, v in extra.items()}}
    fn = core_algos.get_adv_estimator_fn("slca")
    adv, ret = fn(token_level_rewards=torch.zeros(B, T), response_mask=m, index=np.array(index, dtype=object),
                  norm_adv_by_std_in_grpo=norm_by_std, config=AlgoConfig(adv_estimator="slca", norm_adv_by_std_in_grpo=norm_by_std),
                  non_tensor_batch=ntb)
    assert torch.equal(adv, ret)
    return adv


def _close(got, want):
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), atol=2e-5, rtol=1e-5)


def test_slca_paper_through_verls_registry_equals_the_released_loop(monkeypatch):
    """The score verl logs is tool + summary (slca's weighted total with unit weights): the released code's
    ``score_total``; a no-call penalty lives in it as a negative total (the paper reward preset)."""
    rng = random.Random(7)
    for _ in range(150):
        index, mask, process, summary, _, no_call, _ = random_batch(rng)
        process = [p if rng.random() > 0.15 else -0.5 for p in process]  # the penalty path: a negative total
        total = [float(np.float32(p) + np.float32(s)) for p, s in zip(process, summary)]
        zeros = [[0.0] * len(mask[0]) for _ in mask]
        norm_by_std = rng.random() < 0.8
        want = ref_slca(mask, index, process, summary, total, no_call, zeros, 1.0, 1.0, norm_by_std, 1e-6)
        got = _run(monkeypatch, "slca_paper", mask, index, process, summary, {"should_no_call": no_call}, norm_by_std=norm_by_std)
        _close(got, want)


def test_slca_paper_weights_from_the_environment(monkeypatch):
    rng = random.Random(8)
    index, mask, process, summary, _, no_call, _ = random_batch(rng)
    total = [float(np.float32(p) + np.float32(s)) for p, s in zip(process, summary)]
    zeros = [[0.0] * len(mask[0]) for _ in mask]
    want = ref_slca(mask, index, process, summary, total, no_call, zeros, 2.0, 0.5, True, 1e-6)
    got = _run(monkeypatch, "slca_paper", mask, index, process, summary, {"should_no_call": no_call},
               options="lambda_tool=2.0,lambda_sum=0.5")
    _close(got, want)


def test_toolpo_and_rltr_through_verls_registry_equal_the_released_loop(monkeypatch):
    rng = random.Random(9)
    for _ in range(100):
        index, mask, process, summary, _, _, _ = random_batch(rng)
        zeros = [[0.0] * len(mask[0]) for _ in mask]
        total = [float(np.float32(p) + np.float32(s)) for p, s in zip(process, summary)]
        ratio = [rng.choice([0.0, 0.5, 1.0]) for _ in index]
        norm_by_std = rng.random() < 0.8
        got = _run(monkeypatch, "toolpo_grpo", mask, index, process, summary, {"toolpo_correct_ratio": ratio}, norm_by_std=norm_by_std)
        _close(got, ref_toolpo(mask, index, total, ratio, zeros, 1.0, norm_by_std, 1e-6))
        comp = [rng.choice([0.0, 1.0]) for _ in index]
        rep = [-0.1 * rng.randint(0, 2) for _ in index]
        err = [-0.2 * rng.randint(0, 2) for _ in index]
        valid = [float(rng.random() < 0.8) for _ in index]
        extra = {"rltr_comp": comp, "rltr_repeat_penalty": rep, "rltr_error_penalty": err, "rltr_format_valid": valid}
        got = _run(monkeypatch, "rltr_planner", mask, index, process, summary, extra, norm_by_std=norm_by_std)
        _close(got, ref_rltr(mask, index, comp, rep, err, valid, zeros, norm_by_std, 1e-6))


def test_missing_inputs_and_batch_scaling_are_refused_with_the_reason(monkeypatch):
    mask, index = [[1, 0, 1], [1, 0, 1]], ["u", "u"]
    with pytest.raises(ValueError, match=r"SLCA_ESTIMATOR='slca_paper' needs \['should_no_call'\]"):
        _run(monkeypatch, "slca_paper", mask, index, [1.0, 0.0], [0.0, 1.0], {})
    with pytest.raises(ValueError, match="lambda_sum"):
        _run(monkeypatch, "slca_paper", mask, index, [1.0, 0.0], [0.0, 1.0], {"should_no_call": [0, 0]}, options="lambda_sum=x")


def test_compute_score_writes_the_inputs_the_selected_estimator_needs(monkeypatch):
    """slca's verl reward function adds, under their own names, the per-rollout numbers the selected estimator
    needs (computed from the rollout as slca train computes them), so reward_extra_info carries them."""
    pytest.importorskip("slca.rewards.paper")
    from test_integration_verl import paper_row

    row = paper_row()
    good = ('<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n</tool_call>\nuser\n'
            '<tool_response>\n{"condition": "sunny", "temperature": 21}\n</tool_response>\nassistant\n'
            "It is sunny in Paris, 21 degrees.")
    silent_text = "I do not know the weather in Paris."
    for name, keys in (("slca_paper", {"should_no_call"}), ("toolpo_grpo", {"toolpo_correct_ratio"}),
                       ("rltr_planner", {"rltr_comp", "rltr_repeat_penalty", "rltr_error_penalty", "rltr_format_valid"})):
        monkeypatch.setenv("SLCA_ESTIMATOR", name)
        silent = sv.compute_score(row["data_source"], silent_text, row["ground_truth"], row["extra_info"])
        called = sv.compute_score(row["data_source"], good, row["ground_truth"], row["extra_info"])
        assert keys <= set(silent) and keys <= set(called), (name, sorted(silent))
        if name == "slca_paper":
            assert silent["should_no_call"] == 1.0 and called["should_no_call"] == 0.0
        if name == "toolpo_grpo":
            assert called["toolpo_correct_ratio"] == 1.0 and silent["toolpo_correct_ratio"] == 0.0
        if name == "rltr_planner":
            assert called["rltr_comp"] == 1.0 and silent["rltr_comp"] == 0.0
    monkeypatch.setenv("SLCA_ESTIMATOR", "slca")  # an estimator without such needs: nothing added
    assert not {"should_no_call", "toolpo_correct_ratio"} & set(sv.compute_score(row["data_source"], good, row["ground_truth"], row["extra_info"]))


def test_verls_own_compute_advantage_hands_the_released_estimators_their_inputs(monkeypatch):
    """verl 0.9.1's ``ray_trainer.compute_advantage`` (what ``main_ppo`` calls) passes ``non_tensor_batch`` to
    ``gdpo`` alone; the estimator reads the batch it holds (``batch_of_verl_caller``), so the released estimators run
    there with the inputs ``compute_score`` put in ``reward_extra_info``, and equal the released loop. Called by
    anything else without the inputs, they are still refused with the reason."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rng = random.Random(11)
    for _ in range(40):
        index, mask, process, summary, _, no_call, _ = random_batch(rng)
        m = torch.tensor(mask, dtype=torch.long)
        zeros = [[0.0] * len(mask[0]) for _ in mask]
        total = [float(np.float32(p) + np.float32(s)) for p, s in zip(process, summary)]
        ratio = [rng.choice([0.0, 0.5, 1.0]) for _ in index]
        comp = [rng.choice([0.0, 1.0]) for _ in index]
        rep, err = [-0.1 * rng.randint(0, 2) for _ in index], [-0.2 * rng.randint(0, 2) for _ in index]
        valid = [float(rng.random() < 0.8) for _ in index]
        extra = {"should_no_call": no_call, "toolpo_correct_ratio": ratio, "rltr_comp": comp, "rltr_repeat_penalty": rep,
                 "rltr_error_penalty": err, "rltr_format_valid": valid}
        ntb = {"uid": np.array(index, dtype=object), "tool_reward": np.asarray(process, dtype=np.float32),
               "summary_reward": np.asarray(summary, dtype=np.float32),
               **{k: np.asarray(v, dtype=np.float32) for k, v in extra.items()}}
        data = DataProto.from_dict(tensors={"token_level_rewards": torch.zeros(m.shape), "response_mask": m}, non_tensors=ntb)
        want = {
            "slca_paper": ref_slca(mask, index, process, summary, total, no_call, zeros, 1.0, 1.0, True, 1e-6),
            "toolpo_grpo": ref_toolpo(mask, index, total, ratio, zeros, 1.0, True, 1e-6),
            "rltr_planner": ref_rltr(mask, index, comp, rep, err, valid, zeros, True, 1e-6),
        }
        for name, expect in want.items():
            monkeypatch.setenv("SLCA_ESTIMATOR", name)
            got = compute_advantage(data, adv_estimator="slca", config=AlgoConfig(adv_estimator="slca")).batch["advantages"]
            _close(got, expect)
    # the same estimator called directly, without the inputs: refused, naming what is missing
    monkeypatch.setenv("SLCA_ESTIMATOR", "slca_paper")
    with pytest.raises(ValueError, match=r"needs \['should_no_call'\]"):
        core_algos.get_adv_estimator_fn("slca")(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3),
                                                 index=np.array(["u", "u"], dtype=object))


def test_only_verls_compute_advantage_is_read(monkeypatch):
    """A caller's local named ``data`` is read only when the caller is verl's own ``compute_advantage``."""
    from verl import DataProto

    monkeypatch.setenv("SLCA_ESTIMATOR", "slca_paper")
    m = torch.tensor([[1, 0, 1], [1, 0, 1]])
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.zeros(2, 3), "response_mask": m},  # noqa: F841
                               non_tensors={"uid": np.array(["u", "u"], dtype=object), "should_no_call": np.zeros(2)})

    def compute_advantage():  # a function of the same name, not verl's
        return sv.compute_slca_outcome_advantage(torch.zeros(2, 3), m, index=np.array(["u", "u"], dtype=object))

    with pytest.raises(ValueError, match=r"needs \['should_no_call'\]"):
        compute_advantage()
    import sys

    assert sv.batch_of_verl_caller(sys._getframe()) == (None, None, None)
