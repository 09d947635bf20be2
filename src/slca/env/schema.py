"""Tool schemas: load-time checks and argument / response validation.

Tools are OpenAI function schemas whose ``parameters`` (and optional
``response``) are JSON Schemas. Every check goes through ``jsonschema``
(Draft 2020-12 meta-schema, with its ``FormatChecker`` so ``date``, ``email``,
``ipv4``, ... are enforced); nothing here re-implements JSON Schema.

No schema ever makes slca fetch a URL or read a file. ``$ref`` is resolved
through a ``referencing.Registry`` whose ``retrieve`` refuses every URI, and
:func:`check_tool_schema` refuses, when the tool is loaded, any ``$ref`` that
does not point inside the schema itself (``#...``) or that points nowhere.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
import referencing.jsonschema
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from slca._limits import REFUSED_KEYWORDS, BoundedValidator
from slca.types import ToolSpec

__all__ = ["MAX_DEPTH", "MAX_NAME_LENGTH", "ToolBox", "as_tool_specs", "check_tool", "check_tool_name", "check_tool_schema", "nesting_depth"]

_FORMATS = FormatChecker()

MAX_DEPTH = 100
"""Deepest nesting of lists / objects accepted in a schema or a value (deeper input is refused, not a RecursionError later)."""
MAX_NAME_LENGTH = 128
"""Longest tool name accepted (Toucan's longest server-prefixed name is 92 characters)."""

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def _refuse_retrieval(uri: str):
    """``retrieve`` of the registry every validator uses: nothing is fetched, nothing is read."""
    raise NoSuchResource(ref=uri)


_NO_FETCH = Registry(retrieve=_refuse_retrieval)


def nesting_depth(value: Any) -> int:
    """Depth of nested lists / dicts in ``value`` (a scalar is 0), computed without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, (list, tuple)):
            continue
        deepest = max(deepest, d + 1)
        if d + 1 > MAX_DEPTH:  # deep enough to refuse; no need to walk further
            return d + 1
        stack.extend((x, d + 1) for x in v)
    return deepest


def _refs(schema: Any) -> list[str]:
    """Every string ``$ref`` / ``$dynamicRef`` / ``$recursiveRef`` in ``schema``."""
    out, stack = [], [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            out += [v[k] for k in _REF_KEYS if isinstance(v.get(k), str)]
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


# keywords whose object maps names to subschemas (the names are not keywords), and keywords that hold data
_NAMED_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_DATA = ("enum", "const", "default", "examples")


def _keyword_paths(schema: Any, keyword: str) -> list[str]:
    """JSON pointers of every subschema of ``schema`` that uses ``keyword`` (property names and data skipped)."""
    out, stack = [], [(schema, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, list):
            stack.extend((x, f"{path}/{i}") for i, x in enumerate(v))
        elif isinstance(v, dict):
            if keyword in v:
                out.append(path or "/")
            for k, sub in v.items():
                if k in _NAMED_SUBSCHEMAS and isinstance(sub, dict):
                    stack.extend((x, f"{path}/{k}/{name}") for name, x in sub.items())
                elif k not in _DATA:
                    stack.append((sub, f"{path}/{k}"))
    return sorted(out)


def _check_keywords(schema: dict[str, Any]) -> None:
    """Refuse :data:`slca._limits.REFUSED_KEYWORDS` (regexes jsonschema would match without a time limit)."""
    for kw in REFUSED_KEYWORDS:
        if paths := _keyword_paths(schema, kw):
            raise ValueError(f"{kw} at {', '.join(paths[:3])} is not supported: jsonschema matches its keys with an "
                             "unbounded regex search, which a hostile key can stall; describe the keys with "
                             "properties / additionalProperties instead")


def _check_refs(schema: dict[str, Any]) -> None:
    """Refuse a ref that leaves the schema (a URL, a file, another document) or points nowhere."""
    refs = _refs(schema)
    if not refs:
        return
    spec = referencing.jsonschema.specification_with(schema.get("$schema", ""), default=referencing.jsonschema.DRAFT202012)
    resolver = _NO_FETCH.resolver_with_root(spec.create_resource(schema))
    for ref in sorted(set(refs)):
        if not ref.startswith("#"):
            raise ValueError(f"$ref {ref!r} points outside the schema (slca never fetches a URL or reads a file for a schema)")
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(f"$ref {ref!r} does not resolve inside the schema") from None


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    """A checked, compiled validator for one schema (cached: datasets repeat their tools).

    Draft 2020-12, with ``pattern`` matched under a time limit
    (:data:`slca._limits.PATTERN_TIMEOUT`): a value a dataset regex cannot match in
    time is refused instead of backtracking for minutes; ``patternProperties`` is
    refused (:func:`_check_keywords`). ``$ref`` resolves only inside the schema
    (:func:`_check_refs`, and a registry that retrieves nothing).
    """
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    _check_keywords(schema)
    _check_refs(schema)
    return BoundedValidator(schema, registry=_NO_FETCH, format_checker=_FORMATS)


def check_tool_name(name: Any) -> None:
    """Raise ValueError unless ``name`` is a usable tool name.

    Refused: a non-string or empty name, one longer than :data:`MAX_NAME_LENGTH`,
    leading or trailing whitespace, any control / format / line- or
    paragraph-separator character (a newline, a zero-width space), and ``<`` or
    ``>`` (they would break the tag-based tool-call formats). Spaces, dots,
    ``!`` and non-Latin letters are accepted: real MCP servers use them.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool name must be a non-empty string, got {name!r:.80}")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"tool name {name[:40]!r}... is {len(name)} characters, more than {MAX_NAME_LENGTH}")
    if name != name.strip():
        raise ValueError(f"tool name {name!r} has leading or trailing whitespace")
    for ch in name:
        if ch in "<>" or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            raise ValueError(f"tool name {name!r} contains the character {ch!r}, which a tool name may not hold")


def _check_raw(d: Mapping[str, Any]) -> None:
    """Checks on an OpenAI tool dict that :meth:`ToolSpec.from_openai` would otherwise paper over."""
    fn = d.get("function", d)
    if not isinstance(fn, Mapping):
        raise ValueError(f"'function' must be an object, got {type(fn).__name__}")
    check_tool_name(fn.get("name"))
    name = fn["name"]
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise ValueError(f"tool {name!r}: description must be a string, got {type(fn['description']).__name__}")
    for part in ("parameters", "response"):
        if fn.get(part) is not None and not isinstance(fn[part], Mapping):
            raise ValueError(f"tool {name!r}: {part} must be a JSON Schema object, got {type(fn[part]).__name__} {fn[part]!r:.40}")
    for key, want in (("x-stateful", bool), ("x-domain", str)):
        for src in (fn, d):
            if key in src and src[key] is not None and not isinstance(src[key], want):
                raise ValueError(f"tool {name!r}: {key} must be a {want.__name__}, got {src[key]!r:.40}")


def check_tool_schema(spec: ToolSpec) -> None:
    """Raise ValueError naming the tool if its name, parameters or response schema is invalid."""
    check_tool_name(spec.name)
    for part in ("parameters", "response"):
        schema = getattr(spec, part)
        if schema is None:
            continue
        if not isinstance(schema, dict):
            raise ValueError(f"tool {spec.name!r}: {part} must be a JSON Schema object, got {type(schema).__name__}")
        if nesting_depth(schema) > MAX_DEPTH:
            raise ValueError(f"tool {spec.name!r}: {part} schema is nested deeper than {MAX_DEPTH} levels")
        try:
            _validator(json.dumps(schema, sort_keys=True, allow_nan=False))
        except SchemaError as e:
            raise ValueError(f"tool {spec.name!r}: invalid {part} schema: {e.message}") from None
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"tool {spec.name!r}: invalid {part} schema: {e}") from None
    if spec.parameters.get("type", "object") != "object":
        raise ValueError(f"tool {spec.name!r}: parameters must have type 'object', got {spec.parameters.get('type')!r}")


