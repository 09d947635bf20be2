"""The paper's two-stage pipeline on any chat model: TRL's SFTTrainer, then SLCA-GRPO, then the in-domain eval.

1. Warm start: the ``sft_split`` (or ``sft_full``) rows, converted to TRL's
   ``{"messages", "tools"}`` (:func:`slca.env.load_sft_examples`), through TRL's
   ``SFTTrainer``: the model's own chat template writes the calls, so the model
   learns the markup the RL stage's tool loop parses.
2. RL: the ``rl`` rows as slca tasks (:func:`slca.env.load_tasks`, format
   ``paper``) through :class:`slca.integrations.trl.SLCAGRPOTrainer`, with TRL's
   tool loop against slca's schema-guided simulator, each prompt offered its own
   task's tools (:func:`slca.integrations.trl.simulator_environments`).
3. Eval: the ``eval`` rows with slca's in-domain evaluator (Name F1, ArgMatch,
   Process, Success; :func:`slca.eval.in_domain.run_in_domain`), written to
   ``<output_dir>/eval/``.

The data: ``--dataset DIR`` (a download of ``AnonymousRepository/toucan-toolcall-slca``,
its ``data/*.parquet`` as released), or ``--sft_data`` / ``--rl_data`` /
``--eval_data`` (any file or datasets folder the readers take). Nothing is fetched.
Every ``SLCAGRPOConfig`` option is a flag for the RL stage; ``--sft_*`` flags set the SFT stage.

CPU, the embedded model, the committed fixture rows (about a minute)::

    python examples/paper/two_stage.py --model default --dataset tests/fixtures/paper --output_dir runs/paper-cpu \\
        --use_cpu --bf16 false --report_to none --save_strategy no --sft_max_steps 2 --max_steps 1 \\
        --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 64 \\
        --max_tool_calling_iterations 2 --eval_max_new_tokens 48 --eval_max_turns 2 --eval_max_total_tokens 1024

One GPU, the released files unchanged (``huggingface-cli download AnonymousRepository/toucan-toolcall-slca
--repo-type dataset --local-dir data/toucan-toolcall-slca`` once, where there is network)::

    python examples/paper/two_stage.py --model Qwen/Qwen2.5-1.5B-Instruct --dataset data/toucan-toolcall-slca \\
        --output_dir runs/paper --bf16 true --sft_epochs 2 --max_steps 200 --per_device_train_batch_size 8 \\
        --num_generations 8 --max_completion_length 1024 --max_tool_calling_iterations 4 --report_to none
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from trl import SFTConfig, SFTTrainer, TrlParser

from slca.env import SchemaSimulator, load_sft_examples, load_tasks, sft_dataset
from slca.eval.agent import GenerationConfig, PolicyAgent
from slca.eval.in_domain import run_in_domain
from slca.integrations.trl import (
    SLCAGRPOConfig,
    SLCAGRPOTrainer,
    quiet_known_warnings,
    simulator_environments,
    slca_reward_funcs,
    tool_method_problem,
)
from slca.models.loading import load_policy

log = logging.getLogger("slca.paper")

# the release's file names (its dataset card's configs); --dataset DIR looks for them in DIR/data/, then DIR/
RELEASE = {
    "sft_split": "toucan_toolcall_sft_split_42k.parquet",
    "sft_full": "toucan_toolcall_sft_full_74k.parquet",
    "rl": "toucan_toolcall_rl.parquet",
    "eval": "toucan_eval_4k_unified.parquet",
}
FIXTURES = {"sft_split": "sft_split.jsonl", "sft_full": "sft_split.jsonl", "rl": "rl.jsonl", "eval": "eval.jsonl"}


@dataclass
class PaperArguments:
    model: str = field(default="default", metadata={"help": "'default', 'smollm2', a model folder or a hub id"})
    dataset: str | None = field(default=None, metadata={"help": "a download of the release (data/*.parquet), or a folder of "
                                                                 "sft_split.jsonl / rl.jsonl / eval.jsonl rows"})
    sft_data: str | None = field(default=None, metadata={"help": "SFT rows (ShareGPT or Toucan); overrides --dataset"})
    rl_data: str | None = field(default=None, metadata={"help": "rl rows; overrides --dataset"})
    eval_data: str | None = field(default=None, metadata={"help": "eval rows; overrides --dataset"})
    sft_config: str = field(default="sft_split", metadata={"help": "sft_split (the paper's main recipe) or sft_full"})
    skip_sft: bool = field(default=False, metadata={"help": "start RL from --model as it is"})
    sft_epochs: float = field(default=2.0, metadata={"help": "SFT epochs (the paper: 2 on sft_split)"})
    sft_max_steps: int = field(default=-1, metadata={"help": "SFT optimizer steps (> 0 overrides --sft_epochs)"})
    sft_learning_rate: float = field(default=1e-5, metadata={"help": "SFT learning rate"})
    sft_batch_size: int = field(default=2, metadata={"help": "SFT rows per device and step"})
    sft_max_length: int = field(default=4096, metadata={"help": "SFT rows are cut to this many tokens"})
    sft_assistant_only_loss: bool = field(default=False, metadata={"help": "SFT loss on assistant tokens only (TRL's option: "
                                                                           "needs a chat template with generation marks)"})
    reasoning: str = field(default="content", metadata={"help": "<think> blocks: content, field (reasoning_content) or drop"})
    errors: str = field(default="raise", metadata={"help": "a malformed row: raise, or skip (logged)"})
    n_sft: int | None = field(default=None, metadata={"help": "use only the first N SFT rows"})
    n_rl: int | None = field(default=None, metadata={"help": "use only the first N rl rows"})
    n_eval: int | None = field(default=None, metadata={"help": "evaluate only the first N eval rows"})
    eval_format: str = field(default="hermes", metadata={"help": "tool-call format the eval parses (what the chat template writes)"})
    eval_max_new_tokens: int = field(default=512, metadata={"help": "tokens per generated turn in the eval"})
    eval_max_turns: int = field(default=4, metadata={"help": "assistant turns per eval rollout"})
    eval_max_total_tokens: int = field(default=8192, metadata={"help": "tokens per eval rollout"})
    eval_batch_size: int = field(default=8, metadata={"help": "eval conversations generated together"})


def data_path(ex: PaperArguments, split: str) -> str:
    """The file of ``split`` (``sft_split`` / ``sft_full`` / ``rl`` / ``eval``): its flag, else found in ``--dataset``."""
    given = {"rl": ex.rl_data, "eval": ex.eval_data}.get(split, ex.sft_data)
    if given:
        return given
    if not ex.dataset:
        raise SystemExit(f"no {split} rows: pass --dataset DIR or --{'sft' if split.startswith('sft') else split}_data PATH")
    root = Path(ex.dataset)
    for p in (root / "data" / RELEASE[split], root / RELEASE[split], root / FIXTURES[split]):
        if p.exists():
            return str(p)
    raise SystemExit(f"--dataset {root}: no {RELEASE[split]} (in data/ or at the top) nor {FIXTURES[split]}")


def warm_start(ex: PaperArguments, args: SLCAGRPOConfig, model, tokenizer):
    """Stage 1: TRL's SFTTrainer on the SFT rows; returns the trained model."""
    rows = load_sft_examples(data_path(ex, ex.sft_config), reasoning=ex.reasoning, errors=ex.errors)[: ex.n_sft]
    sft_args = SFTConfig(
        output_dir=os.path.join(args.output_dir, "sft"), num_train_epochs=ex.sft_epochs, max_steps=ex.sft_max_steps,
        learning_rate=ex.sft_learning_rate, per_device_train_batch_size=ex.sft_batch_size, max_length=ex.sft_max_length,
        use_cpu=args.use_cpu, bf16=args.bf16, seed=args.seed, report_to=args.report_to, logging_steps=args.logging_steps,
        save_strategy="no", gradient_checkpointing=args.gradient_checkpointing, assistant_only_loss=ex.sft_assistant_only_loss,
    )
    trainer = SFTTrainer(model=model, args=sft_args, train_dataset=sft_dataset(rows), processing_class=tokenizer)
    trainer.train()
    log.info("SFT: %d rows, %d steps", len(rows), trainer.state.global_step)
    return trainer.model


