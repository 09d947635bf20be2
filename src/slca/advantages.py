"""Group-relative advantages and the estimator registry.

All functions are pure: tensors in, tensors out, no config objects.

Shapes: ``B`` rollouts (prompts x G samples), ``T`` response tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index
from slca.segments import tool_turn_index

__all__ = [
    "SCALES",
    "EMPTY_TOOL_MODES",
    "group_normalize",
    "grpo_advantages",
    "slca_advantages",
    "gdpo_advantages",
    "conditional_normalize",
    "slca_cond_advantages",
    "turn_normalize",
    "slca_turn_advantages",
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
    tm, sm, rt, rs = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool)
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
        tool_signatures: length-B sequence of hashables (or None), the tool
            outcome of each rollout (``slca_cond``; see
            :func:`slca.rewards.turns.tool_signature`).
        turn_rewards: (B, K) per-tool-turn rewards, NaN for a missing turn
            (``slca_turn``; see :func:`slca.rewards.turns.turn_scores`).
        turn_index: (B, T) long tool-turn index of each tool token, -1 elsewhere
            (``slca_turn``); None: derived from ``model_mask`` and ``tool_mask``.

    An estimator that reads an optional field lists it in its ``needs``
    attribute (a tuple of field names), so callers fill it only when needed.
    """

    tool_rewards: torch.Tensor
    summary_rewards: torch.Tensor
    group_ids: Any
    model_mask: torch.Tensor
    tool_mask: torch.Tensor
    summary_mask: torch.Tensor
    reward_weights: tuple[float, float] = (1.0, 1.0)
    tool_signatures: Sequence[Hashable] | None = None
    turn_rewards: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None

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


# --------------------------------------------------------------------------- beyond SLCA
# Two estimators for SLCA's known limits (docs/beyond.md): a summary baseline
# conditioned on the tool outcome, and per-turn credit inside the tool segment.

COND_STDS = ("group", "subgroup")


