"""One warm-start recipe, evaluated on the toolworld test split while it trains.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/warmstart_sweep.py --steps 2000 --env-weight 0.5 \
        --eval-at 500,1000,2000 --out docs/results/warmstart/run.json [--save DIR]

Builds the model with :func:`recipes.warmstart.build_default` itself for the given
:class:`~recipes.warmstart.BuildConfig` overrides (so ``--save DIR`` is a finished build,
recipe fingerprint included, that can ship as ``src/slca/models/shipped``), and at each ``--eval-at`` step runs greedy
rollouts on ``--eval-n`` toolworld test tasks and records ArgMatch, Success on
tool-needing and single-call tasks, parse rate and the summary score. The JSON
file is rewritten after every evaluation, so a long run can be read as it goes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=360)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--env-weight", type=float, default=0.0)
    ap.add_argument("--copy-weight", type=float, default=1.0)
    ap.add_argument("--n-tasks", type=int, default=4000)
    ap.add_argument("--synthetic", type=float, default=0.5)
    ap.add_argument("--drills", type=int, default=0)
    ap.add_argument("--digit-runs", action="store_true")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--induction", type=int, default=0)
    ap.add_argument("--induction-every", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--from-default", action="store_true",
                    help="start from BuildConfig() (the shipped recipe) and apply only --paraphrase, --entity-style, "
                         "--wrong-entity, --sequential, --model-heads and --sft-steps; the other options above are ignored")
    ap.add_argument("--paraphrase", type=float, default=None, help="BuildConfig.paraphrase (default: the base config's)")
    ap.add_argument("--entity-style", default=None, help="BuildConfig.entity_style (default: the base config's)")
    ap.add_argument("--wrong-entity", type=float, default=None, help="DemoMix.wrong_entity (default: the base config's)")
    ap.add_argument("--sequential", type=float, default=None, help="DemoMix.sequential: parallel steps split over turns (default: the base config's)")
    ap.add_argument("--model-heads", default=None, help="with --from-default: 'H,KV' attention and key/value heads (same width)")
    ap.add_argument("--seed", type=int, default=None,
                    help="with --from-default: one seed for the data (data_seed), the weights (model_seed) and the SFT order (sft.seed): "
                         "a replicate of the recipe")
    ap.add_argument("--sft-steps", type=int, default=None, help="with --from-default: SFTConfig.steps (the schedule follows)")
    ap.add_argument("--eval-at", default="")
    ap.add_argument("--eval-n", type=int, default=64)
    ap.add_argument("--out", required=True, help="JSON record (rewritten after every evaluation)")
    ap.add_argument("--save", default=None, help="folder for the finished build (as slca build-model writes it) "
                    "and a step<N> snapshot per evaluation")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from slca.env import toolworld
    from slca.models import import_recipe
    from slca.generation.rollout import RolloutConfig, generate_rollouts

    warmstart = import_recipe()  # recipes/warmstart of this checkout
    BuildConfig, ModelSize, SFTConfig, build_default = warmstart.BuildConfig, warmstart.ModelSize, warmstart.SFTConfig, warmstart.build_default

    sys_path_fix()
    from warmstart_report import rollout_rates

    from dataclasses import replace

    cfg = BuildConfig(
        n_tasks=args.n_tasks, synthetic_entities=args.synthetic, drills=args.drills, digit_runs=args.digit_runs,
        vocab_size=args.vocab,
        model=ModelSize(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                        num_key_value_heads=args.kv_heads, intermediate_size=args.mlp),
        sft=SFTConfig(steps=args.steps, batch_tokens=args.batch_tokens, lr=args.lr, warmup_steps=args.warmup,
                      env_loss_weight=args.env_weight, copy_weight=args.copy_weight, induction_steps=args.induction,
                      induction_every=args.induction_every),
    ) if not args.from_default else BuildConfig()
    if not args.from_default:  # the options above describe the recipes before issue 27: no paraphrases, syllable names
        args.paraphrase = 0.0 if args.paraphrase is None else args.paraphrase
        args.entity_style = args.entity_style or "syllables"
        args.wrong_entity = 0.0 if args.wrong_entity is None else args.wrong_entity
    overrides = {k: v for k, v in (("paraphrase", args.paraphrase), ("entity_style", args.entity_style)) if v is not None}
    mix = {k: v for k, v in (("wrong_entity", args.wrong_entity), ("sequential", args.sequential)) if v is not None}
    if mix:
        overrides["mix"] = replace(cfg.mix, **mix)
    if args.model_heads:
        h, kv = (int(x) for x in args.model_heads.split(","))
        overrides["model"] = replace(cfg.model, num_attention_heads=h, num_key_value_heads=kv)
    if args.sft_steps:
        overrides["sft"] = replace(overrides.get("sft", cfg.sft), steps=args.sft_steps)
    if args.seed is not None:
        overrides.update(data_seed=args.seed, model_seed=args.seed, sft=replace(overrides.get("sft", cfg.sft), seed=args.seed))
    cfg = replace(cfg, **overrides)
    args.steps = cfg.sft.steps
    t0, c0 = time.perf_counter(), time.process_time()
    tasks = toolworld.make_tasks("test", n=args.eval_n)
    rcfg = RolloutConfig(group_size=1, temperature=0.0, max_turns=4, max_new_tokens=128, max_total_tokens=768)
    eval_at = {int(s) for s in args.eval_at.split(",") if s}
    record = {"args": vars(args), "config": cfg.to_dict(), "evals": [], "losses": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    eval_cpu = [0.0]

    def on_step(step: int, loss: float, model, tok) -> None:
        record["losses"].append(loss)
        if step + 1 not in eval_at and step + 1 != args.steps:
            return
        c = time.process_time()
        model.eval()
        trajs = []
        with torch.no_grad():
            for i in range(0, len(tasks), 32):
                trajs += generate_rollouts(model, tok, tasks[i : i + 32], toolworld.make_env, rcfg).trajectories
        r = rollout_rates(trajs)
        tool = [t for t in trajs if t.task.gold]
        single = [t for t in trajs if t.task.kind == "single"]
        r["success_tool"] = rollout_rates(tool)["success"] if tool else float("nan")
        r["success_single"] = rollout_rates(single)["success"] if single else float("nan")
        r["step"] = step + 1
        r["eval_cpu_s"] = time.process_time() - c
        eval_cpu[0] += r["eval_cpu_s"]
        r["cpu_s_so_far"] = time.process_time() - c0 - eval_cpu[0]  # data preparation + training, evaluations excluded
        r["loss"] = sum(record["losses"][-20:]) / len(record["losses"][-20:])
        record["evals"].append(r)
        out.write_text(json.dumps(record, indent=1))
        if args.save:
            model.save_pretrained(Path(args.save + ".snapshots") / f"step{step + 1}")
            tok.save_pretrained(Path(args.save + ".snapshots") / f"step{step + 1}")
        print(f"step {step + 1}: loss {r['loss']:.3f} arg_match {r['arg_match']:.3f} success_tool {r['success_tool']:.3f} "
              f"single {r['success_single']:.3f} parse {r['parseable_call_rate']:.3f} summary {r['summary_reward']:.3f} "
              f"cpu {r['cpu_s_so_far']:.0f}s", flush=True)

    import tempfile

    dest = Path(args.save) if args.save else Path(tempfile.mkdtemp()) / "build"
    state = Path(str(dest) + ".build-state") if args.save else None  # resumable: run the same command again
    report = build_default(dest, cfg, progress=False, on_step=on_step, state_dir=state)
    info = json.loads((dest / "slca_build.json").read_text())
    record.update(n_params=report.n_params, induction_losses=info.get("induction_losses", []), report=report.__dict__,
                  wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, eval_cpu_s=eval_cpu[0])
    out.write_text(json.dumps(record, indent=1))


def sys_path_fix() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))


if __name__ == "__main__":
    main()
