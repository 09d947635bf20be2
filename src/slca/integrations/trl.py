"""SLCA inside TRL's ``GRPOTrainer`` (tested with TRL 1.16; extra ``slca[trl]``).

TRL computes one trajectory-level advantage per completion inline in
``GRPOTrainer._generate_and_score_completions``. :class:`SLCAGRPOTrainer` keeps
TRL's whole pipeline (generation, its own tool loop or ``rollout_func``, vLLM,
accelerate / DeepSpeed, the loss) and replaces only ``out["advantages"]`` with a
``(B, T)`` tensor from slca's estimator registry:

1. ``_calculate_rewards`` (private) returns the reward matrix gathered over all
   processes, ``(B_global, n_funcs)``; the subclass keeps it.
2. Each reward function is declared an execution-tier ("tool") or summary-tier
   ("summary") reward (:attr:`SLCAGRPOConfig.reward_tiers`); a tier's reward is
   the weighted sum of its functions (``GRPOConfig.reward_weights``).
3. The segments come from TRL's masks: ``model_mask = completion_mask *
   tool_mask`` (``tool_mask`` is 1 on model tokens and 0 on tool-result tokens,
   from TRL's tool loop or a ``rollout_func``'s ``env_mask``) and
   ``valid_mask = completion_mask``, passed to :func:`slca.segment_masks`.
4. Masks are padded and gathered across processes, so each group is normalised
   over all its members whatever process holds them; every process then keeps
   its own rows (the same slice TRL uses for its 1-D advantages).

``_compute_loss`` accepts ``(B, T)`` advantages (TRL unsqueezes only 1-D ones), so
every TRL loss type works unchanged. Both hooks are private TRL methods:
:func:`check_trl_contract` fails loudly when they change.

Example (runnable with a real model id)::

    from slca.integrations.trl import SLCAGRPOConfig, SLCAGRPOTrainer

    def execution_reward(completions, **kw):   # one float per completion
        ...
    def summary_reward(completions, **kw):
        ...

    trainer = SLCAGRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=[execution_reward, summary_reward],
        args=SLCAGRPOConfig(output_dir="out", reward_tiers=["tool", "summary"]),
        train_dataset=dataset,
        tools=[get_weather],
    )
    trainer.train()
"""

from __future__ import annotations

import inspect
import itertools
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from slca.advantages import EMPTY_TOOL_MODES, AdvantageInputs, get_estimator, resolve_estimator
from slca.segments import segment_masks
from slca.types import Task

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("slca.integrations.trl needs TRL: pip install 'slca[trl]'") from e

__all__ = [
    "TESTED_TRL",
    "TIERS",
    "SLCAGRPOConfig",
    "SLCAGRPOTrainer",
    "check_tiers",
    "check_trl_contract",
    "slca_reward_funcs",
    "simulator_environment",
    "tier_rewards",
    "trl_batch_advantages",
]

TESTED_TRL = (">=1.16", "<1.17")
TIERS = ("tool", "summary")


def check_trl_contract(trainer_cls: type = GRPOTrainer) -> None:
    """Raise RuntimeError if the private TRL methods this integration relies on changed.

    Checked: ``_calculate_rewards(inputs, prompts, completions,
    completion_ids_list)`` exists and gathers (its source calls ``gather``);
    ``_generate_and_score_completions(inputs)`` exists and slices the local rows
    with ``process_index``; its output carries ``completion_mask``, ``tool_mask``
    and ``advantages``; ``_compute_loss`` unsqueezes only 1-D advantages.
    """
    problems = []

    def src(name: str) -> str:
        fn = getattr(trainer_cls, name, None)
        if fn is None:
            problems.append(f"GRPOTrainer.{name} is missing")
            return ""
        return inspect.getsource(fn)

    calc = src("_calculate_rewards")
    if calc:
        params = list(inspect.signature(trainer_cls._calculate_rewards).parameters)
        if params != ["self", "inputs", "prompts", "completions", "completion_ids_list"]:
            problems.append(f"_calculate_rewards signature changed: {params}")
        if "gather(rewards_per_func)" not in calc:
            problems.append("_calculate_rewards no longer returns the gathered reward matrix")
    gen = src("_generate_and_score_completions")
    if gen:
        for needle in ('"completion_mask": completion_mask', 'output["tool_mask"] = tool_mask',
                       '"advantages": advantages', "self.accelerator.process_index * len(prompts)",
                       "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)"):
            if needle not in gen:
                problems.append(f"_generate_and_score_completions no longer contains {needle!r}")
    loss = src("_compute_loss")
    if loss and "if advantages.dim() == 1:" not in loss:
        problems.append("_compute_loss no longer accepts (B, T) advantages")
    if problems:
        raise RuntimeError(
            f"TRL {trl.__version__} changed the private GRPOTrainer methods slca relies on "
            f"(tested: trl{','.join(TESTED_TRL)}): " + "; ".join(problems)
        )


