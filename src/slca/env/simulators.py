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

Failure behaviour: ``call`` never raises on anything the model wrote. Arguments
that are not plain JSON (lone surrogates, non-finite numbers, nesting past 64,
non-string keys) are ``invalid_arguments``; a dataset ``pattern`` that cannot
match a value within 50 ms refuses the value; every answer must be plain JSON and
at most ``max_response_chars`` long (``metrics["invalid_output"]``,
``metrics["oversized_output"]``). A Python tool that raises gives the model an
error result naming the exception (``metrics["tool_raised"]``); the first such
traceback of a run is logged once (:func:`tool_raised`), so a bug in a tool
is seen without stopping the run -- as TRL's tool loop does with the same tools.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import inspect
import logging
import math
import random
import re
import signal
import string
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, timedelta, timezone
from typing import Any, Protocol, runtime_checkable

from slca._limits import SRE, PatternTimeout, parse_regex, pattern_search, value_problem
from slca.env.schema import ToolBox
from slca.types import ToolResult, call_key

__all__ = ["Simulator", "ToolError", "BaseSimulator", "PythonSimulator", "SchemaSimulator", "call_key", "exception_result", "new_tool_run", "tool_raised"]

log = logging.getLogger("slca.env")


@runtime_checkable
class Simulator(Protocol):
    """Anything that answers tool calls; ``episode`` scopes state and caching (one rollout)."""

    def call(self, name: str, arguments: dict, episode: str | int = 0) -> ToolResult: ...


class ToolError(Exception):
    """Raised by a tool implementation to return a failed call the model should see."""


_first_traceback_logged = threading.Event()


def new_tool_run() -> None:
    """A run starts: the next tool exception's traceback is logged again (:func:`tool_raised`)."""
    _first_traceback_logged.clear()


def tool_raised(name: str, exc: Exception) -> str:
    """The error a model reads when tool ``name`` raised ``exc``: ``"<name> raised <Type>: <message>"``.

    The first call of a run (since :func:`new_tool_run`, which slca's trainer and
    ``SLCAGRPOTrainer`` call when they are built) logs the exception's traceback on
    the ``slca.env`` logger (WARNING); later ones log nothing -- the model reads each
    as its tool result, and the simulator counts them in ``metrics["tool_raised"]``.
    The one place both hosts word a tool's exception, so the model sees the same
    text in ``slca train`` and in TRL.
    """
    if not _first_traceback_logged.is_set():
        _first_traceback_logged.set()
        log.warning("tool %r raised %s: the model reads it as the call's error result; this is the first tool exception "
                    "of the run (later ones are not logged)", name, type(exc).__name__, exc_info=exc)
    return f"{name} raised {type(exc).__name__}: {exc}"


def exception_result(name: str, exc: Exception) -> ToolResult:
    """The failed result of tool ``name`` that raised ``exc``, worded alike in every host.

    :class:`ToolError` and ``ValueError`` are the tool refusing the call: ``"<name>
    failed: <message>"``. Any other exception is a bug in the tool: :func:`tool_raised`
    (the type and message; the first traceback of the run is logged).
    """
    if isinstance(exc, (ToolError, ValueError)):
        return ToolResult(ok=False, error=f"{name} failed: {exc}")
    return ToolResult(ok=False, error=tool_raised(name, exc))


@functools.lru_cache(maxsize=1024)
def _wants_state(fn: Callable[..., Any]) -> bool:
    sig = _signature(fn)
    return sig is not None and "state" in sig.parameters


@functools.lru_cache(maxsize=1024)  # inspect.signature is slow; toolworld's generator builds a simulator per task
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: then the call itself decides
        return None


def _stable_int(*parts: Any) -> int:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(h[:8], "big")


