"""A rollout forward with fewer kernels per token, read from the Hugging Face weights.

:class:`FastBatch` is a drop-in for the rollout engine's KV-cache batch (the
same ``feed`` / ``feed_lists`` / ``expand`` / ``keep`` / ``park`` / ``unpark``
methods and the same hole-and-position semantics, see :mod:`slca.kvcache`),
but it does not call the model's ``forward``. It runs the decoder itself:

* **fused projections**: per layer one ``(q|k|v)`` matmul and one
  ``(gate|up)`` matmul, from weights concatenated once per rollout call out of
  the model's own ``q_proj`` / ``k_proj`` / ``v_proj`` / ``gate_proj`` /
  ``up_proj`` (so they are whatever the optimizer last wrote);
* **one static KV buffer** ``(layers, 2, B, kv_heads, capacity, head_dim)``
  written in place (no per-layer cache objects, no concatenation; capacity
  doubles when full), with the validity mask kept beside it;
* RoPE applied to queries and keys in one op, attention through SDPA with
  ``enable_gqa`` (the KV heads are never copied up to the query heads), one
  boolean mask per forward shared by all layers;
* the final norm and the LM head only at each row's last valid column (a
  prefill or environment chunk of W tokens computes one row of logits, not W).

The per-step Python is one loop over the layers (a handful of ops each); the
transformers module stack, mask building and cache bookkeeping are gone.

Supported: ``Qwen2ForCausalLM`` and ``LlamaForCausalLM`` (full attention, SiLU
MLP, plain ``nn.Linear`` projections, any RoPE type the model's own rotary
module computes). Anything else (another architecture, sliding-window layers,
LoRA-wrapped or quantized layers, forward hooks, a subclass that overrides
``forward``) is refused by :func:`unsupported_reason` and the engine falls back
to the transformers forward. A subclass that overrides ``forward`` only to
change the logits it returns may opt in by defining
``slca_rollout_logits(logits, input_ids, valid, position_ids, fresh)`` (see
:meth:`FastBatch.feed`), which the fast path then applies.

Equality: the same math as the transformers forward in a different op order
(fused matmuls, RMSNorm through ``torch.nn.functional.rms_norm``), so logits
differ by float rounding only; ``tests/test_fastpath.py`` checks logits within
``1e-4`` (fp32) of the transformers forward on every feed pattern the engine
uses, and identical sampled tokens and log-probabilities within ``1e-5`` for
whole multi-turn rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from slca.kvcache import chunk_positions, merge_order, pad_chunk

__all__ = ["FastDecoder", "FastBatch", "unsupported_reason", "LOGITS_HOOK"]

LOGITS_HOOK = "slca_rollout_logits"


def _stock_classes() -> dict[str, tuple[type, type, type]]:
    """model_type -> (causal LM class, decoder layer class, base model class) the fast path knows."""
    out: dict[str, tuple[type, type, type]] = {}
    try:
        from transformers.models.qwen2 import modeling_qwen2 as q

        out["qwen2"] = (q.Qwen2ForCausalLM, q.Qwen2DecoderLayer, q.Qwen2Model)
    except ImportError:  # pragma: no cover
        pass
    try:
        from transformers.models.llama import modeling_llama as ll

        out["llama"] = (ll.LlamaForCausalLM, ll.LlamaDecoderLayer, ll.LlamaModel)
    except ImportError:  # pragma: no cover
        pass
    return out


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why :class:`FastDecoder` cannot run ``model`` exactly (None: it can)."""
    cfg = getattr(model, "config", None)
    known = _stock_classes()
    mt = getattr(cfg, "model_type", None)
    if mt not in known:
        return f"model_type {mt!r} is not one of {sorted(known)}"
    lm_cls, layer_cls, base_cls = known[mt]
    if not isinstance(model, lm_cls):
        return f"{type(model).__name__} is not a {lm_cls.__name__}"
    if type(model).forward is not lm_cls.forward and not callable(getattr(model, LOGITS_HOOK, None)):
        return f"{type(model).__name__} overrides forward (define {LOGITS_HOOK} to opt in)"
    base = getattr(model, "model", None)
    if type(base) is not base_cls:
        return "the base model is not the stock one"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention layers"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return "logit soft-capping"
    for mod in model.modules():
        if mod._forward_hooks or mod._forward_pre_hooks:
            return f"a forward hook on {type(mod).__name__}"
    for layer in base.layers:
        if type(layer) is not layer_cls:
            return f"decoder layer {type(layer).__name__}"
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
            if type(lin) is not torch.nn.Linear or not lin.weight.is_floating_point():
                return f"projection {type(lin).__name__} is not a plain floating-point nn.Linear (LoRA, quantized?)"
        for extra in ("q_norm", "k_norm"):
            if getattr(a, extra, None) is not None:
                return f"attention has {extra}"
    if type(model.lm_head) is not torch.nn.Linear:
        return "lm_head is not a plain nn.Linear"
    return None


