"""Training configuration: flat dataclasses, one docstring under every field.

Load from a YAML/JSON file and override on the command line with
``--set section.field=value``; :func:`validate` refuses a bad value before any
work starts, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["TrainConfig", "load_config", "apply_overrides", "validate", "to_dict"]


@dataclass
class TrainConfig:
    """Everything one training run needs (the single-machine reference trainer)."""

    # ---- run
    run_dir: str = "runs/default"
    """Folder for metrics.jsonl, TensorBoard events, checkpoints, report."""
    seed: int = 0
    """Seed for data order, sampling and initialisation of everything random."""
    steps: int = 30
    """Optimizer steps (one rollout batch each)."""
    model: str = "default"
    """'default' = the embedded tiny model (built on first use), or a path / HF id of a causal LM."""
    device: str = "cpu"
    """torch device ('cpu', 'cuda', 'cuda:1')."""

    # ---- data / environment
    suite: str = "toolworld"
    """Task suite: 'toolworld' (built in) or a path to a JSONL/parquet file of tasks."""
    tasks_per_step: int = 8
    """Prompts per step; the batch is tasks_per_step x group_size rollouts."""
    group_size: int = 4
    """G: rollouts per prompt (the GRPO group)."""
    tool_format: str = "hermes"
    """Tool-call format the policy writes (see slca.chat.get_format)."""

    # ---- rollout
    max_turns: int = 4
    """Assistant turns per rollout before it is stopped (stop_reason='max_turns')."""
    max_new_tokens: int = 96
    """Tokens per assistant turn."""
    max_total_tokens: int = 1024
    """Prompt + response tokens per rollout (environment tokens included); generation stops there."""
    temperature: float = 1.0
    """Sampling temperature; training log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off). Off by default: with top_p < 1 the
    sampling distribution is not the policy, and the PPO ratio is biased."""

    # ---- advantages
    estimator: str = "slca"
    """Name in the estimator registry: 'grpo', 'slca', 'gdpo', or one you registered."""
    scale: str = "group"
    """Advantage normalisation: 'group' (GRPO), 'batch' (TRL scale_rewards='batch'), 'none' (Dr. GRPO)."""
    eps: float = 1e-6
    """Added to the std in the normalisation."""
    empty_tool: str = "response"
    """SLCA: rollouts with no tool segment ('response', 'include', 'exclude'; see slca_advantages)."""
    turn_lambda: float = 1.0
    """slca_turn: weight of the per-turn advantage added on each tool turn's tokens (beyond the paper, docs/beyond.md)."""
    tool_weight: float = 1.0
    """Weight of the execution reward in the scalar reward of trajectory-level estimators (grpo)."""
    summary_weight: float = 1.0
    """Weight of the summary reward in the scalar reward of trajectory-level estimators (grpo)."""
    summary_noise: float = 0.0
    """Std of Gaussian noise added to summary rewards (sensitivity studies; 0 = off)."""

    # ---- optimisation
    lr: float = 2e-4
    """AdamW learning rate (constant after warmup)."""
    warmup_steps: int = 2
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 2
    """Minibatches per pass (gradient steps per pass)."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.28
    """PPO ratio clip above 1 (DAPO's clip-higher)."""
    kl_coef: float = 0.0
    """beta: weight of the KL penalty to the frozen reference (0 = no reference model)."""
    kl_kind: str = "k3"
    """KL estimator: 'k1', 'k2', 'k3'."""
    loss_agg: str = "token_mean"
    """Loss aggregation: 'token_mean' (DAPO), 'seq_mean' (GRPO), 'token_sum_norm' (Dr. GRPO), 'segment_balanced'."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (the pre-clip norm is logged)."""

    # ---- diagnostics / evaluation / checkpoints
    diag_every: int = 1
    """Compute per-segment gradients and their cosine every N steps (costs one extra backward)."""
    volatility_window: int = 10
    """Window (steps) of the rolling coefficient of variation of the gradient norm."""
    eval_every: int = 10
    """Held-out evaluation every N steps (0 = only at the end)."""
    eval_tasks: int = 32
    """Held-out tasks per evaluation (toolworld test split)."""
    eval_temperature: float = 0.0
    """Evaluation sampling temperature (0 = greedy)."""
    save_every: int = 10
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (oldest removed)."""
    sample_html_every: int = 10
    """Record one group per N steps for the token-level advantage page."""


_CHOICES: dict[str, tuple[str, ...]] = {
    "scale": ("group", "batch", "none"),
    "empty_tool": ("response", "include", "exclude"),
    "kl_kind": ("k1", "k2", "k3"),
    "loss_agg": ("token_mean", "seq_mean", "token_sum_norm", "segment_balanced"),
}
_POSITIVE = ("steps", "tasks_per_step", "max_turns", "max_new_tokens", "max_total_tokens", "ppo_epochs", "minibatches", "eval_tasks", "volatility_window")
_NONNEG = ("warmup_steps", "weight_decay", "kl_coef", "summary_noise", "eval_every", "save_every", "diag_every", "eps", "tool_weight", "summary_weight", "turn_lambda", "sample_html_every", "eval_temperature")


def validate(cfg: TrainConfig) -> TrainConfig:
    """Raise ValueError naming the first bad field; return ``cfg`` otherwise."""
    from slca.advantages import list_estimators

    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        want = type(f.default)
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
            setattr(cfg, f.name, v)
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise ValueError(f"config field {f.name!r} must be {want.__name__}, got {v!r}")
    for name, choices in _CHOICES.items():
        if getattr(cfg, name) not in choices:
            raise ValueError(f"config field {name!r} must be one of {choices}, got {getattr(cfg, name)!r}")
    for name in _POSITIVE:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"config field {name!r} must be > 0, got {getattr(cfg, name)!r}")
    for name in _NONNEG:
        if getattr(cfg, name) < 0:
            raise ValueError(f"config field {name!r} must be >= 0, got {getattr(cfg, name)!r}")
    if cfg.group_size < 2:
        raise ValueError(f"config field 'group_size' must be >= 2 (GRPO compares rollouts of one prompt), got {cfg.group_size}")
    if cfg.estimator not in list_estimators():
        raise ValueError(f"config field 'estimator' must be a registered estimator {list_estimators()}, got {cfg.estimator!r}")
    if not 0 < cfg.top_p <= 1:
        raise ValueError(f"config field 'top_p' must be in (0, 1], got {cfg.top_p}")
    if cfg.temperature <= 0:
        raise ValueError(f"config field 'temperature' must be > 0, got {cfg.temperature}")
    if not 0 <= cfg.clip_low < 1 or cfg.clip_high < 0:
        raise ValueError(f"config fields 'clip_low' in [0, 1) and 'clip_high' >= 0, got {cfg.clip_low}, {cfg.clip_high}")
    if (cfg.tasks_per_step * cfg.group_size) < cfg.minibatches:
        raise ValueError(f"config field 'minibatches' ({cfg.minibatches}) exceeds the batch size ({cfg.tasks_per_step * cfg.group_size})")
    if cfg.max_new_tokens > cfg.max_total_tokens:
        raise ValueError(f"config field 'max_new_tokens' ({cfg.max_new_tokens}) exceeds 'max_total_tokens' ({cfg.max_total_tokens})")
    return cfg


def _coerce(name: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"config field {name!r} must be a boolean, got {raw!r}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"config field {name!r} must be an integer, got {raw!r}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"config field {name!r} must be a number, got {raw!r}") from None
    return raw


def apply_overrides(cfg: TrainConfig, overrides: list[str] | dict[str, Any]) -> TrainConfig:
    """Apply ``["field=value", ...]`` (strings, coerced to the field's type) or a dict."""
    names = {f.name: f for f in dataclasses.fields(cfg)}
    items = overrides.items() if isinstance(overrides, dict) else (_split(o) for o in overrides)
    for k, v in items:
        if k not in names:
            raise ValueError(f"unknown config field {k!r}; known: {sorted(names)}")
        setattr(cfg, k, _coerce(k, v, getattr(cfg, k)) if isinstance(v, str) else v)
    return cfg


def _split(o: str) -> tuple[str, str]:
    if "=" not in o:
        raise ValueError(f"override {o!r} must look like field=value")
    k, v = o.split("=", 1)
    return k.strip(), v.strip()


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults, then the file (YAML or JSON mapping of field: value), then overrides; validated."""
    cfg = TrainConfig()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"config file {str(p)!r} does not exist")
        data = yaml.safe_load(p.read_text()) if p.suffix in (".yaml", ".yml") else json.loads(p.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"config file {str(p)!r} must hold a mapping of field: value")
        apply_overrides(cfg, data)
    if overrides:
        apply_overrides(cfg, overrides)
    return validate(cfg)


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def field_docs() -> dict[str, str]:
    """Docstring of every field (parsed from the source), for `slca train --help-config`."""
    import ast
    import inspect

    src = inspect.getsource(TrainConfig)
    tree = ast.parse(src)
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
            docs[a.target.id] = str(b.value.value)  # type: ignore[union-attr]
    return docs

