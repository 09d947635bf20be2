"""Which policy tokens are reasoning, a tool call, or other text: span labels from the token ids.

The segments slca routes advantages by come from the environment boundary
(:func:`slca.core.segments.segment_masks`): every policy token before the last tool
result is execution. Two refinements need to know what each policy token *is*
(docs/beyond.md, "Reasoning and calls inside text"): ``slca_think`` gives the
reasoning before a call its own tier, and ``segmentation="span"`` gives the text
around a call the summary advantage. :func:`span_labels` labels each policy token

* :data:`~slca.core.segments.SPAN_THINK`: inside the turn's leading ``<think>...</think>``,
  tags included (as :meth:`slca.chat.ToolCallFormat.parse` reads reasoning);
* :data:`~slca.core.segments.SPAN_CALL`: inside a call span of the format
  (:meth:`slca.chat.ToolCallFormat.call_spans`: ``<tool_call>...</tool_call>`` for
  ``hermes``, the tags and the JSON list for ``json_list``, the JSON calls for ``llama3_json``);
* :data:`~slca.core.segments.SPAN_TEXT`: any other policy text;

and 0 (:data:`~slca.core.segments.SPAN_NONE`) every other token. Each turn (a run of
policy tokens) is decoded and parsed on its own, as :mod:`slca.chat.maskcheck` reads
it (``tokenizer.decode(ids, skip_special_tokens=False)``).

Rules, each deterministic:

* **Characters to tokens.** Token ``k`` of a turn carries the characters that
  streaming detokenisation emits for it (the incremental decoding of vLLM and TGI:
  the text decoding adds once it ends on a whole character, so the bytes of a
  character split over several tokens belong to the token that completes it). When
  the streamed pieces do not add up to the decoded turn (a tokenizer whose decoding
  is not a concatenation), token ``k`` carries instead the characters by which
  ``decode(turn[:k + 1])`` extends the longest prefix of the decoded turn seen so far.
* **Straddling tokens.** A token that carries characters of several spans takes the
  largest label among them: call over reasoning over text. So a call (and reasoning)
  is the smallest run of whole tokens that covers its characters.
* **Whitespace and empty tokens.** Whitespace outside reasoning and calls takes the
  label of the character before it (at the start of a turn, of the one after it);
  a turn of whitespace only is text. A token that carries no character (an
  incomplete byte sequence the next token completes) takes the label of the next
  token that carries one, else of the one before. An end-of-turn token (``end_of_turn``)
  is not decoded and takes the label of the token before it (a turn that ends on a
  call ends as a call).
* **Odd model output.** Labelling never raises on what the model wrote: an unclosed
  ``<think>`` makes the rest of the turn reasoning, an unclosed ``<tool_call>`` runs to
  the next tag or the end of the turn, JSON that does not parse stays inside its call
  span (as the parser reads them; :mod:`slca.chat.formats`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from slca.chat.formats import ToolCallFormat, get_format, list_formats, think_span
from slca.core.beyond import SPAN_LABELS_INPUT
from slca.core.registry import EstimatorSpec
from slca.core.segments import SEGMENTATIONS, SPAN_CALL, SPAN_NONE, SPAN_TEXT, SPAN_THINK

__all__ = [
    "char_labels",
    "token_ends",
    "token_labels",
    "row_span_labels",
    "span_labels",
    "span_format",
    "span_formats",
    "spans_needed",
    "check_segmentation",
]


def spans_needed(spec: EstimatorSpec, segmentation: str) -> bool:
    """Whether a host must compute :func:`span_labels` for a run: ``segmentation="span"``, or an estimator that
    needs ``span_labels`` (``slca_think``)."""
    return segmentation == "span" or SPAN_LABELS_INPUT.name in spec.needs


def check_segmentation(segmentation: Any, fmt: Any, spec: EstimatorSpec) -> None:
    """ValueError, one line, for a ``segmentation`` not in :data:`~slca.core.segments.SEGMENTATIONS`, or a run that
    needs span labels (:func:`spans_needed`) with a tool-call format that has no call spans."""
    if segmentation not in SEGMENTATIONS:
        raise ValueError(f"segmentation must be one of {list(SEGMENTATIONS)}, got {segmentation!r}")
    if spans_needed(spec, segmentation):
        why = "segmentation='span'" if segmentation == "span" else f"estimator {spec.name!r} (it reads span_labels)"
        try:
            span_format(fmt)
        except ValueError as e:
            raise ValueError(f"{why} needs each policy token labelled reasoning / call / text: {e}") from None


def span_formats() -> list[str]:
    """The tool-call formats whose calls are spans of the turn's text (all but ``openai``)."""
    return [n for n in list_formats() if get_format(n).call_spans("") is not None]