@dataclass
class SLCAGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the SLCA options. TRL's own options keep their meaning;
    ``scale_rewards`` is passed to the estimator as ``scale``."""

    advantage_estimator: str = field(
        default="slca",
        metadata={"help": "Name in slca's estimator registry: 'slca' (segment-locked), 'grpo' (one scalar "
                  "on every token, the matched baseline), 'gdpo' (decoupled normalisation, no locking), ...; your own "
                  "as an import path 'my_pkg.module:function' (imported in every process) or a 'slca.estimators' "
                  "entry point. Checked when the config is made, before any model loads."},
    )
    reward_tiers: list[str] | None = field(
        default=None,
        metadata={"help": "One of 'tool' / 'summary' per reward function, in order. Default: two functions, "
                  "the first the execution reward, the second the summary reward."},
    )
    empty_tool: str = field(
        default="response",
        metadata={"help": "Rollouts that made no call: 'response', 'include' or 'exclude' (see "
                  "slca.slca_advantages)."},
    )
    advantage_eps: float = field(
        default=1e-4,
        metadata={"help": "eps added to the group std; 1e-4 is the constant TRL's own normalisation uses."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_estimator(self.advantage_estimator)  # one-line ValueError (unknown, module not found, ...) before any model loads


def tier_rewards(
    rewards_per_func: torch.Tensor, tiers: list[str], weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Execution- and summary-tier reward per rollout from TRL's reward matrix.

    ``r^tier_i = nansum_{k in tier} w_k r_ik``: the functions of the tier that
    scored row ``i`` are summed (a function returning None gives NaN and is
    skipped, as TRL's own ``nansum``); NaN when none of the tier's functions
    scored the row, and NaN on every row for a tier without any function (an
    *absent* tier: :func:`trl_batch_advantages` defines what that means).

    Args:
        rewards_per_func: (B, F) float, NaN = not scored.
        tiers: length-F list of "tool" / "summary".
        weights: (F,) reward weights.

    Returns:
        ``(tool_rewards (B,), summary_rewards (B,))``.
    """
    if rewards_per_func.dim() != 2 or rewards_per_func.shape[1] != len(tiers):
        raise ValueError(
            f"rewards_per_func must be (B, {len(tiers)}) to match reward_tiers, got {tuple(rewards_per_func.shape)}"
        )
    out = []
    w = weights.to(rewards_per_func)
    for tier in TIERS:
        cols = [k for k, t in enumerate(tiers) if t == tier]
        if not cols:  # absent tier (isnan(...).all() of an empty (B, 0) slice would say "unscored" by accident)
            out.append(torch.full_like(rewards_per_func[:, 0], float("nan")))
            continue
        r = rewards_per_func[:, cols] * w[cols]  # (B, F_tier)
        total = torch.nansum(r, dim=1)
        out.append(torch.where(torch.isnan(r).all(dim=1), torch.full_like(total, float("nan")), total))
    return out[0], out[1]


def check_tiers(tiers: list[str], estimator: str) -> None:
    """Raise ValueError if ``estimator`` cannot work with the tiers present in ``tiers``.

    Trajectory-level estimators (``grpo``, any registered with
    ``trajectory=True``: :attr:`slca.advantages.EstimatorSpec.trajectory`) take any
    non-empty set of functions. The tiered ones need a summary-tier function:
    without one there is no reward for the tokens after the last tool response,
    nor for a rollout that made no call. Without a tool-tier function they run
    on the summary tier alone (see :func:`trl_batch_advantages`).
    """
    if not tiers:
        raise ValueError("at least one reward function is needed")
    if not get_estimator(estimator).trajectory and "summary" not in tiers:
        raise ValueError(
            f"advantage_estimator={estimator!r} routes the summary-tier reward to the answer tokens, but no reward "
            f"function is declared 'summary' (reward_tiers={tiers}); declare one, or use advantage_estimator='grpo'"
        )


