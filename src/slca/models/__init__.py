"""The embedded default policy (a small Qwen2 model and its tokenizer, shipped as weights),
SmolLM2-135M-Instruct (``load_smollm2``, :mod:`slca.models.smollm2`), SmolLM2 with its shipped stage-1
tool-calling adapter (``load_smollm2_toolworld``, :mod:`slca.models.smollm2_toolworld`) and model folders for a
server (``export_for_serving``).

``load_default()`` loads the default build shipped with the package (or its cache entry);
both load with ``AutoModelForCausalLM`` / ``AutoTokenizer``. The recipe that builds it
(toolworld demonstrations, tokenizer training, SFT warm start) is not part of the package:
it is ``recipes/warmstart/`` in the repository (:func:`import_recipe`, ``slca build-model``).
See docs/warmstart.md.
"""

from slca.models.default import (
    RESPONSE_TEMPLATE,
    add_response_template,
    default_cache_root,
    default_model_dir,
    load_default,
    resolve_default_dir,
    shipped_fingerprint,
    shipped_model_dir,
)
from slca.models.named import NAMED_MODELS, load_named
from slca.models.recipe import RecipeNotFoundError, find_recipe, import_recipe
from slca.models.serving import export_for_serving
from slca.models.smollm2 import load_smollm2, smollm2_dir
from slca.models.smollm2_toolworld import load_smollm2_toolworld
from slca.models.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, chat_template

__all__ = [
    "ADDED_TOKENS",
    "NAMED_MODELS",
    "RESPONSE_TEMPLATE",
    "SPECIAL_TOKENS",
    "RecipeNotFoundError",
    "add_response_template",
    "chat_template",
    "default_cache_root",
    "default_model_dir",
    "export_for_serving",
    "find_recipe",
    "import_recipe",
    "load_default",
    "load_named",
    "load_smollm2",
    "load_smollm2_toolworld",
    "resolve_default_dir",
    "shipped_fingerprint",
    "shipped_model_dir",
    "smollm2_dir",
]
