"""SLCA as a verl advantage estimator (tested with verl 0.9.1; extra ``slca[verl]``).

Registration
    ``pip install 'slca[verl]'`` declares the entry point
    ``[project.entry-points."verl.plugins"] slca = "slca.integrations.verl"``.
    ``import verl`` loads every ``verl.plugins`` entry point (policy:
    ``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``) by *importing* it; it does not
    call anything, so this module registers ``slca`` in
    ``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY`` at import time
    (:func:`register`, idempotent). Every Ray worker that imports verl therefore
    has it; select it with ``algorithm.adv_estimator=slca``. verl logs a plugin
    that fails to import only at debug level: check with
    ``python -c "import verl; from verl.trainer.ppo.core_algos import get_adv_estimator_fn as g; g('slca')"``.

How the two rewards reach the estimator (verl 0.9.1)
    verl calls a registered estimator with ``token_level_rewards``,
    ``response_mask``, ``index`` (uids) and the algorithm ``config`` only; the
    ``reward_extra_info`` a reward function returns is stored in the batch but not
    handed over (only the built-in ``gdpo`` gets it, by a name check). So both
    rewards travel as token positions (:func:`pack_token_rewards`):

    * the summary reward sits at the last valid response token, where verl's own
      reward managers put the score;
    * the execution (tool) reward sits at a position read from the mask alone
      that is never the last valid token (:func:`tool_reward_positions`): the
      row's first policy token when it has two or more, the position after it
      when it has one (a one-token response, whose one token *is* the last valid
      one); where the agent loop's padding puts that on the last valid token,
      the summary reward moves to the policy token (:func:`summary_reward_positions`);
    * the estimator reads the tool reward back at its position and takes the
      summary reward as the rest of the row's sum (:func:`unpack_token_rewards`).
      So verl's own layout (the score alone at the last valid token) reads as
      tool 0 and summary = score for *every* row, one-token responses included:
      ``grpo`` and ``gdpo`` then equal verl's GRPO, and the SLCA estimators give
      each row's policy tokens its GRPO advantage (``empty_tool=both``, the
      default, ``include`` or ``exclude`` on rows without a tool segment, in
      ``SLCA_ESTIMATOR_OPTIONS``), half of it (``response``), or
      0 (tool tokens: no execution reward), never the opposite sign.

    :class:`slca.integrations.verl_agent_loop.SLCAToolAgentLoop` writes this layout
    from the ``tool_reward`` / ``summary_reward`` keys of :func:`compute_score`'s
    result. ``algorithm.use_kl_in_reward`` must be False (a per-token KL penalty
    would be read as reward; use the actor's ``use_kl_loss`` instead).

    When the batch's ``reward_extra_info`` reaches the estimator
    (``non_tensor_batch``: below), :func:`compute_slca_outcome_advantage` reads
    ``non_tensor_batch["tool_reward"]`` / ``["summary_reward"]`` from there; the
    token layout is what it reads otherwise (verl's own reward managers).

The rest of the batch (per-rollout inputs, token ids)
    verl 0.9.1's ``compute_advantage`` hands a registered estimator
    ``non_tensor_batch`` (the rollouts' ``reward_extra_info``) and ``batch`` (the
    token ids) only when it is named ``gdpo``, by a name check. The estimators
    that need per-rollout inputs (``slca_paper``'s ``should_no_call``,
    ``toolpo_grpo``, ``rltr_planner``, ``slca_cond``) or the token ids
    (``SLCA_SEGMENTATION=span``, ``slca_think``) could therefore not run in a
    real ``main_ppo``. When verl's trainer is the caller, the estimator reads
    both from the batch it holds (:func:`batch_of_verl_caller`: the v1
    trainer's TransferQueue, or the legacy trainer's ``data``): read only,
    nothing of verl is patched, and arguments verl passes itself (upstream PR
    #7473) come first.

Reasoning and calls inside text
    ``SLCA_SEGMENTATION=span`` (the text around a turn's calls gets the summary
    advantage) and ``SLCA_ESTIMATOR=slca_think`` (reasoning as its own segment) label
    each policy token from the response token ids (:func:`slca.chat.spans.span_labels`),
    decoded with the tokenizer ``SLCA_TOKENIZER`` names (a model folder or hub id,
    loaded offline-first) in the format ``SLCA_TOOL_FORMAT`` (default ``json_list``,
    as :func:`compute_score`), from ``batch["responses"]`` (above: the rest of the
    batch). Without them, or without ``SLCA_TOKENIZER``, the estimator refuses in one
    line saying which is missing (:func:`span_inputs`).

Loss aggregation
    This plugin gives verl advantages only; verl's actor aggregates the loss by
    ``actor_rollout_ref.actor.loss_agg_mode``, whose values verl checks against its own
    (``token-mean``, ``seq-mean-token-mean``, ...). slca's ``segment_balanced`` and
    ``turn_mean`` (:func:`slca.core.losses.aggregate`) have no verl mode and are not
    available here (docs/training.md, "Loss aggregation").
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slca import metrics as M
from slca.chat import MaskMismatch, enforce_mask_check
from slca.chat.encoding import ChatRenderer
from slca.chat.spans import check_segmentation, span_labels, spans_needed
from slca.core.beyond import SPAN_LABELS_INPUT
from slca.core.registry import (
    AdvantageInputs,
    EstimatorSpec,
    get_input,
    parse_options,
    resolve_estimator,
    split_assignments,
    with_deprecated,
)
from slca.core.segments import segment_masks, span_segment_masks
from slca.types import ToolResult, Trajectory, Turn

__all__ = [
    "ESTIMATOR_NAME",
    "TOOL_KEY",
    "SUMMARY_KEY",
    "tool_reward_positions",
    "summary_reward_positions",
    "pack_token_rewards",
    "unpack_token_rewards",
    "compute_slca_outcome_advantage",
    "batch_of_verl_caller",
    "mask_check_share",
    "turn_end_ids",
    "dump_batch",
    "selected_estimator",
    "selected_options",
    "selected_segmentation",
    "span_inputs",
    "register",
    "compute_score",
]

ESTIMATOR_NAME = "slca"
ESTIMATOR_ENV = "SLCA_ESTIMATOR"
OPTIONS_ENV = "SLCA_ESTIMATOR_OPTIONS"
EMPTY_TOOL_ENV = "SLCA_EMPTY_TOOL"  # deprecated: SLCA_ESTIMATOR_OPTIONS=empty_tool=... (issue 46)
_WARNED: set[str] = set()  # the deprecated variables already warned of in this process
DUMP_ENV = "SLCA_VERL_DUMP_DIR"
MASK_CHECK_ENV = "SLCA_MASK_CHECK_MAX_MISMATCH"  # the share of rollouts whose masks may disagree (mask_check_share)
MASK_CHECK_KEY = "slca_mask_check"  # each rollout's check, written by slca_tool_agent into extra_fields
MASK_MISMATCH_METRIC = M.ROLLOUT_MASK_MISMATCH.name  # the share, in verl's step metrics (as slca train logs it)
AGENT_LOOP_NAME = "slca_tool_agent"  # slca.integrations.verl_agent_loop.SLCAToolAgentLoop's registered name
SEGMENTATION_ENV = "SLCA_SEGMENTATION"
TOKENIZER_ENV = "SLCA_TOKENIZER"
TOOL_FORMAT_ENV = "SLCA_TOOL_FORMAT"
DEFAULT_TOOL_FORMAT = "json_list"  # compute_score's default: the paper's system prompt
_TOKENIZERS: dict[str, Any] = {}  # SLCA_TOKENIZER -> the loaded tokenizer (once per process)
_DUMPS = 0
TOOL_KEY = "tool_reward"
NOT_EXECUTED = "not executed: the rollout ended before the environment answered"
SUMMARY_KEY = "summary_reward"


def _policy_counts(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, count)``: each row's first policy token (T where none) and its number of policy tokens."""
    model = torch.as_tensor(response_mask).bool()
    T = model.shape[1]
    pos = torch.arange(T, device=model.device).unsqueeze(0)
    first = torch.where(model, pos, torch.full_like(pos, T)).amin(dim=1) if T else torch.zeros(model.shape[0], dtype=torch.long)
    return first, model.sum(dim=1)


