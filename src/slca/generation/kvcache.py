"""The rollout engine's KV cache over the transformers forward: B rows that grow by chunks with holes.

Every forward pass appends columns for all rows; a row's column is valid only
if it carries one of its tokens (``attn``), and ``position_ids`` count each
row's valid tokens, so a row's positions are exactly those of its own sequence
fed alone (``0 .. n-1``). Rows can be repeated (a group's shared prompt is
prefilled once), dropped (finished rollouts), and parked: taken out of the
batch for the rest of a turn and merged back for the next one, with holes for
everything fed while they were out.

:class:`CacheBatch` runs the model's own ``forward`` on a cache of
:class:`GrowingLayer` s; :class:`slca.generation.fastpath.FastBatch` is the same batch over
a fused decoder. Both satisfy :class:`KVBatch`, the interface
:mod:`slca.generation.rollout` decodes through.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

try:
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError:  # transformers < 4.56 has no cache layers: make_cache falls back to DynamicCache
    Cache = None
    DynamicLayer = object

__all__ = ["KVBatch", "kv_bytes_per_token", "rows_within", "CacheBatch", "Parked", "GrowingLayer", "make_cache", "pad_chunk", "chunk_positions", "merge_order"]


class KVBatch(Protocol):
    """A KV cache shared by B rows (:class:`CacheBatch`, :class:`slca.generation.fastpath.FastBatch`)."""

    @property
    def attn(self) -> torch.Tensor:
        """(B, S) long: 1 on each row's valid cache columns."""

    next_pos: torch.Tensor
    """(B,) tokens of each row so far."""

    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor: ...

    def feed_lists(self, seqs: Sequence[Sequence[int] | None]) -> torch.Tensor: ...

    def expand(self, repeats: int) -> None: ...

    def keep(self, index: Sequence[int]) -> None: ...

    def park(self, keep: torch.Tensor) -> Any | None: ...

    def unpark(self, parked: Any, here: torch.Tensor, there: torch.Tensor) -> torch.Tensor: ...


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of KV cache one token of one row takes: layers x 2 (keys, values) x KV heads x head size x the
    parameters' element size (a model without a transformers config: 0, unknown)."""
    cfg = getattr(model, "config", None)
    layers, heads = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "num_attention_heads", None)
    if not layers or not heads:
        return 0
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    size = next(model.parameters()).element_size()
    return int(layers * 2 * kv * head * size)


