"""The single-machine reference trainer: GRPO-family RL for tool-calling agents.

One step, top to bottom (see :func:`train_step`):

1. sample ``tasks_per_step`` tasks; roll out ``group_size`` samples of each
   against the simulator (multi-turn, batched generation);
2. score every rollout with the hierarchical rewards (execution tier, summary tier);
3. split each response into tool / summary segments from the environment mask;
4. compute advantages with the estimator named in the config (registry dispatch);
5. PPO-style epochs over minibatches: clipped surrogate + KL to a frozen
   reference, aggregated as configured; optimizer step;
6. diagnostics (per-segment gradient norms and cosine, volatility, contamination),
   logging, held-out evaluation, checkpoints.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slca.advantages import AdvantageInputs, compute_advantages, get_estimator
from slca.config import TrainConfig, to_dict, validate
from slca.diagnostics import advantage_stats, contamination, flat_grad, grad_cosine, rolling_cv
from slca.losses import aggregate, clipped_surrogate, kl_penalty
from slca.segments import segment_masks
from slca.types import Task, Trajectory

__all__ = ["RolloutBatch", "collate", "response_logprobs", "TaskSampler", "Trainer", "train"]


# --------------------------------------------------------------------------- tensors


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
    """Stack trajectories into a :class:`RolloutBatch`."""
    if not trajs:
        raise ValueError("collate: trajs is empty")
    P = max(len(t.prompt_ids) for t in trajs)
    T = max(max(len(t.response_ids) for t in trajs), 1)
    B = len(trajs)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    att = torch.zeros(B, P + T, dtype=torch.long)
    mm = torch.zeros(B, T, dtype=torch.long)
    vm = torch.zeros(B, T, dtype=torch.long)
    lp = torch.zeros(B, T, dtype=torch.float32)
    for i, t in enumerate(trajs):
        p, r = len(t.prompt_ids), len(t.response_ids)
        ids[i, P - p : P] = torch.tensor(t.prompt_ids)
        att[i, P - p : P] = 1
        if r:
            ids[i, P : P + r] = torch.tensor(t.response_ids)
            att[i, P : P + r] = 1
            mm[i, :r] = torch.tensor(t.model_mask)
            vm[i, :r] = 1
            lp[i, :r] = torch.tensor(t.logprobs, dtype=torch.float32)
    pos = (att.cumsum(1) - 1).clamp_min(0)
    d = torch.device(device)
    return RolloutBatch(ids.to(d), att.to(d), pos.to(d), P, mm.to(d), vm.to(d), lp.to(d))


def response_logprobs(model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the response tokens under ``model`` at ``temperature``.

    Returns:
        (B, T) float32; the value at ``t`` is ``log p(response_t | prefix)``.
    """
    P = batch.prompt_len
    T = batch.input_ids.shape[1] - P
    # Only the T + 1 last positions reach the LM head: on prompt positions it is
    # wasted work (about 10% of a training pass of the default model, see docs/performance.md).
    kw = {"logits_to_keep": T + 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, **kw)
    logits = out.logits[:, -(T + 1) : -1, :].float() / temperature  # (B, T, V) predicts response tokens
    targets = batch.input_ids[:, P:]  # (B, T)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


# --------------------------------------------------------------------------- data


