"""Load the embedded default policy: the weights shipped with the package, or a cached build.

``load_default()`` gives a small Qwen2 model and its tokenizer, built by the
project from nothing (no hub download) by the warm-start recipe. The recipe
(demonstrations, tokenizer training, SFT) lives outside the package, in the
repository's ``recipes/warmstart/`` (docs/warmstart.md); what ships is its
result: a ``save_pretrained`` folder of about 7 MB (:func:`shipped_model_dir`)
whose ``slca_build.json`` records the build config and its fingerprint (a
digest of the config, the recipe version and the data the recipe generates).

``load_default()`` loads the cache entry named by the shipped fingerprint if one
was built (``<root>/default-model/<fingerprint>``, ``<root>`` is ``$SLCA_CACHE``
or ``~/.cache/slca``), else the shipped weights; it needs no recipe and never
builds. Another config, ``rebuild=True``, or a package without shipped weights
builds with the recipe (:func:`slca.models.recipe.import_recipe`, found in a
source checkout) into the cache. A test in the repository keeps the shipped
fingerprint equal to the one the recipe gives for its default config, so a
recipe change cannot keep stale weights.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from importlib import resources
from pathlib import Path

import torch

from slca._fs import check_weights, replaceable_model_folder
from slca.models.recipe import import_recipe
from slca.models.tokenizer import chat_template

__all__ = [
    "INFO_FILE",
    "RESPONSE_TEMPLATE",
    "add_response_template",
    "default_cache_root",
    "default_model_dir",
    "load_default",
    "resolve_default_dir",
    "shipped_fingerprint",
    "shipped_model_dir",
]

#: How a generated assistant turn of the project's chat template parses back into a message
#: (transformers' ``response_template``, read by ``tokenizer.parse_response``; TRL's tool loop
#: needs it). The template renders turns as Qwen2.5 does (hermes ``<tool_call>`` JSON blocks,
#: ``<|im_end|>``), so this is the Qwen2.5/Qwen3 template TRL 1.16 ships for those.
RESPONSE_TEMPLATE: dict = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def add_response_template(tokenizer):
    """Give a tokenizer with the project's chat template its :data:`RESPONSE_TEMPLATE` (in place).

    The build calls it before saving the tokenizer (``save_pretrained`` stores it in
    ``tokenizer_config.json``) and :func:`load_default` on every load, so a model built
    before it existed gets it too. A tokenizer with another chat template, or one that
    already has a response template, is returned unchanged. Not part of the build
    fingerprint: it only tells parsers how to read the model's output.
    """
    if tokenizer.chat_template == chat_template() and getattr(tokenizer, "response_template", None) is None:
        tokenizer.response_template = copy.deepcopy(RESPONSE_TEMPLATE)
    return tokenizer


INFO_FILE = "slca_build.json"
"""The build record in a model folder: ``fingerprint``, ``config``, ``data`` digests, ``report``, loss curves."""


def default_cache_root() -> Path:
    """``$SLCA_CACHE`` or ``~/.cache/slca``."""
    env = os.environ.get("SLCA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "slca"


def shipped_model_dir() -> Path:
    """The default model built by the recipe and shipped in the package (may be absent in a source tree)."""
    return Path(str(resources.files("slca.models").joinpath("shipped")))


def shipped_fingerprint() -> str | None:
    """The fingerprint recorded with the shipped weights, or None when none are shipped (or the record is unreadable)."""
    try:
        return json.loads((shipped_model_dir() / INFO_FILE).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def default_model_dir(cache_dir: str | Path | None = None, config=None) -> Path:
    """Where the model for ``config`` is (or will be) cached: ``<cache_dir>/<fingerprint>``.

    ``cache_dir`` defaults to ``default_cache_root() / "default-model"``. Without a
    ``config`` the fingerprint is the shipped weights' (no recipe needed); a config
    (``recipes.warmstart.BuildConfig``), or a package without shipped weights, asks
    the recipe for its fingerprint.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root() / "default-model"
    name = shipped_fingerprint() if config is None else None
    if name is None:
        recipe = import_recipe()
        name = recipe.fingerprint(config if config is not None else recipe.BuildConfig())
    return root / name


def resolve_default_dir(cache_dir: str | Path | None = None, config=None) -> tuple[Path, bool]:
    """Where the model for ``config`` is loaded from, and whether it must be built first.

    Its cache entry when one was built, else the shipped weights when their recorded
    fingerprint is the config's (the default config's), else the cache entry to build.
    """
    path = default_model_dir(cache_dir, config)
    if (path / INFO_FILE).exists():
        return path, False
    if shipped_fingerprint() == path.name:
        return shipped_model_dir(), False
    return path, True


def load_default(cache_dir: str | Path | None = None, *, rebuild: bool = False, progress: bool = True, config=None):
    """The embedded default policy: ``(model, tokenizer)``: the shipped build, or built and cached on first use.

    Loading the default needs only the package; building (``rebuild``, another
    ``config``, or no shipped weights) needs the warm-start recipe of a source
    checkout (:func:`slca.models.recipe.import_recipe`).

    Args:
        cache_dir: folder of cache entries (default ``$SLCA_CACHE/default-model``
            or ``~/.cache/slca/default-model``).
        rebuild: build again (into the cache) even if a cache entry or shipped weights exist.
        progress: show rich progress while building.
        config: the build config (a ``recipes.warmstart.BuildConfig``; default: the shipped build's).

    Returns:
        ``(Qwen2ForCausalLM in eval mode, PreTrainedTokenizerFast)`` loaded with
        ``AutoModelForCausalLM`` / ``AutoTokenizer`` from the cache entry.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if rebuild:
        recipe = import_recipe()
        config = config if config is not None else recipe.BuildConfig()
        path = default_model_dir(cache_dir, config)
        problem = replaceable_model_folder(path, partial=True)
        if problem is not None:  # a cache entry holds a model and nothing else: never delete what a build did not write
            raise ValueError(f"rebuild: {problem}")
        shutil.rmtree(path, ignore_errors=True)
        recipe.build_default(path, config, progress=progress)
    else:
        path, missing = resolve_default_dir(cache_dir, config)
        if missing:
            import_recipe().build_default(path, config, progress=progress)
    check_weights(path)  # a weights file cut short: one ValueError naming it, not safetensors' traceback
    tokenizer = add_response_template(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer
