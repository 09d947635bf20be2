"""The estimators as the paper's authors released them: ``slca_paper``, ``toolpo_grpo``, ``rltr_planner``.

Source: the authors' repository ``SLCA-GRPO/SLCA-GRPO`` at commit 68539c5 (Apache-2.0),
``verl/verl/trainer/ppo/core_algos.py``: ``compute_slca_grpo_advantage``,
``compute_toolpo_grpo_advantage``, ``compute_rltr_planner_advantage`` and their helpers
``_build_two_segment_masks``, ``_groupwise_normalize_with_present``. The rules are restated
here from reading that file (none of its code is copied); ``tests/test_core_paper.py`` ports
its CPU test file case by case and compares these functions with a loop-for-loop reference
of the released code on thousands of random batches.

How they differ from slca's own ``slca`` (:func:`slca.core.advantages.slca_advantages`), in
short (docs/released.md has the whole table, the reasons and the measurements):

* **Segments are positional.** The summary segment is the *last contiguous run* of policy
  tokens, the process segment the union of the earlier runs (:func:`positional_segments`).
  slca's segments come from the environment boundary (:func:`slca.core.segments.segment_masks`):
  the same on a rollout that calls and then answers, different on a rollout that ends on a
  call (stopped at ``max_turns``): here that call is its summary.
* **Missing segments are left out.** Each segment is normalised only over the group members
  that have it (:func:`present_normalize`); a rollout with one run (no call) has a summary
  only and takes no part in the process statistics.
* **A penalty guard**: when a call was needed and none was made (``should_no_call``) or the
  total score is negative, the process score becomes 0 and the summary score is replaced by
  the total.
* **Weights after normalisation**: ``lambda_tool`` / ``lambda_sum`` (their ``w_process`` /
  ``w_respq``) multiply each segment's normalised advantage.
* **KL folding**: with the KL penalty in the reward, each segment's summed per-token KL is
  added to its score before normalisation (``kl_rewards``; slca's hosts keep the KL in the
  loss, so it is absent and this is a no-op there).

Numerics: the group statistics are computed in float64 (as everywhere in slca), the
released code's in float32. Where a group's scores are tied, float32 rounding can leave
the released code a std of a few ulp and advantages of order ``ulp / eps`` (measured up to
0.06 for a group of equal float32 scores) that are exactly 0 here; elsewhere the two agree to float32 rounding. A NaN score
(a rollout slca could not score) is treated as missing (advantage 0, left out of its
group's statistics); the released code has no NaN scores and would spread the NaN over
the group.

Shapes: ``B`` rollouts, ``T`` response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from slca._checks import as_1d, as_2d, check_mask, check_same_shape, group_index
from slca.core.advantages import EPS, group_normalize
from slca.core.registry import AdvantageInputs, Eps, option, register_estimator

__all__ = [
    "PAPER_COMMIT",
    "PAPER_SCALES",
    "positional_segments",
    "present_normalize",
    "slca_paper_advantages",
    "toolpo_grpo_advantages",
    "rltr_planner_advantages",
    "PaperOptions",
    "ToolPOOptions",
    "RLTROptions",
]

PAPER_COMMIT = "68539c59800a6702a782e57d20376199b9e4dead"
"""The commit of ``SLCA-GRPO/SLCA-GRPO`` these estimators restate."""

PAPER_SCALES = ("group", "none")
"""``norm_adv_by_std_in_grpo`` True / False of the released code (it has no batch scaling)."""


def positional_segments(model_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The released code's two segments: the last run of policy tokens, and every earlier run.

    With ``run[i, t]`` the number of policy-token runs that start at or before ``t`` in row
    ``i`` (a run starts where ``model[i, t] = 1`` and ``t = 0`` or ``model[i, t-1] = 0``):

        ``summary[i, t] = model[i, t] and run[i, t] = max_s run[i, s]``,
        ``process[i, t] = model[i, t] and not summary[i, t]``.

    A row with one run is all summary; a row without policy tokens has neither. The two
    masks partition ``model_mask``. (``_build_two_segment_masks`` in the released
    ``core_algos.py``, without its per-row loop; ``present`` flags are ``mask.any(dim=1)``.)

    Args:
        model_mask: (B, T) 0/1, 1 on policy tokens (verl's ``response_mask``: 0 on tool
            responses and padding).

    Returns:
        ``(process_mask, summary_mask)``, each (B, T) bool.

    Example:
        >>> p, s = positional_segments(torch.tensor([[1, 1, 0, 0, 1, 0, 0, 1, 1, 0]]))
        >>> p.int().tolist(), s.int().tolist()
        ([[1, 1, 0, 0, 1, 0, 0, 0, 0, 0]], [[0, 0, 0, 0, 0, 0, 0, 1, 1, 0]])
    """
    m = check_mask("model_mask", as_2d("model_mask", model_mask))
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    run = (m & ~prev).long().cumsum(dim=1)  # (B, T): 1, 2, ... from each run's first token on
    if m.shape[1] == 0:
        return m.clone(), m.clone()
    summary = m & (run == run.amax(dim=1, keepdim=True))
    return m & ~summary, summary


