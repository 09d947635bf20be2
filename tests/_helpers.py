"""Helpers only the tests use (kept out of the library)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from slca.env.llm import ChatClient
from slca.env.schema import ToolBox
from slca.rewards.values import normalize
from slca.types import ParsedTurn, Task, ToolCall, Trajectory, Turn


def chat_completion(base_url: str, model: str, messages: list[dict[str, Any]], *, api_key: str | None = None,
                    timeout: float = 30.0, http_attempts: int = 1, **params: Any) -> str:
    """POST ``{base_url}/chat/completions`` once (one attempt by default) and return the first choice's content
    (:class:`slca.env.llm.ChatClient`, closed afterwards); raises ``EndpointError`` as the client does."""
    client = ChatClient(base_url, api_key=api_key, timeout=timeout, http_attempts=http_attempts)
    try:
        return client.complete(model, messages, **params)
    finally:
        client.close()


@lru_cache(maxsize=None)
def toolworld_tasks(split: str = "train", n: int = 400, seed: int = 0) -> list[Task]:
    """``toolworld.make_tasks(split, n, seed)``, built once per process (the reward tests share it; nothing
    changes a task)."""
    from slca.env import toolworld

    return toolworld.make_tasks(split, n=n, seed=seed)


def task_of(task_type: str) -> Task:
    """The first of the 400 shared ``train`` tasks (:func:`toolworld_tasks`) of one toolworld task type."""
    return next(t for t in toolworld_tasks("train", n=400, seed=0) if t.meta["task_type"] == task_type)


def approx(x):
    """``pytest.approx`` to 1e-9: the reward tests' exact figures, free of float rounding."""
    import pytest

    return pytest.approx(x, abs=1e-9)


def tool_turn(calls: Iterable[ToolCall], results: Iterable[Any] | None = None, errors: Iterable[Any] = ()) -> Turn:
    """An assistant turn that made ``calls`` (with parse ``errors``), answered by ``results``."""
    return Turn(text="<calls>", parsed=ParsedTurn(calls=list(calls), errors=list(errors)), results=list(results or []))


def answer_turn(text: str) -> Turn:
    """A final assistant turn that answers ``text`` and makes no call."""
    return Turn(text=text, parsed=ParsedTurn(content=text))


def run_steps(task: Task, steps: list[list[ToolCall]], final: str = "") -> list[Turn]:
    """Execute ``steps`` (one turn each) in the task's toolworld env and append the final answer (if any)."""
    from slca.env import toolworld

    env = toolworld.make_env(task)
    turns = [tool_turn(s, [env.call(c.name, c.arguments) for c in s]) for s in steps]
    return turns + ([answer_turn(final)] if final else [])


def reference_summary(task: Any) -> float:
    """The summary reward of a toolworld reference answer after the gold calls: 1, except on ``flight`` tasks.

    toolworld's ``search_flights`` returns a bare price and no tool the task runs names
    its currency, yet the reference answer says "costs 314 USD": the code is an entity
    nothing the rollout saw supports, so faithfulness is 5/6 and no_hallucination 0
    (0.3 * 5/6 + 0.4 + 0.1 = 0.75); docs/environment.md ("Entities") says why.
    """
    return 0.75 if task.meta.get("task_type") == "flight" else 1.0


def values_equal(a: Any, b: Any) -> bool:
    """Equality after :func:`slca.rewards.values.normalize` (``"182"``, ``182`` and ``182.0`` agree)."""
    return normalize(a) == normalize(b)


def advantage_extras(trajectories: list[Trajectory], needs: Iterable[str]) -> dict[str, Any]:
    """The optional estimator inputs named in ``needs``, computed from the rollouts by the input registry
    (:func:`slca.core.registry.get_input`; an unregistered name raises ValueError)."""
    from slca.core.registry import get_input

    return {name: get_input(name).from_trajectories(trajectories) for name in needs}


def check_calls(tools: Iterable[Any], gold: list[list[ToolCall]], *, where: str = "task") -> None:
    """Raise ValueError (prefixed with ``where``) if a gold call names an unknown tool or breaks its schema."""
    box = tools if isinstance(tools, ToolBox) else ToolBox(tools)
    for s, step in enumerate(gold):
        for c, call in enumerate(step):
            err = box.argument_error(call.name, call.arguments)
            if err is not None:
                raise ValueError(f"{where}: gold step {s} call {c} violates its schema: {err}")


# secrets the redaction tests plant in URLs, keys and server replies (test_env_llm, test_faults_http)
SECRET_KEY = "sk-live-0123456789abcdef"
SECRET_PASS = "hunter2-pass"
SECRET_QUERY = "q-token-98765"


def no_secret(*texts):
    """None of the planted secrets appears in any of ``texts``."""
    for t in texts:
        for s in (SECRET_KEY, SECRET_PASS, SECRET_QUERY, "sk-server-leak-4242"):
            assert s not in t, (s, t)


NO_FLAWS = dict(sequential=0.0, redundant=0.0, wrong_argument=0.0, unfaithful=0.0, wrong_entity=0.0, incomplete=0.0, verbose=0.0)
"""``recipes.warmstart.config.DemoMix`` keywords with every flaw off (a clean demonstration)."""


def demo_rewards(d: Any) -> tuple[float, Any]:
    """A warm-start demonstration's execution total and summary reward breakdown."""
    from slca.rewards import execution_reward, summary_reward

    return execution_reward(d.task, d.turns).total, summary_reward(d.task, d.turns, d.final_text)
