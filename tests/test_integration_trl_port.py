"""TRL's own ``GRPOTrainer`` tests (trl 1.16, ``tests/test_grpo_trainer.py``) run against ``SLCAGRPOTrainer``.

Ported to local models and data because the hub is unreachable: TRL's
``trl-internal-testing/tiny-Qwen2ForCausalLM-2.5`` becomes a random tiny
``Qwen2ForCausalLM`` on the local Qwen-style tokenizer of ``tests/_tok.py``,
``tiny-Qwen2ForSequenceClassification-2.5`` a random tiny
``Qwen2ForSequenceClassification``, and the ``trl-internal-testing/zen``
prompts a few lines of the Zen of Python (standard and conversational). The
training arguments are TRL's, with fewer steps.

Each test keeps TRL's own assertions (a finite training loss, every parameter
moved) and runs with ``advantage_estimator="grpo"`` and ``"slca"``. On every
generation batch (train and eval) the trainer's advantages are checked in the
same run: with ``grpo`` against the advantages TRL computed itself for that
batch (:attr:`SLCAGRPOTrainer.trl_advantages`), with ``slca`` against the
segment-locked values recomputed here in numpy from the batch's rewards.

``test_reward_metric_reflects_reward_weights`` is TRL's, for both
``multi_objective_aggregation`` rules. The parity test runs one scripted batch
(tool calls, tool responses, None rewards) through TRL's ``GRPOTrainer`` and the
drop-in with ``grpo`` for every ``scale_rewards`` x ``multi_objective_aggregation``
x ``reward_weights``: the same advantage on every policy token.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from _tok import make_qwen_tokenizer, tiny_qwen2  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import Qwen2Config, Qwen2ForSequenceClassification  # noqa: E402

from slca.integrations.trl import SLCAGRPOConfig, SLCAGRPOTrainer  # noqa: E402

pytestmark = pytest.mark.slow

ZEN = [
    "Beautiful is better than", "Explicit is better than", "Simple is better than", "Complex is better than",
    "Flat is better than", "Sparse is better than", "Readability", "Special cases aren't special enough to",
    "Errors should never", "In the face of ambiguity,",
]
EPS = 1e-4


def zen(config_name: str, n: int = 6, offset: int = 0) -> Dataset:
    lines = ZEN[offset : offset + n]
    if config_name == "standard_prompt_only":
        return Dataset.from_list([{"prompt": p} for p in lines])
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is the next line: {p}"}]} for p in lines])


@pytest.fixture(scope="module")
def tok():
    t = make_qwen_tokenizer()
    t.padding_side = "left"
    return t


def policy(tok):
    m = tiny_qwen2(len(tok), hidden=32, layers=1).train()
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.pad_token_id
    return m


def reward_model(tok):
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    return Qwen2ForSequenceClassification(cfg).eval()


def group_norm(r: np.ndarray, G: int, scale: str = "group") -> np.ndarray:
    """(r - mean_group) / (std + eps) over the non-NaN members (unbiased std; the group's for "group", the
    batch's for "batch", none for "none"); 0 for NaN rows and groups with fewer than two valid members.
    Independent of slca."""
    out = np.zeros(len(r))
    ok_all = ~np.isnan(r)
    bstd = r[ok_all].std(ddof=1) if ok_all.sum() >= 2 else np.nan
    for s in range(0, len(r), G):
        g = r[s : s + G]
        ok = ~np.isnan(g)
        if ok.sum() >= 2:
            v = g[ok]
            std = {"group": v.std(ddof=1), "batch": bstd, "none": None}[scale]
            out[s : s + G][ok] = (v - v.mean()) / (std + EPS) if std is not None else v - v.mean()
    return out


class Checked(SLCAGRPOTrainer):
    """Records, per generation batch, what TRL computed and what slca put in its place."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        self.batches.append({
            "mode": mode, "G": self.num_generations if mode == "train" else self.num_generations_eval,
            "trl": self.trl_advantages.detach().clone(), "adv": out["advantages"].detach().clone(),
            "rewards": self._slca_rewards_per_func.detach().clone(), "mask": out["completion_mask"].clone(),
        })
        return out