def tool_reward_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """Where each row's execution reward is stored, from the mask alone; never the last valid token
    (where verl's reward managers put the score), so verl's own layout reads as "no execution reward":

    * a row with two or more policy tokens: its first policy token (never the last valid one: a later
      policy token follows it);
    * a row with one policy token (a one-token response): the position after it, which is padding or
      a tool-response token, or -1 when that is past the batch's width (no position: the execution
      reward reads as 0, and :func:`pack_token_rewards` refuses such a row);
    * a row without a policy token: 0.

    Args:
        response_mask: (B, T) 0/1, 1 on policy tokens (verl's ``response_mask``).

    Returns:
        (B,) long.
    """
    m = torch.as_tensor(response_mask)
    T = m.shape[1]
    first, count = _policy_counts(m)
    after = torch.where(first + 1 < T, first + 1, torch.full_like(first, -1))
    return torch.where(count >= 2, first, torch.where(count == 1, after, torch.zeros_like(first)))


def summary_reward_positions(response_mask: torch.Tensor, response_lengths: torch.Tensor) -> torch.Tensor:
    """Where each row's summary reward is stored: its last valid token ``length - 1`` (where verl's
    reward managers put the score), unless the execution reward is stored there (a one-token response
    padded by one masked token, as the agent loop pads it): then the response's one policy token
    (a row without policy tokens: the position after the execution reward's). The two positions
    always differ.

    Returns:
        (B,) long.
    """
    m = torch.as_tensor(response_mask)
    n = torch.as_tensor(response_lengths).reshape(-1).long().to(m.device)
    first, count = _policy_counts(m)
    q = tool_reward_positions(m).to(n.device)
    last = n - 1
    other = torch.where(count == 1, first.to(n.device), q + 1)
    return torch.where(last == q, other, last)


def pack_token_rewards(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    response_lengths: torch.Tensor,
) -> torch.Tensor:
    """Write both rewards at their token positions (the inverse of :func:`unpack_token_rewards`).

    The execution reward goes to the first policy token (:func:`tool_reward_positions`),
    the summary reward to the last valid token (:func:`summary_reward_positions`); the
    two positions always differ, so each reward is read back exactly.

    Args:
        tool_rewards: (B,) execution-tier reward.
        summary_rewards: (B,) summary-tier reward.
        response_mask: (B, T) 0/1 policy tokens.
        response_lengths: (B,) number of valid response tokens (policy and tool
            tokens, no padding).

    Returns:
        (B, T) float32 ``token_level_scores``.

    Raises:
        ValueError: on a bad shape or length, non-finite rewards, or a one-token
            response with no position after its policy token (its own width is one
            token; the SLCA agent loop pads such a response by one masked token, see
            :mod:`slca.integrations.verl_agent_loop`).
    """
    m = torch.as_tensor(response_mask)
    B, T = m.shape
    rt = torch.as_tensor(tool_rewards, dtype=torch.float32).reshape(-1)
    rs = torch.as_tensor(summary_rewards, dtype=torch.float32).reshape(-1)
    n = torch.as_tensor(response_lengths).reshape(-1).long()
    for name, v in (("tool_rewards", rt), ("summary_rewards", rs), ("response_lengths", n)):
        if v.shape[0] != B:
            raise ValueError(f"{name} must have length B={B} (rows of response_mask), got {v.shape[0]}")
    if ((n < 1) | (n > T)).any():
        raise ValueError(f"response_lengths must be in [1, {T}], got {n.tolist()}")
    if not torch.isfinite(rt).all() or not torch.isfinite(rs).all():
        raise ValueError("tool_rewards and summary_rewards must be finite (verl sums token rewards for its metrics)")
    p_tool = tool_reward_positions(m)
    p_sum = summary_reward_positions(m, n).to(m.device)
    bad = (p_tool < 0) | (p_sum >= T)
    if bad.any():
        rows = bad.nonzero().flatten().tolist()
        raise ValueError(
            f"rows {rows}: a one-token response needs a second position for its execution reward, but the batch is "
            f"{T} token(s) wide; pad the response by one masked token (as SLCAToolAgentLoop does)"
        )
    out = torch.zeros(B, T, dtype=torch.float32, device=m.device)
    rows = torch.arange(B, device=m.device)
    out[rows, p_sum] = rs.to(m.device)
    out[rows, p_tool] = rt.to(m.device)
    return out


