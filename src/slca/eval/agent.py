"""The policy under evaluation as a tool-calling agent.

:class:`PolicyAgent` turns a Hugging Face causal LM with a chat template into an
agent: given conversations (OpenAI-style messages and the tool schemas on
offer) it renders each one with the tokenizer's chat template, generates the
next assistant turn for all of them in left-padded batches, and parses every
turn with a tool-call format from :mod:`slca.chat` (``hermes`` by default).

Every suite drives the same agent through :func:`drive`: each *episode* (one
rollout of one benchmark record) exposes its conversation so far and takes the
agent's turn; episodes that finish drop out of the batch.

The raw generated text of an assistant turn goes back into the conversation as
the assistant message's ``content``: the model sees exactly what it wrote,
whatever the format, and Qwen-style templates stay prefix-preserving.

A prompt longer than the model's positions (``max_position_embeddings``) less
``max_new_tokens`` is cut to its last tokens (its start, where the system
prompt and the tool list are, is lost); the turn says so (``truncated``) and
suites count the records it happened to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch
from rich.progress import Progress

from slca.chat import ChatRenderer, get_format
from slca.generation.batching import pad
from slca.generation.rollout import MAX_NEW_TOKENS_FIELD, TEMPERATURE_FIELD, Sampling, stop_token_ids
from slca.types import ParsedTurn

__all__ = ["GenerationConfig", "AgentTurn", "PolicyAgent", "Episode", "drive"]

Message = dict[str, Any]


@dataclass(kw_only=True)
class GenerationConfig(Sampling):
    """How the agent samples one assistant turn: :class:`slca.generation.rollout.Sampling` (``max_new_tokens``,
    ``temperature``, ``top_p``, ``seed``; declared and checked there, as for rollouts) with ``slca eval``'s
    defaults (256 tokens, greedy), and the batch size. Keyword arguments only.

    ``seed`` seeds torch's generator once when the agent is built; a temperature > 0 is needed for
    pass^k with K > 1 samples."""

    max_new_tokens: MAX_NEW_TOKENS_FIELD = 256
    temperature: TEMPERATURE_FIELD = 0.0
    batch_size: int = 8
    """Conversations generated together (left-padded)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"GenerationConfig.batch_size must be a positive int, got {self.batch_size!r}")


@dataclass
class AgentTurn:
    """One generated assistant turn: the raw text and its parse."""

    text: str
    parsed: ParsedTurn
    truncated: bool = False
    """Whether the prompt was cut to the model's positions (:attr:`PolicyAgent.max_prompt_tokens`)."""


