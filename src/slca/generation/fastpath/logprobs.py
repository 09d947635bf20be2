"""The training pass's response log-probabilities in a layout SDPA can run without a mask.

The trainer's batch is left-padded (prompts aligned on the right, responses on
the left, see :class:`slca.training.trainer.RolloutBatch`), which needs a padding mask:
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

Rows that share a prompt -- a GRPO group's G rollouts -- share its forward
(:func:`shared_prompts`, :func:`_shared_prompt_hidden`): each distinct prompt
runs once, and the responses continue from its KV cache, copied out to the
rows (the gradient of the prompt sums over them). A minibatch of G rollouts
per prompt of length P then costs P + G x T tokens of work instead of
G x (P + T); on the multi-turn benchmark batch (prompt 303 of 584 tokens,
G = 4) forward + backward take ~0.6x the time (docs/performance.md).

Same values as the left-padded forward up to float rounding (different
attention kernels and summation order); ``tests/test_fastpath_logprobs.py`` checks
values within ``1e-5`` and gradients within ``1e-4`` relative (fp32).
"""

from __future__ import annotations

from typing import Any

import torch

from slca.core.losses import token_logprobs
from slca.generation.fastpath.decode import base_model, unsupported_reason
from slca.generation.kvcache import cache_arg

__all__ = ["fast_response_logprobs", "right_padded", "shared_prompts"]


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


def shared_prompts(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows of ``batch`` whose prompts are the same token sequence (a GRPO group's rows).

    Args:
        batch: a :class:`slca.training.trainer.RolloutBatch`.

    Returns:
        ``(first, inv)``: (U,) one row index per distinct prompt and (B,) each
        row's distinct prompt (``0 .. U-1``); None when no two rows share a
        prompt, or a row has an empty prompt.
    """
    P = batch.prompt_len
    ids, att = batch.input_ids[:, :P], batch.attention_mask[:, :P]
    if P == 0 or bool((att.sum(dim=1) == 0).any()):
        return None
    key = torch.where(att.bool(), ids, -1)  # padding compares equal whatever its id
    uniq, inv = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == key.shape[0]:
        return None
    rows = torch.arange(key.shape[0], device=key.device)
    first = torch.full((uniq.shape[0],), key.shape[0], dtype=torch.long, device=key.device)
    return first.scatter_reduce(0, inv, rows, "amin"), inv


def fast_response_logprobs(model: torch.nn.Module, batch: Any, temperature: float = 1.0, share_prompts: bool = True) -> torch.Tensor:
    """``log p(response_t | prefix)`` of every real response token, right-padded and mask-free.

    Args:
        model: a model :func:`slca.generation.fastpath.unsupported_reason` accepts (a peft LoRA model included: the
            pass runs through its LoRA layers, so their gradients are peft's own).
        batch: a :class:`slca.training.trainer.RolloutBatch` (``input_ids``,
            ``attention_mask``, ``prompt_len``, ``valid_mask``).
        temperature: logits are divided by it.
        share_prompts: when rows share a prompt (a group's rollouts), run each
            distinct prompt once (:func:`_shared_prompt_hidden`), where
            :func:`_can_share` allows it.

    Returns:
        (B, T) float32; 0 on padding (where ``valid_mask`` is 0).
    """
    why = unsupported_reason(model)
    if why is not None:
        raise ValueError(f"fast_response_logprobs: {why}")
    model = base_model(model)  # a PeftModel: its causal LM, whose projections run the LoRA layers (gradients reach them)
    P = batch.prompt_len
    valid = batch.valid_mask.bool()  # (B, T)
    b, t = valid.nonzero(as_tuple=True)  # (N,) each
    shared = shared_prompts(batch) if share_prompts and _can_share(model) else None
    if shared is not None:
        h = _shared_prompt_hidden(model, batch, *shared)[b, t]  # (N, C)
    else:
        ids, _, plen = right_padded(batch.input_ids, batch.attention_mask, P)
        hidden = model.model(input_ids=ids).last_hidden_state  # (B, S, C): causal, no mask
        h = hidden[b, plen[b] + t - 1]  # (N, C): the state before response token t of row b
    lp = token_logprobs(model.lm_head(h), batch.input_ids[b, P + t], temperature)  # (N,)
    return lp.new_zeros(valid.shape).index_put((b, t), lp)


def _can_share(model: torch.nn.Module) -> bool:
    """Whether the shared-prompt pass gives this model's values.

    Not under gradient checkpointing: transformers then drops the cache
    (``cache=None``) the pass continues from. Not with RoPE types whose
    frequencies depend on the longest position of a call (``dynamic``,
    ``longrope``): the prompt's call and the responses' would differ.
    """
    if model.training and torch.is_grad_enabled() and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        return False
    rope = getattr(getattr(model.model, "rotary_emb", None), "rope_type", "default")
    return rope not in ("dynamic", "longrope")


def _shared_prompt_hidden(model: torch.nn.Module, batch: Any, first: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """The hidden state before every response column, each distinct prompt run once.

    The U distinct prompts run right-padded with no mask (causal is exact for
    their real tokens); their KV cache is copied out to the B rows
    (``reorder_cache``, differentiable: the prompt's gradient sums over the
    rows that share it) and the B responses run on top of it, with a mask
    that hides each row's prompt padding. A group of G rollouts thus costs one
    prompt plus G responses instead of G prompts plus G responses (the
    "shared-prefix" forward of Prefix Grouper, arXiv 2506.05433); same values
    as the unshared pass up to float rounding (tested).

    Args:
        first: (U,) a row of each distinct prompt.
        inv: (B,) each row's distinct prompt.

    Returns:
        (B, T, C): at column ``t``, the state that predicts response token ``t``.
    """
    P = batch.prompt_len
    ids, _, plen = right_padded(batch.input_ids[first, :P], batch.attention_mask[first, :P], P)  # (U, Lp), (U,)
    from transformers import DynamicCache

    cache = DynamicCache()
    arg = cache_arg(model.model.forward)
    hp = model.model(input_ids=ids, use_cache=True, **{arg: cache}).last_hidden_state  # (U, Lp, C)
    cache.reorder_cache(inv)  # (U, ...) -> (B, ...)
    resp = batch.input_ids[:, P:]  # (B, T) right-padded: padding follows every real token
    B, T = resp.shape
    pl = plen[inv]  # (B,)
    cols = torch.arange(ids.shape[1], device=ids.device)
    att = torch.cat([(cols[None, :] < pl[:, None]).long(), torch.ones_like(resp)], dim=1)  # (B, Lp + T)
    pos = pl[:, None] + torch.arange(T, device=ids.device)[None, :]  # (B, T)
    hs = model.model(input_ids=resp, attention_mask=att, position_ids=pos, use_cache=True, **{arg: cache}).last_hidden_state  # (B, T, C)
    h0 = hp[inv, pl - 1]  # (B, C): the prompt's last state predicts response token 0
    return torch.cat([h0[:, None, :], hs[:, :-1]], dim=1)