@dataclass
class TaskSampler:
    """Seeded, resumable task order: a fresh permutation each pass over the data."""

    n: int
    seed: int
    epoch: int = 0
    pos: int = 0

    def _perm(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        perm = self._perm()
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                perm = self._perm()
            out.append(perm[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}


# --------------------------------------------------------------------------- rewards


@dataclass
class ScoredBatch:
    """Per-rollout rewards: (B,) tensors plus the named components of each tier."""

    tool: torch.Tensor
    summary: torch.Tensor
    components: dict[str, list[float]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def score(trajs: list[Trajectory]) -> ScoredBatch:
    """Hierarchical rewards for every rollout (NaN + reason when unscorable)."""
    from slca.rewards import execution_reward, summary_reward

    tool, summ, comps, reasons = [], [], {}, []
    for t in trajs:
        e = execution_reward(t.task, t.turns)
        s = summary_reward(t.task, t.turns, t.final_text)
        tool.append(e.total)
        summ.append(s.total)
        for prefix, rb in (("exec", e), ("summary", s)):
            for k, v in rb.components.items():
                comps.setdefault(f"{prefix}/{k}", []).append(float(v))
            if rb.reason and math.isnan(rb.total):
                reasons.append(f"{t.task.id}: {rb.reason}")
    return ScoredBatch(torch.tensor(tool, dtype=torch.float32), torch.tensor(summ, dtype=torch.float32), comps, reasons)


# --------------------------------------------------------------------------- trainer


def _nanmean(x: list[float] | torch.Tensor) -> float:
    t = torch.as_tensor(x, dtype=torch.float32)
    t = t[~torch.isnan(t)]
    return float(t.mean()) if t.numel() else float("nan")


def load_policy(spec: str, device: str) -> tuple[torch.nn.Module, Any]:
    """The embedded default (``"default"``) or any causal LM path with a chat template."""
    if spec == "default":
        from slca.models import load_default

        model, tok = load_default()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = Path(spec)
        if not p.exists():
            raise ValueError(f"model {spec!r}: no such path (hub downloads are not used; pass a local folder)")
        tok = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(f"model {spec!r}: its tokenizer has no chat template")
    return model.to(device), tok


def load_suite(suite: str, split: str, seed: int) -> tuple[list[Task], Callable[[Task], Any]]:
    """Tasks of a split and the simulator factory for them."""
    if suite == "toolworld":
        from slca.env import toolworld

        return toolworld.make_tasks(split, seed=seed), lambda task: toolworld.make_env(task, seed=seed)
    from slca.env import load_tasks, toolworld

    p = Path(suite)
    if not p.exists():
        raise ValueError(f"suite {suite!r}: not 'toolworld' and no such file")
    tasks = load_tasks(p)
    # toolworld's env answers toolworld tools from its world and any other tool from the schema simulator
    return tasks, lambda task: toolworld.make_env(task, seed=seed)


class Trainer:
    """Holds the state of one run; :meth:`train_step` is one optimizer step."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        train_tasks: list[Task] | None = None,
        eval_tasks: list[Task] | None = None,
        make_env: Callable[[Task], Any] | None = None,
        log: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = validate(cfg)
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        if model is None:
            model, tokenizer = load_policy(cfg.model, cfg.device)
        self.model, self.tok = model.to(cfg.device), tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if train_tasks is None:
            train_tasks, make_env = load_suite(cfg.suite, "train", cfg.seed)
            if eval_tasks is None and cfg.suite == "toolworld":
                eval_tasks = load_suite(cfg.suite, "test", cfg.seed)[0]
        if make_env is None:
            raise ValueError("Trainer: pass make_env together with train_tasks")
        self.train_tasks, self.make_env = train_tasks, make_env
        self.eval_tasks = (eval_tasks or [])[: cfg.eval_tasks]
        self.ref = None
        if cfg.kl_coef > 0:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        warm = max(cfg.warmup_steps, 1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm))
        self.sampler = TaskSampler(len(train_tasks), cfg.seed)
        self.step = 0
        self.grad_norms: list[float] = []
        self.samples: list[dict[str, Any]] = []
        self._log = log
        self._tb = None

    # ------------------------------------------------------------------ one step

    def rollout_config(self, step: int, *, eval_mode: bool = False):
        from slca.rollout import RolloutConfig

        c = self.cfg
        return RolloutConfig(
            group_size=1 if eval_mode else c.group_size,
            max_turns=c.max_turns,
            max_new_tokens=c.max_new_tokens,
            max_total_tokens=c.max_total_tokens,
            temperature=c.eval_temperature if eval_mode else c.temperature,
            top_p=1.0 if eval_mode else c.top_p,
            format=c.tool_format,
            seed=c.seed * 1_000_003 + step * 7 + (1 if eval_mode else 0),
        )

    def train_step(self) -> dict[str, Any]:
        """One rollout batch -> rewards -> advantages -> PPO update. Returns the step's metrics."""
        from slca.rollout import generate_rollouts

        c, step = self.cfg, self.step
        m: dict[str, Any] = {"step": step}

        # 1. rollouts: tasks_per_step x group_size, task-major
        tasks = [self.train_tasks[i] for i in self.sampler.next(c.tasks_per_step)]
        self.model.eval()
        res = generate_rollouts(self.model, self.tok, tasks, self.make_env, self.rollout_config(step))
        trajs = res.trajectories
        m["perf/gen_tokens_per_s"] = res.gen_tokens / max(res.gen_seconds, 1e-9)

        # 2. hierarchical rewards
        sb = score(trajs)
        tool_r, sum_r = sb.tool, sb.summary
        if c.summary_noise > 0:  # sensitivity studies: a noisier summary judge
            g = torch.Generator().manual_seed(c.seed * 7919 + step)
            sum_r = sum_r + c.summary_noise * torch.randn(sum_r.shape, generator=g)
        group_ids = [t.group_id for t in trajs]

        # 3. segments from the environment-boundary mask
        batch = collate(trajs, self.pad_id, c.device)
        tool_m, sum_m = segment_masks(batch.model_mask, batch.valid_mask)

        # 4. advantages through the registry (plus the optional inputs the estimator needs)
        from slca.rewards.turns import advantage_extras

        extras = advantage_extras(trajs, getattr(get_estimator(c.estimator), "needs", ()))
        inputs = AdvantageInputs(tool_r, sum_r, group_ids, batch.model_mask, tool_m, sum_m, (c.tool_weight, c.summary_weight), **extras)
        est_kw = {"scale": c.scale, "eps": c.eps, "empty_tool": c.empty_tool, "turn_lambda": c.turn_lambda}
        adv = compute_advantages(c.estimator, inputs, **est_kw)  # (B, T)

        # 5. PPO epochs over minibatches
        t0 = time.perf_counter()
        self.model.train()
        B = len(trajs)
        losses, clipfracs, kls, gnorm = [], [], [], float("nan")
        diag: dict[str, float] = {}
        for epoch in range(c.ppo_epochs):
            perm = torch.randperm(B, generator=torch.Generator().manual_seed(c.seed + 31 * step + epoch))
            for k, idx in enumerate(perm.chunk(c.minibatches)):
                mb = batch.rows(idx)
                mask, tm, sm, a = mb.model_mask, tool_m[idx], sum_m[idx], adv[idx]
                logp = response_logprobs(self.model, mb, c.temperature)
                per_tok = clipped_surrogate(logp, mb.old_logprobs, a, clip_low=c.clip_low, clip_high=c.clip_high)
                if self.ref is not None:
                    with torch.no_grad():
                        ref_logp = response_logprobs(self.ref, mb, c.temperature)
                    kl_tok = kl_penalty(logp, ref_logp, kind=c.kl_kind)
                    per_tok = per_tok + c.kl_coef * kl_tok
                    kls.append(float((kl_tok.detach() * mask).sum() / mask.sum().clamp_min(1)))
                agg = dict(tool_mask=tm, summary_mask=sm, max_tokens=c.max_total_tokens)
                self.opt.zero_grad(set_to_none=True)
                if epoch == 0 and k == 0 and c.diag_every and step % c.diag_every == 0:
                    # the loss is linear in per_tok, so it splits exactly into the two segments
                    l_tool = aggregate(per_tok * tm, mask, c.loss_agg, **agg)
                    l_sum = aggregate(per_tok * sm, mask, c.loss_agg, **agg)
                    l_tool.backward(retain_graph=True)
                    g_tool = flat_grad(self.model.parameters())
                    l_sum.backward()
                    g_sum = flat_grad(self.model.parameters()) - g_tool
                    diag = {
                        "grad/tool_norm": float(g_tool.norm()),
                        "grad/summary_norm": float(g_sum.norm()),
                        "grad/cosine_tool_summary": grad_cosine(g_tool, g_sum),
                    }
                    loss = l_tool + l_sum
                else:
                    loss = aggregate(per_tok, mask, c.loss_agg, **agg)
                    loss.backward()
                gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm))
                self.opt.step()
                losses.append(float(loss.detach()))
                with torch.no_grad():
                    ratio = torch.exp(logp - mb.old_logprobs)
                    clipped = ((ratio < 1 - c.clip_low) | (ratio > 1 + c.clip_high)) & mask.bool()
                    clipfracs.append(float(clipped.sum() / mask.sum().clamp_min(1)))
        self.sched.step()
        train_s = time.perf_counter() - t0
        self.grad_norms.append(gnorm)

        # 6. diagnostics and metrics
        m.update(diag)
        m["grad/norm"] = gnorm
        m["grad/volatility"] = rolling_cv(self.grad_norms, c.volatility_window)
        m["loss"] = _nanmean(losses)
        m["ppo/clip_frac"] = _nanmean(clipfracs)
        if kls:
            m["ppo/kl"] = _nanmean(kls)
        m["lr"] = self.sched.get_last_lr()[0]
        m["reward/tool"] = _nanmean(tool_r)
        m["reward/summary"] = _nanmean(sum_r)
        m["reward/unscored"] = int(torch.isnan(tool_r).sum() + torch.isnan(sum_r).sum())
        for k, v in sb.components.items():
            m[f"reward/{k}"] = _nanmean(v)
        for name, seg in (("tool", tool_m), ("summary", sum_m)):
            for k, v in advantage_stats(adv, seg).items():
                m[f"adv/{name}_{k}"] = v
        m["adv/contamination"] = contamination(c.estimator, inputs, **est_kw)
        if inputs.tool_signatures is not None:
            from slca.rewards.turns import subgroup_fraction

            m["adv/cond_subgroup_frac"] = subgroup_fraction(group_ids, list(inputs.tool_signatures))
        if inputs.turn_rewards is not None:
            m["reward/turn"] = _nanmean(inputs.turn_rewards.flatten())
        n_tok = int(batch.valid_mask.sum())
        m["perf/train_tokens_per_s"] = n_tok * c.ppo_epochs / max(train_s, 1e-9)
        m["rollout/response_tokens"] = n_tok / B
        m["rollout/policy_token_frac"] = float(batch.model_mask.sum()) / max(n_tok, 1)
        m["rollout/tool_turns"] = _nanmean([len(t.calls) for t in trajs])
        stops = [t.stop_reason for t in trajs]
        for r in sorted(set(stops)):
            m[f"rollout/stop_{r}"] = stops.count(r) / B
        for reason in sb.reasons[:3]:
            print(f"[slca] unscored rollout: {reason}")
        if c.sample_html_every and step % c.sample_html_every == 0:
            self.samples.append(self._record_group(step, trajs, tool_r, sum_r, batch, tool_m, sum_m, est_kw))

        self.step += 1
        return m

    def _record_group(self, step, trajs, tool_r, sum_r, batch, tool_m, sum_m, est_kw) -> dict[str, Any]:
        """One group's tokens with the advantages GRPO, GDPO and SLCA would give them."""
        c = self.cfg
        G = c.group_size
        # the group with the widest spread of summary rewards shows misattribution best
        spreads = [float(torch.nan_to_num(sum_r[i : i + G]).std()) for i in range(0, len(trajs), G)]
        g0 = int(np.argmax(spreads)) * G
        sl = slice(g0, g0 + G)
        inputs = AdvantageInputs(tool_r[sl], sum_r[sl], [0] * G, batch.model_mask[sl], tool_m[sl], sum_m[sl], (c.tool_weight, c.summary_weight))
        advs = {name: compute_advantages(name, inputs, **est_kw) for name in ("grpo", "gdpo", "slca")}
        rows = []
        for j, t in enumerate(trajs[sl]):
            n = len(t.response_ids)
            rows.append({
                "tokens": [self.tok.decode([i]) for i in t.response_ids],
                "model_mask": t.model_mask,
                "tool_mask": tool_m[g0 + j, :n].tolist(),
                "summary_mask": sum_m[g0 + j, :n].tolist(),
                "adv": {k: [round(x, 4) for x in v[j, :n].tolist()] for k, v in advs.items()},
                "tool_reward": float(tool_r[g0 + j]),
                "summary_reward": float(sum_r[g0 + j]),
                "stop_reason": t.stop_reason,
            })
        return {"step": step, "task": trajs[g0].task.id, "kind": trajs[g0].task.kind,
                "prompt": self.tok.decode(trajs[g0].prompt_ids), "rollouts": rows}

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics: in-domain metrics, both reward tiers, parse rate."""
        from slca.rewards import in_domain_metrics
        from slca.rollout import generate_rollouts

        if not self.eval_tasks:
            return {}
        self.model.eval()
        res = generate_rollouts(self.model, self.tok, self.eval_tasks, self.make_env, self.rollout_config(self.step, eval_mode=True))
        sb = score(res.trajectories)
        out: dict[str, list[float]] = {}
        for t, rs in zip(res.trajectories, sb.summary.tolist()):
            metrics = in_domain_metrics(t.task, t.turns)
            metrics["parse_ok"] = float(sum(len(x.parsed.errors) for x in t.turns) == 0)
            for k, v in metrics.items():
                out.setdefault(k, []).append(float(v))
            out.setdefault(f"kind/{t.task.kind}/success", []).append(float(metrics["success"]))
            out.setdefault(f"kind/{t.task.kind}/reward_summary", []).append(rs)
        m = {f"eval/{k}": _nanmean(v) for k, v in out.items()}
        m["eval/reward_tool"] = _nanmean(sb.tool)
        m["eval/reward_summary"] = _nanmean(sb.summary)
        m.update(self.parallel_probe())
        return m

    @torch.no_grad()
    def parallel_probe(self, n: int = 8) -> dict[str, float]:
        """The paper's diagnostic case, tracked over training.

        For up to ``n`` held-out tasks whose first gold step is parallel, the
        log-probability of answering with the whole step in one turn versus only
        its first call (the start of the wasteful one-call-per-turn pattern).
        ``probe/parallel_pref`` = mean log p(one parallel turn) - log p(first call alone).
        """
        from slca.chat import encode_conversation, get_format

        fmt = get_format(self.cfg.tool_format)
        tasks = [t for t in self.eval_tasks if t.gold and len(t.gold[0]) > 1][:n]
        if not tasks:
            return {}
        lp: dict[str, list[float]] = {"parallel": [], "sequential": []}
        for task in tasks:
            for name, calls in (("parallel", task.gold[0]), ("sequential", task.gold[0][:1])):
                msgs = task.messages + [{"role": "assistant", "content": fmt.render(calls)}]
                enc = encode_conversation(self.tok, msgs, task.tools)
                ids = torch.tensor([enc.input_ids], device=self.cfg.device)
                mask = torch.tensor(enc.model_mask[1:], device=self.cfg.device, dtype=torch.bool)
                logits = self.model(input_ids=ids).logits[0, :-1].float()
                tok_lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
                lp[name].append(float(tok_lp[mask].sum()))
        par, seq = _nanmean(lp["parallel"]), _nanmean(lp["sequential"])
        return {"probe/logp_parallel": par, "probe/logp_sequential": seq, "probe/parallel_pref": par - seq}

    # ------------------------------------------------------------------ checkpoints

    def save(self) -> Path:
        d = self.run_dir / "checkpoints" / f"step-{self.step:06d}"
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(d, safe_serialization=True)
        self.tok.save_pretrained(d)
        torch.save(
            {
                "step": self.step,
                "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(),
                "sampler": self.sampler.state(),
                "grad_norms": self.grad_norms,
                "samples": self.samples,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
                "ref": self.ref.state_dict() if self.ref is not None else None,
                "config": to_dict(self.cfg),
            },
            d / "trainer_state.pt",
        )
        ckpts = sorted((self.run_dir / "checkpoints").glob("step-*"))
        for old in ckpts[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(old)
        return d

    def resume(self, ckpt: str | Path | None = None) -> bool:
        """Restore the newest checkpoint of the run (or ``ckpt``). False if there is none."""
        if ckpt is None:
            ckpts = sorted((self.run_dir / "checkpoints").glob("step-*"))
            if not ckpts:
                return False
            ckpt = ckpts[-1]
        ckpt = Path(ckpt)
        from safetensors.torch import load_file

        files = sorted(ckpt.glob("*.safetensors"))
        if not files:
            raise ValueError(f"checkpoint {str(ckpt)!r} holds no model weights")
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # tied embeddings are saved once
            raise ValueError(f"checkpoint {str(ckpt)!r} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        st = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        self.opt.load_state_dict(st["optimizer"])
        self.sched.load_state_dict(st["scheduler"])
        self.sampler.epoch, self.sampler.pos = st["sampler"]["epoch"], st["sampler"]["pos"]
        self.grad_norms = list(st["grad_norms"])
        self.samples = list(st["samples"])
        self.step = int(st["step"])
        torch.set_rng_state(st["rng"]["torch"])
        random.setstate(st["rng"]["python"])
        np.random.set_state(st["rng"]["numpy"])
        if self.ref is not None and st["ref"] is not None:
            self.ref.load_state_dict(st["ref"])
        return True

    # ------------------------------------------------------------------ logging

    def log(self, metrics: dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}) + "\n")
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and k != "step" and math.isfinite(v):
                self._tb.add_scalar(k, v, metrics["step"])
        self._tb.flush()
        if self._log is not None:
            self._log(metrics)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _truncate_metrics(path: Path, before_step: int) -> None:
    """Keep only records of steps before ``before_step`` (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) < before_step]
    path.write_text("".join(k + "\n" for k in keep))


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    **trainer_kwargs: Any,
) -> Trainer:
    """Run (or resume) a training run to ``cfg.steps``; returns the trainer.

    ``stop_after`` ends the process early after that many steps in this call
    (used to test stop-and-resume); ``on_step`` receives each step's metrics.
    """
    tr = Trainer(cfg, log=on_step, **trainer_kwargs)
    (tr.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    if resume and tr.resume():
        pass
    _truncate_metrics(tr.run_dir / "metrics.jsonl", tr.step)
    done = 0
    while tr.step < cfg.steps:
        m = tr.train_step()
        last = tr.step == cfg.steps
        if (cfg.eval_every and tr.step % cfg.eval_every == 0) or last:
            m.update(tr.evaluate())
        tr.log(m)
        if (cfg.save_every and tr.step % cfg.save_every == 0) or last:
            tr.save()
        done += 1
        if stop_after is not None and done >= stop_after and not last:
            tr.save()
            break
    (tr.run_dir / "samples.json").write_text(json.dumps(tr.samples))
    tr.close()
    return tr
