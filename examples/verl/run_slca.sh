#!/usr/bin/env bash
# SLCA-GRPO with verl 0.9.1 on N nodes x 8 GPUs (Ray). Run on the head node after
# `ray start` on every node (see docs/integrations.md). Needs: pip install 'slca[verl]'
# plus vllm (verl 0.9.1's vllm extra pins "vllm==0.24.0") or sglang on every node. Extra arguments are appended as verl overrides
# (the last value of a key wins); docs/integrations.md shows the CPU test command.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
NNODES=${NNODES:-2}
DATA=${DATA:-data/toolworld}
EXP=${EXP:-slca-toolworld}
TASKS=${TASKS:-}  # tasks per split (default: all); e.g. TASKS=2 for a quick try
HERE=$(cd "$(dirname "$0")" && pwd)

python "$HERE/prepare_data.py" --out "$DATA" ${TASKS:+--n "$TASKS"}

python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=slca \
  algorithm.use_kl_in_reward=False \
  algorithm.norm_adv_by_std_in_grpo=True \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=2048 \
  data.max_response_length=2048 \
  data.return_raw_chat=True \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.multi_turn.enable=True \
  actor_rollout_ref.rollout.multi_turn.format=hermes \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=6 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$DATA/tool_config.yaml" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=slca_tool_agent \
  reward.custom_reward_function.path=pkg://slca.integrations.verl \
  reward.custom_reward_function.name=compute_score \
  trainer.use_v1=True \
  trainer.nnodes="$NNODES" \
  trainer.n_gpus_per_node=8 \
  trainer.logger='[console,tensorboard]' \
  trainer.project_name=slca \
  trainer.experiment_name="$EXP" \
  trainer.total_epochs=1 \
  "$@"
