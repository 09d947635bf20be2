"""Conformance of slca's unified GRPO path with the real frameworks.

* verl: ``slca.grpo_advantages`` equals ``compute_grpo_outcome_advantage`` (verl
  0.9.1) on random inputs, groups of two or more (marked ``verl``: runs in the
  verl environment).
* TRL: ``slca.group_normalize`` with ``eps=1e-4`` equals the advantages TRL's
  ``GRPOTrainer`` computes itself (sum of weighted rewards, then group / batch /
  no scaling), unscorable rows included (runs in the main environment).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import slca


def _random_groups(seed: int):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 7, size=rng.integers(1, 8))  # groups of 2..6
    uids = np.array([f"u{g}" for g, n in enumerate(sizes) for _ in range(n)], dtype=object)
    rng.shuffle(uids)
    B, T = len(uids), int(rng.integers(1, 30))
    mask = torch.from_numpy(rng.random((B, T)) < 0.8).long()
    scores = torch.from_numpy(rng.normal(size=B).round(int(rng.integers(0, 3)))).float()  # ties: zero-std groups
    return uids, mask, scores


@pytest.mark.verl
@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_equals_verl_compute_grpo_outcome_advantage(seed, norm_by_std):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    uids, mask, scores = _random_groups(seed)
    T = mask.shape[1]
    token_rewards = torch.zeros(mask.shape)
    last = torch.randint(0, T, (len(uids),), generator=torch.Generator().manual_seed(seed))
    token_rewards[torch.arange(len(uids)), last] = scores  # verl sums token rewards per row
    expect, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_rewards, response_mask=mask, index=uids, epsilon=1e-6,
        norm_adv_by_std_in_grpo=norm_by_std,
    )
    got = slca.grpo_advantages(scores, list(uids), mask, scale="group" if norm_by_std else "none", eps=1e-6)
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_normalize_equals_trl_grpo_trainer(tmp_path, scale):
    pytest.importorskip("trl")
    from test_integration_trl import build_policy, build_tokenizer, dataset, scripted_rollout_func
    from trl import GRPOConfig, GRPOTrainer

    tok = build_tokenizer()
    rollout_func, _, _ = scripted_rollout_func(tok)
    B, G = 12, 4
    rng = np.random.default_rng(7)
    r1 = rng.random(B).round(1)
    r2 = rng.random(B).round(1)
    unscorable = 9  # no function scored row 9

    def f1(completions, **_):
        return [None if i == unscorable else float(v) for i, v in enumerate(r1)]

    def f2(completions, **_):  # does not score row 5 either
        return [None if i in (unscorable, 5) else float(v) for i, v in enumerate(r2)]

    weights = [1.0, 0.5]
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=B, num_generations=G, max_completion_length=96,
        report_to="none", use_cpu=True, scale_rewards=scale, reward_weights=weights, beta=0.0,
    )
    trainer = GRPOTrainer(model=build_policy(tok), processing_class=tok, reward_funcs=[f1, f2], args=args,
                          train_dataset=dataset(B), rollout_func=rollout_func)
    out = trainer._generate_and_score_completions([dict(x) for x in trainer.train_dataset])
    # TRL: weighted nansum over functions; a row no function scored is NaN (left out, advantage 0)
    total = np.nansum(np.stack([r1 * weights[0], np.where(np.arange(B) == 5, np.nan, r2) * weights[1]]), axis=0)
    total[unscorable] = np.nan
    expect = slca.group_normalize(torch.tensor(total, dtype=torch.float32), torch.arange(B) // G, scale=scale, eps=1e-4)
    torch.testing.assert_close(out["advantages"], expect, atol=1e-5, rtol=1e-5)


@pytest.mark.verl
@pytest.mark.parametrize("batch_size,seq_len,num_groups,seed", [(64, 128, 5, 0), (128, 256, 8, 1), (512, 512, 10, 2)])
def test_grpo_on_verls_own_test_inputs(batch_size, seq_len, num_groups, seed):
    """The inputs of verl's tests/trainer/ppo/test_core_algos_on_cpu.py::test_grpo_and_vectorized_equivalence
    (groups of two or more, random masks, random rewards on every valid token): slca's grpo equals verl's."""
    import random

    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from test_integration_verl import _verl_make_group_index, _verl_rand_mask

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    index = _verl_make_group_index(batch_size, num_groups, random)
    mask = _verl_rand_mask(batch_size, seq_len)
    token_level_rewards = torch.randn(batch_size, seq_len) * mask
    expect, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards=token_level_rewards, response_mask=mask,
                                                          index=index)
    got = slca.grpo_advantages(token_level_rewards.sum(-1), list(index), mask, eps=1e-6)
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)
