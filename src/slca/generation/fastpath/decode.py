"""A rollout forward with fewer kernels per token, read from the Hugging Face weights.

:class:`FastBatch` is a drop-in for the rollout engine's KV-cache batch (the
same ``feed`` / ``feed_lists`` / ``expand`` / ``keep`` / ``park`` / ``unpark``
methods and the same hole-and-position semantics, see :mod:`slca.generation.kvcache`),
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
  prefill or environment chunk of W tokens computes one row of logits, not W);
* **shared prompts** (CPU, prompts of at least :data:`MIN_SHARED_PROMPT`
  columns): the G rollouts of a task keep its prompt's keys and values once,
  not G times, and each layer attends them in one call for all G rows, merged
  exactly with the attention over each row's own columns through their
  log-sum-exps (:meth:`FastDecoder._attend_shared`; Hydragen, arXiv 2402.05099).

The per-step Python is one loop over the layers (a handful of ops each); the
transformers module stack, mask building and cache bookkeeping are gone.

Supported: ``Qwen2ForCausalLM`` and ``LlamaForCausalLM`` (full attention, SiLU
MLP, plain ``nn.Linear`` projections, any RoPE type the model's own rotary
module computes), bare or inside a peft ``PeftModel`` whose projections carry
LoRA adapters: a LoRA projection runs as one matmul by ``W + s B A``, formed
once per rollout call (what peft computes as ``x W^T + s (x A^T) B^T``, up to
rounding). Anything else (another architecture, sliding-window layers,
quantized layers, DoRA, merged or disabled adapters, LoRA dropout in training
mode, forward hooks, a subclass that overrides ``forward``) is refused by :func:`unsupported_reason` and the engine falls back
to the transformers forward. A subclass that overrides ``forward`` only to
change the logits it returns may opt in by defining
``slca_rollout_logits(logits, input_ids, valid, position_ids, fresh)`` (see
:meth:`FastBatch.feed`), which the fast path then applies.

Equality: the same math as the transformers forward in a different op order
(fused matmuls, RMSNorm through ``torch.nn.functional.rms_norm``), so logits
differ by float rounding only; ``tests/test_fastpath_decode.py`` checks logits within
``1e-4`` (fp32) of the transformers forward on every feed pattern the engine
uses, and identical sampled tokens and log-probabilities within ``1e-5`` for
whole multi-turn rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from slca.generation.kvcache import chunk_positions, merge_order, pad_chunk

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
    model = base_model(model)
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
            why = _lora_problem(lin) if _is_lora(lin) else None
            plain = lin.base_layer if _is_lora(lin) else lin
            if why is None and (type(plain) is not torch.nn.Linear or not plain.weight.is_floating_point()):
                why = f"projection {type(lin).__name__} is not a plain floating-point nn.Linear (quantized?)"
            if why is not None:
                return why
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


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM inside a peft ``PeftModel`` (``get_base_model()``: its projections carry the LoRA layers);
    any other model as it is."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) and hasattr(model, "peft_config") else model


def _is_lora(lin: torch.nn.Module) -> bool:
    """A peft LoRA layer (``lora_A`` / ``lora_B`` beside a ``base_layer``)."""
    return hasattr(lin, "base_layer") and hasattr(lin, "lora_A") and hasattr(lin, "lora_B")


def _active(lin: torch.nn.Module) -> list[str]:
    names = lin.active_adapters if hasattr(lin, "active_adapters") else [lin.active_adapter]
    return [n for n in ([names] if isinstance(names, str) else names) if n in lin.lora_A]


def _lora_problem(lin: torch.nn.Module) -> str | None:
    """Why a peft LoRA layer's output is not ``x @ (W + s B A)^T + b`` exactly (None: it is).

    Refused: adapters disabled or merged (peft then computes something else), DoRA, dropout that is
    active (a module in training mode with p > 0), a LoRA bias, a non-Linear LoRA pair."""
    if getattr(lin, "disable_adapters", False):
        return "LoRA adapters are disabled"
    if getattr(lin, "merged", False):
        return "LoRA adapters are merged into the base layer"
    if getattr(lin, "fan_in_fan_out", False):
        return "LoRA fan_in_fan_out"
    for n in _active(lin):
        if getattr(lin, "use_dora", {}).get(n, False):
            return "DoRA adapters"
        drop = lin.lora_dropout[n] if hasattr(lin, "lora_dropout") else None
        if drop is not None and not isinstance(drop, torch.nn.Identity) and drop.training and getattr(drop, "p", 0) > 0:
            return "LoRA dropout in training mode"
        A, B = lin.lora_A[n], lin.lora_B[n]
        if type(A) is not torch.nn.Linear or type(B) is not torch.nn.Linear or B.bias is not None or A.bias is not None:
            return "a LoRA pair that is not two bias-free nn.Linear layers"
    return None


def _weight(lin: torch.nn.Module) -> torch.Tensor:
    """The (out, in) weight a projection applies: its own, or for a LoRA layer ``W + sum_a s_a B_a A_a``
    (computed in the weights' dtype, as peft adds the adapter's output to the base one)."""
    if not _is_lora(lin):
        return lin.weight
    w = lin.base_layer.weight
    for n in _active(lin):
        A, B = lin.lora_A[n].weight, lin.lora_B[n].weight  # (r, in), (out, r)
        w = w + lin.scaling[n] * (B.to(w.dtype) @ A.to(w.dtype))
    return w


def _bias(lin: torch.nn.Module) -> torch.Tensor | None:
    return (lin.base_layer if _is_lora(lin) else lin).bias


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w + b`` with ``w`` stored (in, out): at decode sizes (32 rows) a contiguous
    (in, out) weight multiplies ~30% faster than ``F.linear``'s (out, in) one (docs/performance.md)."""
    return torch.matmul(x, w) if b is None else torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])