def rows_within(model: torch.nn.Module, tokens_per_row: int, budget_bytes: int) -> int:
    """How many rows of ``tokens_per_row`` tokens fit a KV cache of ``budget_bytes`` (at least 1; a model whose
    cache size is unknown: no limit, a very large number)."""
    per_row = kv_bytes_per_token(model) * tokens_per_row
    return max(1, budget_bytes // per_row) if per_row > 0 else 1 << 30


def pad_chunk(seqs: Sequence[Sequence[int] | None], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One list of ids per row (None or empty: nothing for that row) as a left-aligned chunk.

    Returns:
        ``(ids, valid)``, each (B, W) on the CPU, W the longest list: ``pad_id``
        and False past each row's list.
    """
    W = max((len(s) for s in seqs if s), default=0)
    if W == 0:
        raise ValueError("feed_lists needs at least one non-empty sequence")
    ids = torch.full((len(seqs), W), pad_id, dtype=torch.long)
    valid = torch.zeros(len(seqs), W, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            ids[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            valid[b, : len(s)] = True
    return ids, valid


def cache_arg(forward: Any) -> str:
    """The name ``forward`` takes its KV cache under: ``cache`` (transformers >= 5.2x) or ``past_key_values``.

    A peft wrapper's ``forward`` takes ``**kwargs`` and passes them on: the name is its base model's."""
    params = inspect.signature(forward).parameters
    if "cache" in params:
        return "cache"
    base = getattr(getattr(forward, "__self__", None), "get_base_model", None)
    if "past_key_values" not in params and callable(base):
        return cache_arg(base().forward)
    return "past_key_values"


def chunk_positions(next_pos: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of a chunk's tokens and each row's last valid column.

    Args:
        next_pos: (B,) tokens of each row before the chunk.
        valid: (B, W) bool, True on the row's real tokens.

    Returns:
        ``(pos, last)``: (B, W) position of each valid token in its row's
        sequence (a hole gets ``next_pos``, the row's first position in this chunk,
        wherever it sits; nothing reads a hole's output) and (B,) the last valid
        column (0 for a row without one).
    """
    pos = next_pos[:, None] + valid.long().cumsum(dim=1) - 1  # (B, W)
    pos = torch.where(valid, pos, next_pos[:, None].expand_as(pos))
    cols = torch.arange(valid.shape[1], device=valid.device)
    last = torch.where(valid, cols, torch.full_like(pos, -1)).amax(dim=1).clamp_min(0)
    return pos, last


def merge_order(here: torch.Tensor, there: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where rows go when parked rows rejoin the batch: ordered by their ids.

    Args:
        here: (B_here,) ids of the rows in the batch, in batch order.
        there: (B_parked,) ids of the parked rows, in parked order.

    Returns:
        ``(ids, slot_here, slot_there)``: the sorted ids (the new batch order)
        and the new slot of each batch row and of each parked row.
    """
    ids = torch.cat([here, there])
    order = ids.argsort()
    slot = torch.empty_like(order)
    slot[order] = torch.arange(len(ids), device=ids.device)
    return ids[order], slot[: len(here)], slot[len(here):]


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values grow into preallocated buffers (capacity doubles when full).

    ``DynamicCache`` concatenates its tensors at every step, copying the whole
    cache per token (a third of decode time for a 4M-parameter model on CPU).
    The buffers ``_k`` / ``_v`` are (B, H, capacity, D) with ``_n`` columns
    filled; ``keys`` / ``values`` are views of the filled part. The layer owns
    its row operations: repeat and select (the transformers cache API), split
    (copies of rows to park) and merge (parked rows back).
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None
        self._n = 0

    @property
    def filled(self) -> bool:
        """Whether the buffers exist (something was fed)."""
        return getattr(self, "_k", None) is not None

    def _views(self) -> None:
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        L = key_states.shape[-2]
        if self._k is None or self._n + L > self._k.shape[-2]:
            cap = max(64, 2 * (self._n + L))
            k = key_states.new_zeros(*key_states.shape[:-2], cap, key_states.shape[-1])
            v = value_states.new_zeros(*value_states.shape[:-2], cap, value_states.shape[-1])
            if self._n:
                k[..., : self._n, :] = self._k[..., : self._n, :]
                v[..., : self._n, :] = self._v[..., : self._n, :]
            self._k, self._v = k, v
        self._k[..., self._n : self._n + L, :] = key_states
        self._v[..., self._n : self._n + L, :] = value_states
        self._n += L
        self._views()
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._k is not None:
            self._k, self._v = self._k.repeat_interleave(repeats, dim=0), self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of these rows' filled keys and values, (B_p, H, S, D) each (the rows stay in the layer)."""
        return self._k[rows, :, : self._n].clone(), self._v[rows, :, : self._n].clone()

    def merge(self, parked: tuple[torch.Tensor, torch.Tensor], slot_here: torch.Tensor, slot_there: torch.Tensor) -> None:
        """Put :meth:`split` rows back: the layer's rows go to ``slot_here``, the parked ones to ``slot_there``.

        Columns fed while the parked rows were out stay zero (holes).
        """
        pk, pv = parked
        B = len(slot_here) + len(slot_there)
        k = self._k.new_zeros(B, *self._k.shape[1:])
        v = self._v.new_zeros(B, *self._v.shape[1:])
        k[slot_here], v[slot_here] = self._k, self._v
        k[slot_there, :, : pk.shape[-2]], v[slot_there, :, : pv.shape[-2]] = pk, pv
        self._k, self._v = k, v
        self._views()


def make_cache() -> Any:
    """A transformers cache of :class:`GrowingLayer` s (``DynamicCache`` on transformers without cache layers)."""
    if Cache is None:
        from transformers import DynamicCache

        return DynamicCache()
    return Cache(layer_class_to_replicate=GrowingLayer)


@dataclass
class Parked:
    """Cache, attention mask and positions of rows taken out of the batch for the rest of a turn."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (B_p, H, S_p, D) keys and values
    attn: torch.Tensor  # (B_p, S_p)
    next_pos: torch.Tensor  # (B_p,)


class CacheBatch:
    """A KV cache shared by B rows whose sequences grow by chunks with holes, over the model's ``forward``."""

    def __init__(self, model: torch.nn.Module, batch_size: int, pad_id: int, device: torch.device):
        self.model = model
        self.cache = make_cache()
        self.pad_id = pad_id
        self.device = device
        self.attn = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # (B, S) valid cache slots
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,) tokens so far per row
        self.cache_arg = cache_arg(model.forward)

    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Append a chunk and return each row's logits after its last valid token.

        Args:
            ids: (B, W) token ids (anything where not valid).
            valid: (B, W) bool, True on the row's real tokens (in order, any layout).

        Returns:
            (B, V) float logits at each row's last valid column (rows with no
            valid column: the logits of a masked column, to be ignored).
        """
        pos, last = chunk_positions(self.next_pos, valid)
        v = valid.long()
        self.attn = torch.cat([self.attn, v], dim=1)
        out = self.model(
            input_ids=torch.where(valid, ids, torch.full_like(ids, self.pad_id)),
            attention_mask=self.attn,
            position_ids=pos,
            use_cache=True,
            **{self.cache_arg: self.cache},
        )
        self.next_pos = self.next_pos + v.sum(dim=1)
        return out.logits[torch.arange(ids.shape[0], device=ids.device), last].float()  # (B, V)

    def feed_lists(self, seqs: Sequence[Sequence[int] | None]) -> torch.Tensor:
        """Feed one list of ids per row (None or empty: nothing for that row); returns :meth:`feed`'s logits."""
        ids, valid = pad_chunk(seqs, self.pad_id)
        return self.feed(ids.to(self.device), valid.to(self.device))

    def _layers(self) -> list[GrowingLayer] | None:
        """The growing cache layers, or None when rows cannot be parked (fallback cache, not yet filled)."""
        layers = getattr(self.cache, "layers", None)
        if not layers or not all(isinstance(layer, GrowingLayer) and layer.filled for layer in layers):
            return None
        return layers

    def park(self, keep: torch.Tensor) -> Parked | None:
        """Move the rows where ``keep`` is False out of the batch (their cache aside); None if unsupported.

        Args:
            keep: (B,) bool over the current batch rows.
        """
        layers = self._layers()
        if layers is None:
            return None
        out_idx = (~keep).nonzero().squeeze(-1)
        parked = Parked([layer.split(out_idx) for layer in layers], self.attn[out_idx], self.next_pos[out_idx])
        self.keep(keep.nonzero().squeeze(-1).tolist())
        return parked

    def unpark(self, parked: Parked, here: torch.Tensor, there: torch.Tensor) -> torch.Tensor:
        """Merge parked rows back; rows end up ordered by their ids.

        Args:
            parked: from :meth:`park`.
            here: (B_here,) ids of the rows now in the batch, in batch order.
            there: (B_parked,) ids of the parked rows, in parked order.

        Returns:
            the (B_here + B_parked,) sorted row ids, the new batch order. Parked
            rows get invalid (hole) columns for everything fed while they were out.
        """
        ids, p_here, p_there = merge_order(here, there)
        for layer, kv in zip(self._layers() or [], parked.kv):
            layer.merge(kv, p_here, p_there)
        attn = self.attn.new_zeros(len(ids), self.attn.shape[1])
        attn[p_here] = self.attn
        attn[p_there, : parked.attn.shape[1]] = parked.attn
        next_pos = self.next_pos.new_zeros(len(ids))
        next_pos[p_here], next_pos[p_there] = self.next_pos, parked.next_pos
        self.attn, self.next_pos = attn, next_pos
        return ids

    def expand(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place (row ``i`` becomes rows ``i*repeats .. i*repeats+repeats-1``)."""
        self.cache.batch_repeat_interleave(repeats)
        self.attn = self.attn.repeat_interleave(repeats, dim=0)
        self.next_pos = self.next_pos.repeat_interleave(repeats, dim=0)

    def keep(self, index: Sequence[int]) -> None:
        """Keep only these rows (batch positions), dropping finished rollouts from every later forward."""
        idx = torch.tensor(list(index), dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.attn, self.next_pos = self.attn[idx], self.next_pos[idx]
