"""slca.generation.fastpath against the plain transformers forward: same logits, tokens, log-probs and gradients.

Real tiny Qwen2 and Llama models (random weights, built from their configs).
The decode path is compared feed by feed with the engine's transformers-backed
batch (prefill, group expansion, decode steps with holes, environment chunks,
dropping, parking and merging rows) and on whole multi-turn rollouts; the
training path value by value and gradient by gradient. Tolerances: 1e-4 on
logits, 1e-5 on log-probabilities (fp32; the observed differences are ~1e-7).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")  # the chat templates of test_rollout's tokenizer come from TRL

from test_rollout import AddEnv, make_task, scripted, tok  # noqa: E402,F401  (module fixtures)

import slca.generation.fastpath.decode as decode  # noqa: E402
from slca.generation.batching import collate, response_logprobs  # noqa: E402
from slca.generation.fastpath import FastBatch, make_batch, unsupported_reason  # noqa: E402
from slca.generation.fastpath.logprobs import fast_response_logprobs, right_padded, shared_prompts  # noqa: E402
from slca.generation.kvcache import CacheBatch  # noqa: E402
from slca.generation.rollout import RolloutConfig, generate_rollouts  # noqa: E402
from slca.types import Task, Trajectory  # noqa: E402


def qwen2(vocab=300, seed=0, bias_free=False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return Qwen2ForCausalLM(cfg).eval()


def llama(vocab=300, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, max_position_embeddings=1024, attention_bias=True, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


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


def random_batch(vocab, n=6, seed=1, group=1):
    """``n`` rows of random prompts (3-11 tokens) and responses (1-14); each prompt shared by ``group`` rows in a row."""
    g = torch.Generator().manual_seed(seed)
    task = Task(id="x", messages=[{"role": "user", "content": "hi"}], tools=[])
    trajs = []
    for i in range(n):
        if i % group == 0:
            prompt = torch.randint(1, vocab, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
        p, r = len(prompt), int(torch.randint(1, 15, (1,), generator=g))
        ids = prompt + torch.randint(1, vocab, (r,), generator=g).tolist()
        mm = (torch.rand(r, generator=g) > 0.4).long().tolist()
        trajs.append(Trajectory(task=task, prompt_ids=ids[:p], response_ids=ids[p:], model_mask=mm, logprobs=[0.0] * r,
                                turns=[], final_text="", stop_reason="eos", messages=[], group_id=0))
    return collate(trajs, 0)


def test_right_padded_layout_puts_every_row_at_column_zero():
    batch = random_batch(300)
    ids, src, plen = right_padded(batch.input_ids, batch.attention_mask, batch.prompt_len)
    for i in range(ids.shape[0]):
        real = batch.input_ids[i][batch.attention_mask[i].bool()]
        assert ids[i, : len(real)].tolist() == real.tolist()
        assert int(plen[i]) == int(batch.attention_mask[i, : batch.prompt_len].sum())


@pytest.mark.parametrize("group", [1, 3], ids=["distinct-prompts", "shared-prompts"])
@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_fast_training_logprobs_and_gradients_match_the_plain_forward(build, group):
    model = build().train()
    batch = random_batch(300, n=9, group=group)
    assert (shared_prompts(batch) is None) == (group == 1)
    valid = batch.valid_mask.bool()

    def run(fast):
        model.zero_grad()
        lp = response_logprobs(model, batch, 0.7, fast=fast)
        (lp * batch.model_mask).sum().backward()
        return lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    (lf, gf), (lp, gp) = run(True), run(False)
    assert lf.shape == lp.shape and bool((lf[~valid] == 0).all())
    torch.testing.assert_close(lf[valid], lp[valid], atol=1e-5, rtol=0)
    assert float((gf - gp).norm() / gp.norm()) < 1e-4
    with pytest.raises(ValueError, match="model_type None"):
        fast_response_logprobs(torch.nn.Linear(2, 2), batch)


def test_shared_prompts_finds_the_rows_of_each_prompt_whatever_the_padding_id():
    batch = random_batch(300, n=8, group=2)
    batch.input_ids[:, : batch.prompt_len][batch.attention_mask[:, : batch.prompt_len] == 0] = 7  # odd padding ids
    first, inv = shared_prompts(batch)
    assert inv.tolist() == [int(x) for x in inv] and len(first) == 4
    assert [sorted((inv == inv[r]).nonzero().flatten().tolist()) for r in (0, 2, 4, 6)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(int(inv[f]) == u for u, f in enumerate(first.tolist()))


def test_shared_prompt_pass_matches_when_a_group_is_one_row_and_responses_are_one_token():
    model = qwen2().train()
    batch = random_batch(300, n=5, group=2)  # groups of 2, 2 and 1
    batch.valid_mask[:, 1:] = 0
    batch.model_mask[:, 1:] = 0
    (lf, lp) = (response_logprobs(model, batch, 1.0, fast=f) for f in (True, False))
    torch.testing.assert_close(lf[:, 0], lp[:, 0], atol=1e-5, rtol=0)


def test_gradient_checkpointing_takes_the_unshared_pass_and_matches():
    """transformers drops the KV cache under gradient checkpointing; the shared-prompt pass must not run then.

    ``gradient_checkpointing_enable`` also hooks the embedding (so the plain
    forward runs anyway); with that hook gone the fast path runs, unshared.
    """
    model = qwen2().train()
    model.gradient_checkpointing_enable()
    for m in model.modules():
        m._forward_hooks.clear()
    assert unsupported_reason(model) is None
    batch = random_batch(300, n=6, group=3)
    valid = batch.valid_mask.bool()
    lf = fast_response_logprobs(model, batch, 1.0)
    model.gradient_checkpointing_disable()
    lp = response_logprobs(model, batch, 1.0, fast=False)
    torch.testing.assert_close(lf[valid], lp[valid], atol=1e-5, rtol=0)


def test_position_dependent_rope_is_not_shared():
    from slca.generation.fastpath.logprobs import _can_share

    model = qwen2()
    assert _can_share(model)
    model.model.rotary_emb.rope_type = "dynamic"
    assert not _can_share(model)
