"""recipes/warmstart/tokenizer.py: the embedded default model's byte-level BPE tokenizer.

Trained in the test on a few conversations (tests/test_models.py's ``tok`` fixture) or on rendered
demonstrations (tests/test_warmstart_sft.py's ``_tiny_tokenizer``), no hub: any text round-trips, the
special and added tokens stay single ids, ``save_pretrained`` / ``AutoTokenizer`` round-trip it with the chat
template, a name is the same tokens in text and in JSON arguments, and ``digit_runs`` keeps numbers whole.
"""

from __future__ import annotations

import json

import pytest
from test_models import CONVERSATION, EXPECTED, TOOLS, tok  # noqa: F401  (tok: a fixture)
from test_warmstart_sft import _tiny_tokenizer

from recipes.warmstart.tokenizer import train_tokenizer
from slca.models.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, chat_template


def test_tokenizer_round_trips_any_text_and_keeps_special_tokens_whole(tok):
    for text in ["héllo wörld ✓ 🙂 \t\n  spaces", "{\"a\": [1, 2.5e-3]}", "", "Ünïcode 中文 ok"]:
        assert tok.decode(tok.encode(text)) == text
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        ids = tok.encode(t)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
        assert tok.encode(f"x{t}y")[1] == ids[0]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    ids = tok.encode("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>")
    # Like Qwen: ChatML tokens are special (dropped), tool tags are not (kept for the parser).
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"
    assert len(tok) == 400


def test_vocab_size_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=200)


def test_tokenizer_save_load_round_trip(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    assert back.chat_template == chat_template()
    assert back.encode(EXPECTED) == tok.encode(EXPECTED)
    assert back.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False) == EXPECTED
    assert (back.eos_token, back.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_a_name_tokenizes_the_same_in_text_and_in_json_arguments(tok):
    """Words take no leading space, so copying a request's name into a call is copying its tokens."""
    for name in ("Bogota", "Zurivaka", "PEP", "piano lesson"):
        in_text = tok.encode(f"Weather in {name} today?")
        in_json = tok.encode(json.dumps({"city": name}))
        alone = tok.encode(name)
        for ids in (in_text, in_json):
            assert any(ids[i : i + len(alone)] == alone for i in range(len(ids))), (name, tok.convert_ids_to_tokens(ids))


def test_digit_runs_keep_frequent_numbers_whole():
    _, single = _tiny_tokenizer()
    _, runs = _tiny_tokenizer(digit_runs=True)
    date = "2025-03-14"
    assert len(single(date, add_special_tokens=False)["input_ids"]) == 10  # Qwen2: one digit per token
    pieces = [runs.decode([t]) for t in runs(date, add_special_tokens=False)["input_ids"]]
    assert "".join(pieces) == date and len(pieces) < 10 and "2025" in pieces
