"""Diagnostics: does credit leak between segments?

Pure functions; the trainer calls them every step and logs the results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch

from slca.core.advantages import group_mean
from slca.core.registry import AdvantageInputs, compute_advantages
from slca.core.losses import masked_mean

__all__ = ["contamination", "advantage_stats", "grad_cosine", "flat_grad", "rolling_cv", "summary_counterfactual"]


def summary_counterfactual(inputs: AdvantageInputs) -> AdvantageInputs:
    """The same batch with every summary reward replaced by its group's mean.

    The summary rewards then carry no information about which rollout is better,
    so any difference in the tool-token advantages is what they contributed.
    NaN rewards stay NaN.
    """
    r = inputs.summary_rewards.float()
    return replace(inputs, summary_rewards=group_mean(r, inputs.group_ids))


def contamination(name: str, inputs: AdvantageInputs, **kwargs: Any) -> float:
    """Share of the tool-token advantages that the summary rewards explain.

    ``A`` = the estimator's advantages on tool tokens; ``A_cf`` = the same with the
    summary rewards replaced by their group means (:func:`summary_counterfactual`);
    ``D = A - A_cf`` is the part due to the summary rewards. Returns
    ``|D|^2 / (|D|^2 + |A_cf|^2)`` over tool tokens, in [0, 1]: 0 when tool-token
    credit does not depend on summary rewards (SLCA, by construction), above 0
    under GRPO whenever summary rewards vary within a group. NaN when the batch
    has no tool token.
    """
    tm = inputs.tool_mask.bool()
    if not tm.any():
        return float("nan")
    a = compute_advantages(name, inputs, **kwargs)[tm]
    a_cf = compute_advantages(name, summary_counterfactual(inputs), **kwargs)[tm]
    d2 = float(((a - a_cf) ** 2).sum())
    c2 = float((a_cf**2).sum())
    if d2 + c2 == 0:
        return 0.0
    return d2 / (d2 + c2)


def advantage_stats(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std and mean |A| of (B, T) advantages over a (B, T) mask (NaN when empty)."""
    m = mask.bool()
    if not m.any():
        return {"mean": float("nan"), "std": float("nan"), "abs_mean": float("nan")}
    v = adv[m].float()
    return {
        "mean": float(v.mean()),
        "std": float(v.std()) if v.numel() > 1 else 0.0,
        "abs_mean": float(masked_mean(adv.abs(), m)),
    }


def flat_grad(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients as one flat float32 vector (zeros for parameters without grad)."""
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float() for p in params]
    return torch.cat(parts) if parts else torch.zeros(0)


def grad_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine between two flat gradient vectors (NaN when either is zero)."""
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0:
        return float("nan")
    return float(torch.dot(a, b) / (na * nb))


def rolling_cv(values: Sequence[float], window: int) -> float:
    """Coefficient of variation (std / mean) of the last ``window`` finite values.

    The paper's gradient-norm volatility. NaN with fewer than two values.
    """
    v = [x for x in values[-window:] if math.isfinite(x)]
    if len(v) < 2:
        return float("nan")
    mu = sum(v) / len(v)
    sd = math.sqrt(sum((x - mu) ** 2 for x in v) / (len(v) - 1))
    return sd / mu if mu != 0 else float("nan")
