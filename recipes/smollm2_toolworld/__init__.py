"""Stage 1 of issue 42: SFT that makes SmolLM2-135M-Instruct a toolworld tool caller, as a LoRA adapter.

toolworld ``train`` demonstrations (the warm start's generator, :mod:`recipes.warmstart.demos`) rendered
in SmolLM2's own tool-calling template -> LoRA SFT on the assistant's tokens (:mod:`.sft`, resumable)
-> the adapter and its record (:mod:`.build`), which ships in the package for ``model=smollm2-toolworld``
(:mod:`slca.models.smollm2_toolworld`) -> the evaluation before and after (:mod:`.evaluate`). Everything
that decides the adapter is one :class:`Stage1Config` (:mod:`.config`), whose values only ``train_heldout``
may choose. Not part of the installed ``slca`` package: run it from a source checkout with
``bash scripts/build_smollm2_toolworld.sh`` (docs/training.md, "SmolLM2 as a tool caller: stage 1").
"""

from .build import attach_lora, build_adapter, build_demonstrations, data_digest, fingerprint, measure_steps, ship_adapter, tokens_digest
from .config import ALL_LINEAR, RECIPE_VERSION, Stage1Config, apply_overrides
from .evaluate import BFCL_CATEGORIES, BFCL_LIMIT, MIN_TOOL_TASKS, SPLITS, evaluate, split_tasks, summarize
from .sft import Example, TrainStats, encode, train_lora

__all__ = [
    "ALL_LINEAR",
    "BFCL_CATEGORIES",
    "BFCL_LIMIT",
    "MIN_TOOL_TASKS",
    "RECIPE_VERSION",
    "SPLITS",
    "Example",
    "Stage1Config",
    "TrainStats",
    "apply_overrides",
    "attach_lora",
    "build_adapter",
    "build_demonstrations",
    "data_digest",
    "encode",
    "evaluate",
    "fingerprint",
    "measure_steps",
    "ship_adapter",
    "split_tasks",
    "summarize",
    "tokens_digest",
    "train_lora",
]
