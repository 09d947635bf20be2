"""Tool simulators: what answers a rollout's tool calls.

One interface (:class:`Simulator`), three backends:

* :class:`SchemaSimulator` -- deterministic, seeded, schema-guided: answers
  conform to each tool's response schema; stateful tools remember what they
  created within an episode.
* :class:`slca.env.llm.LLMSimulator` -- the paper's Schema-Guided LLM Simulator
  (SGLS): an OpenAI-compatible chat endpoint plays the tool.
* :class:`PythonSimulator` -- real Python callables (stateful suites, toolworld).

Every backend validates the arguments against the tool's JSON Schema first, so
unknown tools, missing required arguments, wrong types and enum violations all
come back as ``ToolResult(ok=False, error=...)`` with a message the model can read.
The same call in the same episode gets the same answer (per-episode cache).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, timedelta, timezone
from typing import Any, Protocol, runtime_checkable

try:  # the regex parser moved in 3.11; both expose the same API
    from re import _constants as _sre_constants, _parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse

from slca.env.schema import ToolBox
from slca.types import ToolResult

__all__ = ["Simulator", "ToolError", "BaseSimulator", "PythonSimulator", "SchemaSimulator", "call_key"]


@runtime_checkable
class Simulator(Protocol):
    """Anything that answers tool calls; ``episode`` scopes state and caching (one rollout)."""

    def call(self, name: str, arguments: dict, episode: str | int = 0) -> ToolResult: ...


class ToolError(Exception):
    """Raised by a tool implementation to return a failed call the model should see."""


def call_key(name: str, arguments: Any) -> str:
    """Canonical text of a call (sorted-key JSON), for caches and seeds."""
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


@functools.lru_cache(maxsize=1024)
def _wants_state(fn: Callable[..., Any]) -> bool:
    return "state" in inspect.signature(fn).parameters


def _stable_int(*parts: Any) -> int:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "big")


class BaseSimulator:
    """Argument validation, per-episode cache and state, and error metrics shared by the backends.

    Subclasses implement ``_execute(name, arguments, episode) -> ToolResult``.
    ``metrics`` counts ``calls``, ``cache_hits`` and failures by kind
    (``unknown_tool``, ``invalid_arguments``, ``tool_error``, ...).
    """

    def __init__(self, tools: Iterable[Any] | ToolBox):
        self.toolbox = tools if isinstance(tools, ToolBox) else ToolBox(tools)
        self.metrics: Counter[str] = Counter()
        self._cache: dict[Any, dict[str, ToolResult]] = {}
        self._state: dict[Any, dict[str, Any]] = {}

    @property
    def specs(self):
        return self.toolbox.specs

    def state(self, episode: str | int = 0) -> dict[str, Any]:
        """The mutable state of one episode (created on first use)."""
        return self._state.setdefault(episode, {})

    def reset(self, episode: str | int | None = None) -> None:
        """Forget one episode's cache and state (all episodes when None)."""
        if episode is None:
            self._cache.clear()
            self._state.clear()
        else:
            self._cache.pop(episode, None)
            self._state.pop(episode, None)

    def call(self, name: str, arguments: dict, episode: str | int = 0) -> ToolResult:
        """Validate, answer from the episode cache or execute, and count the outcome."""
        self.metrics["calls"] += 1
        err = self.toolbox.argument_error(name, arguments)
        if err is not None:
            self.metrics["unknown_tool" if name not in self.specs else "invalid_arguments"] += 1
            return ToolResult(ok=False, error=err)
        key = call_key(name, arguments)
        cache = self._cache.setdefault(episode, {})
        if key in cache:
            self.metrics["cache_hits"] += 1
            return cache[key]
        result = self._execute(name, dict(arguments), episode)
        if not result.ok:
            self.metrics["failed"] += 1
        # Stateful tools change the world: repeating one is a new action, not a cached read.
        if not self.specs[name].stateful:
            cache[key] = result
        return result

    def _execute(self, name: str, arguments: dict, episode: str | int) -> ToolResult:  # pragma: no cover
        raise NotImplementedError


