"""Group-relative advantages and the estimator registry.

All functions are pure: tensors in, tensors out, no config objects.

Shapes: ``B`` rollouts (prompts x G samples), ``T`` response tokens.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass, replace
from importlib.metadata import entry_points
from typing import Annotated, Any, Literal, Protocol

import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index
from slca._fields import check_value, coerce, did_you_mean, ge, gt, hints, within
from slca.core.segments import last_tool_turn, tool_turn_index

__all__ = [
    "SCALES",
    "EMPTY_TOOL_MODES",
    "EMPTY_SUMMARY_MODES",
    "group_mean",
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
    "EstimatorSpec",
    "InputSpec",
    "GroupOptions",
    "SLCAOptions",
    "SLCACondOptions",
    "SLCATurnOptions",
    "option",
    "option_values",
    "ge",
    "gt",
    "within",
    "register_estimator",
    "register_input",
    "get_estimator",
    "get_input",
    "list_estimators",
    "resolve_estimator",
    "ENTRY_POINT_GROUP",
    "compute_advantages",
    "fill_inputs",
]

SCALES = ("group", "batch", "none")
EMPTY_TOOL_MODES = ("response", "include", "exclude", "both")
EMPTY_SUMMARY_MODES = ("drop", "last_turn")
EMPTY_TOOL_DEFAULT = "both"
"""What every host does by default with a rollout that made no call (docs/beyond.md, "Segments that are missing")."""
EMPTY_SUMMARY_DEFAULT = "last_turn"
"""What every host does by default with a rollout that never answered (same section)."""


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
) -> torch.Tensor:
    """SLCA's routing: the normalised tool reward to tool tokens, ``a_sum`` (B,) to summary tokens.

    ``rt`` (B,) are the raw tool rewards (normalised here, with ``empty_tool``'s
    rule for rollouts without a tool segment); ``tm``, ``sm`` (B, T) the
    segments; ``empty_summary`` the rule for rollouts without a summary segment.
    Returns (B, T) float32.
    """
    has_tool = tm.any(dim=1)  # (B,)
    if empty_tool == "exclude":
        rt = torch.where(has_tool, rt, torch.full_like(rt, float("nan")))
    a_tool = group_normalize(rt, group_ids, scale=scale, eps=eps)  # (B,)
    adv = a_tool.unsqueeze(1) * tm.float() + a_sum.unsqueeze(1) * sm.float()
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
        extra: inputs beyond these fields, by name (a new estimator's new
            input, see :class:`InputSpec`).

    An estimator lists the optional inputs it reads in its spec's ``needs``
    (:class:`EstimatorSpec`), so callers fill them only when needed
    (:func:`fill_inputs`).

    One input contract for every estimator: rewards and masks may be given as
    tensors, numpy arrays or (nested) lists; they are converted here, once, so
    every estimator reads tensors (rewards: 1-D float; masks, ``turn_rewards``,
    ``turn_index``: 2-D). ``B = 0`` and ``T = 0`` are valid shapes.
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
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tool_rewards", "summary_rewards"):
            object.__setattr__(self, name, as_1d(name, getattr(self, name)))
        for name in ("model_mask", "tool_mask", "summary_mask", "turn_rewards", "turn_index"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_2d(name, value))

    @property
    def total_rewards(self) -> torch.Tensor:
        """(B,) ``w_tool * r_tool + w_sum * r_sum`` (NaN if either is NaN)."""
        wt, ws = self.reward_weights
        return wt * self.tool_rewards.float() + ws * self.summary_rewards.float()

    def get(self, name: str) -> Any:
        """The input called ``name``: a field, else an entry of :attr:`extra` (None when absent)."""
        if name in _FIELDS:
            return getattr(self, name)
        return self.extra.get(name)

    def with_inputs(self, values: Mapping[str, Any]) -> "AdvantageInputs":
        """A copy with these inputs set: fields by name, any other name into :attr:`extra`."""
        fields_ = {k: v for k, v in values.items() if k in _FIELDS and k != "extra"}
        extra = {k: v for k, v in values.items() if k not in _FIELDS}
        return replace(self, **fields_, extra={**self.extra, **extra}) if (fields_ or extra) else self


_FIELDS = frozenset(f.name for f in fields(AdvantageInputs))


def option(default: Any, help: str) -> Any:
    """A field of an estimator's options object: its default and one line of help (docs, errors, ``--help-config``)."""
    return field(default=default, metadata={"help": help})


