"""Optional judges for the summary tier (off by default).

A judge is any object with ``score(task, turns, final_text) -> float`` in
[0, 1]; :func:`slca.rewards.summary_reward` mixes it in with weight λ. A judge
that cannot score raises :class:`~slca.rewards.execution.Unscorable`, which
turns the summary reward into NaN with the reason logged (never a silent 0).

* :class:`OpenAIJudge` -- an LLM judge behind any OpenAI-compatible endpoint;
  :func:`digit_logit_bias` constrains its reply to a bare 0-10 score.
* :class:`RewardModelJudge` -- a local scalar reward model
  (``AutoModelForSequenceClassification`` with one label): ``sigmoid(logit / T)``.
"""

from __future__ import annotations

import json
import math
import numbers
from collections import Counter
from typing import Any, Protocol

import torch

from slca.env.llm import ChatClient, EndpointError, parse_json_reply
from slca.rewards.common import Unscorable, collect_calls
from slca.types import Task, Turn

__all__ = ["Judge", "OpenAIJudge", "RewardModelJudge", "digit_logit_bias", "judge_messages"]


class Judge(Protocol):
    def score(self, task: Task, turns: list[Turn], final_text: str) -> float: ...


_RUBRIC = (
    "You grade the final answer of a tool-using assistant. Judge only the answer: is every value it states "
    "supported by the tool results, does it answer every part of the request, is it concise? "
    'Reply with JSON only: {"score": <integer 0-10>}.'
)


def judge_messages(task: Task, turns: list[Turn], final_text: str, max_chars: int = 4000) -> list[dict[str, str]]:
    """The chat messages an LLM judge sees: the request, the tool results and the answer."""
    request = "\n".join(m["content"] for m in task.messages if m.get("role") == "user" and isinstance(m.get("content"), str))
    ro = collect_calls(turns)
    results = [{"call": c.name, "arguments": c.arguments, "result": r.content if r.ok else {"error": r.error}} for c, r in zip(ro.calls, ro.results)]
    body = f"Request:\n{request}\n\nTool results:\n{json.dumps(results, ensure_ascii=False)[:max_chars]}\n\nAnswer:\n{final_text}"
    return [{"role": "system", "content": _RUBRIC}, {"role": "user", "content": body}]


LOGIT_BIAS_LIMIT = 100.0
"""OpenAI's documented range for a ``logit_bias`` value: [-100, 100]."""


def _checked_logit_bias(logit_bias: dict[int, float] | None) -> dict[int, float] | None:
    """``logit_bias`` as OpenAI documents it (token id >= 0 -> finite bias in [-100, 100]), or ValueError naming the bad entry."""
    if logit_bias is None:
        return None
    if not isinstance(logit_bias, dict) or not logit_bias:
        raise ValueError(f"logit_bias must be a non-empty dict of token id -> bias (None for no bias), got {logit_bias!r}")
    out: dict[int, float] = {}
    for k, v in logit_bias.items():
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"logit_bias key {k!r} is not a token id (an int >= 0)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > LOGIT_BIAS_LIMIT:
            raise ValueError(f"logit_bias[{k}] = {v!r} is not a finite number in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]")
        out[int(k)] = float(v)
    return out


def digit_logit_bias(tokenizer: Any, bias: float = 100.0, *, allow_end: bool = True) -> dict[int, float]:
    """``logit_bias`` that lets a served model write only digits: its ids of ``"0"`` .. ``"9"`` -> ``bias``.

    With ``allow_end`` (default) the tokenizer's end token (``eos_token_id``, the chat turn's end for an
    instruct model) gets ``bias`` too: otherwise every digit outbids it, and a reply of ``max_tokens=2``
    is always two digits ("77", out of range) where "7" was meant. With ``max_tokens=2`` the reply is then
    one digit or "10" (or an out-of-range pair, which the judge counts as invalid).

    Raises:
        ValueError: a digit is not exactly one token of ``tokenizer`` (that decodes back to it), or
            ``allow_end`` and the tokenizer has no end token.
    """
    out: dict[int, float] = {}
    for d in "0123456789":
        ids = list(tokenizer.encode(d, add_special_tokens=False))
        if len(ids) != 1 or tokenizer.decode(ids) != d:  # an unknown digit is one token too: the unknown token
            raise ValueError(f"digit {d!r} is not one token of this tokenizer (it encodes to {ids}, "
                             f"which decode to {tokenizer.decode(ids)!r}); a logit_bias cannot constrain the reply to digits")
        out[int(ids[0])] = float(bias)
    if allow_end:
        end = getattr(tokenizer, "eos_token_id", None)
        if end is None:
            raise ValueError("the tokenizer has no eos_token_id to end a one-digit reply; pass allow_end=False")
        out[int(end)] = float(bias)
    return _checked_logit_bias(out)