def unpack_token_rewards(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``(tool_rewards, summary_rewards)``, each (B,), from the token layout.

    ``r_tool = R[i, p_i]`` with ``p_i`` from :func:`tool_reward_positions` (0 where
    ``p_i = -1``); ``r_sum = sum_t R[i, t] - r_tool``. verl's own layout (the score
    alone at the last valid token) reads as ``r_tool = 0``, ``r_sum = score`` for
    every row, one-token responses included.
    """
    R = torch.as_tensor(token_level_rewards).float()
    if R.shape != torch.as_tensor(response_mask).shape:
        raise ValueError(
            f"token_level_rewards {tuple(R.shape)} and response_mask {tuple(response_mask.shape)} must have the same shape"
        )
    p = tool_reward_positions(response_mask).to(R.device)
    if R.shape[1] == 0:
        return torch.zeros(R.shape[0], device=R.device), torch.zeros(R.shape[0], device=R.device)
    r_tool = torch.where(p >= 0, R.gather(1, p.clamp(min=0).unsqueeze(1)).squeeze(1), torch.zeros_like(R[:, 0]))
    return r_tool, R.sum(dim=1) - r_tool


def _cfg(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping) or hasattr(config, "get"):
        try:
            return config.get(key, default)
        except (AttributeError, KeyError):
            return getattr(config, key, default)
    return getattr(config, key, default)


def _as_input(v: Any) -> Any:
    """A reward_extra_info column as an estimator input: numbers as a tensor, anything else as a list."""
    a = np.asarray(v)
    return torch.as_tensor(a.astype(np.float32)) if a.dtype.kind in "fiub" else list(v)


def compute_slca_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl estimator ``slca``: :func:`slca.slca_advantages` (or any registered estimator) through slca's registry.

    The estimator is ``slca`` unless the environment variable ``SLCA_ESTIMATOR``
    names another (:func:`selected_estimator`: ``gdpo``, ``slca_cond``, or yours as
    ``my_pkg.module:function`` or a ``slca.estimators`` entry point);
    the optional inputs it needs (its spec's ``needs``) are read from
    ``non_tensor_batch`` under the same names.

    Args (verl's estimator signature):
        token_level_rewards: (B, T) rewards in the :func:`pack_token_rewards` layout.
        response_mask: (B, T) 0/1, 1 on policy tokens, 0 on tool responses and padding.
        index: (B,) uids: rollouts of one prompt share one.
        epsilon: added to the group std (verl's GRPO default 1e-6).
        norm_adv_by_std_in_grpo: False centres only (Dr. GRPO); also read from
            ``config.norm_adv_by_std_in_grpo``, which verl sets.
        config: verl ``AlgoConfig``; ``use_kl_in_reward`` must be False.
            (``AlgoConfig`` takes no extra keys, so the estimator's options come
            from the environment: :func:`selected_options`,
            ``SLCA_ESTIMATOR_OPTIONS``; a verl row never lacks a summary
            segment, so ``empty_summary`` changes nothing.)
        non_tensor_batch: verl's ``reward_extra_info`` (and uids); when it holds
            ``tool_reward`` / ``summary_reward``, the rewards are read from there
            instead of the token layout, and the estimator's other inputs
            (``should_no_call``, ...) always are. Not given (verl 0.9.1 gives it to
            ``gdpo`` only), it is read from verl's trainer when that is the caller
            (:func:`batch_of_verl_caller`).
        batch: verl's tensor batch (given as ``non_tensor_batch`` is); its
            ``responses`` (B, T) token ids are read when span labels are needed
            (``SLCA_SEGMENTATION=span``, ``SLCA_ESTIMATOR=slca_think``: :func:`span_inputs`).

    With ``SLCA_VERL_DUMP_DIR`` set, each call saves its batch and its advantages
    there (:func:`dump_batch`).

    Returns:
        ``(advantages, returns)``, both (B, T), equal (outcome-only, as GRPO).
    """
    if index is None:
        raise ValueError("index (the rollouts' uids) is required: SLCA normalises within each prompt's group")
    spec = selected_estimator()
    segmentation = selected_segmentation(spec)
    metrics = None  # verl's metrics of this step, when read from its trainer
    if non_tensor_batch is None and batch is None:  # verl 0.9.1 passes them to gdpo alone: read them from its caller
        non_tensor_batch, batch, metrics = _read_from_caller(sys._getframe(1), index, spans_needed(spec, segmentation))
    _count_mask_check(non_tensor_batch, index, metrics)
    if _cfg(config, "use_kl_in_reward", False):
        raise ValueError(
            "algorithm.use_kl_in_reward must be False with adv_estimator=slca: the KL penalty would be read as "
            "reward; use actor_rollout_ref.actor.use_kl_loss=True instead"
        )
    mask = torch.as_tensor(response_mask)
    if non_tensor_batch is not None and TOOL_KEY in non_tensor_batch and SUMMARY_KEY in non_tensor_batch:
        r_tool = torch.as_tensor(np.asarray(non_tensor_batch[TOOL_KEY], dtype=np.float32))
        r_sum = torch.as_tensor(np.asarray(non_tensor_batch[SUMMARY_KEY], dtype=np.float32))
    else:
        r_tool, r_sum = unpack_token_rewards(token_level_rewards, mask)
    scale = "group" if (norm_adv_by_std_in_grpo and _cfg(config, "norm_adv_by_std_in_grpo", True)) else "none"
    options = selected_options(spec, scale=scale, eps=epsilon)
    labels = span_inputs(batch, mask) if spans_needed(spec, segmentation) else None
    tool_seg, summary_seg = segment_masks(mask)
    if segmentation == "span":
        tool_seg, summary_seg = span_segment_masks(tool_seg, summary_seg, labels)
    inputs = AdvantageInputs(
        tool_rewards=r_tool.to(mask.device),
        summary_rewards=r_sum.to(mask.device),
        group_ids=_uids(index),
        model_mask=mask,
        tool_mask=tool_seg,
        summary_mask=summary_seg,
        span_labels=labels,
    )
    # any registered estimator (SLCA_ESTIMATOR, default slca); the inputs it needs come from reward_extra_info
    needs = [n for n in spec.needs if n != SPAN_LABELS_INPUT.name]  # span labels: from the token ids, above
    missing = [n for n in needs if non_tensor_batch is None or n not in non_tensor_batch]
    if missing:
        ref = os.environ.get(ESTIMATOR_ENV, ESTIMATOR_NAME)
        raise ValueError(f"{ESTIMATOR_ENV}={ref!r} needs {missing} in the batch's reward_extra_info (non_tensor_batch)")
    extra = {n: _as_input(non_tensor_batch[n]) for n in needs}
    adv = spec.run(inputs.with_inputs(extra), options)
    adv = adv.to(device=mask.device, dtype=torch.as_tensor(token_level_rewards).dtype)
    if os.environ.get(DUMP_ENV):
        checks = None if non_tensor_batch is None else non_tensor_batch.get(MASK_CHECK_KEY)
        dump_batch(os.environ[DUMP_ENV], spec.name, token_level_rewards, mask, index, r_tool, r_sum, adv, extra,
                   None if checks is None else [str(c) for c in np.asarray(checks).tolist()])
    return adv, adv


