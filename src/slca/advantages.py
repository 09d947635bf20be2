"""Group-relative advantages and the estimator registry.

All functions are pure: tensors in, tensors out, no config objects.

Shapes: ``B`` rollouts (prompts x G samples), ``T`` response tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index

__all__ = [
    "SCALES",
    "EMPTY_TOOL_MODES",
    "group_normalize",
    "grpo_advantages",
    "slca_advantages",
    "gdpo_advantages",
    "AdvantageInputs",
    "Estimator",
    "register_estimator",
    "get_estimator",
    "list_estimators",
    "compute_advantages",
]

SCALES = ("group", "batch", "none")
EMPTY_TOOL_MODES = ("response", "include", "exclude")


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


def group_normalize(
    rewards: torch.Tensor,
    group_ids: Any,
    *,
    scale: str = "group",
    eps: float = 1e-6,
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
        >>> group_normalize(torch.tensor([1.0, 0.0, 5.0]), [0, 0, 1]).tolist()
        [0.7071062922477722, -0.7071062922477722, 0.0]
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
    valid = ~torch.isnan(r)
    centred = r.double() - mean[idx]
    if scale == "group":
        adv = centred / (std[idx] + eps)
    elif scale == "batch":
        rv = r[valid].double()
        bstd = rv.std() if rv.numel() >= 2 else torch.tensor(float("nan"), dtype=torch.float64, device=r.device)
        adv = centred / (bstd + eps)
    else:
        adv = centred
    keep = valid & (cnt[idx] >= 2) & torch.isfinite(adv)
    return torch.where(keep, adv, torch.zeros_like(adv)).float()


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Any,
    response_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-6,
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
    eps: float = 1e-6,
    empty_tool: str = "response",
) -> torch.Tensor:
    """Segment-Locked Credit Assignment (SLCA-GRPO, arXiv 2609.29050, Eq. 6-8).

    ``A^tool_i = norm_g(r^tool)_i`` goes only to rollout ``i``'s tool tokens and
    ``A^sum_i = norm_g(r^sum)_i`` only to its summary tokens; each reward is
    normalised within the group on its own (:func:`group_normalize`), so a change
    in one rollout's summary reward cannot move any tool-token advantage and vice
    versa.

    ``empty_tool`` decides what happens to a rollout whose tool segment is empty
    (it made no call, so ``tool_mask`` is all 0 on its row):

    * ``"response"`` (default): its tool reward takes part in the tool group's
      statistics, and its policy tokens (all in its summary mask) get the mean of
      its two advantages, ``(A^tool_i + A^sum_i) / 2``. Why the default: the only
      tool decision such a rollout made was *not to call*, and that decision lives
      in those tokens. Without it, answering without a tool when one was needed
      would get no execution signal on its own tokens, and correctly abstaining on
      a no-tool task no credit. The mean (not the sum) keeps its per-token scale
      equal to the other rollouts', so with equal rewards SLCA still equals GRPO.
      On every rollout that has a tool segment, locking is unchanged.
    * ``"include"``: its tool reward takes part in the statistics (so it still
      moves the baseline of the others) but its tool advantage has no token to go
      to and is dropped (the paper's literal rule).
    * ``"exclude"``: its tool reward is left out of the tool group's statistics
      (as if NaN), so it moves nobody's tool advantage.

    A rollout with an empty summary segment (it stopped at max turns) has its
    summary advantage dropped; its summary reward still counts in the statistics.

    Args:
        tool_rewards: (B,) execution-tier reward per rollout (NaN = unscored).
        summary_rewards: (B,) summary-tier reward per rollout (NaN = unscored).
        group_ids: (B,) group ids (tensor or sequence of hashables).
        tool_mask: (B, T) 0/1 execution-segment tokens (from :func:`segment_masks`).
        summary_mask: (B, T) 0/1 summary-segment tokens; disjoint from ``tool_mask``.

    Returns:
        (B, T) float32 advantages, zero outside ``tool_mask | summary_mask``.
    """
    tm = check_mask("tool_mask", as_2d("tool_mask", tool_mask))
    sm = check_mask("summary_mask", as_2d("summary_mask", summary_mask))
    check_same_shape(tool_mask=tm, summary_mask=sm)
    if (tm & sm).any():
        raise ValueError("tool_mask and summary_mask overlap: a token belongs to one segment only")
    if empty_tool not in EMPTY_TOOL_MODES:
        raise ValueError(f"empty_tool must be one of {EMPTY_TOOL_MODES}, got {empty_tool!r}")
    B = tm.shape[0]
    rt = as_1d("tool_rewards", tool_rewards, B).to(tm.device)
    rs = as_1d("summary_rewards", summary_rewards, B).to(tm.device)
    has_tool = tm.any(dim=1)  # (B,)
    if empty_tool == "exclude":
        rt = torch.where(has_tool, rt, torch.full_like(rt, float("nan")))
    a_tool = group_normalize(rt, group_ids, scale=scale, eps=eps)  # (B,)
    a_sum = group_normalize(rs, group_ids, scale=scale, eps=eps)  # (B,)
    adv = a_tool.unsqueeze(1) * tm.float() + a_sum.unsqueeze(1) * sm.float()
    if empty_tool == "response":
        mixed = 0.5 * (a_tool + a_sum)  # (B,)
        adv = torch.where(has_tool.unsqueeze(1), adv, mixed.unsqueeze(1) * sm.float())
    return adv


def gdpo_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    group_ids: Any,
    response_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-6,
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


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read, for one batch.

    Attributes:
        tool_rewards: (B,) execution-tier rewards.
        summary_rewards: (B,) summary-tier rewards.
        group_ids: (B,) group ids (tensor or sequence of hashables).
        model_mask: (B, T) 0/1 policy tokens.
        tool_mask: (B, T) 0/1 execution segment.
        summary_mask: (B, T) 0/1 summary segment.
        reward_weights: weights of (tool, summary) in the single scalar reward
            that trajectory-level estimators (``grpo``) use.
    """

    tool_rewards: torch.Tensor
    summary_rewards: torch.Tensor
    group_ids: Any
    model_mask: torch.Tensor
    tool_mask: torch.Tensor
    summary_mask: torch.Tensor
    reward_weights: tuple[float, float] = (1.0, 1.0)

    @property
    def total_rewards(self) -> torch.Tensor:
        """(B,) ``w_tool * r_tool + w_sum * r_sum`` (NaN if either is NaN)."""
        wt, ws = self.reward_weights
        return wt * self.tool_rewards.float() + ws * self.summary_rewards.float()


class Estimator(Protocol):
    def __call__(self, inputs: AdvantageInputs, *, scale: str = "group", eps: float = 1e-6, **kwargs: Any) -> torch.Tensor: ...


_REGISTRY: dict[str, Callable[..., torch.Tensor]] = {}


def register_estimator(name: str, fn: Callable[..., torch.Tensor] | None = None):
    """Register an advantage estimator under ``name`` (usable as a decorator).

    Re-registering the same function under the same name is a no-op; a
    different function under a taken name raises ValueError (as verl's
    ``register_adv_est``).
    """

    def deco(f: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"estimator name must be a non-empty string, got {name!r}")
        old = _REGISTRY.get(name)
        # the same function, or the same definition re-imported (module reload), is fine
        same = old is f or (old is not None and (old.__module__, old.__qualname__) == (f.__module__, f.__qualname__))
        if old is not None and not same:
            raise ValueError(f"an estimator named {name!r} is already registered ({old.__module__}.{old.__qualname__})")
        _REGISTRY[name] = f
        return f

    return deco(fn) if fn is not None else deco


def get_estimator(name: str) -> Callable[..., torch.Tensor]:
    """The estimator registered under ``name``; ValueError listing the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; registered: {sorted(_REGISTRY)}") from None


def list_estimators() -> list[str]:
    return sorted(_REGISTRY)


def compute_advantages(name: str, inputs: AdvantageInputs, **kwargs: Any) -> torch.Tensor:
    """Dispatch to the estimator registered under ``name``; returns (B, T)."""
    return get_estimator(name)(inputs, **kwargs)


@register_estimator("grpo")
def _grpo(inputs: AdvantageInputs, *, scale: str = "group", eps: float = 1e-6, **_: Any) -> torch.Tensor:
    """One scalar (weighted sum of both tiers) per rollout, on every policy token."""
    return grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps)


@register_estimator("slca")
def _slca(
    inputs: AdvantageInputs, *, scale: str = "group", eps: float = 1e-6, empty_tool: str = "response", **_: Any
) -> torch.Tensor:
    """Each tier normalised on its own and locked to its segment."""
    return slca_advantages(
        inputs.tool_rewards,
        inputs.summary_rewards,
        inputs.group_ids,
        inputs.tool_mask,
        inputs.summary_mask,
        scale=scale,
        eps=eps,
        empty_tool=empty_tool,
    )


@register_estimator("gdpo")
def _gdpo(inputs: AdvantageInputs, *, scale: str = "group", eps: float = 1e-6, **_: Any) -> torch.Tensor:
    """Each tier normalised on its own, summed, on every policy token (no locking)."""
    return gdpo_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps
    )
