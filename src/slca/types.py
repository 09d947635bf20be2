"""Typed containers shared by every part of slca.

One definition of each type lives here; the chat formats, the environment, the
rewards, the rollout engine and the trainer all import from this module.

Conventions
-----------
* A tool is an OpenAI function schema::

      {"type": "function", "function": {"name": ..., "description": ...,
       "parameters": <JSON Schema>, "response": <JSON Schema, optional>}}

  :class:`ToolSpec` is the parsed form; ``ToolSpec.to_openai()`` gives the dict back.
* Gold tool use is a list of *steps*; each step is a list of calls that may run in
  parallel (the paper's ``gold_tool_calls`` format).
* Messages are OpenAI-style chat dicts (``role`` in system/user/assistant/tool;
  assistant tool calls in ``tool_calls`` with JSON-string ``arguments``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "call_key",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "ParseError",
    "NON_BLOCKING_ERRORS",
    "ParsedTurn",
    "Task",
    "Turn",
    "Trajectory",
    "RewardBreakdown",
    "STOP_REASONS",
]


def call_key(name: str, arguments: Any) -> str:
    """Canonical text of a call: its name and its arguments as sorted-key JSON.

    For equality, sets, caches and seeds; the reward tiers compare calls after
    value normalisation (:func:`slca.rewards.values.normalized_call_key`).
    """
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class ToolCall:
    """One function call: a name and a JSON object of arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_openai(self, index: int = 0) -> dict[str, Any]:
        """OpenAI ``tool_calls`` entry (arguments as a JSON string)."""
        return {
            "id": self.id or f"call_{index}",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }

    def key(self) -> str:
        """Canonical string for equality / set operations (:func:`call_key`)."""
        return call_key(self.name, self.arguments)

    # frozen dataclass with a dict field is not hashable by default; hash the key.
    def __hash__(self) -> int:  # pragma: no cover - trivial
        return hash(self.key())


@dataclass(frozen=True)
class ToolResult:
    """What the environment answered to one call.

    ``ok`` is False for unknown tools, invalid arguments, simulator failures;
    then ``error`` is a message the model can read and ``content`` may be None.
    """

    ok: bool
    content: Any = None
    error: str | None = None

    def to_text(self) -> str:
        """The text inserted into the conversation as the tool message."""
        if self.ok:
            return self.content if isinstance(self.content, str) else json.dumps(self.content, ensure_ascii=False)
        return json.dumps({"error": self.error}, ensure_ascii=False)


