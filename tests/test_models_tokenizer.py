"""slca.models.tokenizer: the embedded model's tokens and its Qwen2.5-style chat template.

The template's rendering (tools as signature lines, hermes calls, merged tool
responses), prefix preservation and exact assistant masks run on the tokenizer
tests/test_models.py trains from a few conversations (its ``tok`` fixture and
conversations); the token lists are checked against Qwen's and, when the package
ships the default model's weights, against the shipped tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _tok import QWEN_ADDED, QWEN_SPECIAL
from test_models import CONVERSATION, EXPECTED, NO_CALL, TOOLS, tok  # noqa: F401  (tok: a fixture)

import slca.models
from slca.chat import encode_conversation, get_format
from slca.models import shipped_model_dir
from slca.models.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, chat_template
from slca.types import ToolCall


def test_template_renders_tools_calls_and_merged_tool_responses(tok):
    assert tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False) == EXPECTED
    prompt = tok.apply_chat_template(CONVERSATION[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert prompt == EXPECTED[: EXPECTED.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")]
    # No tools: no tool preamble; default system prompt when none is given.
    plain = tok.apply_chat_template(NO_CALL, tokenize=False)
    assert plain == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>\n"


def test_template_tool_calls_equal_hermes_render(tok):
    """A tool_calls message renders exactly as the text the hermes format tells the model to generate."""
    hermes = get_format("hermes")
    calls = [ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Rome", "unit": "c"})]
    for content in ("", "Checking both."):
        as_calls = [CONVERSATION[1], {"role": "assistant", "content": content, "tool_calls": [c.to_openai(i) for i, c in enumerate(calls)]}]
        as_text = [CONVERSATION[1], {"role": "assistant", "content": hermes.render(calls, content)}]
        a = tok.apply_chat_template(as_calls, tools=TOOLS, tokenize=False)
        assert a == tok.apply_chat_template(as_text, tools=TOOLS, tokenize=False)
        assert hermes.parse(a.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")).calls == calls


def test_template_is_prefix_preserving_and_masks_exactly_the_assistant_text(tok):
    for conv, tools in ((CONVERSATION, TOOLS), (NO_CALL, None), (CONVERSATION[1:], TOOLS)):
        full = tok.apply_chat_template(conv, tools=tools, tokenize=False)
        for k in range(1, len(conv) + 1):
            if conv[k - 1]["role"] == "tool" and k < len(conv) and conv[k]["role"] == "tool":
                continue  # mid-way through a merged block of tool responses
            gen = k < len(conv) and conv[k]["role"] == "assistant"
            assert full.startswith(tok.apply_chat_template(conv[:k], tools=tools, tokenize=False, add_generation_prompt=gen))
        enc = encode_conversation(tok, conv, tools)
        assert enc.input_ids == tok.encode(full)
        spans, cur = [], []
        for i, m in zip(enc.input_ids, enc.model_mask):
            if m:
                cur.append(i)
            elif cur:
                spans.append(tok.decode(cur))
                cur = []
        hermes = get_format("hermes")
        want = []
        for m in conv:
            if m["role"] == "assistant":
                calls = [ToolCall(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls", [])]
                want.append(hermes.render(calls, m["content"]) + "<|im_end|>")
        assert spans == want



def test_the_tokens_are_qwens():
    """ChatML control tokens special, tool and reasoning tags added, as in Qwen2.5's own tokenizer.json."""
    assert SPECIAL_TOKENS == tuple(QWEN_SPECIAL) and ADDED_TOKENS == tuple(QWEN_ADDED)
    assert not set(SPECIAL_TOKENS) & set(ADDED_TOKENS)


def test_chat_template_is_the_jinja_file_beside_the_module():
    text = chat_template()
    assert text == (Path(slca.models.__file__).parent / "chat_template.jinja").read_text(encoding="utf-8")
    assert "<|im_start|>" in text and "<tool_call>" in text and "<tool_response>" in text and "<think>" in text


def test_the_shipped_tokenizer_has_these_tokens_and_this_template():
    """Each control token and tag is one id; decoding drops the special ones and keeps the tags (the parser reads them)."""
    from transformers import AutoTokenizer

    if not (shipped_model_dir() / "tokenizer.json").exists():
        pytest.skip("no shipped weights in this tree")
    shipped = AutoTokenizer.from_pretrained(shipped_model_dir())
    assert shipped.chat_template == chat_template()
    assert (shipped.eos_token, shipped.pad_token) == ("<|im_end|>", "<|endoftext|>")
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        ids = shipped.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and shipped.convert_ids_to_tokens(ids[0]) == t
        assert shipped.decode(ids, skip_special_tokens=True) == ("" if t in SPECIAL_TOKENS else t)


def test_tool_signatures_render_types_unions_enums_and_optional_parameters(tok):
    tool = {"type": "function", "function": {"name": "find", "description": "Find things.", "parameters": {
        "type": "object", "required": ["q"],
        "properties": {"q": {"type": "string"}, "n": {"type": ["integer", "null"]}, "mode": {"enum": ["a", 1, True]}, "x": {}}}}}
    bare = {"type": "function", "function": {"name": "ping", "parameters": {}}}
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool, bare], tokenize=False)
    assert '\nfind(q: string, n?: integer|null, mode?: "a"|1|true, x?: any): Find things.\nping()\n</tools>' in text


def test_calls_arguments_verbatim_as_a_string_as_json_as_an_object_and_reasoning_in_think_tags(tok):
    as_string = {"type": "function", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}}
    as_object = {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "UTC"}}}
    msgs = [{"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the clock.", "tool_calls": [as_string, as_object]}]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    turn = text.split("<|im_start|>assistant")[-1]
    assert turn == ('\n<think>\nNeed the clock.\n</think>\n'
                    '\n<tool_call>\n{"name": "get_time", "arguments": {"tz":"UTC"}}\n</tool_call>'
                    '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call><|im_end|>\n')
