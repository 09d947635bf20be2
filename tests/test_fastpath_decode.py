"""slca.generation.fastpath.decode against the plain transformers forward: same logits, tokens and log-probabilities.

Real tiny Qwen2 and Llama models (random weights, built from their configs).
:class:`FastBatch` is compared feed by feed with the engine's transformers-backed
batch (:class:`slca.generation.kvcache.CacheBatch`: prefill, group expansion,
decode steps with holes, environment chunks, dropping, parking and merging rows),
shared prompts with row copies, and whole multi-turn rollouts with the plain
forward. Tolerances: 1e-4 on logits, 1e-5 on log-probabilities (fp32; the
observed differences are ~1e-7). The training pass's fast path:
tests/test_fastpath_logprobs.py.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("trl")  # the chat templates of test_rollout's tokenizer come from TRL

from _tok import random_llama as llama, random_qwen2 as qwen2  # noqa: E402
from test_rollout import AddEnv, make_task, scripted, tok  # noqa: E402,F401  (module fixtures)

import slca.generation.fastpath.decode as decode  # noqa: E402
from slca.generation.fastpath import FastBatch, make_batch, unsupported_reason  # noqa: E402
from slca.generation.kvcache import CacheBatch  # noqa: E402
from slca.generation.rollout import RolloutConfig, generate_rollouts  # noqa: E402


def close(a, b, ok):
    """max |a - b| over the rows where ok (the other rows' logits are to be ignored)."""
    return float(((a - b).abs().amax(dim=1) * ok).max())


@pytest.mark.parametrize("share", [True, False], ids=["shared_prompts", "row_copies"])
@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@torch.no_grad()
def test_fast_batch_matches_the_transformers_batch_feed_by_feed(build, share, monkeypatch):
    monkeypatch.setattr(decode, "MIN_SHARED_PROMPT", 1)  # these prompts are short
    model = build()
    assert unsupported_reason(model) is None
    cpu = torch.device("cpu")
    ref, fast = CacheBatch(model, 3, 0, cpu), FastBatch(model, 3, 0, cpu, capacity=8, share_prompts=share)  # capacity 8: it must grow
    g = torch.Generator().manual_seed(0)

    def both(fn):
        return fn(ref), fn(fast)

    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    a, b = both(lambda x: x.feed_lists(prompts))
    assert close(a, b, torch.ones(3)) < 1e-4
    both(lambda x: x.expand(2))  # 6 rows
    assert (fast.P, fast.group is not None) == ((4, True) if share else (0, False))  # the prompts are held once per group
    assert torch.equal(ref.attn, fast.attn)
    for step in range(12):  # decode with holes: some rows skip some steps
        ids = torch.randint(1, 300, (6, 1), generator=g)
        valid = torch.rand(6, 1, generator=g) > 0.3
        a, b = both(lambda x: x.feed(ids, valid))
        assert close(a, b, valid[:, 0].float()) < 1e-4, step
    chunk = [[1, 2, 3], [4], None, [5, 6], [7, 8, 9, 10], [3]]  # environment tokens, one row idle
    a, b = both(lambda x: x.feed_lists(chunk))
    assert close(a, b, torch.tensor([bool(s) for s in chunk]).float()) < 1e-4
    both(lambda x: x.keep([0, 2, 3, 5]))  # finished rollouts leave
    keep = torch.tensor([True, False, True, False])
    pa, pb = both(lambda x: x.park(keep))  # rows 1 and 3 wait out the turn
    if share:  # the rows left are in groups 0 and 1: group 2's prompt is left out of attention, and kept
        assert fast._layout().kv.shape[2] == 2 and fast._prompts.kv.shape[2] == 3
    for step in range(3):
        ids = torch.randint(1, 300, (2, 1), generator=g)
        a, b = ref.feed(ids, torch.ones(2, 1, dtype=torch.bool)), fast.feed(ids, torch.ones(2, 1, dtype=torch.bool))
        assert close(a, b, torch.ones(2)) < 1e-4
    here, there = torch.tensor([0, 2]), torch.tensor([1, 3])
    assert ref.unpark(pa, here, there).tolist() == fast.unpark(pb, here, there).tolist() == [0, 1, 2, 3]
    assert torch.equal(ref.attn, fast.attn) and torch.equal(ref.next_pos, fast.next_pos)
    a, b = both(lambda x: x.feed_lists([[1, 2], [3], [4, 5, 6], [7]]))
    assert close(a, b, torch.ones(4)) < 1e-4


@torch.no_grad()
def test_shared_prompts_with_uneven_groups_match_row_copies(monkeypatch):
    """Groups of 4, 1 and 3 rows (finished rows gone, the last group partial), rows in and out of group order."""
    monkeypatch.setattr(decode, "MIN_SHARED_PROMPT", 1)
    model = qwen2()
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(3)
    share, copies = FastBatch(model, 3, 0, cpu, share_prompts=True), FastBatch(model, 3, 0, cpu, share_prompts=False)
    for b in (share, copies):
        b.feed_lists([[5, 6, 7, 8, 9], [9, 10], [11, 12, 13]])
        b.expand(4)  # 12 rows
        b.keep([0, 1, 2, 3, 6, 9, 10, 11])  # 4 + 1 + 3 rows
    assert share._layout().gather is not None and share._layout().slots == 4
    for step in range(4):
        ids = torch.randint(1, 300, (8, 1), generator=g)
        assert close(share.feed(ids, torch.ones(8, 1, dtype=torch.bool)), copies.feed(ids, torch.ones(8, 1, dtype=torch.bool)), torch.ones(8)) < 1e-5
    for b in (share, copies):
        b.keep([0, 1, 2, 3, 5, 6])  # 4 + 2 rows in group order: the slots of a full grid, less the last group's two
    assert share._layout().slots == 4
    ids = torch.randint(1, 300, (6, 3), generator=g)
    assert close(share.feed(ids, torch.ones(6, 3, dtype=torch.bool)), copies.feed(ids, torch.ones(6, 3, dtype=torch.bool)), torch.ones(6)) < 1e-5
    for b in (share, copies):
        b.keep([0, 1, 2, 3])  # one full group: the grid is the batch itself
    assert share._layout().gather is None
    ids = torch.randint(1, 300, (4, 1), generator=g)
    assert close(share.feed(ids, torch.ones(4, 1, dtype=torch.bool)), copies.feed(ids, torch.ones(4, 1, dtype=torch.bool)), torch.ones(4)) < 1e-5
    assert torch.equal(share.attn, copies.attn)


@torch.no_grad()
def test_shared_prompts_in_bf16_match_row_copies(monkeypatch):
    monkeypatch.setattr(decode, "MIN_SHARED_PROMPT", 1)
    model = qwen2().to(torch.bfloat16)
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(4)
    share, copies = FastBatch(model, 2, 0, cpu, share_prompts=True), FastBatch(model, 2, 0, cpu, share_prompts=False)
    for b in (share, copies):
        b.feed_lists([[5, 6, 7, 8, 9, 10], [11, 12, 13]])
        b.expand(3)
    assert share.P == 6 and share.kv.dtype == torch.bfloat16
    for _ in range(5):
        ids = torch.randint(1, 300, (6, 1), generator=g)
        a = share.feed(ids, torch.ones(6, 1, dtype=torch.bool))
        b = copies.feed(ids, torch.ones(6, 1, dtype=torch.bool))
        assert a.dtype == torch.float32 and close(a, b, torch.ones(6)) < 0.02  # bf16 rounding (observed 0.004 on logits of ~0.55)


def test_short_prompts_are_copied_per_row():
    b = FastBatch(qwen2(), 2, 0, torch.device("cpu"))
    b.feed_lists([[5] * (decode.MIN_SHARED_PROMPT - 1), [6, 7]])
    b.expand(3)
    assert b.P == 0 and b.group is None and b.kv.shape[2] == 6


def test_unsupported_models_fall_back_to_the_transformers_forward(tok):
    model = qwen2(vocab=len(tok))
    assert make_batch(model, 2, 0, torch.device("cpu")) is not None
    h = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert "hook" in unsupported_reason(model) and make_batch(model, 2, 0, torch.device("cpu")) is None
    h.remove()

    class Wrapped(type(model)):  # overrides forward: its logits might differ, so it is not bypassed
        def forward(self, *a, **k):
            out = super().forward(*a, **k)
            out.logits[..., 0] = 50.0  # token 0 always wins
            return out

    w = Wrapped(model.config).eval()
    assert "overrides forward" in unsupported_reason(w)
    cfg = RolloutConfig(group_size=2, max_turns=1, max_new_tokens=4, temperature=0.0)
    res = generate_rollouts(w, tok, [make_task("single")], lambda t: AddEnv(), cfg)
    assert all(tr.response_ids == [0] * 4 for tr in res.trajectories)  # the override was honoured


@pytest.mark.parametrize("min_shared", [1, None], ids=["shared_prompts", "row_copies"])
def test_multi_turn_rollouts_same_tokens_and_logprobs(tok, scripted, min_shared, monkeypatch):
    """Sampled multi-turn rollouts (parking, holes, finished rows leaving) with and without the fast path."""
    if min_shared is not None:  # the test prompts are short: share them anyway
        monkeypatch.setattr(decode, "MIN_SHARED_PROMPT", min_shared)
    assert unsupported_reason(scripted) is None
    tasks = [make_task(n) for n in ("single", "parallel", "broken", "loop")]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
        kw = dict(group_size=4, max_turns=3, max_new_tokens=40, max_total_tokens=600, temperature=temperature, top_p=top_p, seed=5)
        fast = generate_rollouts(scripted, tok, tasks, lambda t: AddEnv(), RolloutConfig(**kw)).trajectories
        plain = generate_rollouts(scripted, tok, tasks, lambda t: AddEnv(), RolloutConfig(**kw, fast_decode=False)).trajectories
        assert sum(len(t.turns) > 1 for t in fast) >= 4  # several multi-turn rows
        for f, p in zip(fast, plain):
            assert f.response_ids == p.response_ids and f.model_mask == p.model_mask and f.stop_reason == p.stop_reason
            torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(p.logprobs), atol=1e-5, rtol=0)



