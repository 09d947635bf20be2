"""encode_conversation on the real Qwen2.5 / Qwen3 chat templates (as TRL ships them)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from _tok import make_qwen_tokenizer, spans, trl_template, trl_template_dir  # noqa: E402

from slca import segment_masks  # noqa: E402
from slca.chat import ChatRenderer, TemplateNotPrefixPreserving, encode_conversation, get_format  # noqa: E402
from slca.types import ToolCall  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_city_id",
            "description": "Id of a city.",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        },
    },
]


def tc(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def asst(content="", calls=(), reasoning=None):
    m = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = [tc(n, a) for n, a in calls]
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def tool(content):
    return {"role": "tool", "content": content}


SYS = {"role": "system", "content": "You are a weather assistant."}

# Conversations: (messages, number of tool turns)
PARALLEL = [
    SYS,
    {"role": "user", "content": "Weather in Paris and Rome?"},
    asst(calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    tool('{"temp": 20}'),
    tool('{"temp": 25}'),
    asst("Paris is 20 degrees, Rome 25."),
]
CHAIN = [
    {"role": "user", "content": "Weather at the city called Lutetia?"},
    asst("Looking up the id first.", calls=[("get_city_id", {"name": "Lutetia"})]),
    tool('{"id": "paris"}'),
    asst(calls=[("get_weather", {"city": "paris"})]),
    tool('{"error": "timeout"}'),
    asst(calls=[("get_weather", {"city": "paris"})]),
    tool('{"temp": 20, "condition": "sunny"}'),
    asst("It is sunny and 20 degrees in Lutetia (Paris)."),
]
NO_CALL = [SYS, {"role": "user", "content": "Hi there!"}, asst("Hello! Ask me about the weather.")]
CASES = {"parallel": (PARALLEL, 1), "chain": (CHAIN, 3), "no_call": (NO_CALL, 0)}


def with_reasoning(messages):
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            m = dict(m, reasoning_content=f"step {i}: think about it")
        out.append(m)
    return out




def expected_turns(messages, reasoning: bool):
    """What the assistant generates per turn: hermes render + end-of-turn token."""
    fmt = get_format("hermes")
    out = []
    for m in messages:
        if m["role"] != "assistant":
            continue
        calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])]
        r = (m.get("reasoning_content") or "") if reasoning else None
        out.append(fmt.render(calls, content=m["content"], reasoning=r) + "<|im_end|>")
    return out


TEMPLATES = [("qwen2_5", False, False), ("qwen3", True, True), ("qwen3_training", True, False), ("qwen3_training", True, True)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("template,thinks,give_reasoning", TEMPLATES)
def test_model_mask_spans_are_assistant_turns(case, template, thinks, give_reasoning):
    messages, n_tool_turns = CASES[case]
    if give_reasoning:
        messages = with_reasoning(messages)
    tok = make_qwen_tokenizer(trl_template(template))
    enc = encode_conversation(tok, messages, TOOLS)
    full = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    # the pieces tokenise to exactly the template's rendering
    assert tok.decode(enc.input_ids) == full
    assert enc.input_ids == tok(full, add_special_tokens=False)["input_ids"]
    got = spans(tok, enc.input_ids, enc.model_mask)
    assert got == expected_turns(messages, reasoning=thinks)
    # the prompt ends with the assistant header of the first turn
    assert tok.decode(enc.input_ids[: enc.prompt_length]).endswith("<|im_start|>assistant\n")
    assert enc.model_mask[: enc.prompt_length] == [0] * enc.prompt_length

    # segment_masks over the response: tool turns -> tool segment, final answer -> summary
    mm = torch.tensor([enc.model_mask[enc.prompt_length:]])
    tool_m, summ_m = segment_masks(mm)
    resp = enc.input_ids[enc.prompt_length:]
    tool_spans = spans(tok, resp, tool_m[0].tolist())
    summ_spans = spans(tok, resp, summ_m[0].tolist())
    turns = expected_turns(messages, reasoning=thinks)
    assert tool_spans == turns[:n_tool_turns]
    assert summ_spans == turns[n_tool_turns:]
    assert len(summ_spans) == 1


def test_qwen3_template_without_reasoning_is_not_prefix_preserving():
    tok = make_qwen_tokenizer(trl_template("qwen3"))
    with pytest.raises(TemplateNotPrefixPreserving) as e:
        encode_conversation(tok, PARALLEL, TOOLS)
    msg = str(e.value)
    assert "not prefix-preserving" in msg and "<think>" in msg
    assert str(trl_template_dir() / "qwen3_training.jinja") in msg


def test_qwen3_drops_reasoning_of_earlier_queries():
    # Two user queries: Qwen3 renders the first answer's reasoning only while it is the last turn.
    msgs = [
        {"role": "user", "content": "Hi"},
        asst("Hello.", reasoning="greet"),
        {"role": "user", "content": "Weather in Paris?"},
        asst("Sunny.", reasoning="answer"),
    ]
    with pytest.raises(TemplateNotPrefixPreserving):
        encode_conversation(make_qwen_tokenizer(trl_template("qwen3")), msgs)
    # the training template keeps it and works
    enc = encode_conversation(make_qwen_tokenizer(), msgs, chat_template=trl_template("qwen3_training"))
    assert len(spans(make_qwen_tokenizer(), enc.input_ids, enc.model_mask)) == 2


def test_environment_text_is_the_template_between_turns():
    tok = make_qwen_tokenizer(trl_template("qwen2_5"))
    r = ChatRenderer(tok, TOOLS)
    assert r.end_of_turn == "<|im_end|>"
    env = r.environment_text(PARALLEL[:3], PARALLEL[3:5])
    assert env == (
        "\n<|im_start|>user\n<tool_response>\n{\"temp\": 20}\n</tool_response>\n"
        "<tool_response>\n{\"temp\": 25}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # prompt + turn + env reproduces the rendering of the conversation up to the next generation point
    turn = expected_turns(PARALLEL, reasoning=False)[0]
    assert r.render(PARALLEL[:2], True) + turn + env == r.render(PARALLEL[:5], True)


def test_no_assistant_turn_is_all_prompt():
    tok = make_qwen_tokenizer()
    enc = encode_conversation(tok, NO_CALL[:2])
    assert enc.prompt_length == len(enc.input_ids) and not any(enc.model_mask)


def test_no_template_is_an_error():
    tok = make_qwen_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        encode_conversation(tok, NO_CALL)


def test_llama3_template_and_format():
    """A non-Qwen template: Llama 3.1 (TRL's llama3_1.jinja), end of turn <|eot_id|>, llama3_json calls."""
    from _tok import make_llama3_tokenizer

    tok = make_llama3_tokenizer()
    msgs = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "Weather at the city called Lutetia?"},
        asst(calls=[("get_city_id", {"name": "Lutetia"})]),
        tool('{"id": "paris"}'),
        asst(calls=[("get_weather", {"city": "paris"})]),
        tool('{"temp": 20}'),
        asst("It is 20 degrees in Lutetia."),
    ]
    enc = encode_conversation(tok, msgs, TOOLS)
    full = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    assert tok.decode(enc.input_ids) == full and full.startswith("<|begin_of_text|>")
    fmt = get_format("llama3_json")
    turns = [fmt.render([ToolCall("get_city_id", {"name": "Lutetia"})]), fmt.render([ToolCall("get_weather", {"city": "paris"})]), "It is 20 degrees in Lutetia."]
    assert spans(tok, enc.input_ids, enc.model_mask) == [t + "<|eot_id|>" for t in turns]
    r = ChatRenderer(tok, TOOLS)
    assert r.end_of_turn == "<|eot_id|>"
    assert r.environment_text(msgs[:3], msgs[3:4]).startswith("<|start_header_id|>ipython<|end_header_id|>\n\n")
    assert r.environment_text(msgs[:3], msgs[3:4]).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    mm = torch.tensor([enc.model_mask[enc.prompt_length:]])
    tool_m, summ_m = segment_masks(mm)
    resp = enc.input_ids[enc.prompt_length:]
    assert spans(tok, resp, summ_m[0].tolist()) == [turns[-1] + "<|eot_id|>"]
