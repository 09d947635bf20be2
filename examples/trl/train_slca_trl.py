"""SLCA-GRPO with TRL's GRPOTrainer on slca's toolworld tasks.

Single GPU:   python examples/trl/train_slca_trl.py --model Qwen/Qwen2.5-0.5B-Instruct
Many GPUs:    accelerate launch --num_processes 8 examples/trl/train_slca_trl.py --model ... --use-vllm
(add --config_file with a DeepSpeed ZeRO-3 accelerate config for large models).

TRL runs its own tool loop on the toolworld tools (Python functions); the two
reward functions are the execution and summary tiers of slca.rewards.
"""

from __future__ import annotations

import argparse
import inspect

from datasets import Dataset

from slca.env.toolworld import FUNCTIONS, make_tasks
from slca.integrations.trl import SLCAGRPOConfig, SLCAGRPOTrainer, slca_reward_funcs


def as_trl_tool(name: str, fn):
    """A plain function with a Google-style docstring, as TRL's tool loop expects."""
    params = [p for p in inspect.signature(fn).parameters if p != "state"]
    state: dict = {}

    def tool(**kwargs):
        if "state" in inspect.signature(fn).parameters:
            return fn(**kwargs, state=state)
        return fn(**kwargs)

    tool.__name__ = name
    tool.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=str) for p in params]
    )
    tool.__doc__ = f"The {name} tool.\n\nArgs:\n" + "".join(f"    {p}: {p}.\n" for p in params)
    return tool


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--estimator", default="slca", help="slca | grpo | gdpo (slca's registry)")
    ap.add_argument("--use-vllm", action="store_true")
    ap.add_argument("--output-dir", default="runs/trl-slca")
    a = ap.parse_args()

    tasks = {t.id: t for t in make_tasks("train")}
    ds = Dataset.from_list([{"prompt": t.messages, "task_id": t.id} for t in tasks.values()])

    args = SLCAGRPOConfig(
        output_dir=a.output_dir, advantage_estimator=a.estimator, reward_tiers=["tool", "summary"],
        num_generations=8, per_device_train_batch_size=8, max_completion_length=1024,
        max_tool_calling_iterations=6, learning_rate=1e-6, beta=0.0, loss_type="dapo",
        use_vllm=a.use_vllm, vllm_mode="colocate", logging_steps=1, bf16=True,
    )
    trainer = SLCAGRPOTrainer(
        model=a.model, reward_funcs=slca_reward_funcs(tasks), args=args, train_dataset=ds,
        tools=[as_trl_tool(n, f) for n, f in FUNCTIONS.items()],
    )
    trainer.train()


if __name__ == "__main__":
    main()
