"""Beyond SLCA: estimators for its known limits (docs/beyond.md).

``slca_cond``: a summary baseline conditioned on the tool outcome (the summary group
mixes rollouts whose tool segments diverged); ``slca_turn``: per-turn credit inside
the tool segment (one scalar per segment cannot tell a good first call from a bad
second one); ``slca_think``: the reasoning before a call as a third segment with its
own tier (the paper's tool segment includes reasoning). Each reduces exactly to
:func:`slca.core.advantages.slca_advantages` when its extra term is switched off.
Their inputs (``tool_signatures``, ``turn_rewards``) are computed by
:mod:`slca.rewards.turns`; ``span_labels`` by the host from the token ids
(:func:`slca.chat.spans.span_labels`).

Shapes: ``B`` rollouts (prompts x G samples), ``T`` response tokens.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index
from slca.core.advantages import (
    EMPTY_SUMMARY_DEFAULT,
    EMPTY_TOOL_DEFAULT,
    EPS,
    SCALES,
    _group_stats,
    _route,
    _scaled,
    _segment_checks,
    group_normalize,
    slca_advantages,
)
from slca.core.registry import (
    AdvantageInputs,
    InputSpec,
    NonNegative,
    SLCAOptions,
    option,
    register_estimator,
    register_input,
)
from slca.core.segments import think_mask, tool_turn_index

__all__ = [
    "COND_STDS",
    "conditional_normalize",
    "slca_cond_advantages",
    "turn_normalize",
    "slca_turn_advantages",
    "SLCACondOptions",
    "SLCATurnOptions",
    "slca_think_advantages",
    "THINK_REWARDS",
]

THINK_REWARDS = "think_rewards"
"""The name of the reasoning tier's reward, an optional (B,) input of ``slca_think`` (:func:`_slca_think`)."""


COND_STDS = ("group", "subgroup")