Scale = Literal[SCALES]
Eps = Annotated[float, ge(0)]
EmptyTool = Literal[EMPTY_TOOL_MODES]
EmptySummary = Literal[EMPTY_SUMMARY_MODES]
NonNegative = Annotated[float, ge(0)]


@dataclass(frozen=True)
class GroupOptions:
    """Options of the group normalisation every built-in estimator shares (:func:`group_normalize`)."""

    scale: Scale = option("group", "Advantage normalisation: 'group' (GRPO), 'batch' (TRL scale_rewards='batch'), "
                          "'none' (Dr. GRPO: centre only).")
    eps: Eps = option(1e-6, "Added to the std in the normalisation.")


@dataclass(frozen=True)
class SLCAOptions(GroupOptions):
    """Options of :func:`slca_advantages`: the normalisation, and rollouts that lack a segment."""

    empty_tool: EmptyTool = option(EMPTY_TOOL_DEFAULT, "SLCA: rollouts with no tool segment ('response', 'include', "
                                   "'exclude', 'both'; see slca_advantages and docs/beyond.md, \"Segments that are missing\").")
    empty_summary: EmptySummary = option(EMPTY_SUMMARY_DEFAULT, "SLCA: rollouts with no summary segment, i.e. no final "
                                         "answer ('drop': the summary advantage is dropped; 'last_turn': added to the last "
                                         "tool turn's tokens; see slca_advantages and docs/beyond.md, \"Segments that are missing\").")


def option_values(options: Any) -> dict[str, Any]:
    """An options object as keyword arguments (shallow: values as they are)."""
    return {f.name: getattr(options, f.name) for f in fields(options)}


def unknown_option(estimator: str, name: str, declared: Iterable[str], host: Mapping[str, str] | None = None) -> str:
    """The one-line refusal of an option ``estimator`` does not take: the closest name the caller may set, then all of them.

    ``declared``: the estimator's options; ``host``: option -> the host setting it comes from
    (:meth:`EstimatorSpec.host_options`), left out of the names offered and named after them.
    """
    host = host or {}
    accepted = sorted(set(declared) - set(host))
    msg = f"estimator {estimator!r} has no option {name!r}{did_you_mean(name, accepted)}; its options: {accepted}"
    elsewhere = [host[k] for k in sorted(set(declared) & set(host))]
    return msg + (f"; the others come from {', '.join(elsewhere)}" if elsewhere else "")


def check_options(cls: type, estimator: str, given: Mapping[str, Any]) -> Any:
    """``cls(**given)`` (an estimator's options object), every value checked against its field.

    Raises:
        ValueError: naming the estimator and the option: an option ``cls`` does not
            declare (with the closest one it does), a value of the wrong type, outside its range or its choices.
    """
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(unknown_option(estimator, unknown[0], known))
    types_ = hints(cls)
    out = {}
    for k, v in given.items():
        out[k], problem = check_value(v, types_[k])
        if problem:
            raise ValueError(f"estimator {estimator!r}: option {k!r} {problem}")
    return cls(**out)


def parse_options(cls: type, estimator: str, raw: Mapping[str, str], host: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"turn_lambda": "0.5"}`` (strings from the command line or the environment) as typed values.

    Raises ValueError naming the estimator and the option (an unknown option, a value that does not parse);
    the options it offers leave out ``host``'s, those the host sets from its own settings (:func:`unknown_option`).
    """
    known = hints(cls)
    out = {}
    for k, v in raw.items():
        if k not in known:
            raise ValueError(unknown_option(estimator, k, known, host))
        try:
            out[k] = coerce(v, known[k]) if isinstance(v, str) else v
        except ValueError as e:
            raise ValueError(f"estimator {estimator!r}: option {k!r} {e}") from None
    return out


def split_assignments(items: Sequence[str], what: str) -> dict[str, str]:
    """``["name=value", ...]`` (``--set estimator_options=a=1,b=x``, ``SLCA_ESTIMATOR_OPTIONS``) as a mapping."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not name:
            raise ValueError(f"{what}: {item!r} must look like option=value")
        if name in out:
            raise ValueError(f"{what}: option {name!r} is given twice")
        out[name] = value
    return out


