"""Typed statistics of one training step and the metrics they are logged as.

The update phase of :meth:`slca.training.trainer.Trainer.train_step` returns an
:class:`UpdateStats`; its metrics phase builds the others from what the rollout,
score and credit phases returned, and :func:`step_metrics` turns them all into
the flat ``metrics.jsonl`` row.
Every name is declared, with its meaning and range, in :mod:`slca.metrics` (the
training-step metrics there; a row also holds the evaluation metrics when it evaluates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from slca import metrics as M

if TYPE_CHECKING:
    from slca.rewards.batch import RewardComponents

__all__ = ["nanmean", "mixed_fraction", "GradSplit", "UpdateStats", "RolloutStats", "RewardStats", "CreditStats", "step_metrics"]


def nanmean(x: list[float] | torch.Tensor) -> float:
    """Mean of the non-NaN values (in float32); NaN when there is none."""
    t = torch.as_tensor(x, dtype=torch.float32)
    t = t[~torch.isnan(t)]
    return float(t.mean()) if t.numel() else float("nan")


@dataclass(frozen=True)
class GradSplit:
    """Norms of the tool-segment and summary-segment parts of one gradient, and their cosine."""

    tool_norm: float
    summary_norm: float
    cosine: float

    def metrics(self) -> dict[str, float]:
        return {M.GRAD_TOOL_NORM.name: self.tool_norm, M.GRAD_SUMMARY_NORM.name: self.summary_norm, M.GRAD_COSINE.name: self.cosine}


@dataclass
class UpdateStats:
    """The policy update of one step: one entry per minibatch (KL only with a reference)."""

    losses: list[float] = field(default_factory=list)
    clip_fracs: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    """Pre-clip gradient norm of each minibatch, in order."""
    grad_split: GradSplit | None = None
    """The segment split of the first minibatch's gradient (diagnostic steps)."""
    seconds: float = 0.0
    lr: float = float("nan")
    """The learning rate of this step's optimizer steps (the schedule advances after them)."""

    @property
    def grad_norm(self) -> float:
        """The step's gradient norm: the mean of the minibatches' pre-clip norms."""
        return nanmean(self.grad_norms)

    def metrics(self, volatility: float, lr: float) -> dict[str, Any]:
        m: dict[str, Any] = {}
        if self.grad_split is not None:  # the split and the norm it splits, of the same (first) minibatch
            m[M.GRAD_FIRST_NORM.name] = self.grad_norms[0] if self.grad_norms else float("nan")
            m.update(self.grad_split.metrics())
        m.update({M.GRAD_NORM.name: self.grad_norm, M.GRAD_VOLATILITY.name: volatility, M.LOSS.name: nanmean(self.losses),
                  M.PPO_CLIP_FRAC.name: nanmean(self.clip_fracs)})
        if self.kls:
            m[M.PPO_KL.name] = nanmean(self.kls)
        m[M.LR.name] = lr
        return m


def mixed_fraction(group_ids: Any, flags: torch.Tensor) -> float:
    """Share of groups whose rollouts disagree on ``flags`` (B,) bool; NaN for an empty batch."""
    groups: dict[Any, set[bool]] = {}
    for g, f in zip(list(group_ids), flags.tolist()):
        groups.setdefault(g, set()).add(bool(f))
    return sum(len(v) == 2 for v in groups.values()) / len(groups) if groups else float("nan")


@dataclass(frozen=True)
class RolloutStats:
    """Shape of one rollout batch."""

    n_rollouts: int
    response_tokens: int
    """Real response tokens (policy and environment) in the batch."""
    policy_tokens: int
    calls: list[int]
    """Tool calls per rollout (logged as ``rollout/tool_turns``)."""
    stop_reasons: list[str]
    gen_tokens_per_s: float
    no_tool_segment: int = 0
    """Rollouts with no tool segment: no tool reply before their last turn (no call, or a call turn cut by the
    token budget; docs/beyond.md, "Segments that are missing")."""
    no_summary_segment: int = 0
    """Rollouts with a tool segment and no summary segment (no answer: turn limit, or budget after a reply)."""
    mixed_call_groups: float = 0.0
    """Share of groups in which some rollouts have a tool segment and some do not (where ``empty_tool`` acts)."""
    mask_mismatch: float | None = None
    """Share of rollouts whose segment masks disagree with their conversation (:mod:`slca.chat.maskcheck`); None: not checked."""

    def metrics(self) -> dict[str, Any]:
        B, n = self.n_rollouts, self.response_tokens
        m: dict[str, Any] = {
            M.ROLLOUT_TOKENS.name: n / B,
            M.ROLLOUT_POLICY_FRAC.name: self.policy_tokens / max(n, 1),
            M.ROLLOUT_TOOL_TURNS.name: nanmean(self.calls),
            M.ROLLOUT_NO_TOOL.name: self.no_tool_segment / B,
            M.ROLLOUT_NO_SUMMARY.name: self.no_summary_segment / B,
            M.ROLLOUT_MIXED.name: self.mixed_call_groups,
        }
        if self.mask_mismatch is not None:
            m[M.ROLLOUT_MASK_MISMATCH.name] = self.mask_mismatch
        for r in sorted(set(self.stop_reasons)):
            m[M.ROLLOUT_STOP.key(reason=r)] = self.stop_reasons.count(r) / B
        return m


@dataclass(frozen=True)
class RewardStats:
    """Rewards of one batch as trained on (summary noise included)."""

    tool: torch.Tensor
    """(B,) execution-tier rewards."""
    summary: torch.Tensor
    """(B,) summary-tier rewards."""
    components: RewardComponents
    """Both tiers' components (logged as ``reward/exec/<name>``, ``reward/summary/<name>``)."""
    turn: torch.Tensor | None = None
    """(B, K) per-turn rewards, when the estimator reads them."""

    def metrics(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            M.REWARD_TOOL.name: nanmean(self.tool),
            M.REWARD_SUMMARY.name: nanmean(self.summary),
            M.REWARD_UNSCORED.name: int(torch.isnan(self.tool).sum() + torch.isnan(self.summary).sum()),
        }
        for k, v in self.components.by_metric():
            m[k] = nanmean(v)
        if self.turn is not None:
            m[M.REWARD_TURN.name] = nanmean(self.turn.flatten())
        return m


@dataclass(frozen=True)
class CreditStats:
    """Advantage statistics per segment and the contamination diagnostic."""

    tool: dict[str, float]
    summary: dict[str, float]
    contamination: float
    cond_subgroup_frac: float | None = None

    def metrics(self) -> dict[str, Any]:
        m: dict[str, Any] = {}
        for name, st in (("tool", self.tool), ("summary", self.summary)):
            for k, v in st.items():
                m[M.ADV_STAT.key(segment=name, stat=k)] = v
        m[M.ADV_CONTAMINATION.name] = self.contamination
        if self.cond_subgroup_frac is not None:
            m[M.ADV_COND_FRAC.name] = self.cond_subgroup_frac
        return m


def step_metrics(step: int, rollout: RolloutStats, rewards: RewardStats, credit: CreditStats,
                 update: UpdateStats, *, volatility: float, lr: float, train_tokens_per_s: float) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of one training step."""
    m: dict[str, Any] = {M.STEP.name: step, M.PERF_GEN.name: rollout.gen_tokens_per_s}
    m.update(update.metrics(volatility, lr))
    m.update(rewards.metrics())
    m.update(credit.metrics())
    m[M.PERF_TRAIN.name] = train_tokens_per_s
    m.update(rollout.metrics())
    return m