def rl_tasks(ex: PaperArguments):
    """``{row key: Task}`` of the rl rows TRL's tool loop can offer (others are logged and left out)."""
    tasks = load_tasks(data_path(ex, "rl"), errors=ex.errors)[: ex.n_rl]
    keep, left = {}, []
    for i, t in enumerate(tasks):
        problems = [p for p in (tool_method_problem(s) for s in t.tools) if p]
        if problems:
            left.append(f"{t.id}: {problems[0]}")
        else:
            keep[f"{i}:{t.id}"] = t  # the position makes the key unique whatever the ids
    if left:
        log.warning("left out %d of %d rl rows whose tools TRL cannot offer, e.g. %s", len(left), len(tasks), left[0])
    if not keep:
        raise SystemExit("no rl row is left to train on")
    return keep


def reinforce(ex: PaperArguments, args: SLCAGRPOConfig, model, tokenizer):
    """Stage 2: SLCA-GRPO in TRL on the rl rows; returns the trained model."""
    from datasets import Dataset, Features, Json, List, Value

    tasks = rl_tasks(ex)
    make_env = lambda task: SchemaSimulator(task.tools, seed=args.seed)  # noqa: E731 - the paper's simulator stand-in
    factories, env_of = simulator_environments(tasks, make_env)
    rows = [{"prompt": t.messages, "task_id": k, "environment": env_of[k]} for k, t in tasks.items()]
    features = Features({"prompt": List(Json()), "task_id": Value("string"), "environment": Value("string")})
    if args.reward_tiers is None:
        args.reward_tiers = ["tool", "summary"]
    trainer = SLCAGRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=slca_reward_funcs(tasks), args=args,
        train_dataset=Dataset.from_list(rows, features=features), environment_factory=factories, tasks=tasks,
    )
    trainer.train()
    return trainer.model


