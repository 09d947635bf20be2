"""recipes/smollm2_toolworld/sft.py: the stage-1 LoRA SFT on the assistant's tokens (issue 42).

On a tiny random Llama with LoRA (peft): the head run only where the assistant speaks equals the full head's
masked cross-entropy, and a batch in slices is the same update as the batch in one go. The build on SmolLM2
itself: tests/test_smollm2_toolworld_build.py.
"""

from __future__ import annotations

import pytest
import torch

from recipes.smollm2_toolworld import Stage1Config
from recipes.smollm2_toolworld import sft as SFT


def _tiny_lora():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def _examples(n: int = 6) -> list[SFT.Example]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        T_ = 8 + 3 * i
        ids = torch.randint(1, 64, (T_,), generator=g).tolist()
        mask = [0] * (T_ // 2) + [1] * (T_ - T_ // 2)
        out.append(SFT.Example(ids, mask))
    return out


def test_the_assistant_loss_runs_the_head_only_where_it_counts():
    pytest.importorskip("peft")
    model = _tiny_lora()
    ex = _examples(3)
    ids, att, mask = SFT._collate(ex, pad_id=0)
    got = SFT.assistant_ce_sum(model, ids, att, mask)
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view_as(mask)
    torch.testing.assert_close(got, (ce * mask).sum())


def test_a_batch_in_slices_is_the_same_update():
    pytest.importorskip("peft")
    ex = _examples(6)
    results = []
    for micro in (10_000, 20):  # one slice, or one row at a time
        model = _tiny_lora()
        cfg = Stage1Config(n_tasks=6, steps=2, batch_tokens=10_000, micro_tokens=micro, warmup_steps=0)
        stats = SFT.train_lora(model, ex, cfg, pad_id=0)
        results.append(({n: p.detach().clone() for n, p in SFT.trainable(model)}, stats.losses))
    (a, la), (b, lb) = results
    assert la == pytest.approx(lb, rel=1e-5)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-6)
