"""The checked readers of a row's fields, shared by every row format (:mod:`slca.env.rows`).

Each reader takes a value and the field's path in the row (``messages[3].function_call.arguments``) and
returns it checked and decoded (JSON-encoded strings are decoded), or raises :class:`BadValue` naming the
field; :func:`slca.env.loaders.task_from_row` turns that into a :class:`RowError` naming the source, the row
and the field. The gold readers (:func:`gold_steps`) parse the steps of parallel calls every format stores.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from slca.env.schema import MAX_DEPTH, ToolBox, check_tool, nesting_depth
from slca.types import ToolCall


log = logging.getLogger("slca.env")

ROLES = ("system", "user", "assistant", "function", "tool")


class RowError(ValueError):
    """A row that cannot become a valid :class:`Task`.

    ``source`` is the file (or dataset) name, ``row`` the row's 0-based index,
    ``field`` the offending field as a path (``messages[3].function_call.arguments``;
    empty for a row-level problem), ``problem`` what is wrong.
    """

    def __init__(self, source: str, row: int | None, field: str, problem: str, row_id: str | None = None):
        self.source, self.row, self.field, self.problem = source, row, field, problem
        where = source if row is None else f"{source} row {row}" + (f" (id {row_id})" if row_id else "")
        super().__init__(f"{where}: field {field!r}: {problem}" if field else f"{where}: {problem}")


class BadValue(Exception):
    """Raised inside a row builder; :func:`task_from_row` turns it into a :class:`RowError`."""

    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field, self.problem = field, problem


# ---------------------------------------------------------------- values


def json_value(text: str) -> Any:
    """``json.loads`` with every way it can fail as ValueError (bad JSON, too deep, an over-long integer)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than Python can decode (more than ~{MAX_DEPTH} levels are refused anyway)") from None
    except ValueError as e:  # JSONDecodeError, and "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"not valid JSON: {e}") from None


def checked_value(value: Any, field: str) -> Any:
    """Refuse a value nested deeper than MAX_DEPTH or that does not survive JSON (NaN, huge integers, objects)."""
    if nesting_depth(value) > MAX_DEPTH:
        raise BadValue(field, f"nested deeper than {MAX_DEPTH} levels")
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as e:
        raise BadValue(field, f"not a JSON value: {e}") from None
    return value


def decoded(value: Any, field: str) -> Any:
    """A column value, JSON-decoded if it is a string, checked."""
    if isinstance(value, str):
        try:
            value = json_value(value)
        except ValueError as e:
            raise BadValue(field, str(e)) from None
    return checked_value(value, field)


def row_field(row: dict[str, Any], name: str, path: str | None = None) -> Any:
    if name not in row or row[name] is None:
        raise BadValue(path or name, f"missing (the row has {sorted(row)})")
    return row[name]


def as_list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise BadValue(field, f"must be a list, got {type(value).__name__}")
    return list(value)


def as_dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadValue(field, f"must be an object, got {type(value).__name__}")
    return value


