"""The embedded default model's tokens and chat template (what a tokenizer of that model looks like).

Same conventions as Qwen2.5's tokenizer, so one code path serves the tiny model
and real Qwen models: special tokens ``<|endoftext|>`` (padding), ``<|im_start|>``,
``<|im_end|>`` (end of turn, the eos token), the non-special added tokens
``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``,
``<think>``, ``</think>`` (each a single id), and the project's Qwen2.5-style chat
template (``chat_template.jinja`` beside this module). The tokenizer itself is
trained by the warm-start recipe (``recipes/warmstart/tokenizer.py``, outside the
package) and ships with the default model's weights.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["SPECIAL_TOKENS", "ADDED_TOKENS", "chat_template"]

#: ChatML control tokens, as in Qwen2.5 (``special=True``: dropped by ``skip_special_tokens``).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Tool and reasoning tags, as in Qwen2.5/Qwen3 (added tokens, ``special=False``: kept when decoding).
ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)


def chat_template() -> str:
    """The project's Qwen2.5-style chat template (``src/slca/models/chat_template.jinja``)."""
    return resources.files("slca.models").joinpath("chat_template.jinja").read_text(encoding="utf-8")
