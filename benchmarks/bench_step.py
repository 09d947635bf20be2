"""(a) Training-step throughput: slca's Trainer against TRL's GRPOTrainer on identical work.

    .venv/bin/python benchmarks/bench_step.py                 # both workloads, 1 and 2 threads
    .venv/bin/python benchmarks/bench_step.py --workload multi --threads 2 --repeats 7
    .venv/bin/python benchmarks/bench_step.py --model smollm2 --threads 1 --no-plain   # the same work at 135M parameters
    .venv/bin/python benchmarks/bench_step.py --model smollm2 --lora-r 8 --workload multi --threads 1 --no-plain  # study 42's LoRA

Per repeat, one TRL step and one slca step run back to back (the slca step runs
from TRL's ``on_step_end`` callback, so load drift on a shared machine hits both
alike). A step is everything from sampling to the optimizer update: generation,
rewards, advantages, one forward/backward over the batch, AdamW. TRL's step is
timed from ``on_step_begin`` to ``on_step_end`` (its logging afterwards is left
out); slca's is ``Trainer.train_step()`` (its metrics included).

Same work on both sides: the model, prompts, group size, completion lengths,
fp32 (TRL's CPU default ``bf16=True`` is turned off), beta 0, one optimisation
pass over the whole batch (slca ``minibatches=1``; TRL one step per generation
batch), loss dapo / token_mean, temperature 1, no top-k / top-p. slca's per-segment
gradient diagnostic (an extra backward) is off (``diag_every=0``).

TRL keeps its ``GRPOConfig`` default ``gradient_checkpointing=True`` (less
memory, a recomputed forward in the backward); ``--trl-checkpointing off``
runs TRL without it, so that both sides do the same arithmetic.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def with_lora(model, lora: tuple[int, list[str]] | None):
    """``model`` with fresh LoRA adapters (rank, target modules; alpha = 2 x rank, study 42's) through slca's own
    ``apply_lora``, the same on both sides; None: the model itself (full fine-tuning)."""
    if lora is None:
        return model
    from slca.models.loading import apply_lora

    r, targets = lora
    return apply_lora(model, r, 2 * r, 0.0, targets)


def slca_trainer(tok, size: C.Size, multi: bool, run_dir: str, fast: bool = True, device: str = "cpu", dtype: str = "fp32",
                 script: list[list[int]] | None = None, minibatches: int = 1, build=C.build_model, micro_batch_size: int = 0,
                 lora: tuple[int, list[str]] | None = None):
    from slca.training.config import TrainConfig
    from slca.training.trainer import Trainer

    script = script or (C.script_turns(tok) if multi else None)
    model = with_lora(build(tok, size, script).to(device=device, dtype=DTYPES[dtype]), lora)
    cfg = TrainConfig(
        run_dir=run_dir, device=device, seed=0, tasks_per_step=size.prompts, group_size=size.generations,
        max_turns=len(script) if multi else 1, max_total_tokens=4096,
        max_new_tokens=max(len(t) for t in script) + 8 if multi else size.completion_tokens,
        temperature=1.0, top_p=1.0, estimator="slca", kl_coef=0.0, loss_agg="token_mean",
        ppo_epochs=1, minibatches=minibatches, micro_batch_size=micro_batch_size, lr=1e-5, warmup_steps=0, diag_every=0, eval_every=0,
        sample_html_every=0, save_every=0, fast_paths=fast,
    )
    ts = C.tasks(size.prompts, multi)
    return Trainer(cfg, model=model, tokenizer=tok, train_tasks=ts, make_env=C.make_env)


def trl_trainer(tok, size: C.Size, multi: bool, out_dir: str, steps: int, callbacks, device: str = "cpu", dtype: str = "fp32",
                script: list[list[int]] | None = None, checkpointing: bool | None = None, build=C.build_model,
                lora: tuple[int, list[str]] | None = None):
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    script = script or (C.script_turns(tok) if multi else None)
    # the weights themselves in `dtype` on both sides (no autocast: TRL's bf16 flag stays off)
    model = with_lora(build(tok, size, script).to(device=device, dtype=DTYPES[dtype]), lora)
    rows = [{"prompt": t.messages} for t in C.tasks(size.prompts, multi)]

    def execution_reward(completions, **_):
        return [float(sum(len(m.get("tool_calls") or []) for m in c if m["role"] == "assistant")) for c in completions]

    def summary_reward(completions, **_):
        return [float("sunny" in (c[-1].get("content") or "")) for c in completions]

    warnings.filterwarnings("ignore", category=FutureWarning)
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=size.prompts * size.generations, num_generations=size.generations,
        max_completion_length=4096 if multi else size.completion_tokens, max_steps=steps, learning_rate=1e-5,
        beta=0.0, loss_type="dapo", num_iterations=1, gradient_accumulation_steps=1, temperature=1.0, top_p=1.0,
        top_k=0, bf16=False, logging_steps=1, report_to="none", use_cpu=device == "cpu", save_strategy="no", seed=0,
        dataloader_num_workers=0, disable_tqdm=True, max_tool_calling_iterations=len(script) if multi else None,
        **({} if checkpointing is None else {"gradient_checkpointing": checkpointing}),
    )
    tr = GRPOTrainer(
        model=model, processing_class=tok, reward_funcs=[execution_reward, summary_reward], args=args,
        train_dataset=Dataset.from_list(rows * max(steps, 1)), tools=[C.get_weather] if multi else None,
        callbacks=callbacks,
    )
    tr.remove_callback(PrinterCallback)  # its per-step log lines would bury the table
    return tr


def run_pair(tok, size: C.Size, multi: bool, threads: int, repeats: int, warmup: int, plain: bool = True,
             device: str = "cpu", dtype: str = "fp32", trl_checkpointing: bool | None = None, build=C.build_model,
             micro_batch_size: int = 0, lora: tuple[int, list[str]] | None = None) -> dict:
    """Interleaved TRL / slca (/ slca with ``fast_paths=False``) steps at ``threads`` threads: a :class:`_common.Clock` per side.
    ``build(tok, size, script)`` makes each side's policy (:func:`_common.build_model` or :func:`_common.build_smollm2`)."""
    from transformers import TrainerCallback

    C.set_threads(threads)
    with tempfile.TemporaryDirectory() as d:
        dev = {"device": device, "dtype": dtype, "build": build, "lora": lora}
        sl = slca_trainer(tok, size, multi, str(Path(d) / "slca"), micro_batch_size=micro_batch_size, **dev)
        sp = slca_trainer(tok, size, multi, str(Path(d) / "plain"), fast=False, micro_batch_size=micro_batch_size, **dev) if plain else None
        res = {"trl": C.Clock(), "slca": C.Clock(), "plain": C.Clock(), "slca_tokens": 0.0, "plain_tokens": float("nan")}

        class Pair(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                C.sync()
                self.w, self.c = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kw):
                C.sync()
                w, c = time.perf_counter() - self.w, time.process_time() - self.c
                timed = state.global_step > warmup
                if timed:
                    res["trl"].wall.append(w)
                    res["trl"].cpu.append(c)
                clock = res["slca"] if timed else C.Clock()
                with clock():
                    m = sl.train_step()
                res["slca_tokens"] = m["rollout/response_tokens"] * m["rollout/policy_token_frac"]
                if sp is not None:
                    with (res["plain"] if timed else C.Clock())():
                        m = sp.train_step()
                    res["plain_tokens"] = m["rollout/response_tokens"] * m["rollout/policy_token_frac"]

        tr = trl_trainer(tok, size, multi, str(Path(d) / "trl"), warmup + repeats, [Pair()], **dev, checkpointing=trl_checkpointing)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr.train()
        hist = [h for h in tr.state.log_history if "completions/mean_length" in h]
        res["trl_tokens"] = hist[-1]["completions/mean_length"] if hist else float("nan")
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=("single", "multi", "both"), default="both")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts, each run separately")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per side (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per side first")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny model (tests)")
    p.add_argument("--size", choices=("full", "gpu"), default="full", help="gpu: hidden 1024, 12 layers (benchmarks/gpu.sh)")
    p.add_argument("--device", default="cpu", help="torch device of both sides ('cuda' in benchmarks/gpu.sh)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="dtype of the weights on both sides")
    p.add_argument("--no-plain", action="store_true", help="skip the slca fast_paths=False side (a third of the run time)")
    p.add_argument("--trl-checkpointing", choices=("default", "on", "off"), default="default",
                   help="TRL's gradient_checkpointing: its GRPOConfig default (on), or forced on / off (slca never checkpoints)")
    p.add_argument("--micro-batch-size", type=int, default=0,
                   help="slca's TrainConfig.micro_batch_size (rows per forward and backward, gradients accumulated; 0: all 32 at once)")
    p.add_argument("--model", choices=("random", "smollm2"), default="random",
                   help="smollm2: the same workloads on SmolLM2-135M-Instruct (pretrained, 134.5M parameters, its tokenizer and "
                        "slca's tool-calling template; the smollm2 extra) instead of the random Qwen2")
    p.add_argument("--lora-r", type=int, default=0,
                   help="fresh LoRA adapters of this rank on both sides (alpha 2 x rank; peft), as study 42 trains; 0: full fine-tuning")
    p.add_argument("--lora-targets", default="q_proj,v_proj", help="--lora-r: the modules that get adapters (study 42's)")
    a = p.parse_args(argv)
    lora = (a.lora_r, a.lora_targets.split(",")) if a.lora_r > 0 else None
    size = C.TINY if a.tiny else (C.GPU if a.size == "gpu" else C.FULL)
    C.header("bench_step: training-step throughput, slca Trainer vs TRL GRPOTrainer", a)
    build = C.build_smollm2 if a.model == "smollm2" else C.build_model
    tok = C.smollm2_tokenizer() if a.model == "smollm2" else C.build_tokenizer(size.vocab)
    workloads = ["single", "multi"] if a.workload == "both" else [a.workload]
    B = size.prompts * size.generations
    arch = ("SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 9/3 heads)" if a.model == "smollm2"
            else f"random Qwen2 hidden {size.hidden}, {size.layers} layers, {size.heads}/{size.kv_heads} heads")
    tuned = f"LoRA r {a.lora_r} on {a.lora_targets}" if lora else "full fine-tuning"
    print(f"   model: {arch}, vocab {len(tok)}; batch {size.prompts} prompts x {size.generations} generations; {a.device}, {a.dtype}; {tuned}")
    print(f"{'workload':<9}{'thr':>4}  {'TRL wall s/step':<22}{'slca wall s/step':<22}{'TRL cpu s':>10}{'slca cpu s':>11}"
          f"{'plain cpu s':>12}{'slca/TRL wall':>14}{'slca/TRL cpu':>13}{'fast/plain cpu':>15}{'load':>6}{'policy tok TRL/slca/plain':>27}")
    for w in workloads:
        for th in C.parse_threads(a.threads):
            r = run_pair(tok, size, w == "multi", th, a.repeats, a.warmup, plain=not a.no_plain, device=a.device, dtype=a.dtype,
                         trl_checkpointing={"default": None, "on": True, "off": False}[a.trl_checkpointing], build=build,
                         micro_batch_size=a.micro_batch_size, lora=lora)
            t, s, q = r["trl"], r["slca"], r["plain"]
            print(f"{w:<9}{th:>4}  {C.spread(t.wall):<22}{C.spread(s.wall):<22}{C.med(t.cpu):>10.2f}{C.med(s.cpu):>11.2f}"
                  f"{C.med(q.cpu):>12.2f}{C.med(t.wall) / C.med(s.wall):>13.2f}x{C.med(t.cpu) / C.med(s.cpu):>12.2f}x"
                  f"{C.med(q.cpu) / C.med(s.cpu):>14.2f}x{C.load():>6.1f}"
                  f"{r['trl_tokens']:>13.0f}/{r['slca_tokens']:.0f}/{r['plain_tokens']:<8.0f}", flush=True)
    print("wall: median [min-max] seconds per step; cpu: median process CPU seconds per step (less sensitive to other "
          "load). slca = default settings (fast paths on); plain = slca with fast_paths=False (the transformers forward). "
          "slca/TRL = TRL time / slca time (>1: slca faster). fast/plain = plain cpu / slca cpu. load = 1-minute load "
          "average at the end of the row. policy tok = mean model-written tokens per rollout (tool results excluded).")

if __name__ == "__main__":
    main()
