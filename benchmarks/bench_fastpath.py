"""(g) The fast paths against the plain transformers forward, piece by piece, interleaved.

    .venv/bin/python benchmarks/bench_fastpath.py              # 1 thread, 5 repeats

On the bench_step workloads (same model, same batch), each piece runs with
``slca.generation.fastpath`` (fast) and with the transformers forward (plain), alternately
in one process, so load drift hits both alike:

* ``rollout multi``: ``generate_rollouts`` of the multi-turn workload (32 rollouts,
  2 tool turns + summary; ``RolloutConfig.fast_decode``);
* ``rollout single``: 32 x 128 sampled tokens;
* ``decode B=1`` / ``B=32``: CPU ms per decode step after a 200-token prefill;
* ``prompts multi`` / ``prompts multi G=8``: the multi-turn rollouts with the fast
  path on both sides, the group's prompt (303 tokens) held once per group and
  attended once for all its rows (fast) or copied into every row's cache
  (plain; ``slca.generation.fastpath.decode.MIN_SHARED_PROMPT`` set past the prompt);
* ``train multi``: forward + backward of ``response_logprobs`` and a token-mean
  surrogate on the multi-turn batch of the first rollout (``fast=``);
* ``train 32x512``: the same on bench_floor's batch (default model size, 32 rows
  of 256 prompt + 256 response tokens, all rows the same length);
* ``train varied``: default model size, 32 rows of 150-255 prompt and 100-299
  response tokens (seeded), as real rollouts vary. With rows of one length
  (the pieces above) the plain path has no padding either, so transformers
  drops the all-ones mask and both sides run mask-free attention; varying
  lengths are where the right-padded layout pays.

It also checks that both sides sampled the same tokens (rollouts) and prints
the largest log-probability difference (training pass).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny model (tests)")
    p.add_argument("--pieces", default="", help="comma-separated piece names to run (default: all)")
    a = p.parse_args(argv)
    C.header("bench_fastpath: slca.generation.fastpath vs the transformers forward (interleaved A/B)", a)
    C.set_threads(a.threads)

    from slca.generation.batching import collate, response_logprobs
    from slca.generation.fastpath import FastBatch
    from slca.core.losses import aggregate, clipped_surrogate
    from slca.generation.kvcache import CacheBatch
    from slca.generation.rollout import RolloutConfig, generate_rollouts

    size = C.TINY if a.tiny else C.FULL
    tok = C.build_tokenizer(size.vocab)
    script = C.script_turns(tok)
    multi_model = C.build_model(tok, size, script).eval()
    single_model = C.build_model(tok, size).eval()
    G = size.generations
    mt, st = C.tasks(size.prompts, True), C.tasks(size.prompts, False)
    mcfg = dict(group_size=G, max_turns=len(script), max_new_tokens=max(map(len, script)) + 8, max_total_tokens=4096)
    scfg = dict(group_size=G, max_turns=1, max_new_tokens=size.completion_tokens, max_total_tokens=4096)

    def rollout(model, tasks, kw, fast):
        return generate_rollouts(model, tok, tasks, C.make_env, RolloutConfig(**kw, fast_decode=fast)).trajectories

    trajs = rollout(multi_model, mt, mcfg, False)
    mbatch = collate(trajs, tok.pad_token_id)
    if a.tiny:
        fsize, fB, fP, fT = size, 2, 8, 8
    else:
        from slca.models import import_recipe

        d = import_recipe().ModelSize()  # the default model's size (recipes/warmstart)
        fsize = C.Size(hidden=d.hidden_size, layers=d.num_hidden_layers, heads=d.num_attention_heads,
                       kv_heads=d.num_key_value_heads, intermediate=d.intermediate_size, vocab=1536)
        fB, fP, fT = 32, 256, 256
    ftok = C.build_tokenizer(fsize.vocab) if fsize.vocab != size.vocab else tok
    fmodel = C.build_model(ftok, fsize)
    g = torch.Generator().manual_seed(0)
    from slca.generation.batching import RolloutBatch

    ids = torch.randint(0, len(ftok) - 20, (fB, fP + fT), generator=g)
    att = torch.ones(fB, fP + fT, dtype=torch.long)
    fbatch = RolloutBatch(ids, att, att.cumsum(1) - 1, fP, torch.ones(fB, fT, dtype=torch.long),
                          torch.ones(fB, fT, dtype=torch.long), torch.full((fB, fT), -7.0))

    from slca.generation.batching import collate as _collate
    from slca.types import Task, Trajectory

    vt = Task(id="varied", messages=[{"role": "user", "content": "x"}], tools=[])
    vtrajs = []
    for _ in range(fB):
        pl, rl = (int(torch.randint(150, 256, (1,), generator=g)), int(torch.randint(100, 300, (1,), generator=g))) if not a.tiny else (4, 6)
        seq = torch.randint(0, len(ftok) - 20, (pl + rl,), generator=g).tolist()
        vtrajs.append(Trajectory(task=vt, prompt_ids=seq[:pl], response_ids=seq[pl:], model_mask=[1] * rl, logprobs=[-7.0] * rl,
                                 turns=[], final_text="", stop_reason="eos", messages=[], group_id=0))
    vbatch = _collate(vtrajs, 0)

    def train_pass(model, batch, fast):
        model.train()
        for q in model.parameters():
            q.grad = None
        logp = response_logprobs(model, batch, 1.0, fast=fast)
        adv = torch.ones_like(logp)
        loss = aggregate(clipped_surrogate(logp, batch.old_logprobs, adv, clip_low=0.2, clip_high=0.28), batch.model_mask, "token_mean")
        loss.backward()
        model.eval()
        return logp.detach()

    def decode(B, fast, steps=32 if not a.tiny else 4):
        cls = FastBatch if fast else CacheBatch
        b = cls(single_model, B, 0, torch.device("cpu"))
        with torch.no_grad():
            b.feed_lists([list(range(1, 200 if not a.tiny else 10))] * B)
            x, v = torch.randint(1, 300, (B, 1)), torch.ones(B, 1, dtype=torch.bool)
            c = time.process_time()
            for _ in range(steps):
                b.feed(x, v)
            return (time.process_time() - c) / steps

    from slca.generation.fastpath import decode as fdecode

    def shared_prompts(share, group_size):
        keep, fdecode.MIN_SHARED_PROMPT = fdecode.MIN_SHARED_PROMPT, fdecode.MIN_SHARED_PROMPT if share else 10**9
        try:
            return rollout(multi_model, mt, {**mcfg, "group_size": group_size}, True)
        finally:
            fdecode.MIN_SHARED_PROMPT = keep

    pieces = {
        "rollout multi": lambda fast: rollout(multi_model, mt, mcfg, fast),
        "rollout single": lambda fast: rollout(single_model, st, scfg, fast),
        "prompts multi": lambda fast: shared_prompts(fast, G),
        f"prompts multi G={2 * G}": lambda fast: shared_prompts(fast, 2 * G),
        "decode B=1": lambda fast: decode(1, fast),
        f"decode B={size.prompts * G}": lambda fast: decode(size.prompts * G, fast),
        "train multi": lambda fast: train_pass(multi_model, mbatch, fast),
        f"train {fB}x{fP + fT}": lambda fast: train_pass(fmodel, fbatch, fast),
        "train varied": lambda fast: train_pass(fmodel, vbatch, fast),
    }
    if a.pieces:
        pieces = {k: v for k, v in pieces.items() if k in a.pieces.split(",")}
    print(f"{'piece':<16}{'plain cpu s':>12}{'fast cpu s':>11}{'plain/fast':>11}{'same tokens':>12}{'max |dlogp|':>12}{'load':>6}")
    for name, fn in pieces.items():
        clocks = {True: C.Clock(), False: C.Clock()}
        per_step: dict[bool, list[float]] = {True: [], False: []}
        out: dict[bool, object] = {}
        for fast in (False, True):
            fn(fast)  # warm-up
        for _ in range(a.repeats):
            for fast in (False, True):
                with clocks[fast]():
                    out[fast] = fn(fast)
                if name.startswith("decode"):
                    per_step[fast].append(out[fast])
        same, dlp = "", ""
        if name.startswith(("rollout", "prompts")):
            same = "yes" if [t.response_ids for t in out[True]] == [t.response_ids for t in out[False]] else "NO"
            dlp = f"{max(max((abs(x - y) for x, y in zip(f.logprobs, q.logprobs)), default=0.0) for f, q in zip(out[True], out[False])):.1e}"
        elif name.startswith("train"):
            valid = {"train multi": mbatch, "train varied": vbatch}.get(name, fbatch).valid_mask.bool()
            dlp = f"{float((out[True] - out[False])[valid].abs().max()):.1e}"  # padding: the plain path's values are arbitrary
        if name.startswith("decode"):
            pl, fa = C.med(per_step[False]) * 1e3, C.med(per_step[True]) * 1e3
            print(f"{name:<16}{pl:>9.2f} ms{fa:>8.2f} ms{pl / fa:>10.2f}x{same:>12}{dlp:>12}{C.load():>6.1f}", flush=True)
        else:
            pl, fa = C.med(clocks[False].cpu), C.med(clocks[True].cpu)
            print(f"{name:<16}{pl:>12.3f}{fa:>11.3f}{pl / fa:>10.2f}x{same:>12}{dlp:>12}{C.load():>6.1f}", flush=True)
    print("cpu: median process CPU seconds per call (decode: ms per step) over the repeats, the two sides alternating. "
          "plain/fast > 1: the fast path is faster. max |dlogp|: largest log-probability difference between the sides.")


if __name__ == "__main__":
    main()
