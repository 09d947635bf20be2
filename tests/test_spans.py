"""slca.chat.spans: each policy token labelled reasoning / call / text from its turn's text.

Hand cases on a tokenizer of one id per character (where every rule can be seen), the straddling-token and
empty-token rules on a tokenizer of several characters per id and one of split UTF-8 bytes, odd model output that
never raises, and real tokenizers (the embedded default's and SmolLM2's) on hermes and the paper's JSON-list format.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _tok import real_tokenizer
from slca.chat import get_format
from slca.chat.spans import (
    char_labels,
    check_segmentation,
    row_span_labels,
    span_format,
    span_formats,
    span_labels,
    spans_needed,
    token_ends,
    token_labels,
)
from slca.core.registry import get_estimator
from slca.core.segments import SPAN_CALL as C
from slca.core.segments import SPAN_NONE as N
from slca.core.segments import SPAN_TEXT as X
from slca.core.segments import SPAN_THINK as R

EOT = 0


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode_chars(ids: list[int]) -> str:
    return "".join("<eot>" if i == EOT else chr(i) for i in ids)


def labels_of(text: str, fmt: str = "hermes") -> str:
    """One letter per character: x text, r reasoning, c call."""
    return "".join("?xrc"[v] for v in token_labels(chars(text), decode_chars, fmt))


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LIST = '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n</tool_call>'


def test_hand_case_reasoning_text_call_text():
    think = "<think>\nweather first\n</think>"
    text = f"{think}\n\nLet me check.\n{CALL}\nDone"
    got = labels_of(text)
    want = "r" * len(think) + "rr" + "x" * len("Let me check.\n") + "c" * len(CALL) + "c" + "xxxx"
    assert got == want


@pytest.mark.parametrize("fmt,call", [("hermes", CALL), ("json_list", LIST)])
def test_calls_inside_text_both_formats(fmt, call):
    text = f"Paris first. {call} Rome next: {call}"
    got = labels_of(text, fmt)
    a = len("Paris first. ")
    b = a + len(call) + len(" Rome next: ")
    assert got[:a - 1] == "x" * (a - 1) and got[a:a + len(call)] == "c" * len(call)
    assert got[a + len(call) + 1:b] == "x" * (b - a - len(call) - 1) and got[b:] == "c" * len(call)
    # the parser reads the same calls the spans cover
    spans = get_format(fmt).call_spans(text)
    assert [text[s:e] for s, e in spans] == [call, call]
    assert len(get_format(fmt).parse(text).calls) == 2


def test_end_of_turn_takes_the_label_before_it():
    ids = chars(CALL) + [EOT]
    assert token_labels(ids, decode_chars, "hermes", end_of_turn=[EOT])[-1] == C
    ids = chars("Sunny.") + [EOT]
    assert token_labels(ids, decode_chars, "hermes", end_of_turn=[EOT])[-1] == X
    # without end_of_turn the marker is decoded as text
    assert token_labels(chars(CALL) + [EOT], decode_chars, "hermes")[-1] == X


@pytest.mark.parametrize("text,want", [
    ("<think>\nnever closed", "r" * len("<think>\nnever closed")),  # unclosed: the rest of the turn is reasoning
    ("<think>a</think><tool_call>\n{broken", "r" * len("<think>a</think>") + "c" * len("<tool_call>\n{broken")),
    ("x <tool_call>{} </tool_call> y", "xx" + "c" * len("<tool_call>{} </tool_call>") + "cx"),  # empty / bad JSON stays a call
    ("a </tool_call> b", "x" * len("a </tool_call> b")),  # a stray closing tag is text
    ("  \n ", "x" * 4),  # whitespace only: text
    ("", ""),
    ("mid <think>no</think> text", "x" * len("mid <think>no</think> text")),  # only a leading <think> is reasoning
    ("<tool_call>\n{}\n<tool_call>\n{}\n</tool_call>", "c" * len("<tool_call>\n{}\n<tool_call>\n{}\n</tool_call>")),
])
def test_odd_model_output_is_labelled_as_the_parser_reads_it(text, want):
    assert labels_of(text) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list("ab {}[]\"\n<>/;") + ["<think>", "</think>", "<tool_call>", "</tool_call>",
                                                              "<|python_tag|>", '{"name": "f", "parameters": {}}']),
                max_size=30).map("".join), st.sampled_from(["hermes", "json_list", "llama3_json"]))
def test_never_raises_and_labels_every_token(text, fmt):
    out = token_labels(chars(text), decode_chars, fmt)
    assert len(out) == len(text) and set(out) <= {X, R, C}
    for s, e in get_format(fmt).call_spans(text):
        assert 0 <= s < e <= len(text)


def test_llama3_json_spans():
    call = '{"name": "f", "parameters": {"a": 1}}'
    text = f"Checking. {call}; {call} bye"
    spans = get_format("llama3_json").call_spans(text)
    assert [text[s:e] for s, e in spans] == [f"{call}; {call}"]
    assert labels_of("<|python_tag|>" + call, "llama3_json") == "c" * len("<|python_tag|>" + call)


class Pieces:
    """A tokenizer whose ids stand for fixed pieces of text (several characters, or raw UTF-8 bytes)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_a_straddling_token_takes_the_larger_label():
    tok = Pieces([b"Hi.\n<tool", b"_call>\n{}\n</tool_", b"call> ok", b"<think>a</th", b"ink>go"])
    dec = tok.decode
    assert token_labels([0, 1, 2], dec, "hermes") == [C, C, C]  # every token touches the call
    assert token_labels([3, 4], dec, "hermes") == [R, R]  # "ink>" closes the reasoning, "go" is text: reasoning wins
    assert char_labels("<think>a</think>go", "hermes") == [R] * 16 + [X, X]