def run(tok, estimator, *, dataset, reward_funcs, tiers, eval_dataset=None, reward_processing_classes=None,
        tmp_path, model=None, expect_update=True, **kw):
    args = dict(
        output_dir=str(tmp_path), learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
        max_completion_length=8, report_to="none", use_cpu=True, max_steps=2, save_strategy="no", seed=0,
        advantage_estimator=estimator, reward_tiers=tiers, dataloader_num_workers=0,
    )
    args.update(kw)
    trainer = Checked(model=model if model is not None else policy(tok), processing_class=tok, reward_funcs=reward_funcs, args=SLCAGRPOConfig(**args),
                      train_dataset=dataset, eval_dataset=eval_dataset, reward_processing_classes=reward_processing_classes)
    trainer.batches = []
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    # TRL's own assertions
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for n, p in before.items():
        if expect_update:
            assert not torch.equal(p, trainer.model.get_parameter(n)), f"Parameter {n} has not changed."
    check_batches(trainer, estimator, tiers)
    return trainer


def check_batches(trainer, estimator, tiers):
    assert trainer.batches and all(b["adv"].dim() == 2 for b in trainer.batches)
    w = trainer.reward_weights.numpy()
    for b in trainer.batches:
        mask = b["mask"].float()  # no tools here: every completion token is a policy token
        if estimator == "grpo":  # TRL's own advantages of this very batch
            torch.testing.assert_close(b["adv"], b["trl"].unsqueeze(1) * mask, atol=1e-5, rtol=1e-5)
            continue
        r = b["rewards"].numpy() * w
        tier = {t: np.array([k for k, x in enumerate(tiers) if x == t]) for t in ("tool", "summary")}

        def tier_sum(cols):
            s = np.nansum(r[:, cols], axis=1)
            return np.where(np.isnan(r[:, cols]).all(axis=1), np.nan, s)

        scale = trainer.scale_rewards
        a_sum = group_norm(tier_sum(tier["summary"]), b["G"], scale)
        if len(tier["tool"]):  # no call in any completion: empty_tool="both" sums both tiers
            expect = group_norm(tier_sum(tier["tool"]), b["G"], scale) + a_sum
        else:  # summary tier only: the summary advantage on every token (equals TRL's here)
            expect = a_sum
            torch.testing.assert_close(b["adv"], b["trl"].unsqueeze(1) * mask, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b["adv"], torch.tensor(expect, dtype=torch.float32).unsqueeze(1) * mask,
                                   atol=1e-5, rtol=1e-5)


ESTIMATORS = pytest.mark.parametrize("estimator", ["grpo", "slca"])


def len_reward(completions, **kwargs):
    """Reward function that rewards longer completions (TRL's reward_func1)."""
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def unique_reward(completions, **kwargs):
    """Reward function that rewards completions with more unique letters (TRL's reward_func2)."""
    return [float(len(set(c if isinstance(c, str) else c[0]["content"]))) for c in completions]


@ESTIMATORS
@pytest.mark.parametrize("config_name", ["standard_prompt_only", "conversational_prompt_only"])
def test_training(tok, tmp_path, estimator, config_name):
    run(tok, estimator, dataset=zen(config_name), reward_funcs=reward_model(tok), tiers=["summary"], tmp_path=tmp_path,
        reward_processing_classes=tok)


@ESTIMATORS
@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_training_loss_types(tok, tmp_path, estimator, loss_type):
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=len_reward, tiers=["summary"],
        tmp_path=tmp_path, max_completion_length=32, gradient_accumulation_steps=2, loss_type=loss_type, max_steps=1)


