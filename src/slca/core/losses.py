"""Policy losses: clipped surrogate, KL estimators, loss aggregation.

Pure functions on (B, T) tensors. The trainer composes them::

    pg = clipped_surrogate(logp, old_logp, adv, clip_low, clip_high)     # (B, T)
    pg, st = clipped_surrogate(..., return_stats=True)  # + SurrogateStats (clip fraction)
    kl = kl_penalty(logp, ref_logp, kind="k3")                            # (B, T)
    loss = aggregate(pg + beta * kl, mask, mode, tool_mask=..., summary_mask=...)
    w = token_weights(mask, mode, ...)  # (B, T): each token's weight in that loss
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

import torch

from slca._checks import as_2d, check_mask, check_same_shape
from slca.core.segments import tool_turn_index

__all__ = ["AGG_MODES", "KL_KINDS", "SurrogateStats", "clipped_surrogate", "kl_penalty", "aggregate", "masked_mean",
           "token_logprobs", "token_weights", "turn_mean"]

AGG_MODES = ("token_mean", "seq_mean", "token_sum_norm", "segment_balanced", "turn_mean")
KL_KINDS = ("k1", "k2", "k3")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (0 where the mask is empty).

    Args:
        x: (B, T); mask: (B, T) 0/1.
    """
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def turn_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the batch's turns of each turn's token mean (0 where the mask is empty).

    A turn is a maximal run of ``mask`` tokens: the rollout engine appends each
    assistant turn as one run of policy tokens, with the environment's answer (0 in
    the mask) between two turns, and padding only after the last
    (:func:`slca.core.segments.tool_turn_index` numbers the runs). With ``n_ik``
    the tokens of turn ``k`` of row ``i`` and ``K = sum_i K_i`` the turns of the batch::

        turn_mean = (1 / K) sum_i sum_{k < K_i} (1 / n_ik) sum_{t in turn k of row i} x[i, t]

    Args:
        x: (B, T); mask: (B, T) 0/1 or bool.

    Returns:
        scalar tensor.
    """
    m = mask.bool()
    k = tool_turn_index(m, m)  # (B, T) run index of each mask token, -1 elsewhere
    on = k >= 0
    run = k.clamp_min(0)  # runs of a row number at most ceil(T / 2), so T slots hold them all
    sums = torch.zeros_like(x).scatter_add(1, run, torch.where(on, x, torch.zeros_like(x)))  # (B, T): turn k of row i at [i, k]
    counts = torch.zeros_like(x).scatter_add(1, run, on.to(x.dtype))  # (B, T) tokens of that turn
    has = counts > 0
    return (sums[has] / counts[has]).mean() if has.any() else x.sum() * 0.0


@dataclass(frozen=True)
class SurrogateStats:
    """What the clipped surrogate saw, per token (detached).

    Attributes:
        ratio: (B, T) ``rho = exp(logp - old_logp)``.
        clipped: (B, T) bool, ``rho`` outside ``[1 - clip_low, 1 + clip_high]``.
    """

    ratio: torch.Tensor
    clipped: torch.Tensor

    def clip_frac(self, mask: torch.Tensor) -> float:
        """Share of the ``mask`` tokens (B, T) whose ratio was clipped (0 on an empty mask)."""
        m = mask.bool()
        return float((self.clipped & m).sum() / mask.sum().clamp_min(1))


@overload
def clipped_surrogate(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, *,
    clip_low: float = ..., clip_high: float = ..., return_stats: Literal[False] = ...,
) -> torch.Tensor: ...
@overload
def clipped_surrogate(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, *,
    clip_low: float = ..., clip_high: float = ..., return_stats: Literal[True],
) -> tuple[torch.Tensor, SurrogateStats]: ...
def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, SurrogateStats]:
    """PPO clipped surrogate, per token (Schulman et al. 2017, arXiv 1707.06347, Eq. 7).

    ``rho = exp(logp - old_logp)``;
    ``loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)``.
    Separate low / high bounds follow DAPO's clip-higher (arXiv 2503.14476).

    Args:
        logprobs: (B, T) log-probabilities under the current policy (with grad).
        old_logprobs: (B, T) log-probabilities under the sampling policy.
        advantages: (B, T) per-token advantages.
        return_stats: also return the :class:`SurrogateStats` (ratio, clipped tokens).

    Returns:
        (B, T) per-token loss (to be masked and aggregated); with
        ``return_stats``, ``(loss, SurrogateStats)``.
    """
    lp = as_2d("logprobs", logprobs, nonempty=True)
    check_same_shape(logprobs=lp, old_logprobs=as_2d("old_logprobs", old_logprobs), advantages=as_2d("advantages", advantages))
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0, got {clip_low}, {clip_high}")
    ratio = torch.exp(lp - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    if not return_stats:
        return loss
    r = ratio.detach()
    return loss, SurrogateStats(r, (r < 1 - clip_low) | (r > 1 + clip_high))


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, *, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimators from samples of pi (Schulman 2020, "Approximating KL").

    With ``d = ref_logp - logp``:

    * ``k1 = -d`` (unbiased, high variance, can be negative);
    * ``k2 = d^2 / 2``;
    * ``k3 = exp(d) - d - 1`` (unbiased, always >= 0; GRPO's choice, arXiv 2402.03300 Eq. 4).

    Args:
        logprobs: (B, T) current policy; ref_logprobs: (B, T) frozen reference.

    Returns:
        (B, T) per-token penalty.
    """
    lp = as_2d("logprobs", logprobs, nonempty=True)
    check_same_shape(logprobs=lp, ref_logprobs=as_2d("ref_logprobs", ref_logprobs))
    d = ref_logprobs - lp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        d = d.clamp(-20.0, 20.0)  # exp overflow guard; |d| > 20 means the policies share no mass
        return torch.exp(d) - d - 1.0
    raise ValueError(f"kind must be one of {KL_KINDS}, got {kind!r}")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_mean",
    *,
    tool_mask: torch.Tensor | None = None,
    summary_mask: torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    * ``token_mean`` (DAPO, arXiv 2503.14476): ``sum(l * m) / sum(m)`` over the batch;
      every token weighs the same, so long responses weigh more.
    * ``seq_mean`` (original GRPO, arXiv 2402.03300): mean over each sequence's
      tokens, then over sequences; every rollout weighs the same.
    * ``token_sum_norm`` (Dr. GRPO, arXiv 2503.20783): ``sum(l * m) / (B * max_tokens)``,
      a constant denominator, so no length bias.
    * ``segment_balanced`` (slca): tool tokens and summary tokens are averaged
      separately over the batch and the two means averaged,
      ``0.5 * mean_tool(l) + 0.5 * mean_summary(l)``, so a 20-token call is not
      outweighed by a 200-token summary. A segment with no token in the batch
      leaves the other at full weight. Needs ``tool_mask`` and ``summary_mask``.
    * ``turn_mean`` (per turn, :func:`turn_mean`): each assistant turn (a maximal run
      of ``mask`` tokens, between environment tokens) is averaged over its own tokens,
      then the turn means over all turns of the batch: a token of a turn of ``n``
      tokens weighs ``1 / (n * K)``, ``K`` the turns in the batch. Every turn weighs
      the same, so a rollout weighs in proportion to its number of turns, whatever
      their lengths. It is ``seq_mean`` when every rollout has one turn and
      ``token_mean`` when every turn has the same number of tokens; ``seq_mean`` is
      the same construction one level up (rollouts instead of turns).

    Every mode is linear in ``per_token`` (:func:`token_weights` gives each token's weight).

    Args:
        per_token: (B, T) loss per token.
        mask: (B, T) 0/1 tokens that count (policy tokens).
        tool_mask, summary_mask: (B, T) 0/1, for ``segment_balanced``.
        max_tokens: the constant of ``token_sum_norm`` (default: T).

    Returns:
        scalar tensor.
    """
    x = as_2d("per_token", per_token, nonempty=True)
    m = check_mask("mask", as_2d("mask", mask))
    check_same_shape(per_token=x, mask=m)
    if mode == "token_mean":
        return masked_mean(x, m)
    if mode == "seq_mean":
        per_seq = masked_mean(x, m, dim=1)  # (B,)
        has = m.any(dim=1)
        return per_seq[has].mean() if has.any() else x.sum() * 0.0
    if mode == "token_sum_norm":
        denom = float(max_tokens if max_tokens is not None else x.shape[1])
        if denom <= 0:
            raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
        return (x * m.to(x.dtype)).sum() / (x.shape[0] * denom)
    if mode == "segment_balanced":
        if tool_mask is None or summary_mask is None:
            raise ValueError("aggregate(mode='segment_balanced') needs tool_mask and summary_mask")
        tm = check_mask("tool_mask", as_2d("tool_mask", tool_mask)) & m
        sm = check_mask("summary_mask", as_2d("summary_mask", summary_mask)) & m
        check_same_shape(per_token=x, tool_mask=tm, summary_mask=sm)
        parts = [masked_mean(x, seg) for seg in (tm, sm) if seg.any()]
        if not parts:
            return x.sum() * 0.0
        return torch.stack(parts).mean()
    if mode == "turn_mean":
        return turn_mean(x, m)
    raise ValueError(f"mode must be one of {AGG_MODES}, got {mode!r}")


def token_weights(
    mask: torch.Tensor,
    mode: str = "token_mean",
    *,
    tool_mask: torch.Tensor | None = None,
    summary_mask: torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Each token's weight in :func:`aggregate`: ``aggregate(x, mask, mode, ...) == (x * W).sum()`` for every ``x``.

    Every mode is linear in the per-token loss, so ``W`` is its gradient, taken from
    :func:`aggregate` itself (the modes' arithmetic keeps one home). A batch cut into
    slices of rows then gets the whole batch's loss and gradient as the sum over the
    slices of ``(x_slice * W_slice).sum()`` (gradient accumulation, ``micro_batch_size``).

    Args:
        mask, tool_mask, summary_mask, max_tokens: as :func:`aggregate`'s, (B, T).

    Returns:
        (B, T) float32, 0 off ``mask``.
    """
    z = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        total = aggregate(z, mask, mode, tool_mask=tool_mask, summary_mask=summary_mask, max_tokens=max_tokens)
        (w,) = torch.autograd.grad(total, z, allow_unused=True)
    return torch.zeros_like(z).detach() if w is None else w


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / temperature)`` at the target ids.

    Args:
        logits: (..., V) next-token logits (any float dtype; computed in float32).
        targets: (...) long token ids.

    Returns:
        (...) float32 log-probabilities.
    """
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
