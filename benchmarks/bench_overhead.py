"""(b) SLCA's overhead against GRPO inside a full training step.

    .venv/bin/python benchmarks/bench_overhead.py

On a real multi-turn batch (the bench_step ``multi`` workload: 8 prompts x 4
rollouts, two parallel-call tool turns and a summary, collated as the trainer
does), times with many repeats:

* what only SLCA does: the tool / summary segment masks
  (:func:`slca.segment_masks`) and the segment-locked advantages
  (``compute_advantages("slca")``);
* what GRPO does in its place: ``compute_advantages("grpo")``;
* the per-step diagnostics the trainer computes for either estimator
  (contamination, per-segment advantage stats);
* the loss on top of the advantages (clipped surrogate + token-mean), the same
  code for both;

and compares ``slca-only - grpo-only`` with the median full step
(``Trainer.train_step()``, estimator ``slca`` and ``grpo`` interleaved).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402


def micro(fn, repeats: int) -> float:
    """Median process-CPU seconds of ``fn()`` over ``repeats`` calls (after 3 warm-up calls)."""
    return C.med(C.time_call(fn, repeats, warmup=3).cpu)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5, help="full steps per estimator (median)")
    p.add_argument("--micro", type=int, default=200, help="repeats of each small timing (median)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny model (tests)")
    a = p.parse_args(argv)
    size = C.TINY if a.tiny else C.FULL
    C.header("bench_overhead: SLCA-specific work vs GRPO inside a full step", a)

    from slca.core.registry import AdvantageInputs, compute_advantages
    from slca.training.config import TrainConfig
    from slca.core.diagnostics import advantage_stats, contamination
    from slca.core.losses import aggregate, clipped_surrogate
    from slca.generation.rollout import RolloutConfig, generate_rollouts
    from slca.core.segments import segment_masks
    from slca.training.trainer import Trainer, collate

    tok = C.build_tokenizer(size.vocab)
    script = C.script_turns(tok)
    model = C.build_model(tok, size, script)
    ts = C.tasks(size.prompts, True)
    rcfg = RolloutConfig(group_size=size.generations, max_turns=3, max_new_tokens=max(map(len, script)) + 8, max_total_tokens=2048)
    trajs = generate_rollouts(model, tok, ts, C.make_env, rcfg).trajectories
    batch = collate(trajs, tok.pad_token_id)
    B, T = batch.model_mask.shape
    g = torch.Generator().manual_seed(0)
    tool_r, sum_r = torch.rand(B, generator=g), torch.rand(B, generator=g)  # the scripted rollouts score alike
    gids = [t.group_id for t in trajs]
    tm, sm = segment_masks(batch.model_mask, batch.valid_mask)
    inputs = AdvantageInputs(tool_r, sum_r, gids, batch.model_mask, tm, sm, (1.0, 1.0))
    logp = torch.randn(B, T) * 0.1 + batch.old_logprobs
    adv = compute_advantages("slca", inputs)
    print(f"   batch: {B} rollouts x {T} response tokens ({int(batch.model_mask.sum())} policy tokens)")

    def loss():
        per_tok = clipped_surrogate(logp, batch.old_logprobs, adv, clip_low=0.2, clip_high=0.28)
        return aggregate(per_tok, batch.model_mask, "token_mean", tool_mask=tm, summary_mask=sm, max_tokens=2048)

    def diags():
        contamination("slca", inputs)
        advantage_stats(adv, tm)
        advantage_stats(adv, sm)

    with tempfile.TemporaryDirectory() as d:
        trainers = {}
        for est in ("grpo", "slca"):
            cfg = TrainConfig(
                run_dir=str(Path(d) / est), seed=0, estimator=est, tasks_per_step=size.prompts, group_size=size.generations,
                max_turns=3, max_new_tokens=rcfg.max_new_tokens, max_total_tokens=2048, minibatches=1, kl_coef=0.0,
                warmup_steps=0, diag_every=0, eval_every=0, sample_html_every=0, save_every=0,
            )
            trainers[est] = Trainer(cfg, model=C.build_model(tok, size, script), tokenizer=tok, train_tasks=ts, make_env=C.make_env)

        print(f"{'thr':>3}  {'masks':>9}{'slca adv':>10}{'grpo adv':>10}{'diagnostics':>12}{'loss':>9}"
              f"  {'grpo step':>10}{'slca step':>10}  {'SLCA-only - GRPO / step':>24}")
        for th in C.parse_threads(a.threads):
            C.set_threads(th)
            t_mask = micro(lambda: segment_masks(batch.model_mask, batch.valid_mask), a.micro)
            t_slca = micro(lambda: compute_advantages("slca", inputs), a.micro)
            t_grpo = micro(lambda: compute_advantages("grpo", inputs), a.micro)
            t_diag = micro(diags, a.micro)
            t_loss = micro(loss, a.micro)
            steps = {"grpo": C.Clock(), "slca": C.Clock()}
            for est in ("grpo", "slca"):  # warm-up
                trainers[est].train_step()
            for _ in range(a.repeats):
                for est in ("grpo", "slca"):
                    with steps[est]():
                        trainers[est].train_step()
            s_g, s_s = C.med(steps["grpo"].cpu), C.med(steps["slca"].cpu)
            extra = t_mask + t_slca - t_grpo
            print(f"{th:>3}  {t_mask * 1e3:>7.3f}ms{t_slca * 1e3:>8.3f}ms{t_grpo * 1e3:>8.3f}ms{t_diag * 1e3:>10.3f}ms"
                  f"{t_loss * 1e3:>7.3f}ms  {s_g:>9.3f}s{s_s:>9.3f}s  {extra / s_s * 100:>22.3f} %", flush=True)
    print("All figures are median process-CPU time (less sensitive to other load than wall time). SLCA-only - GRPO = "
          "masks + slca adv - grpo adv (the trainer computes the segment masks for any estimator, so this overstates "
          "it). Step medians are noisy; their difference is not the overhead.")


if __name__ == "__main__":
    main()
