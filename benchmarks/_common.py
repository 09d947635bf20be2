"""Shared pieces of the benchmark scripts: the workloads, the scripted policy, timing helpers.

Workloads (both sides of every comparison get exactly these):

* ``single``: 8 prompts x 4 generations, completions of exactly 128 tokens
  (end-of-turn and eos suppressed while sampling), one optimisation pass, beta 0,
  loss dapo / token_mean.
* ``multi``: the same batch shape, each rollout two tool turns with two parallel
  ``get_weather`` calls each, then a summary turn. A random model never writes a
  parseable call, so :class:`ScriptedQwen2ForCausalLM` runs the full Qwen2 forward
  and then, only in no-grad passes (sampling), puts all probability on the next
  token of a fixed script. The compute per token is the real model's; training
  forwards (grad enabled) see the unmodified logits.

The policy is a random ``Qwen2ForCausalLM`` (hidden 256, 4 layers, 4 heads /
2 KV heads, SwiGLU 1024, tied embeddings) over a byte-level BPE vocabulary of
1,000 trained here, with TRL's Qwen2.5 chat template (so TRL's tool loop parses
the calls with its own response parser). Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

CITIES = ("Paris", "Rome", "Oslo", "Lima")
CALLS_PER_TURN = 2


@dataclass(frozen=True)
class Size:
    """Architecture and batch of a benchmark run."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 1024
    vocab: int = 1000
    prompts: int = 8
    generations: int = 4
    completion_tokens: int = 128


FULL = Size()
TINY = Size(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=400, prompts=2, generations=2, completion_tokens=8)


def get_weather(city: str) -> str:
    """Get the current weather of a city.

    Args:
        city: The city name.
    """
    t = 10 + sum(map(ord, city)) % 20
    return json.dumps({"city": city, "condition": "sunny" if t % 2 else "cloudy", "temperature_c": t})


def weather_tool_schema() -> dict:
    from transformers.utils import get_json_schema

    return get_json_schema(get_weather)


def user_prompt(i: int, multi: bool) -> str:
    if multi:
        return f"Request {i}: what is the weather in {', '.join(CITIES)}? Check two cities at a time, then summarise."
    return f"Request {i}: write a short story about the weather in {CITIES[i % len(CITIES)]}."


def script_turns(tok) -> list[list[int]]:
    """Token ids of the three scripted assistant turns (each ends with the end-of-turn id)."""
    from slca.chat import get_format
    from slca.types import ToolCall

    fmt = get_format("hermes")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    turns = []
    for k in range(2):
        calls = [ToolCall("get_weather", {"city": c}) for c in CITIES[2 * k : 2 * k + 2]]
        turns.append(fmt.render(calls))
    facts = ", ".join(f"{c} {json.loads(get_weather(c))['condition']} at {json.loads(get_weather(c))['temperature_c']} C" for c in CITIES)
    turns.append(f"Here is the weather: {facts}. Paris and Lima are the warmest; take a coat in Oslo.")
    return [tok.encode(t, add_special_tokens=False) + [eot] for t in turns]


def build_tokenizer(vocab: int = 1000):
    """Byte-level BPE (slca's trainer for the default model) with TRL's Qwen2.5 chat template."""
    from slca.models.tokenizer import train_tokenizer

    schema = weather_tool_schema()
    texts = []
    for i in range(64):
        for multi in (False, True):
            texts.append(user_prompt(i, multi))
    texts += [get_weather(c) for c in CITIES] * 20
    texts += [json.dumps(schema)] * 20
    texts += ["You are Qwen, created by Alibaba Cloud. You are a helpful assistant. # Tools You may call one or more functions "
              "to assist with the user query. function signatures within <tools></tools> XML tags"] * 20
    texts += ['{"name": "get_weather", "arguments": {"city": "%s"}}' % c for c in CITIES] * 20
    texts += ["Here is the weather: Paris sunny at 21 C. Paris and Lima are the warmest; take a coat in Oslo."] * 20
    g = torch.Generator().manual_seed(0)  # filler words, so BPE reaches the requested vocabulary size
    letters = "abcdefghijklmnopqrstuvwxyz"
    for _ in range(400):
        n = torch.randint(2, 9, (12,), generator=g).tolist()
        texts.append(" ".join("".join(letters[i] for i in torch.randint(0, 26, (k,), generator=g).tolist()) for k in n))
    tok = train_tokenizer(texts, vocab_size=vocab, min_frequency=1)
    try:
        from trl.chat_template_utils import qwen2_5_chat_template

        tok.chat_template = qwen2_5_chat_template
    except ImportError:  # without TRL the project's own Qwen2.5-style template serves the slca side
        pass
    return tok


