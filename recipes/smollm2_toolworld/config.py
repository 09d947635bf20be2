"""The stage-1 recipe's configuration: everything that decides the ``smollm2-toolworld`` adapter.

**Selection rule.** The recipe's hyperparameters (every field of :class:`Stage1Config`: the data
count and mix, the LoRA shape, the optimisation) may only ever be chosen by tool-task success on
``train_heldout`` (new requests of the training distribution). ``test``, ``test_entities``,
``test_phrasings``, ``heldout_tools`` and BFCL are reported, never used to choose: a setting is not
changed, kept or compared because of them. A change to a default here names the ``train_heldout``
figures that chose it (docs/training.md, "SmolLM2 as a tool caller: stage 1").

The defaults were fixed before any SmolLM2 run, not tuned: the data settings are those of the
embedded model's shipped warm start (build PF3: the toolworld ``train`` split, data seed 0,
80% synthetic entities drawn by faker, half the requests paraphrased, the same quality mix
:class:`recipes.warmstart.config.DemoMix`), so both models learn from one generator; LoRA r 8 on
every linear layer of the 30 decoder layers (2.4M parameters, 9.8 MB in float32, within the 16 MB
the package ships); AdamW at 1e-3 with a short warm-up and cosine decay; the step count and batch
sized to the issue's CPU budget (about two CPU hours on this machine: 360 steps of 2,048 tokens at
most, about one pass over 1,200 demonstrations; docs/training.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from slca.env.toolworld import WARMSTART_DEMOS

from ..warmstart.augment import ENTITY_STYLES
from ..warmstart.config import DemoMix

__all__ = ["RECIPE_VERSION", "ALL_LINEAR", "Stage1Config", "apply_overrides"]

#: Bump when the recipe's code (encoding, LoRA wrapping, the SFT loop) changes what a config produces
#: from the same data; a change to the data or the config changes the fingerprint by itself.
RECIPE_VERSION = 1

#: ``(n_tasks, data_seed)`` of the requests ``train_heldout`` leaves out (the warm start's demonstrations):
#: this recipe's demonstrations are drawn from them, so ``train_heldout`` stays unseen.
WARMSTART_N_TASKS_LIMIT, WARMSTART_DATA_SEED = WARMSTART_DEMOS

#: Every linear layer of a Llama decoder layer (SmolLM2's attention and SwiGLU MLP).
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Stage1Config:
    """The SFT of SmolLM2-135M-Instruct into a toolworld tool caller (stage 1 of issue 42).

    Only ``train_heldout`` may choose these values (see the module docstring).
    """

    # ---- data: toolworld train-split demonstrations (recipes.warmstart.demos), SmolLM2's own tool template
    n_tasks: int = 1200
    """Demonstrations (toolworld ``train`` tasks, one each): about one pass in ``steps`` batches. At most the warm
    start's 12,000 of data seed 0: ``train_heldout`` leaves out exactly those requests, so it stays unseen."""
    data_seed: int = 0
    """Seeds the tasks, the synthetic entities, the paraphrases and the flaws. 0 only (see ``n_tasks``)."""
    synthetic_entities: float = 0.8
    """Share of demonstrations whose entities are replaced by fresh names (copying, not memorising)."""
    entity_style: str = "faker"
    """How those names are drawn (:data:`recipes.warmstart.augment.ENTITY_STYLES`)."""
    paraphrase: float = 0.5
    """Share of requests rephrased by the warm start's grammar (never a test template)."""
    mix: DemoMix = field(default_factory=DemoMix)
    """Demonstration quality mix (the warm start's: greedy decoding follows the majority, flaws leave RL work)."""
    max_length: int = 1024
    """Demonstrations longer than this many tokens are dropped, not cut (none is, at about 850 tokens at most)."""

    # ---- LoRA (peft)
    lora_r: int = 8
    """Adapter rank."""
    lora_alpha: int = 16
    """Adapter scale numerator (scale ``lora_alpha / lora_r``)."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input (0: a resumed run is the uninterrupted one)."""
    lora_target_modules: tuple[str, ...] = ALL_LINEAR
    """Linear layers that get an adapter, in every decoder layer."""

    # ---- optimisation
    steps: int = 360
    """Optimizer steps (one length-bucketed batch each; epochs repeat with a new order). 360 steps of about 1,740
    tokens took 19.9 CPU s each here (one thread, the two cores shared): about 2 CPU hours."""
    batch_tokens: int = 2048
    """Token budget of a batch: rows x padded length <= this (3 demonstrations of ~560 tokens, up to 6 short ones)."""
    micro_tokens: int = 2048
    """Rows x padded length of one forward/backward; a batch is accumulated slice by slice (the same update)."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 15
    """Linear warm-up steps, then cosine decay to ``min_lr_ratio * lr``."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay on the adapter."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    seed: int = 0
    """Seeds the adapter's initialisation and the batch order."""
    checkpoint_every: int = 5
    """Steps between checkpoints (adapter, optimizer, batch order, statistics: about 30 MB)."""

    def __post_init__(self) -> None:
        if not 1 <= self.n_tasks <= WARMSTART_N_TASKS_LIMIT:
            raise ValueError(f"Stage1Config.n_tasks must be in [1, {WARMSTART_N_TASKS_LIMIT}] (train_heldout excludes only the "
                             f"first {WARMSTART_N_TASKS_LIMIT} train requests of data seed 0), got {self.n_tasks}")
        if self.data_seed != WARMSTART_DATA_SEED:
            raise ValueError(f"Stage1Config.data_seed must be {WARMSTART_DATA_SEED} (train_heldout excludes the requests of that data "
                             f"seed), got {self.data_seed}")
        if self.entity_style not in ENTITY_STYLES:
            raise ValueError(f"Stage1Config.entity_style must be one of {ENTITY_STYLES}, got {self.entity_style!r}")
        for name in ("synthetic_entities", "paraphrase", "lora_dropout"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"Stage1Config.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("max_length", "lora_r", "lora_alpha", "steps", "batch_tokens", "micro_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Stage1Config.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.warmup_steps < 0 or self.checkpoint_every < 0:
            raise ValueError("Stage1Config.warmup_steps and checkpoint_every must be >= 0")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"Stage1Config: lr must be > 0 and min_lr_ratio in [0, 1], got {self.lr}, {self.min_lr_ratio}")
        if not self.lora_target_modules:
            raise ValueError("Stage1Config.lora_target_modules is empty")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora_target_modules"] = list(self.lora_target_modules)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Stage1Config":
        d = dict(d)
        mix = DemoMix(**d.pop("mix", {}))
        if "lora_target_modules" in d:
            d["lora_target_modules"] = tuple(d["lora_target_modules"])
        return cls(mix=mix, **d)


def apply_overrides(cfg: Stage1Config, pairs: list[str]) -> Stage1Config:
    """``cfg`` with ``key=value`` overrides (``mix.verbose=0.1``, ``lora_target_modules=q_proj,v_proj``), typed as the field."""
    d = cfg.to_dict()
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected key=value")
        target, name = (d["mix"], key[4:]) if key.startswith("mix.") else (d, key)
        if name not in target or name == "mix":
            raise ValueError(f"--set {key}: not a field of Stage1Config ({', '.join(f.name for f in dataclasses.fields(Stage1Config))})")
        old = target[name]
        if isinstance(old, list):
            target[name] = [x.strip() for x in raw.split(",") if x.strip()]
        elif isinstance(old, bool):
            target[name] = raw.lower() in ("1", "true", "yes")
        else:
            target[name] = type(old)(raw)
    return Stage1Config.from_dict(d)
