"""Execution / summary segments from the environment-boundary mask, and their span-level refinement.

SLCA-GRPO (arXiv 2609.29050, Sec. 3.3): the *execution segment* is every policy
token before the last environment (tool-response) token; the *summary segment* is
every policy token after it. The split is deterministic: no learned segmenter.

Beyond the paper (docs/beyond.md, "Reasoning and calls inside text"): each policy
token may also carry a span label (:data:`SPAN_TEXT`, :data:`SPAN_THINK`,
:data:`SPAN_CALL`), read from its turn's text by :func:`slca.chat.spans.span_labels`;
:func:`span_segment_masks` moves the text around a turn's calls to the summary
segment (``segmentation="span"``), :func:`think_mask` picks the reasoning tokens
of the execution segment (``slca_think``).
"""

from __future__ import annotations

import torch

from slca._checks import as_2d, check_mask, check_same_shape

__all__ = [
    "segment_masks",
    "environment_mask",
    "turn_index",
    "tool_turn_index",
    "last_tool_turn",
    "SPAN_NONE",
    "SPAN_TEXT",
    "SPAN_THINK",
    "SPAN_CALL",
    "SPAN_KINDS",
    "SEGMENTATIONS",
    "span_segment_masks",
    "think_mask",
]

SPAN_NONE, SPAN_TEXT, SPAN_THINK, SPAN_CALL = 0, 1, 2, 3
"""Span labels of response tokens: not a policy token, other policy text, reasoning (``<think>...</think>``, tags
included), a tool call (``<tool_call>...</tool_call>`` for hermes; the JSON list for json_list). A token that straddles
two spans takes the larger label (call over reasoning over text; :func:`slca.chat.spans.token_labels`)."""
SPAN_KINDS = ("none", "text", "think", "call")
"""The name of each span label, by value."""
SEGMENTATIONS = ("boundary", "span")
"""``boundary``: the segments of :func:`segment_masks` (the paper's); ``span``: :func:`span_segment_masks` of them."""


def _last_true(mask: torch.Tensor) -> torch.Tensor:
    """(B, 1) long: the position of each row's last True in the (B, T) bool ``mask``, -1 when none
    (every row of a ``T = 0`` batch)."""
    B, T = mask.shape
    if T == 0:  # amax over an empty dimension is undefined
        return torch.full((B, 1), -1, dtype=torch.long, device=mask.device)
    pos = torch.arange(T, device=mask.device)
    return torch.where(mask, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)


def environment_mask(model_mask: torch.Tensor, valid_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Environment (tool-response) tokens of each response.

    Args:
        model_mask: (B, T) 0/1, 1 where the policy generated the token.
        valid_mask: (B, T) 0/1 or None, 1 on every real (non-padding) token.
            Without it, zeros after the last policy token are taken as padding
            and every other zero is an environment token.

    Returns:
        (B, T) bool, True on environment tokens.
    """
    model = check_mask("model_mask", as_2d("model_mask", model_mask))
    if valid_mask is None:
        pos = torch.arange(model.shape[1], device=model.device)
        valid = pos.unsqueeze(0) <= _last_true(model)  # up to the last policy token of each row
    else:
        valid = check_mask("valid_mask", as_2d("valid_mask", valid_mask))
        check_same_shape(model_mask=model, valid_mask=valid)
        if (model & ~valid).any():
            raise ValueError("model_mask has 1 where valid_mask has 0: policy tokens must be valid tokens")
    return valid & ~model


def segment_masks(
    model_mask: torch.Tensor, valid_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split policy tokens into the execution (tool) and summary segments.

    The boundary ``b`` of row ``i`` is the position of its last environment token.
    ``tool[i, t] = model[i, t] and t < b``; ``summary[i, t] = model[i, t] and t > b``.
    A row with no environment token is all summary (the rollout made no call,
    or its call was never answered). An empty batch (``B = 0``) or empty
    responses (``T = 0``) give empty masks of the same ``(B, T)`` shape.

    Args:
        model_mask: (B, T) 0/1 (bool, int or float), 1 where the policy generated
            response token ``t``; 0 for environment tokens and padding.
        valid_mask: (B, T) 0/1 or None, 1 on every real token, so that
            environment tokens (``valid & ~model``) can be told from padding.
            Without it, trailing zeros are padding.

    Returns:
        ``(tool_mask, summary_mask)``, each (B, T) in ``model_mask``'s dtype;
        disjoint, and their sum equals ``model_mask``.

    Example:
        >>> import torch
        >>> m = torch.tensor([[1, 1, 0, 0, 1, 1, 0]])   # call, tool reply, answer, pad
        >>> tool, summ = segment_masks(m)
        >>> tool.tolist(), summ.tolist()
        ([[1, 1, 0, 0, 0, 0, 0]], [[0, 0, 0, 0, 1, 1, 0]])
    """
    mm = as_2d("model_mask", model_mask)
    env = environment_mask(mm, valid_mask)
    model = mm.bool() if mm.dtype != torch.bool else mm
    pos = torch.arange(model.shape[1], device=model.device).unsqueeze(0)
    last_env = _last_true(env)  # (B, 1)
    tool = model & (pos < last_env)
    summary = model & (pos > last_env)
    return tool.to(mm.dtype), summary.to(mm.dtype)


def turn_index(model_mask: torch.Tensor, valid_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Which tool turn each execution-segment token belongs to.

    A turn is a maximal run of policy tokens (the rollout engine appends every
    assistant turn as one run and the environment's answer after it). Runs are
    numbered ``0, 1, ...`` from the start of the response:

        ``start[i, t] = model[i, t] and (t == 0 or not model[i, t-1])``,
        ``k[i, t] = sum_{s <= t} start[i, s] - 1``,

    and ``turn_index[i, t] = k[i, t]`` where ``t`` is in the tool mask of
    :func:`segment_masks`, ``-1`` everywhere else (summary, environment, padding).
    Run ``k`` of the tool segment is the rollout's ``k``-th tool turn.

    Args:
        model_mask: (B, T) 0/1, 1 where the policy generated the token.
        valid_mask: (B, T) 0/1 or None, as in :func:`segment_masks`.

    Returns:
        (B, T) long.

    Example:
        >>> import torch
        >>> turn_index(torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1, 0]])).tolist()
        [[0, 0, -1, 1, -1, -1, -1, -1, -1]]
    """
    mm = as_2d("model_mask", model_mask)
    tool, _ = segment_masks(mm, valid_mask)
    return tool_turn_index(mm, tool)


def tool_turn_index(model_mask: torch.Tensor, tool_mask: torch.Tensor) -> torch.Tensor:
    """:func:`turn_index` for a given tool mask: run index of each policy token where
    ``tool_mask`` is 1, -1 elsewhere.

    Args:
        model_mask: (B, T) 0/1 policy tokens.
        tool_mask: (B, T) 0/1 tool tokens (a subset of ``model_mask``).

    Returns:
        (B, T) long.
    """
    model = check_mask("model_mask", as_2d("model_mask", model_mask))
    tool = check_mask("tool_mask", as_2d("tool_mask", tool_mask))
    check_same_shape(model_mask=model, tool_mask=tool)
    if (tool & ~model).any():
        raise ValueError("tool_mask has 1 where model_mask has 0: tool tokens must be policy tokens")
    prev = torch.zeros_like(model)
    prev[:, 1:] = model[:, :-1]
    k = (model & ~prev).long().cumsum(dim=1) - 1
    return torch.where(tool, k, torch.full_like(k, -1))


def last_tool_turn(tool_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the tokens of each row's last tool turn (the last run of 1s in ``tool_mask``).

    Tool turns are separated by environment tokens, which are 0 in the tool
    mask, so the runs of the tool mask are the tool turns. All False on a row
    without a tool token.

    Example:
        >>> import torch
        >>> last_tool_turn(torch.tensor([[1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]])).int().tolist()
        [[0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]]
    """
    tm = check_mask("tool_mask", as_2d("tool_mask", tool_mask))
    k = tool_turn_index(tm, tm)  # run index on tool tokens, -1 elsewhere
    if k.shape[1] == 0:
        return torch.zeros_like(tm)
    return tm & (k == k.amax(dim=1, keepdim=True))