def row_id(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadValue(field, f"must be a string or an integer, got {type(value).__name__}")
    return str(value)


def row_facts(value: Any, field: str) -> list[str]:
    """``answer_facts``: a list of strings or numbers (a JSON string of one is decoded); a bare string is refused."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json_value(value)
        except ValueError:
            raise BadValue(field, f"must be a list of strings, got the string {value[:40]!r} (a bare string is not split into characters)") from None
    out = []
    for i, f in enumerate(as_list(value, field)):
        if isinstance(f, bool) or not isinstance(f, (str, int, float)):
            raise BadValue(f"{field}[{i}]", f"must be a string or a number, got {type(f).__name__}")
        out.append(str(f))
    return out


def row_kind(value: Any, field: str, default: str) -> str:
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise BadValue(field, f"must be a string, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------- tools, messages, calls


def row_tools(value: Any, field: str) -> list[dict[str, Any]]:
    """OpenAI tool schemas, each checked; identical duplicates collapse, conflicting ones are refused."""
    tools: list[dict[str, Any]] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, t in enumerate(as_list(decoded(value, field), field)):
        f = f"{field}[{i}]"
        t = as_dict(decoded(t, f), f)
        fn = t.get("function", t)
        if not isinstance(fn, dict):
            raise BadValue(f"{f}.function", f"must be an object, got {type(fn).__name__}")
        fn = {k: v for k, v in fn.items() if v is not None and k != "type"}  # parquet fills absent struct fields with None
        if "parameters" not in fn and "input_schema" in fn:  # an MCP tool entry
            fn["parameters"] = fn.pop("input_schema")
        fn.pop("annotations", None)
        tool = {"type": "function", "function": fn}
        try:
            check_tool(tool)
        except ValueError as e:
            raise BadValue(f, str(e)) from None
        key = json.dumps(fn, sort_keys=True)
        name = fn["name"]
        if name in seen:
            j, first = seen[name]
            if first != key:
                raise BadValue(f, f"tool {name!r} is defined twice with different schemas ({field}[{j}] and [{i}]); "
                              "slca cannot tell which one the data used")
            log.warning("%s: tool %r is listed twice with the same schema ([%d] and [%d]); keeping one", field, name, j, i)
            continue
        seen[name] = (i, key)
        tools.append(tool)
    return tools


def row_messages(value: Any, field: str) -> list[dict[str, Any]]:
    """A chat list: objects with a known ``role`` and string ``content`` (None allowed where a call or result stands)."""
    msgs = as_list(decoded(value, field), field)
    out = []
    for i, m in enumerate(msgs):
        f = f"{field}[{i}]"
        m = as_dict(m, f)
        role = m.get("role")
        if role in ("tool_call", "tool_response"):
            raise BadValue(f"{f}.role", f"must be one of {list(ROLES)}, got {role!r}: roles tool_call / tool_response are the "
                                    "LLaMA-Factory SFT shape, a demonstration rather than a task; read it with "
                                    "slca.env.load_sft_examples (format 'llamafactory')")
        if role not in ROLES:
            raise BadValue(f"{f}.role", f"must be one of {list(ROLES)}, got {role!r:.40}")
        content = m.get("content")
        if role in ("system", "user") and not isinstance(content, str):
            raise BadValue(f"{f}.content", f"a {role} message's content must be a string, got {type(content).__name__}")
        if role == "assistant" and content is not None and not isinstance(content, str):
            raise BadValue(f"{f}.content", f"an assistant message's content must be a string, got {type(content).__name__}")
        if m.get("reasoning_content") is not None and not isinstance(m["reasoning_content"], str):
            raise BadValue(f"{f}.reasoning_content", f"must be a string, got {type(m['reasoning_content']).__name__}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def row_call(value: Any, field: str) -> ToolCall:
    """``{name, arguments}`` (arguments an object or a JSON string of one; empty means no arguments)."""
    value = as_dict(decoded(value, field), field)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise BadValue(f"{field}.name", f"a call needs a tool name, got {name!r:.40}")
    args = value.get("arguments")
    if args is None or args == "":
        args = {}
    args = decoded(args, f"{field}.arguments")
    if not isinstance(args, dict):
        raise BadValue(f"{field}.arguments", f"arguments of {name!r} must be an object, got {type(args).__name__}")
    return ToolCall(name, args)


Gold = tuple[list[list[ToolCall]], list[list[str]], list[list[int]]]
"""Gold steps, each call's field path, and the ``[step, call]`` indices of the name-only calls."""

EMPTY_STEP = "an empty step: a step holds one call or more (a task without calls has gold [])"


def bare_name(value: Any) -> bool:
    """A string that is a tool name, not JSON text of a call or a step."""
    return isinstance(value, str) and not value.lstrip().startswith(("{", "["))


def gold_call(value: Any, field: str) -> tuple[ToolCall, bool]:
    """A gold call and whether it is name-only: a bare tool name is a call whose arguments are not given."""
    if bare_name(value):
        if not value:
            raise BadValue(field, "a call needs a tool name, got ''")
        return ToolCall(value, {}), True
    return row_call(value, field), False


def gold_step(step: list[Any], f: str, s: int, out: Gold) -> None:
    if not step:
        raise BadValue(f, EMPTY_STEP)
    calls, paths = [], []
    for c_i, c in enumerate(step):
        call, name_only = gold_call(c, f"{f}[{c_i}]")
        calls.append(call)
        paths.append(f"{f}[{c_i}]")
        if name_only:
            out[2].append([s, c_i])
    out[0].append(calls)
    out[1].append(paths)


def gold_steps(value: Any, field: str) -> Gold:
    """Gold as steps (``verl`` / ``slca``); a bare call where a step is expected is a one-call step, a bare name
    inside a step a name-only call (module docstring)."""
    out: Gold = ([], [], [])
    for s, step in enumerate(as_list(decoded(value, field), field)):
        f = f"{field}[{s}]"
        if bare_name(step):
            raise BadValue(f, f"a bare tool name {step!r:.60} where a step is expected: slca cannot tell whether a flat list "
                          "of names is one step of parallel calls (the authors' reading: format 'paper') or a chain; "
                          "write a step as a list, [[\"name\", ...]] (a bare name in a step is a call whose arguments are not given)")
        step = decoded(step, f)
        if isinstance(step, (list, tuple)):
            gold_step(list(step), f, s, out)
        else:
            out[0].append([row_call(step, f)])
            out[1].append([f])
    return out


def check_items(step: Any, f: str) -> None:
    for c_i, c in enumerate(step):
        if not isinstance(c, (str, dict)):
            raise BadValue(f"{f}[{c_i}]", f"must be a call object or a tool name, got {type(c).__name__}")


def kind_of(gold: list[list[ToolCall]]) -> str:
    if not gold:
        return "no_tool"
    if len(gold) == 1:
        return "single" if len(gold[0]) == 1 else "parallel"
    return "chain"


def check_gold(box: ToolBox, steps: list[list[ToolCall]], paths: list[list[str]], name_only: list[list[int]] = ()) -> None:
    """Each gold call against the tools: a name-only call by its name, any other by its schema."""
    names_only = {(s, c) for s, c in name_only}
    for s, (step, ps) in enumerate(zip(steps, paths)):
        for c, (call, p) in enumerate(zip(step, ps)):
            if (s, c) in names_only:
                if call.name not in box.specs:
                    raise BadValue(p, f"gold call (a bare tool name, its arguments not given) to a tool not offered: "
                                  f"{box.argument_error(call.name, {})}")
                continue
            err = box.argument_error(call.name, call.arguments)
            if err is not None:
                raise BadValue(p, f"gold call violates its schema: {err}")


# ---------------------------------------------------------------- target tools (Toucan), the tool box


def parse_target_tools(value: Any, field: str = "target_tools") -> list[str]:
    """Toucan's ``target_tools``: a comma-separated string of tool names, as Toucan's pipeline splits it.

    ``"company_research_exa, competitor_finder_exa"`` -> two names; a
    multi-server ``"Server Name::tool"`` keeps the part after ``::``. A JSON list
    (of strings) is accepted too. Empty or missing -> ``[]``.
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json_value(text)
            except ValueError as e:
                raise BadValue(field, str(e)) from None
        else:
            value = [t for t in (p.strip() for p in text.split(",")) if t]
    names = []
    for i, t in enumerate(as_list(value, field)):
        if not isinstance(t, str):
            raise BadValue(f"{field}[{i}]", f"must be a tool name string, got {type(t).__name__}")
        t = t.split("::")[-1].strip()
        if t:
            names.append(t)
    return names


def toolbox(tools: list[dict[str, Any]], field: str) -> ToolBox:
    try:
        return ToolBox(tools)
    except ValueError as e:  # each tool was checked already; what is left is a name clash
        raise BadValue(field, str(e)) from None


# ---------------------------------------------------------------- ground truth (verl, paper), fields kept in meta


GT = "reward_model.ground_truth"


def ground_truth(row: dict[str, Any]) -> dict[str, Any]:
    """``reward_model.ground_truth`` as an object (either level may be a JSON string)."""
    rm = as_dict(decoded(row_field(row, "reward_model"), "reward_model"), "reward_model")
    return as_dict(decoded(row_field(rm, "ground_truth", GT), GT), GT)


def with_name_only(meta: dict[str, Any], name_only: list[list[int]]) -> dict[str, Any]:
    """``meta`` with ``name_only_gold`` as the gold has it (a stale value from a file is replaced, or dropped)."""
    meta = {k: v for k, v in meta.items() if k != "name_only_gold"}
    if name_only:
        meta["name_only_gold"] = name_only
    return meta


FIELDS_IN_META = ("reference_answer", "refusal")
"""The :class:`Task` fields a task file keeps in its meta object."""


def lift_fields(meta: dict[str, Any], field: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A file's meta object without :data:`FIELDS_IN_META`, and those fields' values (checked)."""
    ref, refusal = meta.get("reference_answer"), meta.get("refusal")
    if ref is not None and not isinstance(ref, str):
        raise BadValue(f"{field}.reference_answer", f"must be a string, got {type(ref).__name__}")
    if refusal is not None and not isinstance(refusal, bool):
        raise BadValue(f"{field}.refusal", f"must be true or false, got {refusal!r}")
    return {k: v for k, v in meta.items() if k not in FIELDS_IN_META}, {"reference_answer": ref, "refusal": refusal}
