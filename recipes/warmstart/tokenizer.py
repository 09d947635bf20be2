"""Training the embedded default model's tokenizer: byte-level BPE on the rendered demonstrations.

Same conventions as Qwen2.5's tokenizer, so one code path serves the tiny model
and real Qwen models:

* byte-level BPE, so any text encodes and nothing maps to an unknown token,
  behind Qwen2's pre-tokenizer split (the GPT-4-style regex) with one change:
  a word never absorbs the space before it (``" Boston"`` is ``" "`` +
  ``"Boston"``), so a name in the request and the same name inside a JSON
  argument (``"city": "Boston"``) are the same tokens and the model can learn to
  copy unseen names (Qwen's split gives ``"ĠB" "ogota"`` in text but
  ``"B" "ogota"`` in JSON). It costs about a fifth more tokens per conversation;
* special tokens ``<|endoftext|>`` (padding), ``<|im_start|>``, ``<|im_end|>``
  (end of turn, the eos token) and the non-special added tokens
  ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``,
  ``<think>``, ``</think>`` -- each a single id, never split by BPE;
* the project's Qwen2.5-style chat template (``src/slca/models/chat_template.jinja``;
  the tokens and the template are the library's, :mod:`slca.models.tokenizer`).

Training uses the ``tokenizers`` library; the result is wrapped as a
:class:`transformers.PreTrainedTokenizerFast` so that ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` round-trip it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from slca.models.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, chat_template

__all__ = [
    "PRETOKENIZE_REGEX",
    "QWEN2_PRETOKENIZE_REGEX",
    "PRETOKENIZE_REGEX_DIGIT_RUNS",
    "train_tokenizer",
]

#: Qwen2's pre-tokenizer split (from its tokenizer.json).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: The split used here: Qwen2's, except that letters take no leading whitespace.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\s\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: :data:`PRETOKENIZE_REGEX` with digit runs kept whole (``\p{N}+``), so BPE can merge
#: frequent numbers (years, months, days) into one token each, as GPT-2's split does.
PRETOKENIZE_REGEX_DIGIT_RUNS = PRETOKENIZE_REGEX.replace(r"|\p{N}|", r"|\p{N}+|")

_ALL_ADDED = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))


def _without_added_tokens(texts: Iterable[str]) -> Iterator[str]:
    # BPE training does not know the added tokens; feed only the text between them
    # so that no merge learns pieces of "<|im_start|>" and the like.
    for text in texts:
        for piece in _ALL_ADDED.split(text):
            if piece:
                yield piece


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1536, *, min_frequency: int = 2, model_max_length: int = 1024,
                    digit_runs: bool = False):
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers.

    Args:
        texts: training text, e.g. rendered chat conversations; occurrences of the
            special / added tokens are cut out before training.
        vocab_size: total vocabulary size including the 256 byte symbols and the
            9 special / added tokens.
        min_frequency: a pair must occur this often to be merged.
        model_max_length: stored on the tokenizer (the model's context length).
        digit_runs: split with :data:`PRETOKENIZE_REGEX_DIGIT_RUNS` (a run of digits is one
            pre-token, so ``2025-07-16`` can be 5 tokens) instead of one digit per token as
            Qwen2 does (10 tokens). A copied date of single digits is ambiguous to copy by
            content: every ``0`` of the request is followed by a different digit.

    Returns:
        A ``PreTrainedTokenizerFast`` with eos ``<|im_end|>``, pad
        ``<|endoftext|>``, no bos, and the project's chat template.
    """
    n_fixed = 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    if vocab_size <= n_fixed:
        raise ValueError(f"vocab_size must exceed the {n_fixed} byte and special symbols, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX_DIGIT_RUNS if digit_runs else PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS) - len(ADDED_TOKENS),
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_without_added_tokens(texts), trainer)
    # Added after training so they sit at the end of the vocabulary, as in Qwen2.5.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
        chat_template=chat_template(),
        clean_up_tokenization_spaces=False,
    )