def span_format(fmt: str | ToolCallFormat) -> ToolCallFormat:
    """``fmt`` as a format that can label spans; ValueError naming it and the ones that can otherwise."""
    f = get_format(fmt)
    if f.call_spans("") is None:
        raise ValueError(f"tool-call format {f.name!r} does not write its calls as spans of the turn's text (an openai "
                         f"turn is one JSON message), so its tokens cannot be labelled reasoning / call / text; span "
                         f"labels need one of {span_formats()}")
    return f


def char_labels(text: str, fmt: str | ToolCallFormat) -> list[int]:
    """(len(text),) the span label of each character of one assistant turn's text.

    Reasoning (:func:`slca.chat.formats.think_span`) and calls (``fmt.call_spans``)
    first; whitespace outside them takes the label of the character before it (of the
    one after it at the start of the turn). Never raises on model output.
    """
    f = span_format(fmt)
    n = len(text)
    out = [SPAN_TEXT] * n
    fixed = [False] * n
    th = think_span(text)
    spans = ([(th, SPAN_THINK)] if th else []) + [(s, SPAN_CALL) for s in f.call_spans(text)]
    for (a, b), label in spans:
        out[a:b] = [label] * (b - a)
        fixed[a:b] = [True] * (b - a)
    prev = None
    for i, ch in enumerate(text):  # whitespace outside the spans: the label of the character before it
        if fixed[i] or not ch.isspace():
            prev = out[i]
        elif prev is not None:
            out[i] = prev
    first = next((i for i, ch in enumerate(text) if fixed[i] or not ch.isspace()), n)
    if first < n:  # leading whitespace: the label of the first character that is not
        out[:first] = [out[first]] * first
    return out


def _stream_ends(ids: Sequence[int], decode: Callable[[list[int]], str]) -> tuple[list[int], str]:
    """Streaming detokenisation (vLLM's ``detokenize_incrementally``): each token's end in the streamed text, and the text."""
    ends, pieces = [], []
    prefix, read, length = 0, 0, 0
    for k in range(len(ids)):
        before = decode(list(ids[prefix:read]))
        now = decode(list(ids[prefix:k + 1]))
        if len(now) > len(before) and not now.endswith("\ufffd"):
            pieces.append(now[len(before):])
            length += len(pieces[-1])
            prefix, read = read, k + 1
        ends.append(length)
    return ends, "".join(pieces)


def token_ends(ids: Sequence[int], decode: Callable[[list[int]], str]) -> tuple[list[int], str]:
    """``(ends, text)``: ``text = decode(ids)`` and, for each token ``k``, the end of the characters it carries
    (token ``k`` carries ``text[ends[k - 1]:ends[k]]``; the module's rule). Non-decreasing; ``ends[-1] == len(text)``.

    Args:
        ids: (n,) token ids of one turn.
        decode: token ids -> text.
    """
    text = decode(list(ids))
    ends, streamed = _stream_ends(ids, decode)
    if streamed == text:
        return ends, text
    ends, best = [], 0
    for k in range(len(ids)):  # the exact rule: the longest prefix of the turn's text decoded so far
        prefix = decode(list(ids[:k + 1]))
        best = max(best, len(os.path.commonprefix([prefix, text])))
        ends.append(best)
    if ends:
        ends[-1] = len(text)
    return ends, text


