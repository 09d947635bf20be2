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

from slca.chat import encode_conversation

__all__ = ["SFTConfig", "SFTExample", "SFTStats", "encode_examples", "make_batches", "sft_state", "sft_train", "weighted_lm_loss", "induction_warmup"]


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
    induction_steps: int = 0
    """Steps of an induction warm-up before SFT (:func:`induction_warmup`): random token
    sequences repeated twice, loss on the repeat. A small model trained only on
    demonstrations learns the marginal distribution of argument values long before it
    learns to copy them from the request; on repeated random tokens nothing but copying
    lowers the loss, and the copying heads it forms within ~100 steps are then reused by
    the demonstrations (Olsson et al. 2022, "In-context learning and induction heads")."""
    induction_every: int = 0
    """During SFT, add the induction loss of one repeated-random-token batch every this
    many steps (0 = never), so the copying heads of the warm-up are kept in use."""
    env_loss_weight: float = 0.0
    """Weight of a language-modelling loss on the environment's tokens after the first
    assistant turn (tool responses, later user turns), relative to assistant tokens.
    Tool responses echo the call's arguments, so this loss is copying practice at no
    extra forward cost; it never trains the policy to *generate* those tokens at
    rollout time (they are inserted by the environment)."""
    copy_weight: float = 1.0
    """Loss weight of the assistant tokens that copy the request: tokens of the assistant's
    turns whose id occurs in the first user message and not in the system turn (the tool
    signatures), i.e. the entity, number and date pieces an argument or an answer takes from
    the request. 1 weighs them as every other assistant token. Argument values are a few
    percent of the assistant's tokens; above 1, the copying they need is not drowned by the
    JSON and prose around them."""


@dataclass
class SFTExample:
    """One encoded conversation: token ids, the assistant-token mask and the
    environment-token mask (tokens after the first assistant turn that the
    environment inserted) and the copy mask (assistant tokens that copy the request,
    see :attr:`SFTConfig.copy_weight`), all (T,)."""

    input_ids: list[int]
    model_mask: list[int]
    env_mask: list[int] | None = None
    copy_mask: list[int] | None = None


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


def copy_mask(tokenizer, input_ids: Sequence[int], model_mask: Sequence[int], messages: Sequence[dict[str, Any]],
              tools: list[dict[str, Any]] | None) -> list[int]:
    """(T,) 1 on the assistant tokens whose id occurs in the first user message's tokens
    and not in the system turn's (see :attr:`SFTConfig.copy_weight`); all 0 without a user message."""
    request = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    if not isinstance(request, str) or not request:
        return [0] * len(input_ids)
    ids = set(tokenizer(request, add_special_tokens=False)["input_ids"])
    system = [m for m in messages if m.get("role") == "system"]
    head = tokenizer.apply_chat_template(system + [{"role": "user", "content": ""}], tools=tools, tokenize=False)
    ids -= set(tokenizer(head, add_special_tokens=False)["input_ids"])
    return [int(bool(m) and t in ids) for t, m in zip(input_ids, model_mask)]


def encode_examples(tokenizer, conversations: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]], max_length: int,
                    *, with_copy_mask: bool = False):
    """Encode ``(messages, tools)`` pairs with :func:`slca.chat.encode_conversation`
    (and their :func:`copy_mask` when ``with_copy_mask``).

    Returns:
        (examples, dropped): the encoded conversations no longer than
        ``max_length`` tokens, and how many were longer (dropped, not truncated,
        so that no example loses its final answer).
    """
    out: list[SFTExample] = []
    dropped = 0
    for messages, tools in conversations:
        enc = encode_conversation(tokenizer, messages, tools)
        if len(enc.input_ids) > max_length:
            dropped += 1
            continue
        env = [int(i >= enc.prompt_length and not m) for i, m in enumerate(enc.model_mask)]
        cp = copy_mask(tokenizer, enc.input_ids, enc.model_mask, messages, tools) if with_copy_mask else None
        out.append(SFTExample(list(enc.input_ids), list(enc.model_mask), env, cp))
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


