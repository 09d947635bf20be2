"""slca.eval.agent: batched, left-padded generation and parsing of the next assistant turn."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from _tok import make_qwen_tokenizer
from slca.eval import GenerationConfig, PolicyAgent
from slca.eval.agent import drive

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def model_and_tok():
    pytest.importorskip("trl")  # the tokenizer helper reads TRL's Qwen2.5 chat template
    tok = make_qwen_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    return Qwen2ForCausalLM(cfg).eval(), tok


def _convs():
    return [
        ([{"role": "user", "content": "Weather in Paris?"}], TOOLS),
        ([{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the weather like in Berlin and Rome today, please?"}], TOOLS),
        ([{"role": "user", "content": "hi"}], None),
    ]


def test_batched_greedy_equals_one_at_a_time(model_and_tok):
    model, tok = model_and_tok
    batched = PolicyAgent(model, tok, "hermes", GenerationConfig(max_new_tokens=12, batch_size=3)).generate(_convs())
    single = [PolicyAgent(model, tok, "hermes", GenerationConfig(max_new_tokens=12, batch_size=1)).generate([c])[0] for c in _convs()]
    assert batched == single
    assert all(isinstance(t, str) and "<|im_end|>" not in t for t in batched)


def test_prompt_ends_with_generation_prompt_and_lists_tools(model_and_tok):
    model, tok = model_and_tok
    agent = PolicyAgent(model, tok)
    text = tok.decode(agent.prompt_ids(*_convs()[0]))
    assert text.endswith("<|im_start|>assistant\n") and '"get_weather"' in text


def test_act_parses_with_the_format_and_drive_finishes(model_and_tok):
    model, tok = model_and_tok
    agent = PolicyAgent(model, tok, "hermes", GenerationConfig(max_new_tokens=6))
    turn = agent.act(_convs()[:1])[0]
    assert turn.parsed == agent.format.parse(turn.text)

    class TwoTurns:
        def __init__(self):
            self.done, self.n, self.messages = False, 0, [{"role": "user", "content": "hi"}]

        def conversation(self):
            return self.messages, None

        def step(self, turn):
            self.messages = self.messages + [{"role": "assistant", "content": turn.text}, {"role": "user", "content": "again"}]
            self.n += 1
            self.done = self.n == 2

    eps = [TwoTurns() for _ in range(3)]
    drive(agent, eps, progress=False)
    assert [e.n for e in eps] == [2, 2, 2]
    assert agent.generated_tokens > 0


def test_bad_settings(model_and_tok):
    model, tok = model_and_tok
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=0)
    with pytest.raises(ValueError):
        PolicyAgent(model, tok, "no-such-format")
