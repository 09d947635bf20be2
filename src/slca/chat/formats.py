"""Tool-call formats: parse model output into calls, render calls as model output.

Four formats behind one interface (:class:`ToolCallFormat`):

* ``hermes`` -- Qwen2.5 / Qwen3 / Hermes: one ``<tool_call>{"name", "arguments"}</tool_call>``
  per call; several tags in one turn are parallel calls; Qwen3's leading
  ``<think>...</think>`` is the turn's reasoning.
* ``json_list`` -- the SLCA paper's format (arXiv 2609.29050, App. B): one
  ``<tool_call>`` holding a JSON list of ``{"name", "arguments"}`` objects.
* ``llama3_json`` -- Llama 3.1 JSON tool calling: the turn is
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``);
  several calls are separated by ``;`` (as vLLM's ``llama3_json`` parser reads them).
* ``openai`` -- an OpenAI assistant message object (``tool_calls`` with
  JSON-string ``arguments``), as datasets and servers exchange them.

``parse`` never raises on model output: every malformed part becomes a
:class:`~slca.types.ParseError` kept with the turn (so the environment can answer
it and the execution reward can score it), and no call is dropped silently.
Parsing takes time linear in the text's length. JSON is decoded with the bounds
of :func:`slca._limits.loads` (nesting at most 64 deep, integers at most 4,300
digits, no ``NaN``/``Infinity``, no lone surrogates): a value past them is an
``invalid_json`` error naming the bound, so every call that comes out of
``parse`` can be serialised, validated and tokenised downstream.
``render`` produces exactly the text the chat templates of those models render
for an assistant turn (after the generation prompt, before the end-of-turn token)
for ordinary names and arguments; it also escapes what those templates leave raw
(a name with ``"``, ``\\`` or a newline; a literal ``<tool_call>`` or
``</tool_call>`` inside a string, written ``\\u003c...``), so
``parse(render(calls)).calls == calls`` for every JSON-valued call. A call
holding a lone surrogate is not one (it has no UTF-8 encoding, so no token ids):
``render`` writes it as is and ``parse`` refuses it with an ``invalid_json``
error naming the surrogate; it never comes back changed.

Error kinds (``ParseError.kind``): ``invalid_json``, ``unclosed_tag``,
``unmatched_tag``, ``empty_call``, ``call_not_object``, ``not_a_list``,
``missing_name``, ``missing_arguments``, ``arguments_not_object``,
``unclosed_think``, ``text_around_calls`` (the only one that does not make the
turn a tool turn: the calls around it still run).
"""

from __future__ import annotations

import json
import re
import reprlib
from abc import ABC, abstractmethod
from typing import Any

from slca._limits import loads as _bounded_loads, raw_decode as _bounded_raw_decode, value_problem
from slca.types import ParsedTurn, ParseError, ToolCall

__all__ = [
    "ToolCallFormat",
    "HermesFormat",
    "JsonListFormat",
    "Llama3JsonFormat",
    "OpenAIFormat",
    "get_format",
    "list_formats",
    "ERROR_KINDS",
]

ERROR_KINDS = (
    "invalid_json",
    "unclosed_tag",
    "unmatched_tag",
    "empty_call",
    "call_not_object",
    "not_a_list",
    "missing_name",
    "missing_arguments",
    "arguments_not_object",
    "unclosed_think",
    "text_around_calls",
)

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(re.escape(_OPEN) + "|" + re.escape(_CLOSE))
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_WS = re.compile(r"\s*")


def _dumps(obj: Any) -> str:
    # What transformers' ``tojson`` filter writes (json.dumps, ensure_ascii=False).
    return json.dumps(obj, ensure_ascii=False)


def _dumps_in_tag(obj: Any) -> str:
    """JSON for inside ``<tool_call>`` tags: a literal tag in a string is written ``\\u003c...``.

    Structural JSON never contains ``<``, so the tags can only occur inside
    strings, where ``\\u003c`` decodes back to ``<``.
    """
    return _dumps(obj).replace(_OPEN, "\\u003ctool_call>").replace(_CLOSE, "\\u003c/tool_call>")


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _show(obj: Any, n: int = 200) -> str:
    """A short fragment for an error message; never raises (the value may not be JSON)."""
    try:
        return _short(_dumps(obj), n)
    except (TypeError, ValueError, RecursionError):
        return _short(reprlib.repr(obj), n)