class PythonSimulator(BaseSimulator):
    """Tools backed by real Python callables.

    ``functions[name](**arguments)`` returns the tool's JSON-serialisable content;
    a callable that declares a ``state`` parameter also gets the episode's state
    dict (for stateful suites). Raising :class:`ToolError` (or ``ValueError``)
    returns ``ok=False`` with the message; any other exception is a bug in the
    tool and propagates. Content that violates the tool's response schema is
    returned as a failed call and counted in ``metrics["invalid_output"]``.
    """

    def __init__(self, tools: Iterable[Any] | ToolBox, functions: Mapping[str, Callable[..., Any]]):
        super().__init__(tools)
        missing = sorted(set(self.specs) - set(functions))
        if missing:
            raise ValueError(f"functions: no implementation for tools {missing}")
        self.functions = dict(functions)
        self._wants_state = {n: _wants_state(f) for n, f in self.functions.items()}

    def _execute(self, name: str, arguments: dict, episode: str | int) -> ToolResult:
        fn = self.functions[name]
        kwargs = dict(arguments)
        if self._wants_state.get(name):
            kwargs["state"] = self.state(episode)
        try:
            content = fn(**kwargs)
        except (ToolError, ValueError) as e:
            self.metrics["tool_error"] += 1
            return ToolResult(ok=False, error=f"{name} failed: {e}")
        bad = self.toolbox.response_error(name, content)
        if bad is not None:
            self.metrics["invalid_output"] += 1
            return ToolResult(ok=False, error=f"{name} returned output that violates its response schema: {bad}")
        return ToolResult(ok=True, content=content)


# ---------------------------------------------------------------- schema-guided


_WORDS = (
    "alpha amber blue bright calm cedar coral delta ember fern frost gold harbor "
    "iris jade lake maple north oak pearl pine quartz river sage silver stone sun "
    "tide vale willow"
).split()


_DRAWS = 8


class SchemaSimulator(BaseSimulator):
    """Deterministic, seeded, schema-guided tool simulator.

    The answer to ``name(arguments)`` is drawn from the tool's response schema
    with an RNG seeded by ``(seed, name, arguments)``, so it is reproducible and
    the same call in an episode gets the same answer. The generator honours
    ``type`` (including unions), ``enum``/``const``, ``properties``/``required``,
    ``items``/``minItems``/``maxItems``, ``minimum``/``maximum`` (and the
    exclusive forms), ``multipleOf``, ``minLength``/``maxLength``, ``pattern``
    (drawn from the stdlib's parse of the regex), ``format`` (date, date-time,
    time, email, uri, uuid, ipv4), ``anyOf``/``oneOf``/``allOf`` and local
    ``$ref``; every answer is checked against the schema before it is returned
    (a few redraws, then ``ok=False`` counted in ``metrics["invalid_output"]``).

    Consistency: a response property with the same name as an argument echoes
    the argument's value; an ``id`` or ``*_id`` string property gets an id.
    State (``ToolSpec.stateful``): the record ``arguments | response`` of a
    stateful tool is stored in the episode under every id it holds; a later call
    in the same episode whose arguments mention that id gets the stored values
    for matching response properties (a booking made can be looked up).
    A tool without a response schema answers ``{"status": "ok"}`` plus its arguments.
    """

    def __init__(self, tools: Iterable[Any] | ToolBox, seed: int = 0):
        super().__init__(tools)
        self.seed = int(seed)

    def _execute(self, name: str, arguments: dict, episode: str | int) -> ToolResult:
        spec = self.specs[name]
        rng = random.Random(_stable_int(self.seed, call_key(name, arguments)))
        records = self.state(episode).setdefault("records", {})
        known: dict[str, Any] = dict(arguments)
        for v in arguments.values():
            if isinstance(v, str) and v in records:
                known = {**records[v], **known}
        if spec.response is None:
            content: Any = {"status": "ok", **arguments}
        else:
            # A stored / echoed value may not fit, and float ``multipleOf`` checks can
            # reject a rounded draw: redraw (without the echoes) a few times.
            for attempt in range(_DRAWS):
                content = _generate(spec.response, rng, known if attempt == 0 else {}, name, depth=0, root=spec.response)
                bad = self.toolbox.response_error(name, content)
                if bad is None:
                    break
            if bad is not None:
                self.metrics["invalid_output"] += 1
                return ToolResult(ok=False, error=f"simulator could not produce a valid response for {name!r}: {bad}")
        if spec.stateful and isinstance(content, dict):
            record = {**arguments, **content}
            for k, v in record.items():
                if isinstance(v, str) and (k == "id" or k.endswith("_id")):
                    records[v] = record
        return ToolResult(ok=True, content=content)


