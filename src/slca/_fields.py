"""Dataclass fields that carry their own help and checks: the one type checker of
:class:`slca.training.config.TrainConfig` and of every estimator's options object.

A field says everything about itself where it is declared:

* its **type**, with its **checks** as ``Annotated`` extras and its choices as a
  ``Literal`` built from the library's constants::

      eps: Annotated[float, ge(0)] = field(default=1e-6, metadata={"help": "added to the std"})
      scale: Literal[SCALES] = field(default="group", metadata={"help": "advantage normalisation"})

* its **help** in ``metadata["help"]``.

Checks ride on the type rather than in ``metadata`` because
:class:`transformers.HfArgumentParser` passes a field's metadata to
``argparse.add_argument`` (an unknown key there is a TypeError) and reads the
type with ``typing.get_type_hints``, which drops ``Annotated`` extras: such a
dataclass parses with ``HfArgumentParser`` as it is, ``Literal`` fields as
``choices``.

A check returns None when the value is good, otherwise what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

__all__ = ["Check", "gt", "ge", "within", "help_of", "hints", "check_value", "coerce", "type_name", "did_you_mean"]

Check = Callable[[Any], "str | None"]


def gt(lo: float) -> Check:
    """``value > lo``."""
    return lambda v: None if v > lo else f"must be > {lo}, got {v!r}"


def ge(lo: float) -> Check:
    """``value >= lo``."""
    return lambda v: None if v >= lo else f"must be >= {lo}, got {v!r}"


def within(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    """``value`` in the interval ``[lo, hi]`` (either end open)."""

    def check(v: Any) -> str | None:
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        return None if ok else f"must be in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}, got {v!r}"

    return check


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the name of ``names`` closest to a mistyped ``name`` (difflib), or ''.

    The one "did you mean" of config fields, estimator names and estimator options.
    """
    close = difflib.get_close_matches(name, [str(n) for n in names], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def help_of(f: dataclasses.Field) -> str:
    """A field's ``metadata["help"]`` ('' if it has none)."""
    return str(f.metadata.get("help", ""))


def hints(cls: type) -> dict[str, Any]:
    """Every field's annotation, ``Annotated`` extras (its checks) kept."""
    return typing.get_type_hints(cls, include_extras=True)


def _split(hint: Any) -> tuple[Any, tuple[Check, ...]]:
    """``(type, checks)`` of an annotation, ``Annotated[T, c1, c2]`` -> ``(T, (c1, c2))``."""
    if typing.get_origin(hint) is Annotated:
        base, *extras = typing.get_args(hint)
        return base, tuple(extras)
    return hint, ()


def _type_ok(v: Any, hint: Any) -> bool:
    """``v`` matches ``hint`` (int, float, str, bool, Literal, X | None, list[X], Any)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(v, h) for h in typing.get_args(hint))
    if origin is Literal:
        return any(v == c and type(v) is type(c) for c in typing.get_args(hint))
    if origin in (list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return isinstance(v, origin) and all(_type_ok(x, item) for x in v)
    if hint is Any:
        return True
    if hint is type(None):
        return v is None
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, hint)


def type_name(hint: Any) -> str:
    """``int``, ``int | None``, ``list[str]``: a generic keeps its arguments (``list[str].__name__`` is ``list``)."""
    if typing.get_origin(hint) is None and getattr(hint, "__name__", None):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, (list, tuple)):
        return all(_finite(x) for x in v)
    return True


def check_value(value: Any, hint: Any) -> tuple[Any, str | None]:
    """``(value, problem)``: ``value`` checked against an annotation (its type, finiteness, its checks).

    An ``int`` given for a ``float`` comes back as a float; ``problem`` is None
    when the value is good, else what is wrong (``"must be >= 0, got -1"``).
    """
    base, checks = _split(hint)
    if typing.get_origin(base) is Literal and not _type_ok(value, base):
        return value, f"must be one of {list(typing.get_args(base))}, got {value!r}"
    if not _type_ok(value, base):
        return value, f"must be {type_name(base)}, got {value!r}"
    if base is float and isinstance(value, int):
        value = float(value)
    if not _finite(value):
        return value, f"must be a finite number, got {value!r}"
    return value, next((msg for c in checks if (msg := c(value))), None)


def coerce(raw: str, hint: Any) -> Any:
    """A string (``--set field=value``, an environment variable) as a value of the annotated type.

    Raises:
        ValueError: ``"must be an integer, got 'x'"`` (or a number, a boolean).
    """
    base, _ = _split(hint)
    args = [h for h in typing.get_args(base) if h is not type(None)]
    origin = typing.get_origin(base)
    if origin in (typing.Union, types.UnionType):
        if raw.lower() in ("none", "null", ""):
            return None
        return coerce(raw, args[0]) if len(args) == 1 else raw
    if origin is list:
        return [coerce(x.strip(), args[0] if args else str) for x in raw.split(",") if x.strip()]
    if base is bool:
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"must be a boolean (true/false), got {raw!r}")
    for kind, what in ((int, "an integer"), (float, "a number")):
        if base is kind:
            try:
                return kind(raw)
            except ValueError:
                raise ValueError(f"must be {what}, got {raw!r}") from None
    return raw


class ConfigError(ValueError):
    """A refused config value; ``str(e)`` is ``"<field>: <what is wrong>"``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")