def _cat_bias(*lins: torch.nn.Module) -> torch.Tensor | None:
    bs = [_bias(lin) for lin in lins]
    if all(b is None for b in bs):
        return None
    return torch.cat([b if b is not None else _weight(lin).new_zeros(_weight(lin).shape[0]) for b, lin in zip(bs, lins)])


_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)  # (out, logsumexp)
MIN_SHARED_PROMPT = 256
"""Prompt columns from which :meth:`FastBatch.expand` shares them (below, the second attention call and the
merge cost more than the copies' reads save: docs/performance.md)."""


@dataclass
class SharedPrompt:
    """The prompt columns the rows of each group share, stored once per group, and where each row's queries go.

    Built by :meth:`FastBatch.expand` (a group is the G rollouts of one task)
    and re-laid when rows leave or come back. ``gather`` / ``flat`` place the
    rows' queries in a (groups, slots) grid, so that one attention call per
    layer reads each group's prompt once for all its rows.
    """

    kv: torch.Tensor  # (layers, 2, groups, Hkv, P, D)
    bias: torch.Tensor  # (groups, 1, 1, P) additive mask in the model's dtype: 0 at a prompt token, -inf at a hole
    gather: torch.Tensor | None  # (groups, slots) long: the batch row in each slot (B: an empty slot); None: row b
    # is slot b (rows in group order, every group full: the grid is the batch itself)
    flat: torch.Tensor | None  # (B,) long: each row's slot, as group * slots + slot (None with gather)
    slots: int