class BaseSimulator:
    """Argument validation, per-episode cache and state, and error metrics shared by the backends.

    Subclasses implement ``_execute(name, arguments, episode) -> ToolResult``.
    ``metrics`` counts ``calls``, ``cache_hits`` and failures by kind
    (``unknown_tool``, ``invalid_arguments``, ``tool_error``, ``invalid_output``,
    ``oversized_output``, ...). An answer whose tool message would be longer than
    ``max_response_chars`` (None: no limit) becomes ``ok=False``.
    """

    max_response_chars: int | None = 16384

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
        if not isinstance(name, str) or name not in self.specs:
            self.metrics["unknown_tool"] += 1
            return ToolResult(ok=False, error=self.toolbox.argument_error(str(name)[:200], arguments))
        problem = value_problem(arguments) if isinstance(arguments, dict) else None
        err = f"invalid arguments for {name!r}: {problem}" if problem else self.toolbox.argument_error(name, arguments)
        if err is not None:
            self.metrics["invalid_arguments"] += 1
            return ToolResult(ok=False, error=err)
        key = call_key(name, arguments)
        cache = self._cache.setdefault(episode, {})
        if key in cache:
            self.metrics["cache_hits"] += 1
            return cache[key]
        result = self._execute(name, dict(arguments), episode)
        if result.ok:
            result = self._checked_output(name, result)
        if not result.ok:
            self.metrics["failed"] += 1
        # Stateful tools change the world: repeating one is a new action, not a cached read.
        if not self.specs[name].stateful:
            cache[key] = result
        return result

    def _checked_output(self, name: str, result: ToolResult) -> ToolResult:
        """``result`` if its content is plain JSON of bounded size, else a failed call (counted)."""
        problem = value_problem(result.content)
        if problem is not None:
            self.metrics["invalid_output"] += 1
            return ToolResult(ok=False, error=f"{name} returned a value that is not JSON: {problem}")
        limit = self.max_response_chars
        if limit is not None:
            size = len(result.to_text())
            if size > limit:
                self.metrics["oversized_output"] += 1
                return ToolResult(ok=False, error=f"{name} returned {size} characters, more than the limit of {limit}")
        return result

    def _execute(self, name: str, arguments: dict, episode: str | int) -> ToolResult:  # pragma: no cover
        raise NotImplementedError


class _CallTimeout(BaseException):
    """Raised inside a Python tool that ran past its time limit (a BaseException, so the tool's own
    ``except Exception`` cannot swallow it)."""


class _ToolNotRun(RuntimeError):
    """The tool could not be started (the interpreter is shutting down); raised past the tool-error handling."""


def _run_with_deadline(fn: Callable[..., Any], kwargs: dict, seconds: float | None) -> Any:
    """``fn(**kwargs)``, raising :class:`_CallTimeout` after ``seconds``.

    In the main thread on POSIX, with no other real-time timer running, the call
    is interrupted (``SIGALRM`` via ``setitimer``). Elsewhere it runs in a worker
    thread and is abandoned when late: Python cannot stop a thread, so it finishes
    on its own in the background.
    """
    if seconds is None:
        return fn(**kwargs)
    if (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    ):
        armed = [True]

        def on_alarm(signum: int, frame: Any) -> None:
            if armed[0]:
                raise _CallTimeout

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            try:
                return fn(**kwargs)
            finally:
                armed[0] = False  # from here on a late alarm is ignored
        finally:  # (one-shot timer: if it fired just before the line above, this still runs)
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="slca-tool")
    try:
        try:
            future = pool.submit(fn, **kwargs)
        except RuntimeError as e:  # the interpreter is shutting down: the tool never ran, so it is not the tool's error
            raise _ToolNotRun(str(e)) from e
        return future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise _CallTimeout from None
    finally:
        pool.shutdown(wait=False)