def trl_batch_advantages(
    rewards_per_func: torch.Tensor,
    tiers: list[str],
    weights: torch.Tensor,
    completion_mask: torch.Tensor,
    tool_mask: torch.Tensor | None,
    num_generations: int,
    *,
    estimator: str = "slca",
    scale: str = "group",
    eps: float = 1e-4,
    empty_tool: str = "response",
) -> tuple[torch.Tensor, AdvantageInputs]:
    """Per-token advantages for a gathered TRL batch, through slca's registry.

    TRL's sampler puts each prompt's ``num_generations`` completions next to each
    other in the gathered batch, so row ``i`` belongs to group ``i // G``.

    Rewards (TRL's rules, so that ``estimator="grpo"`` equals TRL's own advantages):

    * trajectory-level estimators (``grpo``) get TRL's scalar: the weighted
      ``nansum`` over all functions, NaN (left out, advantage 0) only when no
      function scored the row. A tier one row has no score in counts 0 there
      when the other tier scored it.
    * tiered estimators (``slca``, ``gdpo``, ...) get each tier's own reward
      (:func:`tier_rewards`); a row a tier did not score is left out of that
      tier's group statistics and gets no advantage from it.
    * an absent tool tier (no function declared ``tool``): the summary tier
      alone, on the summary segment, and on every policy token of a rollout that
      made no call (``empty_tool`` is then ``include``: there is no execution
      advantage to mix in). Tool-call tokens get 0: no reward judged them.
      Without tool calls in the batch this equals TRL's GRPO advantages.
    * an absent summary tier with a tiered estimator: ValueError (:func:`check_tiers`).

    Args:
        rewards_per_func: (B, F) gathered reward matrix.
        tiers: length-F tier of each reward function.
        weights: (F,) reward weights.
        completion_mask: (B, T) 1 on real completion tokens (0 = padding, or a
            truncated completion TRL masked out).
        tool_mask: (B, T) 1 on model tokens, 0 on tool-result tokens; None when
            the batch has no tool tokens.
        num_generations: G.

    Returns:
        ``(advantages (B, T) float32, the AdvantageInputs used)``.
    """
    B = rewards_per_func.shape[0]
    if num_generations < 1 or B % num_generations:
        raise ValueError(f"num_generations must divide the batch size {B}, got {num_generations}")
    check_tiers(list(tiers), estimator)
    valid = completion_mask.long()
    model = valid if tool_mask is None else valid * tool_mask.long()
    tool_seg, summary_seg = segment_masks(model, valid)
    r_tool, r_sum = tier_rewards(rewards_per_func, tiers, weights)
    spec = get_estimator(estimator)
    if spec.trajectory:
        # TRL's scalar: nansum over all functions; NaN only where nothing scored the row
        r_tool = torch.where(torch.isnan(r_tool) & ~torch.isnan(r_sum), torch.zeros_like(r_tool), r_tool)
        r_sum = torch.where(torch.isnan(r_sum) & ~torch.isnan(r_tool), torch.zeros_like(r_sum), r_sum)
    elif "tool" not in tiers:
        empty_tool = "include"
    group_ids = torch.arange(B, device=rewards_per_func.device) // num_generations
    inputs = AdvantageInputs(
        tool_rewards=r_tool,
        summary_rewards=r_sum,
        group_ids=group_ids,
        model_mask=model,
        tool_mask=tool_seg,
        summary_mask=summary_seg,
    )
    # options it does not take (empty_tool for grpo) are not passed
    adv = spec(inputs, **spec.pick({"scale": scale, "eps": eps, "empty_tool": empty_tool}))
    return adv, inputs


def slca_reward_funcs(tasks: Mapping[str, Task], id_column: str = "task_id") -> list[Callable[..., list[float | None]]]:
    """TRL reward functions ``[execution, summary]`` from :mod:`slca.rewards`.

    Each completion (TRL's message list: assistant turns with ``tool_calls``,
    tool messages, the final answer) is scored against the :class:`Task` whose id
    is in the dataset column ``id_column``. A rollout slca cannot score (NaN
    total) returns None, which TRL turns into NaN and the estimator leaves out of
    its group's statistics. Use with ``reward_tiers=["tool", "summary"]``.
    """
    from slca.rewards import execution_reward, summary_reward, turns_from_messages

    def _task(i: str) -> Task:
        if i not in tasks:
            raise ValueError(f"{id_column}={i!r} is not among the {len(tasks)} tasks given to slca_reward_funcs")
        return tasks[i]

    def _none_if_nan(x: float) -> float | None:
        return None if math.isnan(x) else float(x)

    def slca_execution(completions, **kwargs):
        ids = kwargs[id_column]
        return [_none_if_nan(execution_reward(_task(i), turns_from_messages(c)[0]).total) for c, i in zip(completions, ids)]

    def slca_summary(completions, **kwargs):
        out = []
        for c, i in zip(completions, kwargs[id_column]):
            turns, final = turns_from_messages(c)
            out.append(_none_if_nan(summary_reward(_task(i), turns, final).total))
        return out

    return [slca_execution, slca_summary]