@dataclass
class _Layer:
    """One decoder layer's weights, fused where it saves kernels, stored (in, out) for ``x @ w``."""

    ln1: torch.Tensor  # (C,)
    wqkv: torch.Tensor  # (C, (H + 2 Hkv) D)
    bqkv: torch.Tensor | None  # ((H + 2 Hkv) D,)
    wo: torch.Tensor  # (H D, C)
    bo: torch.Tensor | None
    ln2: torch.Tensor  # (C,)
    wgu: torch.Tensor  # (C, 2 I)
    bgu: torch.Tensor | None
    wd: torch.Tensor  # (I, C)
    bd: torch.Tensor | None


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w + b`` with ``w`` stored (in, out): at decode sizes (32 rows) a contiguous
    (in, out) weight multiplies ~30% faster than ``F.linear``'s (out, in) one (docs/performance.md)."""
    return torch.matmul(x, w) if b is None else torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])


def _cat_bias(*lins: torch.nn.Linear) -> torch.Tensor | None:
    if all(lin.bias is None for lin in lins):
        return None
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in lins])


class FastDecoder:
    """The decoder of a supported model as a few fused ops per layer (weights read at construction)."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module):
        why = unsupported_reason(model)
        if why is not None:
            raise ValueError(f"FastDecoder: {why}")
        self.model = model
        cfg = model.config
        base = model.model
        a0 = base.layers[0].self_attn
        self.H = cfg.num_attention_heads
        self.Hkv = cfg.num_key_value_heads
        self.D = a0.head_dim
        self.scale = a0.scaling
        self.eps = base.norm.variance_epsilon
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.norm_w = base.norm.weight
        self.lm_w = model.lm_head.weight.t().contiguous()  # (C, V)
        self.lm_b = model.lm_head.bias
        self.hook = getattr(model, LOGITS_HOOK, None)
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight,
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).t().contiguous(),
                bqkv=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                wo=a.o_proj.weight.t().contiguous(), bo=a.o_proj.bias,
                ln2=layer.post_attention_layernorm.weight,
                wgu=torch.cat([m.gate_proj.weight, m.up_proj.weight]).t().contiguous(),
                bgu=_cat_bias(m.gate_proj, m.up_proj),
                wd=m.down_proj.weight.t().contiguous(), bd=m.down_proj.bias,
            ))
        self.dtype = self.layers[0].wqkv.dtype
        self.device = self.embed.device

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        # low precision: normalise in fp32 and round before the weight, as transformers' RMSNorm does
        return w * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """SDPA of queries (B, W, H, D) over the cache's k, v (B, Hkv, S, D) under mask (B, 1, W, S); (B, W, H, D).

        A one-token step (W = 1) runs the H / Hkv query heads of each KV head
        as that head's query rows (same mask for all of them): one SDPA over
        (B, Hkv, H / Hkv, D) queries, 1.5-1.7x faster than ``enable_gqa`` over
        (B, H, 1, D) at decode sizes (docs/performance.md).
        """
        B, W, H, D = q.shape
        Hkv = k.shape[1]
        if W == 1 and H != Hkv:
            out = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v, attn_mask=mask, scale=self.scale)
            return out.view(B, 1, H, D)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=self.scale, enable_gqa=Hkv != H)
        return out.transpose(1, 2)  # (B, W, H, D)

    def forward(
        self, ids: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, start: int, mask: torch.Tensor, last: torch.Tensor
    ) -> torch.Tensor:
        """Feed W columns for B rows; return the logits at each row's column ``last``.

        Args:
            ids: (B, W) token ids.
            pos: (B, W) position of each column's token in its row's sequence.
            kv: (layers, 2, B, Hkv, capacity, D) cache; columns ``start .. start+W`` are written.
            start: cache columns already filled.
            mask: (B, 1, W, start + W) bool, True where a query column may attend a cache column.
            last: (B,) column (0 .. W-1) whose logits are returned.

        Returns:
            (B, V) logits in the model's dtype.
        """
        B, W = ids.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        end = start + W
        x = F.embedding(ids, self.embed)  # (B, W, C)
        cos, sin = self.rotary(x, pos)  # (B, W, D) each
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        half = D // 2
        for li, L in enumerate(self.layers):
            h = self._rms(x, L.ln1)
            qkv = _linear(h, L.wqkv, L.bqkv).view(B, W, H + 2 * Hkv, D)
            qk = qkv[:, :, : H + Hkv]
            rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rot * sin  # RoPE on queries and keys at once: (B, W, H + Hkv, D)
            kv[li, 0, :, :, start:end] = qk[:, :, H:].transpose(1, 2)
            kv[li, 1, :, :, start:end] = qkv[:, :, H + Hkv :].transpose(1, 2)
            att = self._attend(qk[:, :, :H], kv[li, 0, :, :, :end], kv[li, 1, :, :, :end], mask)  # (B, W, H, D)
            x = x + _linear(att.reshape(B, W, H * D), L.wo, L.bo)
            h = self._rms(x, L.ln2)
            g, u = _linear(h, L.wgu, L.bgu).chunk(2, dim=-1)
            x = x + _linear(F.silu(g) * u, L.wd, L.bd)
        xl = x[torch.arange(B, device=x.device), last]  # (B, C) each row's last valid column
        return _linear(self._rms(xl, self.norm_w), self.lm_w, self.lm_b)


@dataclass
class FastParked:
    """Cache, validity and positions of rows taken out of the batch for the rest of a turn."""

    kv: torch.Tensor  # (layers, 2, B_p, Hkv, S_p, D)
    attn: torch.Tensor  # (B_p, S_p) bool
    next_pos: torch.Tensor  # (B_p,)


class FastBatch:
    """The rollout engine's shared, holed KV cache over :class:`FastDecoder` (see :mod:`slca.kvcache`).

    Column ``j`` of the cache holds, for every row, the token fed in that
    column; ``attn[b, j]`` says whether it is one of row ``b``'s tokens (a
    hole otherwise). ``next_pos[b]`` counts row ``b``'s tokens so far.
    """

    def __init__(self, model: torch.nn.Module, batch_size: int, pad_id: int, device: torch.device,
                 decoder: FastDecoder | None = None, capacity: int = 256):
        self.dec = decoder or FastDecoder(model)
        self.model = model
        self.pad_id = pad_id
        self.device = device
        d = self.dec
        self.kv = torch.zeros(len(d.layers), 2, batch_size, d.Hkv, capacity, d.D, dtype=d.dtype, device=device)
        self._attn = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
        self.n = 0  # cache columns filled
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)

    @property
    def attn(self) -> torch.Tensor:
        """(B, S) long: 1 on each row's valid cache columns."""
        return self._attn[:, : self.n].long()

    def _reserve(self, extra: int) -> None:
        cap = self.kv.shape[-2]
        if self.n + extra <= cap:
            return
        new = max(2 * cap, self.n + extra + 64)
        kv = self.kv.new_zeros(*self.kv.shape[:-2], new, self.kv.shape[-1])
        kv[..., : self.n, :] = self.kv[..., : self.n, :]
        at = self._attn.new_zeros(self._attn.shape[0], new)
        at[:, : self.n] = self._attn[:, : self.n]
        self.kv, self._attn = kv, at

    @torch.no_grad()
    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Append a chunk (``ids``, ``valid``: (B, W), as :meth:`slca.kvcache.CacheBatch.feed`).

        Returns (B, V) float logits at each row's last valid column (rows
        without one: to be ignored). A model defining ``slca_rollout_logits(
        logits, input_ids, valid, position_ids, fresh)`` gets these logits, the
        chunk and whether the cache was empty, and returns the logits to use.
        """
        B, W = ids.shape
        v = valid.long()
        ids = torch.where(valid, ids, torch.full_like(ids, self.pad_id))
        self._reserve(W)
        start, end = self.n, self.n + W
        self._attn[:, start:end] = valid
        pos, last = chunk_positions(self.next_pos, valid)
        cols = torch.arange(end, device=ids.device)
        # a query column sees the valid columns up to itself, and always itself (so a hole's
        # output stays finite; it is never read)
        causal = cols[None, :] <= (start + torch.arange(W, device=ids.device))[:, None]  # (W, S)
        mask = (self._attn[:, None, :end] & causal[None]) | (cols[None, None, :] == start + torch.arange(W, device=ids.device)[None, :, None])
        mask = mask[:, None]
        logits = self.dec.forward(ids, pos, self.kv, start, mask, last)
        fresh = start == 0
        self.n = end
        self.next_pos = self.next_pos + v.sum(dim=1)
        if self.dec.hook is not None:
            logits = self.dec.hook(logits, ids, valid, pos, fresh)
        return logits.float()

    def feed_lists(self, seqs: Sequence[Sequence[int] | None]) -> torch.Tensor:
        """Feed one list of ids per row (None or empty: nothing for that row); returns :meth:`feed`'s logits."""
        ids, valid = pad_chunk(seqs, self.pad_id)
        return self.feed(ids.to(self.device), valid.to(self.device))

    def _select(self, idx: torch.Tensor) -> None:
        n = self.n
        kv = self.kv.new_zeros(*self.kv.shape[:2], len(idx), *self.kv.shape[3:])
        kv[..., :n, :] = self.kv[:, :, idx, :, :n]
        at = self._attn.new_zeros(len(idx), self._attn.shape[1])
        at[:, :n] = self._attn[idx, :n]
        self.kv, self._attn, self.next_pos = kv, at, self.next_pos[idx]

    def expand(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place (row ``i`` becomes rows ``i*repeats .. i*repeats+repeats-1``)."""
        B = self.next_pos.shape[0]
        self._select(torch.arange(B, device=self.device).repeat_interleave(repeats))

    def keep(self, index: Sequence[int]) -> None:
        """Keep only these rows (batch positions), dropping finished rollouts from every later forward."""
        self._select(torch.tensor(list(index), dtype=torch.long, device=self.device))

    def park(self, keep: torch.Tensor) -> FastParked:
        """Move the rows where ``keep`` is False out of the batch (their cache aside).

        Args:
            keep: (B,) bool over the current batch rows.
        """
        out_idx = (~keep).nonzero().squeeze(-1)
        n = self.n
        parked = FastParked(self.kv[:, :, out_idx, :, :n].clone(), self._attn[out_idx, :n].clone(), self.next_pos[out_idx])
        self._select(keep.nonzero().squeeze(-1))
        return parked

    def unpark(self, parked: FastParked, here: torch.Tensor, there: torch.Tensor) -> torch.Tensor:
        """Merge parked rows back, ordered by their ids (the contract of :meth:`slca.kvcache.CacheBatch.unpark`).

        ``here`` / ``there``: (B_here,) / (B_parked,) row ids in batch / parked
        order. Returns the sorted ids (the new batch order); parked rows get
        holes for everything fed while they were out.
        """
        ids, p_here, p_there = merge_order(here, there)
        s = parked.kv.shape[-2]
        kv = self.kv.new_zeros(*self.kv.shape[:2], len(ids), *self.kv.shape[3:])
        kv[:, :, p_here] = self.kv
        kv[:, :, p_there, :, :s] = parked.kv
        at = self._attn.new_zeros(len(ids), self._attn.shape[1])
        at[p_here] = self._attn
        at[p_there, :s] = parked.attn
        next_pos = self.next_pos.new_zeros(len(ids))
        next_pos[p_here], next_pos[p_there] = self.next_pos, parked.next_pos
        self.kv, self._attn, self.next_pos = kv, at, next_pos
        return ids


def make_batch(model: torch.nn.Module, batch_size: int, pad_id: int, device: torch.device, capacity: int = 256) -> FastBatch | None:
    """A :class:`FastBatch` for ``model``, or None when the fast path does not support it."""
    if unsupported_reason(model) is not None:
        return None
    return FastBatch(model, batch_size, pad_id, device, capacity=capacity)


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """Whether the fast decode path runs ``model`` and, if not, why."""
    why = unsupported_reason(model)
    return {"fast_decode": why is None, "reason": why}