def test_describe_and_the_decoder_refuse_what_unsupported_reason_names():
    """Every model the fast path cannot run exactly is named with its reason: ``describe`` reports it,
    ``FastDecoder`` refuses it (ValueError), ``make_batch`` gives None; a stock model passes all three."""
    model = qwen2()
    assert decode.describe(model) == {"fast_decode": True, "reason": None}
    assert isinstance(make_batch(model, 2, 0, torch.device("cpu")), FastBatch)

    def refused(m, words):
        why = unsupported_reason(m)
        assert why is not None and words in why, why
        assert decode.describe(m) == {"fast_decode": False, "reason": why}
        assert make_batch(m, 2, 0, torch.device("cpu")) is None
        with pytest.raises(ValueError, match="^FastDecoder: " + re.escape(why)):
            decode.FastDecoder(m)

    refused(torch.nn.Linear(2, 2), "model_type None")
    gelu = qwen2()
    gelu.config.hidden_act = "gelu"
    refused(gelu, "hidden_act 'gelu'")
    sliding = qwen2()
    sliding.config.layer_types = ["full_attention", "sliding_attention"]
    refused(sliding, "sliding-window")
    wrapped = qwen2()
    wrapped.model.layers[1].self_attn.v_proj = torch.nn.Sequential(wrapped.model.layers[1].self_attn.v_proj)  # as an adapter wraps it
    refused(wrapped, "not a plain floating-point nn.Linear")
    head = qwen2()
    head.lm_head = torch.nn.Sequential(head.lm_head)
    refused(head, "lm_head")