def conditional_normalize(
    rewards: torch.Tensor,
    group_ids: Any,
    signatures: Sequence[Hashable | None],
    *,
    scale: str = "group",
    eps: float = 1e-6,
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
    centred = rc.double() - base
    if scale == "group":
        sd = torch.where(use_sub, std_s[idx_s], std_g[idx_g]) if cond_std == "subgroup" else std_g[idx_g]
        adv = centred / (sd + eps)
    elif scale == "batch":
        rv = rc[~torch.isnan(rc)].double()
        bstd = rv.std() if rv.numel() >= 2 else torch.tensor(float("nan"), dtype=torch.float64)
        adv = centred / (bstd + eps)
    else:
        adv = centred
    keep = ~torch.isnan(rc) & (cnt_g[idx_g] >= 2) & torch.isfinite(adv)
    return torch.where(keep, adv, torch.zeros_like(adv)).float().to(r.device)


def _segment_checks(
    tool_rewards: Any, summary_rewards: Any, tool_mask: Any, summary_mask: Any, empty_tool: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated ``(tool_mask, summary_mask, tool_rewards, summary_rewards)`` as in :func:`slca_advantages`."""
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
    return tm, sm, rt, rs


def slca_cond_advantages(
    tool_rewards: torch.Tensor,
    summary_rewards: torch.Tensor,
    group_ids: Any,
    tool_signatures: Sequence[Hashable | None],
    tool_mask: torch.Tensor,
    summary_mask: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-6,
    empty_tool: str = "response",
    cond_std: str = "group",
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
    has fewer than two valid members). Routing, ``empty_tool`` and NaN handling
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
    tm, sm, rt, rs = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool)
    has_tool = tm.any(dim=1)  # (B,)
    if empty_tool == "exclude":
        rt = torch.where(has_tool, rt, torch.full_like(rt, float("nan")))
    a_tool = group_normalize(rt, group_ids, scale=scale, eps=eps)  # (B,)
    a_sum = conditional_normalize(rs, group_ids, tool_signatures, scale=scale, eps=eps, cond_std=cond_std).to(tm.device)
    adv = a_tool.unsqueeze(1) * tm.float() + a_sum.unsqueeze(1) * sm.float()
    if empty_tool == "response":
        mixed = 0.5 * (a_tool + a_sum)  # (B,)
        adv = torch.where(has_tool.unsqueeze(1), adv, mixed.unsqueeze(1) * sm.float())
    return adv


def turn_normalize(turn_rewards: torch.Tensor, group_ids: Any, *, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
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
    eps: float = 1e-6,
    empty_tool: str = "response",
) -> torch.Tensor:
    """SLCA with temporal credit inside the tool segment (``slca_turn``).

    One scalar per tool segment cannot tell a good first call from a bad second
    call. With per-turn execution scores ``r_{i,k}`` (turn ``k`` of rollout ``i``),
    normalised per group and turn index (:func:`turn_normalize`):

        ``A_{i,t} = A^tool_i + lambda * A^turn_{i,k(i,t)}``   on tool tokens of turn ``k``,
        ``A_{i,t} = A^sum_i``                                  on summary tokens,

    where ``A^tool``, ``A^sum`` (and the ``empty_tool`` handling) are exactly
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
            :func:`slca.segments.turn_index`). Only its values on tool tokens are read.
        turn_lambda: weight of the turn term (finite).

    Returns:
        (B, T) float32, zero outside ``tool_mask | summary_mask``.
    """
    tm, sm, _, _ = _segment_checks(tool_rewards, summary_rewards, tool_mask, summary_mask, empty_tool)
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
        tool_rewards, summary_rewards, group_ids, tm, sm, scale=scale, eps=eps, empty_tool=empty_tool
    )
    K = rk.shape[1]
    if K == 0 or turn_lambda == 0:
        return base
    a_turn = turn_normalize(rk, group_ids, scale=scale, eps=eps).to(tm.device)  # (B, K)
    on = tm & (ti < K)
    per_tok = a_turn.gather(1, ti.clamp(0, K - 1))  # (B, T)
    return base + float(turn_lambda) * torch.where(on, per_tok, torch.zeros_like(per_tok))


def _needs(inputs: AdvantageInputs, name: str, field_name: str, hint: str) -> Any:
    v = getattr(inputs, field_name)
    if v is None:
        raise ValueError(f"estimator {name!r} needs AdvantageInputs.{field_name} ({hint}); it is None")
    return v


@register_estimator("slca_cond")
def _slca_cond(
    inputs: AdvantageInputs,
    *,
    scale: str = "group",
    eps: float = 1e-6,
    empty_tool: str = "response",
    cond_std: str = "group",
    **_: Any,
) -> torch.Tensor:
    """SLCA with the summary baseline conditioned on the tool outcome."""
    sigs = _needs(inputs, "slca_cond", "tool_signatures", "one hashable per rollout, e.g. slca.rewards.turns.tool_signature(turns)")
    return slca_cond_advantages(
        inputs.tool_rewards,
        inputs.summary_rewards,
        inputs.group_ids,
        sigs,
        inputs.tool_mask,
        inputs.summary_mask,
        scale=scale,
        eps=eps,
        empty_tool=empty_tool,
        cond_std=cond_std,
    )


_slca_cond.needs = ("tool_signatures",)  # type: ignore[attr-defined]


@register_estimator("slca_turn")
def _slca_turn(
    inputs: AdvantageInputs,
    *,
    scale: str = "group",
    eps: float = 1e-6,
    empty_tool: str = "response",
    turn_lambda: float = 1.0,
    **_: Any,
) -> torch.Tensor:
    """SLCA plus a per-turn execution advantage on each tool turn's tokens."""
    rk = _needs(inputs, "slca_turn", "turn_rewards", "(B, K) per-turn scores, e.g. slca.rewards.turns.turn_scores per rollout")
    ti = inputs.turn_index
    if ti is None:
        ti = tool_turn_index(inputs.model_mask, inputs.tool_mask)
    return slca_turn_advantages(
        inputs.tool_rewards,
        inputs.summary_rewards,
        rk,
        inputs.group_ids,
        inputs.tool_mask,
        inputs.summary_mask,
        ti,
        turn_lambda=turn_lambda,
        scale=scale,
        eps=eps,
        empty_tool=empty_tool,
    )


_slca_turn.needs = ("turn_rewards",)  # type: ignore[attr-defined]
