"""LoRA SFT of SmolLM2 on encoded conversations, loss on the assistant's tokens only, resumable.

The loss is next-token cross-entropy on every token the assistant generates in its turns (its
``<|im_end|>`` included) and on nothing else: the mask is :func:`slca.chat.encode_conversation`'s
``model_mask``, the code that masks rollouts, so SFT and RL agree on which tokens are the policy's.
The language-model head runs only at the positions that predict such a token (a fifth of a
demonstration's; SmolLM2's 49,152-word head is a fifth of its forward cost per position).

A step is one length-bucketed batch (:func:`recipes.warmstart.sft.make_batches`), run in slices of at
most ``micro_tokens`` and accumulated with each token weighted as in the whole batch, so the update is the
whole batch's. Only the adapter's parameters train (AdamW). Every ``checkpoint_every`` steps the whole
state of the loop is written atomically (the adapter's tensors, the optimizer, the batch order, the random
streams, the statistics; about 30 MB for r 8 on every linear layer), and after the last step: a killed run
started again resumes at its last checkpoint and ends where the uninterrupted run ends (same machine and threads; tested). CPU
seconds are process CPU time in the loop, summed over the pieces of a resumed run.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slca.chat import encode_conversation

from ..warmstart.sft import make_batches
from .config import Stage1Config

__all__ = ["Example", "TrainStats", "StateMismatch", "encode", "lr_at", "train_lora", "trainable"]


@dataclass
class Example:
    """One encoded conversation: token ids and the assistant-token mask, both (T,)."""

    input_ids: list[int]
    model_mask: list[int]


@dataclass
class TrainStats:
    """What the loop did (all steps, those before a resume included)."""

    losses: list[float] = field(default_factory=list)
    """Per step: mean cross-entropy over the batch's assistant tokens (before the update)."""
    lrs: list[float] = field(default_factory=list)
    """Per step: the learning rate of its update."""
    tokens: int = 0
    """Tokens forwarded (padding excluded)."""
    assistant_tokens: int = 0
    """Tokens that carried loss."""
    seconds: float = 0.0
    """Wall seconds in the loop."""
    cpu_seconds: float = 0.0
    """Process CPU seconds in the loop (all threads)."""
    resumed_at: list[int] = field(default_factory=list)
    """Steps a run resumed at."""


class StateMismatch(ValueError):
    """A checkpoint of another build (its fingerprint differs): one line, naming the file."""


def encode(tokenizer, conversations: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
           max_length: int) -> tuple[list[Example], int]:
    """``(messages, tools)`` pairs -> examples no longer than ``max_length`` tokens, and how many were longer (dropped)."""
    out: list[Example] = []
    dropped = 0
    for messages, tools in conversations:
        enc = encode_conversation(tokenizer, messages, tools)
        if len(enc.input_ids) > max_length:
            dropped += 1
            continue
        out.append(Example(list(enc.input_ids), [int(bool(m)) for m in enc.model_mask]))
    return out, dropped


def lr_at(step: int, cfg: Stage1Config) -> float:
    """Linear warm-up (step ``s`` of ``warmup_steps`` at ``lr (s + 1) / warmup_steps``), then cosine decay to
    ``lr * min_lr_ratio`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + (cfg.lr - lo) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, p)))


def trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters that train (the adapter's), by name, in the model's order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _slices(batch: list[Example], micro_tokens: int) -> list[list[Example]]:
    """Consecutive rows whose ``rows x longest`` stays within ``micro_tokens`` (at least one row each)."""
    out: list[list[Example]] = [[]]
    longest = 0
    for e in batch:
        n = len(e.input_ids)
        if out[-1] and (len(out[-1]) + 1) * max(longest, n) > micro_tokens:
            out.append([])
            longest = 0
        out[-1].append(e)
        longest = max(longest, n)
    return out


def _collate(rows: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, T), attention mask (B, T), target mask (B, T - 1): 1 where token ``t + 1`` is the assistant's."""
    T = max(len(e.input_ids) for e in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), T), dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.bool)
    for b, e in enumerate(rows):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        att[b, :n] = 1
        mask[b, :n] = torch.tensor(e.model_mask, dtype=torch.bool)
    return ids, att, mask[:, 1:]


