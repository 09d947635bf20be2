"""Supervised fine-tuning on chat conversations, loss on assistant tokens only.

The warm start of the embedded default model: next-token cross-entropy on every
token the assistant generates in its turns (its ``<|im_end|>`` included), zero
weight on system, user and tool tokens and on the template's own headers. The
assistant spans come from :func:`slca.chat.encode_conversation`, the same code
that masks rollouts, so SFT and RL agree on which tokens are the policy's.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["SFTConfig", "SFTExample", "SFTStats", "encode_examples", "make_batches", "sft_train"]


@dataclass(frozen=True)
class SFTConfig:
    """Optimisation settings of the warm start."""

    steps: int = 360
    """Optimizer steps (each one batch)."""
    batch_tokens: int = 4096
    """Token budget of a batch: rows x padded length <= this (length-bucketed)."""
    lr: float = 3e-3
    """Peak AdamW learning rate (tiny models take large rates)."""
    warmup_steps: int = 20
    """Linear warm-up steps, then cosine decay to ``min_lr_ratio * lr``."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    max_length: int = 512
    """Conversations longer than this many tokens are dropped (not truncated)."""
    seed: int = 0
    """Seeds batch order."""


@dataclass
class SFTExample:
    """One encoded conversation: token ids and the assistant-token mask, both (T,)."""

    input_ids: list[int]
    model_mask: list[int]


@dataclass
class SFTStats:
    """What a run did: per-step loss (mean over assistant tokens), token counts, time."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    assistant_tokens: int = 0
    seconds: float = 0.0
    """Wall time of the loop."""
    cpu_seconds: float = 0.0
    """CPU time of this process in the loop (= wall time on an otherwise idle machine with one thread)."""


def encode_examples(tokenizer, conversations: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]], max_length: int):
    """Encode ``(messages, tools)`` pairs with :func:`slca.chat.encode_conversation`.

    Returns:
        (examples, dropped): the encoded conversations no longer than
        ``max_length`` tokens, and how many were longer (dropped, not truncated,
        so that no example loses its final answer).
    """
    from slca.chat import encode_conversation

    out: list[SFTExample] = []
    dropped = 0
    for messages, tools in conversations:
        enc = encode_conversation(tokenizer, messages, tools)
        if len(enc.input_ids) > max_length:
            dropped += 1
            continue
        out.append(SFTExample(list(enc.input_ids), list(enc.model_mask)))
    return out, dropped


def make_batches(lengths: Sequence[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches of example indices.

    Sorts by length (ties broken at random), cuts runs whose ``rows x max length``
    stays within ``batch_tokens``, then shuffles the batch order, so padding is
    small and every example appears once.
    """
    if batch_tokens <= 0:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def _collate(examples: Sequence[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` (B, T), ``attention_mask`` (B, T), ``labels`` (B, T).

    ``labels[b, t] = input_ids[b, t]`` on assistant tokens and -100 elsewhere
    (the model shifts labels itself).
    """
    T = max(len(e.input_ids) for e in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        row = torch.tensor(e.input_ids, dtype=torch.long)
        ids[b, :n] = row
        att[b, :n] = 1
        m = torch.tensor(e.model_mask, dtype=torch.bool)
        labels[b, :n] = torch.where(m, row, torch.full_like(row, -100))
    return ids, att, labels


def _lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up then cosine decay: lr(s) = lr_min + (lr - lr_min) (1 + cos(pi p)) / 2."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + (cfg.lr - lo) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, p)))


def sft_train(model, examples: Sequence[SFTExample], cfg: SFTConfig, *, pad_id: int, progress=None) -> SFTStats:
    """Train ``model`` in place for ``cfg.steps`` steps on ``examples``.

    Loss: mean next-token cross-entropy over assistant tokens of the batch.
    Epochs repeat with a fresh batch order until ``cfg.steps`` are done.

    Args:
        model: a causal LM (``model(input_ids, attention_mask, labels)`` gives ``.loss``).
        examples: encoded conversations.
        cfg: optimisation settings.
        pad_id: the padding token id.
        progress: optional callable ``progress(step, loss)`` called after each step.

    Returns:
        The per-step losses and token counts.
    """
    if not examples:
        raise ValueError("examples is empty: nothing to train on")
    if cfg.steps <= 0:
        raise ValueError(f"cfg.steps must be positive, got {cfg.steps}")
    rng = random.Random(cfg.seed)
    lengths = [len(e.input_ids) for e in examples]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    stats = SFTStats()
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    batches: list[list[int]] = []
    for step in range(cfg.steps):
        if not batches:
            batches = make_batches(lengths, cfg.batch_tokens, rng)
        idx = batches.pop()
        ids, att, labels = _collate([examples[i] for i in idx], pad_id)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.losses.append(float(loss.detach()))
        stats.tokens += int(att.sum())
        stats.assistant_tokens += int((labels != -100).sum())
        if progress is not None:
            progress(step, stats.losses[-1])
    stats.seconds = time.perf_counter() - t0
    stats.cpu_seconds = time.process_time() - c0
    model.eval()
    return stats
