"""Loading the policy to train: the embedded default model or a local causal LM folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["load_policy"]


def load_policy(spec: str, device: str) -> tuple[torch.nn.Module, Any]:
    """``(model on device, tokenizer)``: the embedded default (``"default"``) or a causal LM folder with a chat template."""
    if spec == "default":
        from slca.models import load_default

        model, tok = load_default()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = Path(spec)
        if not p.exists():
            raise ValueError(f"model {spec!r}: no such path (hub downloads are not used; pass a local folder)")
        tok = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(f"model {spec!r}: its tokenizer has no chat template")
    return model.to(device), tok