class PolicyAgent:
    """A Hugging Face causal LM plus a tool-call format, acting on conversations.

    Args:
        model: a ``transformers`` causal LM (``generate`` is used).
        tokenizer: its tokenizer; needs a chat template (or ``chat_template``).
        format: a :func:`slca.chat.get_format` name (``hermes``, ``json_list``, ...).
        gen: sampling settings.
        chat_template: a Jinja template overriding the tokenizer's.
    """

    def __init__(self, model, tokenizer, format: str = "hermes", gen: GenerationConfig | None = None, *, chat_template: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.format_name = format
        self.format = get_format(format)
        self.gen = gen or GenerationConfig()
        self.chat_template = chat_template
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template; pass chat_template= (a Jinja template)")
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("tokenizer needs a pad_token or an eos_token for batched generation")
        self._stop_ids = self._stop_token_ids()
        self._generator_seeded = False
        self.generated_tokens = 0
        self.max_positions: int | None = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_prompt_tokens: int | None = None if self.max_positions is None else self.max_positions - self.gen.max_new_tokens
        """Longest prompt the model can take with room for ``max_new_tokens`` (None: no known limit)."""
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_new_tokens={self.gen.max_new_tokens} leaves no room for a prompt in the model's {self.max_positions} positions")
        self.last_truncated: list[bool] = []
        """For the last :meth:`generate` call: which prompts were cut."""

    def prompt_limit(self) -> str:
        """:attr:`max_prompt_tokens` in words, e.g. ``1,016 tokens (1,024 positions less 8 new tokens)`` ('' when there is no known limit)."""
        if self.max_prompt_tokens is None:
            return ""
        return f"{self.max_prompt_tokens:,} tokens ({self.max_positions:,} positions less {self.gen.max_new_tokens} new tokens)"

    def _stop_token_ids(self) -> list[int]:
        """The rollouts' rule (:func:`slca.generation.rollout.stop_token_ids`): the chat template's end-of-turn token and the eos tokens."""
        eot = ChatRenderer(self.tokenizer, chat_template=self.chat_template).end_of_turn_id()
        return stop_token_ids(self.tokenizer, self.model, eot)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the conversation followed by the assistant generation prompt."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False, chat_template=self.chat_template
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def generate(self, conversations: Sequence[tuple[list[Message], list[dict[str, Any]] | None]]) -> list[str]:
        """Generate the next assistant turn of every conversation.

        Args:
            conversations: ``(messages, tools)`` pairs; ``tools`` are OpenAI tool schemas or None.

        Returns:
            One decoded string per conversation (special tokens such as
            ``<|im_end|>`` removed; added tokens such as ``<tool_call>`` kept).
            Prompts over :attr:`max_prompt_tokens` keep their last tokens
            (:attr:`last_truncated` says which).
        """
        if not self._generator_seeded:
            torch.manual_seed(self.gen.seed)
            self._generator_seeded = True
        prompts = [self.prompt_ids(m, t) for m, t in conversations]
        limit = self.max_prompt_tokens
        self.last_truncated = [limit is not None and len(p) > limit for p in prompts]
        prompts = [p[-limit:] if cut else p for p, cut in zip(prompts, self.last_truncated)]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[str] = [""] * len(prompts)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        device = next(self.model.parameters()).device
        bs = self.gen.batch_size
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            ids, att = pad([prompts[i] for i in idx], pad_id, left=True)  # (b, W) left-padded
            width = ids.shape[1]
            sample = self.gen.temperature > 0
            kwargs: dict[str, Any] = dict(
                max_new_tokens=self.gen.max_new_tokens,
                do_sample=sample,
                pad_token_id=pad_id,
                eos_token_id=self._stop_ids,
            )
            if sample:
                kwargs.update(temperature=self.gen.temperature, top_p=self.gen.top_p, top_k=0)
            else:
                kwargs.update(temperature=None, top_p=None, top_k=None)
            seqs = self.model.generate(input_ids=ids.to(device), attention_mask=att.to(device), **kwargs)
            new = seqs[:, width:].cpu()  # (b, <= max_new_tokens)
            for row, i in enumerate(idx):
                toks = new[row].tolist()
                n = len(toks)
                for j, t in enumerate(toks):
                    if t in self._stop_ids:
                        n = j
                        break
                self.generated_tokens += n
                out[i] = self.tokenizer.decode(toks[:n], skip_special_tokens=True)
        return out

    def act(self, conversations: Sequence[tuple[list[Message], list[dict[str, Any]] | None]]) -> list[AgentTurn]:
        """:meth:`generate`, then parse each turn with the agent's tool-call format."""
        texts = self.generate(conversations)
        return [AgentTurn(text=t, parsed=self.format.parse(t), truncated=cut) for t, cut in zip(texts, self.last_truncated)]


class Episode(Protocol):
    """One rollout of one record, stepped by :func:`drive`."""

    done: bool

    def conversation(self) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """The messages so far and the tools on offer."""
        ...

    def step(self, turn: AgentTurn) -> None:
        """Take the agent's turn: run its calls, append answers, maybe finish."""
        ...


def drive(agent: PolicyAgent, episodes: Sequence[Episode], *, desc: str = "rollouts", progress: bool = True) -> None:
    """Step all episodes with batched agent turns until every one is done."""
    active = [e for e in episodes if not e.done]
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task(desc, total=len(episodes), completed=len(episodes) - len(active))
        while active:
            turns = agent.act([e.conversation() for e in active])
            for e, t in zip(active, turns):
                e.step(t)
            still = [e for e in active if not e.done]
            bar.advance(task, len(active) - len(still))
            active = still