@dataclass(frozen=True)
class InputSpec:
    """An optional estimator input: its name, what it is, how to compute it from rollouts.

    Attributes:
        name: an :class:`AdvantageInputs` field, or any other name (then it
            travels in :attr:`AdvantageInputs.extra`).
        doc: what it holds (shape, meaning); quoted when it is missing.
        compute: ``compute(trajectories) -> value`` for the B rollouts of a
            batch, or a ``"module:function"`` path imported on first use (so this
            module need not import the reward code). None: callers must pass it.
    """

    name: str
    doc: str
    compute: Callable[[Sequence[Any]], Any] | str | None = None

    def from_trajectories(self, trajectories: Sequence[Any]) -> Any:
        f = self.compute
        if f is None:
            raise ValueError(f"input {self.name!r} has no compute function: pass it in AdvantageInputs")
        if isinstance(f, str):
            mod, _, attr = f.partition(":")
            f = getattr(importlib.import_module(mod), attr)
        return f(trajectories)


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator, complete: its function, the inputs it needs, its options object.

    ``options`` is a frozen dataclass (e.g. :class:`SLCAOptions`): each field one
    option with its type (checks and choices on it, see :mod:`slca._fields`),
    default and help. ``fn(inputs, **options) -> (B, T)`` is called with every
    option, the defaults filled in; an option it does not declare, or a bad
    value, is refused with an error naming the estimator and the option.
    ``needs`` are names of optional inputs (:class:`InputSpec`) that must not be
    None. ``reference`` marks the estimators every run records on its sample
    groups and ``slca compare`` runs by default. ``trajectory`` marks an
    estimator that reads one scalar per rollout (``AdvantageInputs.total_rewards``)
    instead of the two tiers, as ``grpo`` does (the TRL trainer then sums the
    tiers as TRL does).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    needs: tuple[str, ...] = ()
    options: type = field(default_factory=lambda: _NO_OPTIONS)
    doc: str = ""
    reference: bool = False
    trajectory: bool = False

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.options))

    def defaults(self) -> dict[str, Any]:
        return option_values(self.options())

    def make_options(self, given: Mapping[str, Any] | None = None) -> Any:
        """The options object: ``given`` (checked) over the defaults. Unknown names or bad values raise ValueError."""
        return check_options(self.options, self.name, given or {})

    def pick(self, source: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of ``source`` (e.g. a host's settings) that are options of this estimator."""
        names = set(self.option_names)
        return {k: v for k, v in source.items() if k in names}

    def host_options(self, host: Mapping[str, Any], given: Mapping[str, Any] | None, where: Mapping[str, str]) -> Any:
        """The options object a host (the trainer, TRL, verl) runs this estimator with, validated.

        ``host``: the values the host's own settings give (``scale``, ``eps``, ...); those
        this estimator does not declare are left out. ``given``: the user's estimator
        options, which may not set an option the host gives (``where[name]`` names the
        setting that does, for the error).
        """
        given = dict(given or {})
        clash = sorted(set(given) & set(where))
        if clash:
            raise ValueError(f"estimator_options may not set {clash[0]!r}: it comes from {where[clash[0]]}")
        unknown = sorted(set(given) - set(self.option_names))
        if unknown:  # listing only what the user may set here
            raise ValueError(unknown_option(self.name, unknown[0], self.option_names, where))
        return self.make_options({**self.pick(host), **given})

    def check_inputs(self, inputs: AdvantageInputs) -> None:
        for n in self.needs:
            if inputs.get(n) is None:
                where = f"AdvantageInputs.{n}" if n in _FIELDS else f"AdvantageInputs.extra[{n!r}]"
                hint = _INPUTS[n].doc if n in _INPUTS else "no InputSpec registered"
                raise ValueError(f"estimator {self.name!r} needs {where} ({hint}); it is None")

    def run(self, inputs: AdvantageInputs, options: Any) -> torch.Tensor:
        """(B, T) advantages with an options object from :meth:`make_options` / :meth:`host_options`."""
        self.check_inputs(inputs)
        return self.fn(inputs, **option_values(options))

    def __call__(self, inputs: AdvantageInputs, **options: Any) -> torch.Tensor:
        return self.run(inputs, self.make_options(options))


@dataclass(frozen=True)
class _NoOptions:
    """An estimator without options."""


_NO_OPTIONS = _NoOptions


class Estimator(Protocol):
    """What :attr:`EstimatorSpec.fn` is: (B, T) advantages from the batch's inputs and the options."""

    def __call__(self, inputs: AdvantageInputs, **options: Any) -> torch.Tensor: ...


_REGISTRY: dict[str, EstimatorSpec] = {}
_INPUTS: dict[str, InputSpec] = {}


def _options_of(name: str, fn: Callable[..., Any]) -> type:
    """An options object built from ``fn``'s keyword-only parameters with defaults (each typed as its default)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return _NO_OPTIONS
    opts = [(p.name, Any if p.default is None else type(p.default), field(default=p.default))
            for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty]
    return make_dataclass(f"{name}_options", opts, frozen=True) if opts else _NO_OPTIONS


def register_input(spec: InputSpec) -> InputSpec:
    """Register an optional estimator input (a different spec under a taken name raises ValueError)."""
    old = _INPUTS.get(spec.name)
    same = old is not None and old.doc == spec.doc and (
        old.compute == spec.compute or (callable(old.compute) and callable(spec.compute) and _same_fn(old.compute, spec.compute)))
    if old is not None and not same:
        raise ValueError(f"an estimator input named {spec.name!r} is already registered ({old.doc})")
    _INPUTS[spec.name] = spec
    return spec


def get_input(name: str) -> InputSpec:
    try:
        return _INPUTS[name]
    except KeyError:
        raise ValueError(f"cannot compute AdvantageInputs field {name!r}: no InputSpec registered; known: {sorted(_INPUTS)}") from None


def _same_fn(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    # the same function, or the same definition re-imported (module reload)
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (getattr(b, "__module__", 0), getattr(b, "__qualname__", 0))


def register_estimator(
    name: str,
    fn: Callable[..., torch.Tensor] | EstimatorSpec | None = None,
    *,
    needs: Sequence[str | InputSpec] = (),
    options: type | None = None,
    doc: str | None = None,
    reference: bool = False,
    trajectory: bool = False,
):
    """Register an advantage estimator under ``name``, as a complete spec (usable as a decorator).

    Args:
        fn: ``fn(inputs: AdvantageInputs, **options) -> (B, T)``, or an
            :class:`EstimatorSpec` (as :func:`get_estimator` returns).
        needs: optional inputs it reads: names of registered inputs, or
            :class:`InputSpec` objects, registered here too (a new input and its
            estimator in one registration).
        options: its options object, a frozen dataclass (see :class:`SLCAOptions`);
            None reads them from ``fn``'s keyword-only parameters with defaults
            (each typed as its default). A ``**kwargs`` parameter adds none: an
            option that is not declared is refused.
        doc: one line (default: the first line of ``fn``'s docstring).
        reference: one of the estimators recorded on sample groups and compared by default.
        trajectory: it reads one scalar per rollout (``total_rewards``), not the two tiers.

    Re-registering the same function under the same name is a no-op; a
    different function under a taken name raises ValueError (as verl's
    ``register_adv_est``). Returns ``fn``.
    """

    def deco(f: Callable[..., torch.Tensor] | EstimatorSpec) -> Callable[..., torch.Tensor] | EstimatorSpec:
        if not isinstance(name, str) or not name:
            raise ValueError(f"estimator name must be a non-empty string, got {name!r}")
        spec = f if isinstance(f, EstimatorSpec) else _make_spec(name, f, needs, options, doc, reference, trajectory)
        old = _REGISTRY.get(name)
        if old is not None and not _same_fn(old.fn, spec.fn):
            raise ValueError(f"an estimator named {name!r} is already registered ({old.fn.__module__}.{old.fn.__qualname__})")
        for n in needs:
            if isinstance(n, InputSpec):
                register_input(n)
        _REGISTRY[name] = spec
        if not isinstance(f, EstimatorSpec):
            try:  # lets resolve_estimator("module:function") find the spec from the function itself
                f.__slca_estimator__ = spec  # type: ignore[union-attr]
            except (AttributeError, TypeError):
                pass
        return f

    return deco(fn) if fn is not None else deco


def _make_spec(name, f, needs, options, doc, reference, trajectory) -> EstimatorSpec:
    if options is None:
        options = _options_of(name, f)
    elif not (isinstance(options, type) and is_dataclass(options) and options.__dataclass_params__.frozen):
        raise ValueError(f"estimator {name!r}: options must be a frozen dataclass (its fields the options), got {options!r}")
    first_line = ((f.__doc__ or "").strip().splitlines() or [""])[0]
    return EstimatorSpec(name, f, tuple(n.name if isinstance(n, InputSpec) else n for n in needs), options,
                         doc if doc is not None else first_line, reference, trajectory=trajectory)


def get_estimator(name: str) -> EstimatorSpec:
    """The estimator spec ``name`` refers to (callable: ``spec(inputs, **options)``).

    ``name`` is a registered name, an import path ``"package.module:function"`` or
    the name of a ``slca.estimators`` entry point (see :func:`resolve_estimator`);
    ValueError, one line, saying what is wrong otherwise (listing the known ones).
    """
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    return spec if spec is not None else resolve_estimator(name)


ENTRY_POINT_GROUP = "slca.estimators"
"""Entry-point group an installed package declares its estimators in (``[project.entry-points."slca.estimators"]``)."""

_ALIASES: dict[str, EstimatorSpec] = {}  # an import path or entry-point name already resolved -> its spec


def resolve_estimator(ref: str) -> EstimatorSpec:
    """The estimator ``ref`` refers to, importing the user code that registers it; works in any process.

    ``ref`` is one of:

    * a registered name (``"slca"``, or one registered in this process);
    * an import path ``"package.module:function"``: the module is imported (which
      runs its ``@register_estimator(...)``) and ``function`` is a function it
      registered (or an :class:`EstimatorSpec`, or the registered *name* of an
      estimator the module registered). A process that never saw the
      registration (``slca train``, ``slca compare``'s runs, a TRL or verl worker)
      resolves the same path to the same function;
    * the name of an entry point in the group :data:`ENTRY_POINT_GROUP`
      (``slca.estimators``) of an installed package, e.g.
      ``[project.entry-points."slca.estimators"] my_est = "my_pkg.module:fn"``;
      its value is resolved as an import path.

    A resolved reference is remembered (the module is imported once).

    Raises:
        ValueError: one line naming the reference and what is wrong: unknown
            name, module not found, the module failed to import (e.g. it
            registers a name another estimator holds), attribute missing, not a
            registered estimator, an entry-point name two packages declare.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(f"estimator must be a non-empty string (a registered name or 'package.module:function'), got {ref!r}")
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    known = _ALIASES.get(ref)
    if known is not None and _REGISTRY.get(known.name) is known:
        return known
    if ":" in ref:
        spec = _from_import_path(ref, ref)
    else:
        eps = _entry_points()
        if ref not in eps:
            installed = f"; installed ({ENTRY_POINT_GROUP} entry points): {sorted(eps)}" if eps else ""
            raise ValueError(f"unknown estimator {ref!r}{did_you_mean(ref, [*_REGISTRY, *eps])}; registered: {sorted(_REGISTRY)}{installed}; "
                             "user code: give its import path 'package.module:function'")
        spec = _from_entry_point(ref, eps[ref])
    _ALIASES[ref] = spec
    return spec


def _entry_points() -> dict[str, Any]:
    """The ``slca.estimators`` entry points by name; ValueError if two packages declare one name differently."""
    out: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        old = out.get(ep.name)
        if old is not None and old.value != ep.value:
            raise ValueError(f"estimator entry point {ep.name!r} ({ENTRY_POINT_GROUP}) is declared twice: "
                             f"{_dist_name(old)} -> {old.value!r}, {_dist_name(ep)} -> {ep.value!r}; uninstall one or "
                             "give the import path instead")
        out.setdefault(ep.name, ep)
    return out


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "a package"


def _from_entry_point(name: str, ep: Any) -> EstimatorSpec:
    where = f"estimator {name!r} (entry point {ep.value!r} of {_dist_name(ep)})"
    if ":" in ep.value:
        return _from_import_path(ep.value, where)
    _import(ep.value.strip(), where)  # a module: importing it registers `name`
    if name not in _REGISTRY:
        raise ValueError(f"{where}: importing {ep.value!r} registered no estimator named {name!r}; "
                         f"it registered: {_registered_by(ep.value.strip())}")
    return _REGISTRY[name]


def _import(module: str, where: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise ValueError(f"{where}: no module named {e.name!r} (install its package, or put the folder that "
                             "holds it on PYTHONPATH)") from None
        raise ValueError(f"{where}: importing module {module!r} failed: {e}") from None
    except Exception as e:  # the module's own error (a duplicate name, a syntax error, ...), reported in one line
        raise ValueError(f"{where}: importing module {module!r} failed: {type(e).__name__}: {e}") from None


def _registered_by(module: str) -> list[str]:
    return sorted(n for n, s in _REGISTRY.items() if getattr(s.fn, "__module__", None) == module)


def _from_import_path(path: str, where: str) -> EstimatorSpec:
    """The estimator at ``"package.module:attr"``; ``where`` starts every error message."""
    if where == path:
        where = f"estimator {path!r}"
    module, _, attr = (x.strip() for x in path.partition(":"))
    if not module or not attr or not all(p.isidentifier() for p in (*module.split("."), *attr.split("."))):
        raise ValueError(f"{where}: an import path must look like 'package.module:function'")
    obj: Any = _import(module, where)
    for part in attr.split("."):
        if not hasattr(obj, part):
            if attr in _REGISTRY and getattr(_REGISTRY[attr].fn, "__module__", None) == module:
                return _REGISTRY[attr]  # "module:NAME", NAME the name the module registered
            raise ValueError(f"{where}: module {module!r} has no attribute {attr!r}; "
                             f"estimators it registered: {_registered_by(module)}")
        obj = getattr(obj, part)
    return _spec_of(obj, f"{where}: {module}.{attr}")


def _spec_of(obj: Any, where: str) -> EstimatorSpec:
    """The registered spec of ``obj`` (an EstimatorSpec, or a function registered as an estimator)."""
    if isinstance(obj, EstimatorSpec):
        try:
            register_estimator(obj.name, obj)  # a no-op if it is there; ValueError if another function holds the name
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return _REGISTRY[obj.name]
    if callable(obj):
        for spec in _REGISTRY.values():
            if spec.fn is obj:
                return spec
        own = getattr(obj, "__slca_estimator__", None)
        if isinstance(own, EstimatorSpec) and own.fn is obj:  # registered at import, since dropped from the registry
            register_estimator(own.name, own)
            return own
        raise ValueError(f"{where} is not a registered estimator: decorate it with @slca.register_estimator(\"NAME\") "
                         "in its module (the import path then finds it)")
    raise ValueError(f"{where} is a {type(obj).__name__}, not an estimator function")


def list_estimators(*, reference: bool | None = None) -> list[str]:
    """Registered names, sorted; ``reference=True``: only the reference estimators, in registration order."""
    if reference is None:
        return sorted(_REGISTRY)
    return [n for n, s in _REGISTRY.items() if s.reference == reference]


def compute_advantages(name: str, inputs: AdvantageInputs, **options: Any) -> torch.Tensor:
    """Dispatch to the estimator registered under ``name``; returns (B, T).

    Options the estimator does not declare raise ValueError naming it and the option.
    """
    return get_estimator(name)(inputs, **options)


def fill_inputs(inputs: AdvantageInputs, name: str, trajectories: Sequence[Any]) -> AdvantageInputs:
    """``inputs`` with every input estimator ``name`` needs computed from the batch's trajectories."""
    spec = get_estimator(name)
    return inputs.with_inputs({n: get_input(n).from_trajectories(trajectories) for n in spec.needs})


@register_estimator("grpo", options=GroupOptions, reference=True, trajectory=True)
def _grpo(inputs: AdvantageInputs, *, scale: str, eps: float) -> torch.Tensor:
    """One scalar (weighted sum of both tiers) per rollout, on every policy token."""
    return grpo_advantages(inputs.total_rewards, inputs.group_ids, inputs.model_mask, scale=scale, eps=eps)


@register_estimator("slca", options=SLCAOptions, reference=True)
def _slca(inputs: AdvantageInputs, *, scale: str, eps: float, empty_tool: str, empty_summary: str) -> torch.Tensor:
    """Each tier normalised on its own and locked to its segment."""
    return slca_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.tool_mask, inputs.summary_mask,
        scale=scale, eps=eps, empty_tool=empty_tool, empty_summary=empty_summary,
    )


@register_estimator("gdpo", options=GroupOptions, reference=True)
def _gdpo(inputs: AdvantageInputs, *, scale: str, eps: float) -> torch.Tensor:
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
    sd = torch.where(use_sub, std_s[idx_s], std_g[idx_g]) if cond_std == "subgroup" else std_g[idx_g]
    return _scaled(rc, rc.double() - base, sd, cnt_g[idx_g], scale, eps).to(r.device)


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


register_input(InputSpec(
    "tool_signatures", "one hashable per rollout, e.g. slca.rewards.turns.tool_signature(turns)",
    "slca.rewards.turns:tool_signatures",
))
register_input(InputSpec(
    "turn_rewards", "(B, K) per-turn scores, e.g. slca.rewards.turns.turn_scores per rollout",
    "slca.rewards.turns:turn_rewards",
))


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
