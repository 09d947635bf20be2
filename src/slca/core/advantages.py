"""Group-relative advantages: the math of GRPO, SLCA and GDPO.

All functions are pure: tensors in, tensors out, no config objects. The estimator
registry that dispatches to them by name is :mod:`slca.core.registry`; the estimators
beyond the paper (``slca_cond``, ``slca_turn``) are :mod:`slca.core.beyond`, the
authors' released ones :mod:`slca.core.paper`.

Shapes: ``B`` rollouts (prompts x G samples), ``T`` response tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index
from slca.core.segments import last_tool_turn

__all__ = [
    "SCALES",
    "EMPTY_TOOL_MODES",
    "EMPTY_SUMMARY_MODES",
    "EMPTY_TOOL_DEFAULT",
    "EMPTY_SUMMARY_DEFAULT",
    "EPS",
    "group_mean",
    "group_normalize",
    "grpo_advantages",
    "slca_advantages",
    "gdpo_advantages",
]

SCALES = ("group", "batch", "none")
EMPTY_TOOL_MODES = ("response", "include", "exclude", "both")
EMPTY_SUMMARY_MODES = ("drop", "last_turn")
EMPTY_TOOL_DEFAULT = "both"
"""What every host does by default with a rollout that made no call (docs/beyond.md, "Segments that are missing")."""
EMPTY_SUMMARY_DEFAULT = "last_turn"
"""What every host does by default with a rollout that never answered (same section)."""
EPS = 1e-6
"""The default ``eps`` added to a std in every normalisation of the core (verl's GRPO uses the same; TRL's own, 1e-4,
is ``slca.integrations.trl.TRL_EPS``, so that ``grpo`` there equals TRL's advantages)."""


def _group_stats(r: torch.Tensor, idx: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group count, mean and unbiased std over the non-NaN entries.

    Args:
        r: (B,) rewards, NaN = missing.
        idx: (B,) dense group index in ``[0, n_groups)``.

    Returns:
        ``count (G,)``, ``mean (G,)``, ``std (G,)`` (std is NaN where count < 2).
    """
    valid = ~torch.isnan(r)
    rv = torch.where(valid, r, torch.zeros_like(r)).double()
    cnt = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, valid.double())
    s = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, rv)
    mean = s / cnt.clamp_min(1)
    dev = torch.where(valid, rv - mean[idx], torch.zeros_like(rv))
    ss = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, idx, dev * dev)
    var = ss / (cnt - 1)  # unbiased, as torch.std; inf/NaN where cnt < 2
    std = torch.where(cnt >= 2, var.clamp_min(0).sqrt(), torch.full_like(var, float("nan")))
    return cnt, mean, std


def group_mean(rewards: torch.Tensor, group_ids: Any) -> torch.Tensor:
    """Each rollout's group mean over the valid (non-NaN) rewards; NaN where the reward is NaN.

    Args:
        rewards: (B,) float, NaN = missing.
        group_ids: (B,) group ids (tensor or sequence of hashables).

    Returns:
        (B,) float32.

    Example:
        >>> group_mean(torch.tensor([1.0, 0.0, float("nan"), 5.0]), [0, 0, 0, 1]).tolist()
        [0.5, 0.5, nan, 5.0]
    """
    r = as_1d("rewards", rewards)
    idx, G = group_index(group_ids, r.shape[0])
    _, mean, _ = _group_stats(r.detach().cpu(), idx.cpu(), G)
    m = mean[idx.cpu()].float().to(r.device)
    return torch.where(torch.isnan(r), r, m)


def group_normalize(
    rewards: torch.Tensor,
    group_ids: Any,
    *,
    scale: str = "group",
    eps: float = EPS,
) -> torch.Tensor:
    """GRPO's group-relative normalisation (DeepSeekMath, arXiv 2402.03300, Eq. 3).

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``mean_g``, ``std_g`` (unbiased,
    as ``torch.std``) over the members of rollout ``i``'s group.

    * ``scale="group"``: divide by the group's std (GRPO);
    * ``scale="batch"``: divide by the std of all valid rewards in the batch
      (TRL's ``scale_rewards="batch"``);
    * ``scale="none"``: centre only (Dr. GRPO, arXiv 2503.20783).

    A NaN reward (a rollout that could not be scored) is left out of its group's
    statistics and gets advantage 0. A group with fewer than two valid members
    gets 0 (there is nothing to compare against).

    Args:
        rewards: (B,) float.
        group_ids: (B,) integer tensor or a length-B sequence of hashable ids.

    Returns:
        (B,) float32 advantages.

    Example:
        >>> [round(a, 4) for a in group_normalize(torch.tensor([1.0, 0.0, 5.0]), [0, 0, 1]).tolist()]
        [0.7071, -0.7071, 0.0]
    """
    r = as_1d("rewards", rewards)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    idx, G = group_index(group_ids, r.shape[0])
    idx = idx.to(r.device)
    cnt, mean, std = _group_stats(r.cpu(), idx.cpu(), G)
    cnt, mean, std = cnt.to(r.device), mean.to(r.device), std.to(r.device)
    return _scaled(r, r.double() - mean[idx], std[idx], cnt[idx], scale, eps)


def _scaled(r: torch.Tensor, centred: torch.Tensor, std: torch.Tensor, count: torch.Tensor, scale: str, eps: float) -> torch.Tensor:
    """Centred rewards scaled as ``scale`` says; 0 where the reward is NaN, its group has < 2 members, or not finite.

    Args:
        r: (N,) rewards (NaN = missing); centred: (N,) float64 ``r - baseline``;
        std: (N,) float64 std of each entry's group; count: (N,) valid members of its group.

    Returns:
        (N,) float32: ``centred / (std + eps)`` (``"group"``), ``centred / (batch std + eps)``
        (``"batch"``, std of all valid ``r``) or ``centred`` (``"none"``).
    """
    valid = ~torch.isnan(r)
    if scale == "group":
        adv = centred / (std + eps)
    elif scale == "batch":
        rv = r[valid].double()
        bstd = rv.std() if rv.numel() >= 2 else torch.tensor(float("nan"), dtype=torch.float64, device=r.device)
        adv = centred / (bstd + eps)
    else:
        adv = centred
    keep = valid & (count >= 2) & torch.isfinite(adv)
    return torch.where(keep, adv, torch.zeros_like(adv)).float()


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Any,
    response_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = EPS,
) -> torch.Tensor:
    """Plain GRPO: one trajectory-level advantage broadcast to every policy token.

    Equal to verl's ``compute_grpo_outcome_advantage`` (with ``scores =
    rewards``) for groups of two or more.

    Args:
        rewards: (B,) total reward per rollout.
        group_ids: (B,) group ids (tensor or sequence).
        response_mask: (B, T) 0/1, 1 on tokens that receive the advantage.

    Returns:
        (B, T) float32, zero where ``response_mask`` is 0.
    """
    m = check_mask("response_mask", as_2d("response_mask", response_mask))
    a = group_normalize(as_1d("rewards", rewards, m.shape[0]), group_ids, scale=scale, eps=eps)
    return a.to(m.device).unsqueeze(1) * m.float()


def slca_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    group_ids: Any,
    tool_mask: torch.Tensor,
    summary_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = EPS,
    empty_tool: str = EMPTY_TOOL_DEFAULT,
    empty_summary: str = EMPTY_SUMMARY_DEFAULT,
) -> torch.Tensor:
    """Segment-Locked Credit Assignment (SLCA-GRPO, arXiv 2609.29050, Eq. 6-8).

    ``A^tool_i = norm_g(r^tool)_i`` goes only to rollout ``i``'s tool tokens and
    ``A^sum_i = norm_g(r^sum)_i`` only to its summary tokens; each reward is
    normalised within the group on its own (:func:`group_normalize`), so a change
    in one rollout's summary reward cannot move any tool-token advantage and vice
    versa.

    ``empty_tool`` decides what happens to a rollout whose tool segment is empty
    (it made no call, so ``tool_mask`` is all 0 on its row):

    * ``"response"`` (the default until issue 26): its tool reward takes part in
      the tool group's statistics, and its policy tokens (all in its summary mask)
      get the mean of its two advantages, ``(A^tool_i + A^sum_i) / 2``: the only
      tool decision such a rollout made was *not to call*, and that decision lives
      in those tokens. The mean keeps its per-token scale equal to the other
      rollouts', but halves the tool verdict on that decision (a biased baseline,
      factor ``1 - p/2``; docs/beyond.md).
    * ``"include"``: its tool reward takes part in the statistics (so it still
      moves the baseline of the others) but its tool advantage has no token to go
      to and is dropped (the paper's literal rule).
    * ``"exclude"``: its tool reward is left out of the tool group's statistics
      (as if NaN), so it moves nobody's tool advantage.
    * ``"both"`` (default): its tool reward counts in the statistics (as ``"include"``) and
      its policy tokens get the sum ``A^tool_i + A^sum_i``: each tier's advantage
      in full, as on the tokens of a rollout that called. The decision not to call
      then gets the tool tier's verdict with the weight the decision to call gets,
      which is what makes the tool baseline action-independent at that decision
      (``"response"`` halves it, ``"include"`` drops it: docs/beyond.md,
      "Segments that are missing").

    ``empty_summary`` decides what happens to a rollout with a tool segment but
    an empty summary segment (it stopped at ``max_turns``, or at the token budget
    right after a tool response: no final answer; its summary reward, 0 for an
    empty answer, counts in the summary group's statistics either way):

    * ``"drop"`` (the default until issue 26): its summary advantage has no token
      to go to and is dropped, so the summary baseline is subtracted on the
      answering branch only (biased, factor ``1 - p``; docs/beyond.md).
    * ``"last_turn"`` (default): its summary advantage is added, in full, to the tokens of
      its last tool turn (the turn that called instead of answering), on top of
      their tool advantage. This is the summary tier's verdict on not answering,
      on the tokens that decided it (docs/beyond.md, "Segments that are
      missing"); it is the one place where a summary reward reaches tool tokens.

    Args:
        tool_rewards: (B,) execution-tier reward per rollout (NaN = unscored).
        summary_rewards: (B,) summary-tier reward per rollout (NaN = unscored).
        group_ids: (B,) group ids (tensor or sequence of hashables).
        tool_mask: (B, T) 0/1 execution-segment tokens (from :func:`segment_masks`).
        summary_mask: (B, T) 0/1 summary-segment tokens; disjoint from ``tool_mask``.

    Returns:
        (B, T) float32 advantages, zero outside ``tool_mask | summary_mask``.
    """
    tm, sm, rt, rs = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool, empty_summary)
    a_sum = group_normalize(rs, group_ids, scale=scale, eps=eps)  # (B,)
    return _route(rt, a_sum, group_ids, tm, sm, scale, eps, empty_tool, empty_summary)


def _route(
    rt: torch.Tensor, a_sum: torch.Tensor, group_ids: Any, tm: torch.Tensor, sm: torch.Tensor, scale: str, eps: float,
    empty_tool: str, empty_summary: str = EMPTY_SUMMARY_DEFAULT,
    think: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """SLCA's routing: the normalised tool reward to tool tokens, ``a_sum`` (B,) to summary tokens.

    ``rt`` (B,) are the raw tool rewards (normalised here, with ``empty_tool``'s
    rule for rollouts without a tool segment); ``tm``, ``sm`` (B, T) the
    segments; ``empty_summary`` the rule for rollouts without a summary segment.
    ``think``: ``(think_mask (B, T) bool, a subset of tm; think_rewards (B,) or None)``:
    those tool tokens get the reasoning tier's advantage instead (its rewards
    normalised as the tool tier's, ``empty_tool`` included; None: the tool tier's
    advantage itself, so the result is the one without ``think``).
    Returns (B, T) float32.
    """
    has_tool = tm.any(dim=1)  # (B,)
    if empty_tool == "exclude":
        rt = torch.where(has_tool, rt, torch.full_like(rt, float("nan")))
    a_tool = group_normalize(rt, group_ids, scale=scale, eps=eps)  # (B,)
    tool_tok = a_tool.unsqueeze(1)  # (B, 1), or (B, T) with a reasoning tier
    if think is not None and think[1] is not None:
        th, rk = think
        if empty_tool == "exclude":
            rk = torch.where(has_tool, rk, torch.full_like(rk, float("nan")))
        a_think = group_normalize(rk, group_ids, scale=scale, eps=eps)  # (B,)
        tool_tok = torch.where(th, a_think.unsqueeze(1), tool_tok)
    adv = tool_tok * tm.float() + a_sum.unsqueeze(1) * sm.float()
    if empty_tool in ("response", "both"):
        mixed = 0.5 * (a_tool + a_sum) if empty_tool == "response" else a_tool + a_sum  # (B,)
        adv = torch.where(has_tool.unsqueeze(1), adv, mixed.unsqueeze(1) * sm.float())
    if empty_summary == "last_turn":
        last = last_tool_turn(tm) & ~sm.any(dim=1, keepdim=True)  # (B, T): rows without a summary segment
        adv = adv + a_sum.unsqueeze(1) * last.float()
    return adv


def gdpo_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    group_ids: Any,
    response_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = EPS,
) -> torch.Tensor:
    """GDPO-style decoupled normalisation, then one scalar per rollout.

    ``A_i = norm_g(r^tool)_i + norm_g(r^sum)_i`` broadcast to every policy token
    (TRL's ``multi_objective_aggregation="normalize_then_sum"``). It balances the
    two rewards' scales like SLCA but does not route them: the control that tells
    normalisation apart from locking.

    Returns:
        (B, T) float32, zero where ``response_mask`` is 0.
    """
    m = check_mask("response_mask", as_2d("response_mask", response_mask))
    B = m.shape[0]
    a = group_normalize(as_1d("tool_rewards", tool_rewards, B), group_ids, scale=scale, eps=eps) + group_normalize(
        as_1d("summary_rewards", summary_rewards, B), group_ids, scale=scale, eps=eps
    )
    return a.to(m.device).unsqueeze(1) * m.float()


def _segment_checks(
    tool_rewards: Any, summary_rewards: Any, tool_mask: Any, summary_mask: Any, empty_tool: str, empty_summary: str = EMPTY_SUMMARY_DEFAULT
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated ``(tool_mask, summary_mask, tool_rewards, summary_rewards)`` as in :func:`slca_advantages`."""
    tm = check_mask("tool_mask", as_2d("tool_mask", tool_mask))
    sm = check_mask("summary_mask", as_2d("summary_mask", summary_mask))
    check_same_shape(tool_mask=tm, summary_mask=sm)
    if (tm & sm).any():
        raise ValueError("tool_mask and summary_mask overlap: a token belongs to one segment only")
    if empty_tool not in EMPTY_TOOL_MODES:
        raise ValueError(f"empty_tool must be one of {EMPTY_TOOL_MODES}, got {empty_tool!r}")
    if empty_summary not in EMPTY_SUMMARY_MODES:
        raise ValueError(f"empty_summary must be one of {EMPTY_SUMMARY_MODES}, got {empty_summary!r}")
    B = tm.shape[0]
    rt = as_1d("tool_rewards", tool_rewards, B).to(tm.device)
    rs = as_1d("summary_rewards", summary_rewards, B).to(tm.device)
    return tm, sm, rt, rs
