"""SLCA inside TRL's ``GRPOTrainer`` (tested with TRL 1.16; extra ``slca[trl]``).

TRL computes one trajectory-level advantage per completion inline in
``GRPOTrainer._generate_and_score_completions``. :class:`SLCAGRPOTrainer` keeps
TRL's whole pipeline (generation, its own tool loop or ``rollout_func``, vLLM,
accelerate / DeepSpeed, the loss) and replaces only ``out["advantages"]`` with a
``(B, T)`` tensor from slca's estimator registry:

1. ``_calculate_rewards`` (private) returns the reward matrix gathered over all
   processes, ``(B_global, n_funcs)``; the subclass keeps it.
2. Each reward function is declared an execution-tier ("tool") or summary-tier
   ("summary") reward (:attr:`SLCAGRPOConfig.reward_tiers`); a tier's reward is
   the weighted sum of its functions (``GRPOConfig.reward_weights``).
3. The segments come from TRL's masks: ``model_mask = completion_mask *
   tool_mask`` (``tool_mask`` is 1 on model tokens and 0 on tool-result tokens,
   from TRL's tool loop or a ``rollout_func``'s ``env_mask``) and
   ``valid_mask = completion_mask``, passed to :func:`slca.segment_masks`.
4. Masks are padded and gathered across processes, so each group is normalised
   over all its members whatever process holds them; every process then keeps
   its own rows (the same slice TRL uses for its 1-D advantages).
5. An estimator that needs more inputs (``slca_cond``, ``slca_turn``, a
   registered one) gets them computed on each process and gathered the same way
   (:class:`SLCAGRPOTrainer`'s ``tasks`` / ``estimator_inputs``); its options
   come from :attr:`SLCAGRPOConfig.estimator_options`.

With ``advantage_estimator="grpo"`` the advantages are TRL's own for every TRL
option (``scale_rewards``, ``multi_objective_aggregation``, ``reward_weights``);
the tiered estimators refuse ``normalize_then_sum`` (:func:`check_aggregation`).

``_compute_loss`` accepts ``(B, T)`` advantages (TRL unsqueezes only 1-D ones), so
every TRL loss type works unchanged. Both hooks are private TRL methods:
:func:`check_trl_contract` fails loudly when they change.

Example (runnable with a real model id)::

    from slca.integrations.trl import SLCAGRPOConfig, SLCAGRPOTrainer

    def execution_reward(completions, **kw):   # one float per completion
        ...
    def summary_reward(completions, **kw):
        ...

    trainer = SLCAGRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=[execution_reward, summary_reward],
        args=SLCAGRPOConfig(output_dir="out", reward_tiers=["tool", "summary"]),
        train_dataset=dataset,
        tools=[get_weather],
    )
    trainer.train()
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import json
import keyword
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from packaging.version import Version

from slca import metrics as M
from slca._fields import did_you_mean, help_of
from slca.core.advantages import EMPTY_SUMMARY_DEFAULT, EMPTY_TOOL_DEFAULT, group_normalize
from slca.core.beyond import SPAN_LABELS_INPUT
from slca.core.registry import (
    AdvantageInputs,
    EmptySummary,
    EmptyTool,
    EstimatorSpec,
    SLCAOptions,
    get_estimator,
    get_input,
    list_estimators,
    resolve_estimator,
    with_deprecated,
)
from slca.chat import check_segment_masks, enforce_mask_check, list_formats
from slca.chat.spans import check_segmentation, span_labels, spans_needed
from slca.core.losses import AGG_MODES
from slca.core.segments import SEGMENTATIONS, segment_masks, span_segment_masks
from slca.env.simulators import exception_result, new_tool_run
from slca.models.named import NAMED_MODELS, load_named, named_model_problem
from slca.reporting.report import write_token_html
from slca.rewards import execution_reward, summary_reward, turns_from_messages
from slca.training.config import TrainConfig
from slca.models.loading import hub_model_problem, looks_like_path
from slca.training.samples import SampleGroup, SampleRollout
from slca.types import Task, ToolResult, Trajectory, Turn

try:
    import trl
    from accelerate.utils import gather_object
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("slca.integrations.trl needs TRL: pip install 'slca[trl]'") from e

__all__ = [
    "AGGREGATIONS",
    "HOST_OPTIONS",
    "TESTED_TRL",
    "TIERS",
    "UNANSWERED_MODES",
    "AdvantageBatch",
    "SLCAGRPOConfig",
    "SLCAGRPOTrainer",
    "SplitBatch",
    "call_options",
    "check_aggregation",
    "check_loss_type",
    "check_tiers",
    "check_trl_contract",
    "mark_unanswered",
    "quiet_known_warnings",
    "reported_tool",
    "resolve_model",
    "slca_reward_funcs",
    "simulator_environment",
    "simulator_environments",
    "tool_method_problem",
    "tier_rewards",
    "trajectories_from_completions",
    "trl_batch_advantages",
]

TESTED_TRL = (">=1.16", "<1.17")
TIERS = ("tool", "summary")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")  # TRL's multi_objective_aggregation
TRL_LOSS_TYPE = {"token_mean": "dapo", "seq_mean": "grpo", "token_sum_norm": "dr_grpo"}
"""slca's ``loss_agg`` -> the TRL ``loss_type`` that normalises the same way; slca's other modes have none."""
UNANSWERED_MODES = ("unscored", "not_executed")
"""What :func:`slca_reward_funcs` does with the calls of a completion's last turn that TRL never executed."""
NOT_EXECUTED = "not executed: the rollout ended before the environment answered"  # as slca.integrations.verl

HOST_OPTIONS = {"scale": "scale_rewards", "eps": "advantage_eps"}
"""Estimator options the host sets from its own config (option -> SLCAGRPOConfig field); every other option
travels in ``SLCAGRPOConfig.estimator_options``."""
TRL_EPS = 1e-4
"""The eps TRL's own GRPO normalisation adds to the std (``std + 1e-4``), and so ``advantage_eps``'s default: ``grpo``
under this host equals TRL's advantages. slca's trainer and verl keep 1e-6, each its host's own constant
(docs/architecture.md)."""
DEPRECATED_OPTION_FIELDS = ("empty_tool", "empty_summary")
"""``SLCAGRPOConfig`` fields that are deprecated spellings of ``estimator_options={name: ...}`` (issue 46)."""


KNOWN_NOISE = (
    # TRL 1.16 sets and calls transformers 5's gradient_checkpointing names, deprecated for activation_checkpointing
    (FutureWarning, r"`\w*gradient_checkpointing\w*` is deprecated and will be removed in v6"),
)
"""``(category, message regex)`` of the third-party warnings every TRL run on the tested versions prints."""


def quiet_known_warnings() -> None:
    """Hide the third-party notices every run prints that say nothing about the run: :data:`KNOWN_NOISE`, and
    TRL's "experimental feature" notice of ``environment_factory`` / ``rollout_func`` (through TRL's own switch,
    ``TRL_EXPERIMENTAL_SILENCE=1``, unless it is set already). Every other warning still shows, slca's own
    included. The examples call it first; a script of yours may.
    """
    for category, message in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def check_trl_contract(trainer_cls: type = GRPOTrainer) -> None:
    """Raise RuntimeError if the private TRL methods this integration relies on changed.

    Checked: ``_calculate_rewards(inputs, prompts, completions,
    completion_ids_list)`` exists and gathers (its source calls ``gather``);
    ``_generate_and_score_completions(inputs)`` exists and slices the local rows
    with ``process_index``; its output carries ``completion_mask``, ``tool_mask``
    and ``advantages``; ``_compute_loss`` unsqueezes only 1-D advantages.
    """
    problems = []

    def src(name: str) -> str:
        fn = getattr(trainer_cls, name, None)
        if fn is None:
            problems.append(f"GRPOTrainer.{name} is missing")
            return ""
        return inspect.getsource(fn)

    calc = src("_calculate_rewards")
    if calc:
        params = list(inspect.signature(trainer_cls._calculate_rewards).parameters)
        if params != ["self", "inputs", "prompts", "completions", "completion_ids_list"]:
            problems.append(f"_calculate_rewards signature changed: {params}")
        if "gather(rewards_per_func)" not in calc:
            problems.append("_calculate_rewards no longer returns the gathered reward matrix")
    gen = src("_generate_and_score_completions")
    if gen:
        for needle in ('"completion_mask": completion_mask', 'output["tool_mask"] = tool_mask',
                       '"advantages": advantages', "self.accelerator.process_index * len(prompts)",
                       "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)"):
            if needle not in gen:
                problems.append(f"_generate_and_score_completions no longer contains {needle!r}")
    loss = src("_compute_loss")
    if loss and "if advantages.dim() == 1:" not in loss:
        problems.append("_compute_loss no longer accepts (B, T) advantages")
    if problems:
        raise RuntimeError(
            f"TRL {trl.__version__} changed the private GRPOTrainer methods slca relies on "
            f"(tested: trl{','.join(TESTED_TRL)}): " + "; ".join(problems)
        )


