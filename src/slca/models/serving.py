"""Model folders for an OpenAI-compatible server: ``slca export-model``.

``transformers serve`` (transformers' own FastAPI server: ``/v1/chat/completions``,
``/v1/models``, ``/health``) serves any ``save_pretrained`` folder; slca's LLM-backed
parts talk to it as to vLLM: :class:`slca.env.LLMSimulator`, :class:`slca.rewards.OpenAIJudge`
and tau2's user simulator (``slca eval --suite tau2 --user-url``). See docs/environment.md.

How the server turns a generated turn into a message is the tokenizer's
``response_template`` (or, without one, a fallback transformers keeps for Qwen
models). A template that parses ``<tool_call>`` blocks as JSON makes the server
answer **HTTP 500** when the model writes a malformed call (the parser raises), and a
malformed call from a small model is ordinary output, not a server fault. So
:func:`export_for_serving` writes the folder with :data:`TEXT_RESPONSE_TEMPLATE` by
default: the whole turn comes back as ``content``, tool-call markup included, and
slca's callers parse what they need themselves (:mod:`slca.chat.formats` never
raises). ``tool_calls=True`` keeps the parsing template (OpenAI ``tool_calls`` in the
reply, for a client that needs them, such as tau2's telecom user tools) and with it
the 500s, which slca's clients count and report as endpoint faults.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

__all__ = ["TEXT_RESPONSE_TEMPLATE", "export_for_serving"]

TEXT_RESPONSE_TEMPLATE: dict = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"}},
}
"""A ChatML turn read as plain text: everything up to ``<|im_end|>`` is the message content (a turn
with ``<tool_call>`` blocks included), so no model output can make the server's parser raise."""


def _merged(model: Any) -> Any:
    """A LoRA-wrapped model with its adapters merged into the weights (a plain model as it is)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def export_for_serving(spec: str, out: str | Path, *, tool_calls: bool = False, chat_template: str = "") -> Path:
    """Write ``spec`` (a named model such as ``smollm2`` or ``default``, a model folder, a LoRA checkpoint or a
    hub id) as a ``save_pretrained`` folder ``out`` for ``transformers serve``, float32.

    The folder holds the model's chat template (``chat_template``: a .jinja path or inline text to use another) and
    :data:`TEXT_RESPONSE_TEMPLATE`, or, with ``tool_calls=True``, the template that parses ``<tool_call>`` blocks
    into OpenAI ``tool_calls`` (:data:`slca.models.default.RESPONSE_TEMPLATE`). ``out`` must not hold a model yet.
    """
    from slca.models.default import RESPONSE_TEMPLATE
    from slca.policy import load_policy

    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {str(out)!r}: exists and is not empty")
    model, tok = load_policy(spec, chat_template=chat_template, template_fix="set chat_template (a .jinja file or inline)")
    model = _merged(model)
    tok.response_template = copy.deepcopy(RESPONSE_TEMPLATE if tool_calls else TEXT_RESPONSE_TEMPLATE)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    from slca.runs import umask_modes

    umask_modes(out)
    return out
