"""The embedded default policy (a small Qwen2 model, its tokenizer and SFT warm start), SmolLM2-135M-Instruct
(``load_smollm2``, :mod:`slca.models.smollm2`) and model folders for a server (``export_for_serving``).

``load_default()`` loads the default build shipped with the package, or builds a
config on first use from toolworld demonstrations (nothing from the hub) and caches
it with ``save_pretrained``; both load with ``AutoModelForCausalLM`` /
``AutoTokenizer``. See docs/warmstart.md.
"""

from slca.models.config import RECIPE_VERSION, BuildConfig, DemoMix, ModelSize
from slca.models.default import (
    BuildReport,
    build_default,
    default_cache_root,
    default_model_dir,
    load_default,
    make_model,
    prepare_build,
    resolve_default_dir,
    shipped_model_dir,
)
from slca.models.named import NAMED_MODELS, load_named
from slca.models.serving import export_for_serving
from slca.models.sft import SFTConfig, SFTStats, sft_train
from slca.models.smollm2 import load_smollm2, smollm2_dir
from slca.models.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, chat_template, train_tokenizer

__all__ = [
    "ADDED_TOKENS",
    "RECIPE_VERSION",
    "SPECIAL_TOKENS",
    "BuildConfig",
    "BuildReport",
    "DemoMix",
    "ModelSize",
    "NAMED_MODELS",
    "SFTConfig",
    "SFTStats",
    "build_default",
    "chat_template",
    "default_cache_root",
    "default_model_dir",
    "export_for_serving",
    "load_default",
    "load_named",
    "load_smollm2",
    "make_model",
    "prepare_build",
    "resolve_default_dir",
    "sft_train",
    "shipped_model_dir",
    "smollm2_dir",
    "train_tokenizer",
]