@ESTIMATORS
def test_training_with_eval_and_num_generations_eval(tok, tmp_path, estimator):
    """TRL's test_training_with_eval / _with_num_generations_eval: eval groups of one member get 0, as in TRL."""
    t = run(tok, estimator, dataset=zen("standard_prompt_only"), eval_dataset=zen("standard_prompt_only", 3, 6),
            reward_funcs=len_reward, tiers=["summary"], tmp_path=tmp_path, per_device_eval_batch_size=3,
            num_generations_eval=1, eval_strategy="steps", eval_steps=2, eval_on_start=True, loss_type="grpo")
    evals = [b for b in t.batches if b["mode"] == "eval"]
    assert evals and all(torch.all(b["adv"] == 0) for b in evals)


@ESTIMATORS
def test_training_multiple_iterations(tok, tmp_path, estimator):
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=len_reward, tiers=["summary"],
        tmp_path=tmp_path, num_iterations=2)


@ESTIMATORS
def test_training_reward_func_conversational(tok, tmp_path, estimator):
    run(tok, estimator, dataset=zen("conversational_prompt_only"), reward_funcs=len_reward, tiers=["summary"],
        tmp_path=tmp_path)


@ESTIMATORS
@pytest.mark.parametrize("tiers", [["tool", "summary"], ["summary", "summary"]])
def test_training_multiple_reward_funcs(tok, tmp_path, estimator, tiers):
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=[len_reward, unique_reward], tiers=tiers,
        tmp_path=tmp_path)


@ESTIMATORS
def test_training_sync_and_async_reward_funcs(tok, tmp_path, estimator):
    def ones(completions, **kwargs):
        return [1 for _ in completions]

    async def async_unique(completions, **kwargs):
        return [float(len(set(c))) for c in completions]

    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=[len_reward, ones, async_unique],
        tiers=["tool", "summary", "summary"], tmp_path=tmp_path)


@ESTIMATORS
def test_training_multiple_mixed_reward_funcs(tok, tmp_path, estimator):
    """A reward model and a function (TRL's test_training_multiple_mixed_reward_funcs)."""
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=[len_reward, reward_model(tok)],
        reward_processing_classes=[None, tok], tiers=["tool", "summary"], tmp_path=tmp_path)


@ESTIMATORS
def test_training_reward_weights(tok, tmp_path, estimator):
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=[len_reward, unique_reward],
        tiers=["tool", "summary"], tmp_path=tmp_path, reward_weights=[0.7, 0.3])


@ESTIMATORS
def test_training_multiple_reward_funcs_with_none_output(tok, tmp_path, estimator):
    """TRL's test: one function returns None on some rows (TRL sums the others), one on every row of a prompt."""

    def sometimes(completions, **kwargs):
        return [None if i % 2 else float(len(c)) for i, c in enumerate(completions)]

    def never_first(completions, **kwargs):
        return [None if i < 3 else float(len(set(c))) for i, c in enumerate(completions)]

    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=[sometimes, never_first],
        tiers=["tool", "summary"], tmp_path=tmp_path, per_device_train_batch_size=6)


@ESTIMATORS
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_training_scale_rewards(tok, tmp_path, estimator, scale_rewards):
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=[len_reward, unique_reward],
        tiers=["tool", "summary"], tmp_path=tmp_path, scale_rewards=scale_rewards, max_steps=1)


@ESTIMATORS
def test_training_beta_non_zero(tok, tmp_path, estimator):
    """With a KL term TRL builds its reference model from the model id: pass a saved model's folder, as TRL does."""
    path = tmp_path / "policy"
    policy(tok).save_pretrained(path)
    tok.save_pretrained(path)
    run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=len_reward, tiers=["summary"],
        tmp_path=tmp_path, model=str(path), beta=0.1)


@ESTIMATORS
def test_training_with_mask_truncated_completions(tok, tmp_path, estimator):
    """Truncated completions are masked out; the random tiny policy never ends within 4 tokens, so every
    completion is masked and there is nothing to learn (TRL's parameter check does not apply): every
    advantage must be 0, and the loss finite."""
    t = run(tok, estimator, dataset=zen("standard_prompt_only"), reward_funcs=len_reward, tiers=["summary"],
            tmp_path=tmp_path, mask_truncated_completions=True, max_completion_length=4, expect_update=False)
    assert all(torch.all(b["mask"] == 0) and torch.all(b["adv"] == 0) for b in t.batches)