@torch.no_grad()
def test_a_forward_override_that_defines_the_logits_hook_runs_on_the_fast_path():
    """A subclass that overrides ``forward`` but defines ``slca_rollout_logits`` opts in: the fast batch hands the
    hook each feed's logits, ids, validity, positions and whether the cache was empty, and returns what it gives."""
    base = qwen2()
    seen = []

    class Hooked(type(base)):
        def forward(self, *a, **k):  # pragma: no cover - the fast path never calls it
            return super().forward(*a, **k)

        def slca_rollout_logits(self, logits, input_ids, valid, position_ids, fresh):
            seen.append((input_ids.tolist(), valid.tolist(), position_ids[valid].tolist(), fresh))
            out = logits.clone()
            out[:, 0] += 100.0
            return out

    hooked = Hooked(base.config).eval()
    hooked.load_state_dict(base.state_dict())
    assert unsupported_reason(hooked) is None
    cpu = torch.device("cpu")
    plain, fast = FastBatch(base, 2, 0, cpu), FastBatch(hooked, 2, 0, cpu)
    for seqs in ([[5, 6, 7], [8, 9]], [[10], None]):
        a, b = plain.feed_lists(seqs), fast.feed_lists(seqs)
        assert float((b[:, 0] - a[:, 0] - 100.0).abs().max()) < 1e-4 and float((b[:, 1:] - a[:, 1:]).abs().max()) < 1e-5
    assert seen == [([[5, 6, 7], [8, 9, 0]], [[True, True, True], [True, True, False]], [0, 1, 2, 0, 1], True),
                    ([[10], [0]], [[True], [False]], [3], False)]  # each row's tokens at its own positions; holes padded