@dataclass(frozen=True)
class ToolSpec:
    """A tool's OpenAI function schema, parsed.

    ``parameters`` is a JSON Schema for the arguments object; ``response`` an
    optional JSON Schema for what the tool returns (used by the simulator).
    ``stateful`` marks tools whose effects later calls in the same episode see.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    response: dict[str, Any] | None = None
    domain: str = ""
    stateful: bool = False

    @classmethod
    def from_openai(cls, d: dict[str, Any]) -> "ToolSpec":
        fn = d.get("function", d)
        if not isinstance(fn, dict) or "name" not in fn:
            got = f"keys {sorted(fn)}" if isinstance(fn, dict) else f"a {type(fn).__name__}"
            raise ValueError(f"tool schema needs a 'name' (got {got})")
        return cls(
            name=fn["name"],
            description=fn.get("description", ""),
            parameters=fn.get("parameters") or {"type": "object", "properties": {}},
            response=fn.get("response"),
            domain=fn.get("x-domain", d.get("x-domain", "")),
            stateful=bool(fn.get("x-stateful", d.get("x-stateful", False))),
        )

    def to_openai(self) -> dict[str, Any]:
        """The schema as chat templates and OpenAI servers expect it (no private keys)."""
        fn: dict[str, Any] = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ParseError:
    """A structured error from parsing model output.

    ``kind`` is a short machine-readable code (``invalid_json``, ``unclosed_tag``,
    ``missing_name``, ``arguments_not_object``, ``text_around_calls``, ...);
    ``message`` is readable by the model and the user; ``fragment`` is the raw text.
    """

    kind: str
    message: str
    fragment: str = ""

    @property
    def blocking(self) -> bool:
        """False for text around well-formed calls (those calls still run); True for an attempted call that failed to parse."""
        return self.kind not in NON_BLOCKING_ERRORS


#: Parse-error kinds that do not block a turn (text outside well-formed calls).
NON_BLOCKING_ERRORS: frozenset[str] = frozenset({"text_around_calls"})


@dataclass
class ParsedTurn:
    """One assistant turn after parsing.

    ``content`` is the visible text outside tool calls (the answer, for a final
    turn); ``reasoning`` is ``<think>`` text, if any; ``calls`` are the well-formed
    calls in order; ``errors`` the fragments that could not be parsed. A turn is a
    tool turn when it has calls or blocking errors (an attempted call).
    """

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    reasoning: str | None = None

    @property
    def blocking_errors(self) -> list[ParseError]:
        """The errors of attempted calls (:attr:`ParseError.blocking`): each is answered like a failed call."""
        return [e for e in self.errors if e.blocking]

    @property
    def is_tool_turn(self) -> bool:
        return bool(self.calls or self.blocking_errors)


@dataclass
class Task:
    """A tool-use task.

    ``messages`` is the prompt (system and user turns, no assistant turn);
    ``tools`` the OpenAI tool schemas offered; ``gold`` a list of steps, each a
    list of parallel :class:`ToolCall` (empty for "no tool needed" and
    "cannot be served" tasks); ``answer_facts`` values a good summary must state
    (for the summary reward); ``kind`` a task kind label (``single``,
    ``parallel``, ``chain``, ``no_tool``, ``unservable``, or a loader's label);
    ``meta`` what a suite or loader records beside (its split, entities, source row).
    """

    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    gold: list[list[ToolCall]] = field(default_factory=list)
    kind: str = "single"
    answer_facts: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    reference_answer: str | None = None
    """A good final answer, when the task has one (toolworld's templated answer, a dataset's recorded one):
    the summary reward's reference and the warm start's demonstration."""
    refusal: bool | None = None
    """Whether the right answer declines (no offered tool serves the request); None at construction means
    ``kind == "unservable"``."""

    def __post_init__(self) -> None:
        moved = sorted({"reference_answer", "refusal"} & set(self.meta))
        if moved:  # their home until issue 31; a task file still stores them in meta (slca.env.loaders lifts them out)
            raise ValueError(f"task {self.id!r}: meta[{moved[0]!r}] is a Task field now: pass {moved[0]}= instead")
        if self.refusal is None:
            self.refusal = self.kind == "unservable"
        if self.reference_answer is not None and not isinstance(self.reference_answer, str):
            raise TypeError(f"task {self.id!r}: reference_answer must be a string or None, got {type(self.reference_answer).__name__}")
        if not isinstance(self.refusal, bool):
            raise TypeError(f"task {self.id!r}: refusal must be True, False or None, got {self.refusal!r}")

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return [ToolSpec.from_openai(t) for t in self.tools]


@dataclass
class Turn:
    """One assistant turn of a rollout and the environment's answers to it."""

    text: str
    parsed: ParsedTurn
    results: list[ToolResult] = field(default_factory=list)


STOP_REASONS = ("final_answer", "max_turns", "max_tokens", "eos")


@dataclass
class Trajectory:
    """A finished rollout at token level.

    ``prompt_ids`` are the prompt tokens; ``response_ids`` everything after it
    (policy turns and environment tokens in order). ``model_mask[t]`` is 1 where
    the policy sampled ``response_ids[t]``; ``logprobs[t]`` its sampling
    log-probability (0.0 on environment tokens). ``turns`` are the parsed
    assistant turns with the tool results; ``final_text`` the last assistant turn's
    visible content; ``stop_reason`` one of :data:`STOP_REASONS`.
    """

    task: Task
    prompt_ids: list[int]
    response_ids: list[int]
    model_mask: list[int]
    logprobs: list[float]
    turns: list[Turn]
    final_text: str
    stop_reason: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    group_id: int = 0

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.model_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"Trajectory: response_ids ({n}), model_mask ({len(self.model_mask)}) and "
                f"logprobs ({len(self.logprobs)}) must have the same length"
            )
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"Trajectory.stop_reason must be one of {STOP_REASONS}, got {self.stop_reason!r}")

    @property
    def calls(self) -> list[list[ToolCall]]:
        """Calls per tool turn (the rollout's "steps")."""
        return [t.parsed.calls for t in self.turns if t.parsed.is_tool_turn]


@dataclass
class RewardBreakdown:
    """A reward's total and its named components.

    ``total`` may be NaN when the rollout could not be scored; ``reason`` then
    says why (the advantage functions give NaN rewards advantage 0).
    """

    total: float
    components: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