def _option_help(name: str) -> str:
    """The help of an option of :class:`slca.core.registry.SLCAOptions` (its one home)."""
    return next(help_of(f) for f in fields(SLCAOptions) if f.name == name)


def _train_help(name: str) -> str:
    """The help of a :class:`slca.training.config.TrainConfig` field (its one home)."""
    return next(help_of(f) for f in fields(TrainConfig) if f.name == name)


@dataclass
class SLCAGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the SLCA options. TRL's own options keep their meaning;
    ``scale_rewards`` is passed to the estimator as ``scale``."""

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["estimator_options"]

    advantage_estimator: str = field(
        default="slca",
        metadata={"help": "Name in slca's estimator registry: 'slca' (segment-locked), 'grpo' (one scalar "
                  "on every token, the matched baseline), 'gdpo' (decoupled normalisation, no locking), "
                  "'slca_cond', 'slca_turn'; your own as an import path 'my_pkg.module:function' (imported in every "
                  "process) or a 'slca.estimators' entry point. Checked when the config is made, before any model loads."},
    )
    estimator_options: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "The estimator's own options by name (JSON on the command line), e.g. "
                  "'{\"turn_lambda\": 0.5}' for slca_turn or '{\"cond_std\": \"subgroup\"}' for slca_cond; "
                  "checked against the options it declares when the config is made, e.g. "
                  "'{\"empty_tool\": \"exclude\"}' for slca. scale and eps come from scale_rewards and advantage_eps."},
    )
    task_id_column: str = field(
        default="task_id",
        metadata={"help": "Dataset column naming each row's slca Task (a key of the trainer's tasks=), for the "
                  "inputs an estimator needs (slca_cond's tool_signatures, slca_turn's turn_rewards)."},
    )
    reward_tiers: list[str] | None = field(
        default=None,
        metadata={"help": "One of 'tool' / 'summary' per reward function, in order. Default: two functions, "
                  "the first the execution reward, the second the summary reward."},
    )
    empty_tool: EmptyTool = field(
        default=EMPTY_TOOL_DEFAULT,
        metadata={"help": "Deprecated: estimator_options={\"empty_tool\": ...}. " + _option_help("empty_tool")},
    )
    empty_summary: EmptySummary = field(
        default=EMPTY_SUMMARY_DEFAULT,
        metadata={"help": "Deprecated: estimator_options={\"empty_summary\": ...}. " + _option_help("empty_summary")
                  + " A rollout that ends on an unexecuted call (TRL's max_tool_calling_iterations) has that call turn "
                  "as its summary segment and is not affected."},
    )
    advantage_eps: float = field(
        default=TRL_EPS,
        metadata={"help": "eps added to the group std; 1e-4 is the constant TRL's own normalisation uses."},
    )
    mask_check_max_mismatch: float = field(
        default=TrainConfig.mask_check_max_mismatch, metadata={"help": _train_help("mask_check_max_mismatch")},
    )
    tool_format: str = field(
        default="hermes",
        metadata={"help": "The slca.chat tool-call format the model writes, which the mask check parses call segments "
                  "with (and segmentation='span' / slca_think label tokens with): " + ", ".join(list_formats()) + "."},
    )
    segmentation: str = field(
        default="boundary",
        metadata={"help": _train_help("segmentation") + " Labels come from the completion ids decoded with the "
                  "processing_class."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        spec = resolve_estimator(self.advantage_estimator)  # one-line ValueError (unknown, module not found, ...) before any model loads
        if self.reward_tiers is not None:  # a typo is refused here, not after the model loads
            check_tier_names(self.reward_tiers)
            check_tiers(list(self.reward_tiers), self.advantage_estimator)
        check_loss_type(self.loss_type)
        check_mask_options(self.mask_check_max_mismatch, self.tool_format)
        check_segmentation(self.segmentation, self.tool_format, spec)
        old = {k: getattr(self, k) for k in DEPRECATED_OPTION_FIELDS if getattr(self, k) != getattr(SLCAOptions, k)}
        if old:  # checked, then routed into estimator_options where the estimator takes them
            given = self.estimator_options if isinstance(self.estimator_options, Mapping) else {}
            routed = with_deprecated(spec, given, old, {k: f"SLCAGRPOConfig.{k}" for k in old}, "estimator_options")
            for k, v in old.items():
                warnings.warn(f"SLCAGRPOConfig.{k} is deprecated: pass estimator_options={{{k!r}: {v!r}}} instead",
                              FutureWarning, stacklevel=3)
            if self.estimator_options is None or isinstance(self.estimator_options, Mapping):
                self.estimator_options = routed
        if isinstance(self.estimator_options, Mapping):  # a JSON string is parsed by GRPOConfig; checked by the trainer otherwise
            host = {"scale": self.scale_rewards, "eps": self.advantage_eps}
            call_options(spec, host, self.estimator_options)  # an unknown or bad option: one line, before any model loads


def check_mask_options(max_mismatch: Any, tool_format: Any) -> None:
    """ValueError, in one line, for a ``mask_check_max_mismatch`` outside [0, 1] or an unknown ``tool_format``."""
    if isinstance(max_mismatch, bool) or not isinstance(max_mismatch, (int, float)) or not 0 <= max_mismatch <= 1:
        raise ValueError(f"mask_check_max_mismatch must be a share in [0, 1] (1.0: count only), got {max_mismatch!r}")
    if tool_format not in list_formats():
        raise ValueError(f"tool_format must be one of {list_formats()}, got {tool_format!r}")


def check_loss_type(loss_type: str) -> None:
    """Raise ValueError, in one line, for one of slca's ``loss_agg`` names given as TRL's ``loss_type``.

    TRL aggregates the loss itself (``GRPOTrainer._compute_loss``, by ``loss_type``) and
    slca replaces only the advantages, so slca's ``segment_balanced`` and ``turn_mean``
    have no TRL form: TRL's normalisers count tokens, sequences or a constant, never
    segments or turns. TRL's own names are left to TRL.
    """
    if loss_type not in AGG_MODES:
        return
    if loss_type in TRL_LOSS_TYPE:
        raise ValueError(f"loss_type={loss_type!r} is slca's loss_agg name; TRL's loss type that normalises the same way "
                         f"is loss_type={TRL_LOSS_TYPE[loss_type]!r}")
    raise ValueError(
        f"loss_type={loss_type!r}: TRL's GRPOTrainer aggregates the loss itself and its loss types normalise by "
        "tokens, sequences or a constant, never by segments or turns, while slca replaces only its advantages; use "
        f"slca's own trainer (slca train --set loss_agg={loss_type}) or one of TRL's loss types (docs/training.md, "
        '"Loss aggregation")'
    )


def tier_rewards(
    rewards_per_func: torch.Tensor, tiers: list[str], weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Execution- and summary-tier reward per rollout from TRL's reward matrix.

    ``r^tier_i = nansum_{k in tier} w_k r_ik``: the functions of the tier that
    scored row ``i`` are summed (a function returning None gives NaN and is
    skipped, as TRL's own ``nansum``); NaN when none of the tier's functions
    scored the row, and NaN on every row for a tier without any function (an
    *absent* tier: :func:`trl_batch_advantages` defines what that means).

    Args:
        rewards_per_func: (B, F) float, NaN = not scored.
        tiers: length-F list of "tool" / "summary".
        weights: (F,) reward weights.

    Returns:
        ``(tool_rewards (B,), summary_rewards (B,))``.
    """
    if rewards_per_func.dim() != 2 or rewards_per_func.shape[1] != len(tiers):
        raise ValueError(
            f"rewards_per_func must be (B, {len(tiers)}) to match reward_tiers, got {tuple(rewards_per_func.shape)}"
        )
    out = []
    w = weights.to(rewards_per_func)
    for tier in TIERS:
        cols = [k for k, t in enumerate(tiers) if t == tier]
        if not cols:  # absent tier (isnan(...).all() of an empty (B, 0) slice would say "unscored" by accident)
            out.append(torch.full_like(rewards_per_func[:, 0], float("nan")))
            continue
        r = rewards_per_func[:, cols] * w[cols]  # (B, F_tier)
        total = torch.nansum(r, dim=1)
        out.append(torch.where(torch.isnan(r).all(dim=1), torch.full_like(total, float("nan")), total))
    return out[0], out[1]