def test_split_utf8_bytes_go_to_the_token_that_completes_the_character():
    e_acute = "é".encode()  # two bytes
    tok = Pieces([b"caf", e_acute[:1], e_acute[1:] + b" <tool_call>{}</tool_call>"])
    ends, text = token_ends([0, 1, 2], tok.decode)
    assert text == "café <tool_call>{}</tool_call>" and ends == [3, 3, len(text)]
    assert token_labels([0, 1, 2], tok.decode, "hermes") == [X, C, C]  # the empty token takes the next token's label


def test_a_decoder_that_is_not_a_concatenation_uses_the_prefix_rule():
    class Strips:  # strips the leading space of the whole decoded text, as SentencePiece decoders do
        pieces = ["a", " b", " <tool_call>{}</tool_call>"]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(self.pieces[i] for i in ids).lstrip(" ")

    tok = Strips()
    ends, text = token_ends([1, 2], tok.decode)
    assert text == "b <tool_call>{}</tool_call>" and ends == [1, len(text)]
    assert token_labels([1, 2], tok.decode, "hermes") == [X, C]


def test_rows_and_batches():
    call_ids = chars(CALL) + [EOT]
    env = [ord("E")] * 3
    answer = chars("Sunny.") + [EOT]
    ids = chars("Ok ") + call_ids + env + answer
    pol = [1] * (3 + len(call_ids)) + [0] * 3 + [1] * len(answer)
    row = row_span_labels(ids, pol, decode=decode_chars, fmt="hermes", end_of_turn=[EOT])
    assert row[:2] == [X, X] and set(row[3:3 + len(call_ids)]) == {C} and row[3 + len(call_ids):3 + len(call_ids) + 3] == [N] * 3
    assert set(row[-len(answer):]) == {X}
    T = len(ids) + 2
    batch = span_labels(torch.tensor([ids + [7, 7], [5] * T]), torch.tensor([pol + [1, 1], [0] * T]), decode=decode_chars,
                        fmt="hermes", end_of_turn=[EOT], lengths=[len(ids), 0])
    assert batch.dtype == torch.int8 and batch.shape == (2, T)
    assert batch[0, :len(ids)].tolist() == row and batch[0, len(ids):].tolist() == [N, N] and batch[1].tolist() == [N] * T