class OpenAIJudge:
    """LLM judge over an OpenAI-compatible chat endpoint; the score is ``reply / 10``.

    HTTP goes through :class:`slca.env.llm.ChatClient`, whose options
    (``api_key``, ``timeout``: a total deadline per request, its retries included,
    ending it within ``timeout + slca.env.llm.DEADLINE_SLACK`` seconds;
    ``http_attempts`` attempts with exponential ``backoff`` up to ``max_backoff``
    while the deadline allows) pass through ``**http``; one score sends at most
    ``max_retries + 1`` requests; ``max_tokens`` (None: the server's default) bounds each reply.
    ``logit_bias`` (None: not sent) goes with every request as OpenAI's ``logit_bias`` (token id -> bias in
    [-100, 100], added to that token's logit; ``transformers serve`` applies it as ``sequence_bias``):
    :func:`digit_logit_bias` with ``max_tokens=2`` makes a small model answer a bare score such as ``7``,
    which is read like ``{"score": 7}``. An unparsable
    or out-of-range reply is asked again ``max_retries`` times. When no score comes, :class:`Unscorable` is raised (the summary reward
    becomes NaN with the reason; the reason names the fault and the redacted URL,
    never the server's body). ``metrics`` counts ``requests``, each fault kind
    (``timeouts``, ``connection_errors``, ``incomplete_responses``,
    ``http_errors``, ``bad_responses``), ``http_retries`` and ``invalid_output``.
    A subclass with another rubric overrides :meth:`messages` (what is sent) and :meth:`read_reply`
    (how a reply gives a score), as :class:`slca.rewards.paper.PaperJudge` does.
    """

    def __init__(self, base_url: str, model: str, *, max_retries: int = 1, temperature: float = 0.0, max_tokens: int | None = None,
                 logit_bias: dict[int, float] | None = None, **http: Any):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_tokens is not None and int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
        self.metrics: Counter[str] = Counter()
        self.client = ChatClient(base_url, metrics=self.metrics, **http)
        self.model, self.max_retries, self.temperature = model, int(max_retries), float(temperature)
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.logit_bias = _checked_logit_bias(logit_bias)
        self._params: dict[str, Any] = {"temperature": self.temperature}  # sent with every request; only what is set
        if self.max_tokens is not None:
            self._params["max_tokens"] = self.max_tokens
        if self.logit_bias is not None:
            self._params["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}  # JSON keys are strings

    def messages(self, task: Task, turns: list[Turn], final_text: str) -> list[dict[str, str]]:
        """The chat messages sent for one score (:func:`judge_messages`); a subclass with another rubric overrides it."""
        return judge_messages(task, turns, final_text)

    def read_reply(self, text: str) -> float:
        """The score in [0, 1] a reply gives: ``{"score": s}`` or a bare ``s`` in 0-10, over 10.

        Raises:
            ValueError: the reply gives no score in range (the message says why; it counts as invalid output).
        """
        try:
            value = parse_json_reply(text)
            s = float(value["score"] if isinstance(value, dict) else value)
        except (ValueError, KeyError, TypeError, OverflowError):
            raise ValueError(f"judge reply is not a score: {self.client.redact(text[:100])!r}") from None
        if not 0.0 <= s <= 10.0:
            raise ValueError(f"judge score {s} outside 0-10")
        return s / 10.0

    def score(self, task: Task, turns: list[Turn], final_text: str) -> float:
        msgs = self.messages(task, turns, final_text)
        last = ""
        for _ in range(self.max_retries + 1):
            try:
                text = self.client.complete(self.model, msgs, **self._params)
            except EndpointError as e:
                raise Unscorable(f"judge endpoint failed: {e}") from None
            try:
                return self.read_reply(text)
            except ValueError as e:
                self.metrics["invalid_output"] += 1
                last = str(e)
        raise Unscorable(last)


class RewardModelJudge:
    """A local scalar reward model as the judge: ``sigmoid(logit / temperature)`` of the conversation.

    Args:
        model: a transformers sequence-classification model with ``num_labels == 1``.
        tokenizer: its tokenizer; its chat template renders the conversation when it has one.
        temperature: logit scale before the sigmoid.
        max_length: tokens kept (from the end).
    """

    def __init__(self, model: Any, tokenizer: Any, *, temperature: float = 1.0, max_length: int = 1024):
        if getattr(model.config, "num_labels", 1) != 1:
            raise ValueError(f"model must have num_labels == 1 (a scalar reward), got {model.config.num_labels}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.model, self.tokenizer, self.temperature, self.max_length = model, tokenizer, float(temperature), int(max_length)

    def text(self, task: Task, turns: list[Turn], final_text: str) -> str:
        msgs = [m for m in task.messages if isinstance(m.get("content"), str)] + [{"role": "assistant", "content": final_text}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(msgs, tokenize=False)
        return "\n".join(f"{m['role']}: {m['content']}" for m in msgs)

    def score(self, task: Task, turns: list[Turn], final_text: str) -> float:
        ids = self.tokenizer(self.text(task, turns, final_text), return_tensors="pt")["input_ids"][:, -self.max_length :]
        device = next(self.model.parameters()).device
        with torch.no_grad():
            logit = self.model(input_ids=ids.to(device)).logits.reshape(-1)[0].float().item()
        if not math.isfinite(logit):
            raise Unscorable(f"reward model returned a non-finite logit {logit}")
        return 1.0 / (1.0 + math.exp(-logit / self.temperature))