def check_tier_names(tiers: Any) -> None:
    """Raise ValueError, in one line, unless ``tiers`` is a list of :data:`TIERS` names (the closest one offered for a typo)."""
    if isinstance(tiers, str) or not isinstance(tiers, (list, tuple)):
        raise ValueError(f"reward_tiers must be a list with one of {list(TIERS)} per reward function, got {tiers!r}")
    for t in tiers:
        if t not in TIERS:
            raise ValueError(f"reward_tiers: {t!r} is not a tier{did_you_mean(str(t), TIERS)}; give one of {list(TIERS)} "
                             f"per reward function, in order, got {list(tiers)}")


def check_tiers(tiers: list[str], estimator: str) -> None:
    """Raise ValueError if ``estimator`` cannot work with the tiers present in ``tiers``.

    Trajectory-level estimators (``grpo``, any registered with
    ``trajectory=True``: :attr:`slca.core.registry.EstimatorSpec.trajectory`) take any
    non-empty set of functions. The tiered ones need a summary-tier function:
    without one there is no reward for the tokens after the last tool response,
    nor for a rollout that made no call. Without a tool-tier function they run
    on the summary tier alone (see :func:`trl_batch_advantages`).
    """
    if not tiers:
        raise ValueError("at least one reward function is needed")
    if not get_estimator(estimator).trajectory and "summary" not in tiers:
        raise ValueError(
            f"advantage_estimator={estimator!r} routes the summary-tier reward to the answer tokens, but no reward "
            f"function is declared 'summary' (reward_tiers={tiers}); declare one, or use advantage_estimator='grpo'"
        )


def check_aggregation(estimator: str, aggregation: str) -> None:
    """Raise ValueError if ``estimator`` cannot honour TRL's ``multi_objective_aggregation``.

    Trajectory-level estimators (``grpo``) take both of TRL's rules and give
    TRL's advantages. The tiered ones take only ``sum_then_normalize`` (within
    each tier: they normalise each tier's reward in its group themselves).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"multi_objective_aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "normalize_then_sum" and not get_estimator(estimator).trajectory:
        raise ValueError(
            f"multi_objective_aggregation='normalize_then_sum' with advantage_estimator={estimator!r}: TRL's rule "
            "normalises each reward function in its group and then their weighted sum over the whole batch, one scalar "
            f"per rollout; {estimator!r} normalises each tier's reward in its group itself and routes it to that tier's "
            "segment, so a batch-normalised sum of both tiers leaves nothing to route. Keep 'sum_then_normalize' (the "
            "sum is then per tier), use 'gdpo' for each tier normalised on its own on every token, or 'grpo' for TRL's "
            "normalize_then_sum exactly"
        )


def call_options(spec: EstimatorSpec, host: Mapping[str, Any], given: Mapping[str, Any] | None) -> Any:
    """The options object to call ``spec`` with: the host's (``scale``, ``eps``) it takes, plus ``given``.

    ``given`` (``SLCAGRPOConfig.estimator_options``) may not set a host option
    (:data:`HOST_OPTIONS` says which config field does); an option the
    estimator does not declare, or a bad value, raises ValueError naming both
    (:meth:`slca.core.registry.EstimatorSpec.host_options`).
    """
    return spec.host_options(host, given, {k: f"SLCAGRPOConfig.{v}" for k, v in HOST_OPTIONS.items()})


def _normalize_per_function(rewards_per_func: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """Each column normalised within its groups (TRL's ``normalize_then_sum`` first step); NaN stays NaN.

    A member of a group with fewer than two scores of that function gets 0, as
    TRL's ``nansum`` of its NaN gives.
    """
    cols = [group_normalize(rewards_per_func[:, k], group_ids, scale="group", eps=eps) for k in range(rewards_per_func.shape[1])]
    out = torch.stack(cols, dim=1).to(rewards_per_func)
    return torch.where(torch.isnan(rewards_per_func), rewards_per_func, out)


def trl_batch_advantages(
    rewards_per_func: torch.Tensor,
    tiers: list[str],
    weights: torch.Tensor,
    completion_mask: torch.Tensor,
    tool_mask: torch.Tensor | None,
    num_generations: int,
    *,
    estimator: str = "slca",
    scale: str = "group",
    eps: float = TRL_EPS,
    aggregation: str = "sum_then_normalize",
    options: Mapping[str, Any] | None = None,
    extra_inputs: Mapping[str, Any] | None = None,
    segmentation: str = "boundary",
    span_labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, AdvantageInputs]:
    """Per-token advantages for a gathered TRL batch, through slca's registry.

    TRL's sampler puts each prompt's ``num_generations`` completions next to each
    other in the gathered batch, so row ``i`` belongs to group ``i // G``.

    Rewards (TRL's rules, so that ``estimator="grpo"`` equals TRL's own advantages):

    * trajectory-level estimators (``grpo``) get TRL's scalar: the weighted
      ``nansum`` over all functions, NaN (left out, advantage 0) only when no
      function scored the row. A tier one row has no score in counts 0 there
      when the other tier scored it.
    * ``aggregation="normalize_then_sum"`` (trajectory-level estimators only,
      :func:`check_aggregation`): TRL's rule. Each function is normalised in its
      group first (:func:`_normalize_per_function`), the weighted sum is then
      normalised over the whole batch: the estimator sees the batch as one
      group, with ``scale="group"`` (TRL ignores ``scale_rewards`` there).
    * tiered estimators (``slca``, ``gdpo``, ...) get each tier's own reward
      (:func:`tier_rewards`); a row a tier did not score is left out of that
      tier's group statistics and gets no advantage from it.
    * an absent tool tier (no function declared ``tool``): the summary tier
      alone, on the summary segment, and on every policy token of a rollout that
      made no call (the option ``empty_tool`` is then ``include``: there is no
      execution advantage to mix in). Tool-call tokens get 0: no reward judged them.
      Without tool calls in the batch this equals TRL's GRPO advantages.
    * an absent summary tier with a tiered estimator: ValueError (:func:`check_tiers`).

    Args:
        rewards_per_func: (B, F) gathered reward matrix.
        tiers: length-F tier of each reward function.
        weights: (F,) reward weights.
        completion_mask: (B, T) 1 on real completion tokens (0 = padding, or a
            truncated completion TRL masked out).
        tool_mask: (B, T) 1 on model tokens, 0 on tool-result tokens; None when
            the batch has no tool tokens.
        num_generations: G.
        aggregation: TRL's ``multi_objective_aggregation``.
        options: the estimator's options but ``scale`` and ``eps`` (:func:`call_options`), e.g.
            ``{"empty_tool": "exclude"}``.
        extra_inputs: the optional inputs the estimator needs (its spec's
            ``needs``), by name, for the B gathered rows.
        segmentation: ``"boundary"`` (the segments of :func:`slca.segment_masks`) or
            ``"span"`` (:func:`slca.core.segments.span_segment_masks` of them).
        span_labels: (B, T) span labels of the gathered rows (:func:`slca.chat.spans.span_labels`);
            needed with ``"span"`` and by an estimator that reads them (``slca_think``).

    Returns:
        ``(advantages (B, T) float32, the AdvantageInputs used)``.
    """
    B = rewards_per_func.shape[0]
    if num_generations < 1 or B % num_generations:
        raise ValueError(f"num_generations must divide the batch size {B}, got {num_generations}")
    check_tiers(list(tiers), estimator)
    check_aggregation(estimator, aggregation)
    spec = get_estimator(estimator)
    if segmentation not in SEGMENTATIONS:
        raise ValueError(f"segmentation must be one of {list(SEGMENTATIONS)}, got {segmentation!r}")
    if span_labels is None and spans_needed(spec, segmentation):
        raise ValueError(f"segmentation={segmentation!r} with estimator {estimator!r} needs span_labels (slca.chat.spans.span_labels)")
    valid = completion_mask.long()
    model = valid if tool_mask is None else valid * tool_mask.long()
    tool_seg, summary_seg = segment_masks(model, valid)
    if segmentation == "span":
        tool_seg, summary_seg = span_segment_masks(tool_seg, summary_seg, span_labels)
    group_ids = torch.arange(B, device=rewards_per_func.device) // num_generations
    if aggregation == "normalize_then_sum":
        rewards_per_func = _normalize_per_function(rewards_per_func, group_ids, eps)
        group_ids, scale = torch.zeros_like(group_ids), "group"
    r_tool, r_sum = tier_rewards(rewards_per_func, tiers, weights)
    if spec.trajectory:
        # TRL's scalar: nansum over all functions; NaN only where nothing scored the row
        r_tool = torch.where(torch.isnan(r_tool) & ~torch.isnan(r_sum), torch.zeros_like(r_tool), r_tool)
        r_sum = torch.where(torch.isnan(r_sum) & ~torch.isnan(r_tool), torch.zeros_like(r_sum), r_sum)
    elif "tool" not in tiers and "empty_tool" in spec.option_names:
        options = {**(options or {}), "empty_tool": "include"}
    inputs = AdvantageInputs(
        tool_rewards=r_tool,
        summary_rewards=r_sum,
        group_ids=group_ids,
        model_mask=model,
        tool_mask=tool_seg,
        summary_mask=summary_seg,
        span_labels=span_labels,
    ).with_inputs(dict(extra_inputs or {}))
    host = {"scale": scale, "eps": eps}
    adv = spec.run(inputs, call_options(spec, host, options))
    return adv, inputs


def _task_of(tasks: Mapping[str, Task], id_column: str, key: Any, where: str) -> Task:
    if key not in tasks:
        raise ValueError(f"{id_column}={key!r} is not among the {len(tasks)} tasks given to {where}")
    return tasks[key]


def _messages(completion: Any) -> list[dict[str, Any]]:
    """TRL's completion as chat messages: a conversational completion is one already, a text one becomes one turn."""
    return completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]


