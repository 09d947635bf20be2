"""The single-machine reference trainer: GRPO-family RL for tool-calling agents.

A short recipe over library components. One step (:meth:`Trainer.train_step`)
reads as five named phases, the first four each returning a typed record:

1. :meth:`Trainer.rollout` -- sample ``tasks_per_step`` tasks and roll out
   ``group_size`` samples of each against the simulator (:mod:`slca.generation.rollout`),
   stacked into a :class:`~slca.generation.batching.RolloutBatch`;
2. :meth:`Trainer.score` -- hierarchical rewards of every rollout
   (:func:`slca.rewards.score_batch`, the config's ``reward`` preset), plus optional summary noise;
3. :meth:`Trainer.credit` -- tool / summary segments from the environment mask
   (:func:`slca.core.segments.segment_masks`) and advantages from the estimator named
   in the config (registry dispatch, :mod:`slca.core.registry`);
4. :meth:`Trainer.update` -- PPO-style epochs over minibatches: clipped surrogate
   + KL to a frozen reference, aggregated as configured (:mod:`slca.core.losses`);
   on diagnostic steps the first backward is split by segment;
5. :meth:`Trainer.step_metrics` -- diagnostics and the metrics row
   (:mod:`slca.training.stats`, :mod:`slca.core.diagnostics`).

:func:`train` runs the steps with held-out evaluation, logging and checkpoints.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slca import metrics as M
from slca._fs import writing
from slca._checks import group_index
from slca.chat import ChatRenderer, check_segment_masks, encode_conversation, enforce_mask_check, get_format
from slca.chat.spans import span_labels, spans_needed
from slca.core.registry import AdvantageInputs, compute_advantages, fill_inputs, get_estimator, list_estimators, option_values
from slca.core.diagnostics import advantage_stats, contamination, flat_grad, grad_cosine, rolling_cv
from slca.core.losses import aggregate, clipped_surrogate, kl_penalty, token_logprobs, token_weights
from slca.core.segments import segment_masks, span_segment_masks
from slca.env.simulators import new_tool_run
from slca.env.suites import fit_suites, load_suites
from slca.generation.batching import RolloutBatch, collate, response_logprobs
from slca.generation.kvcache import rows_within
from slca.generation.rollout import RolloutConfig, generate_rollouts, stop_token_ids
from slca.rewards.batch import ScoredBatch, score_batch
from slca.rewards.execution import eval_scores
from slca.rewards.turns import subgroup_fraction
from slca.models.named import model_fingerprint
from slca.training.baseline_cache import baseline_key, cached_baseline
from slca.training.config import ConfigError, TrainConfig, config_diff, estimator_options, to_dict, validate
from slca.models.loading import load_policy, policy_options, prepare_policy
from slca.training.runs import (
    RESUME_MAY_CHANGE,
    RunFolder,
    load_checkpoint,
    model_record_problem,
    newest_intact_checkpoint,
    read_model_record,
    read_jsonl,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_atomic,
    write_model_record,
)
from slca.training.samples import SampleGroup, SampleRollout, samples_from_json, samples_to_json
from slca.training.stats import CreditStats, GradSplit, RewardStats, RolloutStats, UpdateStats, mixed_fraction, nanmean, step_metrics
from slca.training.tracking import make_trackers
from slca.types import Task, Trajectory

__all__ = ["Rollouts", "Credit", "TaskSampler", "Trainer", "train"]


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


@dataclass
class Rollouts:
    """Phase 1's output: the trajectories (task-major) and their token batch."""

    trajs: list[Trajectory]
    batch: RolloutBatch
    gen_tokens_per_s: float


@dataclass
class Credit:
    """Phase 3's output: segments, the estimator's inputs and its advantages.

    Attributes:
        tool_mask, summary_mask: (B, T) 0/1 segments.
        inputs: what the estimator read (rewards, masks, optional inputs).
        advantages: (B, T) float32.
        mask_mismatch: :meth:`Trainer.check_masks`'s share, or None.
        boundary: with ``segmentation="span"``, the environment-boundary segments
            (tool, summary) that ``tool_mask`` / ``summary_mask`` refine; the mask
            check reads these. None: the segments are the boundary ones.
    """

    tool_mask: torch.Tensor
    summary_mask: torch.Tensor
    inputs: AdvantageInputs
    advantages: torch.Tensor
    mask_mismatch: float | None = None  # share of rollouts whose masks disagree with their conversation; None: not checked
    boundary: tuple[torch.Tensor, torch.Tensor] | None = None  # segmentation='span': the (B, T) boundary segments it refined