def _collate(examples: Sequence[SFTExample], pad_id: int, env_weight: float = 0.0,
             copy_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` (B, T), ``attention_mask`` (B, T), loss ``weights`` (B, T).

    ``weights[b, t]`` weighs the prediction of token ``t`` (from position ``t - 1``):
    1 on assistant tokens (``copy_weight`` on those of the copy mask), ``env_weight`` on
    environment tokens after the first assistant turn, 0 elsewhere (system, first user
    turn, padding).
    """
    T = max(len(e.input_ids) for e in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    weights = torch.zeros((B, T), dtype=torch.float32)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        att[b, :n] = 1
        w = torch.tensor(e.model_mask, dtype=torch.float32)
        if env_weight and e.env_mask is not None:
            w = w + env_weight * torch.tensor(e.env_mask, dtype=torch.float32)
        if copy_weight != 1.0 and e.copy_mask is not None:
            w = w + (copy_weight - 1.0) * torch.tensor(e.copy_mask, dtype=torch.float32)
        weights[b, :n] = w
    return ids, att, weights


def weighted_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, weights: torch.Tensor,
                     assistant_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy weighted per target token.

    Args:
        logits: (B, T, V) model outputs.
        input_ids: (B, T) the sequence (targets are ``input_ids[:, 1:]``).
        weights: (B, T) weight of predicting each token (column 0 is never a target).
        assistant_mask: (B, T) the assistant's tokens, for the logged loss; default: the
            tokens of weight exactly 1.

    Returns:
        (loss, assistant_loss): ``sum(w * ce) / sum(w)`` over targets, and the plain
        mean cross-entropy on the assistant's tokens (for logging).
    """
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten(), reduction="none")
    w = weights[:, 1:].flatten()
    loss = (ce * w).sum() / w.sum().clamp_min(1e-9)
    a = (w == 1.0).float() if assistant_mask is None else assistant_mask[:, 1:].flatten().float()
    return loss, (ce.detach() * a).sum() / a.sum().clamp_min(1.0)


def _lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up then cosine decay: lr(s) = lr_min + (lr - lr_min) (1 + cos(pi p)) / 2."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + (cfg.lr - lo) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, p)))


def induction_loss_fn(vocab_ids: Sequence[int], *, bos_id: int, sep_id: int, rows: int = 64, min_len: int = 12, max_len: int = 12,
                      seed: int = 0):
    """A callable ``f(model) -> loss`` drawing a fresh batch ``bos x sep x`` (x: (rows, n) uniform over
    ``vocab_ids``) each call; the loss is the cross-entropy of the second copy (seeded stream)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.as_tensor(list(vocab_ids), dtype=torch.long)

    def batch_loss(model) -> torch.Tensor:
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        x = ids[torch.randint(len(ids), (rows, n), generator=gen)]  # (rows, n)
        bos = torch.full((rows, 1), bos_id, dtype=torch.long)
        sep = torch.full((rows, 1), sep_id, dtype=torch.long)
        seq = torch.cat([bos, x, sep, x], dim=1)  # (rows, 2n + 2)
        logits = model(input_ids=seq).logits[:, n + 1 : -1]  # predictions of the second copy
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), x.flatten())

    batch_loss.generator = gen  # its stream's state, saved and restored by a resumable build
    return batch_loss


def induction_warmup(model, vocab_ids: Sequence[int], steps: int, *, lr: float, bos_id: int, sep_id: int, rows: int = 64,
                     min_len: int = 12, max_len: int = 12, seed: int = 0) -> list[float]:
    """Train ``model`` in place on repeated random token sequences; returns the per-step losses.

    Each row is ``bos x sep x`` for ``x`` drawn uniformly from ``vocab_ids`` (length
    ``min_len..max_len``, one length per batch); the loss is the cross-entropy of the
    second copy, which only copying (an induction head) can bring to zero. The fixed
    first token and one length for all rows matter: with neither (lengths 8-24, a
    10-step lr warm-up) the copy loss was still 5.6 after 200 steps; with both it is
    below 0.1 after 100 (measured on the default model size). AdamW at a constant
    ``lr``; its optimizer state is discarded afterwards.
    """
    if steps <= 0:
        return []
    batch_loss = induction_loss_fn(vocab_ids, bos_id=bos_id, sep_id=sep_id, rows=rows, min_len=min_len, max_len=max_len, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses: list[float] = []
    model.train()
    for step in range(steps):
        loss = batch_loss(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def sft_train(model, examples: Sequence[SFTExample], cfg: SFTConfig, *, pad_id: int, progress=None, aux_loss=None,
              resume: dict[str, Any] | None = None, checkpoint=None, checkpoint_every: int = 0) -> SFTStats:
    """Train ``model`` in place for ``cfg.steps`` steps on ``examples``.

    Loss: next-token cross-entropy over the assistant tokens of the batch, plus
    ``cfg.env_loss_weight`` times that on environment tokens (:func:`weighted_lm_loss`);
    ``stats.losses`` records the assistant-token part.
    Epochs repeat with a fresh batch order until ``cfg.steps`` are done.

    Args:
        model: a causal LM (``model(input_ids, attention_mask, labels)`` gives ``.loss``).
        examples: encoded conversations.
        cfg: optimisation settings.
        pad_id: the padding token id.
        aux_loss: optional callable ``aux_loss(model) -> loss`` added to the loss every
            ``cfg.induction_every`` steps (the induction batches of :func:`induction_loss_fn`).
        progress: optional callable ``progress(step, loss)`` called after each step
            (``step`` 0-based; it may evaluate the model, which is put back in train mode).
        checkpoint: optional callable ``checkpoint(state)`` called after every ``checkpoint_every``
            steps (and not after the last) with the loop's whole state (:func:`sft_state`).
        resume: such a state: the model, the optimizer, the batch order, the random streams and
            the statistics are restored and training continues at its step; the result is the
            one the uninterrupted run gives (same machine, same threads).

    Returns:
        The per-step losses and token counts (of all steps, those before ``resume`` included).
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
    batches: list[list[int]] = []
    start = 0
    if resume is not None:
        start, batches = _restore(resume, model, opt, rng, aux_loss, stats, cfg)
    model.train()
    t0, c0 = time.perf_counter() - stats.seconds, time.process_time() - stats.cpu_seconds
    for step in range(start, cfg.steps):
        if not batches:
            batches = make_batches(lengths, cfg.batch_tokens, rng)
        batch = [examples[i] for i in batches.pop()]
        loss = _sft_step(model, opt, batch, step, cfg, pad_id, aux_loss, stats)
        if progress is not None:
            progress(step, loss)
            model.train()
        if checkpoint is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < cfg.steps:
            stats.seconds, stats.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
            checkpoint(sft_state(step + 1, model, opt, rng, batches, aux_loss, stats))
    stats.seconds = time.perf_counter() - t0
    stats.cpu_seconds = time.process_time() - c0
    model.eval()
    return stats


def _sft_step(model, opt, batch: list[SFTExample], step: int, cfg: SFTConfig, pad_id: int, aux_loss, stats: SFTStats) -> float:
    """One optimizer step on ``batch``; appends to ``stats`` and returns the assistant-token loss."""
    ids, att, weights = _collate(batch, pad_id, cfg.env_loss_weight, cfg.copy_weight)
    assistant = None
    if cfg.copy_weight != 1.0:
        assistant = torch.zeros_like(weights)
        for b, e in enumerate(batch):
            assistant[b, : len(e.model_mask)] = torch.tensor(e.model_mask, dtype=torch.float32)
    for g in opt.param_groups:
        g["lr"] = _lr_at(step, cfg)
    logits = model(input_ids=ids, attention_mask=att).logits
    loss, assistant_loss = weighted_lm_loss(logits, ids, weights, assistant)
    if aux_loss is not None and cfg.induction_every and step % cfg.induction_every == 0:
        loss = loss + aux_loss(model)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    stats.losses.append(float(assistant_loss))
    stats.tokens += int(att.sum())
    stats.assistant_tokens += int(((weights[:, 1:] == 1.0) if assistant is None else assistant[:, 1:].bool()).sum())
    return stats.losses[-1]


def sft_state(step: int, model, opt, rng: random.Random, batches: list[list[int]], aux_loss, stats: SFTStats) -> dict[str, Any]:
    """The whole state of :func:`sft_train` after ``step`` steps (what ``resume`` takes; ``torch.save`` writes it)."""
    gen = getattr(aux_loss, "generator", None)
    return {"step": step, "model": {k: v.detach().clone() for k, v in model.state_dict().items()}, "optimizer": opt.state_dict(),
            "rng": rng.getstate(), "batches": [list(b) for b in batches], "torch_rng": torch.get_rng_state(),
            "aux_rng": None if gen is None else gen.get_state(), "stats": dict(stats.__dict__, losses=list(stats.losses))}


def _restore(state: dict[str, Any], model, opt, rng: random.Random, aux_loss, stats: SFTStats, cfg: SFTConfig) -> tuple[int, list[list[int]]]:
    """Put :func:`sft_state`'s ``state`` back into the loop's objects; returns ``(step, batches)``."""
    step = int(state["step"])
    if not 0 < step <= cfg.steps or len(state["stats"]["losses"]) != step:
        raise ValueError(f"resume: a state of step {step} with {len(state['stats']['losses'])} losses does not fit a run of {cfg.steps} steps")
    gen = getattr(aux_loss, "generator", None)
    if (gen is None) != (state["aux_rng"] is None):
        raise ValueError("resume: the state was saved with" + ("out" if state["aux_rng"] is None else "") + " induction batches, this run differs")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    if gen is not None:
        gen.set_state(state["aux_rng"])
    stats.__dict__.update(state["stats"])
    return step, [list(b) for b in state["batches"]]
