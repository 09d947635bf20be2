#!/usr/bin/env bash
# The SLCA-GRPO authors' training recipe on slca's verl integration (verl 0.9.1, adv_estimator=slca,
# SLCA_ESTIMATOR=slca_paper: their compute_slca_grpo_advantage). The values are those of
# SLCA-GRPO/SLCA-GRPO@68539c5 rl/slca_grpo/train_slca_grpo.sh (its overrides win) over
# rl/slca_grpo/config/toucan_grpo.yaml; docs/released.md (appendix A) has the line of each. Their run:
# 4 nodes x 8 GPUs, Qwen2.5-7B-Instruct after their split SFT. Run on the head node after
# `ray start` on every node, with SLCA_ESTIMATOR / SLCA_ESTIMATOR_OPTIONS set where Ray starts
# (docs/integrations.md). Extra arguments are appended as verl overrides (the last value wins).
#
# Needs: pip install 'slca[verl]' "verl[vllm]==0.9.1" on every node (verl 0.9.1's vllm extra pins
# vllm==0.24.0; with TRL in the same environment keep "vllm>=0.22,<0.32", what TRL 1.16 supports).
#
# Not theirs, by design or for want of a setting (each is in docs/released.md):
# * data: slca's prepared rows (examples/verl/prepare_data.py; toolworld by default, DATA=folder for
#   another prepared set); their RL parquet is not all readable by slca (tests/test_loaders_release.py);
# * reward: slca.integrations.verl.compute_score (slca's execution and summary tiers), not their HierR
#   (format/name/key/value/parallel + a GPT-OSS-120B judge);
# * tools: slca's SLCASimulatedTool per row's tools (agent_loop.yaml), not their LLM simulator (SGLS,
#   Qwen3-235B-A22B, temperature 0.6) behind one wildcard tool; their verl patches
#   (multi_turn.disable_tool_schema_injection, wildcard_tool_name) do not exist in verl 0.9.1;
# slca_paper needs `should_no_call` per rollout from verl's reward_extra_info (compute_score writes
# it), which verl 0.9.1's compute_advantage passes to an estimator named gdpo only; the estimator
# reads it from the batch compute_advantage holds (docs/integrations.md, "The rest of the batch").
set -euo pipefail
MODEL=${MODEL:-./outputs/sft_split/qwen2_5_7b_toucan_toolcall}
NNODES=${NNODES:-4}
DATA=${DATA:-data/toolworld}
EXP=${EXP:-paper-recipe-slca_paper}
HERE=$(cd "$(dirname "$0")" && pwd)
# their SLCA_WEIGHT_PROCESS / SLCA_WEIGHT_RESPQ (1.0 / 1.0), applied after normalisation
export SLCA_ESTIMATOR="${SLCA_ESTIMATOR:-slca_paper}"
export SLCA_ESTIMATOR_OPTIONS="${SLCA_ESTIMATOR_OPTIONS:-lambda_tool=1.0,lambda_sum=1.0}"

[ -f "$DATA/train.parquet" ] || python "$HERE/prepare_data.py" --out "$DATA"

# G=16 rollouts per prompt, 128 prompts per step, 4 updates of 32 prompts each, lr 1e-6, KL loss
# 0.001 low_var_kl, token-mean loss, 24576/8192 prompt/response tokens, 5 epochs.
python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=slca \
  algorithm.use_kl_in_reward=False \
  algorithm.norm_adv_by_std_in_grpo=True \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=128 \
  data.max_prompt_length=24576 \
  data.max_response_length=8192 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.return_raw_chat=True \
  data.train_max_samples=-1 \
  data.val_max_samples=0 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.trust_remote_code=True \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.policy_loss.loss_mode=vanilla \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.clip_ratio=0.2 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.82 \
  actor_rollout_ref.rollout.prompt_length=24576 \
  actor_rollout_ref.rollout.response_length=8192 \
  actor_rollout_ref.rollout.max_model_len=32768 \
  actor_rollout_ref.rollout.max_num_seqs=32 \
  actor_rollout_ref.rollout.enable_prefix_caching=True \
  actor_rollout_ref.rollout.enable_chunked_prefill=True \
  actor_rollout_ref.rollout.enforce_eager=True \
  actor_rollout_ref.rollout.free_cache_engine=True \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128 \
  actor_rollout_ref.rollout.val_kwargs.n=1 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=False \
  actor_rollout_ref.rollout.multi_turn.enable=True \
  actor_rollout_ref.rollout.multi_turn.format=hermes \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=10 \
  actor_rollout_ref.rollout.multi_turn.max_user_turns=6 \
  actor_rollout_ref.rollout.multi_turn.max_parallel_calls=20 \
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length=2048 \
  actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=middle \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$DATA/tool_config.yaml" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=slca_tool_agent \
  actor_rollout_ref.rollout.agent.num_workers=32 \
  reward.custom_reward_function.path=pkg://slca.integrations.verl \
  reward.custom_reward_function.name=compute_score \
  trainer.use_v1=True \
  trainer.nnodes="$NNODES" \
  trainer.n_gpus_per_node=8 \
  trainer.total_epochs=5 \
  trainer.test_freq=10 \
  trainer.save_freq=10 \
  trainer.val_before_train=True \
  trainer.max_actor_ckpt_to_keep=8 \
  trainer.max_critic_ckpt_to_keep=8 \
  trainer.resume_mode=auto \
  trainer.logger='[console,tensorboard]' \
  trainer.project_name=slca \
  trainer.experiment_name="$EXP" \
  "$@"