# --------------------------------------------------------------------------- trainer


EVAL_KV_BUDGET = 2 << 30
"""Bytes of KV cache an evaluation batch may take when ``eval_batch_size`` is 0 (auto): SmolLM2-135M takes 45 KB a
token, so 45 rows of 1024 tokens (the default ``max_total_tokens``); the embedded model takes 2 KB a token, so 1024
rows. The engine's buffer doubles its capacity when full, so it may hold up to twice that."""


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
        ood_tasks: dict[str, list[Task]] | None = None,
        make_env: Callable[[Task], Any] | None = None,
        log: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = validate(cfg)
        self.run_dir = Path(cfg.run_dir)
        new_tool_run()  # the first tool exception of this run logs its traceback (slca.env.simulators.tool_raised)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        fit = train_tasks is None
        if train_tasks is None:  # tasks before the model: a bad task file is refused before a model loads
            train_tasks, held_out, ood, make_env = load_suites(cfg.suite, cfg.seed, eval_suite=cfg.eval_suite, eval_fraction=cfg.eval_fraction,
                                                               eval_split=cfg.eval_split, ood_splits=cfg.ood_eval_splits,
                                                               tools=cfg.tools)
            eval_tasks = held_out if eval_tasks is None else eval_tasks
            ood_tasks = ood if ood_tasks is None else ood_tasks
        if make_env is None:
            raise ValueError("Trainer: pass make_env together with train_tasks")
        if not train_tasks:
            raise ValueError("Trainer: train_tasks is empty")
        if model is None:
            model, tokenizer = load_policy(cfg.model, **policy_options(cfg))
        else:
            model, tokenizer = prepare_policy(model, tokenizer, **policy_options(cfg))
        self.model, self.tok = model, tokenizer
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters only
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if fit:  # loaded prompts that leave no room to generate are left out, with a warning
            train_tasks, eval_tasks = fit_suites(train_tasks, eval_tasks or [], tokenizer, cfg.max_total_tokens, suite=cfg.suite, eval_suite=cfg.eval_suite)
        self.train_tasks, self.make_env = train_tasks, make_env
        self.eval_tasks = (eval_tasks or [])[: cfg.eval_tasks]
        self.ood_tasks = {s: ts[: cfg.ood_eval_tasks or cfg.eval_tasks] for s, ts in (ood_tasks or {}).items() if ts}
        self.ref = None  # with LoRA the reference is the base model: the adapters switched off
        if cfg.kl_coef > 0 and not cfg.lora_r:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = _lr_schedule(self.opt, cfg)
        self.sampler = TaskSampler(len(train_tasks), cfg.seed)
        self.step = 0
        self.grad_norms: list[float] = []
        self.samples: list[SampleGroup] = []
        self._log = log
        self._turn_ends: list[int] | None = None  # turn_ends(): the tokens that end a turn, found on first use
        self._trackers = make_trackers(cfg)  # opened on the first record
        self.run_dir.mkdir(parents=True, exist_ok=True)  # last: a refused task file or model leaves no folder behind

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict[str, Any]:
        """One optimizer step: rollout -> score -> credit -> update -> metrics. Returns the step's metrics.

        ``step`` (the updates done before this one) seeds the phases; the step is
        logged, checkpointed and plotted as ``step + 1``, the 1-based index of the
        update just taken (TRL's ``global_step``), 0 being the evaluation before training.
        """
        step = self.step
        ro = self.rollout(step)
        scored = self.score(ro.trajs, step)
        credit = self.credit(ro, scored)
        credit = replace(credit, mask_mismatch=self.check_masks(ro.trajs, credit))  # before anything trains on the masks
        update = self.update(ro.batch, credit, step)
        self.grad_norms.append(update.grad_norm)
        m = self.step_metrics(step + 1, ro, scored, credit, update)
        if self.cfg.sample_html_every and step % self.cfg.sample_html_every == 0:  # steps 1, N + 1, ...
            self.samples.append(self._record_group(step + 1, ro.trajs, credit))
        self.step += 1
        return m

    def rollout_config(self, step: int, *, eval_mode: bool = False):
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
            fast_decode=c.fast_paths,
        )

    def rollout(self, step: int) -> Rollouts:
        """Phase 1: ``tasks_per_step x group_size`` rollouts (task-major) and their token batch."""
        tasks = [self.train_tasks[i] for i in self.sampler.next(self.cfg.tasks_per_step)]
        self.model.eval()
        res = generate_rollouts(self.model, self.tok, tasks, self.make_env, self.rollout_config(step))
        batch = collate(res.trajectories, self.pad_id, self.cfg.device)
        return Rollouts(res.trajectories, batch, res.gen_tokens / max(res.gen_seconds, 1e-9))

    def score(self, trajs: list[Trajectory], step: int) -> ScoredBatch:
        """Phase 2: the two reward tiers of the config's ``reward`` preset (slca's, or the authors');
        ``summary_noise`` adds a seeded Gaussian to the summary tier."""
        c = self.cfg
        sb = score_batch(trajs, reward=c.reward)
        if c.summary_noise > 0:  # sensitivity studies: a noisier summary judge
            g = torch.Generator().manual_seed(c.seed * 7919 + step)
            sb = replace(sb, summary=sb.summary + c.summary_noise * torch.randn(sb.summary.shape, generator=g))
        for reason in sb.reasons[:3]:
            print(f"[slca] unscored rollout: {reason}")
        return sb

    def estimator_options(self, name: str) -> dict[str, Any]:
        """The options estimator ``name`` runs with in this run (:func:`slca.training.config.estimator_options`), as keywords."""
        return option_values(estimator_options(self.cfg, name))

    def credit(self, ro: Rollouts, scored: ScoredBatch) -> Credit:
        """Phase 3: segments from the environment-boundary mask (refined to spans with ``segmentation="span"``),
        advantages through the registry."""
        c, b = self.cfg, ro.batch
        tool_m, sum_m = boundary = segment_masks(b.model_mask, b.valid_mask)
        labels = None
        if spans_needed(get_estimator(c.estimator), c.segmentation):  # each policy token: reasoning, call or text
            labels = span_labels(b.input_ids[:, b.prompt_len:], b.model_mask, tokenizer=self.tok, fmt=c.tool_format,
                                 end_of_turn=self.turn_ends(), lengths=b.valid_mask.sum(dim=1).tolist())
        if c.segmentation == "span":
            tool_m, sum_m = span_segment_masks(tool_m, sum_m, labels)
        group_ids = [t.group_id for t in ro.trajs]
        inputs = AdvantageInputs(scored.tool, scored.summary, group_ids, b.model_mask, tool_m, sum_m, (c.tool_weight, c.summary_weight),
                                 span_labels=labels)
        inputs = fill_inputs(inputs, c.estimator, ro.trajs)  # the optional inputs the estimator needs
        return Credit(tool_m, sum_m, inputs, compute_advantages(c.estimator, inputs, **self.estimator_options(c.estimator)),
                      boundary=boundary if c.segmentation == "span" else None)

    def turn_ends(self) -> list[int]:
        """The tokens that end a sampled turn, as the rollout engine stops on them (found on first use)."""
        if self._turn_ends is None:
            self._turn_ends = stop_token_ids(self.tok, self.model, ChatRenderer(self.tok).end_of_turn_id())
        return self._turn_ends

    def check_masks(self, trajs: list[Trajectory], credit: Credit) -> float:
        """The share of rollouts whose segment masks disagree with their conversation (:func:`slca.chat.check_segment_masks`);
        :class:`slca.chat.MaskMismatchError` naming them when it is above ``mask_check_max_mismatch``. The environment-boundary
        segments are checked (with ``segmentation="span"``, those the span segments refine: a turn's runs are whole there)."""
        tool_m, sum_m = credit.boundary if credit.boundary is not None else (credit.tool_mask, credit.summary_mask)
        found = check_segment_masks(
            [t.response_ids for t in trajs], tool_m, sum_m, [t.messages[len(t.task.messages):] for t in trajs],
            tokenizer=self.tok, fmt=self.cfg.tool_format, end_of_turn=self.turn_ends(),
            row_names=[f"rollout {i} (task {t.task.id!r})" for i, t in enumerate(trajs)])
        return enforce_mask_check(found, len(trajs), self.cfg.mask_check_max_mismatch)

    def update(self, batch: RolloutBatch, credit: Credit, step: int) -> UpdateStats:
        """Phase 4: ``ppo_epochs`` passes of ``minibatches`` optimizer steps, then the LR schedule."""
        c = self.cfg
        t0 = time.perf_counter()
        self.model.train()
        st = UpdateStats(lr=self.opt.param_groups[0]["lr"])  # the rate this step's updates use (logged as `lr`)
        for epoch in range(c.ppo_epochs):
            for k, idx in enumerate(self._minibatch_rows(credit.inputs.group_ids, step, epoch)):
                split = epoch == 0 and k == 0 and bool(c.diag_every) and step % c.diag_every == 0
                self._minibatch_step(batch.rows(idx), credit.tool_mask[idx], credit.summary_mask[idx], credit.advantages[idx], split, st)
        self.sched.step()
        st.seconds = time.perf_counter() - t0
        return st

    def _minibatch_rows(self, group_ids: Sequence[Any], step: int, epoch: int) -> list[torch.Tensor]:
        """Row indices of each minibatch of one pass: rows shuffled one by one, or whole groups (``group_minibatches``)."""
        c = self.cfg
        gen = torch.Generator().manual_seed(c.seed + 31 * step + epoch)
        if not c.group_minibatches:
            return list(torch.randperm(len(group_ids), generator=gen).chunk(c.minibatches))
        idx, G = group_index(group_ids, len(group_ids))  # (B,) dense group of each row
        order = torch.randperm(G, generator=gen)
        return [torch.isin(idx, part).nonzero().squeeze(-1) for part in order.tensor_split(c.minibatches)]

    def _minibatch_step(self, mb: RolloutBatch, tm: torch.Tensor, sm: torch.Tensor, adv: torch.Tensor,
                        split_grads: bool, st: UpdateStats) -> None:
        """One optimizer step on a minibatch (masks and advantages (b, T)); appends to ``st``."""
        c, mask = self.cfg, mb.model_mask
        self.opt.zero_grad(set_to_none=True)
        if 0 < c.micro_batch_size < len(adv):
            self._accumulate(mb, tm, sm, adv, split_grads, st)
        else:
            per_tok, sur = self._per_token_loss(mb, adv, st)

            def loss_of(x: torch.Tensor) -> torch.Tensor:
                return aggregate(x, mask, c.loss_agg, tool_mask=tm, summary_mask=sm, max_tokens=c.max_total_tokens)

            if split_grads:
                loss, st.grad_split = self._split_backward(loss_of(per_tok * tm), loss_of(per_tok * sm))
            else:
                loss = loss_of(per_tok)
                loss.backward()
            st.losses.append(float(loss.detach()))
            st.clip_fracs.append(sur.clip_frac(mask))
        st.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, c.max_grad_norm)))
        self.opt.step()

    def _per_token_loss(self, mb: RolloutBatch, adv: torch.Tensor, st: UpdateStats, kls: list[float] | None = None):
        """The (b, T) per-token loss of ``mb`` (clipped surrogate, plus the KL penalty) and the surrogate's stats; the
        KL's mean over the policy tokens goes to ``st.kls`` (or, given ``kls``, its sum and count there)."""
        c, mask = self.cfg, mb.model_mask
        logp = response_logprobs(self.model, mb, c.temperature, c.fast_paths)
        per_tok, sur = clipped_surrogate(logp, mb.old_logprobs, adv, clip_low=c.clip_low, clip_high=c.clip_high, return_stats=True)
        if c.kl_coef > 0:
            kl_tok = kl_penalty(logp, self._ref_logprobs(mb), kind=c.kl_kind)
            per_tok = per_tok + c.kl_coef * kl_tok
            kl_sum = (kl_tok.detach() * mask).sum()
            if kls is None:
                st.kls.append(float(kl_sum / mask.sum().clamp_min(1)))
            else:
                kls += [float(kl_sum), float(mask.sum())]
        return per_tok, sur

    def _accumulate(self, mb: RolloutBatch, tm: torch.Tensor, sm: torch.Tensor, adv: torch.Tensor,
                    split_grads: bool, st: UpdateStats) -> None:
        """The minibatch's gradient, ``micro_batch_size`` rows at a time: each token is weighted by its weight in the
        minibatch's loss (:func:`token_weights`), so the sum over the slices is the minibatch's loss and gradient."""
        c, mask = self.cfg, mb.model_mask
        w = token_weights(mask, c.loss_agg, tool_mask=tm, summary_mask=sm, max_tokens=c.max_total_tokens)  # (b, T)
        loss, clipped, kls, g_tool = 0.0, 0.0, [], None
        for rows in torch.arange(len(adv)).split(c.micro_batch_size):
            per_tok, sur = self._per_token_loss(mb.rows(rows), adv[rows], st, kls)
            clipped += sur.clip_frac(mask[rows]) * float(mask[rows].sum())
            if split_grads:  # as _split_backward, slice by slice: the tool part's gradient is kept apart
                l_tool, l_sum = (per_tok * tm[rows] * w[rows]).sum(), (per_tok * sm[rows] * w[rows]).sum()
                before = flat_grad(self.params)
                l_tool.backward(retain_graph=True)
                g_tool = flat_grad(self.params) - before + (0.0 if g_tool is None else g_tool)
                l_sum.backward()
                part = l_tool + l_sum
            else:
                part = (per_tok * w[rows]).sum()
                part.backward()
            loss += float(part.detach())
        if split_grads:
            g_sum = flat_grad(self.params) - g_tool
            st.grad_split = GradSplit(float(g_tool.norm()), float(g_sum.norm()), grad_cosine(g_tool, g_sum))
        st.losses.append(loss)
        st.clip_fracs.append(clipped / max(float(mask.sum()), 1.0))
        if kls:
            st.kls.append(sum(kls[0::2]) / max(sum(kls[1::2]), 1.0))

    @torch.no_grad()
    def _ref_logprobs(self, mb: RolloutBatch) -> torch.Tensor:
        """(b, T) log-probabilities under the frozen reference (LoRA: the base, adapters off)."""
        c = self.cfg
        if self.ref is not None:
            return response_logprobs(self.ref, mb, c.temperature, c.fast_paths)
        with self.model.disable_adapter():
            return response_logprobs(self.model, mb, c.temperature, c.fast_paths)

    def _split_backward(self, l_tool: torch.Tensor, l_sum: torch.Tensor) -> tuple[torch.Tensor, GradSplit]:
        """Backward of ``l_tool + l_sum`` in two passes, measuring each segment's gradient.

        The loss is linear in the per-token loss, so it splits exactly into its
        tool-token and summary-token parts.
        """
        l_tool.backward(retain_graph=True)
        g_tool = flat_grad(self.params)
        l_sum.backward()
        g_sum = flat_grad(self.params) - g_tool
        return l_tool + l_sum, GradSplit(float(g_tool.norm()), float(g_sum.norm()), grad_cosine(g_tool, g_sum))

    def step_metrics(self, step: int, ro: Rollouts, scored: ScoredBatch, credit: Credit, update: UpdateStats) -> dict[str, Any]:
        """Phase 5: the step's diagnostics and its ``metrics.jsonl`` row (names in :mod:`slca.training.stats`)."""
        c, inp, b = self.cfg, credit.inputs, ro.batch
        rewards = RewardStats(inp.tool_rewards, inp.summary_rewards, scored.components, inp.turn_rewards)
        sigs = inp.tool_signatures
        cs = CreditStats(
            advantage_stats(credit.advantages, credit.tool_mask),
            advantage_stats(credit.advantages, credit.summary_mask),
            contamination(c.estimator, inp, **self.estimator_options(c.estimator)),
            subgroup_fraction(list(inp.group_ids), list(sigs)) if sigs is not None else None,
        )
        n_tok = int(b.valid_mask.sum())
        has_tool, has_sum = credit.tool_mask.any(dim=1), credit.summary_mask.any(dim=1)
        rs = RolloutStats(len(ro.trajs), n_tok, int(b.model_mask.sum()), [len(t.calls) for t in ro.trajs],
                          [t.stop_reason for t in ro.trajs], ro.gen_tokens_per_s,
                          no_tool_segment=int((~has_tool).sum()), no_summary_segment=int((has_tool & ~has_sum).sum()),
                          mixed_call_groups=mixed_fraction(inp.group_ids, has_tool), mask_mismatch=credit.mask_mismatch)
        m = step_metrics(step, rs, rewards, cs, update, volatility=rolling_cv(self.grad_norms, c.volatility_window),
                         lr=update.lr, train_tokens_per_s=n_tok * c.ppo_epochs / max(update.seconds, 1e-9))
        if credit.boundary is not None:  # segmentation='span': how much of the execution segment it gave the summary
            m[M.ROLLOUT_SPAN_MOVED.name] = span_moved_share(credit)
        return m

    def _record_group(self, step: int, trajs: list[Trajectory], credit: Credit) -> SampleGroup:
        """One group's tokens with the advantages the reference estimators (grpo, slca, gdpo) would give them.

        The group with the widest spread of summary rewards is recorded: it shows misattribution best.
        """
        inp, G = credit.inputs, self.cfg.group_size
        sl = _widest_group(inp.summary_rewards, G)
        tool_r, sum_r, tool_m, sum_m = inp.tool_rewards[sl], inp.summary_rewards[sl], credit.tool_mask[sl], credit.summary_mask[sl]
        group = AdvantageInputs(tool_r, sum_r, [0] * G, inp.model_mask[sl], tool_m, sum_m, inp.reward_weights)
        advs = {name: compute_advantages(name, group, **self.estimator_options(name)) for name in list_estimators(reference=True)}
        rows = []
        for j, t in enumerate(trajs[sl]):
            n = len(t.response_ids)
            rows.append(SampleRollout(
                tokens=[self.tok.decode([i]) for i in t.response_ids],
                model_mask=t.model_mask,
                tool_mask=tool_m[j, :n].tolist(),
                summary_mask=sum_m[j, :n].tolist(),
                adv={k: [round(x, 4) for x in v[j, :n].tolist()] for k, v in advs.items()},
                tool_reward=float(tool_r[j]),
                summary_reward=float(sum_r[j]),
                stop_reason=t.stop_reason,
            ))
        first = trajs[sl.start]
        return SampleGroup(step, first.task.id, first.task.kind, self.tok.decode(first.prompt_ids), rows)

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (``eval/*``), the out-of-distribution sets (``eval_<split>/*``) and the parallel probe."""
        m = self.evaluate_on(self.eval_tasks, M.EVAL_SET) if self.eval_tasks else {}
        if not m:
            return {}
        for split, tasks in self.ood_tasks.items():
            m.update(self.evaluate_on(tasks, f"{M.EVAL_SET}_{split}"))
        m.update(self.parallel_probe())
        return m

    def eval_batch(self) -> int:
        """Tasks rolled out together in an evaluation: ``eval_batch_size``, or (0) as many as a KV cache of
        :data:`EVAL_KV_BUDGET` bytes holds at ``max_total_tokens`` a row."""
        return self.cfg.eval_batch_size or rows_within(self.model, self.cfg.max_total_tokens, EVAL_KV_BUDGET)

    def evaluate_baseline(self) -> dict[str, float]:
        """:meth:`evaluate` before any update, read from the step-0 cache when a run with the same weights, tasks
        and settings stored it there (``SLCA_BASELINE_CACHE``; :mod:`slca.training.baseline_cache`)."""
        def key() -> str:
            tok = self.tok
            settings = {"rollout": asdict(self.rollout_config(0, eval_mode=True)), "eval_batch": self.eval_batch(),
                        "device": str(self.cfg.device),
                        "chat_template": getattr(tok, "chat_template", None), "vocab": sorted(tok.get_vocab().items())}
            return baseline_key(self.model, {M.EVAL_SET: self.eval_tasks, **self.ood_tasks}, settings)

        m, path = cached_baseline(self.evaluate, key)
        if path is not None:
            print(f"[slca] step-0 evaluation read from the baseline cache ({path})")
        return m

    @torch.no_grad()
    def evaluate_on(self, tasks: list[Task], prefix: str) -> dict[str, float]:
        """One greedy rollout per task, scored as ``slca eval`` scores its in-domain suites
        (:func:`slca.rewards.eval_scores`: in-domain metrics, parse rate, parallel steps split over
        turns, the authors' Success@0.9), averaged overall, per task kind and over the tasks that need a call;
        both of slca's reward tiers, whatever the run's ``reward`` preset, so that runs of either preset compare
        on one scale."""
        self.model.eval()
        n, rc = self.eval_batch(), self.rollout_config(self.step, eval_mode=True)
        trajs = [t for i in range(0, len(tasks), n)  # batch k sampled with seed + k (greedy: no sampling)
                 for t in generate_rollouts(self.model, self.tok, tasks[i : i + n], self.make_env,
                                            replace(rc, seed=rc.seed + i // n)).trajectories]
        sb = score_batch(trajs)
        out: dict[str, list[float]] = {}  # metric key -> one value per rollout that has it
        for t, rs in zip(trajs, sb.summary.tolist()):
            scores = eval_scores(t.task, t.turns, final_text=t.final_text)
            row = {M.EVAL_IN_DOMAIN[k].key(set=prefix): v for k, v in scores.items()}
            row[M.EVAL_KIND_SUCCESS.key(set=prefix, kind=t.task.kind)] = scores["success"]
            row[M.EVAL_KIND_SUMMARY.key(set=prefix, kind=t.task.kind)] = rs
            if t.task.gold:  # tasks that need at least one call: what tool use is judged on
                row[M.EVAL_TOOL_TASKS.key(set=prefix)] = scores["success"]
            for k, v in row.items():
                out.setdefault(k, []).append(float(v))
        m = {k: nanmean(v) for k, v in out.items()}
        m[M.EVAL_REWARD_TOOL.key(set=prefix)] = nanmean(sb.tool)
        m[M.EVAL_REWARD_SUMMARY.key(set=prefix)] = nanmean(sb.summary)
        return m

    @torch.no_grad()
    def parallel_probe(self, n: int = 8) -> dict[str, float]:
        """The paper's diagnostic case, tracked over training.

        For up to ``n`` held-out tasks whose first gold step is parallel, the
        log-probability of answering with the whole step in one turn versus only
        its first call (the start of the wasteful one-call-per-turn pattern).
        ``probe/parallel_pref`` = mean log p(one parallel turn) - log p(first call alone).
        """
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
                tok_lp = token_logprobs(self.model(input_ids=ids).logits[0, :-1], ids[0, 1:])
                lp[name].append(float(tok_lp[mask].sum()))
        par, seq = nanmean(lp["parallel"]), nanmean(lp["sequential"])
        return {M.PROBE_LOGP_PARALLEL.name: par, M.PROBE_LOGP_SEQUENTIAL.name: seq, M.PROBE_PARALLEL_PREF.name: par - seq}

    # ------------------------------------------------------------------ checkpoints

    def save(self) -> Path:
        """Checkpoint the run atomically (see :func:`slca.training.runs.save_checkpoint`); returns its folder."""
        state = {
            "step": self.step,
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "sampler": self.sampler.state(),
            "grad_norms": self.grad_norms,
            "samples": samples_to_json(self.samples),
            "rng": rng_state(),
            "ref": self.ref.state_dict() if self.ref is not None else None,
            "config": to_dict(self.cfg),
        }
        return save_checkpoint(self.run_dir / "checkpoints", self.step, model=self.model, tokenizer=self.tok, state=state,
                               keep=self.cfg.keep_checkpoints)

    def resume(self, ckpt: str | Path | None = None) -> bool:
        """Restore the newest intact checkpoint of the run (or ``ckpt``). False if there is none.

        Nothing is unpickled: weights and trainer tensors come from safetensors,
        the rest from JSON. A checkpoint of a different config is refused.
        """
        if ckpt is None:
            ckpt = newest_intact_checkpoint(self.run_dir / "checkpoints")[0]
            if ckpt is None:
                return False
        ckpt = Path(ckpt)
        sd, st = load_checkpoint(ckpt)
        diff = config_diff(st["config"], self.cfg, ignore=("run_dir", *RESUME_MAY_CHANGE))
        if diff:
            raise ValueError(f"checkpoint {str(ckpt)!r} is of a different config: {'; '.join(diff)}")
        if hasattr(self.model, "peft_config"):  # LoRA: the checkpoint holds the adapters only
            from peft import set_peft_model_state_dict

            missing, unexpected = [], set_peft_model_state_dict(self.model, sd).unexpected_keys
        else:
            missing, unexpected = self.model.load_state_dict(sd, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # tied embeddings are saved once
            raise ValueError(f"checkpoint {str(ckpt)!r} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.opt.load_state_dict(st["optimizer"])
        self.sched.load_state_dict(st["scheduler"])
        self.sampler.epoch, self.sampler.pos = st["sampler"]["epoch"], st["sampler"]["pos"]
        self.grad_norms = list(st["grad_norms"])
        self.samples = samples_from_json(st["samples"], f"checkpoint {str(ckpt)!r}")
        self.step = int(st["step"])
        set_rng_state(st["rng"])
        if self.ref is not None and st["ref"] is not None:
            self.ref.load_state_dict(st["ref"])
        return True

    # ------------------------------------------------------------------ logging

    def log(self, metrics: dict[str, Any]) -> None:
        """One record to ``metrics.jsonl``, then to the ``report_to`` trackers (:mod:`slca.training.tracking`)."""
        path = self.run_dir / "metrics.jsonl"
        with writing(path, f"the record of step {metrics.get(M.STEP.name)}", after="a torn line is dropped on resume"):
            with open(path, "a") as f:
                f.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}) + "\n")
        self._trackers.log(metrics)
        if self._log is not None:
            self._log(metrics)

    def close(self) -> None:
        self._trackers.close()


def _widest_group(summary_rewards: torch.Tensor, group_size: int) -> slice:
    """The rows of the (first) group whose summary rewards spread widest (NaN read as 0)."""
    spreads = [float(torch.nan_to_num(summary_rewards[i : i + group_size]).std()) for i in range(0, len(summary_rewards), group_size)]
    g0 = int(np.argmax(spreads)) * group_size
    return slice(g0, g0 + group_size)


def _lr_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """``transformers.get_scheduler(cfg.lr_scheduler_type)``, stepped once per training step.

    transformers gives the first update schedule step 0 (learning rate 0 during
    warmup); here update ``k`` (1-based) uses schedule step ``k``, so the first
    update already learns: the schedule is advanced once before training, over
    ``steps + 1`` schedule steps so that a decaying schedule's last update is not 0.
    """
    from transformers import get_scheduler

    sched = get_scheduler(cfg.lr_scheduler_type, opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.steps + 1)
    with warnings.catch_warnings():  # torch warns about a scheduler step before the first optimizer step
        warnings.simplefilter("ignore", UserWarning)
        sched.step()
    return sched


def _truncate_metrics(path: Path, completed_steps: int) -> None:
    """Keep only the records a run resumed after ``completed_steps`` steps keeps: steps
    0 (the evaluation before training) to ``completed_steps``; none when it starts at 0.

    A torn last line (a kill mid-write) is dropped; the file is rewritten atomically.
    """
    if not path.exists():
        return
    keep = [r for r in read_jsonl(path) if completed_steps > 0 and r.get(M.STEP.name, 0) <= completed_steps]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))


def span_moved_share(credit: Credit) -> float:
    """The share of the environment-boundary execution segment's tokens that ``segmentation="span"`` moved to the summary
    segment (``rollout/span_moved``; 0.0 when the batch has no execution tokens)."""
    was, now = credit.boundary[0].bool(), credit.tool_mask.bool()
    return float((was & ~now).sum()) / max(int(was.sum()), 1)


class Stopwatch:
    """This process's CPU seconds (user + system, every thread: ``time.process_time``) between two laps; the
    checkpoint written after a row counts in the next one."""

    def __init__(self) -> None:
        self.mark = time.process_time()

    def lap(self) -> float:
        """The CPU seconds since the last lap (or since it was made)."""
        before, self.mark = self.mark, time.process_time()
        return self.mark - before


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    **trainer_kwargs: Any,
) -> Trainer:
    """Run (or resume) a training run to ``cfg.steps``; returns the trainer.

    An existing run folder needs ``resume`` (continue from its newest intact
    checkpoint; the config must match) or ``overwrite`` (start over); see
    :class:`slca.training.runs.RunFolder`. ``stop_after`` ends the process early after
    that many steps in this call (used to test stop-and-resume); ``on_step``
    receives each step's metrics.
    """
    validate(cfg)  # before the run folder is touched or a model loads
    # the folder is locked and checked first; it is written (config.json, an --overwrite emptied) only once
    # the tasks, the model and the checkpoint have loaded: a start refused until then leaves it as it was
    with RunFolder(cfg, resume=resume, overwrite=overwrite, defer_write=True) as run:
        for note in run.notes:
            print(f"[slca] {note}")
        tr = Trainer(cfg, log=on_step, **trainer_kwargs)
        fingerprint = model_fingerprint(cfg.model)  # every run's records name the weights they started from
        if run.checkpoint is not None:
            problem = model_record_problem(tr.run_dir, cfg.model, fingerprint)
            if problem is not None and read_model_record(tr.run_dir) is not None:
                raise ConfigError("--resume", f"{problem}; pass --overwrite to start over")
            tr.resume(run.checkpoint)
        run.commit()
        write_model_record(tr.run_dir, cfg.model, fingerprint)
        if run.checkpoint is not None:
            print(f"[slca] resumed from step {tr.step} ({run.checkpoint})")
        _truncate_metrics(tr.run_dir / "metrics.jsonl", tr.step)
        try:
            cpu = Stopwatch()  # each row's perf/cpu_s: this process's CPU seconds since the row before
            if cfg.eval_on_start and tr.step == 0 and tr.eval_tasks:
                tr.log({M.STEP.name: 0, **tr.evaluate_baseline(), M.PERF_CPU.name: cpu.lap()})  # the baseline, before any update
            done = 0
            while tr.step < cfg.steps:
                m = tr.train_step()
                last = tr.step == cfg.steps
                if (cfg.eval_every and tr.step % cfg.eval_every == 0) or last:
                    m.update(tr.evaluate())
                tr.log({**m, M.PERF_CPU.name: cpu.lap()})
                saved = (cfg.save_every and tr.step % cfg.save_every == 0) or last
                if saved:
                    tr.save()
                done += 1
                if stop_after is not None and done >= stop_after and not last:
                    if not saved:
                        tr.save()
                    break
            write_atomic(tr.run_dir / "samples.json", json.dumps(samples_to_json(tr.samples)))
        finally:
            tr.close()
    return tr
