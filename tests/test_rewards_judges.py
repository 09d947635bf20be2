"""Optional summary judges: an LLM judge against a real loopback HTTP server, a local reward model."""

from __future__ import annotations

import logging
import math

import pytest

from slca.env import toolworld as tw
from slca.rewards import OpenAIJudge, RewardModelJudge, Unscorable, digit_logit_bias, summary_reward
from slca.types import ParsedTurn, Turn

TASK = next(t for t in tw.make_tasks("train", n=100) if t.meta["task_type"] == "weather")


def turns_for(task):
    env = tw.make_env(task)
    calls = task.gold[0]
    ref = task.reference_answer
    return [Turn("<c>", ParsedTurn(calls=list(calls)), [env.call(c.name, c.arguments) for c in calls]), Turn(ref, ParsedTurn(content=ref))]


def test_openai_judge_scores_and_mixes_in(judge_server):
    url, replies, seen = judge_server
    replies += [("content", '{"score": 8}')]
    judge = OpenAIJudge(url, "judge-model")
    turns = turns_for(TASK)
    s = summary_reward(TASK, turns, TASK.reference_answer, judge=judge, judge_weight=0.5)
    assert s.components["judge"] == pytest.approx(0.8) and s.total == pytest.approx(0.5 * 1.0 + 0.5 * 0.8)
    user = seen[0]["messages"][-1]["content"]
    assert TASK.messages[0]["content"] in user and TASK.reference_answer in user and '"temp_c"' in user


def test_openai_judge_retries_then_nan_with_reason(judge_server, caplog):
    url, replies, _ = judge_server
    replies += [("content", "great answer!"), ("content", "7")]
    judge = OpenAIJudge(url, "m", max_retries=1, http_attempts=2, backoff=0.01)
    assert judge.score(TASK, turns_for(TASK), "x") == pytest.approx(0.7) and judge.metrics["invalid_output"] == 1
    replies += [("status", 500), ("content", '{"score": 42}'), ("content", '{"score": 42}')]  # 500 retried, then 42 asked again
    with caplog.at_level(logging.WARNING, logger="slca.rewards"):
        s = summary_reward(TASK, turns_for(TASK), TASK.reference_answer, judge=judge)
    assert math.isnan(s.total) and "judge failed" in s.reason and "outside 0-10" in s.reason
    assert judge.metrics["http_errors"] == 1 and judge.metrics["http_retries"] == 1 and any("NaN" in r.message for r in caplog.records)


def test_openai_judge_sends_logit_bias_and_reads_a_bare_score(judge_server):
    url, replies, seen = judge_server
    replies += [("content", "7"), ("content", "10"), ("content", "77"), ("content", "77"), ("content", '{"score": 3}')]
    judge = OpenAIJudge(url, "m", max_retries=1, max_tokens=2, logit_bias={39: 100.0, 2: 100})
    turns = turns_for(TASK)
    assert judge.score(TASK, turns, "x") == pytest.approx(0.7) and judge.score(TASK, turns, "x") == pytest.approx(1.0)
    with pytest.raises(Unscorable, match="outside 0-10"):  # "77" is out of range, never clamped to 10
        judge.score(TASK, turns, "x")
    assert judge.metrics["invalid_output"] == 2 and all(b["logit_bias"] == {"39": 100.0, "2": 100.0} and b["max_tokens"] == 2 for b in seen)
    OpenAIJudge(url, "m").score(TASK, turns, "x")
    assert "logit_bias" not in seen[-1] and "max_tokens" not in seen[-1]  # off by default: the request is unchanged


@pytest.mark.parametrize("bias, named", [
    ({-1: 5.0}, "key -1"), ({"39": 5.0}, "key '39'"), ({True: 5.0}, "key True"), ({1.5: 5.0}, "key 1.5"),
    ({39: 100.5}, r"logit_bias\[39\] = 100.5"), ({39: -101}, r"logit_bias\[39\] = -101"),
    ({39: math.nan}, r"logit_bias\[39\] = nan"), ({39: math.inf}, r"logit_bias\[39\] = inf"), ({39: "100"}, r"logit_bias\[39\] = '100'"),
    ({}, "non-empty dict"), ([(39, 5.0)], "non-empty dict"),
])
def test_openai_judge_refuses_a_bad_logit_bias(bias, named):
    with pytest.raises(ValueError, match=named):
        OpenAIJudge("http://127.0.0.1:9/v1", "m", logit_bias=bias)


def _word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>")


def test_digit_logit_bias_is_the_digits_and_the_end_token():
    pytest.importorskip("transformers")
    tok = _word_tokenizer(["ten", *"9876543210"])  # "9" is id 3 ... "0" is id 12
    assert digit_logit_bias(tok) == {**{12 - i: 100.0 for i in range(10)}, 1: 100.0}
    assert digit_logit_bias(tok, 50, allow_end=False) == {12 - i: 50.0 for i in range(10)}
    with pytest.raises(ValueError, match=r"logit_bias\[12\] = 200"):
        digit_logit_bias(tok, 200)
    with pytest.raises(ValueError, match="digit '7' is not one token.*'\\[UNK\\]'"):  # unknown: one token, the wrong one
        digit_logit_bias(_word_tokenizer(list("012345689")))

    class Split:  # a tokenizer that writes "7" as two tokens
        eos_token_id = None

        def encode(self, text, add_special_tokens=False):
            return [5, 6] if text == "7" else [ord(text)]

        def decode(self, ids):
            return "7" if ids == [5, 6] else "".join(map(chr, ids))

    with pytest.raises(ValueError, match=r"digit '7' is not one token of this tokenizer \(it encodes to \[5, 6\]"):
        digit_logit_bias(Split())
    assert len(digit_logit_bias(_word_tokenizer(list("0123456789")), allow_end=False)) == 10
    tok_no_end = _word_tokenizer(list("0123456789"))
    tok_no_end.eos_token = None
    with pytest.raises(ValueError, match="no eos_token_id"):
        digit_logit_bias(tok_no_end)


def test_reward_model_judge_on_a_local_model():
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

    words = sorted({w for t in tw.make_tasks("train", n=200) for w in (t.messages[0]["content"] + " " + t.reference_answer).split()})
    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, num_labels=1, pad_token_id=1)
    model = Qwen2ForSequenceClassification(cfg).eval()
    judge = RewardModelJudge(model, hf_tok)
    turns = turns_for(TASK)
    a = judge.score(TASK, turns, TASK.reference_answer)
    b = judge.score(TASK, turns, TASK.reference_answer)
    c = judge.score(TASK, turns, "Sorry , no idea .")
    assert 0.0 < a < 1.0 and a == b and a != c
    s = summary_reward(TASK, turns, TASK.reference_answer, judge=judge, judge_weight=1.0)
    assert s.total == pytest.approx(a)
    with pytest.raises(ValueError, match="num_labels"):
        RewardModelJudge(Qwen2ForSequenceClassification(Qwen2Config(**{**cfg.to_dict(), "num_labels": 2})), hf_tok)
