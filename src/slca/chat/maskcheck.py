"""Do the segment masks agree with the conversation that produced them?

slca routes the execution advantage to the tool mask and the summary advantage to the
summary mask (:func:`slca.core.segments.segment_masks`), both read from the host's
environment-boundary mask. When that mask and the token ids drift apart (a chat template
that re-tokenises a turn boundary differently, TRL #5144 / #5224; a custom
``rollout_func``'s ``env_mask`` off by a token), training goes on silently on the wrong
tokens. :func:`check_segment_masks` reads each row back against its conversation:

* the masks' policy runs (maximal runs of tool or summary tokens) are the conversation's
  assistant turns, one for one;
* no run reaches past an end-of-turn token, and a run that other tokens follow ends at one
  (so no environment or template token lies inside a policy segment, and no turn's end
  lies outside it);
* each run of the tool mask decodes to a tool turn (a call, or an attempted call the
  environment answered as failed) with the calls and text of its conversation turn, as
  :meth:`slca.chat.ToolCallFormat.parse` reads them (which never raises on model output);
* the summary run decodes to the conversation's last assistant turn: the final answer.

Whitespace at the edges of a turn's text is not compared (hosts strip it differently);
a shifted boundary still shows in the end-of-turn check. The check costs one decode and
one parse per turn (see docs/training.md for the measured cost); it never changes the masks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slca.chat.formats import ToolCallFormat, get_format
from slca.types import ParsedTurn

__all__ = ["MISMATCH_KINDS", "MaskMismatch", "MaskMismatchError", "check_row_masks", "check_segment_masks", "enforce_mask_check"]

MISMATCH_KINDS = ("turns", "boundary", "call", "summary")
"""What disagreed: the number of policy runs and assistant turns; a run's end against the end-of-turn
token (environment tokens inside a policy segment); a tool-segment run against its call turn; the
summary run against the final answer."""


@dataclass(frozen=True)
class MaskMismatch:
    """The first disagreement found on one row."""

    row: int  # the row's index in the batch
    name: str  # how the host names the row, e.g. "rollout 5 (task 'weather-3')"
    kind: str  # one of MISMATCH_KINDS
    detail: str  # what disagreed, one line

    def __str__(self) -> str:
        return f"{self.name}: {self.kind}: {self.detail}"


class MaskMismatchError(RuntimeError):
    """More rows disagreed with their conversations than the run allows."""


def _short(text: str, n: int = 80) -> str:
    text = text if len(text) <= n else text[: n - 3] + "..."
    return repr(text)


def _runs(tool: Sequence[int], summary: Sequence[int]) -> list[tuple[int, int, str]]:
    """``(start, end, segment)`` of each maximal run of policy tokens, ``segment`` "tool" or "summary"."""
    out: list[tuple[int, int, str]] = []
    seg_prev = None
    for t, (a, b) in enumerate(zip(tool, summary)):
        seg = "tool" if a else ("summary" if b else None)
        if seg is not None and seg == seg_prev:
            s, _, _ = out[-1]
            out[-1] = (s, t + 1, seg)
        elif seg is not None:
            out.append((t, t + 1, seg))
        seg_prev = seg
    return out


def _text(content: Any) -> str:
    """A message's text content (a string, a list of ``{"type": "text"}`` parts, or None)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def _args(a: Any) -> str:
    if isinstance(a, str):
        try:
            a = json.loads(a) if a.strip() else {}
        except ValueError:
            return a
    return json.dumps(a, sort_keys=True, ensure_ascii=False, default=str)


def _shape(p: ParsedTurn) -> tuple[list[tuple[str, str]], str]:
    return [(c.name, _args(c.arguments)) for c in p.calls], p.content.strip()


def _expected(msg: Mapping[str, Any], fmt: ToolCallFormat) -> tuple[list[tuple[str, str]], str, bool]:
    """``(calls, content, is_tool_turn)`` of a conversation's assistant message: its ``tool_calls`` when it has
    them (OpenAI style, as TRL and slca's rollouts write them), else its content as ``fmt`` parses it."""
    content = _text(msg.get("content"))
    tcs = msg.get("tool_calls")
    if tcs:
        calls = []
        for tc in tcs:
            fn = tc.get("function", tc) if isinstance(tc, Mapping) else {}
            calls.append((str(fn.get("name", "")), _args(fn.get("arguments", {}))))
        return calls, fmt.parse(content).content.strip() if content else "", True
    p = fmt.parse(content)
    return (*_shape(p), p.is_tool_turn)


