"""Bounds on untrusted values: JSON from model output or the network, tool results, regex matching.

Model output and HTTP replies are hostile input: JSON nested thousands deep
(``RecursionError`` in ``json``, ``jsonschema`` and chat templates), integers of
millions of digits, ``NaN``/``Infinity``, lone UTF-16 surrogates (a
``UnicodeEncodeError`` at the first ``.encode()``), regexes that backtrack
exponentially. Everything here returns a reason instead of raising, in time
linear in the input:

* :func:`loads` -- ``json.loads`` with a depth limit checked *before* decoding
  (a linear scan, so the decoder never recurses past it), integers capped at
  4,300 digits whatever ``sys.set_int_max_str_digits`` says, ``NaN`` /
  ``Infinity`` / overflowing floats refused, lone surrogates refused.
* :func:`value_problem` -- why a Python value is not plain JSON (a ``set``,
  ``datetime``, ``bytes``, ``Decimal``, a non-finite float, a huge int, a lone
  surrogate, nesting past the limit), with the path to it.
* :func:`pattern_search` and :data:`BoundedValidator` -- ``re.search`` with a
  time limit (the ``regex`` module's ``timeout``), and the JSON Schema 2020-12
  validator whose ``pattern`` keyword uses it. ``patternProperties`` is not
  bounded here: jsonschema matches its keys with an unbounded ``re.search`` (in
  ``patternProperties``, ``additionalProperties`` and ``unevaluatedProperties``),
  so :func:`slca.env.schema.check_tool_schema` refuses schemas that use it when a
  tool is loaded (:data:`REFUSED_KEYWORDS`).
* :func:`parse_regex` -- the stdlib's parse tree of a regex (the one home of the
  private ``re._parser`` import), for the size check here and the schema
  simulator's string generator.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators

try:  # the stdlib's regex parser (moved in 3.11; same API); used only through parse_regex and SRE
    from re import _constants as SRE, _parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as SRE
    import sre_parse as _sre_parse

__all__ = [
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "PATTERN_TIMEOUT",
    "REFUSED_KEYWORDS",
    "SRE",
    "BoundedValidator",
    "PatternTimeout",
    "json_depth",
    "loads",
    "raw_decode",
    "value_problem",
    "parse_regex",
    "pattern_search",
]

MAX_DEPTH = 64
"""Deepest JSON nesting accepted from model output or the network (arrays and objects)."""

MAX_INT_DIGITS = 4300
"""Longest integer accepted (CPython's default ``int`` <-> ``str`` limit)."""

PATTERN_TIMEOUT = 0.05
"""Seconds one JSON Schema ``pattern`` may take on one value before the value is refused."""

REFUSED_KEYWORDS = ("patternProperties",)
"""JSON Schema keywords a tool schema may not use: jsonschema matches ``patternProperties`` keys with an
unbounded ``re.search`` (also inside ``additionalProperties`` and ``unevaluatedProperties``), which a
hostile key can make backtrack for minutes; no tool schema slca has met uses it."""

MAX_PATTERN_COST = 20_000
"""Largest regex accepted, counted with nested counted repeats multiplied out (``(a{1000}){1000}``
is 1,000,000): the ``regex`` module unrolls such repeats when it compiles, which no timeout bounds."""

# A JSON string (an unterminated one runs to the end: every quote is consumed once, so linear).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_INT_LIMIT = 10**MAX_INT_DIGITS  # the smallest integer with more than MAX_INT_DIGITS digits


def json_depth(text: str, limit: int | None = None) -> int:
    """Upper bound of the JSON nesting depth of any value starting in ``text`` (linear time).

    Brackets inside strings are ignored; an unmatched closing bracket resets the
    count (so the bound holds for a value decoded from any offset). Stops early
    once ``limit`` is passed.
    """
    depth = best = 0
    for b in _BRACKETS.findall(_STRING.sub("", text)):
        if b in "[{":
            depth += 1
            if depth > best:
                best = depth
                if limit is not None and best > limit:
                    return best
        elif depth:
            depth -= 1
    return best


def _parse_int(s: str) -> int:
    if len(s) - (s[0] == "-") > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(s)} digits (more than {MAX_INT_DIGITS})")
    return int(s)


def _parse_float(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise ValueError(f"number {s[:20]}{'...' if len(s) > 20 else ''} is out of range")
    return x


def _parse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)


def _decode_error(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at char {e.pos}"
    if isinstance(e, RecursionError):
        return "JSON nested too deep"
    return str(e).split(";")[0]


def loads(text: str, max_depth: int = MAX_DEPTH) -> tuple[Any, str | None]:
    """Decode untrusted JSON: ``(value, None)``, or ``(None, reason)``. Never raises.

    The reason is readable by the model (``"Expecting ',' delimiter at char 12"``,
    ``"JSON nested deeper than 64 levels"``, ``"integer with 5000 digits ..."``,
    ``"NaN is not JSON"``, ``"lone surrogate '\\\\ud800' ..."``).
    """
    if json_depth(text, max_depth) > max_depth:
        return None, f"JSON nested deeper than {max_depth} levels"
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        return None, _decode_error(e)
    problem = value_problem(value, max_depth=max_depth, json_only=True)
    return (None, problem) if problem else (value, None)


def raw_decode(text: str, pos: int = 0, max_depth: int = MAX_DEPTH) -> tuple[Any, int, str | None]:
    """``JSONDecoder.raw_decode`` at ``pos`` with :func:`loads`' limits: ``(value, end, reason)``.

    On failure ``value`` is None, ``end`` is ``pos`` when the end of the value is
    unknown (a syntax error), else the end of the refused value (so a caller can
    go on after it).
    """
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError) as e:
        return None, pos, _decode_error(e)
    if json_depth(text[pos:end], max_depth) > max_depth:
        return None, end, f"JSON nested deeper than {max_depth} levels"
    problem = value_problem(value, max_depth=max_depth, json_only=True)
    return (None, end, problem) if problem else (value, end, None)