def present_normalize(
    scores: torch.Tensor, group_ids: Any, present: torch.Tensor, *, scale: str = "group", eps: float = EPS
) -> torch.Tensor:
    """Group normalisation over the members that are present (``_groupwise_normalize_with_present``).

    ``A_i = (s_i - mean_P) / (std_P + eps)`` (``scale="group"``; ``"none"``: ``s_i - mean_P``)
    with ``P = {j in g(i) : present_j}`` and ``std`` unbiased; 0 where ``present_i`` is False
    and in every group with ``|P| <= 1``. This is :func:`~slca.core.advantages.group_normalize`
    with the absent members' scores set to NaN.

    Args:
        scores: (B,) float.
        group_ids: (B,) group ids (tensor or sequence of hashables).
        present: (B,) bool, whether rollout ``i`` has the segment.

    Returns:
        (B,) float32.

    Example:
        >>> present_normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]), [0] * 4, torch.tensor([True, True, False, False]),
        ...                   scale="none").tolist()
        [-0.5, 0.5, 0.0, 0.0]
    """
    s = as_1d("scores", scores)
    p = check_mask("present", as_1d("present", present, s.shape[0]))
    if scale not in PAPER_SCALES:
        raise ValueError(f"scale must be one of {PAPER_SCALES} (the released code has no batch scaling), got {scale!r}")
    r = torch.where(p.to(s.device), s.float(), torch.full_like(s, float("nan"), dtype=torch.float32))
    return group_normalize(r, group_ids, scale=scale, eps=eps)


def _per_row(name: str, value: Any, B: int, device: torch.device, default: float | None) -> torch.Tensor:
    """(B,) float32 on ``device``: ``value``, or ``default`` everywhere when it is None."""
    if value is None:
        if default is None:
            raise ValueError(f"{name} is required")
        return torch.full((B,), default, dtype=torch.float32, device=device)
    return as_1d(name, value, B).to(device=device, dtype=torch.float32)