def call_from_object(
    obj: Any, *, args_keys: tuple[str, ...] = ("arguments",), fragment: str = ""
) -> ToolCall | ParseError:
    """A :class:`ToolCall` from a decoded ``{"name": ..., <args_key>: {...}}`` object.

    Returns a :class:`ParseError` (``call_not_object``, ``missing_name``,
    ``missing_arguments``, ``arguments_not_object``) instead of raising.
    """
    frag = fragment or (_short(obj, 200) if isinstance(obj, str) else _show(obj))
    if not isinstance(obj, dict):
        return ParseError("call_not_object", f"a tool call must be a JSON object, got {type(obj).__name__}", frag)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ParseError("missing_name", "the tool call has no \"name\" string", frag)
    key = next((k for k in args_keys if k in obj), None)
    if key is None:
        return ParseError(
            "missing_arguments", f"the call to {name!r} has no \"{args_keys[0]}\" object", frag
        )
    args = obj[key]
    if not isinstance(args, dict):
        return ParseError(
            "arguments_not_object",
            f"\"{key}\" of the call to {name!r} must be a JSON object, got {type(args).__name__}",
            frag,
        )
    problem = value_problem({"name": name, "arguments": args})
    if problem is not None:
        return ParseError("invalid_json", f"the call to {name[:80]!r} is not plain JSON: {problem}", frag)
    return ToolCall(name=name, arguments=args)


def _split_think(text: str) -> tuple[str | None, str, list[ParseError]]:
    """Leading ``<think>...</think>`` -> (reasoning, rest, errors)."""
    stripped = text.lstrip()
    if not stripped.startswith(_THINK_OPEN):
        return None, text, []
    body = stripped[len(_THINK_OPEN):]
    end = body.find(_THINK_CLOSE)
    if end < 0:
        err = ParseError("unclosed_think", "<think> is never closed with </think>", _short(stripped, 200))
        return body.strip("\n"), "", [err]
    return body[:end].strip("\n"), body[end + len(_THINK_CLOSE):].lstrip("\n"), []


def think_span(text: str) -> tuple[int, int] | None:
    """``(start, end)`` of the turn's leading reasoning, ``<think>`` and ``</think>`` included, as
    :func:`_split_think` reads it; an unclosed ``<think>`` runs to the end of the text. None without one."""
    stripped = text.lstrip()
    if not stripped.startswith(_THINK_OPEN):
        return None
    start = len(text) - len(stripped)
    end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
    return (start, len(text)) if end < 0 else (start, end + len(_THINK_CLOSE))


def _after_think(text: str) -> int:
    """Where the text after the leading reasoning starts (0 without reasoning; the end when it is unclosed)."""
    th = think_span(text)
    return 0 if th is None else th[1]


