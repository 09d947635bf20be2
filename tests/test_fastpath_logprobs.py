"""slca.generation.fastpath.logprobs against the plain transformers forward: same log-probabilities and gradients.

Real tiny Qwen2 and Llama models (random weights, built from their configs): the
training pass's right-padded, mask-free log-probabilities (and its shared-prompt
pass) value by value and gradient by gradient against
:func:`slca.generation.batching.response_logprobs` with ``fast=False``.
Tolerances: 1e-5 on log-probabilities, 1e-4 relative on gradients (fp32; the
observed differences are ~1e-7). The rollout decoder's fast path:
tests/test_fastpath_decode.py.
"""

from __future__ import annotations

import pytest
import torch
from _tok import random_llama as llama, random_qwen2 as qwen2

from slca.generation.batching import collate, response_logprobs
from slca.generation.fastpath import unsupported_reason
from slca.generation.fastpath.logprobs import fast_response_logprobs, right_padded, shared_prompts
from slca.types import Task, Trajectory


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



@pytest.mark.parametrize("group", [1, 3], ids=["distinct-prompts", "shared-prompts"])
@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_lora_models_take_the_fast_training_pass_with_peft_gradients(build, group):
    """A peft LoRA model (the shape of study 42's runs, which died here: the pass called the PeftModel's inner
    model as if it were the base model): the fast pass runs through the LoRA layers, so log-probabilities and the
    adapters' gradients equal peft's own forward; the base weights get none."""
    from test_fastpath_decode import lora

    model = lora(build()).train()
    assert unsupported_reason(model) is None
    batch = random_batch(300, n=9, group=group)
    valid = batch.valid_mask.bool()

    def run(fast):
        model.zero_grad()
        lp = response_logprobs(model, batch, 0.7, fast=fast)
        (lp * batch.model_mask).sum().backward()
        grads = {n: p.grad.flatten() for n, p in model.named_parameters() if p.grad is not None}
        return lp.detach(), grads

    (lf, gf), (lp, gp) = run(True), run(False)
    assert gf.keys() == gp.keys() and gf and all("lora_" in n for n in gf)
    torch.testing.assert_close(lf[valid], lp[valid], atol=1e-5, rtol=0)
    f, p = torch.cat(list(gf.values())), torch.cat(list(gp.values()))
    assert float((f - p).norm() / p.norm()) < 1e-4