def token_labels(ids: Sequence[int], decode: Callable[[list[int]], str], fmt: str | ToolCallFormat,
                 end_of_turn: Collection[int] = ()) -> list[int]:
    """(n,) the span label of each token of one assistant turn (the module's rules).

    Args:
        ids: (n,) the turn's token ids (a run of policy tokens).
        decode: token ids -> text, special tokens kept.
        fmt: the tool-call format the policy writes.
        end_of_turn: ids that end a turn: a last token among them is not decoded and takes the label before it.
    """
    ids = [int(x) for x in ids]
    n = len(ids)
    if n == 0:
        return []
    body = ids[:-1] if ids[-1] in end_of_turn else ids
    ends, text = token_ends(body, decode)
    chars = char_labels(text, fmt)
    out: list[int | None] = []
    start = 0
    for e in ends:
        out.append(max(chars[start:e]) if e > start else None)
        start = e
    nxt = None
    for k in range(len(out) - 1, -1, -1):  # a token without characters: the next token's label ...
        if out[k] is None:
            out[k] = nxt
        else:
            nxt = out[k]
    prev = SPAN_TEXT
    for k in range(len(out)):  # ... else the one before (else text)
        if out[k] is None:
            out[k] = prev
        prev = out[k]
    if len(body) < n:
        out.append(out[-1] if out else SPAN_TEXT)
    return [int(x) for x in out]  # type: ignore[arg-type]


def row_span_labels(ids: Sequence[int], policy: Sequence[int], *, decode: Callable[[list[int]], str],
                    fmt: str | ToolCallFormat, end_of_turn: Collection[int] = ()) -> list[int]:
    """(n,) span labels of one response: each run of policy tokens labelled as a turn (:func:`token_labels`), 0 elsewhere.

    Args:
        ids: (n,) the response's token ids (real tokens; padding may follow if ``policy`` is 0 there).
        policy: (n,) 0/1, 1 on policy tokens.
    """
    f = span_format(fmt)
    eot = frozenset(int(x) for x in end_of_turn)
    out = [SPAN_NONE] * len(ids)
    t, n = 0, min(len(ids), len(policy))
    while t < n:
        if not policy[t]:
            t += 1
            continue
        s = t
        while t < n and policy[t]:
            t += 1
        out[s:t] = token_labels(ids[s:t], decode, f, eot)
    return out


def span_labels(ids: Any, model_mask: Any, *, tokenizer: Any = None, decode: Callable[[list[int]], str] | None = None,
                fmt: str | ToolCallFormat, end_of_turn: Collection[int] = (), lengths: Sequence[int] | None = None) -> torch.Tensor:
    """(B, T) int8 span labels of a batch of responses (:func:`row_span_labels` per row).

    Args:
        ids: (B, T) response token ids (a tensor or nested lists).
        model_mask: (B, T) 0/1 policy tokens.
        tokenizer: has ``decode(ids, skip_special_tokens=False)``; or give ``decode``.
        fmt: the tool-call format the policy writes (one of :func:`span_formats`).
        end_of_turn: the ids that end an assistant turn.
        lengths: (B,) real tokens per row (default: every position; policy tokens past it are not labelled).

    Returns:
        (B, T) torch.int8 on ``model_mask``'s device: :data:`~slca.core.segments.SPAN_TEXT`,
        ``SPAN_THINK`` or ``SPAN_CALL`` on policy tokens, :data:`~slca.core.segments.SPAN_NONE` elsewhere.

    Raises:
        ValueError: a format without call spans, mismatched shapes, neither ``tokenizer`` nor ``decode``.
    """
    f = span_format(fmt)
    if decode is None:
        if tokenizer is None:
            raise ValueError("span_labels needs a tokenizer (or decode) to read the turns' text from the token ids")

        def decode(x: list[int]) -> str:
            return tokenizer.decode(x, skip_special_tokens=False)

    mm = torch.as_tensor(model_mask)
    ids_l = ids.tolist() if hasattr(ids, "tolist") else [list(r) for r in ids]
    mm_l = mm.tolist()
    if len(ids_l) != len(mm_l) or any(len(a) != len(b) for a, b in zip(ids_l, mm_l)):
        raise ValueError(f"span_labels: ids {_shape(ids_l)} and model_mask {tuple(mm.shape)} must have the same shape")
    out = torch.zeros(mm.shape, dtype=torch.int8)
    for i, (row, pol) in enumerate(zip(ids_l, mm_l)):
        n = len(row) if lengths is None else int(lengths[i])
        labels = row_span_labels(row[:n], pol[:n], decode=decode, fmt=f, end_of_turn=end_of_turn)
        if labels:
            out[i, :n] = torch.tensor(labels, dtype=torch.int8)
    return out.to(mm.device)


def _shape(rows: list[list[int]]) -> tuple[int, ...]:
    return (len(rows), len(rows[0])) if rows else (0,)