def lora(model, *, targets=("q_proj", "v_proj", "down_proj"), dropout=0.0, seed=1, **extra):
    """``model`` inside a peft PeftModel with LoRA adapters whose B is random (a fresh adapter's B is 0: its
    output would equal the base model's and prove nothing)."""
    peft = pytest.importorskip("peft")
    m = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=list(targets), **extra))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m.eval()


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@torch.no_grad()
def test_lora_adapters_run_on_the_fast_path_with_the_adapted_logits(build):
    """A peft model with LoRA on q, v and down projections: the fast path runs it (W + s B A per projection)
    and its logits are the PeftModel's own, not the base model's, feed by feed."""
    model = lora(build())
    assert unsupported_reason(model) is None
    cpu = torch.device("cpu")
    ref, fast = CacheBatch(model, 2, 0, cpu), make_batch(model, 2, 0, cpu)
    assert isinstance(fast, FastBatch)
    prompts = [[5, 6, 7, 8], [9, 10]]
    a, b = ref.feed_lists(prompts), fast.feed_lists(prompts)
    assert close(a, b, torch.ones(2)) < 1e-4
    with model.disable_adapter():  # the adapters change the logits: the check above could fail
        base = CacheBatch(model, 2, 0, cpu).feed_lists(prompts)
    assert close(a, base, torch.ones(2)) > 1e-2
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        ids = torch.randint(1, 300, (2, 1), generator=g)
        ok = torch.ones(2, 1, dtype=torch.bool)
        assert close(ref.feed(ids, ok), fast.feed(ids, ok), torch.ones(2)) < 1e-4


def test_lora_rollouts_same_tokens_and_logprobs_as_the_peft_forward(tok):
    """Whole sampled multi-turn rollouts of a LoRA model: the fast path and peft's forward agree."""
    model = lora(qwen2(vocab=len(tok)))
    tasks = [make_task(n) for n in ("single", "parallel")]
    kw = dict(group_size=3, max_turns=2, max_new_tokens=24, max_total_tokens=600, temperature=1.0, seed=3)
    fast = generate_rollouts(model, tok, tasks, lambda t: AddEnv(), RolloutConfig(**kw)).trajectories
    plain = generate_rollouts(model, tok, tasks, lambda t: AddEnv(), RolloutConfig(**kw, fast_decode=False)).trajectories
    for f, p in zip(fast, plain):
        assert f.response_ids == p.response_ids and f.model_mask == p.model_mask
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(p.logprobs), atol=1e-5, rtol=0)


def test_lora_states_peft_computes_otherwise_are_refused():
    """Adapters peft would not apply as ``W + s B A`` (disabled, merged, DoRA, dropout while training) are refused
    with the reason; dropout in eval mode (peft skips it) runs."""
    def why(m):
        r = unsupported_reason(m)
        assert (r is None) == (make_batch(m, 2, 0, torch.device("cpu")) is not None)
        return r

    assert why(lora(qwen2(), dropout=0.1)) is None  # eval mode: no dropout
    assert "dropout in training mode" in why(lora(qwen2(), dropout=0.1).train())
    assert why(lora(qwen2(), dropout=0.0).train()) is None  # p = 0: nn.Identity
    assert "DoRA" in why(lora(qwen2(), use_dora=True))
    merged = lora(qwen2())
    merged.merge_adapter()
    assert "merged" in why(merged)
    off = lora(qwen2())
    with off.disable_adapter():
        assert "disabled" in why(off)
    assert why(off) is None


@pytest.mark.parametrize("W", [1, 3])
def test_attention_takes_any_layout_the_kernel_returns(monkeypatch, W):
    """CUDA's SDPA kernels may return their output in another memory layout than the CPU's (a one-token step on an
    H200 failed at ``.view`` before this was fixed): the same values in a non-contiguous layout give the same result."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    B, H, Hkv, D, S = 2, 6, 2, 8, 5
    q = torch.randn(B, W, H, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    mask = torch.ones(B, 1, W * (H // Hkv if W == 1 else 1), S, dtype=torch.bool)
    self = SimpleNamespace(scale=D ** -0.5)
    want = decode.FastDecoder._attend(self, q, k, v, mask)
    real = decode.F.scaled_dot_product_attention

    seen = []

    def strided(*a, **kw):  # the same values, stored with the last two dims swapped
        out = real(*a, **kw).transpose(-1, -2).contiguous().transpose(-1, -2)
        seen.append(out.is_contiguous())
        return out

    monkeypatch.setattr(decode.F, "scaled_dot_product_attention", strided)
    got = decode.FastDecoder._attend(self, q, k, v, mask)
    assert seen == [False]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