def _uids(index: Any) -> list[str]:
    """verl's uids (a numpy object array, a list, a tensor) as strings, the group ids slca normalises within."""
    return [str(u) for u in np.asarray(index).tolist()]


def _read_from_caller(frame: Any, index: Any, ids: bool) -> tuple[Mapping[str, Any] | None, Any, dict | None]:
    """:func:`batch_of_verl_caller` with its rows checked against the estimator's uids. A failed read leaves the
    estimator what verl passed (logged: an estimator without inputs still runs on the token layout; one with them
    names what is missing)."""
    try:
        ntb, batch, metrics = batch_of_verl_caller(frame, ids=ids)
    except Exception as e:
        logging.getLogger(__name__).warning("reading the batch from verl's trainer failed (%s: %s); the estimator gets "
                                            "only what verl passed", type(e).__name__, e)
        return None, None, None
    if ntb is not None and "uid" in ntb:
        if _uids(ntb["uid"]) != _uids(index):
            raise ValueError("the batch read from verl's trainer does not line up with the estimator's rows (its uids "
                             "differ): this verl's internals changed; pass non_tensor_batch= and batch=")
    return ntb, batch, metrics


def _count_mask_check(non_tensor_batch: Mapping[str, Any] | None, index: Any, metrics: dict | None) -> None:
    """The batch's mask check (:func:`mask_check_share`), its share put in verl's step ``metrics`` when given; with
    ``SLCA_MASK_CHECK_MAX_MISMATCH`` set and no check in the batch (another agent loop), a one-line refusal."""
    checks = None if non_tensor_batch is None else non_tensor_batch.get(MASK_CHECK_KEY)
    if checks is not None:
        share = mask_check_share(checks, index)
        if metrics is not None:
            metrics[MASK_MISMATCH_METRIC] = share
    elif os.environ.get(MASK_CHECK_ENV):
        raise ValueError(f"{MASK_CHECK_ENV} is set, but this batch carries no mask check: slca's agent loop makes it "
                         f"(actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}) and verl's v1 trainer "
                         "carries it to the estimator (docs/training.md, \"Masks checked against the conversation\"); "
                         "use them, or unset it")