def check_tool(tool: Mapping[str, Any]) -> ToolSpec:
    """One OpenAI tool dict as a checked :class:`ToolSpec`; ValueError naming the tool if it is unusable.

    Besides the schema checks of :func:`check_tool_schema`: ``parameters`` and
    ``response`` must be objects when given (``parameters: []`` is refused, not
    read as "no parameters"), ``description`` a string, ``x-stateful`` a real
    boolean (the string ``"false"`` is refused, not read as True), ``x-domain``
    a string.
    """
    _check_raw(tool)
    spec = ToolSpec.from_openai(dict(tool))
    check_tool_schema(spec)
    return spec


def as_tool_specs(tools: Iterable[Any]) -> list[ToolSpec]:
    """Parse OpenAI tool dicts (or ToolSpecs) and check every schema; names must be unique."""
    specs: list[ToolSpec] = []
    for i, t in enumerate(tools):
        try:
            if isinstance(t, ToolSpec):
                check_tool_schema(t)
                spec = t
            elif isinstance(t, Mapping):
                spec = check_tool(t)
            else:
                raise ValueError(f"must be an OpenAI tool dict or a ToolSpec, got {type(t).__name__}")
        except ValueError as e:
            raise ValueError(f"tools[{i}]: {e}") from None
        specs.append(spec)
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tools: duplicate tool names {dup}")
    return specs


def _message(err: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in err.absolute_path)
    return f"{err.message}" + (f" (at '{where}')" if where else "")


def _first_error(v: Any, instance: Any) -> str | None:
    """The best validation error for ``instance``, or None if it is valid; never raises."""
    try:
        err = best_match(v.iter_errors(instance))  # one pass (a bounded pattern may take its time limit)
    except Unresolvable as e:  # refused at load; kept so a ToolSpec built by hand cannot fetch either
        return f"the schema has an unresolvable $ref ({e})"
    except RecursionError:
        return "the value is nested too deeply to validate"
    return None if err is None else _message(err)


class ToolBox:
    """Checked tool specs with compiled validators, looked up by name."""

    def __init__(self, tools: Iterable[Any]):
        self.specs: dict[str, ToolSpec] = {s.name: s for s in as_tool_specs(tools)}
        self._args = {n: _validator(json.dumps(s.parameters, sort_keys=True)) for n, s in self.specs.items()}
        self._resp = {n: _validator(json.dumps(s.response, sort_keys=True)) for n, s in self.specs.items() if s.response}

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def argument_error(self, name: str, arguments: Any) -> str | None:
        """A message the model can read if the call is invalid, else None."""
        if name not in self.specs:
            return f"unknown tool {name!r}; available tools: {', '.join(sorted(self.specs))}"
        if not isinstance(arguments, dict):
            return f"arguments for {name!r} must be a JSON object, got {type(arguments).__name__}"
        err = _first_error(self._args[name], arguments)
        return None if err is None else f"invalid arguments for {name!r}: {err}"

    def response_error(self, name: str, content: Any) -> str | None:
        """Why ``content`` violates ``name``'s response schema, or None (also when it has none)."""
        v = self._resp.get(name)
        return None if v is None else _first_error(v, content)