def _merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Attention over two disjoint column sets, from each part's output (..., D) and log-sum-exp (...):
    ``(e^l1 o1 + e^l2 o2) / (e^l1 + e^l2) = o2 + (o1 - o2) sigmoid(l1 - l2)``."""
    w = torch.sigmoid(l1 - l2)[..., None]  # the log-sum-exps are float32
    a, b = o1.float(), o2.float()  # no copies in fp32; low precision merges in fp32
    return (b + (a - b) * w).to(o1.dtype)


def _query_row_bias(mask: torch.Tensor, r: int, dtype: torch.dtype) -> torch.Tensor:
    """A (B, 1, W, S) bool mask as the additive mask of :meth:`FastDecoder._attend_shared`'s query rows,
    ordered (column, query head) within each KV head: (B, 1, W r, S), or (B, 1, 1, S) when W = 1."""
    B, _, W, S = mask.shape
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return bias if W == 1 else bias[:, :, :, None, :].expand(B, 1, W, r, S).reshape(B, 1, W * r, S)


class FastDecoder:
    """The decoder of a supported model as a few fused ops per layer (weights read at construction)."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module):
        why = unsupported_reason(model)
        if why is not None:
            raise ValueError(f"FastDecoder: {why}")
        self.model = model
        model = base_model(model)
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
                wqkv=torch.cat([_weight(a.q_proj), _weight(a.k_proj), _weight(a.v_proj)]).t().contiguous(),
                bqkv=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                wo=_weight(a.o_proj).t().contiguous(), bo=_bias(a.o_proj),
                ln2=layer.post_attention_layernorm.weight,
                wgu=torch.cat([_weight(m.gate_proj), _weight(m.up_proj)]).t().contiguous(),
                bgu=_cat_bias(m.gate_proj, m.up_proj),
                wd=_weight(m.down_proj).t().contiguous(), bd=_bias(m.down_proj),
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
            return out.reshape(B, 1, H, D)  # reshape: a CUDA kernel may return another layout
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=self.scale, enable_gqa=Hkv != H)
        return out.transpose(1, 2)  # (B, W, H, D)

    def _attend_shared(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                       kp: torch.Tensor, vp: torch.Tensor, shared: SharedPrompt) -> torch.Tensor:
        """Attention of queries (B, W, H, D) over their group's prompt ``kp, vp`` (groups, Hkv, P, D) and
        their own columns ``k, v`` (B, Hkv, S, D) under the additive ``bias`` (B, 1, W x H / Hkv or 1, S),
        one row per query row (:func:`_query_row_bias`); (B, W, H, D).

        Each part runs as one CPU flash-attention call that also returns its
        log-sum-exp, and the two are merged exactly (:func:`_merge`): the
        prompt part reads each group's prompt once, with all its rows' queries
        as query rows, where a per-row cache reads one copy per row (Hydragen's
        shared-prefix attention, arXiv 2402.05099). Query rows are ordered
        (column, query head) within each KV head.
        """
        B, W, H, D = q.shape
        Hkv = k.shape[1]
        r, n_g, slots = H // Hkv, kp.shape[0], shared.slots
        qs = q.view(B, W, Hkv, r, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, W * r, D)
        o2, l2 = _FLASH(qs, k, v, attn_mask=bias, scale=self.scale)  # (B, Hkv, W r, D), (B, Hkv, W r)
        qg = qs if shared.gather is None else torch.cat([qs, qs.new_zeros(1, Hkv, W * r, D)])[shared.gather.view(-1)]
        qg = qg.view(n_g, slots, Hkv, W * r, D).transpose(1, 2).reshape(n_g, Hkv, slots * W * r, D)
        o1, l1 = _FLASH(qg, kp, vp, attn_mask=shared.bias, scale=self.scale)
        o1 = o1.reshape(n_g, Hkv, slots, W * r, D).transpose(1, 2).reshape(n_g * slots, Hkv, W * r, D)
        l1 = l1.reshape(n_g, Hkv, slots, W * r).transpose(1, 2).reshape(n_g * slots, Hkv, W * r)
        if shared.flat is not None:
            o1, l1 = o1[shared.flat], l1[shared.flat]
        out = _merge(o1, l1, o2, l2)  # (B, Hkv, W r, D)
        return out.reshape(B, Hkv, W, r, D).permute(0, 2, 1, 3, 4).reshape(B, W, H, D)

    def forward(
        self, ids: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, start: int, mask: torch.Tensor, last: torch.Tensor,
        shared: SharedPrompt | None = None,
    ) -> torch.Tensor:
        """Feed W columns for B rows; return the logits at each row's column ``last``.

        Args:
            ids: (B, W) token ids.
            pos: (B, W) position of each column's token in its row's sequence.
            kv: (layers, 2, B, Hkv, capacity, D) cache; columns ``start .. start+W`` are written.
            start: cache columns already filled.
            mask: (B, 1, W, start + W) bool, True where a query column may attend a cache column.
            last: (B,) column (0 .. W-1) whose logits are returned.
            shared: the group prompts the rows also attend (before all of ``kv``'s columns), or None.

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
        if shared is not None:  # once for all layers
            mask = _query_row_bias(mask, H // Hkv, self.dtype)
        for li, L in enumerate(self.layers):
            h = self._rms(x, L.ln1)
            qkv = _linear(h, L.wqkv, L.bqkv).view(B, W, H + 2 * Hkv, D)
            qk = qkv[:, :, : H + Hkv]
            rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rot * sin  # RoPE on queries and keys at once: (B, W, H + Hkv, D)
            kv[li, 0, :, :, start:end] = qk[:, :, H:].transpose(1, 2)
            kv[li, 1, :, :, start:end] = qkv[:, :, H + Hkv :].transpose(1, 2)
            if shared is None:
                att = self._attend(qk[:, :, :H], kv[li, 0, :, :, :end], kv[li, 1, :, :, :end], mask)  # (B, W, H, D)
            else:
                att = self._attend_shared(qk[:, :, :H], kv[li, 0, :, :, :end], kv[li, 1, :, :, :end], mask,
                                          shared.kv[li, 0], shared.kv[li, 1], shared)
            x = x + _linear(att.reshape(B, W, H * D), L.wo, L.bo)
            h = self._rms(x, L.ln2)
            g, u = _linear(h, L.wgu, L.bgu).chunk(2, dim=-1)
            x = x + _linear(F.silu(g) * u, L.wd, L.bd)
        xl = x[torch.arange(B, device=x.device), last]  # (B, C) each row's last valid column
        return _linear(self._rms(xl, self.norm_w), self.lm_w, self.lm_b)


@dataclass
class FastParked:
    """Cache, validity and positions of rows taken out of the batch for the rest of a turn."""

    kv: torch.Tensor  # (layers, 2, B_p, Hkv, S_p, D): the rows' own columns
    attn: torch.Tensor  # (B_p, S_p) bool
    next_pos: torch.Tensor  # (B_p,)
    group: torch.Tensor | None = None  # (B_p,): each row's shared prompt, when the batch shares them


@dataclass
class _Prompts:
    """Every group's prompt columns, stored once (:meth:`FastBatch.expand`)."""

    kv: torch.Tensor  # (layers, 2, groups, Hkv, P, D)
    attn: torch.Tensor  # (groups, P) bool
    bias: torch.Tensor  # (groups, 1, 1, P): 0 at a prompt token, -inf at a hole