def check_row_masks(
    ids: Sequence[int],
    tool: Sequence[int],
    summary: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    *,
    decode: Callable[[list[int]], str],
    fmt: str | ToolCallFormat,
    end_of_turn: Collection[int] = (),
) -> tuple[str, str] | None:
    """The first disagreement of one row's segment masks with its conversation, as ``(kind, detail)``; None if none.

    Args:
        ids: (n,) the row's response token ids, its real tokens only (no padding).
        tool, summary: (n,) 0/1, the segment masks slca routes the row's advantages by.
        messages: the conversation after the prompt (assistant and tool messages, in order).
        decode: token ids -> text, special tokens kept (``tokenizer.decode(ids, skip_special_tokens=False)``).
        fmt: the tool-call format the policy writes (a name of :func:`slca.chat.list_formats`, or one).
        end_of_turn: the ids that end an assistant turn (empty: the boundary check is skipped).
    """
    fmt = get_format(fmt)
    eot = frozenset(end_of_turn)
    runs = _runs(tool, summary)
    if not runs:  # nothing is trained on this row (e.g. TRL's mask_truncated_completions)
        return None
    turns = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"]
    if len(runs) != len(turns):
        return "turns", (f"the masks hold {len(runs)} run(s) of policy tokens, the conversation {len(turns)} assistant "
                         f"turn(s): policy and environment tokens are not where the conversation puts them")
    n = len(ids)
    for k, (s, e, seg) in enumerate(runs):
        run = [int(x) for x in ids[s:e]]
        if eot:
            inside = [i for i, x in enumerate(run[:-1]) if x in eot]
            if inside:
                return "boundary", (f"turn {k}'s {seg} tokens (positions {s}-{e - 1}) run past an end-of-turn token at "
                                    f"{s + inside[0]}: environment or template tokens lie inside a policy segment")
            if e < n and run[-1] not in eot:
                return "boundary", (f"turn {k}'s {seg} tokens (positions {s}-{e - 1}) end at {_short(decode(run[-1:]))}, "
                                    "not at an end-of-turn token, and more tokens follow: the mask is shifted against the tokens")
        text = decode(run[:-1] if run[-1] in eot else run)
        got = fmt.parse(text)
        want_calls, want_content, want_tool = _expected(turns[k], fmt)
        if seg == "tool" and not got.is_tool_turn:
            return "call", f"turn {k} is in the execution segment but decodes to no call: {_short(text)}"
        if _shape(got) != (want_calls, want_content):
            kind = "call" if seg == "tool" else "summary"
            want = f"calls {[c for c, _ in want_calls]}" if want_tool else f"the answer {_short(want_content)}"
            return kind, (f"turn {k} ({seg} segment) decodes to {_short(text)} (calls {[c.name for c in got.calls]}), "
                          f"the conversation's turn {k} has {want}")
    return None


def check_segment_masks(
    ids: Any,
    tool_mask: Any,
    summary_mask: Any,
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    *,
    tokenizer: Any,
    fmt: str | ToolCallFormat,
    end_of_turn: Collection[int] = (),
    lengths: Sequence[int] | None = None,
    row_names: Sequence[str] | None = None,
) -> list[MaskMismatch]:
    """Every row of a batch whose segment masks disagree with its conversation (:func:`check_row_masks`).

    Args:
        ids: (B, T) response token ids (a tensor or nested lists).
        tool_mask, summary_mask: (B, T) 0/1 segments, as slca routes the advantages.
        conversations: B conversations, each the messages after its prompt.
        tokenizer: has ``decode(ids, skip_special_tokens=False)``.
        fmt: the tool-call format the policy writes.
        end_of_turn: the ids that end an assistant turn.
        lengths: (B,) real tokens per row (default: every position is real).
        row_names: (B,) how to name each row in a message (default ``"row i"``).

    Returns:
        One :class:`MaskMismatch` per disagreeing row, in row order.
    """
    def as_lists(x: Any) -> list[list[int]]:
        return x.tolist() if hasattr(x, "tolist") else [list(r) for r in x]

    ids_l, tool_l, summ_l = as_lists(ids), as_lists(tool_mask), as_lists(summary_mask)
    if not len(ids_l) == len(tool_l) == len(summ_l) == len(conversations):
        raise ValueError(f"check_segment_masks: {len(ids_l)} rows of ids, {len(tool_l)} / {len(summ_l)} of masks and "
                         f"{len(conversations)} conversations: one of each per row")

    def decode(x: list[int]) -> str:
        return tokenizer.decode(x, skip_special_tokens=False)

    out = []
    for i, conv in enumerate(conversations):
        n = len(ids_l[i]) if lengths is None else int(lengths[i])
        found = check_row_masks(ids_l[i][:n], tool_l[i][:n], summ_l[i][:n], conv, decode=decode, fmt=fmt, end_of_turn=end_of_turn)
        if found is not None:
            out.append(MaskMismatch(i, row_names[i] if row_names is not None else f"row {i}", *found))
    return out


def enforce_mask_check(mismatches: Sequence[MaskMismatch], rows: int, max_share: float, *,
                       count: int | None = None, option: str = "mask_check_max_mismatch") -> float:
    """The share of ``rows`` with a mismatch; :class:`MaskMismatchError` naming the rows when it is above ``max_share``.

    ``max_share`` 1.0 never stops a run (the share is still logged); 0.0 stops on the first mismatch.
    ``count``: the number of disagreeing rows when ``mismatches`` holds only some of them (a multi-process host
    gathers the count and a few examples); default ``len(mismatches)``.
    """
    count = len(mismatches) if count is None else count
    share = count / max(rows, 1)
    if share > max_share:
        shown = "; ".join(str(m) for m in mismatches[:3]) + (f"; and {count - 3} more" if count > 3 else "")
        raise MaskMismatchError(
            f"segment masks disagree with their conversations on {count} of {rows} rollouts ({share:.0%}, more "
            f"than {option}={max_share:g}): {shown}. The advantages would land on tokens the policy did not write, or miss "
            f"tokens it did: check the host's tool / env mask against the token ids (docs/training.md, \"Masks checked "
            f"against the conversation\"); {option}=1.0 only counts them.")
    return share
