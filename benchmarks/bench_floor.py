"""(d) The floor: a training pass's FLOPs against this machine's measured fp32 matmul peak,
and the per-token decode latency.

    .venv/bin/python benchmarks/bench_floor.py

1. Peak: the best ``torch.matmul`` rate over square fp32 sizes (512-2048) and
   over the model's own largest shape, per thread count.
2. Training pass at the embedded default model's size
   (:class:`recipes.warmstart.config.ModelSize`, vocabulary 1,536): forward + backward
   of ``slca.training.trainer.response_logprobs`` and a token-mean surrogate on a batch of
   32 rows x (256 prompt + 256 response) tokens.
   FLOPs: the work the pass must do, counted as it runs: ``6 * N_dec * B * S``
   for the decoder's linear layers over every token, ``6 * N_head * B * T``
   for the LM head over the response positions only (the fast pass computes
   no logits elsewhere), and causal attention ``3 * 2 * layers * S^2 * hidden``
   per row (QK^T and AV over the lower triangle, forward + 2x backward; SDPA's
   ``is_causal`` skips the upper half). The rows are distinct (no prompt shared),
   so the shared-prompt pass does not apply and the count is what runs.
   (Round 1 counted the LM head on every position and the full S x S, i.e.
   1.25x these FLOPs for the same pass.)
3. Decode: seconds per generated token of slca's rollout engine at batch 1 and
   32 (128 tokens), against the matmul floor ``2 * N * batch / peak``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402


def matmul_peak(sizes: list[tuple[int, int, int]], repeats: int) -> tuple[float, tuple[int, int, int]]:
    """Best fp32 FLOP/s of ``(m, k) @ (k, n)`` over ``sizes``."""
    best, arg = 0.0, sizes[0]
    for m, k, n in sizes:
        x, y = torch.randn(m, k), torch.randn(k, n)
        torch.matmul(x, y)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(x, y)
            dt = time.perf_counter() - t0
            if 2 * m * k * n / dt > best:
                best, arg = 2 * m * k * n / dt, (m, k, n)
    return best, arg


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters used in a matmul per token: every Linear plus the (tied) LM head."""
    n = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    return n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--response", type=int, default=256)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on a tiny model (tests)")
    a = p.parse_args(argv)
    C.header("bench_floor: training-pass FLOPs vs measured matmul peak; decode latency", a)

    from slca.core.losses import aggregate, clipped_surrogate
    from slca.models import import_recipe
    from slca.generation.rollout import RolloutConfig, generate_rollouts
    from slca.training.trainer import RolloutBatch, response_logprobs

    ModelSize = import_recipe().ModelSize  # the default model's size (recipes/warmstart)

    if a.tiny:
        ms, vocab, a.rows, a.prompt, a.response = C.TINY, C.TINY.vocab, 2, 8, 8
        size = ms
        squares = [(64, 64, 64)]
    else:
        d = ModelSize()
        size = C.Size(hidden=d.hidden_size, layers=d.num_hidden_layers, heads=d.num_attention_heads,
                      kv_heads=d.num_key_value_heads, intermediate=d.intermediate_size, vocab=1536)
        vocab = 1536
        squares = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048)]
    tok = C.build_tokenizer(vocab)
    model = C.build_model(tok, size)
    N = matmul_params(model)
    N_head = model.lm_head.weight.numel()
    B, P, T = a.rows, a.prompt, a.response
    S = P + T
    L, H = size.layers, size.hidden
    attn = 3 * 2 * L * S * S * H * B
    flops = 6 * (N - N_head) * B * S + 6 * N_head * B * T + attn
    print(f"   model: Qwen2 hidden {H}, {L} layers, {size.heads}/{size.kv_heads} heads, SwiGLU {size.intermediate}, "
          f"vocab {len(tok)}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {N / 1e6:.2f}M in matmuls")
    print(f"   training pass: {B} rows x {S} tokens = {flops / 1e9:.1f} GFLOP (attention {attn / flops * 100:.0f}%, causal; LM head on the {T} response positions)")
    model_shapes = [(B * S, H, size.intermediate), (B * S, H, len(tok))]

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok) - 20, (B, S), generator=g)
    att = torch.ones(B, S, dtype=torch.long)
    batch = RolloutBatch(ids, att, (att.cumsum(1) - 1), P, torch.ones(B, T, dtype=torch.long),
                         torch.ones(B, T, dtype=torch.long), torch.full((B, T), -7.0))
    adv = torch.randn(B, T, generator=g)
    opt_params = list(model.parameters())

    def train_pass() -> None:
        for q in opt_params:
            q.grad = None
        logp = response_logprobs(model, batch)
        loss = aggregate(clipped_surrogate(logp, batch.old_logprobs, adv, clip_low=0.2, clip_high=0.28), batch.model_mask, "token_mean")
        loss.backward()

    ts = C.tasks(32 if not a.tiny else 2, False)
    dec_n = 128 if not a.tiny else 4

    def decode(n_rows: int) -> float:
        cfg = RolloutConfig(group_size=1, max_turns=1, max_new_tokens=dec_n, max_total_tokens=4096)
        res = generate_rollouts(model, tok, ts[:n_rows], C.make_env, cfg)
        return res.gen_seconds / (res.gen_tokens / n_rows)  # seconds per decode step

    print(f"{'thr':>3}  {'matmul peak':>12} {'(at m,k,n)':<20}{'pass wall med [min]':>22}{'pass cpu':>10}"
          f"{'best-wall GF/s':>15}{'% peak':>8}{'% peak (cpu)':>13}  {'decode ms/token B=1':>20}{f'B={len(ts)}':>8}{'floor B=1/B=' + str(len(ts)):>17}")
    for th in C.parse_threads(a.threads):
        C.set_threads(th)
        peak, at = matmul_peak(squares + model_shapes, a.repeats)
        model.train()
        clock = C.time_call(train_pass, a.repeats)
        model.eval()
        d1 = C.med([decode(1) for _ in range(max(1, a.repeats // 2))])
        dB = C.med([decode(len(ts)) for _ in range(max(1, a.repeats // 2))])
        best = flops / min(clock.wall)
        by_cpu = flops * th / C.med(clock.cpu)
        fl1, flB = 2 * N / peak, 2 * N * len(ts) / peak
        print(f"{th:>3}  {peak / 1e9:>8.1f} GF/s {str(at):<20}{C.med(clock.wall):>13.2f} [{min(clock.wall):.2f}] s{C.med(clock.cpu):>8.2f} s"
              f"{best / 1e9:>15.1f}{best / peak * 100:>7.1f}%{by_cpu / peak * 100:>12.1f}%"
              f"  {d1 * 1e3:>20.2f}{dB * 1e3:>8.2f}{fl1 * 1e3:>9.3f}/{flB * 1e3:.3f} ms", flush=True)
    print("peak: best single matmul over sizes and repeats (wall). % peak: FLOPs / fastest pass; % peak (cpu): "
          "FLOPs x threads / median process CPU seconds (robust to other load when threads are busy). "
          "floor = 2 * N * batch / peak: the matmul time of one decode step at the measured peak.")


if __name__ == "__main__":
    main()
