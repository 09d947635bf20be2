"""Embedded default model: the recipe's SFT loop (batches, the assistant-token loss).

The tokenizer here is trained in the test on a few conversations (no hub); its
conversations (``CONVERSATION``, ``EXPECTED``) and the ``tok`` fixture also serve
the recipe tokenizer's tests (tests/test_warmstart_tokenizer.py) and the chat
template's (tests/test_models_tokenizer.py). The whole build pipeline at a tiny
size: tests/test_warmstart_build.py.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from slca.chat import encode_conversation
from recipes.warmstart.sft import SFTConfig, SFTExample, make_batches, sft_train
from recipes.warmstart.tokenizer import train_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Local time.", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]


def _call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# Parallel calls in one turn, their two results, a second (chained) tool turn, then the answer.
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome, then the time in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "Paris"}), _call("get_weather", {"city": "Rome"})]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": '{"temp": 25}'},
    {"role": "assistant", "content": "", "tool_calls": [_call("get_time", {"tz": "Europe/Rome"})]},
    {"role": "tool", "content": '{"time": "14:05"}'},
    {"role": "assistant", "content": "Paris is 21, Rome is 25; it is 14:05 in Rome."},
]
NO_CALL = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]

EXPECTED = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n"
    'get_weather(city: string, unit?: "c"|"f"): Current weather for a city.\n'
    "get_time(tz?: string): Local time.\n"
    "</tools>\nCall tools as:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nWeather in Paris and Rome, then the time in Rome?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\n{"temp": 25}\n</tool_response><|im_end|>\n'
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Rome"}}\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n{"time": "14:05"}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\nParis is 21, Rome is 25; it is 14:05 in Rome.<|im_end|>\n"
)


@pytest.fixture(scope="module")
def tok():
    texts = [EXPECTED, "The weather is sunny today in many cities, and the time is late."] * 5
    return train_tokenizer(texts, vocab_size=400)


def test_make_batches_uses_every_example_once_within_the_token_budget():
    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(200)]
    batches = make_batches(lengths, 128, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(200))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 128 or len(b) == 1
    with pytest.raises(ValueError, match="batch_tokens"):
        make_batches(lengths, 0, rng)


def test_sft_loss_decreases_and_ignores_non_assistant_tokens(tok):
    from recipes.warmstart.config import ModelSize
    from recipes.warmstart.build import make_model

    enc = encode_conversation(tok, CONVERSATION, TOOLS)
    ex = SFTExample(enc.input_ids, enc.model_mask)
    size = ModelSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
    model = make_model(size, tok, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    stats = sft_train(model, [ex] * 4, SFTConfig(steps=30, batch_tokens=4096, lr=1e-2, warmup_steps=3), pad_id=tok.pad_token_id)
    assert stats.losses[-1] < 0.5 * stats.losses[0]
    assert stats.assistant_tokens == 30 * 4 * sum(ex.model_mask)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # The loss is the mean cross-entropy of the assistant tokens only (next-token shift).
    from recipes.warmstart.sft import _collate, weighted_lm_loss

    ids, att, weights = _collate([ex], tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits
        logp = torch.log_softmax(logits[0, :-1], dim=-1)
        targets = ids[0, 1:]
        nll = -logp[torch.arange(len(targets)), targets]
        on = torch.tensor(ex.model_mask[1:], dtype=torch.bool)
        loss, assistant = weighted_lm_loss(logits, ids, weights)
    assert 0 < on.sum() < len(on)
    assert float(loss) == pytest.approx(float(nll[on].mean()), rel=1e-5)
    assert float(assistant) == pytest.approx(float(loss), rel=1e-6)
    # With env_loss_weight, tool-response tokens after the first assistant turn join the loss
    # at that weight; system / first-user tokens never do.
    from recipes.warmstart.sft import encode_examples

    (ex2,), _ = encode_examples(tok, [(CONVERSATION, TOOLS)], 4096)
    assert ex2.model_mask == ex.model_mask and sum(ex2.env_mask) > 0
    assert not any(ex2.env_mask[: enc.prompt_length]) and not any(m and e for m, e in zip(ex2.model_mask, ex2.env_mask))
    ids, att, weights = _collate([ex2], tok.pad_token_id, env_weight=0.5)
    env = torch.tensor(ex2.env_mask[1:], dtype=torch.bool)
    with torch.no_grad():
        loss, assistant = weighted_lm_loss(model(input_ids=ids, attention_mask=att).logits, ids, weights)
    expect = (nll[on].sum() + 0.5 * nll[env].sum()) / (on.sum() + 0.5 * env.sum())
    assert float(loss) == pytest.approx(float(expect), rel=1e-5)
    assert float(assistant) == pytest.approx(float(nll[on].mean()), rel=1e-5)
    with pytest.raises(ValueError, match="examples"):
        sft_train(model, [], SFTConfig(), pad_id=0)