def _where(path: list[Any]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "the value"


def value_problem(value: Any, *, max_depth: int = MAX_DEPTH, json_only: bool = False) -> str | None:
    """Why ``value`` is not plain JSON (str, int, float, bool, None, list, tuple, dict), or None.

    Checks every nested value (iteratively, no recursion): types, finite floats,
    integers of at most :data:`MAX_INT_DIGITS` digits, strings without lone
    surrogates, dict keys that are strings, depth at most ``max_depth``.
    ``json_only`` skips the type checks (for values ``json`` itself decoded).
    """
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            m = _SURROGATE.search(v)
            if m:
                return f"{_where(path)}: lone surrogate {m.group()!r} is not valid Unicode"
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not -_INT_LIMIT < v < _INT_LIMIT:
                return f"{_where(path)}: integer with more than {MAX_INT_DIGITS} digits"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return f"{_where(path)}: {v} is not a JSON number"
        elif isinstance(v, (dict, list, tuple)):
            if len(path) >= max_depth:
                return f"{_where(path[:3])}...: nested deeper than {max_depth} levels"
            if isinstance(v, dict):
                for k, sub in v.items():
                    if not isinstance(k, str):
                        if not json_only:
                            return f"{_where(path)}: key {k!r} is a {type(k).__name__}, not a string"
                    elif _SURROGATE.search(k):
                        return f"{_where(path)}: key with a lone surrogate is not valid Unicode"
                    stack.append((sub, path + [k]))
            else:
                stack.extend((sub, path + [i]) for i, sub in enumerate(v))
        elif not json_only:
            return f"{_where(path)} is a {type(v).__name__}, not a JSON value (str, int, float, bool, None, list, dict)"
    return None


# ------------------------------------------------------------------ bounded regex


class PatternTimeout(Exception):
    """A regex did not finish within its time limit."""


def parse_regex(pattern: str) -> Any:
    """The stdlib's parse tree of ``pattern`` (``re._parser.parse``; its opcodes are :data:`SRE`'s). Raises
    ``re.error`` (and, on hostile input, ``RecursionError`` / ``OverflowError``) when it does not parse."""
    return _sre_parse.parse(pattern)


def _cost(items: Any) -> int:
    """Size of a parsed regex with counted repeats multiplied out (capped just past the limit)."""
    c = SRE
    total = 0
    for op, av in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            n = hi if hi is not c.MAXREPEAT else lo
            total += max(1, n) * _cost(sub)
        elif op is c.SUBPATTERN:
            total += _cost(av[-1])
        elif op is c.BRANCH:
            total += sum(_cost(b) for b in av[1])
        elif op in (c.ASSERT, c.ASSERT_NOT):
            total += _cost(av[1])
        elif op is getattr(c, "ATOMIC_GROUP", None):
            total += _cost(av)
        else:
            total += 1
        if total > MAX_PATTERN_COST:
            return MAX_PATTERN_COST + 1
    return total


@functools.lru_cache(maxsize=2048)
def _compile(pattern: str) -> Any:
    """The compiled pattern; None if ``regex`` cannot compile it; "too complex" past :data:`MAX_PATTERN_COST`."""
    try:
        if _cost(parse_regex(pattern)) > MAX_PATTERN_COST:
            return "too complex"
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        pass  # not a stdlib regex: let the regex module decide
    try:
        return regex.compile(pattern)
    except (regex.error, TypeError, ValueError, RecursionError, OverflowError):
        return None


def pattern_search(pattern: str, text: str, timeout: float = PATTERN_TIMEOUT) -> bool:
    """``re.search(pattern, text) is not None``, within ``timeout`` seconds (else :class:`PatternTimeout`).

    Uses the ``regex`` module (its ``timeout`` stops catastrophic backtracking);
    a pattern it cannot compile falls back to ``re`` (unbounded, as jsonschema does);
    a pattern past :data:`MAX_PATTERN_COST` is not run at all (:class:`PatternTimeout`).
    """
    rx = _compile(pattern)
    if rx == "too complex":
        raise PatternTimeout(f"pattern {pattern[:60]!r} is too large to match under a time limit")
    if rx is None:
        return re.search(pattern, text) is not None
    try:
        return rx.search(text, timeout=timeout) is not None
    except TimeoutError as e:
        raise PatternTimeout(f"matching it against {pattern[:60]!r} takes more than {timeout * 1000:.0f} ms") from e


def _pattern(validator: Any, patrn: str, instance: Any, schema: dict) -> Any:
    if not validator.is_type(instance, "string"):
        return
    try:
        ok = pattern_search(patrn, instance)
    except PatternTimeout as e:
        yield ValidationError(f"{instance[:40]!r}{'...' if len(instance) > 40 else ''} is refused: {e}")
        return
    if not ok:
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


BoundedValidator = validators.extend(Draft202012Validator, {"pattern": _pattern})
"""Draft 2020-12 validator whose ``pattern`` keyword runs under :data:`PATTERN_TIMEOUT` (for schemas without
:data:`REFUSED_KEYWORDS`, which :func:`slca.env.schema.check_tool_schema` refuses)."""
BoundedValidator.__module__, BoundedValidator.__qualname__ = __name__, "BoundedValidator"  # picklable by name