def mask_check_share(checks: Any, index: Any, max_share: float | None = None) -> float:
    """The share of a batch's rollouts whose segment masks disagree with their conversations, from each rollout's
    check as slca's agent loop stores it (``"ok"``, ``"kind: detail"``, ``"unchecked: why"``:
    :func:`slca.integrations.verl_agent_loop.mask_check_result`); unchecked rollouts count as rows, not as
    mismatches. Above ``max_share`` (default: ``SLCA_MASK_CHECK_MAX_MISMATCH``, else 0.1, slca train's default;
    1.0 only counts) :class:`slca.chat.MaskMismatchError` names the rows (index and uid) and what disagreed.

    Raises:
        ValueError: one line, for a ``SLCA_MASK_CHECK_MAX_MISMATCH`` that is not a share in [0, 1].
    """
    if max_share is None:
        raw = os.environ.get(MASK_CHECK_ENV, "0.1")
        try:
            max_share = float(raw)
        except ValueError:
            max_share = -1.0
        if not 0.0 <= max_share <= 1.0:
            raise ValueError(f"{MASK_CHECK_ENV}={raw!r}: a share in [0, 1] (1.0: count only)")
    uids = _uids(index)
    found = []
    for i, c in enumerate(str(x) for x in np.asarray(checks).tolist()):
        if c != "ok" and not c.startswith("unchecked:"):
            kind, _, detail = c.partition(": ")
            found.append(MaskMismatch(i, f"rollout {i} (uid {uids[i]})", kind, detail))
    return enforce_mask_check(found, len(uids), max_share, option=MASK_CHECK_ENV)


def _is_verl_function(code: Any, module: str, name: str) -> bool:
    """``code`` is the code of function ``name`` of the loaded verl module ``module`` (by name and file)."""
    mod = sys.modules.get(module)
    return mod is not None and code.co_name == name and code.co_filename == getattr(mod, "__file__", None)


def batch_of_verl_caller(frame: Any, depth: int = 6, *, ids: bool = True) -> tuple[Mapping[str, Any] | None, Any, dict | None]:
    """``(non_tensor_batch, batch, metrics)`` of the batch verl is computing advantages for, read from verl's own
    functions among the estimator's callers (``frame`` and up to ``depth`` frames above it); ``(None, None, None)``
    when none is. ``metrics`` is the v1 trainer's dict of the step's metrics (where the estimator logs the mask
    check's share), None under the legacy trainer. ``ids=False``: the v1 trainer's response ids are not read
    (``batch`` is None there; they are read only for span labels).

    verl 0.9.1 hands a registered estimator only ``token_level_rewards``, ``response_mask``, ``index`` and
    ``config`` unless it is named ``gdpo`` (a name check in ``verl.trainer.ppo.ray_trainer.compute_advantage``).
    The estimators whose inputs travel in the rollouts' ``reward_extra_info`` (``slca_paper``, ``toolpo_grpo``,
    ``rltr_planner``, ``slca_cond``) or that label tokens from their ids (``span``, ``slca_think``) read them here:

    * verl's v1 trainer (``trainer.use_v1=True``, 0.9.1's default) keeps the rollouts in its TransferQueue and
      reads only the fields GRPO needs; from ``PPOTrainer._compute_advantage``'s ``batch`` (the rows' keys, in
      the order of the estimator's rows), this reads each row's ``extra_fields["reward_extra_info"]`` and
      ``responses`` from the queue, as that trainer reads ``extra_fields`` for its own metrics;
    * the legacy trainer holds them in ``compute_advantage``'s argument ``data``.

    Read only: nothing of verl is patched, and a function is matched by its code's name and file in the loaded
    verl module, so no other caller's locals are read. The authors of SLCA-GRPO patched their verl for the same
    reason; a verl that passes ``non_tensor_batch`` and ``batch`` itself (upstream PR #7473) makes this unused.
    """
    legacy = None
    f = frame
    for _ in range(depth):
        if f is None:
            break
        if _is_verl_function(f.f_code, "verl.trainer.ppo.v1.trainer_base", "_compute_advantage"):
            metrics = f.f_locals.get("metrics")
            return (*_from_transfer_queue(f.f_locals.get("batch"), ids), metrics if isinstance(metrics, dict) else None)
        if legacy is None and _is_verl_function(f.f_code, "verl.trainer.ppo.ray_trainer", "compute_advantage"):
            legacy = f.f_locals.get("data")
        f = f.f_back
    ntb = getattr(legacy, "non_tensor_batch", None)
    return (ntb if isinstance(ntb, Mapping) else None), getattr(legacy, "batch", None), None


def _from_transfer_queue(meta: Any, ids: bool) -> tuple[Mapping[str, Any] | None, Any]:
    """``(non_tensor_batch, {"responses": ids})`` of the rows ``meta`` (a ``KVBatchMeta``) names, from verl's
    TransferQueue: each row's ``reward_extra_info`` keys that every row has, as arrays, its mask check
    (``extra_fields["slca_mask_check"]``, when every row has one) and, with ``ids``, its response ids right-padded
    with 0 to the longest (the width of the estimator's ``response_mask``; else None)."""
    keys, partition = getattr(meta, "keys", None), getattr(meta, "partition_id", None)
    if keys is None or partition is None:
        return None, None
    import transfer_queue as tq

    fields = ["uid", "extra_fields", "responses"] if ids else ["uid", "extra_fields"]
    got = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=fields)
    extra = [e if isinstance(e, Mapping) else {} for e in got.pop("extra_fields").tolist()]
    infos = [e.get("reward_extra_info") or {} for e in extra]
    shared = set(infos[0]).intersection(*infos[1:]) if infos else set()
    ntb: dict[str, Any] = {"uid": np.array(got.pop("uid").tolist(), dtype=object)}
    ntb.update({k: np.array([info[k] for info in infos]) for k in sorted(shared)})
    if extra and all(MASK_CHECK_KEY in e for e in extra):
        ntb[MASK_CHECK_KEY] = np.array([str(e[MASK_CHECK_KEY]) for e in extra], dtype=object)
    if not ids:
        return ntb, None
    rows = list(got["responses"].unbind())
    width = max((len(r) for r in rows), default=0)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ntb, {"responses": ids}