def evaluate(ex: PaperArguments, args: SLCAGRPOConfig, model, tokenizer) -> dict:
    """Stage 3: the in-domain metrics on the eval rows, saved under ``<output_dir>/eval``."""
    tasks = load_tasks(data_path(ex, "eval"), errors=ex.errors)[: ex.n_eval]
    gen = GenerationConfig(max_new_tokens=ex.eval_max_new_tokens, batch_size=ex.eval_batch_size, seed=args.seed)
    agent = PolicyAgent(model.eval(), tokenizer, format=ex.eval_format, gen=gen)
    report = run_in_domain(agent, tasks, lambda t: SchemaSimulator(t.tools, seed=args.seed), suite="paper-eval",
                           max_turns=ex.eval_max_turns, max_total_tokens=ex.eval_max_total_tokens, progress=False,
                           model_label=ex.model, group_by="subset")
    report.save(os.path.join(args.output_dir, "eval"))
    return report.metrics


def main(argv: list[str] | None = None) -> dict:
    quiet_known_warnings()  # transformers' / TRL's notices that every run prints; the rest still show
    ex, args = TrlParser((PaperArguments, SLCAGRPOConfig)).parse_args_and_config(args=argv)
    if ex.sft_config not in ("sft_split", "sft_full"):
        raise SystemExit(f"--sft_config must be sft_split or sft_full, got {ex.sft_config!r}")
    model, tokenizer = load_policy(ex.model)
    if not ex.skip_sft:
        model = warm_start(ex, args, model, tokenizer)
    model = reinforce(ex, args, model, tokenizer)
    metrics = evaluate(ex, args, model, tokenizer)
    print(json.dumps({"eval": metrics}, indent=1))
    return metrics


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