def conditional_normalize(
    rewards: torch.Tensor,
    group_ids: Any,
    signatures: Sequence[Hashable | None],
    *,
    scale: str = "group",
    eps: float = EPS,
    cond_std: str = "group",
) -> torch.Tensor:
    """Group-relative normalisation with a baseline conditioned on a per-rollout signature.

    Rollout ``i`` of group ``g`` with signature ``s_i`` belongs to the sub-group
    ``S(i) = {j in g : s_j = s_i}``. With ``n_S`` its valid (non-NaN) members:

        ``b_i = mean_{S(i)} r``  if ``n_S >= 2``, else ``mean_g r``  (fallback),
        ``A_i = (r_i - b_i) / (sigma_i + eps)``,

    where ``sigma_i`` is, for ``scale="group"``, the std of the whole group ``g``
    (``cond_std="group"``, default) or of ``S(i)`` (``cond_std="subgroup"``, full
    normalisation inside the sub-group; ``g``'s std on fallback);
    for ``scale="batch"`` the batch std; ``scale="none"`` only centres.
    Stds are unbiased as ``torch.std``. The default keeps the group's scale so a
    sub-group of two with a tiny reward gap is not blown up to ``+-0.71``: the
    sub-group only changes the baseline (a state-dependent baseline: the tool
    outcome is fixed before the summary is written).

    A signature ``None`` means unknown: that rollout always uses the fallback.
    NaN rewards get 0 and are left out of every statistic; a group with fewer than
    two valid members gives 0. If every rollout of a group has the same signature,
    the result equals :func:`group_normalize` of that group.

    Args:
        rewards: (B,) float, NaN = missing.
        group_ids: (B,) group ids (tensor or sequence of hashables).
        signatures: length-B sequence of hashables or None.

    Returns:
        (B,) float32.

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.5, 0.0])
        >>> conditional_normalize(r, [0] * 4, ["a", "a", "b", "b"], scale="none").tolist()
        [0.5, -0.5, 0.25, -0.25]
    """
    r = as_1d("rewards", rewards)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if cond_std not in COND_STDS:
        raise ValueError(f"cond_std must be one of {COND_STDS}, got {cond_std!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    B = r.shape[0]
    if isinstance(signatures, (str, bytes)) or not hasattr(signatures, "__len__"):
        raise ValueError(f"signatures must be a sequence of hashables, got {type(signatures).__name__}")
    sigs = list(signatures)
    if len(sigs) != B:
        raise ValueError(f"signatures has length {len(sigs)}, expected {B} (one per rollout)")
    idx_g, G = group_index(group_ids, B)
    idx_g = idx_g.cpu()
    sub_keys = [(int(g), 0, s) if s is not None else (int(g), 1, i) for i, (g, s) in enumerate(zip(idx_g.tolist(), sigs))]
    try:
        idx_s, S = group_index(sub_keys, B)
    except ValueError as e:
        raise ValueError("signatures must be hashable") from e
    rc = r.detach().cpu()
    cnt_g, mean_g, std_g = _group_stats(rc, idx_g, G)
    cnt_s, mean_s, std_s = _group_stats(rc, idx_s, S)
    use_sub = cnt_s[idx_s] >= 2
    base = torch.where(use_sub, mean_s[idx_s], mean_g[idx_g])
    sd = torch.where(use_sub, std_s[idx_s], std_g[idx_g]) if cond_std == "subgroup" else std_g[idx_g]
    return _scaled(rc, rc.double() - base, sd, cnt_g[idx_g], scale, eps).to(r.device)


def slca_cond_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    group_ids: Any,
    tool_signatures: Sequence[Hashable | None],
    tool_mask: torch.Tensor,
    summary_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = EPS,
    empty_tool: str = EMPTY_TOOL_DEFAULT,
    cond_std: str = "group",
    empty_summary: str = EMPTY_SUMMARY_DEFAULT,
) -> torch.Tensor:
    """SLCA with a summary baseline conditioned on the tool outcome (``slca_cond``).

    SLCA's summary group mixes rollouts whose tool segments diverged, so a summary
    written from failed calls is judged against summaries that had the right
    tool results (a grouping bias: the summary advantage partly rewards the tool
    segment). Here

        ``A^tool_i = norm_g(r^tool)_i``                       (exactly as SLCA),
        ``A^sum_i  = (r^sum_i - b_i) / (sigma_i + eps)``      (:func:`conditional_normalize`),

    with ``b_i`` the mean summary reward of the rollouts of the same task with
    the same tool signature (falling back to the whole group when that sub-group
    has fewer than two valid members). Routing, ``empty_tool``, ``empty_summary`` and NaN handling
    are those of :func:`slca_advantages`, so locking holds unchanged: tool
    rewards never reach summary tokens (beyond SLCA's own ``"response"`` mix on
    rollouts without a tool segment), and summary rewards never reach tool tokens.
    With one signature per group it equals :func:`slca_advantages`.

    Args:
        tool_rewards: (B,) execution-tier reward (NaN = unscored).
        summary_rewards: (B,) summary-tier reward (NaN = unscored).
        group_ids: (B,) group ids.
        tool_signatures: length-B hashables (None = unknown, use the group).
        tool_mask, summary_mask: (B, T) 0/1, disjoint.

    Returns:
        (B, T) float32, zero outside ``tool_mask | summary_mask``.
    """
    tm, sm, rt, rs = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool, empty_summary)
    a_sum = conditional_normalize(rs, group_ids, tool_signatures, scale=scale, eps=eps, cond_std=cond_std).to(tm.device)
    return _route(rt, a_sum, group_ids, tm, sm, scale, eps, empty_tool, empty_summary)


def turn_normalize(turn_rewards: torch.Tensor, group_ids: Any, *, scale: str = "group", eps: float = EPS) -> torch.Tensor:
    """Per-turn group normalisation (MT-GRPO, arXiv 2505.11821): turn ``k`` against turn ``k``.

    ``A_{i,k} = norm_{(g, k)}(r)_{i,k}``: :func:`group_normalize` over the valid
    entries ``{r_{j,k} : j in g(i)}`` of the same group and the same turn index.
    A NaN entry (rollout ``i`` has no turn ``k``, or it was not scored) gets 0
    and is left out; a (group, turn) cell with fewer than two valid members gives 0.
    ``scale="batch"`` divides by the std of all valid turn rewards of the batch.

    Args:
        turn_rewards: (B, K) float, NaN = missing.
        group_ids: (B,) group ids.

    Returns:
        (B, K) float32.
    """
    r = as_2d("turn_rewards", turn_rewards)
    if not torch.is_floating_point(r):
        r = r.float()
    B, K = r.shape
    if K == 0:
        return torch.zeros(B, 0, device=r.device)
    idx, _ = group_index(group_ids, B)
    cell = idx.cpu().unsqueeze(1) * K + torch.arange(K).unsqueeze(0)  # (B, K) dense (group, turn) id
    a = group_normalize(r.reshape(-1), cell.reshape(-1), scale=scale, eps=eps)
    return a.reshape(B, K)