def dump_batch(directory: str, estimator: str, token_level_rewards, response_mask, index, tool_rewards,
               summary_rewards, advantages, inputs: Mapping[str, Any] | None = None,
               mask_checks: list[str] | None = None) -> str:
    """Save what the estimator was handed and what it returned, one ``torch.save`` file per call.

    Set ``SLCA_VERL_DUMP_DIR`` (where Ray starts, like ``SLCA_ESTIMATOR``) to see, from a real verl run,
    the batch verl's dispatch passed and the advantages it got back: a dict with ``estimator`` (the
    slca estimator's name), ``token_level_rewards``, ``response_mask``, ``advantages`` (all (B, T)),
    ``index`` (the uids), ``tool_rewards`` and ``summary_rewards`` ((B,), as read from the batch) and
    ``inputs`` (the estimator's other inputs, by name, as it got them: ``should_no_call``, ...) and
    ``mask_checks`` (each rollout's mask check, :func:`mask_check_share`; None when the batch carries none).
    Files are ``advantages-<pid>-<n>.pt``, ``n`` counting this process's calls from 1.

    Returns:
        The file's path.
    """
    global _DUMPS
    _DUMPS += 1
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"advantages-{os.getpid()}-{_DUMPS}.pt"
    torch.save(
        {
            "estimator": estimator,
            "token_level_rewards": torch.as_tensor(token_level_rewards).detach().cpu(),
            "response_mask": torch.as_tensor(response_mask).detach().cpu(),
            "advantages": advantages.detach().cpu(),
            "index": _uids(index),
            "tool_rewards": tool_rewards.detach().cpu(),
            "summary_rewards": summary_rewards.detach().cpu(),
            "inputs": {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in (inputs or {}).items()},
            "mask_checks": mask_checks,
        },
        path,
    )
    return str(path)


def selected_estimator() -> EstimatorSpec:
    """The slca estimator that verl's ``algorithm.adv_estimator=slca`` runs in this process.

    ``SLCA_ESTIMATOR`` (default ``slca``): a registered name, an import path
    ``my_pkg.module:function`` (the module is imported here, which registers it:
    verl's workers need no registration code of their own, only the package on
    their path) or the name of a ``slca.estimators`` entry point
    (:func:`slca.core.registry.resolve_estimator`). verl looks ``adv_estimator`` up in
    its own registry, where this module registers ``slca`` alone, so the choice
    among slca's estimators travels in the environment. Check a node before a run
    with ``python -c "from slca.integrations.verl import selected_estimator as s; print(s().name)"``.

    Raises:
        ValueError: one line, ``SLCA_ESTIMATOR='...': <what is wrong>``.
    """
    ref = os.environ.get(ESTIMATOR_ENV, ESTIMATOR_NAME)
    try:
        return resolve_estimator(ref)
    except ValueError as e:
        raise ValueError(f"{ESTIMATOR_ENV}={ref!r}: {e}") from None


def selected_options(spec: EstimatorSpec, *, scale: str = "group", eps: float = 1e-6) -> Any:
    """The options object (validated) ``spec`` runs with under verl, from verl's settings and the environment.

    ``scale`` and ``eps`` come from verl (``norm_adv_by_std_in_grpo``, ``epsilon``), every other option of
    the estimator from ``SLCA_ESTIMATOR_OPTIONS`` as ``option=value,option=value`` (the syntax of
    ``slca train --set estimator_options=...``), e.g. ``empty_tool=exclude`` for ``slca`` or
    ``cond_std=subgroup`` for ``slca_cond``; an option not given takes the estimator's default
    (``empty_tool``: ``both``, as in ``slca train`` and TRL). verl's ``AlgoConfig`` takes no extra keys,
    so these travel in the environment; they are parsed and checked by the estimator's options object,
    as ``slca train`` and the TRL trainer do.

    ``SLCA_EMPTY_TOOL=mode`` (before issue 46) still works, as a deprecated spelling of
    ``SLCA_ESTIMATOR_OPTIONS=empty_tool=mode``: a FutureWarning once per process, the value checked
    whatever the estimator and passed to one that takes it.

    Raises:
        ValueError: one line naming the variable, the estimator and the option; or both spellings of
            ``empty_tool`` with different values.
    """
    raw = os.environ.get(OPTIONS_ENV, "")
    try:
        given = parse_options(spec.options, spec.name, split_assignments([x for x in raw.split(",") if x.strip()], OPTIONS_ENV))
    except ValueError as e:
        raise ValueError(f"{OPTIONS_ENV}={raw!r}: {e}") from None
    old = os.environ.get(EMPTY_TOOL_ENV)
    if old is not None:
        given = with_deprecated(spec, given, {"empty_tool": old}, {"empty_tool": EMPTY_TOOL_ENV}, OPTIONS_ENV)
        if EMPTY_TOOL_ENV not in _WARNED:
            _WARNED.add(EMPTY_TOOL_ENV)
            warnings.warn(f"{EMPTY_TOOL_ENV} is deprecated: set {OPTIONS_ENV}=empty_tool={old} instead (with the "
                          "estimator's other options, comma-separated)", FutureWarning, stacklevel=2)
    try:
        where = {"scale": "verl's algorithm.norm_adv_by_std_in_grpo", "eps": "verl's epsilon"}
        return spec.host_options({"scale": scale, "eps": eps}, given, where)
    except ValueError as e:
        raise ValueError(f"{OPTIONS_ENV}={raw!r}: {e}") from None


def selected_segmentation(spec: EstimatorSpec) -> str:
    """``SLCA_SEGMENTATION`` (default ``boundary``), checked with the format ``SLCA_TOOL_FORMAT`` and the estimator
    ``spec`` (:func:`slca.chat.spans.check_segmentation`); ValueError, one line, naming the variable otherwise."""
    seg = os.environ.get(SEGMENTATION_ENV, "boundary")
    fmt = os.environ.get(TOOL_FORMAT_ENV, DEFAULT_TOOL_FORMAT)
    try:
        check_segmentation(seg, fmt, spec)
    except ValueError as e:
        raise ValueError(f"{SEGMENTATION_ENV}={seg!r}, {TOOL_FORMAT_ENV}={fmt!r}: {e}") from None
    return seg


