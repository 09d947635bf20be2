"""Token batches: padding, positions and per-token log-probabilities.

One home for what every forward pass over rollouts needs: the trainer's
re-scoring of a rollout batch (:func:`collate` + :func:`response_logprobs`),
the rollout module's :func:`~slca.generation.rollout.trajectory_logprobs` and the evaluation
agent's left-padded prompts (:func:`pad`). The log-probabilities at the targets are
:func:`slca.core.losses.token_logprobs` (pure math, shared with the fast paths).

Layout of a :class:`RolloutBatch`: prompts left-padded to a common length
``P`` so every response starts at column ``P``; responses right-padded to
``T``; ``position_ids`` count each row's real tokens, so a row's positions are
those of its own sequence fed alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slca.core.losses import token_logprobs
from slca.types import Trajectory

__all__ = ["RolloutBatch", "pad", "positions", "collate", "response_logprobs"]


def pad(
    seqs: Sequence[Sequence[int | float]],
    value: int | float,
    *,
    width: int | None = None,
    left: bool = False,
    dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sequences of different lengths into ``(values, attention_mask)``.

    Args:
        seqs: B sequences.
        value: the padding value.
        width: the padded length W (default: the longest sequence); must be >= it.
        left: pad on the left (right-align the sequences), else on the right.

    Returns:
        ``(B, W)`` tensor of ``dtype`` and ``(B, W)`` long mask, 1 on real entries.
    """
    W = max((len(s) for s in seqs), default=0) if width is None else width
    out = torch.full((len(seqs), W), value, dtype=dtype)
    att = torch.zeros(len(seqs), W, dtype=torch.long)
    for i, s in enumerate(seqs):
        n = len(s)
        if n > W:
            raise ValueError(f"pad: sequence {i} has {n} entries, more than width {W}")
        if n:
            sl = slice(W - n, W) if left else slice(0, n)
            out[i, sl] = torch.tensor(list(s), dtype=dtype)
            att[i, sl] = 1
    return out, att


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) position ids that skip padding: ``cumsum(mask) - 1``, 0 on leading pads."""
    return (attention_mask.cumsum(1) - 1).clamp_min(0)


@dataclass
class RolloutBatch:
    """Token tensors of one rollout batch, prompts left-padded so responses align.

    Attributes:
        input_ids: (B, P + T) prompt (left-padded) + response (right-padded).
        attention_mask: (B, P + T) 1 on real tokens.
        position_ids: (B, P + T) positions that ignore the left padding.
        prompt_len: P, where every response starts.
        model_mask: (B, T) 1 on policy tokens.
        valid_mask: (B, T) 1 on real response tokens (policy and environment).
        old_logprobs: (B, T) sampling log-probabilities (0 off policy tokens).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_len: int
    model_mask: torch.Tensor
    valid_mask: torch.Tensor
    old_logprobs: torch.Tensor

    def rows(self, idx: torch.Tensor) -> "RolloutBatch":
        return RolloutBatch(
            self.input_ids[idx], self.attention_mask[idx], self.position_ids[idx], self.prompt_len,
            self.model_mask[idx], self.valid_mask[idx], self.old_logprobs[idx],
        )


def collate(trajs: list[Trajectory], pad_id: int, device: str | torch.device = "cpu") -> RolloutBatch:
    """Stack trajectories into a :class:`RolloutBatch` (on ``device``)."""
    if not trajs:
        raise ValueError("collate: trajs is empty")
    T = max(max(len(t.response_ids) for t in trajs), 1)
    p_ids, p_att = pad([t.prompt_ids for t in trajs], pad_id, left=True)
    r_ids, vm = pad([t.response_ids for t in trajs], pad_id, width=T)
    mm, _ = pad([t.model_mask for t in trajs], 0, width=T)
    lp, _ = pad([t.logprobs for t in trajs], 0.0, width=T, dtype=torch.float32)
    ids, att = torch.cat([p_ids, r_ids], dim=1), torch.cat([p_att, vm], dim=1)
    d = torch.device(device)
    return RolloutBatch(ids.to(d), att.to(d), positions(att).to(d), p_ids.shape[1], mm.to(d), vm.to(d), lp.to(d))


def response_logprobs(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0, fast: bool = True) -> torch.Tensor:
    """Log-probabilities of the response tokens under ``model`` at ``temperature``.

    ``fast``: supported models (stock Qwen2 / Llama) run
    :func:`slca.generation.fastpath.logprobs.fast_response_logprobs`: rows that share a
    prompt (a group's rollouts) run it once and continue from its KV cache;
    otherwise right-padded with no mask (SDPA skips the causal half and shares
    the KV heads); the LM head sees response positions only. Same values
    within 1e-5 (tested), 0 on padding. Other models, or
    False, run the plain left-padded forward below.

    Returns:
        (B, T) float32; the value at ``t`` is ``log p(response_t | prefix)``.
    """
    if fast:
        from slca.generation.fastpath import unsupported_reason
        from slca.generation.fastpath.logprobs import fast_response_logprobs

        if unsupported_reason(model) is None:
            return fast_response_logprobs(model, batch, temperature)
    P = batch.prompt_len
    T = batch.input_ids.shape[1] - P
    # Only the T + 1 last positions reach the LM head: on prompt positions it is
    # wasted work (about 10% of a training pass of the default model, see docs/performance.md).
    kw = {"logits_to_keep": T + 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, **kw)
    logits = out.logits[:, -(T + 1) : -1, :]  # (B, T, V) predicts response tokens
    return token_logprobs(logits, batch.input_ids[:, P:], temperature)
