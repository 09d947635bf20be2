"""examples/trl/paper_recipe.py: the SLCA-GRPO authors' recipe as an ``SLCAGRPOConfig`` (integrations/trl.py).

The values are those of their ``rl/slca_grpo/train_slca_grpo.sh`` at commit 68539c5
(docs/released.md), mapped to TRL's names; this checks the config object TRL builds from them.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytest.importorskip("trl")

import slca  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "trl" / "paper_recipe.py"


@pytest.fixture(scope="module")
def recipe():
    return runpy.run_path(str(RECIPE))


def test_the_recipe_config_builds_with_their_settings(recipe, tmp_path):
    if "slca_paper" not in slca.list_estimators():
        pytest.skip("slca_paper is not registered yet (src/slca/core/paper.py)")
    c = recipe["paper_config"](str(tmp_path), use_cpu=True)  # bf16 needs a GPU unless use_cpu; nothing else changes
    assert c.advantage_estimator == "slca_paper" and c.estimator_options == {"lambda_tool": 1.0, "lambda_sum": 1.0}
    assert (c.scale_rewards, c.advantage_eps) == ("group", 1e-6)
    # G = 16; 128 prompts per rollout step; 32 prompts (512 completions) per optimizer step over 32 processes
    assert (c.num_generations, c.generation_batch_size, c.per_device_train_batch_size) == (16, 128 * 16, 1)
    assert c.gradient_accumulation_steps * c.per_device_train_batch_size * 32 == 32 * 16
    assert (c.num_iterations, c.num_train_epochs) == (1, 5)
    assert (c.learning_rate, c.weight_decay, str(c.lr_scheduler_type.value), c.max_grad_norm) == (1e-6, 0.01, "constant", 1.0)
    assert (c.loss_type, c.epsilon, c.beta) == ("dapo", 0.2, 0.001)
    assert (c.max_completion_length, c.temperature, c.top_p, c.max_tool_calling_iterations) == (8192, 1.0, 1.0, 10)
    assert (c.use_vllm, c.vllm_mode, c.vllm_gpu_memory_utilization, c.vllm_tensor_parallel_size) == (True, "colocate", 0.82, 1)
    assert (c.vllm_max_model_length, c.vllm_enable_sleep_mode, c.vllm_importance_sampling_correction) == (32768, True, False)
    assert (c.eval_steps, c.save_steps, c.save_total_limit, c.eval_on_start, c.num_generations_eval) == (40, 40, 8, True, 1)
    assert c.gradient_checkpointing and c.bf16


def test_fewer_processes_keep_512_completions_per_optimizer_step(recipe, tmp_path):
    for n in (1, 8, 16):
        assert recipe["paper_recipe"](n)["gradient_accumulation_steps"] * n == 512
    with pytest.raises(ValueError, match="do not split over 3 processes"):
        recipe["paper_recipe"](3)


def test_the_recipe_flags_parse_back_to_the_same_config(recipe, tmp_path):
    """What main() hands examples/trl/train_slca_trl.py goes through TRL's own parser to the same values."""
    if "slca_paper" not in slca.list_estimators():
        pytest.skip("slca_paper is not registered yet (src/slca/core/paper.py)")
    from trl import TrlParser

    from slca.integrations.trl import SLCAGRPOConfig

    flags = recipe["recipe_flags"]() + ["--output_dir", str(tmp_path), "--use_cpu", "true"]
    (parsed,) = TrlParser((SLCAGRPOConfig,)).parse_args_and_config(args=flags)
    built = recipe["paper_config"](str(tmp_path), use_cpu=True)
    for key in recipe["paper_recipe"]():
        got, want = getattr(parsed, key), getattr(built, key)
        assert got == want, (key, got, want)


def test_vllm_is_pinned_to_what_trl_1_16_supports():
    """The recipe's install line pins vLLM to the range TRL 1.16 itself accepts (its is_vllm_available warns outside it)."""
    import importlib
    import inspect

    assert 'pip install \'slca[trl]\' "vllm>=0.22,<0.32"' in RECIPE.read_text()
    src = inspect.getsource(importlib.import_module("trl.import_utils").is_vllm_available)
    assert 'Version("0.22.0") <= _vllm_base_version <= Version("0.31.0")' in src
