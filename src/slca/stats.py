"""Typed statistics of one training step and the metrics they are logged as.

The update phase of :meth:`slca.trainer.Trainer.train_step` returns an
:class:`UpdateStats`; its metrics phase builds the others from what the rollout,
score and credit phases returned, and :func:`step_metrics` turns them all into
the flat ``metrics.jsonl`` row.
Metric names (a row also holds ``eval/*`` and ``probe/*`` when it evaluates):

* ``perf/gen_tokens_per_s``, ``perf/train_tokens_per_s``: throughput (wall clock);
* ``grad/norm``: the pre-clip gradient norm, mean over the step's minibatches (every PPO epoch);
  ``grad/volatility``: the rolling coefficient of variation of ``grad/norm``;
* on diagnostic steps, of the step's first minibatch (where the backward is split by segment):
  ``grad/first_minibatch_norm`` (its pre-clip norm), ``grad/tool_norm``, ``grad/summary_norm``
  (the norms of its tool-token and summary-token parts) and ``grad/cosine_tool_summary``;
* ``loss``, ``ppo/clip_frac``, ``ppo/kl`` (with a reference model): means over the step's
  minibatches; ``lr``: the rate the step's update used;
* ``reward/tool``, ``reward/summary``, ``reward/unscored``, ``reward/exec/*``,
  ``reward/summary/*``, ``reward/turn`` (estimators with turn rewards);
* ``adv/{tool,summary}_{mean,std,abs_mean}``, ``adv/contamination``,
  ``adv/cond_subgroup_frac`` (estimators with tool signatures);
* ``rollout/response_tokens``, ``rollout/policy_token_frac``,
  ``rollout/tool_turns``, ``rollout/stop_<reason>``, ``rollout/no_tool_segment`` and
  ``rollout/no_summary_segment`` (shares of rollouts missing a segment),
  ``rollout/mixed_call_groups`` (share of groups where some rollouts called and some did not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

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
        return {"grad/tool_norm": self.tool_norm, "grad/summary_norm": self.summary_norm, "grad/cosine_tool_summary": self.cosine}


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
            m["grad/first_minibatch_norm"] = self.grad_norms[0] if self.grad_norms else float("nan")
            m.update(self.grad_split.metrics())
        m.update({"grad/norm": self.grad_norm, "grad/volatility": volatility, "loss": nanmean(self.losses),
                  "ppo/clip_frac": nanmean(self.clip_fracs)})
        if self.kls:
            m["ppo/kl"] = nanmean(self.kls)
        m["lr"] = lr
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

    def metrics(self) -> dict[str, Any]:
        B, n = self.n_rollouts, self.response_tokens
        m: dict[str, Any] = {
            "rollout/response_tokens": n / B,
            "rollout/policy_token_frac": self.policy_tokens / max(n, 1),
            "rollout/tool_turns": nanmean(self.calls),
            "rollout/no_tool_segment": self.no_tool_segment / B,
            "rollout/no_summary_segment": self.no_summary_segment / B,
            "rollout/mixed_call_groups": self.mixed_call_groups,
        }
        for r in sorted(set(self.stop_reasons)):
            m[f"rollout/stop_{r}"] = self.stop_reasons.count(r) / B
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
            "reward/tool": nanmean(self.tool),
            "reward/summary": nanmean(self.summary),
            "reward/unscored": int(torch.isnan(self.tool).sum() + torch.isnan(self.summary).sum()),
        }
        for k, v in self.components.items():
            m[f"reward/{k}"] = nanmean(v)
        if self.turn is not None:
            m["reward/turn"] = nanmean(self.turn.flatten())
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
                m[f"adv/{name}_{k}"] = v
        m["adv/contamination"] = self.contamination
        if self.cond_subgroup_frac is not None:
            m["adv/cond_subgroup_frac"] = self.cond_subgroup_frac
        return m


def step_metrics(step: int, rollout: RolloutStats, rewards: RewardStats, credit: CreditStats,
                 update: UpdateStats, *, volatility: float, lr: float, train_tokens_per_s: float) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of one training step."""
    m: dict[str, Any] = {"step": step, "perf/gen_tokens_per_s": rollout.gen_tokens_per_s}
    m.update(update.metrics(volatility, lr))
    m.update(rewards.metrics())
    m.update(credit.metrics())
    m["perf/train_tokens_per_s"] = train_tokens_per_s
    m.update(rollout.metrics())
    return m