def _tag_spans(text: str, start: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every ``<tool_call>`` block of ``text[start:]``, tags included, as :func:`_tag_blocks`
    reads them: a closed tag up to its ``</tool_call>``, an unclosed one up to the next tag or the end. A stray
    ``</tool_call>`` is no block."""
    tags = [(m.start(), m.group() == _OPEN) for m in _TAG.finditer(text, start)]
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(tags):
        at, is_open = tags[i]
        if not is_open:
            i += 1
            continue
        if i + 1 < len(tags) and not tags[i + 1][1]:  # the next tag closes this one
            out.append((at, tags[i + 1][0] + len(_CLOSE)))
            i += 2
            continue
        out.append((at, tags[i + 1][0] if i + 1 < len(tags) else len(text)))
        i += 1
    return out


def _tag_blocks(text: str) -> tuple[str, list[str], list[ParseError]]:
    """Split text on ``<tool_call>`` tags (one pass over the tag positions: linear time).

    Returns ``(content, bodies, errors)``: ``content`` is the text before the
    first tag; ``bodies`` the text inside each closed tag; errors for unclosed
    tags, stray closing tags and text between or after the tags.
    """
    errors: list[ParseError] = []
    tags = [(m.start(), m.group() == _OPEN) for m in _TAG.finditer(text)]
    i = next((k for k, (_, is_open) in enumerate(tags) if is_open), None)
    head = text if i is None else text[: tags[i][0]]
    if tags and (i is None or i > 0):  # a closing tag before any opening one
        errors.append(ParseError("unmatched_tag", "</tool_call> without an opening <tool_call>", _short(head, 200)))
    if i is None:
        return head.strip(), [], errors
    bodies: list[str] = []
    first = pos = tags[i][0]
    while True:
        while i < len(tags) and not tags[i][1]:
            i += 1  # stray closing tags: part of the text between / after the calls
        if i == len(tags):
            tail = text[pos:]
            if tail.strip():
                if _CLOSE in tail:
                    errors.append(ParseError("unmatched_tag", "</tool_call> without an opening <tool_call>", _short(tail, 200)))
                else:
                    errors.append(ParseError("text_around_calls", "text after the tool calls is ignored", _short(tail.strip(), 200)))
            break
        at = tags[i][0]
        between = text[pos:at]
        if pos != first and between.strip():
            errors.append(ParseError("text_around_calls", "text between tool calls is ignored", _short(between.strip(), 200)))
        start = at + len(_OPEN)
        if i + 1 < len(tags) and not tags[i + 1][1]:  # the next tag closes this one
            bodies.append(text[start: tags[i + 1][0]])
            pos, i = tags[i + 1][0] + len(_CLOSE), i + 2
            continue
        stop = tags[i + 1][0] if i + 1 < len(tags) else len(text)
        errors.append(ParseError("unclosed_tag", "<tool_call> is never closed with </tool_call>", _short(text[at: min(stop, at + 201)], 200)))
        pos, i = stop, i + 1
    return head.strip(), bodies, errors


def _loads(body: str) -> tuple[Any, ParseError | None]:
    src = body.strip()
    if not src:
        return None, ParseError("empty_call", "empty <tool_call></tool_call>", _short(body, 200))
    obj, reason = _bounded_loads(src)
    if reason is not None:
        return None, ParseError("invalid_json", f"tool call is not valid JSON: {reason}", _short(src, 200))
    return obj, None


class ToolCallFormat(ABC):
    """How a model writes tool calls in an assistant turn."""

    name: str = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn's text (no end-of-turn token). Never raises."""

    @abstractmethod
    def render(self, calls: list[ToolCall], content: str = "", reasoning: str | None = None) -> str:
        """The assistant text a model should generate for these calls."""

    def call_spans(self, text: str) -> list[tuple[int, int]] | None:
        """``(start, end)`` character ranges of the calls in one assistant turn's text, as :meth:`parse` finds them
        (outside the leading reasoning; broken calls included, up to where the parser stops reading them). Never
        raises. None: this format does not write its calls as spans of the turn's text (the default)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _think_prefix(reasoning: str | None) -> str:
    # Qwen3's template: '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n')
    return "" if reasoning is None else f"{_THINK_OPEN}\n{reasoning.strip(chr(10))}\n{_THINK_CLOSE}\n\n"


class HermesFormat(ToolCallFormat):
    """Qwen2.5 / Qwen3 / Hermes: ``<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>`` per call.

    Rendering matches the Qwen2.5 and Qwen3 chat templates: content, then each
    call on its own line (``"\\n".join``), reasoning first as ``<think>\\n..\\n</think>\\n\\n``.
    """

    name = "hermes"

    def parse(self, text: str) -> ParsedTurn:
        reasoning, rest, errors = _split_think(text)
        content, bodies, tag_errors = _tag_blocks(rest)
        errors += tag_errors
        calls: list[ToolCall] = []
        for body in bodies:
            obj, err = _loads(body)
            if err is None and isinstance(obj, list):
                err = ParseError(
                    "call_not_object", "one JSON object per <tool_call> (got a list; use one tag per call)", _short(body.strip(), 200)
                )
            if err is None:
                res = call_from_object(obj, fragment=_short(body.strip(), 200))
                if isinstance(res, ParseError):
                    err = res
                else:
                    calls.append(res)
            if err is not None:
                errors.append(err)
        return ParsedTurn(content=content, calls=calls, errors=errors, reasoning=reasoning)

    def render(self, calls: list[ToolCall], content: str = "", reasoning: str | None = None) -> str:
        parts = [content] if content else []
        # The templates write '{"name": "' + name + '", ...': the same text for every name that needs no escaping.
        parts += [f'{_OPEN}\n{{"name": {_dumps_in_tag(c.name)}, "arguments": {_dumps_in_tag(c.arguments)}}}\n{_CLOSE}' for c in calls]
        return _think_prefix(reasoning) + "\n".join(parts)

    def call_spans(self, text: str) -> list[tuple[int, int]]:
        """Each ``<tool_call>...</tool_call>`` block after the reasoning."""
        return _tag_spans(text, _after_think(text))


class JsonListFormat(ToolCallFormat):
    """The SLCA paper's format: ``<tool_call>\\n[{"name": .., "arguments": {..}}, ...]\\n</tool_call>``.

    All parallel calls of a turn sit in one JSON list. Several tags are read in
    order (their calls concatenated).
    """

    name = "json_list"

    def parse(self, text: str) -> ParsedTurn:
        reasoning, rest, errors = _split_think(text)
        content, bodies, tag_errors = _tag_blocks(rest)
        errors += tag_errors
        calls: list[ToolCall] = []
        for body in bodies:
            obj, err = _loads(body)
            if err is None and not isinstance(obj, list):
                err = ParseError("not_a_list", f"<tool_call> must hold a JSON list of calls, got {type(obj).__name__}", _short(body.strip(), 200))
            if err is None and not obj:
                err = ParseError("empty_call", "<tool_call> holds an empty list", body.strip())
            if err is not None:
                errors.append(err)
                continue
            for item in obj:
                res = call_from_object(item)
                (errors if isinstance(res, ParseError) else calls).append(res)  # type: ignore[arg-type]
        return ParsedTurn(content=content, calls=calls, errors=errors, reasoning=reasoning)

    def render(self, calls: list[ToolCall], content: str = "", reasoning: str | None = None) -> str:
        parts = [content] if content else []
        if calls:
            body = _dumps_in_tag([{"name": c.name, "arguments": c.arguments} for c in calls])
            parts.append(f"{_OPEN}\n{body}\n{_CLOSE}")
        return _think_prefix(reasoning) + "\n".join(parts)

    def call_spans(self, text: str) -> list[tuple[int, int]]:
        """Each ``<tool_call>`` block (the JSON list with its tags) after the reasoning."""
        return _tag_spans(text, _after_think(text))


_PY_TAG = "<|python_tag|>"
_LLAMA_START = re.compile(r'\{\s*"name"\s*:')


class Llama3JsonFormat(ToolCallFormat):
    """Llama 3.1 JSON tool calling: ``{"name": .., "parameters": {..}}`` (``; ``-separated when parallel).

    A turn is a tool turn when, after an optional ``<|python_tag|>``, it starts
    with a JSON object, or when it contains ``{"name":`` (then the text before it
    is a ``text_around_calls`` error; nothing is dropped). ``"arguments"`` is
    accepted for ``"parameters"``.
    """

    name = "llama3_json"

    def parse(self, text: str) -> ParsedTurn:
        reasoning, rest, errors = _split_think(text)
        body = rest.strip()
        had_tag = body.startswith(_PY_TAG)
        if had_tag:
            body = body[len(_PY_TAG):].lstrip()
        if not body.startswith("{"):
            m = _LLAMA_START.search(body)
            if m is None:
                if had_tag:
                    errors.append(ParseError("empty_call" if not body else "invalid_json", "<|python_tag|> is not followed by a JSON call", _short(body, 200)))
                return ParsedTurn(content=body, errors=errors, reasoning=reasoning)
            errors.append(ParseError("text_around_calls", "text before the tool call is ignored", _short(body[: m.start()].strip(), 200)))
            body = body[m.start():]
        calls: list[ToolCall] = []
        pos, n = 0, len(body)
        while pos < n:  # every step moves past one call: linear in the text
            obj, end, reason = _bounded_raw_decode(body, pos)
            if reason is not None:
                errors.append(ParseError("invalid_json", f"tool call is not valid JSON: {reason}", _short(body[pos: pos + 201], 200)))
                if end == pos:  # a syntax error: the end of the call is unknown
                    break
            else:
                res = call_from_object(obj, args_keys=("parameters", "arguments"), fragment=_short(body[pos: min(end, pos + 201)], 200))
                (errors if isinstance(res, ParseError) else calls).append(res)  # type: ignore[arg-type]
            q = _WS.match(body, end).end()
            if q < n and body[q] == ";":
                pos = _WS.match(body, q + 1).end()
                continue
            if q < n:
                errors.append(ParseError("text_around_calls", "text after the tool calls is ignored", _short(body[q: q + 201], 200)))
            break
        return ParsedTurn(content="", calls=calls, errors=errors, reasoning=reasoning)

    def call_spans(self, text: str) -> list[tuple[int, int]]:
        """One span: from ``<|python_tag|>`` (or the first call's ``{``) to the end of the last call :meth:`parse`
        reads (to the end of the text when a call is not valid JSON: the parser stops there)."""
        start = _after_think(text)
        p = _WS.match(text, start).end()
        end = len(text.rstrip())
        had_tag = text.startswith(_PY_TAG, p)
        q = _WS.match(text, p + len(_PY_TAG)).end() if had_tag else p
        if not text.startswith("{", q):
            m = _LLAMA_START.search(text, q, max(end, q))
            if m is None:
                return [(p, end)] if had_tag and end > p else []
            q = m.start()
        first, last, pos = (p if had_tag else q), q, q
        while pos < end:  # the parse loop: every step moves past one call
            _, stop, reason = _bounded_raw_decode(text[:end], pos)
            if reason is not None and stop == pos:
                return [(first, end)]
            last = stop
            r = _WS.match(text, stop).end()
            if r < end and text[r] == ";":
                pos = _WS.match(text, r + 1).end()
                continue
            break
        return [(first, last)] if last > first else []

    def render(self, calls: list[ToolCall], content: str = "", reasoning: str | None = None) -> str:
        if calls and content:
            raise ValueError("llama3_json: a turn with calls cannot carry content (got both `calls` and `content`)")
        if not calls:
            return _think_prefix(reasoning) + content
        return _think_prefix(reasoning) + "; ".join(_dumps({"name": c.name, "parameters": c.arguments}) for c in calls)


class OpenAIFormat(ToolCallFormat):
    """OpenAI assistant message objects.

    ``{"role": "assistant", "content": .., "tool_calls": [{"id": .., "type": "function",
    "function": {"name": .., "arguments": "<JSON string>"}}]}``; ``reasoning_content``
    carries reasoning. Text that does not start with ``{`` is plain content.
    ``arguments`` may also be an object (some datasets store it so).
    """

    name = "openai"

    def parse(self, text: str) -> ParsedTurn:
        src = text.strip()
        if not src.startswith("{"):
            return ParsedTurn(content=src)
        msg, reason = _bounded_loads(src)
        if reason is not None:
            return ParsedTurn(errors=[ParseError("invalid_json", f"message is not valid JSON: {reason}", _short(src, 200))])
        return self.parse_message(msg)

    def parse_message(self, msg: Any) -> ParsedTurn:
        """Parse a decoded OpenAI assistant message (a dict). Never raises."""
        if not isinstance(msg, dict):
            return ParsedTurn(errors=[ParseError("call_not_object", f"message must be a JSON object, got {type(msg).__name__}", _show(msg))])
        content = msg.get("content") or ""
        if not isinstance(content, str):
            content = _show(content, 10**9)
        reasoning = msg.get("reasoning_content")
        out = ParsedTurn(content=content, reasoning=reasoning if isinstance(reasoning, str) else None)
        raw_calls = msg.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            out.errors.append(ParseError("not_a_list", f"\"tool_calls\" must be a list, got {type(raw_calls).__name__}", _show(raw_calls)))
            return out
        for i, tc in enumerate(raw_calls):
            if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
                out.errors.append(ParseError("call_not_object", f"tool_calls[{i}] needs a \"function\" object", _show(tc)))
                continue
            fn = dict(tc["function"])
            args = fn.get("arguments")
            if isinstance(args, str):
                fn["arguments"], reason = _bounded_loads(args) if args.strip() else ({}, None)
                if reason is not None:
                    out.errors.append(ParseError("invalid_json", f"tool_calls[{i}] arguments are not valid JSON: {reason}", _short(args, 200)))
                    continue
            res = call_from_object(fn, fragment=_show(tc))
            if isinstance(res, ParseError):
                out.errors.append(res)
            else:
                cid = tc.get("id")
                out.calls.append(ToolCall(res.name, res.arguments, id=cid if isinstance(cid, str) else None))
        return out

    def render(self, calls: list[ToolCall], content: str = "", reasoning: str | None = None) -> str:
        msg: dict[str, Any] = {"role": "assistant", "content": content or None}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = [c.to_openai(i) for i, c in enumerate(calls)]
        return _dumps(msg)


_FORMATS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat,
    "json_list": JsonListFormat,
    "llama3_json": Llama3JsonFormat,
    "openai": OpenAIFormat,
}


def list_formats() -> list[str]:
    """Names accepted by :func:`get_format`."""
    return sorted(_FORMATS)


def get_format(name: str | ToolCallFormat) -> ToolCallFormat:
    """The tool-call format called ``name`` (``hermes``, ``json_list``, ``llama3_json``, ``openai``).

    A :class:`ToolCallFormat` instance is returned as is.
    """
    if isinstance(name, ToolCallFormat):
        return name
    if name not in _FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}; choose one of {list_formats()}")
    return _FORMATS[name]()
