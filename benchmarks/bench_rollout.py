"""(c) Rollout generation throughput: slca's rollout engine against transformers' ``generate``.

    .venv/bin/python benchmarks/bench_rollout.py

The same batch on both sides: the bench_step ``single`` workload, 8 prompts x 4
samples, exactly 128 new tokens each (stop tokens suppressed), temperature 1,
no top-k / top-p, KV cache. ``generate`` gets the prompts left-padded, as TRL
passes them. slca's engine also records each token's log-probability and parses
the turn; ``generate`` returns ids only. Per repeat the two run back to back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny model (tests)")
    a = p.parse_args(argv)
    size = C.TINY if a.tiny else C.FULL
    C.header("bench_rollout: slca generate_rollouts vs transformers generate", a)

    from slca.generation.rollout import RolloutConfig, generate_rollouts

    tok = C.build_tokenizer(size.vocab)
    model = C.build_model(tok, size).eval()
    ts = C.tasks(size.prompts, False)
    G, N = size.generations, size.completion_tokens
    cfg = RolloutConfig(group_size=G, max_turns=1, max_new_tokens=N, max_total_tokens=4096, temperature=1.0, top_p=1.0)
    prompts = [tok.apply_chat_template(t.messages, add_generation_prompt=True, tokenize=True, return_dict=False) for t in ts for _ in range(G)]
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    B = len(prompts)
    print(f"   batch: {B} sequences, prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {N} new tokens each")

    def slca() -> int:
        res = generate_rollouts(model, tok, ts, C.make_env, cfg)
        return res.gen_tokens

    @torch.no_grad()
    def hf() -> int:
        out = model.generate(**enc, max_new_tokens=N, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             pad_token_id=tok.pad_token_id)
        return int((out[:, enc["input_ids"].shape[1]:] != tok.pad_token_id).sum())

    print(f"{'thr':>3}  {'generate wall s':<22}{'slca wall s':<22}{'gen cpu':>9}{'slca cpu':>9}{'generate tok/s':>15}"
          f"{'slca tok/s':>11}{'slca/gen wall':>14}{'cpu':>10}")
    for th in C.parse_threads(a.threads):
        C.set_threads(th)
        t = {"hf": C.Clock(), "slca": C.Clock()}
        n: dict[str, int] = {}
        for fn in (hf, slca):
            fn()  # warm-up
        for _ in range(a.repeats):
            for name, fn in (("hf", hf), ("slca", slca)):
                with t[name]():
                    n[name] = fn()
        if n["hf"] != n["slca"]:
            raise RuntimeError(f"the two sides generated different token counts: {n}")
        th_hf, th_sl = n["hf"] / C.med(t["hf"].wall), n["slca"] / C.med(t["slca"].wall)
        c_hf, c_sl = C.med(t["hf"].cpu), C.med(t["slca"].cpu)
        print(f"{th:>3}  {C.spread(t['hf'].wall):<22}{C.spread(t['slca'].wall):<22}{c_hf:>9.2f}{c_sl:>9.2f}"
              f"{th_hf:>15.0f}{th_sl:>11.0f}{th_sl / th_hf:>12.2f}x{c_hf / c_sl:>10.2f}x", flush=True)
    print("wall: median [min-max] s; cpu: median process CPU s; tok/s = generated tokens / median wall s (prefill "
          "included); slca/generate > 1: slca faster (on wall, then on cpu).")


if __name__ == "__main__":
    main()