@pytest.mark.parametrize("multi_objective_aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_reward_metric_reflects_reward_weights(tok, tmp_path, multi_objective_aggregation):
    """TRL's test (tests/test_grpo_trainer.py): the logged 'reward' is the weighted sum, with either aggregation.
    The rewards are constant, so every advantage is 0 and nothing moves (TRL checks only the metric)."""

    def constant_reward_1(completions, **kwargs):
        return [1.0] * len(completions)

    def constant_reward_0(completions, **kwargs):
        return [0.0] * len(completions)

    trainer = run(tok, "grpo", dataset=zen("standard_prompt_only"), reward_funcs=[constant_reward_1, constant_reward_0],
                  tiers=["tool", "summary"], tmp_path=tmp_path, reward_weights=[0.7, 0.3], max_steps=1,
                  multi_objective_aggregation=multi_objective_aggregation, expect_update=False)
    log = trainer.state.log_history[-1]
    assert abs(log["reward"] - 0.7) < 1e-5, f"Expected logged reward to be ~0.7 (weighted), got {log['reward']}."


# ----------------------------------------------------------------- parity: the drop-in's grpo is TRL's GRPO

@pytest.mark.parametrize("weights", [None, [0.7, 0.3, 2.0]])
@pytest.mark.parametrize("multi_objective_aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_grpo_advantages_equal_trls_for_every_option(tmp_path, scale_rewards, multi_objective_aggregation, weights):
    """One scripted batch (tool calls, tool responses, padding) through TRL's GRPOTrainer and the drop-in with
    advantage_estimator="grpo": the same advantage on every policy token, for each of TRL's scale_rewards x
    multi_objective_aggregation x reward_weights. The rewards have None rows (one function on some rows, another on
    a whole group, all functions on one row: unscorable)."""
    from test_integration_trl import base_args, build_policy, build_tokenizer, scripted_rollout_func
    from test_integration_trl import dataset as weather_dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = build_tokenizer()
    rollout_func, _, _ = scripted_rollout_func(tok)
    rng = np.random.default_rng(7)
    r1, r2, r3 = (rng.random(8).tolist() for _ in range(3))
    r2 = [None if i % 3 == 1 else x for i, x in enumerate(r2)]
    r3 = [None if i < 4 else x for i, x in enumerate(r3)]  # the whole first group
    r1[5] = r2[5] = r3[5] = None  # no function scored row 5

    def fixed(values, name):
        def f(completions, **kwargs):
            return list(values)

        f.__name__ = name
        return f

    funcs = [fixed(r1, "r1"), fixed(r2, "r2"), fixed(r3, "r3")]
    options = dict(scale_rewards=scale_rewards, multi_objective_aggregation=multi_objective_aggregation,
                   reward_weights=weights, shuffle_dataset=False)
    out = {}
    drop_in = {"advantage_estimator": "grpo", "reward_tiers": ["tool", "summary", "summary"]}
    for cls, cfg, extra in [(GRPOTrainer, GRPOConfig, {}), (SLCAGRPOTrainer, SLCAGRPOConfig, drop_in)]:
        t = cls(model=build_policy(tok), processing_class=tok, reward_funcs=funcs,
                args=base_args(tmp_path, cls=cfg, **options, **extra), train_dataset=weather_dataset(8),
                rollout_func=rollout_func)
        out[cls.__name__] = t._generate_and_score_completions([dict(x) for x in t.train_dataset])
    trl_out, slca_out = out["GRPOTrainer"], out["SLCAGRPOTrainer"]
    assert trl_out["advantages"].abs().sum() > 0 and (trl_out["tool_mask"] == 0).any()
    model_tok = (trl_out["completion_mask"] * trl_out["tool_mask"]).float()
    torch.testing.assert_close(slca_out["advantages"], trl_out["advantages"].unsqueeze(1) * model_tok,
                               atol=1e-5, rtol=1e-5)