def slca_turn_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    turn_rewards: torch.Tensor,
    group_ids: Any,
    tool_mask: torch.Tensor,
    summary_mask: torch.Tensor,
    turn_index: torch.Tensor,
    *,
    turn_lambda: float = 1.0,
    scale: str = "group",
    eps: float = EPS,
    empty_tool: str = EMPTY_TOOL_DEFAULT,
    empty_summary: str = EMPTY_SUMMARY_DEFAULT,
) -> torch.Tensor:
    """SLCA with temporal credit inside the tool segment (``slca_turn``).

    One scalar per tool segment cannot tell a good first call from a bad second
    call. With per-turn execution scores ``r_{i,k}`` (turn ``k`` of rollout ``i``),
    normalised per group and turn index (:func:`turn_normalize`):

        ``A_{i,t} = A^tool_i + lambda * A^turn_{i,k(i,t)}``   on tool tokens of turn ``k``,
        ``A_{i,t} = A^sum_i``                                  on summary tokens,

    where ``A^tool``, ``A^sum`` (and the ``empty_tool`` / ``empty_summary`` handling) are exactly
    :func:`slca_advantages`'s. The segment-level term keeps what only the whole
    segment shows (efficiency, completeness); the turn term moves credit between
    turns. Locking is unchanged: summary rewards never reach tool tokens, turn
    rewards never reach summary tokens; ``lambda = 0`` (or turn rewards constant
    per group and turn index) gives :func:`slca_advantages`.

    A tool token whose turn index is ``>= K`` or whose turn reward is NaN gets
    no turn term.

    Args:
        tool_rewards: (B,) execution-tier reward.
        summary_rewards: (B,) summary-tier reward.
        turn_rewards: (B, K) per-turn execution scores, NaN = missing turn.
        group_ids: (B,) group ids.
        tool_mask, summary_mask: (B, T) 0/1, disjoint.
        turn_index: (B, T) integer, the tool turn of each tool token (-1 elsewhere;
            :func:`slca.core.segments.turn_index`). Only its values on tool tokens are read.
        turn_lambda: weight of the turn term (finite).

    Returns:
        (B, T) float32, zero outside ``tool_mask | summary_mask``.
    """
    tm, sm, _, _ = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool, empty_summary)
    B, T = tm.shape
    if not (isinstance(turn_lambda, (int, float)) and math.isfinite(turn_lambda)):
        raise ValueError(f"turn_lambda must be a finite number, got {turn_lambda!r}")
    rk = as_2d("turn_rewards", turn_rewards)
    if rk.shape[0] != B:
        raise ValueError(f"turn_rewards has {rk.shape[0]} rows, expected {B} (one per rollout)")
    ti = as_2d("turn_index", turn_index)
    check_same_shape(tool_mask=tm, turn_index=ti)
    if torch.is_floating_point(ti) or ti.dtype == torch.bool:
        raise ValueError(f"turn_index must be an integer tensor, got {ti.dtype}")
    ti = ti.to(tm.device).long()
    if (tm & (ti < 0)).any():
        raise ValueError("turn_index is negative on a tool token: every tool token needs its turn (0, 1, ...)")
    base = slca_advantages(
        tool_rewards, summary_rewards, group_ids, tm, sm, scale=scale, eps=eps, empty_tool=empty_tool,
        empty_summary=empty_summary,
    )
    K = rk.shape[1]
    if K == 0 or turn_lambda == 0:
        return base
    a_turn = turn_normalize(rk, group_ids, scale=scale, eps=eps).to(tm.device)  # (B, K)
    on = tm & (ti < K)
    per_tok = a_turn.gather(1, ti.clamp(0, K - 1))  # (B, T)
    return base + float(turn_lambda) * torch.where(on, per_tok, torch.zeros_like(per_tok))


@dataclass(frozen=True)
class SLCACondOptions(SLCAOptions):
    """Options of :func:`slca_cond_advantages`."""

    cond_std: Literal[COND_STDS] = option("group", "slca_cond: std of the conditioned summary normalisation, the whole "
                                          "group's ('group') or the tool-outcome subgroup's ('subgroup'; see conditional_normalize).")


@dataclass(frozen=True)
class SLCATurnOptions(SLCAOptions):
    """Options of :func:`slca_turn_advantages`."""

    turn_lambda: NonNegative = option(1.0, "slca_turn: weight of the per-turn advantage added on each tool turn's tokens "
                                      "(beyond the paper, docs/beyond.md).")


@register_estimator("slca_cond", needs=("tool_signatures",), options=SLCACondOptions)
def _slca_cond(inputs: AdvantageInputs, *, scale: str, eps: float, empty_tool: str, cond_std: str,
               empty_summary: str) -> torch.Tensor:
    """SLCA with the summary baseline conditioned on the tool outcome."""
    return slca_cond_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.tool_signatures, inputs.tool_mask,
        inputs.summary_mask, scale=scale, eps=eps, empty_tool=empty_tool, cond_std=cond_std, empty_summary=empty_summary,
    )