def trajectories_from_completions(
    completions: list[Any], task_ids: list[Any], tasks: Mapping[str, Task], id_column: str = "task_id"
) -> list[Trajectory]:
    """slca :class:`Trajectory` objects for TRL's completions, so the input registry's compute functions run on them.

    Each completion (TRL's message list, or a text) gives the turns and final
    text (:func:`slca.rewards.turns_from_messages`); its :class:`Task` is
    ``tasks[task_ids[i]]``. The token-level fields are empty (TRL keeps the
    tokens); ``stop_reason`` is ``final_answer`` when the last assistant turn
    made no call, else ``max_turns``.
    """
    out = []
    for c, key in zip(completions, task_ids, strict=True):
        msgs = _messages(c)
        turns, final = turns_from_messages(msgs)
        stop = "max_turns" if turns and turns[-1].parsed.is_tool_turn else "final_answer"
        out.append(Trajectory(_task_of(tasks, id_column, key, "the trainer's tasks"), [], [], [], [], turns, final, stop, msgs))
    return out


def mark_unanswered(turns: list[Turn]) -> list[Turn]:
    """``turns`` with the unanswered calls of the last turn recorded as not executed.

    TRL's tool loop stops at ``max_tool_calling_iterations`` (or when a tool result
    would not fit in ``max_completion_length``) right after a turn that made
    calls, without running them: that turn has no tool messages. Its calls get
    ``ToolResult(ok=False, error=NOT_EXECUTED)``, as verl's reward function
    (:func:`slca.integrations.verl.compute_score`) and slca's rollout engine record
    calls cut off by a limit. Only the last turn is completed: a missing result
    anywhere else is a malformed conversation and stays unscorable.
    """
    if turns and turns[-1].parsed.is_tool_turn and len(turns[-1].results) < len(turns[-1].parsed.calls):
        last = turns[-1]
        missing = len(last.parsed.calls) - len(last.results)
        turns = [*turns[:-1], Turn(last.text, last.parsed, [*last.results, *[ToolResult(ok=False, error=NOT_EXECUTED)] * missing])]
    return turns


def slca_reward_funcs(
    tasks: Mapping[str, Task], id_column: str = "task_id", *, unanswered: str = "not_executed"
) -> list[Callable[..., list[float | None]]]:
    """TRL reward functions ``[execution, summary]`` from :mod:`slca.rewards`.

    Each completion (TRL's message list: assistant turns with ``tool_calls``,
    tool messages, the final answer) is scored against the :class:`Task` whose id
    is in the dataset column ``id_column``. A rollout slca cannot score (NaN
    total) returns None, which TRL turns into NaN and the estimator leaves out of
    its group's statistics. Use with ``reward_tiers=["tool", "summary"]``.

    ``unanswered`` decides what a completion whose last turn's calls TRL never
    executed (it hit ``max_tool_calling_iterations``) scores on the execution tier:

    * ``"not_executed"`` (default since issue 26): the calls count as made and
      not executed (:func:`mark_unanswered`), as in slca's trainer and in verl.
    * ``"unscored"`` (the default before): None (NaN): that rollout is left out
      of the tool tier's statistics and gets no tool advantage. Leaving a
      rollout out because of what the policy did (it kept calling) is an
      action-dependent baseline: the tool tier then never sees the cost of
      running out of turns (docs/beyond.md, "Segments that are missing").
    """
    if unanswered not in UNANSWERED_MODES:
        raise ValueError(f"unanswered must be one of {UNANSWERED_MODES}, got {unanswered!r}")
    complete = mark_unanswered if unanswered == "not_executed" else (lambda turns: turns)

    def _task(i: str) -> Task:
        return _task_of(tasks, id_column, i, "slca_reward_funcs")

    def _none_if_nan(x: float) -> float | None:
        return None if math.isnan(x) else float(x)

    def slca_execution(completions, **kwargs):
        ids = kwargs[id_column]
        return [_none_if_nan(execution_reward(_task(i), complete(turns_from_messages(c)[0])).total) for c, i in zip(completions, ids)]

    def slca_summary(completions, **kwargs):
        out = []
        for c, i in zip(completions, kwargs[id_column]):
            turns, final = turns_from_messages(c)
            out.append(_none_if_nan(summary_reward(_task(i), complete(turns), final).total))
        return out

    return [slca_execution, slca_summary]


_JSON_TO_PY = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def tool_method_problem(schema: dict[str, Any]) -> str | None:
    """Why a tool cannot be a method of a TRL environment (None if it can).

    TRL's tool loop offers an environment's methods, described by their Python
    signatures, so every parameter must be a Python identifier that is not a keyword
    (an MCP tool's ``from`` or ``max-results`` is not).
    """
    fn_schema = schema.get("function", schema)
    props = (fn_schema.get("parameters") or {}).get("properties", {})
    bad = [p for p in props if not p.isidentifier() or keyword.iskeyword(p)]
    if bad:
        return (f"tool {fn_schema.get('name')!r}: parameter names {bad[:5]} are not Python identifiers, so TRL's "
                "tool loop cannot offer it as a method")
    return None


def _tool_method(name: str, schema: dict[str, Any]) -> Callable[..., str]:
    """A method ``name(self, **arguments) -> str`` whose signature and Google-style
    docstring render back to ``schema`` through transformers' ``get_json_schema``."""
    problem = tool_method_problem(schema)
    if problem is not None:
        raise ValueError(problem)
    fn_schema = schema.get("function", schema)
    params = fn_schema.get("parameters") or {}
    props = params.get("properties", {})
    required = set(params.get("required", []))

    def method(self, **arguments: Any) -> str:
        return self._call(name, arguments)

    sig = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = [fn_schema.get("description") or name, "", "Args:"]
    for p, ps in props.items():
        typ = ps.get("type")
        py = _JSON_TO_PY.get(typ, str) if isinstance(typ, str) else str
        annotations[p] = py if p in required else (py | None)
        default = inspect.Parameter.empty if p in required else None
        sig.append(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotations[p]))
        lines.append(f"    {p}: {ps.get('description') or p}")
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(sig, return_annotation=str)
    method.__annotations__ = annotations
    method.__doc__ = "\n".join(lines if props else lines[:1])
    return method