def _types(schema: dict) -> list[str]:
    t = schema.get("type")
    if t is None:
        if "properties" in schema:
            return ["object"]
        if "items" in schema:
            return ["array"]
        return ["string"]
    return [t] if isinstance(t, str) else list(t)


def _resolve(ref: str, root: Any) -> Any:
    """A local JSON pointer (``#/$defs/Name``) into ``root``; None if it does not resolve."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _generate(schema: Any, rng: random.Random, known: dict[str, Any], field: str, depth: int, root: Any = None) -> Any:
    """Draw one value that satisfies ``schema``; ``field`` is the property name (for ids and echoes)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "$ref" in schema:
        target = _resolve(schema["$ref"], root)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _generate({**target, **rest} if isinstance(target, dict) else rest, rng, known, field, depth + 1, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for sub in schema["allOf"]:
            merged.update(sub)
        return _generate({**{k: v for k, v in schema.items() if k != "allOf"}, **merged}, rng, known, field, depth + 1, root)
    for comb in ("anyOf", "oneOf"):
        if comb in schema:
            return _generate(schema[comb][0], rng, known, field, depth + 1, root)
    types = [t for t in _types(schema) if t != "null"] or ["null"]
    t = types[0]
    if t == "object":
        props = schema.get("properties", {})
        out: dict[str, Any] = {}
        for k, sub in props.items():
            if k in known and depth == 0:
                out[k] = known[k]
            else:
                out[k] = _generate(sub, rng, known, k, depth + 1, root)
        return out
    if t == "array":
        lo = int(schema.get("minItems", 1))
        hi = int(schema.get("maxItems", max(lo, 3)))
        n = rng.randint(lo, max(lo, hi))
        return [_generate(schema.get("items", {}), rng, known, field, depth + 1, root) for _ in range(n)]
    if t in ("integer", "number"):
        lo = float(schema["minimum"]) if "minimum" in schema else None
        hi = float(schema["maximum"]) if "maximum" in schema else None
        if "exclusiveMinimum" in schema:
            lo = max(lo if lo is not None else -1e18, float(schema["exclusiveMinimum"]) + (1 if t == "integer" else 0.01))
        if "exclusiveMaximum" in schema:
            hi = min(hi if hi is not None else 1e18, float(schema["exclusiveMaximum"]) - (1 if t == "integer" else 0.01))
        lo = 0.0 if lo is None else lo
        hi = lo + (100.0 if t == "integer" else 1000.0) if hi is None else hi
        step = float(schema.get("multipleOf", 1 if t == "integer" else 0.01))
        k_lo, k_hi = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
        k = rng.randint(k_lo, max(k_lo, k_hi))
        if t == "integer":
            return int(round(k * step))
        if "multipleOf" not in schema or not isinstance(schema["multipleOf"], float):
            return round(k * step, 10)
        # jsonschema checks a float multipleOf as ``int(x / step) == x / step``, which
        # rounding error fails for some multiples (4.1 / 0.1): take the nearest k that passes.
        n = max(1, k_hi - k_lo + 1)
        for d in range(min(n, 64)):
            x = round((k_lo + (k - k_lo + d) % n) * step, 10)
            if x / step == int(x / step):
                return x
        return round(k * step, 10)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    return _string(schema, rng, field)


def _from_regex(pattern: str, rng: random.Random) -> str | None:
    """A string matching ``pattern``, drawn by walking the stdlib's parse of the regex (None if unsupported)."""
    try:
        tree = _sre_parse.parse(pattern)
    except re.error:
        return None
    c = _sre_constants

    def walk(items: Any) -> str:
        out = []
        for op, av in items:
            if op is c.LITERAL:
                out.append(chr(av))
            elif op is c.NOT_LITERAL:
                out.append("x" if chr(av) != "x" else "y")
            elif op is c.ANY:
                out.append(rng.choice(string.ascii_lowercase))
            elif op is c.IN:
                out.append(pick(av))
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                lo, hi, sub = av
                hi = min(hi, lo + 3) if hi is not c.MAXREPEAT else lo + 3
                out.extend(walk(sub) for _ in range(rng.randint(lo, max(lo, hi))))
            elif op is c.SUBPATTERN:
                out.append(walk(av[-1]))
            elif op is c.BRANCH:
                out.append(walk(rng.choice(av[1])))
            elif op is c.AT:
                continue
            elif op is c.CATEGORY:
                out.append(pick([(op, av)]))
            else:
                raise ValueError(f"unsupported regex construct {op}")
        return "".join(out)

    def pick(options: Any) -> str:
        chars: list[str] = []
        for op, av in options:
            if op is c.LITERAL:
                chars.append(chr(av))
            elif op is c.RANGE:
                chars.extend(chr(x) for x in range(av[0], min(av[1], av[0] + 60) + 1))
            elif op is c.CATEGORY:
                chars.extend({c.CATEGORY_DIGIT: string.digits, c.CATEGORY_WORD: string.ascii_letters + string.digits,
                              c.CATEGORY_SPACE: " "}.get(av, "x"))
            elif op is c.NEGATE:
                raise ValueError("negated character classes are not generated")
        return rng.choice(chars) if chars else "x"

    try:
        s = walk(tree)
    except ValueError:
        return None
    return s if re.search(pattern, s) else None


def _string(schema: dict, rng: random.Random, field: str) -> str:
    if "pattern" in schema:
        s = _from_regex(schema["pattern"], rng)
        if s is not None:
            return s
    fmt = schema.get("format")
    base = date(2025, 1, 1) + timedelta(days=rng.randint(0, 364))
    if fmt == "date":
        s = base.isoformat()
    elif fmt == "date-time":
        s = datetime(base.year, base.month, base.day, rng.randint(0, 23), rng.choice((0, 15, 30, 45)), tzinfo=timezone.utc).isoformat()
    elif fmt == "time":
        s = f"{rng.randint(0, 23):02d}:{rng.choice((0, 15, 30, 45)):02d}:00"
    elif fmt == "email":
        s = f"{rng.choice(_WORDS)}{rng.randint(1, 99)}@example.com"
    elif fmt in ("uri", "url", "iri"):
        s = f"https://example.com/{rng.choice(_WORDS)}/{rng.randint(1, 999)}"
    elif fmt == "uuid":
        s = "%08x-%04x-4%03x-8%03x-%012x" % (rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(12), rng.getrandbits(12), rng.getrandbits(48))
    elif fmt == "ipv4":
        s = ".".join(str(rng.randint(1, 254)) for _ in range(4))
    elif field == "id" or field.endswith("_id"):
        prefix = "".join(w[0] for w in field.split("_")[:-1]).upper() or "ID"
        s = f"{prefix}{rng.randint(100, 999)}"
    else:
        s = rng.choice(_WORDS) + ("" if rng.random() < 0.5 else f" {rng.choice(_WORDS)}")
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(s) < lo:
        s = s + "".join(rng.choice(string.ascii_lowercase) for _ in range(lo - len(s)))
    if hi is not None and len(s) > int(hi):
        s = s[: int(hi)]
    return s
