"""The training pass's response log-probabilities in a layout SDPA can run without a mask.

The trainer's batch is left-padded (prompts aligned on the right, responses on
the left, see :class:`slca.trainer.RolloutBatch`), which needs a padding mask:
with a mask, SDPA on CPU computes the full ``S x S`` score matrix (it cannot
skip the causal upper half) and transformers copies the KV heads up to the
query heads first. :func:`fast_response_logprobs` shifts every row left so that
it starts at column 0 (right padding). A row's real tokens then sit at
positions ``0 .. n-1`` -- the positions the left-padded layout gives them
(``position_ids`` ignore the padding) -- and padding only follows them, so
plain causal attention with *no mask* is exact for every real token: SDPA runs
``is_causal`` (skips the upper half) and shares the KV heads (``enable_gqa``,
which transformers uses when there is no mask).

Only the hidden states that predict response tokens (policy and environment)
reach the LM head, flattened to ``(N, C)`` (no logits for padding; a fused
``cross_entropy`` instead of log-softmax + gather measured no faster, see
docs/performance.md).

Same values as the left-padded forward up to float rounding (different
attention kernels and summation order); ``tests/test_fastpath.py`` checks
values within ``1e-5`` and gradients within ``1e-4`` relative (fp32).
"""

from __future__ import annotations

from typing import Any

import torch

from slca.batching import token_logprobs
from slca.fastpath.decode import unsupported_reason

__all__ = ["fast_response_logprobs", "right_padded"]


def right_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to start at column 0.

    Args:
        input_ids: (B, P + T) left-padded prompts, right-padded responses.
        attention_mask: (B, P + T) 1 on real tokens (contiguous per row).
        prompt_len: P.

    Returns:
        ``(ids, src, plen)``: (B, S) right-padded ids (S = the longest row;
        padding repeats the row's last column, never attended by a real
        token), (B, S) source column of each new column, (B,) prompt lengths.
    """
    B, W = input_ids.shape
    left = (attention_mask[:, :prompt_len] == 0).sum(dim=1)  # (B,) left padding per row
    n = attention_mask.sum(dim=1)  # (B,) real tokens per row
    S = int(n.max()) if B else 0
    src = (torch.arange(S, device=input_ids.device)[None, :] + left[:, None]).clamp_max(W - 1)  # (B, S)
    return input_ids.gather(1, src), src, prompt_len - left


def fast_response_logprobs(model: torch.nn.Module, batch: Any, temperature: float = 1.0) -> torch.Tensor:
    """``log p(response_t | prefix)`` of every real response token, right-padded and mask-free.

    Args:
        model: a model :func:`slca.fastpath.unsupported_reason` accepts.
        batch: a :class:`slca.trainer.RolloutBatch` (``input_ids``,
            ``attention_mask``, ``prompt_len``, ``valid_mask``).
        temperature: logits are divided by it.

    Returns:
        (B, T) float32; 0 on padding (where ``valid_mask`` is 0).
    """
    why = unsupported_reason(model)
    if why is not None:
        raise ValueError(f"fast_response_logprobs: {why}")
    P = batch.prompt_len
    T = batch.input_ids.shape[1] - P
    ids, _, plen = right_padded(batch.input_ids, batch.attention_mask, P)
    hidden = model.model(input_ids=ids).last_hidden_state  # (B, S, C): causal, no mask
    valid = batch.valid_mask.bool()  # (B, T)
    b, t = valid.nonzero(as_tuple=True)  # (N,) each
    h = hidden[b, plen[b] + t - 1]  # (N, C): the state before response token t of row b
    lp = token_logprobs(model.lm_head(h), batch.input_ids[b, P + t], temperature)  # (N,)
    return lp.new_zeros(valid.shape).index_put((b, t), lp)