def reported_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a TRL tool whose exception becomes the error result ``slca train`` gives for it.

    TRL's own loop turns a raising tool into ``{'error': str(e)}``, without the
    exception's type and without a traceback anywhere. Wrapped, the model reads
    :func:`slca.env.simulators.exception_result`'s text (``"<name> raised <Type>:
    <message>"``; ``"<name> failed: <message>"`` for ``ToolError`` / ``ValueError``)
    and the run's first traceback is logged once, as in ``slca train``. The
    signature and docstring stay ``fn``'s (``functools.wraps``), so TRL builds the
    same schema. A coroutine function is returned as it is (TRL handles it).
    """
    if inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            return exception_result(fn.__name__, e).to_text()

    return tool


def simulator_environment(
    tasks: Mapping[str, Task], make_env: Callable[[Task], Any], id_column: str = "task_id"
) -> type:
    """An environment class for TRL's ``environment_factory`` backed by slca's simulators.

    Every tool offered by any of ``tasks`` becomes a public method (TRL's tool
    loop calls them by name); ``reset(**row)`` looks up the row's task by
    ``row[id_column]`` and builds a fresh simulator with ``make_env(task)`` (for
    example :func:`slca.env.toolworld.make_env`), so stateful tools keep state per
    rollout. A method returns ``ToolResult.to_text()``: errors (unknown tool,
    invalid arguments) come back as ``{"error": ...}`` text the model can read.

    Use: ``SLCAGRPOTrainer(..., environment_factory=simulator_environment(tasks, make_env))``.
    """
    schemas: dict[str, dict[str, Any]] = {}
    for task in tasks.values():
        for t in task.tools:
            fn = t.get("function", t)
            schemas.setdefault(fn["name"], t)
    reserved = {"reset", "get_reward"} & set(schemas)
    if reserved:
        raise ValueError(f"tool names {sorted(reserved)} clash with TRL's environment hooks")
    episodes = itertools.count()

    def reset(self, **row: Any) -> None:
        key = row.get(id_column)
        if key not in tasks:
            raise ValueError(f"row[{id_column!r}]={key!r} is not among the {len(tasks)} tasks of this environment")
        self.task = tasks[key]
        self.simulator = make_env(self.task)
        self.episode = next(episodes)
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.simulator.call(name, arguments, episode=self.episode).to_text()

    namespace: dict[str, Any] = {"reset": reset, "_call": _call, "__doc__": simulator_environment.__doc__}
    namespace.update({name: _tool_method(name, schema) for name, schema in schemas.items()})
    return type("SLCASimulatorEnvironment", (), namespace)


def simulator_environments(
    tasks: Mapping[str, Task], make_env: Callable[[Task], Any], id_column: str = "task_id"
) -> tuple[dict[str, type], dict[str, str]]:
    """One :func:`simulator_environment` per distinct tool set, for TRL's multi-environment mode.

    Returns ``(factories, environment_of)``: pass ``environment_factory=factories``
    and give each row the column ``environment=environment_of[task_id]``. TRL then
    renders each prompt with its own task's tools (one environment with every
    tool of a large dataset would declare them all in every prompt). A tool set's
    name is a short hash of its sorted tool schemas.
    """
    groups: dict[str, dict[str, Task]] = {}
    environment_of: dict[str, str] = {}
    for tid, task in tasks.items():
        key = json.dumps(sorted(json.dumps(t, sort_keys=True) for t in task.tools))
        name = "tools-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        groups.setdefault(name, {})[tid] = task
        environment_of[tid] = name
    return {name: simulator_environment(group, make_env, id_column) for name, group in groups.items()}, environment_of


def resolve_model(model: Any, processing_class: Any = None) -> tuple[Any, Any]:
    """``(model, processing_class)`` as :class:`SLCAGRPOTrainer` hands them to TRL.

    A name slca knows (:data:`slca.models.named.NAMED_MODELS`: ``"default"``, ``"smollm2"``, ...)
    is loaded offline by :func:`slca.models.named.load_named`, its tokenizer (with slca's chat
    template) becoming the processing class unless one is given. A folder, or a loaded model,
    passes through. A hub id is checked first (:func:`slca.models.loading.hub_model_problem`:
    the local cache, then one request without retries), so one that cannot load here
    (``HF_HUB_OFFLINE=1``, no network) fails at once, in one line naming it and the named models,
    instead of after TRL's ``from_pretrained`` retries.
    """
    if not isinstance(model, str):
        return model, processing_class
    if model in NAMED_MODELS:
        problem = named_model_problem(model)
        if problem is not None:
            raise ValueError(f"model {problem}")
        loaded, tokenizer = load_named(model)
        return loaded, processing_class if processing_class is not None else tokenizer
    if Path(model).expanduser().exists():
        return model, processing_class
    problem = f"{model!r}: no such folder" if looks_like_path(model) else hub_model_problem(model)
    if problem is not None:
        raise ValueError(f"model {problem}; slca's named models load offline: "
                         + ", ".join(f"{n!r} ({what})" for n, what in NAMED_MODELS.items()))
    return model, processing_class


def _func_name(f: Any) -> str:
    """A reward function's name as TRL logs it (a model id's last part)."""
    return f.split("/")[-1] if isinstance(f, str) else getattr(f, "__name__", type(f).__name__)


def _check_tier_count(tiers: list[str] | None, names: list[str], estimator: str) -> list[str]:
    """``tiers`` (default ``["tool", "summary"]``) checked against the reward functions ``names``; ValueError otherwise."""
    tiers = list(tiers or ["tool", "summary"])
    check_tier_names(tiers)
    if len(tiers) != len(names):
        raise ValueError(f"reward_tiers must give one of {TIERS} for each of the {len(names)} reward functions "
                         f"({names}), got {tiers}")
    check_tiers(tiers, estimator)
    return tiers


@dataclass(frozen=True)
class SplitBatch:
    """One generation batch as SLCA split it, gathered over all processes (:attr:`SLCAGRPOTrainer.last_advantages`).

    ``B`` rows (prompts x ``num_generations``; rows ``g*G`` to ``g*G + G - 1`` are one prompt's
    group), ``T`` completion tokens. The segment masks, tier rewards and estimator inputs are
    in :attr:`inputs` (``tool_mask``, ``summary_mask``, ``model_mask``, ``tool_rewards``,
    ``summary_rewards``); :meth:`SLCAGRPOTrainer.write_token_page` draws it.
    """

    step: int  # trainer.state.global_step when the batch was generated
    mode: str  # "train" or "eval"
    estimator: str  # the registry name that gave the advantages
    num_generations: int  # G
    advantages: torch.Tensor  # (B, T) float32: what the loss weighs each token by
    completion_ids: torch.Tensor  # (B, T) token ids
    valid_mask: torch.Tensor  # (B, T) TRL's completion_mask: 1 on real tokens
    env_mask: torch.Tensor | None  # (B, T) TRL's tool_mask: 1 on model tokens, 0 on tool results; None without any
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    rewards_per_func: torch.Tensor  # (B, F) NaN = the function returned None
    inputs: AdvantageInputs  # the estimator's inputs: tier rewards, group ids, segment masks, extra inputs

    @property
    def tool_mask(self) -> torch.Tensor:
        """(B, T) the execution segment: policy tokens before the last tool result (less the text around the calls
        with ``segmentation="span"``)."""
        return self.inputs.tool_mask

    @property
    def summary_mask(self) -> torch.Tensor:
        """(B, T) the summary segment: policy tokens after the last tool result (and the text around the calls with
        ``segmentation="span"``)."""
        return self.inputs.summary_mask


@dataclass(frozen=True)
class AdvantageBatch:
    """Which estimator gave one process its advantages on a generation batch, and which rows it kept.

    Every process computes the advantages of the batch gathered from all processes and keeps
    its own rows, ``start`` to ``start + rows - 1`` of ``total``
    (:attr:`SLCAGRPOTrainer.last_advantage_batch`; ``str()`` is one line for a run's log).
    """

    estimator: str  # the registry name the advantages were computed by
    mode: str  # "train" or "eval"
    process: int  # accelerate's process index
    processes: int  # number of processes
    start: int  # this process's first row in the gathered batch
    rows: int  # rows this process kept (its local batch)
    total: int  # rows of the gathered batch

    def __str__(self) -> str:
        return (f"process {self.process} of {self.processes}: {self.mode} advantages of rows {self.start}-"
                f"{self.start + self.rows - 1} of {self.total} by advantage_estimator={self.estimator!r}")


class SLCAGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with per-token advantages from slca's registry.

    Takes TRL's arguments unchanged; ``args`` should be an :class:`SLCAGRPOConfig`
    (a plain ``GRPOConfig`` gets the defaults: estimator ``slca``, tiers
    ``["tool", "summary"]``). ``model`` may also be a name slca knows
    (``"default"``, ``"smollm2"``: loaded offline with its tokenizer, :func:`resolve_model`);
    a hub id that cannot load here fails at once. Logs ``slca/*`` metrics and the shares
    ``rollout/no_tool_segment`` / ``rollout/no_summary_segment`` next to TRL's, and warns once per
    run when a batch has no tool segment at all or a tier returned None for every rollout.
    After each generation batch, :attr:`last_advantages` (:class:`SplitBatch`) holds its
    ``(B, T)`` advantages, segment masks, token ids and tier rewards, gathered over all
    processes, and :meth:`write_token_page` draws them as ``slca train``'s ``tokens.html``.
    ``tools`` are wrapped by :func:`reported_tool`: a tool that raises gives the model the
    error result ``slca train`` gives (the exception's type and message) and the first
    traceback is logged once.
    ``multi_objective_aggregation``: both of TRL's rules with a trajectory-level
    estimator (``grpo``), ``sum_then_normalize`` with a tiered one
    (:func:`check_aggregation`). After each generation batch,
    :attr:`trl_advantages` holds the ``(B_local,)`` advantages TRL itself
    computed for it (before they are replaced), so a run can check
    ``advantage_estimator="grpo"`` against TRL on every batch, and
    :attr:`last_advantage_batch` (:class:`AdvantageBatch`) the estimator that
    replaced them and the rows this process kept.

    Two keyword arguments of its own, for an estimator that needs more than the
    rewards (its spec's ``needs``: ``slca_cond``'s ``tool_signatures``,
    ``slca_turn``'s ``turn_rewards``, or a registered estimator's own input):

    * ``tasks``: ``{task_id: Task}``, the rows' slca tasks (each row names its
      task in the column ``args.task_id_column``). Each needed input is then
      computed by slca's input registry (:func:`slca.core.registry.get_input`) on
      the batch's completions as slca trajectories
      (:func:`trajectories_from_completions`).
    * ``estimator_inputs``: ``{name: fn}`` computing an input directly, called
      as TRL calls a reward function (``fn(prompts=, completions=,
      completion_ids=, **columns)``) and returning one value per completion (a
      list, or an array / tensor whose first dimension is the batch). Takes
      precedence over ``tasks`` for that input.

    An input is computed on each process for its own completions and gathered
    (tensors padded with NaN, or -1 if not float, to a common shape), like the
    rewards. A needed input with neither raises ValueError when the trainer is built.
    """

    def __init__(
        self,
        *args: Any,
        tasks: Mapping[str, Task] | None = None,
        estimator_inputs: Mapping[str, Callable[..., Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        check_trl_contract(GRPOTrainer)
        given = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        given.pop("self")
        funcs = given.get("reward_funcs")
        if funcs is not None:  # the tiers against the functions before any model loads
            funcs = funcs if isinstance(funcs, list) else [funcs]
            _check_tier_count(getattr(given.get("args"), "reward_tiers", None), [_func_name(f) for f in funcs],
                              getattr(given.get("args"), "advantage_estimator", "slca"))
        new_tool_run()  # the first tool exception of this run logs its traceback
        if given.get("tools"):  # a raising tool: the same error result and one logged traceback as in slca train
            given["tools"] = [reported_tool(t) for t in given["tools"]]
        given["model"], processing_class = resolve_model(given.get("model"), given.get("processing_class"))
        if processing_class is not None:
            given["processing_class"] = processing_class
        super().__init__(**given)
        a = self.args
        self.slca_estimator = getattr(a, "advantage_estimator", "slca")
        spec = get_estimator(self.slca_estimator)  # ValueError listing the known ones
        tiers = _check_tier_count(getattr(a, "reward_tiers", None), self.reward_func_names, self.slca_estimator)
        self.slca_tiers = list(tiers)
        self.slca_aggregation = getattr(self, "multi_objective_aggregation", "sum_then_normalize")
        check_aggregation(self.slca_estimator, self.slca_aggregation)
        check_loss_type(self.loss_type)  # a plain GRPOConfig is not checked when it is made
        self.slca_eps = float(getattr(a, "advantage_eps", TRL_EPS))
        self.slca_options = dict(getattr(a, "estimator_options", None) or {})  # SLCAGRPOConfig routed its deprecated fields in
        # unknown or mistyped options fail here, not on a batch
        call_options(spec, {"scale": self.scale_rewards, "eps": self.slca_eps}, self.slca_options)
        self.slca_tasks = tasks
        self.slca_task_column = getattr(a, "task_id_column", "task_id")
        self.slca_input_funcs = self._check_needs(spec, dict(estimator_inputs or {}))
        self._slca_rewards_per_func: torch.Tensor | None = None
        self._slca_extra: dict[str, Any] = {}
        self.trl_advantages: torch.Tensor | None = None  # TRL's own (B_local,) advantages of the last batch, for checks
        self.last_advantage_batch: AdvantageBatch | None = None  # the estimator and rows of the last batch
        self.last_advantages: SplitBatch | None = None  # the last batch's split, gathered (write_token_page)
        self._slca_warned: set[str] = set()  # the once-per-run warnings already given
        self.slca_mask_max = getattr(a, "mask_check_max_mismatch", TrainConfig.mask_check_max_mismatch)
        self.slca_tool_format = getattr(a, "tool_format", "hermes")
        check_mask_options(self.slca_mask_max, self.slca_tool_format)  # a plain GRPOConfig gets the defaults
        self.slca_segmentation = getattr(a, "segmentation", "boundary")
        check_segmentation(self.slca_segmentation, self.slca_tool_format, spec)
        self.slca_spans = spans_needed(spec, self.slca_segmentation)  # label each policy token: reasoning, call, text
        self._slca_local: tuple[list[Any], list[Any]] = ([], [])  # this process's completions and task ids (mask check)

    def _check_needs(self, spec: EstimatorSpec, funcs: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any] | None]:
        """``{need: fn, or None for the input registry}`` for every input ``spec`` needs; ValueError if one has no source."""
        if SPAN_LABELS_INPUT.name in funcs:
            raise ValueError(f"estimator_inputs may not give {SPAN_LABELS_INPUT.name!r}: the trainer labels the completion ids "
                             "itself (slca.chat.spans.span_labels, in SLCAGRPOConfig.tool_format)")
        unused = sorted(set(funcs) - set(spec.needs))
        if unused:
            raise ValueError(f"estimator_inputs {unused} are not inputs advantage_estimator={spec.name!r} needs "
                             f"(it needs {list(spec.needs) or 'none'})")
        out: dict[str, Callable[..., Any] | None] = {}
        for n in spec.needs:
            if n in funcs:
                out[n] = funcs[n]
                continue
            if n == SPAN_LABELS_INPUT.name:  # computed from the completion ids here (_span_labels)
                continue
            registered = get_input(n)  # ValueError if no InputSpec is registered under n
            if registered.compute is None or self.slca_tasks is None:
                how = "it has no compute function" if registered.compute is None else (
                    f"slca computes it from each rollout's trajectory ({registered.compute!r}), which needs the rollout's "
                    f"slca Task: pass tasks={{task_id: Task}} (rows name theirs in the column {self.slca_task_column!r})")
                raise ValueError(
                    f"advantage_estimator={spec.name!r} needs the input {n!r} ({registered.doc}); {how}, or pass "
                    f"estimator_inputs={{{n!r}: fn}} (called as a reward function, one value per completion)"
                )
            out[n] = None
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._slca_rewards_per_func = rewards_per_func  # (B_global, F), gathered
        self._slca_local = (list(completions), [row.get(self.slca_task_column) for row in inputs])
        self._slca_extra = {
            n: self._gather_input(v) for n, v in self._local_inputs(inputs, prompts, completions, completion_ids_list).items()
        }
        return rewards_per_func

    def _local_inputs(self, inputs, prompts, completions, completion_ids_list) -> dict[str, Any]:
        """The estimator's needed inputs for this process's completions, by name."""
        if not self.slca_input_funcs:
            return {}
        columns = {k: [row[k] for row in inputs] for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")}
        trajectories = None
        out = {}
        for n, fn in self.slca_input_funcs.items():
            if fn is not None:
                value = fn(prompts=prompts, completions=completions, completion_ids=completion_ids_list, **columns)
            else:
                if trajectories is None:
                    if self.slca_task_column not in columns:
                        raise ValueError(f"the dataset has no column {self.slca_task_column!r} naming each row's task "
                                         f"(SLCAGRPOConfig.task_id_column); its columns: {sorted(columns)}")
                    trajectories = trajectories_from_completions(
                        completions, columns[self.slca_task_column], self.slca_tasks, self.slca_task_column)
                value = get_input(n).from_trajectories(trajectories)
            if len(value) != len(prompts):
                raise ValueError(f"input {n!r} has {len(value)} values for {len(prompts)} completions (one per completion)")
            out[n] = value
        return out

    def _gather_input(self, value: Any) -> Any:
        """One input's values of this process's rows, gathered over all processes in TRL's row order."""
        acc = self.accelerator
        if isinstance(value, np.ndarray):
            value = torch.as_tensor(value)
        if not isinstance(value, torch.Tensor):
            return gather_object(list(value))
        t = value.to(acc.device)
        pad = float("nan") if torch.is_floating_point(t) else -1
        for d in range(1, t.dim()):  # e.g. turn_rewards (B, K): K differs between processes
            t = acc.pad_across_processes(t, dim=d, pad_index=pad)
        return acc.gather(t)

    def _generate_and_score_completions(self, inputs):
        self._slca_rewards_per_func = None
        out = super()._generate_and_score_completions(inputs)
        rewards_per_func = self._slca_rewards_per_func
        if rewards_per_func is None:
            raise RuntimeError("GRPOTrainer._calculate_rewards was not called; TRL's private API changed")
        acc = self.accelerator
        completion_mask = out["completion_mask"]  # (B_local, T_local)
        tool_mask = out.get("tool_mask")
        B_local, T_local = completion_mask.shape
        has_tool = bool(acc.gather(torch.tensor([int(tool_mask is not None)], device=completion_mask.device)).sum())
        if tool_mask is None:
            tool_mask = torch.ones_like(completion_mask)
        valid_g = acc.gather(acc.pad_across_processes(completion_mask, dim=1, pad_index=0))
        tool_g = acc.gather(acc.pad_across_processes(tool_mask, dim=1, pad_index=0)) if has_tool else None
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        labels = self._span_labels(out, completion_mask * tool_mask) if self.slca_spans else None
        adv, used = trl_batch_advantages(
            rewards_per_func,
            self.slca_tiers,
            self.reward_weights,
            valid_g,
            tool_g,
            G,
            estimator=self.slca_estimator,
            scale=self.scale_rewards,
            eps=self.slca_eps,
            aggregation=self.slca_aggregation,
            options=self.slca_options,
            extra_inputs=self._slca_extra,
            segmentation=self.slca_segmentation,
            span_labels=labels,
        )
        start = acc.process_index * B_local
        self.trl_advantages = out["advantages"]
        out["advantages"] = adv[start : start + B_local, :T_local].to(completion_mask.device)
        self.last_advantage_batch = AdvantageBatch(self.slca_estimator, mode, acc.process_index, acc.num_processes,
                                                   start, B_local, adv.shape[0])
        self.last_advantages = self._split_batch(out, mode, G, adv, used, valid_g, tool_g, rewards_per_func)
        self._log_slca_metrics(mode, adv, used)
        boundary = segment_masks(used.model_mask, valid_g.long()) if self.slca_segmentation == "span" else (used.tool_mask, used.summary_mask)
        self._check_masks(out, boundary, start, mode, G)
        self._warn_lost_split(used, rewards_per_func)
        return out

    def _span_labels(self, out: dict[str, Any], model_mask: torch.Tensor) -> torch.Tensor:
        """(B_global, T) span labels (:func:`slca.chat.spans.span_labels`) of this process's completion ids, decoded with
        the processing_class, gathered over all processes as the masks are."""
        acc, valid = self.accelerator, out["completion_mask"]
        labels = span_labels(out["completion_ids"], model_mask, tokenizer=self._page_tokenizer(), fmt=self.slca_tool_format,
                             end_of_turn=self._turn_ends(), lengths=_lengths(valid))
        return acc.gather(acc.pad_across_processes(labels.to(valid.device), dim=1, pad_index=0))

    def _turn_ends(self) -> list[int]:
        """The ids that end a completion's turn: TRL's ``eos_token_ids``, else the tokenizer's eos."""
        return list(getattr(self, "eos_token_ids", None) or [self._page_tokenizer().eos_token_id])

    def _check_masks(self, out: dict[str, Any], boundary: tuple[torch.Tensor, torch.Tensor], start: int, mode: str, G: int) -> None:
        """:func:`slca.chat.check_segment_masks` of the (B_global, T) environment-boundary segments ``boundary`` (those
        ``segmentation="span"`` refines) on this process's rows against their completions; the share over all
        processes logged as ``rollout/mask_mismatch``; every process raises :class:`slca.chat.MaskMismatchError` above
        ``mask_check_max_mismatch``. Not under a ``rollout_func``: TRL then decodes the whole completion, environment
        tokens included, as one message, so there is no conversation to read the ``env_mask`` against."""
        if getattr(self, "rollout_func", None) is not None:
            return
        acc, valid = self.accelerator, out["completion_mask"]
        B, T = valid.shape
        completions, task_ids = self._slca_local
        lengths = _lengths(valid)
        names = [f"row {start + i} ({self.slca_task_column} {k!r})" if k is not None else f"row {start + i} (group {(start + i) // G})"
                 for i, k in enumerate(task_ids)]
        eot = self._turn_ends()
        tool_g, summary_g = boundary
        found = check_segment_masks(out["completion_ids"], tool_g[start:start + B, :T], summary_g[start:start + B, :T],
                                    [_messages(c) for c in completions], tokenizer=self._page_tokenizer(), fmt=self.slca_tool_format,
                                    end_of_turn=eot, lengths=lengths, row_names=names)
        count, rows = (int(x) for x in acc.gather(torch.tensor([[len(found), B]], device=valid.device)).sum(dim=0))
        self._metrics[mode][M.ROLLOUT_MASK_MISMATCH.name].append(count / max(rows, 1))
        if count / max(rows, 1) > self.slca_mask_max:  # every process: the counts are gathered
            enforce_mask_check(gather_object(found[:3]), rows, self.slca_mask_max, count=count)

    def _page_tokenizer(self) -> Any:
        pc = self.processing_class
        return getattr(pc, "tokenizer", pc)  # a multimodal processor carries its tokenizer

    def _split_batch(self, out: dict[str, Any], mode: str, G: int, adv: torch.Tensor, used: AdvantageInputs,
                     valid_g: torch.Tensor, tool_g: torch.Tensor | None, rewards_per_func: torch.Tensor) -> SplitBatch:
        """The batch's tokens gathered next to its advantages, masks and rewards (same rows, same padding)."""
        acc = self.accelerator
        pad = self._page_tokenizer().pad_token_id
        pad = 0 if pad is None else pad
        ids = acc.gather(acc.pad_across_processes(out["completion_ids"], dim=1, pad_index=pad))
        prompt_ids = acc.gather(acc.pad_across_processes(out["prompt_ids"], dim=1, pad_index=pad, pad_first=True))
        prompt_mask = acc.gather(acc.pad_across_processes(out["prompt_mask"], dim=1, pad_index=0, pad_first=True))
        return SplitBatch(self.state.global_step, mode, self.slca_estimator, G, adv.detach(), ids, valid_g, tool_g,
                          prompt_ids, prompt_mask, rewards_per_func.detach(), used)

    def _warn_once(self, key: str, message: str) -> None:
        """``message`` as a UserWarning the first time ``key`` happens in this run (main process only)."""
        if key in self._slca_warned:
            return
        self._slca_warned.add(key)
        if self.accelerator.is_main_process:
            warnings.warn(message, UserWarning, stacklevel=3)

    def _warn_lost_split(self, used: AdvantageInputs, rewards_per_func: torch.Tensor) -> None:
        """Warn once per run when a batch leaves SLCA nothing to split: no rollout with a tool segment (the
        advantages are then GRPO's on the summary reward), or a tier none of whose functions scored any rollout
        (its advantages are 0: training goes on with the other tier)."""
        B, step = rewards_per_func.shape[0], self.state.global_step
        if not get_estimator(self.slca_estimator).trajectory and not used.tool_mask.bool().any():
            self._warn_once("no_tool_segment", (
                f"slca: none of the {B} rollouts of the batch at step {step} has a tool segment (no tool result in any "
                f"completion), so advantage_estimator={self.slca_estimator!r} had nothing to split and trained it as GRPO "
                f"on the summary tier; {M.ROLLOUT_NO_TOOL.name} logs the share per batch. Check that the model calls "
                "tools (a model before tool-calling SFT rarely does) and that max_completion_length leaves room for a "
                "call. Warned once per run."))
        for tier in TIERS:
            cols = [k for k, t in enumerate(self.slca_tiers) if t == tier]
            if cols and torch.isnan(rewards_per_func[:, cols]).all():
                names = [self.reward_func_names[k] for k in cols]
                self._warn_once(f"unscored_{tier}", (
                    f"slca: the {tier!r} tier's reward functions {names} returned None for all {B} rollouts of the "
                    f"batch at step {step}: that tier gave no advantage on it and the batch trained on the other tier "
                    "alone. Warned once per run."))

    def write_token_page(self, path: str | Path, *, max_groups: int | None = None) -> Path:
        """Write the last batch's token page (``tokens.html``, the page ``slca train`` writes) to ``path``.

        Each group of :attr:`last_advantages` (the first ``max_groups``; all by default) shows every
        rollout's tokens coloured by the advantage this run's estimator gave them, next to what
        the reference estimators (``grpo``, ``slca``, ``gdpo``) give the same rewards
        (:func:`slca.reporting.report.write_token_html`). The main process writes it; every
        process returns the path. RuntimeError before any batch.
        """
        if self.last_advantages is None:
            raise RuntimeError("no batch yet: write_token_page draws the last generation batch (after a training step)")
        path = Path(path)
        if self.accelerator.is_main_process:
            advs = self._page_advantages(self.last_advantages)
            write_token_html(self._page_groups(self.last_advantages, advs, max_groups), path,
                             title=f"TRL step {self.last_advantages.step}: token-level advantages", estimators=list(advs))
        return path

    def _page_advantages(self, b: SplitBatch) -> dict[str, torch.Tensor]:
        """``{estimator: (B, T)}``: this run's advantages, then the reference estimators' on the same rewards and masks
        (an estimator the tiers cannot serve, e.g. ``slca`` without a summary-tier function, is left out)."""
        out = {b.estimator: b.advantages}
        for name in list_estimators(reference=True):
            if name in out:
                continue
            ref = get_estimator(name)
            try:
                out[name], _ = trl_batch_advantages(
                    b.rewards_per_func, self.slca_tiers, self.reward_weights, b.valid_mask, b.env_mask, b.num_generations,
                    estimator=name, scale=self.scale_rewards, eps=self.slca_eps,
                    aggregation=self.slca_aggregation if ref.trajectory else "sum_then_normalize",
                    options=ref.pick(self.slca_options))  # the run's empty_tool / empty_summary where it takes them
            except ValueError:
                continue
        return out

    def _page_groups(self, b: SplitBatch, advs: dict[str, torch.Tensor], max_groups: int | None) -> list[SampleGroup]:
        tok = self._page_tokenizer()
        eos = tok.eos_token_id
        G, B = b.num_generations, b.completion_ids.shape[0]
        cpu = {k: v.detach().float().cpu() for k, v in advs.items()}
        model, tool, summ = (m.long().cpu() for m in (b.inputs.model_mask, b.tool_mask, b.summary_mask))
        valid, ids = b.valid_mask.long().cpu(), b.completion_ids.cpu()
        r_tool, r_sum = b.inputs.tool_rewards.float().cpu(), b.inputs.summary_rewards.float().cpu()
        groups = []
        for g in range(B // G if max_groups is None else min(B // G, max_groups)):
            rows = []
            for i in range(g * G, (g + 1) * G):
                real = valid[i].nonzero()
                n = int(real.max()) + 1 if len(real) else 0
                last = int(ids[i, n - 1]) if n else None
                rows.append(SampleRollout(
                    tokens=[tok.decode([int(t)]) for t in ids[i, :n]],
                    model_mask=model[i, :n].tolist(),
                    tool_mask=tool[i, :n].tolist(),
                    summary_mask=summ[i, :n].tolist(),
                    adv={k: [round(x, 4) for x in v[i, :n].tolist()] for k, v in cpu.items()},
                    tool_reward=float(r_tool[i]),
                    summary_reward=float(r_sum[i]),
                    stop_reason="eos" if last is not None and last == eos else "max_tokens",
                ))
            prompt = tok.decode(b.prompt_ids[g * G][b.prompt_mask[g * G].bool()].tolist())
            groups.append(SampleGroup(b.step, f"group {g}", b.mode, prompt, rows))
        return groups

    def _log_slca_metrics(self, mode: str, adv: torch.Tensor, used: AdvantageInputs) -> None:
        """``slca/*``: tier rewards, segment sizes and mean |advantage| per segment; the shares of rollouts without a
        tool segment and with one but no answer after it (:data:`slca.metrics.ROLLOUT_NO_TOOL`,
        :data:`slca.metrics.ROLLOUT_NO_SUMMARY`); all over the gathered batch."""
        m = self._metrics[mode]
        tool, summ, model = used.tool_mask.bool(), used.summary_mask.bool(), used.model_mask.bool()
        m[M.TRL_TOOL_REWARD.name].append(torch.nanmean(used.tool_rewards).item())
        m[M.TRL_SUMMARY_REWARD.name].append(torch.nanmean(used.summary_rewards).item())
        m[M.TRL_TOOL_TOKEN_FRAC.name].append((tool.sum() / model.sum().clamp_min(1)).item())
        has_tool, has_summary = tool.any(dim=1), summ.any(dim=1)
        m[M.ROLLOUT_NO_TOOL.name].append((~has_tool).float().mean().item())
        m[M.ROLLOUT_NO_SUMMARY.name].append((has_tool & ~has_summary).float().mean().item())
        for name, seg in (("tool", tool), ("summary", summ)):
            a = adv[seg].abs()
            m[M.TRL_ADV_ABS.key(segment=name)].append(a.mean().item() if a.numel() else 0.0)


def _lengths(valid: torch.Tensor) -> list[int]:
    """(B,) each row's real tokens: up to its last 1 in TRL's (B, T) ``completion_mask``."""
    B, T = valid.shape
    pos = torch.arange(T, device=valid.device)
    return (torch.where(valid.bool(), pos + 1, 0).amax(dim=1) if T else torch.zeros(B, dtype=torch.long)).tolist()


def _warn_untested_version() -> None:
    v = Version(trl.__version__)
    if not (Version("1.16") <= v < Version("1.17")):
        warnings.warn(
            f"slca.integrations.trl was tested with trl{','.join(TESTED_TRL)}, found {trl.__version__}; "
            "check_trl_contract() still guards the private methods it uses",
            stacklevel=2,
        )


_warn_untested_version()
