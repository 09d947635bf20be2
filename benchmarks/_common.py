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
GPU = Size(hidden=1024, layers=12, heads=16, kv_heads=4, intermediate=2816)
"""The larger from-scratch Qwen2 of benchmarks/gpu.sh (~150M parameters; run in bf16 on CUDA)."""
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


FILLER = "Let me look up the weather for the cities in the request, two at a time, and then write a summary. "


def script_turns(tok, tool_turns: int = 2, turn_tokens: int | None = None) -> list[list[int]]:
    """Token ids of the scripted assistant turns (each ends with the end-of-turn id).

    ``tool_turns`` turns of two parallel ``get_weather`` calls (city pairs in
    turn), then a summary. ``turn_tokens``: every turn is padded to that many
    tokens with :data:`FILLER` text before the calls (before the summary text),
    for the scaling benchmark; None keeps the turns as they are (the default
    workload: 2 tool turns, 135 tokens in all).
    """
    from slca.chat import get_format
    from slca.types import ToolCall

    fmt = get_format("hermes")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    turns = []
    for k in range(tool_turns):
        pair = CITIES[2 * (k % 2) : 2 * (k % 2) + 2]
        turns.append(fmt.render([ToolCall("get_weather", {"city": c}) for c in pair]))
    facts = ", ".join(f"{c} {json.loads(get_weather(c))['condition']} at {json.loads(get_weather(c))['temperature_c']} C" for c in CITIES)
    turns.append(f"Here is the weather: {facts}. Paris and Lima are the warmest; take a coat in Oslo.")
    out = [tok.encode(t, add_special_tokens=False) + [eot] for t in turns]
    if turn_tokens is not None:
        filler = tok.encode(FILLER * (1 + turn_tokens // 8), add_special_tokens=False)
        sep = tok.encode("\n", add_special_tokens=False)
        out = [(filler[: max(turn_tokens - len(t) - len(sep), 0)] + sep + t) if len(t) < turn_tokens else t for t in out]
    return out


def build_tokenizer(vocab: int = 1000):
    """Byte-level BPE (slca's trainer for the default model) with TRL's Qwen2.5 chat template."""
    from slca.models import import_recipe

    train_tokenizer = import_recipe().train_tokenizer  # recipes/warmstart of this checkout
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


class ScriptedMixin:
    """A real causal LM whose *sampling* passes follow a script; training passes are untouched.

    In a forward pass with gradients disabled (generation), after the full model
    computes its logits, the logits at each row's last fed token are replaced:

    * no script: the stop tokens (end of turn, eos, padding) get ``-inf``, so every
      completion runs to its token budget;
    * a script (a list of assistant turns as token ids): all mass goes to token
      ``p`` of turn ``k``, where the row's next position is ``p`` tokens after the
      ``k``-th ``<|im_start|>assistant\n`` header seen since the cache was empty.

    The header positions are kept per batch, not per row, because every prompt of
    a workload has the same length (checked in :func:`tasks`) and the script is
    the same for all rows: a row's position alone says where it is in the
    conversation. So Hugging Face ``generate``, TRL's tool loop (one prefill per
    turn) and slca's engine (one cache; rows shared, reordered or parked) all
    sample the same sequences.
    """

    def configure(self, tok, script: list[list[int]] | None = None) -> "ScriptedMixin":
        self._stop = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        self._start = tok.convert_tokens_to_ids("<|im_start|>")
        self._header = tok.encode("assistant\n", add_special_tokens=False)
        self._script = None
        if script is not None:
            L = max(len(t) for t in script)
            table = torch.full((len(script), L + 1), self._stop[0], dtype=torch.long)
            for k, t in enumerate(script):
                table[k, : len(t)] = torch.tensor(t)
            self._script = table
        self._turn_starts: set[int] = set()
        return self

    def forward(self, *args, **kwargs):
        att, cache = kwargs.get("attention_mask"), kwargs.get("cache", kwargs.get("past_key_values"))
        ids = kwargs.get("input_ids", args[0] if args else None)
        past = 0 if cache is None else cache.get_seq_length()
        out = super().forward(*args, **kwargs)
        if torch.is_grad_enabled() or getattr(self, "_stop", None) is None:
            return out
        logits = out.logits  # (B, W or 1, V)
        B, W = ids.shape
        valid = att[:, -W:].bool() if att is not None else torch.ones_like(ids, dtype=torch.bool)
        ar = torch.arange(W, device=ids.device)
        col = torch.where(valid, ar, -1).amax(1).clamp_min(0)  # (B,) each row's last fed token
        lcol = col if logits.shape[1] == W else torch.full_like(col, logits.shape[1] - 1)
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = (att.cumsum(-1) - 1)[:, -W:] if att is not None else (past + ar).expand(B, W)
        fresh = (att.shape[1] == W) if att is not None else past == 0
        rows = torch.arange(B, device=ids.device)
        logits[rows, lcol] = self.slca_rollout_logits(logits[rows, lcol], ids, valid, pos, fresh)
        return out

    def slca_rollout_logits(self, logits, input_ids, valid, position_ids, fresh):
        """The script applied to (B, V) logits at each row's last valid token of a fed chunk.

        Called by :meth:`forward` (transformers ``generate``, TRL, slca's plain
        engine) and, under this name, by slca's fast decode path
        (:mod:`slca.generation.fastpath`), so both sides sample the same script.
        """
        if getattr(self, "_stop", None) is None:
            return logits
        logits = logits.clone()
        ids, valid, pos = input_ids, valid, position_ids
        B, W = ids.shape
        ar = torch.arange(W, device=ids.device)
        col = torch.where(valid, ar, -1).amax(1).clamp_min(0)  # (B,) each row's last fed token
        rows = torch.arange(B, device=ids.device)
        if self._script is None:
            logits[:, torch.tensor(self._stop, device=logits.device)] = float("-inf")
            return logits
        if fresh:
            self._turn_starts = set()
        h = len(self._header)
        for b, j in torch.nonzero((ids == self._start) & valid).tolist():
            if ids[b, j + 1 : j + 1 + h].tolist() == self._header:
                self._turn_starts.add(int(pos[b, j]) + 1 + h)
        starts = torch.tensor(sorted(self._turn_starts) or [0], device=ids.device)
        script = self._script.to(ids.device)
        q = pos[rows, col] + 1  # (B,) position of the token to sample
        k = (torch.searchsorted(starts, q, right=True) - 1).clamp(0, script.shape[0] - 1)
        p = (q - starts[k]).clamp(0, script.shape[1] - 1)
        forced = torch.full((B, logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device)
        forced[rows, script[k, p]] = 0.0
        return forced


def _scripted(base: type) -> type:
    """``Scripted<base>``: :class:`ScriptedMixin` over ``base``, its ``forward`` signed as ``base.forward`` (TRL reads it)."""

    def forward(self, *args, **kwargs):
        return ScriptedMixin.forward(self, *args, **kwargs)

    forward.__signature__ = inspect.signature(base.forward)
    return type(f"Scripted{base.__name__}", (ScriptedMixin, base), {"forward": forward, "__module__": __name__})


ScriptedQwen2ForCausalLM = _scripted(Qwen2ForCausalLM)
"""The random Qwen2 of the default workloads, scripted."""


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


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer with slca's tool-calling template (the ``smollm2`` extra; converted once)."""
    from transformers import AutoTokenizer

    from slca.models.smollm2 import prepare_smollm2_tokenizer, smollm2_dir

    return prepare_smollm2_tokenizer(AutoTokenizer.from_pretrained(smollm2_dir(progress=True)))


def build_smollm2(tok, size: Size, script: list[list[int]] | None = None, seed: int = 0):
    """SmolLM2-135M-Instruct (pretrained weights, float32) with the workload's script: the same work as
    :func:`build_model` at 135M parameters (``size``'s architecture fields do not apply)."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from slca.models.smollm2 import smollm2_dir

    hf_logging.disable_progress_bar()  # "Loading weights" bars would split the table's rows
    cls = _scripted(LlamaForCausalLM)
    model = cls.from_pretrained(smollm2_dir(), dtype=torch.float32).configure(tok, script)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def tasks(n: int, multi: bool):
    """slca Tasks of a workload (the same prompts the TRL dataset gets)."""
    from slca.types import Task, ToolCall

    out = []
    if multi and len({len(user_prompt(i, multi)) for i in range(n)}) != 1:
        raise ValueError(f"n={n}: the prompts must have one length (the scripted policy relies on it); use n <= 10")
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


def sync() -> None:
    """Wait for queued CUDA work, so wall-clock sections end when the work does."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Clock:
    """Wall and process-CPU seconds of timed sections.

    On a shared machine wall time depends on what else runs; the CPU seconds this
    process spent (``time.process_time``, all its threads) depend much less on it,
    so comparisons are made on both. With one thread, CPU time ~ the time the
    work would take on an idle core.
    """

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        sync()
        w, c = time.perf_counter(), time.process_time()
        yield
        sync()
        self.wall.append(time.perf_counter() - w)
        self.cpu.append(time.process_time() - c)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    """``median [min-max]`` in seconds."""
    if not xs:
        return "n/a"
    return f"{med(xs):.3f} [{min(xs):.2f}-{max(xs):.2f}]"


def time_call(fn: Callable[[], object], repeats: int, warmup: int = 1) -> Clock:
    for _ in range(warmup):
        fn()
    clock = Clock()
    for _ in range(repeats):
        with clock():
            fn()
    return clock


def load() -> float:
    """The 1-minute load average (NaN where the OS does not report it)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
            f"load average {load[0]:.1f} (other processes share these cores: figures are noisy)")


def header(title: str, args) -> None:
    print(f"== {title}")
    print(f"   machine: {machine()}")
    print(f"   args: {vars(args)}")