def _span_checks(tool_mask: torch.Tensor, span_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tm = check_mask("tool_mask", as_2d("tool_mask", tool_mask))
    labels = as_2d("span_labels", span_labels)
    check_same_shape(tool_mask=tm, span_labels=labels)
    if labels.numel() == 0:  # an empty list has no integer dtype
        labels = labels.long()
    if torch.is_floating_point(labels) or labels.dtype == torch.bool:
        raise ValueError(f"span_labels must be an integer tensor (slca.chat.spans.span_labels), got {labels.dtype}")
    labels = labels.to(tm.device)
    if ((labels < SPAN_NONE) | (labels > SPAN_CALL)).any():
        raise ValueError(f"span_labels must hold {SPAN_NONE}..{SPAN_CALL} ({', '.join(SPAN_KINDS)}), got "
                         f"{sorted(set(labels.unique().tolist()))}")
    if (tm & (labels == SPAN_NONE)).any():
        raise ValueError("span_labels is 0 (not a policy token) on a tool-segment token: labels and masks are of "
                         "different rows or tokens")
    return tm, labels


def span_segment_masks(
    tool_mask: torch.Tensor, summary_mask: torch.Tensor, span_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Span-level segments (``segmentation="span"``): text around the calls of a tool turn joins the summary segment.

    A tool turn is a run of the tool mask (tool turns are separated by environment
    tokens). In a tool turn that holds a :data:`SPAN_CALL` token, its
    :data:`SPAN_TEXT` tokens move from the execution to the summary segment; its
    call and reasoning tokens stay. A tool turn without a call token (an attempt
    the environment answered as failed, written without the format's call span)
    keeps all its tokens: it is execution as a whole, as in the boundary split.
    The summary segment keeps every token it had.

    ``tool'[i, t] = tool[i, t] and not (L[i, t] == TEXT and turn k(i, t) has a CALL)``,
    ``summary'[i, t] = summary[i, t] or (tool[i, t] and not tool'[i, t])``.

    Args:
        tool_mask, summary_mask: (B, T) 0/1, disjoint (:func:`segment_masks`).
        span_labels: (B, T) integer labels (:data:`SPAN_NONE` .. :data:`SPAN_CALL`), a
            policy label on every tool token.

    Returns:
        ``(tool_mask, summary_mask)``, each (B, T) in ``tool_mask``'s dtype; disjoint,
        with the same union as the inputs.

    Example:
        >>> import torch
        >>> tool = torch.tensor([[1, 1, 1, 0, 1, 1]])           # turn 0: text + call; turn 1: text, no call
        >>> summ = torch.zeros_like(tool)
        >>> labels = torch.tensor([[1, 3, 3, 0, 1, 1]])
        >>> [m.tolist() for m in span_segment_masks(tool, summ, labels)]
        [[[0, 1, 1, 0, 1, 1]], [[1, 0, 0, 0, 0, 0]]]
    """
    raw = as_2d("tool_mask", tool_mask)
    tm, labels = _span_checks(raw, span_labels)
    sm = check_mask("summary_mask", as_2d("summary_mask", summary_mask))
    check_same_shape(tool_mask=tm, summary_mask=sm)
    B, T = tm.shape
    k = tool_turn_index(tm, tm)  # (B, T) run of the tool mask, -1 elsewhere
    K = int(k.max()) + 1 if k.numel() else 0
    call = (tm & (labels == SPAN_CALL)).long()
    has_call = torch.zeros(B, K + 1, dtype=torch.long, device=tm.device).scatter_reduce(1, k + 1, call, "amax")  # slot 0: k = -1
    moved = tm & (labels == SPAN_TEXT) & has_call.gather(1, k + 1).bool()
    return (tm & ~moved).to(raw.dtype), (sm | moved).to(raw.dtype)


def think_mask(tool_mask: torch.Tensor, span_labels: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the reasoning (:data:`SPAN_THINK`) tokens of the execution segment.

    Reasoning in the summary segment (the thinking before the final answer) is not
    in it: it stays summary (``slca_think``, docs/beyond.md).

    Args:
        tool_mask: (B, T) 0/1 execution segment.
        span_labels: (B, T) integer span labels.
    """
    tm, labels = _span_checks(tool_mask, span_labels)
    return tm & (labels == SPAN_THINK)
