"""Tool schemas: load-time checks and argument / response validation.

Tools are OpenAI function schemas whose ``parameters`` (and optional
``response``) are JSON Schemas. Every check goes through ``jsonschema``
(Draft 2020-12 meta-schema, with its ``FormatChecker`` so ``date``, ``email``,
``ipv4``, ... are enforced); nothing here re-implements JSON Schema.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError, best_match

from slca._limits import BoundedValidator
from slca.types import ToolCall, ToolSpec

__all__ = ["ToolBox", "as_tool_specs", "check_tool_schema", "check_calls"]

_FORMATS = FormatChecker()


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Draft202012Validator:
    """A checked, compiled validator for one schema (cached: datasets repeat their tools).

    Draft 2020-12, with ``pattern`` / ``patternProperties`` matched under a time
    limit (:data:`slca._limits.PATTERN_TIMEOUT`): a value a dataset regex cannot
    match in time is refused instead of backtracking for minutes.
    """
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return BoundedValidator(schema, format_checker=_FORMATS)


def check_tool_schema(spec: ToolSpec) -> None:
    """Raise ValueError naming the tool if its parameters or response schema is invalid."""
    if not isinstance(spec.name, str) or not spec.name:
        raise ValueError(f"tool name must be a non-empty string, got {spec.name!r}")
    for part in ("parameters", "response"):
        schema = getattr(spec, part)
        if schema is None:
            continue
        if not isinstance(schema, dict):
            raise ValueError(f"tool {spec.name!r}: {part} must be a JSON Schema object, got {type(schema).__name__}")
        try:
            _validator(json.dumps(schema, sort_keys=True))
        except SchemaError as e:
            raise ValueError(f"tool {spec.name!r}: invalid {part} schema: {e.message}") from e
    if spec.parameters.get("type", "object") != "object":
        raise ValueError(f"tool {spec.name!r}: parameters must have type 'object', got {spec.parameters.get('type')!r}")


def as_tool_specs(tools: Iterable[Any]) -> list[ToolSpec]:
    """Parse OpenAI tool dicts (or ToolSpecs) and check every schema; names must be unique."""
    specs: list[ToolSpec] = []
    for i, t in enumerate(tools):
        if isinstance(t, ToolSpec):
            spec = t
        elif isinstance(t, Mapping):
            try:
                spec = ToolSpec.from_openai(dict(t))
            except ValueError as e:
                raise ValueError(f"tools[{i}]: {e}") from e
        else:
            raise ValueError(f"tools[{i}] must be an OpenAI tool dict or a ToolSpec, got {type(t).__name__}")
        check_tool_schema(spec)
        specs.append(spec)
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tools: duplicate tool names {dup}")
    return specs


def _message(err: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in err.absolute_path)
    return f"{err.message}" + (f" (at '{where}')" if where else "")


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
        err = best_match(self._args[name].iter_errors(arguments))  # one pass (a bounded pattern may take its time limit)
        if err is not None:
            return f"invalid arguments for {name!r}: {_message(err)}"
        return None

    def response_error(self, name: str, content: Any) -> str | None:
        """Why ``content`` violates ``name``'s response schema, or None (also when it has none)."""
        v = self._resp.get(name)
        if v is None:
            return None
        err = best_match(v.iter_errors(content))
        return None if err is None else _message(err)


def check_calls(tools: Iterable[Any], gold: list[list[ToolCall]], *, where: str = "task") -> None:
    """Raise ValueError (prefixed with ``where``) if a gold call names an unknown tool or breaks its schema."""
    box = tools if isinstance(tools, ToolBox) else ToolBox(tools)
    for s, step in enumerate(gold):
        for c, call in enumerate(step):
            err = box.argument_error(call.name, call.arguments)
            if err is not None:
                raise ValueError(f"{where}: gold step {s} call {c} violates its schema: {err}")