_JSON_TO_PY = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _tool_method(name: str, schema: dict[str, Any]) -> Callable[..., str]:
    """A method ``name(self, **arguments) -> str`` whose signature and Google-style
    docstring render back to ``schema`` through transformers' ``get_json_schema``."""
    fn_schema = schema.get("function", schema)
    params = fn_schema.get("parameters") or {}
    props = params.get("properties", {})
    required = set(params.get("required", []))

    def method(self, **arguments: Any) -> str:
        return self._call(name, arguments)

    sig = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = [fn_schema.get("description") or name, "", "Args:"]
    for p, ps in props.items():
        typ = ps.get("type")
        py = _JSON_TO_PY.get(typ, str) if isinstance(typ, str) else str
        annotations[p] = py if p in required else (py | None)
        default = inspect.Parameter.empty if p in required else None
        sig.append(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotations[p]))
        lines.append(f"    {p}: {ps.get('description') or p}")
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(sig, return_annotation=str)
    method.__annotations__ = annotations
    method.__doc__ = "\n".join(lines if props else lines[:1])
    return method


def simulator_environment(
    tasks: Mapping[str, Task], make_env: Callable[[Task], Any], id_column: str = "task_id"
) -> type:
    """An environment class for TRL's ``environment_factory`` backed by slca's simulators.

    Every tool offered by any of ``tasks`` becomes a public method (TRL's tool
    loop calls them by name); ``reset(**row)`` looks up the row's task by
    ``row[id_column]`` and builds a fresh simulator with ``make_env(task)`` (for
    example :func:`slca.env.toolworld.make_env`), so stateful tools keep state per
    rollout. A method returns ``ToolResult.to_text()``: errors (unknown tool,
    invalid arguments) come back as ``{"error": ...}`` text the model can read.

    Use: ``SLCAGRPOTrainer(..., environment_factory=simulator_environment(tasks, make_env))``.
    """
    schemas: dict[str, dict[str, Any]] = {}
    for task in tasks.values():
        for t in task.tools:
            fn = t.get("function", t)
            schemas.setdefault(fn["name"], t)
    reserved = {"reset", "get_reward"} & set(schemas)
    if reserved:
        raise ValueError(f"tool names {sorted(reserved)} clash with TRL's environment hooks")
    episodes = itertools.count()

    def reset(self, **row: Any) -> None:
        key = row.get(id_column)
        if key not in tasks:
            raise ValueError(f"row[{id_column!r}]={key!r} is not among the {len(tasks)} tasks of this environment")
        self.task = tasks[key]
        self.simulator = make_env(self.task)
        self.episode = next(episodes)
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.simulator.call(name, arguments, episode=self.episode).to_text()

    namespace: dict[str, Any] = {"reset": reset, "_call": _call, "__doc__": simulator_environment.__doc__}
    namespace.update({name: _tool_method(name, schema) for name, schema in schemas.items()})
    return type("SLCASimulatorEnvironment", (), namespace)


class SLCAGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with per-token advantages from slca's registry.

    Takes TRL's arguments unchanged; ``args`` should be an :class:`SLCAGRPOConfig`
    (a plain ``GRPOConfig`` gets the defaults: estimator ``slca``, tiers
    ``["tool", "summary"]``). Logs ``slca/*`` metrics next to TRL's.
    ``multi_objective_aggregation`` must stay TRL's default (the estimator
    decides how rewards combine). After each generation batch,
    :attr:`trl_advantages` holds the ``(B_local,)`` advantages TRL itself
    computed for it (before they are replaced), so a run can check
    ``advantage_estimator="grpo"`` against TRL on every batch.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_contract(GRPOTrainer)
        super().__init__(*args, **kwargs)
        a = self.args
        self.slca_estimator = getattr(a, "advantage_estimator", "slca")
        get_estimator(self.slca_estimator)  # ValueError listing the known ones
        tiers = getattr(a, "reward_tiers", None) or ["tool", "summary"]
        if len(tiers) != len(self.reward_funcs) or any(t not in TIERS for t in tiers):
            raise ValueError(
                f"reward_tiers must give one of {TIERS} for each of the {len(self.reward_funcs)} reward functions "
                f"({self.reward_func_names}), got {tiers}"
            )
        check_tiers(list(tiers), self.slca_estimator)
        self.slca_tiers = list(tiers)
        aggregation = getattr(self, "multi_objective_aggregation", "sum_then_normalize")
        if aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={aggregation!r} is TRL's own advantage rule, which SLCAGRPOTrainer replaces; "
                "keep the default 'sum_then_normalize' and pick the rule with advantage_estimator ('gdpo' normalises "
                "each tier on its own, as normalize_then_sum does per function)"
            )
        self.slca_empty_tool = getattr(a, "empty_tool", "response")
        if self.slca_empty_tool not in EMPTY_TOOL_MODES:
            raise ValueError(f"empty_tool must be one of {EMPTY_TOOL_MODES}, got {self.slca_empty_tool!r}")
        self.slca_eps = float(getattr(a, "advantage_eps", 1e-4))
        self._slca_rewards_per_func: torch.Tensor | None = None
        self.trl_advantages: torch.Tensor | None = None  # TRL's own (B_local,) advantages of the last batch, for checks

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._slca_rewards_per_func = rewards_per_func  # (B_global, F), gathered
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._slca_rewards_per_func = None
        out = super()._generate_and_score_completions(inputs)
        rewards_per_func = self._slca_rewards_per_func
        if rewards_per_func is None:
            raise RuntimeError("GRPOTrainer._calculate_rewards was not called; TRL's private API changed")
        acc = self.accelerator
        completion_mask = out["completion_mask"]  # (B_local, T_local)
        tool_mask = out.get("tool_mask")
        B_local, T_local = completion_mask.shape
        has_tool = bool(acc.gather(torch.tensor([int(tool_mask is not None)], device=completion_mask.device)).sum())
        if tool_mask is None:
            tool_mask = torch.ones_like(completion_mask)
        valid_g = acc.gather(acc.pad_across_processes(completion_mask, dim=1, pad_index=0))
        tool_g = acc.gather(acc.pad_across_processes(tool_mask, dim=1, pad_index=0)) if has_tool else None
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        adv, used = trl_batch_advantages(
            rewards_per_func,
            self.slca_tiers,
            self.reward_weights,
            valid_g,
            tool_g,
            G,
            estimator=self.slca_estimator,
            scale=self.scale_rewards,
            eps=self.slca_eps,
            empty_tool=self.slca_empty_tool,
        )
        start = acc.process_index * B_local
        self.trl_advantages = out["advantages"]
        out["advantages"] = adv[start : start + B_local, :T_local].to(completion_mask.device)
        self._log_slca_metrics(mode, adv, used)
        return out

    def _log_slca_metrics(self, mode: str, adv: torch.Tensor, used: AdvantageInputs) -> None:
        """``slca/*``: tier rewards, segment sizes and mean |advantage| per segment (gathered batch)."""
        m = self._metrics[mode]
        tool, summ, model = used.tool_mask.bool(), used.summary_mask.bool(), used.model_mask.bool()
        m["slca/tool_reward_mean"].append(torch.nanmean(used.tool_rewards).item())
        m["slca/summary_reward_mean"].append(torch.nanmean(used.summary_rewards).item())
        m["slca/tool_token_frac"].append((tool.sum() / model.sum().clamp_min(1)).item())
        m["slca/empty_tool_frac"].append((~tool.any(dim=1)).float().mean().item())
        for name, seg in (("tool", tool), ("summary", summ)):
            a = adv[seg].abs()
            m[f"slca/{name}_adv_abs_mean"].append(a.mean().item() if a.numel() else 0.0)


def _warn_untested_version() -> None:
    from packaging.version import Version

    v = Version(trl.__version__)
    if not (Version("1.16") <= v < Version("1.17")):
        warnings.warn(
            f"slca.integrations.trl was tested with trl{','.join(TESTED_TRL)}, found {trl.__version__}; "
            "check_trl_contract() still guards the private methods it uses",
            stacklevel=2,
        )


_warn_untested_version()
