"""Batched multi-turn rollouts against a tool simulator, with exact token-level trajectories.

All ``B = len(tasks) * group_size`` rollouts advance together: one forward pass
of the whole batch per generated token, with one KV cache for the whole
rollout (no re-prefill between turns). Per turn:

1. every active row samples until its end-of-turn token (the template's, e.g.
   ``<|im_end|>``), an eos token, or its token budget; rows that finished wait,
   masked out of the batch's attention (their cache slots are invalid);
2. each finished turn is parsed with the configured tool-call format; a turn
   without an attempted call is the final answer; otherwise each call goes to the
   task's simulator and each blocking parse error gets an error tool message
   (so a malformed call is answered, never an exception);
3. the tool messages are appended as environment tokens: exactly the template's
   text between the assistant's end-of-turn token and the next generation point
   (:meth:`slca.chat.ChatRenderer.environment_text`), fed to the cache in one
   chunk per turn for all continuing rows.

Rows of different lengths share the cache through holes: every forward pass
appends columns for all rows, a row's column is valid only if it carries one of
its tokens, and ``position_ids`` count each row's valid tokens, so a row's
positions are exactly those of its own sequence fed alone (``0 .. n-1``). The
cache lives in :mod:`slca.generation.kvcache` (over the transformers forward) and
:mod:`slca.generation.fastpath` (a fused decoder); this module is the turn protocol.

Speed: a group's shared prompt is prefilled once and its cache copied G times;
the cache grows into preallocated buffers (no per-token concatenation); rows
that finished their turn are parked out of the batch once half of it waits, and
merged back for the next turn; finished rollouts leave the batch. What remains
turn-synchronous: a turn of the batch lasts as long as its longest row.

Logprobs: ``Trajectory.logprobs[t]`` is ``log softmax(logits / T)[token]``, the
temperature-scaled distribution the token was sampled from, *before* top-p
truncation (with ``top_p == 1`` it is the sampling distribution exactly); with
``temperature == 0`` (greedy) it is ``log softmax(logits)``. Re-scoring the
trajectory's tokens in one forward pass at the same temperature gives the same
numbers (see :func:`trajectory_logprobs`); this is the ``old_logprobs`` the
PPO / GRPO ratio needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Annotated, Any, Callable, Sequence

import torch

from slca._fields import check_value, ge, gt, hints, within
from slca.chat import ChatRenderer, ToolCallFormat, get_format
from slca.generation.batching import collate, response_logprobs
from slca.types import ParsedTurn, Task, ToolResult, Trajectory, Turn

if TYPE_CHECKING:
    from slca.env.simulators import Simulator
    from slca.generation.kvcache import KVBatch

__all__ = [
    "stop_token_ids",
    "MAX_NEW_TOKENS_FIELD",
    "TEMPERATURE_FIELD",
    "TOP_P_FIELD",
    "Sampling",
    "RolloutConfig",
    "RolloutResult",
    "generate_rollouts",
    "trajectory_logprobs",
    "sample_tokens",
    "assistant_message",
    "answer_turn",
]


MAX_NEW_TOKENS_FIELD = Annotated[int, gt(0)]
"""The annotation (type and check) of every ``max_new_tokens`` setting: :class:`Sampling`'s and ``TrainConfig``'s."""
TEMPERATURE_FIELD = Annotated[float, ge(0)]
"""The annotation of every sampling temperature (0 = greedy): :class:`Sampling`'s and ``TrainConfig.eval_temperature``'s.
``TrainConfig.temperature`` is stricter (> 0: the update's log-probs are taken at that temperature)."""
TOP_P_FIELD = Annotated[float, within(0, 1, lo_open=True)]
"""The annotation of every nucleus mass ``top_p``: :class:`Sampling`'s and ``TrainConfig``'s."""


@dataclass(kw_only=True)
class Sampling:
    """How one assistant turn is sampled: the settings rollouts (:class:`RolloutConfig`) and ``slca eval``'s
    agent (:class:`slca.eval.agent.GenerationConfig`) share, declared here once and checked once (against
    the ``*_FIELD`` annotations, which ``TrainConfig``'s fields of the same names use too)."""

    max_new_tokens: MAX_NEW_TOKENS_FIELD = 128
    """Tokens per assistant turn; a turn that reaches it without an end-of-turn token stops (a rollout with
    ``max_tokens``; in ``slca eval`` the turn is parsed as it is)."""
    temperature: TEMPERATURE_FIELD = 1.0
    """Sampling temperature; 0 means greedy. Rollouts record their logprobs at this temperature."""
    top_p: TOP_P_FIELD = 1.0
    """Nucleus sampling mass (1 = off; ignored when greedy). Recorded logprobs are before truncation."""
    seed: int = 0
    """Seed of the sampling generator: same seed, model and tasks -> same rollouts."""

    def __post_init__(self) -> None:
        for f in fields(Sampling):
            value, problem = check_value(getattr(self, f.name), _SAMPLING_HINTS[f.name])
            if problem:
                raise ValueError(f"{type(self).__name__}.{f.name} {problem}")
            setattr(self, f.name, value)


_SAMPLING_HINTS = hints(Sampling)


@dataclass(kw_only=True)
class RolloutConfig(Sampling):
    """How rollouts are sampled: :class:`Sampling` (``max_new_tokens``, ``temperature``, ``top_p``, ``seed``)
    and the rollout's own settings. Keyword arguments only."""

    group_size: int = 4
    """G: rollouts per task (the GRPO group)."""
    max_turns: int = 4
    """Assistant turns per rollout; a rollout whose last allowed turn still calls tools stops with ``max_turns``."""
    max_total_tokens: int = 1024
    """Prompt + response tokens per rollout; generation never goes past it (the last turn's environment tokens may)."""
    format: str = "hermes"
    """Tool-call format the model writes (:func:`slca.chat.get_format`)."""
    chat_template: str | None = None
    """A chat template to use instead of ``tokenizer.chat_template`` (e.g. a prefix-preserving training template)."""
    fast_decode: bool = True
    """Run supported models (stock Qwen2 / Llama) through :mod:`slca.generation.fastpath` (fused projections, one static
    KV buffer): same sampled tokens, logprobs within 1e-5 of the transformers forward (tested); other models,
    or False, use the transformers forward."""

    @classmethod
    def of(cls, sampling: Sampling, **settings: Any) -> RolloutConfig:
        """Rollouts sampled as ``sampling`` says (its :class:`Sampling` fields: e.g. an agent's
        :class:`~slca.eval.agent.GenerationConfig`), with the rollout's own ``settings``."""
        return cls(**{f.name: getattr(sampling, f.name) for f in fields(Sampling)}, **settings)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("group_size", "max_turns", "max_total_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"RolloutConfig.{name} must be a positive int, got {v!r}")
        get_format(self.format)


@dataclass
class RolloutResult:
    """Trajectories (task-major: task 0's G samples first) and generation speed."""

    trajectories: list[Trajectory]
    gen_tokens: int
    """Policy tokens sampled."""
    gen_seconds: float
    """Wall time of the whole call (prefill, decoding, parsing, simulator calls)."""

    @property
    def tokens_per_second(self) -> float:
        return self.gen_tokens / max(self.gen_seconds, 1e-9)


@dataclass
class _Row:
    """Mutable state of one rollout while it is generated."""

    task_index: int
    episode: int
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_text: str = ""
    stop_reason: str | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Args:
        logits: (B, V) next-token logits.
        temperature: > 0 samples from ``softmax(logits / temperature)``; 0 is greedy.
        top_p: nucleus mass; the smallest set of most likely tokens whose mass reaches it.
        generator: torch generator on ``logits.device`` (seeded by the caller).

    Returns:
        ``(tokens, logprobs)``, each (B,): the sampled ids and
        ``log softmax(logits / temperature)`` at them (before top-p truncation;
        ``log softmax(logits)`` when greedy).
    """
    logits = logits.float()
    if temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)  # (B, V)
    probs = logp.exp()
    if top_p < 1.0:
        sp, idx = probs.sort(dim=-1, descending=True)
        # drop a token when the mass of the more likely ones already reaches top_p
        sp = sp.masked_fill(sp.cumsum(dim=-1) - sp >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sp)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _new_batch(model: torch.nn.Module, batch_size: int, pad_id: int, fast: bool, prompt_len: int) -> KVBatch:
    """The engine's KV-cache batch: :class:`slca.generation.fastpath.FastBatch` when ``fast`` and the model is supported,
    else :class:`slca.generation.kvcache.CacheBatch` (the transformers forward)."""
    device = next(model.parameters()).device
    if fast:
        from slca.generation.fastpath import make_batch

        b = make_batch(model, batch_size, pad_id, device, capacity=prompt_len + 256)
        if b is not None:
            return b
    from slca.generation.kvcache import CacheBatch

    return CacheBatch(model, batch_size, pad_id, device)


def _prefill(model: torch.nn.Module, prompts: list[list[int]], group_size: int, pad_id: int, fast: bool) -> tuple[KVBatch, torch.Tensor]:
    """A batch holding each prompt ``group_size`` times, and the (B, V) next-token logits of its rows.

    A group shares its prompt: it is prefilled once per task, then the cache is copied G times.
    """
    batch = _new_batch(model, len(prompts), pad_id, fast, max(len(p) for p in prompts))
    logits = batch.feed_lists(prompts)
    if group_size > 1:
        batch.expand(group_size)
        logits = logits.repeat_interleave(group_size, dim=0)
    return batch, logits


def assistant_message(text: str, parsed: ParsedTurn) -> dict[str, Any]:
    """The assistant message of a turn (OpenAI style). A turn with a blocking parse
    error keeps its raw text as content, so replaying the messages reproduces it."""
    if parsed.blocking_errors:
        return {"role": "assistant", "content": text}
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        msg["tool_calls"] = [c.to_openai(i) for i, c in enumerate(parsed.calls)]
    if parsed.reasoning is not None:
        msg["reasoning_content"] = parsed.reasoning
    return msg


def answer_turn(parsed: ParsedTurn, env: Any, episode: int | str = 0) -> tuple[list[ToolResult], list[dict[str, Any]]]:
    """The environment's answer to a tool turn: ``(results, tool messages)``.

    One result per call (``env.call(name, arguments, episode=episode)``), then one
    ``ToolResult(ok=False)`` per blocking parse error, so a malformed call is
    answered like a failed one. Messages are ``role: "tool"`` with
    ``ToolResult.to_text()`` content, in the same order.
    """
    results: list[ToolResult] = []
    msgs: list[dict[str, Any]] = []
    for i, c in enumerate(parsed.calls):
        r = env.call(c.name, dict(c.arguments), episode=episode)
        if not isinstance(r, ToolResult):
            raise TypeError(f"simulator {type(env).__name__}.call returned {type(r).__name__}, expected ToolResult")
        results.append(r)
        msgs.append({"role": "tool", "tool_call_id": c.id or f"call_{i}", "name": c.name, "content": r.to_text()})
    for e in parsed.blocking_errors:
        r = ToolResult(ok=False, error=f"could not parse your tool call ({e.kind}): {e.message}")
        results.append(r)
        msgs.append({"role": "tool", "content": r.to_text()})
    return results, msgs


def stop_token_ids(tokenizer: Any, model: torch.nn.Module, end_of_turn_id: int) -> list[int]:
    """The tokens that end a sampled turn (sorted): the chat template's end-of-turn token
    (:meth:`slca.chat.ChatRenderer.end_of_turn_id`) and every eos token of the tokenizer and of the
    model's generation config. One rule for rollouts and for evaluation (:class:`slca.eval.agent.PolicyAgent`)."""
    ids: set[int] = {int(end_of_turn_id)}
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return sorted(ids)


@dataclass
class _Turns:
    """The agent/environment turn protocol of one :func:`generate_rollouts` call: how a sampled turn is read,
    whether it ends the rollout, and how the environment answers it."""

    tokenizer: Any
    fmt: ToolCallFormat
    renderers: list[ChatRenderer]  # per task
    envs: list[Simulator]  # per task
    eot_id: int  # the template's end-of-turn token
    stop_ids: list[int]  # sorted: end of turn and the eos tokens
    max_turns: int
    max_total_tokens: int

    def finish(self, rows: list[_Row], toks: torch.Tensor, lps: torch.Tensor, n: torch.Tensor) -> list[list[int] | None]:
        """Record every row's sampled turn (``toks``, ``lps``: (B, L), ``n``: (B,), from :func:`_decode_turn`).

        Returns, per row, the tokens to feed next (None: the rollout ended).
        """
        out: list[list[int] | None] = []
        for row, ids, lp, k in zip(rows, toks.tolist(), lps.tolist(), n.tolist()):
            if k == 0:  # no token budget left
                row.stop_reason = "max_tokens"
                out.append(None)
            else:
                out.append(self.finish_turn(row, ids[:k], lp[:k]))
        return out

    def finish_turn(self, row: _Row, ids: list[int], lps: list[float]) -> list[int] | None:
        """Record a finished turn; answer its calls. Returns the tokens to feed next (None: the rollout ended)."""
        row.response_ids += ids
        row.model_mask += [1] * len(ids)
        row.logprobs += lps
        last = ids[-1]
        ended = last in self.stop_ids
        text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        parsed = self.fmt.parse(text)
        turn = Turn(text=text, parsed=parsed)
        row.turns.append(turn)
        row.messages.append(assistant_message(text, parsed))
        if not ended or last != self.eot_id:
            # truncated by the token budget, or a non-end-of-turn eos token: calls in
            # this unfinished turn never reach the environment, and are recorded as
            # not executed (so the execution reward scores them, instead of NaN)
            row.stop_reason = "max_tokens" if not ended else "eos"
            row.final_text = parsed.content
            why = "the token budget" if not ended else "an end-of-sequence token"
            turn.results = [ToolResult(ok=False, error=f"not executed: the turn was cut off by {why} before it ended")
                            for _ in parsed.calls]
            return None
        if not parsed.is_tool_turn:
            row.stop_reason = "final_answer"
            row.final_text = parsed.content
            return None
        return self._answer(row, turn, last)

    def _answer(self, row: _Row, turn: Turn, last: int) -> list[int] | None:
        """Run a tool turn's calls and append the environment tokens; the tokens to feed next, or None."""
        turn.results, tool_msgs = answer_turn(turn.parsed, self.envs[row.task_index], row.episode)
        renderer = self.renderers[row.task_index]
        env_ids = renderer.tokenize(renderer.environment_text(row.messages, tool_msgs))
        row.messages += tool_msgs
        row.response_ids += env_ids
        row.model_mask += [0] * len(env_ids)
        row.logprobs += [0.0] * len(env_ids)
        if len(row.turns) >= self.max_turns:
            row.stop_reason = "max_turns"
            return None
        if row.length >= self.max_total_tokens:
            row.stop_reason = "max_tokens"
            return None
        return [last] + env_ids


@dataclass(frozen=True)
class _Sampler:
    """:func:`sample_tokens` at a rollout's temperature and top-p, from its seeded generator."""

    temperature: float
    top_p: float
    generator: torch.Generator

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_tokens(logits, self.temperature, self.top_p, self.generator)


def _start_rows(tasks: list[Task], renderers: list[ChatRenderer], group_size: int, max_total_tokens: int) -> list[_Row]:
    """G rows per task (task-major) holding its rendered prompt; a prompt already too long ends before generating."""
    rows: list[_Row] = []
    for ti, (task, r) in enumerate(zip(tasks, renderers)):
        prompt = r.tokenize(r.render(task.messages, add_generation_prompt=True))
        for g in range(group_size):
            rows.append(_Row(ti, g, [dict(m) for m in task.messages], list(prompt)))
    for row in rows:
        if row.length >= max_total_tokens:
            row.stop_reason = "max_tokens"
    return rows


def _trajectory(row: _Row, task: Task) -> Trajectory:
    return Trajectory(
        task=task,
        prompt_ids=row.prompt_ids,
        response_ids=row.response_ids,
        model_mask=row.model_mask,
        logprobs=row.logprobs,
        turns=row.turns,
        final_text=row.final_text,
        stop_reason=row.stop_reason or "max_tokens",
        messages=row.messages,
        group_id=row.task_index,
    )


@torch.no_grad()
def generate_rollouts(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: list[Task],
    make_env: Callable[[Task], Any],
    cfg: RolloutConfig,
) -> RolloutResult:
    """Sample ``cfg.group_size`` multi-turn rollouts per task, all in one batch.

    Args:
        model: a Hugging Face causal LM (any device; its mode is restored after).
        tokenizer: its tokenizer, with a chat template (or ``cfg.chat_template``).
        tasks: the prompts (``Task.messages``) and tools (``Task.tools``).
        make_env: builds the simulator of a task, called once per task; rollout
            ``g`` of the group talks to it with ``episode=g``.
        cfg: sampling settings.

    Returns:
        :class:`RolloutResult`; trajectory ``i`` belongs to task ``i // G`` and
        has ``group_id = i // G``. ``response_ids`` hold the policy turns (mask 1,
        each ending with its end-of-turn token when it has one) and the
        environment tokens (mask 0, logprob 0) in order.
    """
    if not tasks:
        raise ValueError("generate_rollouts: `tasks` is empty")
    t0 = time.perf_counter()
    fmt = get_format(cfg.format)
    device = next(model.parameters()).device
    G = cfg.group_size
    renderers = [ChatRenderer(tokenizer, t.tools or None, chat_template=cfg.chat_template) for t in tasks]
    eot_id = renderers[0].end_of_turn_id()
    stop_ids = stop_token_ids(tokenizer, model, eot_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eot_id
    turns = _Turns(tokenizer, fmt, renderers, [make_env(t) for t in tasks], eot_id, stop_ids,
                   cfg.max_turns, cfg.max_total_tokens)
    rows = _start_rows(tasks, renderers, G, cfg.max_total_tokens)
    sample = _Sampler(cfg.temperature, cfg.top_p, torch.Generator(device=device).manual_seed(cfg.seed))
    stop_t = torch.tensor(stop_ids, device=device)

    was_training = model.training
    model.eval()
    gen_tokens = 0
    live = [b for b, row in enumerate(rows) if row.stop_reason is None]  # rows in the batch, in order
    try:
        if live:
            prompts = [rows[ti * G].prompt_ids for ti in sorted({rows[b].task_index for b in live})]
            batch, logits = _prefill(model, prompts, G, pad_id, cfg.fast_decode)
        while live:
            budget = torch.tensor([min(cfg.max_new_tokens, cfg.max_total_tokens - rows[b].length) for b in live], device=device)
            toks, lps, n = _decode_turn(batch, logits, budget, stop_t, sample)
            gen_tokens += int(n.sum())
            nxt = turns.finish([rows[b] for b in live], toks, lps, n)
            still = [i for i, ids in enumerate(nxt) if ids is not None]
            if len(still) < len(live) and still:
                batch.keep(still)  # finished rollouts leave the batch
            live = [live[i] for i in still]
            if live:
                logits = batch.feed_lists([nxt[i] for i in still])  # (n_live, V)
    finally:
        model.train(was_training)
    return RolloutResult([_trajectory(row, tasks[row.task_index]) for row in rows], gen_tokens, time.perf_counter() - t0)


def _decode_turn(
    batch: KVBatch,
    logits: torch.Tensor,
    budget: torch.Tensor,
    stop_t: torch.Tensor,
    sample: _Sampler,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one turn for every row of the batch, one batched forward per token.

    Rows that finished their turn wait, masked, until the last one finishes;
    when half the batch or more is waiting, the waiting rows are parked (their
    cache set aside) and merged back when the turn ends.

    Args:
        logits: (B, V) next-token logits of every row.
        budget: (B,) max tokens of this turn per row.
        stop_t: (S,) the tokens that end a turn.

    Returns:
        ``(tokens, logprobs, lengths)``: (B, L) ids and sampling logprobs of the
        turn (L = the longest turn) and (B,) tokens per row. The last token of
        each row (its stop token, or the token that used up its budget) is not
        yet in the cache: the caller feeds it with the environment tokens.
    """
    B = budget.shape[0]
    device = logits.device
    L = int(budget.clamp_min(0).max())
    toks = torch.zeros(B, max(L, 1), dtype=torch.long, device=device)
    lps = torch.zeros(B, max(L, 1), dtype=torch.float32, device=device)
    n = torch.zeros(B, dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)  # which of the B rows sit in the batch, in batch order
    going = budget > 0  # over the rows in the batch
    parked: list[tuple[torch.Tensor, Any]] = []
    step = 0
    while bool(going.any()):
        # rows that are not generating carry logits of masked columns: keep them finite
        logits = torch.where(going[:, None], logits, torch.zeros_like(logits))
        tok, lp = sample(logits)
        toks[rows, step] = torch.where(going, tok, toks[rows, step])
        lps[rows, step] = torch.where(going, lp, lps[rows, step])
        n[rows] += going.long()
        still = going & ~torch.isin(tok, stop_t) & (n[rows] < budget[rows])
        step += 1
        n_still = int(still.sum())
        if n_still == 0:
            break
        if 2 * n_still <= len(rows) and len(rows) >= 8:
            # most rows are done with this turn: take them out so they stop costing compute
            p = batch.park(still)
            if p is not None:
                parked.append((rows[~still], p))
                rows, tok, still = rows[still], tok[still], still[still]
        logits = batch.feed(tok[:, None], still[:, None])
        going = still
    for out_rows, p in reversed(parked):
        rows = batch.unpark(p, rows, out_rows)
    return toks[:, :step], lps[:, :step], n


@torch.no_grad()
def trajectory_logprobs(model: torch.nn.Module, trajectories: Sequence[Trajectory], temperature: float = 1.0) -> list[torch.Tensor]:
    """Re-score trajectories in one forward pass: ``log softmax(logits / T)`` of every response token.

    Args:
        trajectories: rollouts (prompts left-padded to a common length here).
        temperature: the rollout temperature (0 is treated as 1, as when sampling greedily).

    Returns:
        One (T_i,) float tensor per trajectory, aligned with ``response_ids``;
        on policy tokens it matches ``Trajectory.logprobs`` within float tolerance.
    """
    if not trajectories:
        return []
    device = next(model.parameters()).device
    batch = collate(list(trajectories), 0, device)
    lp = response_logprobs(model, batch, temperature if temperature > 0 else 1.0)  # (B, R)
    return [lp[i, : len(t.response_ids)].cpu() for i, t in enumerate(trajectories)]