class FastBatch:
    """The rollout engine's shared, holed KV cache over :class:`FastDecoder` (see :mod:`slca.generation.kvcache`).

    Column ``j`` of the cache holds, for every row, the token fed in that
    column; ``attn[b, j]`` says whether it is one of row ``b``'s tokens (a
    hole otherwise). ``next_pos[b]`` counts row ``b``'s tokens so far.

    **Shared prompts** (``share_prompts``, CPU): when :meth:`expand` repeats
    each prefilled prompt G times and the prompts fill at least
    :data:`MIN_SHARED_PROMPT` columns, the prompt's columns are kept once per
    group instead of G times (``self.P`` columns, :class:`_Prompts`), rows
    keep only the columns fed after it, and attention reads each group's
    prompt once for all its rows (:meth:`FastDecoder._attend_shared`).
    """

    def __init__(self, model: torch.nn.Module, batch_size: int, pad_id: int, device: torch.device,
                 decoder: FastDecoder | None = None, capacity: int = 256, share_prompts: bool = True):
        self.dec = decoder or FastDecoder(model)
        self.model = model
        self.pad_id = pad_id
        self.device = device
        d = self.dec
        self.kv = torch.zeros(len(d.layers), 2, batch_size, d.Hkv, capacity, d.D, dtype=d.dtype, device=device)
        self._attn = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
        self.n = 0  # cache columns filled, the shared prompt's included
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.share_prompts = share_prompts and _FLASH is not None and torch.device(device).type == "cpu"
        self.P = 0  # columns held once per group (0: none); a row's own column j is cache column P + j
        self.group: torch.Tensor | None = None  # (B,) each row's group in self._prompts
        self._prompts: _Prompts | None = None
        self._shared: SharedPrompt | None = None  # the rows' layout over the prompts (None: to rebuild)

    @property
    def attn(self) -> torch.Tensor:
        """(B, S) long: 1 on each row's valid cache columns."""
        own = self._attn[:, : self.n - self.P]
        if self.group is None:
            return own.long()
        return torch.cat([self._prompts.attn[self.group], own], dim=1).long()

    def _reserve(self, extra: int) -> None:
        m, cap = self.n - self.P, self.kv.shape[-2]
        if m + extra <= cap:
            return
        new = max(2 * cap, m + extra + 64)
        kv = self.kv.new_zeros(*self.kv.shape[:-2], new, self.kv.shape[-1])
        kv[..., :m, :] = self.kv[..., :m, :]
        at = self._attn.new_zeros(self._attn.shape[0], new)
        at[:, :m] = self._attn[:, :m]
        self.kv, self._attn = kv, at

    def _layout(self) -> SharedPrompt | None:
        """The rows' queries laid out by group (rebuilt after rows leave, come back or repeat)."""
        if self.group is None or self._shared is not None:
            return self._shared
        g = self.group
        groups, ag = torch.unique(g, return_inverse=True)  # the groups with a row here
        counts = torch.bincount(ag, minlength=len(groups))
        slots = int(counts.max())
        order = torch.argsort(ag, stable=True)
        rank = torch.empty_like(ag)
        rank[order] = torch.arange(len(g), device=g.device) - (counts.cumsum(0) - counts)[ag[order]]
        flat = ag * slots + rank
        gather = torch.full((len(groups) * slots,), len(g), dtype=torch.long, device=g.device)
        gather[flat] = torch.arange(len(g), device=g.device)
        kv, bias = self._prompts.kv, self._prompts.bias
        if len(groups) < kv.shape[2]:  # groups without a row here (finished or parked) are left out
            kv, bias = kv[:, :, groups], bias[groups]
        if len(groups) * slots == len(g) and torch.equal(flat, torch.arange(len(g), device=g.device)):
            self._shared = SharedPrompt(kv, bias, None, None, slots)
        else:
            self._shared = SharedPrompt(kv, bias, gather.view(len(groups), slots), flat, slots)
        return self._shared

    @torch.no_grad()
    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Append a chunk (``ids``, ``valid``: (B, W), as :meth:`slca.generation.kvcache.CacheBatch.feed`).

        Returns (B, V) float logits at each row's last valid column (rows
        without one: to be ignored). A model defining ``slca_rollout_logits(
        logits, input_ids, valid, position_ids, fresh)`` gets these logits, the
        chunk and whether the cache was empty, and returns the logits to use.
        """
        B, W = ids.shape
        v = valid.long()
        ids = torch.where(valid, ids, torch.full_like(ids, self.pad_id))
        self._reserve(W)
        start, end = self.n - self.P, self.n - self.P + W  # in the rows' own columns
        self._attn[:, start:end] = valid
        pos, last = chunk_positions(self.next_pos, valid)
        cols = torch.arange(end, device=ids.device)
        # a query column sees the valid columns up to itself, and always itself (so a hole's
        # output stays finite; it is never read); a shared prompt's columns it sees all (they come first)
        causal = cols[None, :] <= (start + torch.arange(W, device=ids.device))[:, None]  # (W, S)
        mask = (self._attn[:, None, :end] & causal[None]) | (cols[None, None, :] == start + torch.arange(W, device=ids.device)[None, :, None])
        mask = mask[:, None]
        logits = self.dec.forward(ids, pos, self.kv, start, mask, last, self._layout())
        fresh = self.n == 0
        self.n += W
        self.next_pos = self.next_pos + v.sum(dim=1)
        if self.dec.hook is not None:
            logits = self.dec.hook(logits, ids, valid, pos, fresh)
        return logits.float()

    def feed_lists(self, seqs: Sequence[Sequence[int] | None]) -> torch.Tensor:
        """Feed one list of ids per row (None or empty: nothing for that row); returns :meth:`feed`'s logits."""
        ids, valid = pad_chunk(seqs, self.pad_id)
        return self.feed(ids.to(self.device), valid.to(self.device))

    def _select(self, idx: torch.Tensor) -> None:
        m = self.n - self.P
        kv = self.kv.new_zeros(*self.kv.shape[:2], len(idx), *self.kv.shape[3:])
        kv[..., :m, :] = self.kv[:, :, idx, :, :m]
        at = self._attn.new_zeros(len(idx), self._attn.shape[1])
        at[:, :m] = self._attn[idx, :m]
        self.kv, self._attn, self.next_pos = kv, at, self.next_pos[idx]
        if self.group is not None:
            self.group, self._shared = self.group[idx], None

    def expand(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place (row ``i`` becomes rows ``i*repeats .. i*repeats+repeats-1``).

        With ``share_prompts``, the first expansion of a filled cache moves its
        columns into the per-group prompt store instead of copying them.
        """
        B = self.next_pos.shape[0]
        if not (repeats > 1 and self.share_prompts and self.group is None and self.n >= MIN_SHARED_PROMPT):
            self._select(torch.arange(B, device=self.device).repeat_interleave(repeats))
            return
        n = self.n
        attn = self._attn[:, :n].clone()
        bias = torch.zeros(B, 1, 1, n, dtype=self.kv.dtype, device=self.device).masked_fill_(~attn[:, None, None, :], float("-inf"))
        self._prompts = _Prompts(self.kv[..., :n, :].clone(), attn, bias)
        self.P = n
        self.group, self._shared = torch.arange(B, device=self.device).repeat_interleave(repeats), None
        self.kv = self.kv.new_zeros(*self.kv.shape[:2], B * repeats, *self.kv.shape[3:])
        self._attn = self._attn.new_zeros(B * repeats, self._attn.shape[1])
        self.next_pos = self.next_pos.repeat_interleave(repeats)

    def keep(self, index: Sequence[int]) -> None:
        """Keep only these rows (batch positions), dropping finished rollouts from every later forward."""
        self._select(torch.tensor(list(index), dtype=torch.long, device=self.device))

    def park(self, keep: torch.Tensor) -> FastParked:
        """Move the rows where ``keep`` is False out of the batch (their cache aside).

        Args:
            keep: (B,) bool over the current batch rows.
        """
        out_idx = (~keep).nonzero().squeeze(-1)
        m = self.n - self.P
        parked = FastParked(self.kv[:, :, out_idx, :, :m].clone(), self._attn[out_idx, :m].clone(), self.next_pos[out_idx],
                            None if self.group is None else self.group[out_idx])
        self._select(keep.nonzero().squeeze(-1))
        return parked

    def unpark(self, parked: FastParked, here: torch.Tensor, there: torch.Tensor) -> torch.Tensor:
        """Merge parked rows back, ordered by their ids (the contract of :meth:`slca.generation.kvcache.CacheBatch.unpark`).

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
        if self.group is not None:
            group = self.group.new_zeros(len(ids))
            group[p_here], group[p_there] = self.group, parked.group
            self.group, self._shared = group, None
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
