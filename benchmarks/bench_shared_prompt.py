"""(h) Does the shared-prompt decode pay on the workload where it turns on? Interleaved A/B.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_shared_prompt.py --model smollm2   # slca eval --samples 4 on toolworld
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_shared_prompt.py --model default    # the embedded model (prompts < 256)

``slca.generation.fastpath.decode`` holds a group's prompt once and attends it once for all
the group's rows when the prompt has ``MIN_SHARED_PROMPT`` (256) columns or more;
below, every row keeps a copy. On the default model's workloads the prompts stay
under 256 tokens, so it never turns on. It does turn on for SmolLM2-135M-Instruct
with ``slca eval --suite toolworld --samples K`` (toolworld prompts render to about
300-570 SmolLM2 tokens). This script runs exactly that work, the rollouts of
``slca eval``'s in-domain runner (K samples per task, temperature 0.7, seeded),
with the shared prompt (``shared``) and with row copies (``copies``:
``MIN_SHARED_PROMPT`` set past every prompt), alternately in one process so load
drift hits both alike, and prints CPU seconds per side, their ratio and how many
rollouts sampled the same tokens on both sides (sampling is seeded; the two
attention orders differ only in float rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="a named model (smollm2, default) or a model folder")
    p.add_argument("--tasks", type=int, default=8, help="toolworld tasks (the first of --split)")
    p.add_argument("--samples", type=int, default=4, help="K rollouts per task (slca eval --samples)")
    p.add_argument("--split", default="train_heldout")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per side (median reported)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny random model (tests)")
    a = p.parse_args(argv)
    C.header("bench_shared_prompt: the group's prompt held once (shared) vs copied into every row (copies)", a)
    C.set_threads(a.threads)

    from slca.env import toolworld
    from slca.env.loaders import prompt_lengths
    from slca.generation.fastpath import decode as fdecode
    from slca.generation.rollout import RolloutConfig, generate_rollouts

    if a.tiny:
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from _tok import save_tiny_policy
        from transformers import AutoModelForCausalLM, AutoTokenizer

        d = save_tiny_policy(Path(tempfile.mkdtemp()) / "m", hidden=32, heads=2, kv_heads=1, intermediate=64)
        model, tok = AutoModelForCausalLM.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d)
        a.tasks, a.samples, a.max_new_tokens, a.repeats = 2, 2, 6, 1
    else:
        from slca.models.named import NAMED_MODELS, load_named

        if a.model in NAMED_MODELS:
            model, tok = load_named(a.model)
        else:
            from slca.models.loading import load_policy

            model, tok = load_policy(a.model)
    tasks = toolworld.make_tasks(a.split, n=max(a.tasks, 1), seed=0)[: a.tasks]
    lengths = prompt_lengths(tasks, tok)
    threshold = 1 if a.tiny else fdecode.MIN_SHARED_PROMPT  # the tiny run's prompts are short: share them all
    print(f"   prompts: {min(lengths)}-{max(lengths)} tokens, {sum(n >= threshold for n in lengths)} of {len(lengths)} "
          f"at or past MIN_SHARED_PROMPT={threshold}")
    cfg = RolloutConfig(group_size=a.samples, max_turns=4, max_new_tokens=a.max_new_tokens, temperature=0.7, seed=0, max_total_tokens=2048)

    def run(share: bool):
        keep, fdecode.MIN_SHARED_PROMPT = fdecode.MIN_SHARED_PROMPT, threshold if share else 10**9
        try:
            w, c = time.perf_counter(), time.process_time()
            res = generate_rollouts(model, tok, tasks, toolworld.make_env, cfg)
            return time.process_time() - c, time.perf_counter() - w, res
        finally:
            fdecode.MIN_SHARED_PROMPT = keep

    run(True)  # warm-up (allocations, first-call costs)
    cpu: dict[str, list[float]] = {"shared": [], "copies": []}
    wall: dict[str, list[float]] = {"shared": [], "copies": []}
    last: dict[str, object] = {}
    for r in range(a.repeats):
        for side in (("shared", "copies") if r % 2 == 0 else ("copies", "shared")):
            c, w, res = run(side == "shared")
            cpu[side].append(c)
            wall[side].append(w)
            last[side] = res
    same = sum(x.response_ids == y.response_ids for x, y in zip(last["shared"].trajectories, last["copies"].trajectories))
    n = len(last["shared"].trajectories)
    toks = {s: last[s].gen_tokens for s in cpu}
    print(f"{'side':<8} {'cpu_s':>8} {'wall_s':>8} {'gen_tokens':>10} {'tok/cpu_s':>10}")
    for s in cpu:
        mc = statistics.median(cpu[s])
        print(f"{s:<8} {mc:8.2f} {statistics.median(wall[s]):8.2f} {toks[s]:10d} {toks[s] / mc:10.1f}")
    ratio = statistics.median(x / y for x, y in zip(cpu["shared"], cpu["copies"]))
    print(f"ratio shared/copies (CPU s, pair by pair, median): {ratio:.3f}")
    print(f"same tokens: {same} of {n} rollouts")


if __name__ == "__main__":
    main()