@register_estimator("slca_turn", needs=("turn_rewards",), options=SLCATurnOptions)
def _slca_turn(inputs: AdvantageInputs, *, scale: str, eps: float, empty_tool: str, turn_lambda: float,
               empty_summary: str) -> torch.Tensor:
    """SLCA plus a per-turn execution advantage on each tool turn's tokens."""
    ti = inputs.turn_index
    if ti is None:
        ti = tool_turn_index(inputs.model_mask, inputs.tool_mask)
    return slca_turn_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.turn_rewards, inputs.group_ids, inputs.tool_mask,
        inputs.summary_mask, ti, turn_lambda=turn_lambda, scale=scale, eps=eps, empty_tool=empty_tool,
        empty_summary=empty_summary,
    )


def slca_think_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    group_ids: Any,
    tool_mask: torch.Tensor,
    summary_mask: torch.Tensor,
    think_mask: torch.Tensor,
    *,
    think_rewards: torch.Tensor | None = None,
    scale: str = "group",
    eps: float = EPS,
    empty_tool: str = EMPTY_TOOL_DEFAULT,
    empty_summary: str = EMPTY_SUMMARY_DEFAULT,
) -> torch.Tensor:
    """SLCA with three segments: reasoning, call, summary (``slca_think``).

    The paper puts the reasoning before a call in the tool segment. Here the
    reasoning tokens of the execution segment (``think_mask``,
    :func:`slca.core.segments.think_mask`) form a segment of their own with its own
    tier:

        ``A_{i,t} = norm_g(r^think)_i``   on reasoning tokens of the execution segment,
        ``A_{i,t} = norm_g(r^tool)_i``    on its other tokens (the calls),
        ``A_{i,t} = norm_g(r^sum)_i``     on summary tokens,

    each normalised within the group on its own (:func:`group_normalize`), with
    ``empty_tool`` / ``empty_summary`` and NaN handling as in :func:`slca_advantages`
    (the reasoning tier is left out of its statistics where the tool tier is, under
    ``empty_tool="exclude"``; ``empty_summary="last_turn"`` adds the summary
    advantage to the whole last tool turn, reasoning included). Reasoning in the
    summary segment stays summary: it is the thinking that writes the answer, which
    the summary tier judges.

    ``think_rewards`` None inherits the call tier: ``r^think = r^tool``, so every
    token gets exactly :func:`slca_advantages`'s advantage (bit for bit).

    Args:
        tool_rewards: (B,) execution-tier reward (NaN = unscored).
        summary_rewards: (B,) summary-tier reward (NaN = unscored).
        group_ids: (B,) group ids.
        tool_mask, summary_mask: (B, T) 0/1, disjoint.
        think_mask: (B, T) 0/1 reasoning tokens, a subset of ``tool_mask``.
        think_rewards: (B,) reasoning-tier reward (NaN = unscored), or None.

    Returns:
        (B, T) float32, zero outside ``tool_mask | summary_mask``.
    """
    tm, sm, rt, rs = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool, empty_summary)
    th = check_mask("think_mask", as_2d("think_mask", think_mask)).to(tm.device)
    check_same_shape(tool_mask=tm, think_mask=th)
    if (th & ~tm).any():
        raise ValueError("think_mask has 1 outside tool_mask: reasoning tokens of the summary segment stay summary "
                         "(slca.core.segments.think_mask)")
    rk = None if think_rewards is None else as_1d("think_rewards", think_rewards, tm.shape[0]).to(tm.device)
    a_sum = group_normalize(rs, group_ids, scale=scale, eps=eps)
    return _route(rt, a_sum, group_ids, tm, sm, scale, eps, empty_tool, empty_summary, think=(th, rk))


SPAN_LABELS_INPUT = register_input(InputSpec(
    "span_labels", "(B, T) int: each response token's span label (slca.core.segments.SPAN_*: text, think, call; 0 off "
    "policy tokens), computed by the host from the token ids with its tokenizer (slca.chat.spans.span_labels)"))


@register_estimator("slca_think", needs=("span_labels",), options=SLCAOptions)
def _slca_think(inputs: AdvantageInputs, *, scale: str, eps: float, empty_tool: str, empty_summary: str) -> torch.Tensor:
    """SLCA with the reasoning before a call as its own segment (reward: think_rewards, else the call tier's)."""
    return slca_think_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.tool_mask, inputs.summary_mask,
        think_mask(inputs.tool_mask, inputs.span_labels), think_rewards=inputs.get(THINK_REWARDS), scale=scale, eps=eps,
        empty_tool=empty_tool, empty_summary=empty_summary,
    )
