"""slca.eval.agent: batched, left-padded generation and parsing of the next assistant turn."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from slca.eval import GenerationConfig, PolicyAgent
from slca.eval.agent import drive

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def model_and_tok(qwen_tokenizer):
    tok = qwen_tokenizer
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


def test_prompts_over_the_model_positions_are_cut_to_their_last_tokens(model_and_tok):
    _, tok = model_and_tok
    short, long = _convs()[0], _convs()[1]
    probe = PolicyAgent(Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1)), tok)
    n_short, n_long = len(probe.prompt_ids(*short)), len(probe.prompt_ids(*long))
    assert n_short < n_long
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=n_short + 6)
    model = Qwen2ForCausalLM(cfg).eval()
    agent = PolicyAgent(model, tok, "hermes", GenerationConfig(max_new_tokens=6))
    assert agent.max_prompt_tokens == n_short
    turns = agent.act([short, long])
    assert [t.truncated for t in turns] == [False, True]
    # the cut prompt is the last max_prompt_tokens tokens: same output as generating from them directly
    ids = torch.tensor([probe.prompt_ids(*long)[-n_short:]])
    direct = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id,
                            eos_token_id=agent._stop_ids, temperature=None, top_p=None, top_k=None)[0, n_short:].tolist()
    stop = next((j for j, t in enumerate(direct) if t in agent._stop_ids), len(direct))
    assert turns[1].text == tok.decode(direct[:stop], skip_special_tokens=True)
    with pytest.raises(ValueError, match="leaves no room for a prompt"):
        PolicyAgent(model, tok, "hermes", GenerationConfig(max_new_tokens=n_short + 6))


def test_the_agent_stops_where_the_chat_template_ends_a_turn(model_and_tok):
    """The stop tokens come from the chat template, as in rollouts (slca.generation.rollout.stop_token_ids): a template
    that ends its turns with <|eot_id|> (Llama 3) stops the agent there; it used to stop only at Qwen's <|im_end|>
    and the eos token."""
    import copy

    from slca.chat import ChatRenderer
    from slca.generation.rollout import stop_token_ids

    model, tok = model_and_tok
    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"additional_special_tokens": ["<|eot_id|>"]})
    template = ("{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|eot_id|>{% endfor %}"
                "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    agent = PolicyAgent(model, tok, "hermes", GenerationConfig(max_new_tokens=4), chat_template=template)
    assert agent._stop_ids == sorted({eot, tok.eos_token_id})  # the template's end of turn, and the eos token
    assert agent._stop_ids == stop_token_ids(tok, model, ChatRenderer(tok, chat_template=template).end_of_turn_id())
    qwen = PolicyAgent(model, model_and_tok[1], "hermes", GenerationConfig(max_new_tokens=4))
    assert model_and_tok[1].convert_tokens_to_ids("<|im_end|>") in qwen._stop_ids