def _parts(model):
    """``(decoder, lm_head)`` of a causal LM, under a peft wrapper or not."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model, inner.lm_head


def assistant_ce_sum(model, ids: torch.Tensor, att: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropy of the assistant's tokens (``target_mask`` (B, T - 1): predicting token ``t + 1``),
    the head run only at those positions."""
    decoder, head = _parts(model)
    hidden = decoder(input_ids=ids, attention_mask=att).last_hidden_state[:, :-1]  # (B, T - 1, H)
    logits = head(hidden[target_mask]).float()  # (N, V)
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:][target_mask], reduction="sum")


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_lora(model, examples: Sequence[Example], cfg: Stage1Config, *, pad_id: int, state_path: str | Path | None = None,
               fingerprint: str = "", on_step: Callable[[int, float, TrainStats], None] | None = None,
               log_path: str | Path | None = None) -> TrainStats:
    """Train the adapter of ``model`` (a peft model: its trainable parameters) in place for ``cfg.steps`` steps.

    Args:
        model: the peft-wrapped causal LM.
        examples: encoded conversations (:func:`encode`).
        cfg: the recipe's settings (optimisation fields).
        pad_id: the padding id.
        state_path: the checkpoint file: resumed from when it exists, written (atomically) every
            ``cfg.checkpoint_every`` steps and after the last one (the caller removes it once the adapter is saved).
        fingerprint: the build's fingerprint; a checkpoint with another one is refused (:class:`StateMismatch`).
        on_step: ``on_step(step, loss, stats)`` after each step (1-based ``step``) and its checkpoint.
        log_path: a JSON-lines file that gets one line per step (step, loss, lr, tokens, seconds).

    Returns:
        The statistics of all ``cfg.steps`` steps.
    """
    if not examples:
        raise ValueError("no examples to train on")
    params = trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters (wrap it with a LoRA adapter first)")
    opt = torch.optim.AdamW([p for _, p in params], lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    stats = TrainStats()
    batches: list[list[int]] = []
    start = 0
    state_path = Path(state_path) if state_path is not None else None
    if state_path is not None and state_path.is_file():
        start, batches = _restore(torch.load(state_path, weights_only=False), state_path, params, opt, rng, stats, cfg, fingerprint)
        stats.resumed_at.append(start)
    lengths = [len(e.input_ids) for e in examples]
    model.train()
    t0, c0 = time.perf_counter() - stats.seconds, time.process_time() - stats.cpu_seconds
    for step in range(start, cfg.steps):
        if not batches:
            batches = make_batches(lengths, cfg.batch_tokens, rng)
        batch = [examples[i] for i in batches.pop()]
        loss = _step(model, opt, params, batch, step, cfg, pad_id, stats)
        stats.seconds, stats.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        if log_path is not None:
            with open(log_path, "a") as f:
                f.write(json.dumps({"step": step + 1, "loss": round(loss, 5), "lr": stats.lrs[-1], "tokens": stats.tokens,
                                    "seconds": round(stats.seconds, 1), "cpu_seconds": round(stats.cpu_seconds, 1)}) + "\n")
        if state_path is not None and ((cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0) or step + 1 == cfg.steps):
            _atomic_save(_state(step + 1, params, opt, rng, batches, stats, fingerprint), state_path)
        if on_step is not None:
            on_step(step + 1, loss, stats)
    model.eval()
    return stats


def _step(model, opt, params, batch: list[Example], step: int, cfg: Stage1Config, pad_id: int, stats: TrainStats) -> float:
    """One optimizer step on ``batch`` (slice by slice); returns its mean assistant-token cross-entropy."""
    lr = lr_at(step, cfg)
    for g in opt.param_groups:
        g["lr"] = lr
    n_targets = sum(sum(e.model_mask[1:]) for e in batch)
    total = 0.0
    for rows in _slices(batch, cfg.micro_tokens):
        ids, att, mask = _collate(rows, pad_id)
        s = assistant_ce_sum(model, ids, att, mask)
        (s / max(n_targets, 1)).backward()
        total += float(s.detach())
        stats.tokens += int(att.sum())
    torch.nn.utils.clip_grad_norm_([p for _, p in params], cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    stats.assistant_tokens += n_targets
    stats.losses.append(total / max(n_targets, 1))
    stats.lrs.append(lr)
    return stats.losses[-1]


def _state(step: int, params, opt, rng: random.Random, batches: list[list[int]], stats: TrainStats, fingerprint: str) -> dict[str, Any]:
    return {"step": step, "fingerprint": fingerprint, "adapter": {n: p.detach().clone() for n, p in params},
            "optimizer": opt.state_dict(), "rng": rng.getstate(), "batches": [list(b) for b in batches],
            "torch_rng": torch.get_rng_state(), "stats": {**stats.__dict__, "losses": list(stats.losses), "lrs": list(stats.lrs),
                                                          "resumed_at": list(stats.resumed_at)}}


def _restore(state: dict[str, Any], path: Path, params, opt, rng: random.Random, stats: TrainStats, cfg: Stage1Config,
             fingerprint: str) -> tuple[int, list[list[int]]]:
    if state.get("fingerprint") != fingerprint:
        raise StateMismatch(f"{path}: a checkpoint of another build (fingerprint {state.get('fingerprint')!r}, this build "
                            f"{fingerprint!r}): remove it to start over, or build into another folder")
    step = int(state["step"])
    if not 0 < step <= cfg.steps or len(state["stats"]["losses"]) != step:
        raise StateMismatch(f"{path}: a checkpoint of step {step} does not fit a run of {cfg.steps} steps")
    names = [n for n, _ in params]
    if sorted(state["adapter"]) != sorted(names):
        raise StateMismatch(f"{path}: its adapter's tensors are not this model's")
    with torch.no_grad():
        for n, p in params:
            p.copy_(state["adapter"][n])
    opt.load_state_dict(state["optimizer"])
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    stats.__dict__.update(state["stats"])
    return step, [list(b) for b in state["batches"]]
