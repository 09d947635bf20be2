"""The SLCA-GRPO authors' training recipe as TRL settings: an ``SLCAGRPOConfig`` with ``advantage_estimator="slca_paper"``.

Source: ``SLCA-GRPO/SLCA-GRPO`` at commit 68539c5, ``rl/slca_grpo/train_slca_grpo.sh`` (its verl
overrides win) over ``rl/slca_grpo/config/toucan_grpo.yaml`` and verl 0.7.0.dev's defaults for what
neither sets; docs/released.md (appendix A) gives the file and line of every value. The verl version of the
same recipe, on slca's verl integration, is ``examples/verl/run_paper_recipe.sh``.

Their run: 4 nodes x 8 GPUs (32 processes), actor and vLLM rollout colocated. Run this file as
``examples/trl/train_slca_trl.py`` is run (it calls that example's ``main`` with these settings first
and your flags after them; the last value of a flag wins). TRL 1.16 supports vLLM 0.22-0.31 only::

    pip install 'slca[trl]' "vllm>=0.22,<0.32"
    accelerate launch --num_machines 4 --num_processes 32 --machine_rank $RANK --main_process_ip $HEAD \\
        examples/trl/paper_recipe.py --model ./outputs/sft_split/qwen2_5_7b_toucan_toolcall --output_dir runs/paper

On fewer processes pass ``--num_processes N``: ``gradient_accumulation_steps`` is recomputed so that
one optimizer step still sees 512 completions (32 prompts x 16); ``--gradient_accumulation_steps``
after it overrides that. A quick CPU check of the wiring (no vLLM, tiny batches)::

    python examples/trl/paper_recipe.py --num_processes 1 --model default --output_dir runs/paper-cpu --use_cpu \\
        --bf16 false --use_vllm false --max_steps 1 --generation_batch_size 16 --gradient_accumulation_steps 1 \\
        --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 64 --report_to none

What is not the same (no TRL setting for it), each said again next to its value below:
the data (toolworld tasks here; their RL parquet's rows are not all readable by slca:
tests/test_loaders_release.py), the reward (slca's two tiers; their HierR with a GPT-OSS-120B judge is
``reward=paper`` in ``slca train``), the tool simulator (slca's schema simulator; theirs an LLM, SGLS),
prompt-length filtering, per-turn tool-response truncation, the parallel-call cap, verl's dual-clip
constant and its ``low_var_kl`` clamp.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

from slca.integrations.trl import SLCAGRPOConfig

PROMPTS_PER_STEP = 128      # data.train_batch_size=128 (train_slca_grpo.sh): prompts per rollout step
GROUP_SIZE = 16             # actor_rollout_ref.rollout.n=16: G, completions per prompt
PROMPTS_PER_UPDATE = 32     # actor.ppo_mini_batch_size=32 (prompts): 4 optimizer steps per rollout step
MICRO_BATCH = 1             # actor.ppo_micro_batch_size_per_gpu=1
THEIR_PROCESSES = 32        # trainer.nnodes=4 x trainer.n_gpus_per_node=8


def paper_recipe(num_processes: int = THEIR_PROCESSES) -> dict[str, Any]:
    """The recipe as ``SLCAGRPOConfig`` keyword arguments, for ``num_processes`` training processes."""
    per_update = PROMPTS_PER_UPDATE * GROUP_SIZE  # 512 completions per optimizer step
    if per_update % (MICRO_BATCH * num_processes):
        raise ValueError(f"{per_update} completions per optimizer step do not split over {num_processes} processes")
    return {
        # --- the estimator: their compute_slca_grpo_advantage (algorithm.adv_estimator=slca_grpo)
        "advantage_estimator": "slca_paper",
        # SLCA_WEIGHT_PROCESS / SLCA_WEIGHT_RESPQ (both 1.0), applied after normalisation
        "estimator_options": {"lambda_tool": 1.0, "lambda_sum": 1.0},
        "scale_rewards": "group",          # verl: algorithm.norm_adv_by_std_in_grpo=true
        "advantage_eps": 1e-6,             # verl: the estimator's epsilon=1e-6 (TRL's default is 1e-4)
        # --- groups and batches (TRL counts completions; verl counts prompts)
        "num_generations": GROUP_SIZE,     # verl: actor_rollout_ref.rollout.n
        "generation_batch_size": PROMPTS_PER_STEP * GROUP_SIZE,  # verl: data.train_batch_size (128 prompts) x n
        "per_device_train_batch_size": MICRO_BATCH,  # verl: actor.ppo_micro_batch_size_per_gpu
        # verl: actor.ppo_mini_batch_size=32 prompts = 512 completions per optimizer step
        "gradient_accumulation_steps": per_update // (MICRO_BATCH * num_processes),
        "num_iterations": 1,               # verl: actor.ppo_epochs=1 (verl's default)
        "num_train_epochs": 5,             # verl: trainer.total_epochs=5
        "shuffle_dataset": True,           # verl: data.shuffle=true (verl's default)
        # --- optimiser (verl's defaults where the recipe sets nothing)
        "learning_rate": 1e-6,             # verl: actor.optim.lr
        "weight_decay": 0.01,              # verl: actor.optim.weight_decay=0.01 (default; TRL's is 0.0)
        "lr_scheduler_type": "constant",   # verl: constant LR, no warmup (lr_warmup_steps=-1, ratio 0.0)
        "max_grad_norm": 1.0,              # verl: actor.grad_clip=1.0
        # verl: model.enable_gradient_checkpointing=true -- GRPOConfig's gradient_checkpointing defaults to True
        "bf16": True,                      # verl FSDP trains in bf16 mixed precision
        # --- loss
        "loss_type": "dapo",               # verl: actor.loss_agg_mode=token-mean (over all tokens of the mini-batch)
        "epsilon": 0.2,                    # verl: actor.clip_ratio=0.2 (policy_loss.loss_mode=vanilla; no TRL dual clip, verl's clip_ratio_c=3.0)
        "beta": 0.001,                     # verl: actor.use_kl_loss=true, kl_loss_coef=0.001 (TRL's k3 = low_var_kl without its [-10, 10] clamp)
        # --- generation
        "max_completion_length": 8192,     # verl: data.max_response_length (the whole multi-turn response)
        # no max_prompt_length in TRL 1.16: verl's data.max_prompt_length=24576 with filter_overlong_prompts=true
        # drops longer prompts; filter the dataset first (slca.env.loaders.fit_prompts)
        "temperature": 1.0,                # verl: rollout.temperature (default 1.0)
        "top_p": 1.0,                      # verl: rollout.top_p (default 1.0)
        "max_tool_calling_iterations": 10,  # verl: multi_turn.max_assistant_turns=10 (max_user_turns=6, max_parallel_calls=20,
        # max_tool_response_length=2048 with middle truncation: no TRL setting)
        # --- vLLM, colocated as verl's hybrid engine (pin: "vllm>=0.22,<0.32", what TRL 1.16 supports)
        "use_vllm": True,                  # verl: rollout.name=vllm, mode=async
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.82,  # verl: rollout.gpu_memory_utilization
        "vllm_tensor_parallel_size": 1,    # verl: rollout.tensor_model_parallel_size
        "vllm_max_model_length": 32768,    # verl: rollout.max_model_len (max_num_seqs=32, enforce_eager, prefix caching: no TRL setting)
        "vllm_enable_sleep_mode": True,    # verl: rollout.free_cache_engine=true
        "vllm_importance_sampling_correction": False,  # verl 0.7.0.dev applies no rollout importance correction by default
        # --- evaluation and checkpoints: one verl step = 4 TRL optimizer steps (128 / 32 prompts)
        "eval_strategy": "steps",
        "eval_steps": 10 * PROMPTS_PER_STEP // PROMPTS_PER_UPDATE,  # verl: trainer.test_freq=10
        "eval_on_start": True,             # verl: trainer.val_before_train=true
        "num_generations_eval": 1,         # verl: rollout.val_kwargs.n=1 (do_sample=false: greedy; TRL samples at `temperature`)
        "save_steps": 10 * PROMPTS_PER_STEP // PROMPTS_PER_UPDATE,  # verl: trainer.save_freq=10
        "save_total_limit": 8,             # verl: trainer.max_actor_ckpt_to_keep=8
        "report_to": "none",               # theirs: trainer.logger=["console","wandb"]; pass --report_to wandb
    }


def paper_config(output_dir: str, num_processes: int = THEIR_PROCESSES, **overrides: Any) -> SLCAGRPOConfig:
    """An ``SLCAGRPOConfig`` of the recipe (``overrides`` replace any value, e.g. ``use_cpu=True``)."""
    return SLCAGRPOConfig(output_dir=output_dir, **{**paper_recipe(num_processes), **overrides})


def recipe_flags(num_processes: int = THEIR_PROCESSES) -> list[str]:
    """The recipe as command-line flags for ``examples/trl/train_slca_trl.py`` (TRL's parser)."""
    flags = []
    for key, value in paper_recipe(num_processes).items():
        text = json.dumps(value) if isinstance(value, dict) else str(value).lower() if isinstance(value, bool) else str(value)
        flags += [f"--{key}", text]
    return flags


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    n = THEIR_PROCESSES
    if "--num_processes" in argv:
        i = argv.index("--num_processes")
        n = int(argv[i + 1])
        del argv[i : i + 2]
    example = runpy.run_path(str(Path(__file__).with_name("train_slca_trl.py")))
    no_eval = ["--eval_strategy", "no", "--eval_on_start", "false"]  # that example passes TRL no eval split
    return example["main"](recipe_flags(n) + no_eval + argv)


if __name__ == "__main__":
    main()