class ScriptedQwen2ForCausalLM(Qwen2ForCausalLM):
    """A real Qwen2 whose *sampling* passes follow a script; training passes are untouched.

    In a forward pass with gradients disabled (generation), after the full model
    computes its logits, the logits at each row's last fed token are replaced:

    * no script: the stop tokens (end of turn, eos, padding) get ``-inf``, so every
      completion runs to its token budget;
    * a script (a list of assistant turns as token ids): all mass goes to the next
      token of turn ``k`` at position ``p``, with ``k`` = tool responses seen so far
      / calls per turn and ``p`` = tokens since the last ``<|im_start|>assistant\\n``.

    Both are pure functions of the tokens a row has been fed, tracked from the
    attention mask (an empty cache resets them), so Hugging Face ``generate``,
    TRL's tool loop and slca's rollout engine all sample the same sequences.
    """

    def configure(self, tok, script: list[list[int]] | None = None) -> "ScriptedQwen2ForCausalLM":
        self._stop = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        self._start = tok.convert_tokens_to_ids("<|im_start|>")
        self._marker = tok.convert_tokens_to_ids("<tool_response>")
        self._header = len(tok.encode("assistant\n", add_special_tokens=False))
        self._script = None
        if script is not None:
            L = max(len(t) for t in script)
            table = torch.full((len(script), L + 1), self._stop[0], dtype=torch.long)
            for k, t in enumerate(script):
                table[k, : len(t)] = torch.tensor(t)
            self._script = table
        self._marks = self._since = None
        return self

    def forward(self, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        fresh = cache is None or cache.get_seq_length() == 0
        out = super().forward(*args, **kwargs)
        if torch.is_grad_enabled() or getattr(self, "_stop", None) is None:
            return out
        ids = kwargs.get("input_ids", args[0] if args else None)
        att = kwargs.get("attention_mask")
        logits = out.logits  # (B, W or 1, V)
        B, W = ids.shape
        valid = att[:, -W:].bool() if att is not None else torch.ones_like(ids, dtype=torch.bool)
        ar = torch.arange(W, device=ids.device)
        if logits.shape[1] == W:
            col = torch.where(valid, ar, -1).amax(1).clamp_min(0)  # (B,) each row's last fed token
        else:
            col = torch.full((B,), logits.shape[1] - 1, device=ids.device)
        rows = torch.arange(B, device=ids.device)
        if self._script is None:
            logits[rows[:, None], col[:, None], torch.tensor(self._stop)[None, :]] = float("-inf")
            return out
        if fresh or self._marks is None or self._marks.shape[0] != B:
            self._marks = torch.zeros(B, dtype=torch.long)
            self._since = torch.zeros(B, dtype=torch.long)
        is_start = (ids == self._start) & valid
        self._marks += ((ids == self._marker) & valid).sum(1)
        cum = valid.long().cumsum(1)
        last_start = torch.where(is_start, ar, -1).amax(1)
        after = cum[:, -1] - cum.gather(1, last_start.clamp_min(0)[:, None]).squeeze(1)
        self._since = torch.where(is_start.any(1), after, self._since + cum[:, -1])
        k = (self._marks // CALLS_PER_TURN).clamp_max(self._script.shape[0] - 1)
        p = (self._since - self._header).clamp(0, self._script.shape[1] - 1)
        nxt = self._script[k, p]  # (B,)
        forced = torch.full((B, logits.shape[-1]), float("-inf"), dtype=logits.dtype)
        forced[rows, nxt] = 0.0
        logits[rows, col] = forced
        return out


ScriptedQwen2ForCausalLM.forward.__signature__ = inspect.signature(Qwen2ForCausalLM.forward)


def build_model(tok, size: Size, script: list[list[int]] | None = None, seed: int = 0) -> ScriptedQwen2ForCausalLM:
    """The random policy of ``size`` for ``tok`` (tied embeddings, eos = end of turn)."""
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = ScriptedQwen2ForCausalLM(cfg).configure(tok, script)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    return model


def tasks(n: int, multi: bool):
    """slca Tasks of a workload (the same prompts the TRL dataset gets)."""
    from slca.types import Task, ToolCall

    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": user_prompt(i, multi)}]
        if multi:
            gold = [[ToolCall("get_weather", {"city": c}) for c in CITIES[:2]], [ToolCall("get_weather", {"city": c}) for c in CITIES[2:]]]
            facts = [json.loads(get_weather(c))["condition"] for c in CITIES]
            out.append(Task(id=f"bench-{i}", messages=msgs, tools=[weather_tool_schema()], gold=gold, kind="parallel", answer_facts=facts))
        else:
            out.append(Task(id=f"bench-{i}", messages=msgs, tools=[], kind="no_tool"))
    return out


def make_env(task):
    from slca.env import PythonSimulator

    return PythonSimulator(task.tools, {"get_weather": get_weather})


# --------------------------------------------------------------------------- measurement


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def parse_threads(s: str) -> list[int]:
    out = [int(x) for x in s.split(",") if x.strip()]
    if not out or any(t < 1 for t in out):
        raise ValueError(f"--threads must be a comma-separated list of positive ints, got {s!r}")
    return out


@contextlib.contextmanager
def timer(out: list[float]) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    out.append(time.perf_counter() - t0)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    """``median [min-max]`` in seconds."""
    if not xs:
        return "n/a"
    return f"{med(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def time_call(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    ts: list[float] = []
    for _ in range(repeats):
        with timer(ts):
            fn()
    return ts


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
            f"load average {load[0]:.1f} (other processes share these cores: figures are noisy)")


def header(title: str, args) -> None:
    print(f"== {title}")
    print(f"   machine: {machine()}")
    print(f"   args: {vars(args)}")
