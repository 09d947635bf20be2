"""Input checks shared by the tensor functions: every failure names the argument."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def as_2d(name: str, x: Any, *, nonempty: bool = False) -> torch.Tensor:
    """Return ``x`` as a 2-D tensor or raise a ValueError naming ``name``.

    An empty batch (``B = 0``) or empty response (``T = 0``) is a valid shape;
    ``nonempty=True`` refuses ``B = 0`` (for a result that is undefined on no rows, as a loss).
    """
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except Exception as e:  # noqa: BLE001 - re-raised with the argument's name
            raise ValueError(f"{name} must be a (B, T) tensor, got {type(x).__name__}: {e}") from e
    if x.dim() == 1 and x.numel() == 0:
        x = x.reshape(0, 0)  # [] : no rows, and so no columns either
    if x.dim() != 2:
        raise ValueError(f"{name} must be a (B, T) tensor, got shape {tuple(x.shape)}")
    if nonempty and x.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (B=0); pass at least one rollout")
    return x


def as_1d(name: str, x: Any, n: int | None = None) -> torch.Tensor:
    """Return ``x`` as a 1-D float tensor of length ``n`` (if given); ``B = 0`` is a valid length."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float32)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{name} must be a (B,) tensor of numbers, got {type(x).__name__}: {e}") from e
    if x.dim() != 1:
        raise ValueError(f"{name} must be a (B,) tensor, got shape {tuple(x.shape)}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has length {x.shape[0]}, expected {n} (one value per rollout)")
    if not torch.is_floating_point(x):
        x = x.float()
    return x


def check_mask(name: str, m: torch.Tensor) -> torch.Tensor:
    """Check that ``m`` holds only 0 and 1 (bool, int or float); return it as bool."""
    if m.dtype == torch.bool:
        return m
    if torch.is_floating_point(m) and torch.isnan(m).any():
        raise ValueError(f"{name} must contain only 0 and 1, found NaN")
    bad = (m != 0) & (m != 1)
    if bad.any():
        vals = torch.unique(m[bad])[:5].tolist()
        raise ValueError(f"{name} must contain only 0 and 1, found {vals}")
    return m.bool()


def check_same_shape(**tensors: torch.Tensor) -> None:
    items = list(tensors.items())
    name0, t0 = items[0]
    for name, t in items[1:]:
        if tuple(t.shape) != tuple(t0.shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(t0.shape)} (the shape of {name0})")


def group_index(group_ids: Any, n: int) -> tuple[torch.Tensor, int]:
    """Map group ids to dense indices ``0..G-1``.

    ``group_ids`` may be a 1-D integer tensor or any sequence of hashable ids
    (verl passes string uids). Returns ``(index (B,) long, G)``.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
        if torch.is_floating_point(group_ids) or group_ids.dtype == torch.bool:
            raise ValueError(f"group_ids as a tensor must be integer, got {group_ids.dtype}")
        if group_ids.shape[0] != n:
            raise ValueError(f"group_ids has length {group_ids.shape[0]}, expected {n} (one id per rollout)")
        uniq, inv = torch.unique(group_ids, return_inverse=True)
        return inv.long(), int(uniq.numel())
    if isinstance(group_ids, (str, bytes)) or not isinstance(group_ids, Sequence) and not hasattr(group_ids, "__len__"):
        raise ValueError(f"group_ids must be a 1-D tensor or a sequence of ids, got {type(group_ids).__name__}")
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has length {len(ids)}, expected {n} (one id per rollout)")
    table: dict[Any, int] = {}
    out = []
    for g in ids:
        try:
            out.append(table.setdefault(g, len(table)))
        except TypeError as e:
            raise ValueError(f"group_ids must be hashable, got {type(g).__name__}") from e
    return torch.tensor(out, dtype=torch.long), len(table)