def _segment_kl(kl_rewards: Any, mask: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """(B,) the per-token KL term (``token_level_rewards - token_level_scores``) summed over ``seg``; 0 without one."""
    if kl_rewards is None:
        return torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    kl = as_2d("kl_rewards", kl_rewards).to(mask.device)
    check_same_shape(model_mask=mask, kl_rewards=kl)
    return (kl.float() * seg.float()).sum(dim=1)


def slca_paper_advantages(
    process_scores: torch.Tensor,
    summary_scores: torch.Tensor,
    group_ids: Any,
    model_mask: torch.Tensor,
    *,
    score_total: torch.Tensor | None = None,
    should_no_call: torch.Tensor | None = None,
    kl_rewards: torch.Tensor | None = None,
    lambda_tool: float = 1.0,
    lambda_sum: float = 1.0,
    scale: str = "group",
    eps: float = EPS,
) -> torch.Tensor:
    """SLCA-GRPO exactly as released (``compute_slca_grpo_advantage``, commit 68539c5).

    With the positional segments ``P`` (process) and ``S`` (summary) of :func:`positional_segments`,
    ``pen_i = should_no_call_i or score_total_i < 0`` (the penalty guard) and ``kl`` the per-token
    KL term of the reward:

        ``x^p_i = (0 if pen_i else process_i) + sum_{t in P_i} kl_{i,t}``,
        ``x^s_i = (score_total_i if pen_i else summary_i) + sum_{t in S_i} kl_{i,t}``,
        ``A^p = lambda_tool * norm(x^p | P_i non-empty)``, ``A^s = lambda_sum * norm(x^s | S_i non-empty)``,
        ``A_{i,t} = A^p_i`` on ``P_i``, ``A^s_i`` on ``S_i``, 0 elsewhere,

    where ``norm(x | present)`` is :func:`present_normalize` (a group with at most one member
    that has the segment gives 0). The weights act after normalisation, so they scale the
    advantages (before it, the z-score would cancel them).

    Args:
        process_scores: (B,) process-segment (execution) score.
        summary_scores: (B,) summary-segment score.
        group_ids: (B,) group ids.
        model_mask: (B, T) 0/1 policy tokens.
        score_total: (B,) the rollout's total score (may be negative); None gives 0 (no
            negative-score guard), as the released code does when it is missing.
        should_no_call: (B,) 0/1, a call was needed and none was made; None gives 0.
        kl_rewards: (B, T) per-token KL term in the reward (``token_level_rewards -
            token_level_scores``); None gives 0 (KL in the loss, or none).
        lambda_tool, lambda_sum: segment weights, applied after normalisation.
        scale: ``"group"`` (divide by the std) or ``"none"`` (centre only, Dr. GRPO).
        eps: added to the std.

    Returns:
        (B, T) float32, zero outside ``model_mask``.
    """
    mask = check_mask("model_mask", as_2d("model_mask", model_mask))
    B, dev = mask.shape[0], mask.device
    proc_m, sum_m = positional_segments(mask)
    proc = _per_row("process_scores", process_scores, B, dev, None)
    summ = _per_row("summary_scores", summary_scores, B, dev, None)
    total = _per_row("score_total", score_total, B, dev, 0.0)
    no_call = _per_row("should_no_call", should_no_call, B, dev, 0.0)
    pen = (no_call > 0.5) | (total < 0)
    x_p = torch.where(pen, torch.zeros_like(proc), proc) + _segment_kl(kl_rewards, mask, proc_m)
    x_s = torch.where(pen, total, summ) + _segment_kl(kl_rewards, mask, sum_m)
    a_p = float(lambda_tool) * present_normalize(x_p, group_ids, proc_m.any(dim=1), scale=scale, eps=eps).to(dev)
    a_s = float(lambda_sum) * present_normalize(x_s, group_ids, sum_m.any(dim=1), scale=scale, eps=eps).to(dev)
    return a_p.unsqueeze(1) * proc_m.float() + a_s.unsqueeze(1) * sum_m.float()


def _grpo_singleton_raw(total: torch.Tensor, group_ids: Any, *, scale: str, eps: float) -> torch.Tensor:
    """(B,) float32 GRPO advantages as verl's ``compute_grpo_outcome_advantage`` gives them, singletons included.

    As :func:`~slca.core.advantages.group_normalize`, except that a rollout alone in its group
    gets its raw score (``s / (1 + eps)``, or ``s`` with ``scale="none"``): verl's fallback
    ``mean = 0, std = 1``, which ToolPO's released ``A_global`` keeps.
    """
    a = group_normalize(total, group_ids, scale=scale, eps=eps).to(total.device)
    idx, G = group_index(group_ids, total.shape[0])
    alone = (torch.bincount(idx.cpu(), minlength=G)[idx.cpu()] == 1).to(total.device)
    raw = total.float() / (1.0 + eps) if scale == "group" else total.float()
    return torch.where(alone, raw, a)


def toolpo_grpo_advantages(
    total_scores: torch.Tensor,
    correct_ratio: torch.Tensor,
    group_ids: Any,
    model_mask: torch.Tensor,
    *,
    kl_rewards: torch.Tensor | None = None,
    toolpo_lambda: float = 1.0,
    scale: str = "group",
    eps: float = EPS,
) -> torch.Tensor:
    """ToolPO as the authors ran it as a baseline (``compute_toolpo_grpo_advantage``, commit 68539c5).

    An additive tool advantage on top of GRPO (ToolPO, Eq. 7):

        ``A_{i,t} = A^glob_i + [t in P_i] * toolpo_lambda * A^tool_i``  on policy tokens,

    with ``A^glob`` GRPO on the whole score ``total_i + sum_t kl_{i,t}`` (verl's fallback for a
    group of one: the raw score, :func:`_grpo_singleton_raw`), ``A^tool = norm(correct_ratio |
    P_i non-empty)`` (:func:`present_normalize`) and ``P`` the positional process segment.
    Summary tokens (and the whole of a one-run rollout) get ``A^glob`` only, so the summary
    reward still reaches tool tokens through ``A^glob``: the additive form does not lock.

    Args:
        total_scores: (B,) the rollout's scalar reward (ToolPO's ``R_succ``; slca's weighted total).
        correct_ratio: (B,) ``sum C(a^call) / |gold calls|`` (``toolpo_correct_ratio``).
        group_ids: (B,) group ids.
        model_mask: (B, T) 0/1 policy tokens.
        kl_rewards: (B, T) per-token KL term in the reward, or None.
        toolpo_lambda: weight of the tool advantage.

    Returns:
        (B, T) float32, zero outside ``model_mask``.
    """
    mask = check_mask("model_mask", as_2d("model_mask", model_mask))
    B, dev = mask.shape[0], mask.device
    if scale not in PAPER_SCALES:
        raise ValueError(f"scale must be one of {PAPER_SCALES} (the released code has no batch scaling), got {scale!r}")
    proc_m, _ = positional_segments(mask)
    total = _per_row("total_scores", total_scores, B, dev, None) + _segment_kl(kl_rewards, mask, mask)
    a_glob = _grpo_singleton_raw(total, group_ids, scale=scale, eps=eps)
    ratio = _per_row("correct_ratio", correct_ratio, B, dev, None)
    a_tool = present_normalize(ratio, group_ids, proc_m.any(dim=1), scale=scale, eps=eps).to(dev)
    return a_glob.unsqueeze(1) * mask.float() + (float(toolpo_lambda) * a_tool).unsqueeze(1) * proc_m.float()


def rltr_planner_advantages(
    comp: torch.Tensor,
    repeat_penalty: torch.Tensor,
    error_penalty: torch.Tensor,
    format_valid: torch.Tensor,
    group_ids: Any,
    model_mask: torch.Tensor,
    *,
    kl_rewards: torch.Tensor | None = None,
    scale: str = "group",
    eps: float = EPS,
) -> torch.Tensor:
    """RLTR's planner as the authors ran it as a baseline (``compute_rltr_planner_advantage``, commit 68539c5).

    RLTR (arXiv 2508.19598) trains a planner on the tool trajectory alone and leaves the answer
    to a frozen summariser; in one model that means only the process segment learns:

        ``R_i = comp_i + repeat_i + error_i`` if ``format_valid_i``, else ``-1`` (RLTR, Eq. 3),
        ``A_{i,t} = norm(R + sum_{t in P_i} kl_{i,t} | P_i non-empty)_i``  on ``P_i``, 0 elsewhere.

    Args:
        comp: (B,) completeness reward in [0, 1] (``rltr_comp``).
        repeat_penalty: (B,) penalty for consecutive repeated calls, <= 0 (``rltr_repeat_penalty``).
        error_penalty: (B,) penalty for invalid calls, <= 0 (``rltr_error_penalty``).
        format_valid: (B,) 0/1 (``rltr_format_valid``).
        group_ids: (B,) group ids.
        model_mask: (B, T) 0/1 policy tokens.
        kl_rewards: (B, T) per-token KL term in the reward, or None.

    Returns:
        (B, T) float32, zero outside the positional process segment.
    """
    mask = check_mask("model_mask", as_2d("model_mask", model_mask))
    B, dev = mask.shape[0], mask.device
    proc_m, _ = positional_segments(mask)
    parts = [_per_row(n, v, B, dev, None) for n, v in
             (("comp", comp), ("repeat_penalty", repeat_penalty), ("error_penalty", error_penalty), ("format_valid", format_valid))]
    r = torch.where(parts[3] > 0.5, parts[0] + parts[1] + parts[2], torch.full_like(parts[0], -1.0))
    r = r + _segment_kl(kl_rewards, mask, proc_m)
    a = present_normalize(r, group_ids, proc_m.any(dim=1), scale=scale, eps=eps).to(dev)
    return a.unsqueeze(1) * proc_m.float()


# --------------------------------------------------------------------------- registration

PaperScale = Literal[PAPER_SCALES]


@dataclass(frozen=True)
class _PaperNorm:
    """The normalisation options the three released estimators share."""

    scale: PaperScale = option("group", "'group' divides by the group std (norm_adv_by_std_in_grpo=True), 'none' only "
                               "centres (Dr. GRPO); the released code has no batch scaling.")
    eps: Eps = option(EPS, "Added to the std in the normalisation.")


@dataclass(frozen=True)
class PaperOptions(_PaperNorm):
    """Options of ``slca_paper`` (:func:`slca_paper_advantages`)."""

    lambda_tool: float = option(1.0, "slca_paper: weight of the process segment's advantage, applied after "
                                "normalisation (the released SLCA_WEIGHT_PROCESS, which also weights the reward).")
    lambda_sum: float = option(1.0, "slca_paper: weight of the summary segment's advantage, applied after "
                               "normalisation (the released SLCA_WEIGHT_RESPQ).")


@dataclass(frozen=True)
class ToolPOOptions(_PaperNorm):
    """Options of ``toolpo_grpo`` (:func:`toolpo_grpo_advantages`)."""

    toolpo_lambda: float = option(1.0, "toolpo_grpo: weight of the tool advantage added on process tokens.")


@dataclass(frozen=True)
class RLTROptions(_PaperNorm):
    """Options of ``rltr_planner`` (:func:`rltr_planner_advantages`)."""


def _score_total(inputs: AdvantageInputs) -> torch.Tensor:
    """(B,) ``extra["score_total"]`` when a host gives it, else the weighted total of the two tiers."""
    given = inputs.get("score_total")
    return inputs.total_rewards if given is None else as_1d("score_total", given, inputs.model_mask.shape[0])


@register_estimator("slca_paper", needs=("should_no_call",), options=PaperOptions)
def _slca_paper(inputs: AdvantageInputs, *, scale: str, eps: float, lambda_tool: float, lambda_sum: float) -> torch.Tensor:
    """SLCA exactly as its authors released it (positional segments, present-only statistics, penalty guard)."""
    return slca_paper_advantages(
        inputs.tool_rewards, inputs.summary_rewards, inputs.group_ids, inputs.model_mask,
        score_total=_score_total(inputs), should_no_call=inputs.get("should_no_call"),
        kl_rewards=inputs.get("kl_rewards"), lambda_tool=lambda_tool, lambda_sum=lambda_sum, scale=scale, eps=eps,
    )


@register_estimator("toolpo_grpo", needs=("toolpo_correct_ratio",), options=ToolPOOptions)
def _toolpo_grpo(inputs: AdvantageInputs, *, scale: str, eps: float, toolpo_lambda: float) -> torch.Tensor:
    """The authors' ToolPO baseline: GRPO on every token plus a tool advantage on process tokens."""
    return toolpo_grpo_advantages(
        _score_total(inputs), inputs.get("toolpo_correct_ratio"), inputs.group_ids, inputs.model_mask,
        kl_rewards=inputs.get("kl_rewards"), toolpo_lambda=toolpo_lambda, scale=scale, eps=eps,
    )


@register_estimator("rltr_planner", needs=("rltr_comp", "rltr_repeat_penalty", "rltr_error_penalty", "rltr_format_valid"),
                    options=RLTROptions)
def _rltr_planner(inputs: AdvantageInputs, *, scale: str, eps: float) -> torch.Tensor:
    """The authors' RLTR baseline: RLTR's planner reward on process tokens only."""
    return rltr_planner_advantages(
        inputs.get("rltr_comp"), inputs.get("rltr_repeat_penalty"), inputs.get("rltr_error_penalty"),
        inputs.get("rltr_format_valid"), inputs.group_ids, inputs.model_mask,
        kl_rewards=inputs.get("kl_rewards"), scale=scale, eps=eps,
    )