class PythonSimulator(BaseSimulator):
    """Tools backed by real Python callables.

    ``functions[name](**arguments)`` returns the tool's JSON-serialisable content;
    a callable that declares a ``state`` parameter also gets the episode's state
    dict (for stateful suites). Raising :class:`ToolError` (or ``ValueError``)
    returns ``ok=False`` with the message (``metrics["tool_error"]``); any other
    exception returns ``ok=False`` with ``"<name> raised <Type>: <message>"``
    (``metrics["tool_raised"]``), and the first one of a run logs its
    traceback (:func:`tool_raised`). Content that violates the tool's response
    schema is returned as a failed call and counted in ``metrics["invalid_output"]``.

    Failure behaviour (no conversion happens behind the tool's back):

    * arguments the callable does not accept (an extra key the schema allows, a
      parameter the schema does not require) -> ``ok=False`` naming the argument,
      ``metrics["invalid_arguments"]``; the callable is not run;
    * a result that is not plain JSON (``set``, ``datetime``, ``bytes``,
      ``Decimal``, NaN, ...) -> ``ok=False`` naming the value's path and type,
      ``metrics["invalid_output"]``: return ``sorted(s)``, ``d.isoformat()``,
      ``str(x)`` yourself;
    * a call running longer than ``timeout`` seconds (default 10; None: no limit)
      -> ``ok=False``, ``metrics["timeouts"]``. In the main thread the call is
      interrupted; in other threads it is abandoned and finishes in the background.
    """

    def __init__(self, tools: Iterable[Any] | ToolBox, functions: Mapping[str, Callable[..., Any]], *, timeout: float | None = 10.0):
        super().__init__(tools)
        missing = sorted(set(self.specs) - set(functions))
        if missing:
            raise ValueError(f"functions: no implementation for tools {missing}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        self.functions = dict(functions)
        self.timeout = timeout
        self._wants_state = {n: _wants_state(f) for n, f in self.functions.items()}
        self._signatures = {n: _signature(f) for n, f in self.functions.items()}

    def _execute(self, name: str, arguments: dict, episode: str | int) -> ToolResult:
        fn = self.functions[name]
        kwargs = dict(arguments)
        if self._wants_state.get(name):
            kwargs["state"] = self.state(episode)
        sig = self._signatures.get(name)
        if sig is not None:
            try:
                sig.bind(**kwargs)
            except TypeError as e:
                self.metrics["invalid_arguments"] += 1
                return ToolResult(ok=False, error=f"invalid arguments for {name!r}: {e}")
        try:
            content = _run_with_deadline(fn, kwargs, self.timeout)
        except _ToolNotRun:  # this process is ending (a signal during a rollout): not a result the model reads
            raise
        except _CallTimeout:
            self.metrics["timeouts"] += 1
            return ToolResult(ok=False, error=f"{name} did not finish within {self.timeout} s")
        except Exception as e:  # a refusal (ToolError, ValueError) or a bug: the model reads it as the call's result
            self.metrics["tool_error" if isinstance(e, (ToolError, ValueError)) else "tool_raised"] += 1
            return exception_result(name, e)
        problem = value_problem(content)
        if problem is not None:
            self.metrics["invalid_output"] += 1
            return ToolResult(ok=False, error=f"{name} returned a value that is not JSON: {problem}")
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
MAX_ITEMS = 64
"""Most items the schema simulator draws for one array (a larger ``minItems`` is refused)."""
MAX_STRING = 4096
"""Longest string the schema simulator draws (a larger ``minLength`` is refused)."""
MAX_VALUES = 4096
"""Most values (nested ones included) in one drawn response."""


class _Refused(Exception):
    """A response schema asks for something the simulator will not draw (too large, nothing allowed)."""


class _Draw:
    """One response draw: the RNG, the schema root (for ``$ref``) and a budget of values."""

    def __init__(self, rng: random.Random, root: Any):
        self.rng, self.root, self.left = rng, root, MAX_VALUES

    def spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise _Refused(f"the response schema asks for more than {MAX_VALUES} values")


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

    Failure behaviour: a response schema that allows nothing (``enum: []``) or
    asks for more than the simulator draws (``minItems`` > 64, ``minLength`` >
    4096, more than 4096 values in all) gives ``ok=False`` saying so, counted in
    ``metrics["invalid_output"]``; a schema construct the generator cannot handle
    (an error while drawing) gives ``ok=False`` counted in
    ``metrics["schema_errors"]``. A ``pattern`` is drawn from the stdlib's parse of
    the regex and checked with a 50 ms time limit; one it cannot draw or check in
    time falls back to an ordinary string (then the response check decides).
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
            try:
                for attempt in range(_DRAWS):
                    content = _generate(spec.response, _Draw(rng, spec.response), known if attempt == 0 else {}, name, depth=0)
                    bad = self.toolbox.response_error(name, content)
                    if bad is None:
                        break
            except _Refused as e:
                self.metrics["invalid_output"] += 1
                return ToolResult(ok=False, error=f"simulator will not draw a response for {name!r}: {e}")
            except (ValueError, TypeError, OverflowError, RecursionError, IndexError, KeyError, AttributeError) as e:
                self.metrics["schema_errors"] += 1
                return ToolResult(ok=False, error=f"simulator cannot draw a response from {name!r}'s response schema: {type(e).__name__}: {e}")
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


def _generate(schema: Any, ctx: _Draw, known: dict[str, Any], field: str, depth: int) -> Any:
    """Draw one value that satisfies ``schema``; ``field`` is the property name (for ids and echoes)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    rng = ctx.rng
    ctx.spend()
    if "$ref" in schema:
        target = _resolve(schema["$ref"], ctx.root) if isinstance(schema["$ref"], str) else None
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _generate({**target, **rest} if isinstance(target, dict) else rest, ctx, known, field, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        if not schema["enum"]:
            raise _Refused(f"{field!r} has an empty enum: no value is allowed")
        return rng.choice(schema["enum"])
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for sub in schema["allOf"]:
            if isinstance(sub, dict):
                merged.update(sub)
        return _generate({**{k: v for k, v in schema.items() if k != "allOf"}, **merged}, ctx, known, field, depth + 1)
    for comb in ("anyOf", "oneOf"):
        if comb in schema and schema[comb]:
            return _generate(schema[comb][0], ctx, known, field, depth + 1)
    types = [t for t in _types(schema) if t != "null"] or ["null"]
    t = types[0]
    if t == "object":
        props = schema.get("properties", {})
        out: dict[str, Any] = {}
        for k, sub in props.items():
            if k in known and depth == 0:
                out[k] = known[k]
            else:
                out[k] = _generate(sub, ctx, known, k, depth + 1)
        return out
    if t == "array":
        lo = int(schema.get("minItems", 1))
        if lo > MAX_ITEMS:
            raise _Refused(f"{field!r} needs minItems {lo}, more than the {MAX_ITEMS} items the simulator draws")
        hi = min(int(schema.get("maxItems", max(lo, 3))), MAX_ITEMS)
        n = rng.randint(lo, max(lo, hi))
        return [_generate(schema.get("items", {}), ctx, known, field, depth + 1) for _ in range(n)]
    if t in ("integer", "number"):
        return _number(schema, t == "integer", rng)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    return _string(schema, ctx, field)


def _number(schema: dict[str, Any], integer: bool, rng: random.Random) -> int | float:
    """Draw a number within the schema's bounds, on its ``multipleOf`` grid (a step of 1 or 0.01 without one)."""
    lo = float(schema["minimum"]) if "minimum" in schema else None
    hi = float(schema["maximum"]) if "maximum" in schema else None
    if "exclusiveMinimum" in schema:
        lo = max(lo if lo is not None else -1e18, float(schema["exclusiveMinimum"]) + (1 if integer else 0.01))
    if "exclusiveMaximum" in schema:
        hi = min(hi if hi is not None else 1e18, float(schema["exclusiveMaximum"]) - (1 if integer else 0.01))
    lo = 0.0 if lo is None else lo
    hi = lo + (100.0 if integer else 1000.0) if hi is None else hi
    step = float(schema.get("multipleOf", 1 if integer else 0.01))
    k_lo, k_hi = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    k = rng.randint(k_lo, max(k_lo, k_hi))
    if integer:
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


def _from_regex(pattern: str, rng: random.Random) -> str | None:
    """A string matching ``pattern``, drawn by walking the stdlib's parse of the regex (None if unsupported)."""
    try:
        tree = parse_regex(pattern)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        return None
    c = SRE
    left = [MAX_STRING]  # characters still allowed (nested repeats multiply)

    def walk(items: Any) -> str:
        out = []
        for op, av in items:
            left[0] -= 1
            if left[0] < 0:
                raise ValueError("the pattern's shortest match is too long")
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
                if lo > MAX_STRING:
                    raise ValueError("the pattern repeats more than the simulator draws")
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
        return s if pattern_search(pattern, s) else None
    except (ValueError, RecursionError, PatternTimeout):
        return None


def _string(schema: dict, ctx: _Draw, field: str) -> str:
    rng = ctx.rng
    if isinstance(schema.get("pattern"), str):
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
    if lo > MAX_STRING:
        raise _Refused(f"{field!r} needs minLength {lo}, more than the {MAX_STRING} characters the simulator draws")
    if len(s) < lo:
        s = s + "".join(rng.choice(string.ascii_lowercase) for _ in range(lo - len(s)))
    if hi is not None and len(s) > int(hi):
        s = s[: int(hi)]
    return s