def test_refusals_name_what_is_wrong():
    assert span_formats() == ["hermes", "json_list", "llama3_json"]
    with pytest.raises(ValueError, match="'openai' does not write its calls as spans"):
        span_format("openai")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        span_labels([[1]], [[1]], fmt="hermes")
    with pytest.raises(ValueError, match="same shape"):
        span_labels([[1, 2]], [[1]], decode=decode_chars, fmt="hermes")
    slca, think = get_estimator("slca"), get_estimator("slca_think")
    assert not spans_needed(slca, "boundary") and spans_needed(slca, "span") and spans_needed(think, "boundary")
    check_segmentation("boundary", "openai", slca)  # nothing to label: fine
    with pytest.raises(ValueError, match="segmentation='span' needs each policy token labelled .* 'openai'"):
        check_segmentation("span", "openai", slca)
    with pytest.raises(ValueError, match="estimator 'slca_think' .* 'openai'"):
        check_segmentation("boundary", "openai", think)
    with pytest.raises(ValueError, match="segmentation must be one of"):
        check_segmentation("spans", "hermes", slca)


# ----------------------------------------------------------------- real tokenizers


@pytest.fixture(scope="module", params=["default", "smollm2"])
def tok(request):
    return real_tokenizer(request.param)


def _eot(tok):
    from slca.chat import ChatRenderer

    return ChatRenderer(tok).end_of_turn_id()


@pytest.mark.parametrize("fmt,call", [("hermes", CALL), ("json_list", LIST)])
def test_real_tokenizers_label_what_the_text_says(tok, fmt, call):
    """A tool turn with reasoning, text, a call and text after it, then the environment, then the answer: each token's
    label is the label of the characters its own decoding carries (every token of the call decodes inside the call)."""
    eot = _eot(tok)
    turn = f"<think>\nParis, then Rome.\n</think>\n\nChecking Zürich too.\n{call}\nOne moment."
    t_ids = tok(turn, add_special_tokens=False)["input_ids"] + [eot]
    env = tok("\n<tool_response>\n{}\n</tool_response>\n", add_special_tokens=False)["input_ids"]
    a_ids = tok("It is sunny.", add_special_tokens=False)["input_ids"] + [eot]
    ids, pol = t_ids + env + a_ids, [1] * len(t_ids) + [0] * len(env) + [1] * len(a_ids)
    labels = span_labels(torch.tensor([ids]), torch.tensor([pol]), tokenizer=tok, fmt=fmt, end_of_turn=[eot])[0].tolist()
    assert labels[len(t_ids):len(t_ids) + len(env)] == [N] * len(env)
    assert set(labels[-len(a_ids):]) == {X}
    turn_labels = labels[:len(t_ids)]
    assert turn_labels[-1] == X  # the turn ends on text ("One moment."), its end-of-turn token with it
    dec = lambda x: tok.decode(x, skip_special_tokens=False)  # noqa: E731
    by = {v: dec([i for i, lab in zip(t_ids[:-1], turn_labels) if lab == v]) for v in (X, R, C)}
    assert by[R].startswith("<think>") and by[R].rstrip().endswith("</think>") and "Paris, then Rome." in by[R]
    assert by[C].strip() == call  # the call, whole, and nothing but the call
    assert "Checking Zürich too." in by[X] and "One moment." in by[X] and "<tool_call>" not in by[X]
    # the labels follow the tokens: a turn tokenised one character at a time labels the same text the same way
    split = [i for ch in turn for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert dec(split) == turn
    lab2 = token_labels(split + [eot], dec, fmt, end_of_turn=[eot])
    by2 = {v: dec([i for i, lab in zip(split, lab2) if lab == v]) for v in (X, R, C)}
    assert by2[C].strip() == call and by2[R].strip() == by[R].strip()


def test_real_tokenizer_cost_is_linear_enough(tok):
    import time

    turn = ("Some text. " + CALL + "\n") * 40
    ids = tok(turn, add_special_tokens=False)["input_ids"]
    t0 = time.perf_counter()
    out = token_labels(ids, lambda x: tok.decode(x, skip_special_tokens=False), "hermes")
    seconds = time.perf_counter() - t0
    assert out.count(C) > len(ids) // 2
    assert seconds < 5.0, seconds  # generous for a busy machine; about 15 ms for ~1,000 tokens here