def _tokenizer(ref: str) -> Any:
    """The tokenizer ``SLCA_TOKENIZER`` names, loaded once per process (from the local cache first, as verl's workers
    run offline as often as not)."""
    if ref not in _TOKENIZERS:
        from transformers import AutoTokenizer

        try:
            try:
                tok = AutoTokenizer.from_pretrained(ref, local_files_only=True)
            except OSError:
                tok = AutoTokenizer.from_pretrained(ref)
        except Exception as e:  # one line naming the variable: a typo, or a hub id that cannot be had here
            raise ValueError(f"{TOKENIZER_ENV}={ref!r}: the tokenizer does not load ({type(e).__name__}: {e})") from None
        _TOKENIZERS[ref] = (tok, turn_end_ids(tok))
    return _TOKENIZERS[ref]


def turn_end_ids(tok: Any) -> list[int]:
    """The ids that end an assistant turn: the chat template's end-of-turn token (Qwen's ``<|im_end|>``) and eos."""
    ends = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    if getattr(tok, "chat_template", None):
        try:
            ends.add(ChatRenderer(tok).end_of_turn_id())
        except ValueError:  # a template without a single-token end of turn: eos alone (the labels' rule for it: docs)
            pass
    return sorted(ends)


def span_inputs(batch: Any, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) span labels (:func:`slca.chat.spans.span_labels`) of the batch's responses, for ``SLCA_SEGMENTATION=span``
    and ``SLCA_ESTIMATOR=slca_think``: ``batch["responses"]`` decoded with ``SLCA_TOKENIZER`` in ``SLCA_TOOL_FORMAT``.

    Raises:
        ValueError: one line saying what is missing: the token ids (no ``batch``: the estimator was called
            neither by verl's ``compute_advantage`` nor with ``batch=``), or ``SLCA_TOKENIZER``.
    """
    why = f"{SEGMENTATION_ENV}=span or {ESTIMATOR_ENV}=slca_think labels each policy token reasoning / call / text from the token ids"
    ids = None
    if batch is not None:
        try:
            ids = batch["responses"]
        except (KeyError, TypeError, IndexError):
            ids = None
    if ids is None:
        raise ValueError(f"{why}, which the estimator was not handed: it reads batch['responses'] from verl's "
                         "compute_advantage when that is its caller, or from batch= (upstream PR #7473); called "
                         "otherwise, pass batch={'responses': ids}")
    ref = os.environ.get(TOKENIZER_ENV, "")
    if not ref:
        raise ValueError(f"{why}, with a tokenizer verl does not hand the estimator: set {TOKENIZER_ENV} to the policy's "
                         "model folder or hub id (where Ray starts, like SLCA_ESTIMATOR)")
    ids = torch.as_tensor(ids)
    if tuple(ids.shape) != tuple(response_mask.shape):
        raise ValueError(f"batch['responses'] {tuple(ids.shape)} and response_mask {tuple(response_mask.shape)} must have the same shape")
    tok, eot = _tokenizer(ref)
    return span_labels(ids, response_mask, tokenizer=tok, fmt=os.environ.get(TOOL_FORMAT_ENV, DEFAULT_TOOL_FORMAT), end_of_turn=eot)


def register() -> None:
    """Register :func:`compute_slca_outcome_advantage` as verl's ``slca`` (idempotent).

    Raises ValueError (from verl) if a different function already holds the name.
    """
    from verl.trainer.ppo import core_algos

    old = core_algos.ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME)
    fn = compute_slca_outcome_advantage
    same_definition = old is not None and (old.__qualname__, getattr(old, "__code__", None) and old.__code__.co_filename) == (
        fn.__qualname__,
        fn.__code__.co_filename,
    )
    if old is fn or same_definition:
        # this file executed again (a reload, or verl loading it by path as a reward-function module)
        return
    core_algos.register_adv_est(ESTIMATOR_NAME)(fn)


# ---------------------------------------------------------------------- reward function


def _task_from_row(ground_truth: Any, extra_info: Mapping[str, Any] | None):
    """The :class:`slca.types.Task` of a prepared row, from what verl hands a reward function.

    verl passes ``reward_model.ground_truth`` and the row's ``extra_info`` only,
    so ``examples/verl/prepare_data.py`` puts the rest of the task in
    ``extra_info``: ``prompt`` and ``tools`` (JSON), ``meta`` (JSON: the
    reference answer, refusal flag, ...). The row is rebuilt and read with slca's
    own loader (:func:`slca.env.loaders.task_from_row`, format ``verl``), so a
    prepared file loads to the same Task in ``slca train`` and here.
    ``ground_truth`` is a dict (or its JSON) with ``gold_tool_calls`` (a list,
    or its JSON, of steps, each a list of parallel ``{"name", "arguments"}``)
    and ``answer_facts``.
    """
    # the environment and the rewards load on first use: every verl process (each Ray worker) imports this plugin
    from slca.env.loaders import task_from_row

    gt = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth or {})
    gt.setdefault("gold_tool_calls", [])  # no gold: a task that needs no call; the loader decodes a JSON string of it
    info = dict(extra_info or {})
    row = {
        "prompt": info.get("prompt", []),
        "tools": info.get("tools", []),
        "reward_model": {"ground_truth": gt},
        "extra_info": {k: v for k, v in info.items() if k in ("index", "uuid", "kind", "meta")},
    }
    return task_from_row(row, "verl", where=f"verl row {info.get('index', info.get('uuid', '?'))}")


_HEADER = re.compile(r"^\s*(?:assistant|user)[ \t]*(?:\n|$)")
_TRAILER = re.compile(r"(?:^|\n|(?<=</tool_call>))[ \t]*(?:user|assistant)\s*$")


def _turns_from_solution(solution_str: str, fmt: str):
    """Assistant turns and tool results from a decoded multi-turn verl response.

    verl decodes the response with ``skip_special_tokens=True``; with Qwen-style
    templates tool results stay wrapped in ``<tool_response>`` blocks and the role
    headers reduce to ``user`` / ``assistant`` lines, which are stripped here (a
    piece that is only a header, such as the ``assistant`` generation prompt after
    the last tool response of a rollout that never answered, is no turn).
    Calls the environment never answered (the rollout hit verl's turn or length
    limit right after them) get ``ToolResult(ok=False, error=NOT_EXECUTED)``: they
    were not executed, and the execution tier scores them as such. Tool results
    are read as :func:`slca.rewards.turns_from_messages` reads tool messages
    (:func:`slca.rewards.messages.tool_result`).
    """
    from slca.chat import get_format
    from slca.rewards.messages import tool_result

    parser = get_format(fmt)
    pieces = re.split(r"<tool_response>(.*?)</tool_response>", solution_str, flags=re.S)
    texts, responses = pieces[0::2], pieces[1::2]
    turns, final_text = [], ""
    r = 0
    for raw in texts:
        text = raw
        while True:  # headers and trailers, possibly several ("user\n" + "assistant\n" around a response)
            stripped = _TRAILER.sub("", _HEADER.sub("", text))
            if stripped == text:
                break
            text = stripped
        text = text.strip()
        if not text:
            continue
        parsed = parser.parse(text)
        results = []
        if parsed.is_tool_turn:
            n = max(1, len(parsed.calls))
            answered = responses[r : r + n]
            results = [tool_result(body.strip()) for body in answered]
            results += [ToolResult(ok=False, error=NOT_EXECUTED)] * (len(parsed.calls) - len(answered))
            r += n
            final_text = ""
        else:
            final_text = parsed.content
        turns.append(Turn(text=text, parsed=parsed, results=results))
    return turns, final_text


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **_: Any,
) -> dict[str, float]:
    """verl reward function: slca's hierarchical rewards on the paper's row format.

    Returns ``{"score": tool + summary, "tool_reward": ..., "summary_reward": ...,
    <components>}``. ``score`` keeps verl's logging and any non-SLCA estimator
    meaningful; the SLCA agent loop and estimator use the two tiers. verl has no
    channel for "unscored" (NaN) rewards, so a rollout slca cannot score raises
    rather than scoring 0; calls left unanswered at the end of a rollout are
    scored as not executed (see :func:`_turns_from_solution`).

    ``extra_info["tool_call_format"]`` picks the parser (default ``json_list``,
    the paper's system prompt: a JSON list of calls inside one ``<tool_call>``).
    """
    from slca.rewards import execution_reward, summary_reward

    task = _task_from_row(ground_truth, extra_info)
    fmt = str((extra_info or {}).get("tool_call_format", "json_list"))
    turns, final_text = _turns_from_solution(solution_str, fmt)
    ex = execution_reward(task, turns)
    su = summary_reward(task, turns, final_text)
    if np.isnan(ex.total) or np.isnan(su.total):
        raise ValueError(f"rollout of task {task.id!r} ({data_source}) cannot be scored: {ex.reason or su.reason}")
    out = {"score": float(ex.total + su.total), TOOL_KEY: float(ex.total), SUMMARY_KEY: float(su.total)}
    out.update({f"exec/{k}": float(v) for k, v in ex.components.items()})
    out.update({f"summary/{k}": float(v) for k, v in su.components.items()})
    out.update(_scalar_inputs(task, turns, final_text))
    return out


def _scalar_inputs(task: Any, turns: list[Turn], final_text: str) -> dict[str, float]:
    """The per-rollout inputs the selected estimator needs (``SLCA_ESTIMATOR``'s spec ``needs``), under their own
    names, for verl's ``reward_extra_info``: those slca computes from a trajectory as one number per rollout
    (``should_no_call``, ``toolpo_correct_ratio``, the ``rltr_*`` terms). Others (``tool_signatures``,
    ``turn_rewards``) are not numbers and stay the user's reward function's to add."""
    try:
        needs = selected_estimator().needs
    except ValueError:
        return {}  # the estimator raises this itself, where verl runs it
    traj = Trajectory(task=task, prompt_ids=[], response_ids=[], model_mask=[], logprobs=[], turns=turns,
                      final_text=final_text, stop_reason="final_answer" if final_text else "max_turns")
    out: dict[str, float] = {}
    for n in needs:
        spec = get_input(n)
        if spec.compute is None:
            continue
        value = spec.from_trajectories([traj])
        if isinstance(value, torch.Tensor) and value.shape == (1,):
            out[n] = float(value[0])
    return out


def _warn_if_unresolvable() -> None:
    """At ``import verl`` (this plugin's import, before any model loads): a ``SLCA_ESTIMATOR`` that cannot be
    resolved is logged as a warning now. verl ignores a plugin that raises, so the error itself is raised
    where the estimator runs (:func:`selected_estimator`)."""
    if not {ESTIMATOR_ENV, OPTIONS_ENV, EMPTY_TOOL_ENV, SEGMENTATION_ENV, TOOL_FORMAT_ENV} & set(os.environ):
        return
    try:
        selected_options(selected_estimator())
        selected_segmentation(selected_estimator())
    except ValueError as e:
        logging.getLogger(__name__).warning("%s (adv_estimator=slca will raise this on the first batch)", e)


register()
_warn_if_unresolvable()
