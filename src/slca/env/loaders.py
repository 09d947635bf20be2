"""Dataset loaders: Toucan rows, the paper's verl rows and slca's own rows -> :class:`Task`.

Sources: a ``.jsonl``, ``.json`` (a list of rows) or ``.parquet`` file, a folder
written by ``datasets.Dataset.save_to_disk``, a ``datasets.Dataset`` object, or
a list of row dicts. JSON-encoded string columns are decoded.

Row formats:

* ``toucan`` -- Toucan-1.5M as published (Kimi-K2, OSS and Qwen3 configs; every
  column a string): ``uuid``, ``subset_name`` (``single-turn-original``,
  ``single-turn-diversify``, ``irrelevant``, ``multi-turn``), ``messages``
  (roles system / user / assistant / function; a call is an assistant message
  with ``function_call: {name, arguments: "<json>"}``, parallel calls are calls
  with no function result between them; assistant messages may carry
  ``reasoning_content``; results are ``role: "function"`` messages with a
  ``name``), ``available_tools`` (OpenAI tool schemas, often server-prefixed
  names such as ``exa-search-web_search_exa``), ``target_tools`` (a
  comma-separated string of bare tool names), ``question``, the two quality
  assessments and ``metadata`` (``mcp_servers[].remote_server_response.tools[]``
  with ``input_schema``). The prompt is the system (prose only; a
  ``<|im_system|>tool_declare<|im_middle|>...`` declaration is dropped, the chat
  template declares the tools) and user messages before the first assistant
  message; the gold is the calls made for that first request; later user turns
  of a multi-turn row are kept, checked, in ``meta["followups"]``.
* ``verl`` -- the paper's verl-native rows: ``prompt`` (chat list), ``tools``
  (OpenAI tool schemas), ``reward_model.ground_truth.gold_tool_calls`` (a list
  of steps, each a list of ``{name, arguments}``), optional ``answer_facts``
  there and ``extra_info`` (``uuid``/``index``, ``kind``).
* ``paper`` -- the paper's released ``rl`` / ``eval`` rows
  (``AnonymousRepository/toucan-toolcall-slca``; ``format="auto"`` picks it by
  ``data_source`` in :data:`PAPER_SOURCES`): verl rows whose
  ``reward_model.ground_truth`` holds ``question_content``, ``allowed_tools``
  (each an offered tool; every gold call must be one), ``tool_schemas``
  (used when the ``tools`` column is absent; both: the same tool names) and
  ``gold_tool_calls`` (a JSON string of per-step lists of parallel calls), and
  whose ``extra_info`` holds ``original_idx``, ``source``, ``parallel_type``,
  ``has_history`` and, for decomposed multi-turn rows, ``turn_index`` /
  ``split_position`` (all kept, typed, in ``meta``; ``source`` also as
  ``meta["subset"]``). The id is ``<data_source>-<original_idx>`` (plus
  ``-t<turn_index>`` / ``-s<split_position>``).

  The rows the authors' converters write (``data/convert_toucan_to_verl.py``
  and ``_v2.py`` of ``SLCA-GRPO/SLCA-GRPO``; ``data_source`` in
  :data:`CONVERTER_SOURCES`, e.g. their ``data/samples`` RL preview) are
  ``paper`` rows too: ``ground_truth.subset_name`` (``tool_call`` /
  ``irrelevant``) is kept as ``meta["subset_name"]`` (and as ``meta["subset"]``
  when ``extra_info.source`` is absent), ``extra_info.original_turn_index`` as
  ``meta["original_turn_index"]``. A system message that is only the
  converter's tool declaration (v1: ``You have access to the following
  tools: ... <tools>...</tools> ...``, exactly as it writes it for the row's
  tools) is dropped, and a trailing ``# Tool Definitions <tools>...</tools>``
  (v2) is cut from the system text (``meta["tool_declare_dropped"]``): the chat
  template declares the tools, and would otherwise declare them twice.

  Gold, as the authors' reward reads it (``rl/slca_grpo/reward_fn.py``,
  ``_normalize_gold_tool_calls_nested``): a list whose first item is a list is
  a list of steps; any other list is ONE step of parallel calls (v1 wrote a
  flat list of bare tool names: ``["a", "b"]`` is one step of two calls). An
  item is a ``{name, arguments}`` object or a bare tool name. (Their reward
  drops an item or step of another type, and an empty step; slca refuses the row,
  naming it.)

* ``slca`` -- :func:`save_tasks` output: ``id``, ``messages``, ``tools``, ``gold``
  and optional ``kind``, ``answer_facts``, ``meta``.

In ``slca`` rows and in a verl row's ``extra_info.meta`` the meta object also
holds the task's ``reference_answer`` and ``refusal`` flag (where files have
always kept them): loading lifts them into the :class:`Task` fields of those
names, writing (:func:`row_meta`) puts them back.

Name-only gold calls. A bare tool name is a call whose arguments the row does
not give. It becomes ``ToolCall(name, {})``, its name is checked (an offered
tool; for ``paper`` rows one of ``allowed_tools``) but not its arguments against
the schema (they are unknown, not empty), and its ``[step, call]`` index is
listed in ``meta["name_only_gold"]``. Scoring: the authors' reward
(``reward="paper"``, :mod:`slca.rewards.paper`) scores such a call by name only
(tool-name F1 and the first step's size; its key / value match skips gold calls
without arguments, their ``gold_with_args`` filter), exactly as theirs does.
slca's own tiers (:mod:`slca.rewards.execution`) cannot tell unknown arguments
from none: the execution tier's ``arg_match`` and the in-domain ``arg_match``,
``process`` and ``success`` compare the rollout's call with ``{}``, so a call
that passes any argument loses there (its name still counts in ``name_f1``);
score name-only tasks with ``reward="paper"``.
:func:`task_to_row` writes such a call back as its bare name. In ``verl`` and
``slca`` rows a bare name is read inside a step list (``[["a", "b"]]``); a bare
name where a step is expected is refused (a flat list of names is one step to
the authors' reward, a chain to slca's bare-call rule: the row must say which).

Every row is checked at load time; a bad row raises :class:`RowError` (a
``ValueError``) naming the source, the row, the field and the problem. Nothing
is fetched and no file is read for a schema's ``$ref`` (:mod:`slca.env.schema`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from slca.chat.encoding import ChatRenderer
from slca.env.schema import MAX_DEPTH, ToolBox, check_tool, nesting_depth
from slca.types import Task, ToolCall

__all__ = [
    "CONVERTER_SOURCES",
    "FORMATS",
    "PAPER_SOURCES",
    "RowError",
    "TOUCAN_SUBSETS",
    "detect_format",
    "fit_prompts",
    "prompt_lengths",
    "load_tasks",
    "read_rows",
    "parse_target_tools",
    "row_meta",
    "save_tasks",
    "split_tasks",
    "task_from_row",
    "task_to_row",
]

log = logging.getLogger("slca.env")
T = TypeVar("T")

FORMATS = ("toucan", "verl", "paper", "slca")
PAPER_SOURCES = ("toucan_toolcall_v4_rl", "toucan_eval_v4")
"""``data_source`` values of the paper's released ``rl`` / ``eval`` rows: ``format="auto"`` reads them as ``paper``."""
CONVERTER_SOURCES = ("toucan_toolcall",)
"""``data_source`` of the rows the authors' converters write (``data/convert_toucan_to_verl.py`` / ``_v2.py`` of
``SLCA-GRPO/SLCA-GRPO``, and their RL preview): ``format="auto"`` reads them as ``paper`` too."""
TOUCAN_SUBSETS = ("single-turn-original", "single-turn-diversify", "irrelevant", "multi-turn")
_TOOL_DECLARE = "<|im_system|>tool_declare<|im_middle|>"
_ROLES = ("system", "user", "assistant", "function", "tool")


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


class _Bad(Exception):
    """Raised inside a row builder; :func:`task_from_row` turns it into a :class:`RowError`."""

    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field, self.problem = field, problem


# ---------------------------------------------------------------- values


def _json(text: str) -> Any:
    """``json.loads`` with every way it can fail as ValueError (bad JSON, too deep, an over-long integer)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than Python can decode (more than ~{MAX_DEPTH} levels are refused anyway)") from None
    except ValueError as e:  # JSONDecodeError, and "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"not valid JSON: {e}") from None


def _checked(value: Any, field: str) -> Any:
    """Refuse a value nested deeper than MAX_DEPTH or that does not survive JSON (NaN, huge integers, objects)."""
    if nesting_depth(value) > MAX_DEPTH:
        raise _Bad(field, f"nested deeper than {MAX_DEPTH} levels")
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as e:
        raise _Bad(field, f"not a JSON value: {e}") from None
    return value


def _decoded(value: Any, field: str) -> Any:
    """A column value, JSON-decoded if it is a string, checked."""
    if isinstance(value, str):
        try:
            value = _json(value)
        except ValueError as e:
            raise _Bad(field, str(e)) from None
    return _checked(value, field)


def _field(row: dict[str, Any], name: str, path: str | None = None) -> Any:
    if name not in row or row[name] is None:
        raise _Bad(path or name, f"missing (the row has {sorted(row)})")
    return row[name]


def _as_list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise _Bad(field, f"must be a list, got {type(value).__name__}")
    return list(value)


def _as_dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(field, f"must be an object, got {type(value).__name__}")
    return value


def _row_id(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Bad(field, f"must be a string or an integer, got {type(value).__name__}")
    return str(value)


def _facts(value: Any, field: str) -> list[str]:
    """``answer_facts``: a list of strings or numbers (a JSON string of one is decoded); a bare string is refused."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = _json(value)
        except ValueError:
            raise _Bad(field, f"must be a list of strings, got the string {value[:40]!r} (a bare string is not split into characters)") from None
    out = []
    for i, f in enumerate(_as_list(value, field)):
        if isinstance(f, bool) or not isinstance(f, (str, int, float)):
            raise _Bad(f"{field}[{i}]", f"must be a string or a number, got {type(f).__name__}")
        out.append(str(f))
    return out


def _kind(value: Any, field: str, default: str) -> str:
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise _Bad(field, f"must be a string, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------- tools, messages, calls


def _tools(value: Any, field: str) -> list[dict[str, Any]]:
    """OpenAI tool schemas, each checked; identical duplicates collapse, conflicting ones are refused."""
    tools: list[dict[str, Any]] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, t in enumerate(_as_list(_decoded(value, field), field)):
        f = f"{field}[{i}]"
        t = _as_dict(_decoded(t, f), f)
        fn = t.get("function", t)
        if not isinstance(fn, dict):
            raise _Bad(f"{f}.function", f"must be an object, got {type(fn).__name__}")
        fn = {k: v for k, v in fn.items() if v is not None and k != "type"}  # parquet fills absent struct fields with None
        if "parameters" not in fn and "input_schema" in fn:  # an MCP tool entry
            fn["parameters"] = fn.pop("input_schema")
        fn.pop("annotations", None)
        tool = {"type": "function", "function": fn}
        try:
            check_tool(tool)
        except ValueError as e:
            raise _Bad(f, str(e)) from None
        key = json.dumps(fn, sort_keys=True)
        name = fn["name"]
        if name in seen:
            j, first = seen[name]
            if first != key:
                raise _Bad(f, f"tool {name!r} is defined twice with different schemas ({field}[{j}] and [{i}]); "
                              "slca cannot tell which one the data used")
            log.warning("%s: tool %r is listed twice with the same schema ([%d] and [%d]); keeping one", field, name, j, i)
            continue
        seen[name] = (i, key)
        tools.append(tool)
    return tools


def _messages(value: Any, field: str) -> list[dict[str, Any]]:
    """A chat list: objects with a known ``role`` and string ``content`` (None allowed where a call or result stands)."""
    msgs = _as_list(_decoded(value, field), field)
    out = []
    for i, m in enumerate(msgs):
        f = f"{field}[{i}]"
        m = _as_dict(m, f)
        role = m.get("role")
        if role in ("tool_call", "tool_response"):
            raise _Bad(f"{f}.role", f"must be one of {list(_ROLES)}, got {role!r}: roles tool_call / tool_response are the "
                                    "LLaMA-Factory SFT shape, a demonstration rather than a task; read it with "
                                    "slca.env.load_sft_examples (format 'llamafactory')")
        if role not in _ROLES:
            raise _Bad(f"{f}.role", f"must be one of {list(_ROLES)}, got {role!r:.40}")
        content = m.get("content")
        if role in ("system", "user") and not isinstance(content, str):
            raise _Bad(f"{f}.content", f"a {role} message's content must be a string, got {type(content).__name__}")
        if role == "assistant" and content is not None and not isinstance(content, str):
            raise _Bad(f"{f}.content", f"an assistant message's content must be a string, got {type(content).__name__}")
        if m.get("reasoning_content") is not None and not isinstance(m["reasoning_content"], str):
            raise _Bad(f"{f}.reasoning_content", f"must be a string, got {type(m['reasoning_content']).__name__}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def _call(value: Any, field: str) -> ToolCall:
    """``{name, arguments}`` (arguments an object or a JSON string of one; empty means no arguments)."""
    value = _as_dict(_decoded(value, field), field)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise _Bad(f"{field}.name", f"a call needs a tool name, got {name!r:.40}")
    args = value.get("arguments")
    if args is None or args == "":
        args = {}
    args = _decoded(args, f"{field}.arguments")
    if not isinstance(args, dict):
        raise _Bad(f"{field}.arguments", f"arguments of {name!r} must be an object, got {type(args).__name__}")
    return ToolCall(name, args)


Gold = tuple[list[list[ToolCall]], list[list[str]], list[list[int]]]
"""Gold steps, each call's field path, and the ``[step, call]`` indices of the name-only calls."""

_EMPTY_STEP = "an empty step: a step holds one call or more (a task without calls has gold [])"


def _bare_name(value: Any) -> bool:
    """A string that is a tool name, not JSON text of a call or a step."""
    return isinstance(value, str) and not value.lstrip().startswith(("{", "["))


def _gold_call(value: Any, field: str) -> tuple[ToolCall, bool]:
    """A gold call and whether it is name-only: a bare tool name is a call whose arguments are not given."""
    if _bare_name(value):
        if not value:
            raise _Bad(field, "a call needs a tool name, got ''")
        return ToolCall(value, {}), True
    return _call(value, field), False


def _gold_step(step: list[Any], f: str, s: int, out: Gold) -> None:
    if not step:
        raise _Bad(f, _EMPTY_STEP)
    calls, paths = [], []
    for c_i, c in enumerate(step):
        call, name_only = _gold_call(c, f"{f}[{c_i}]")
        calls.append(call)
        paths.append(f"{f}[{c_i}]")
        if name_only:
            out[2].append([s, c_i])
    out[0].append(calls)
    out[1].append(paths)


def _steps(value: Any, field: str) -> Gold:
    """Gold as steps (``verl`` / ``slca``); a bare call where a step is expected is a one-call step, a bare name
    inside a step a name-only call (module docstring)."""
    out: Gold = ([], [], [])
    for s, step in enumerate(_as_list(_decoded(value, field), field)):
        f = f"{field}[{s}]"
        if _bare_name(step):
            raise _Bad(f, f"a bare tool name {step!r:.60} where a step is expected: slca cannot tell whether a flat list "
                          "of names is one step of parallel calls (the authors' reading: format 'paper') or a chain; "
                          "write a step as a list, [[\"name\", ...]] (a bare name in a step is a call whose arguments are not given)")
        step = _decoded(step, f)
        if isinstance(step, (list, tuple)):
            _gold_step(list(step), f, s, out)
        else:
            out[0].append([_call(step, f)])
            out[1].append([f])
    return out


def _paper_steps(value: Any, field: str) -> Gold:
    """Gold as the authors' reward reads it: nested if the first item is a list, else ONE step of parallel calls;
    an item is a ``{name, arguments}`` object or a bare tool name (module docstring)."""
    gold = _as_list(_decoded(value, field), field)
    out: Gold = ([], [], [])
    if not gold:
        return out
    for i, item in enumerate(gold):
        if not isinstance(item, (str, dict, list, tuple)):
            raise _Bad(f"{field}[{i}]", f"must be a call object, a tool name or a step (a list of them), got {type(item).__name__}")
    if isinstance(gold[0], (list, tuple)):
        for s, step in enumerate(gold):
            f = f"{field}[{s}]"
            if not isinstance(step, (list, tuple)):
                raise _Bad(f, f"must be a step (a list of calls) like step 0, got {type(step).__name__}: the authors' reward "
                              "would skip it, slca does not drop a gold step")
            _check_items(step, f)
            _gold_step(list(step), f, s, out)
    else:
        _check_items(gold, field)
        _gold_step(gold, field, 0, out)  # one step: its calls' paths are gold_tool_calls[i]
    return out


def _check_items(step: Any, f: str) -> None:
    for c_i, c in enumerate(step):
        if not isinstance(c, (str, dict)):
            raise _Bad(f"{f}[{c_i}]", f"must be a call object or a tool name, got {type(c).__name__}")


def _kind_of(gold: list[list[ToolCall]]) -> str:
    if not gold:
        return "no_tool"
    if len(gold) == 1:
        return "single" if len(gold[0]) == 1 else "parallel"
    return "chain"


def _check_gold(box: ToolBox, steps: list[list[ToolCall]], paths: list[list[str]], name_only: list[list[int]] = ()) -> None:
    """Each gold call against the tools: a name-only call by its name, any other by its schema."""
    names_only = {(s, c) for s, c in name_only}
    for s, (step, ps) in enumerate(zip(steps, paths)):
        for c, (call, p) in enumerate(zip(step, ps)):
            if (s, c) in names_only:
                if call.name not in box.specs:
                    raise _Bad(p, f"gold call (a bare tool name, its arguments not given) to a tool not offered: "
                                  f"{box.argument_error(call.name, {})}")
                continue
            err = box.argument_error(call.name, call.arguments)
            if err is not None:
                raise _Bad(p, f"gold call violates its schema: {err}")


# ---------------------------------------------------------------- Toucan


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
                value = _json(text)
            except ValueError as e:
                raise _Bad(field, str(e)) from None
        else:
            value = [t for t in (p.strip() for p in text.split(",")) if t]
    names = []
    for i, t in enumerate(_as_list(value, field)):
        if not isinstance(t, str):
            raise _Bad(f"{field}[{i}]", f"must be a tool name string, got {type(t).__name__}")
        t = t.split("::")[-1].strip()
        if t:
            names.append(t)
    return names


def _toucan_tools(row: dict[str, Any], msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools offered: ``available_tools``, else ``tools``, else a tool_declare system message, else ``metadata``."""
    for col in ("available_tools", "tools"):
        if row.get(col) is not None:
            return _tools(row[col], col)
    for i, m in enumerate(msgs):
        if m["role"] == "system" and m["content"].startswith(_TOOL_DECLARE):
            body = m["content"][len(_TOOL_DECLARE):].split("<|im_end|>")[0]
            return _tools(body, f"messages[{i}].content")
    if row.get("metadata") is not None:
        meta = _as_dict(_decoded(row["metadata"], "metadata"), "metadata")
        tools = []
        for s, server in enumerate(_as_list(meta.get("mcp_servers") or [], "metadata.mcp_servers")):
            f = f"metadata.mcp_servers[{s}]"
            server = _as_dict(server, f)
            prefix = str(server.get("server_name") or "").lower().replace(" ", "-")
            resp = _as_dict(server.get("remote_server_response") or {}, f"{f}.remote_server_response")
            for t, tool in enumerate(_as_list(resp.get("tools") or [], f"{f}.remote_server_response.tools")):
                tf = f"{f}.remote_server_response.tools[{t}]"
                tool = _as_dict(tool, tf)
                if not isinstance(tool.get("name"), str):
                    raise _Bad(f"{tf}.name", f"must be a string, got {tool.get('name')!r:.40}")
                tools.append({"name": f"{prefix}-{tool['name']}" if prefix else tool["name"], "description": tool.get("description"),
                              "parameters": tool.get("input_schema")})
        return _tools(tools, "metadata.mcp_servers[].remote_server_response.tools")
    raise _Bad("available_tools", "missing, and no tools / tool_declare system message / metadata.mcp_servers to take them from")


def _requests(msgs: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    """Split the conversation from ``start`` at each user message: each request's calls, results and answer."""
    out: list[dict[str, Any]] = []
    cur = {"user": None, "steps": [], "paths": [], "results": [], "answer": "", "run": [], "run_paths": []}

    def close() -> None:
        if cur["run"]:
            cur["steps"].append(cur["run"])
            cur["paths"].append(cur["run_paths"])
            cur["run"], cur["run_paths"] = [], []

    for j in range(start, len(msgs)):
        m = msgs[j]
        f = f"messages[{j}]"
        if m["role"] == "user":
            close()
            out.append(cur)
            cur = {"user": m["content"], "steps": [], "paths": [], "results": [], "answer": "", "run": [], "run_paths": []}
            continue
        if m["role"] in ("function", "tool"):  # a result ends the step: later calls saw it
            close()
            cur["results"].append(m.get("content"))
            continue
        if m["role"] != "assistant":
            raise _Bad(f"{f}.role", f"a {m['role']} message after the conversation started is not supported")
        calls = []
        if "function_call" in m:
            calls.append((_call(m["function_call"], f"{f}.function_call"), f"{f}.function_call"))
        if "tool_calls" in m:
            for k, tc in enumerate(_as_list(m["tool_calls"], f"{f}.tool_calls")):
                tf = f"{f}.tool_calls[{k}]"
                tc = _as_dict(tc, tf)
                if "function" in tc:
                    tf, tc = f"{tf}.function", tc["function"]
                calls.append((_call(tc, tf), tf))
        if calls:
            cur["run"] += [c for c, _ in calls]
            cur["run_paths"] += [p for _, p in calls]
        elif isinstance(m.get("content"), str) and m["content"].strip():  # text (not reasoning alone) ends the step
            close()
            cur["answer"] = m["content"].strip()
    close()
    out.append(cur)
    return out


def _resolve_names(steps: list[list[ToolCall]], names: list[str]) -> dict[str, str]:
    """Rename a call whose name is not offered but is the bare name of exactly one offered ``<server>-<name>`` tool."""
    renamed: dict[str, str] = {}
    for step in steps:
        for i, c in enumerate(step):
            if c.name in names:
                continue
            cands = [n for n in names if n.endswith("-" + c.name)]
            if len(cands) == 1:
                renamed[c.name] = cands[0]
                step[i] = ToolCall(cands[0], c.arguments)
    return renamed


def _from_toucan(row: dict[str, Any], index: int) -> Task:
    msgs = _messages(_field(row, "messages"), "messages")
    tools = _toucan_tools(row, msgs)
    names = [t["function"]["name"] for t in tools]
    first = next((i for i, m in enumerate(msgs) if m["role"] not in ("system", "user")), len(msgs))
    declared = any(m["role"] == "system" and m["content"].startswith(_TOOL_DECLARE) for m in msgs[:first])
    prompt = [{"role": m["role"], "content": m["content"]} for m in msgs[:first]
              if not (m["role"] == "system" and m["content"].startswith(_TOOL_DECLARE))]
    if not any(m["role"] == "user" for m in prompt):
        raise _Bad("messages", "no user message before the first assistant message")
    reqs = _requests(msgs, first)
    box = _toolbox(tools, "available_tools")
    renamed: dict[str, str] = {}
    for r in reqs:
        renamed.update(_resolve_names(r["steps"], names))
        _check_gold(box, r["steps"], r["paths"])
    head, later = reqs[0], reqs[1:]
    subset = _kind(row.get("subset_name"), "subset_name", "")
    targets = parse_target_tools(row.get("target_tools"))
    steps = head["steps"]
    kind = "unservable" if subset == "irrelevant" and not steps else _kind_of(steps)
    meta: dict[str, Any] = {
        "source": "toucan",
        "subset": subset,
        "gold_results": head["results"],
        "target_tools": targets,
        "target_tool_matches": {t: [n for n in names if t in n] for t in targets},  # Toucan matches by substring
        "user_turns": 1 + len(later),
        "followups": [{"user": r["user"], "gold": [[{"name": c.name, "arguments": c.arguments} for c in s] for s in r["steps"]],
                       "reference_answer": r["answer"]} for r in later],
    }
    if isinstance(row.get("question"), str):
        meta["question"] = row["question"]
    if declared:
        meta["tool_declare_dropped"] = True
    if renamed:
        meta["renamed_calls"] = renamed
    rid = _row_id(row.get("uuid"), "uuid")
    return Task(id=rid or f"toucan-{index}", messages=prompt, tools=tools, gold=steps, kind=kind, meta=meta,
                reference_answer=head["answer"], refusal=subset == "irrelevant" and not steps)


def _toolbox(tools: list[dict[str, Any]], field: str) -> ToolBox:
    try:
        return ToolBox(tools)
    except ValueError as e:  # each tool was checked already; what is left is a name clash
        raise _Bad(field, str(e)) from None


# ---------------------------------------------------------------- verl, slca


_GT = "reward_model.ground_truth"


def _ground_truth(row: dict[str, Any]) -> dict[str, Any]:
    """``reward_model.ground_truth`` as an object (either level may be a JSON string)."""
    rm = _as_dict(_decoded(_field(row, "reward_model"), "reward_model"), "reward_model")
    return _as_dict(_decoded(_field(rm, "ground_truth", _GT), _GT), _GT)


def _verl_id(row: dict[str, Any], extra: dict[str, Any]) -> str | None:
    tid = None
    for name, v in (("uuid", row.get("uuid")), ("id", row.get("id")), ("extra_info.uuid", extra.get("uuid")), ("extra_info.index", extra.get("index"))):
        tid = tid or _row_id(v, name)
    return tid


def _with_name_only(meta: dict[str, Any], name_only: list[list[int]]) -> dict[str, Any]:
    """``meta`` with ``name_only_gold`` as the gold has it (a stale value from a file is replaced, or dropped)."""
    meta = {k: v for k, v in meta.items() if k != "name_only_gold"}
    if name_only:
        meta["name_only_gold"] = name_only
    return meta


def _from_verl(row: dict[str, Any], index: int) -> Task:
    prompt = _messages(_field(row, "prompt"), "prompt")
    tools = _tools(_field(row, "tools"), "tools")
    gt = _ground_truth(row)
    gold, paths, name_only = _steps(_field(gt, "gold_tool_calls", f"{_GT}.gold_tool_calls"), f"{_GT}.gold_tool_calls")
    _check_gold(_toolbox(tools, "tools"), gold, paths, name_only)
    extra = _as_dict(_decoded(row.get("extra_info") or {}, "extra_info"), "extra_info")
    extra_meta = _as_dict(_decoded(extra.get("meta") or {}, "extra_info.meta"), "extra_info.meta")  # the task's own meta, if the row carries it
    extra_meta, fields = _lift_fields(extra_meta, "extra_info.meta")
    meta = _with_name_only({**extra_meta, "source": "verl", "data_source": row.get("data_source"), "extra_info": extra}, name_only)
    return Task(id=_verl_id(row, extra) or f"verl-{index}", messages=prompt, tools=tools, gold=gold,
                kind=_kind(extra.get("kind"), "extra_info.kind", _kind_of(gold)),
                answer_facts=_facts(gt.get("answer_facts"), f"{_GT}.answer_facts"), meta=meta, **fields)


# ---------------------------------------------------------------- the paper's released rl / eval rows


def _paper_tools(row: dict[str, Any], gt: dict[str, Any]) -> list[dict[str, Any]]:
    """``tools`` (what the model is shown), else ``ground_truth.tool_schemas``; both: they must name the same tools."""
    if row.get("tools") is None:
        return _tools(_field(gt, "tool_schemas", f"{_GT}.tool_schemas"), f"{_GT}.tool_schemas")
    tools = _tools(row["tools"], "tools")
    if gt.get("tool_schemas") is not None:
        names = sorted(t["function"]["name"] for t in tools)
        other = sorted(t["function"]["name"] for t in _tools(gt["tool_schemas"], f"{_GT}.tool_schemas"))
        if names != other:
            raise _Bad(f"{_GT}.tool_schemas", f"names the tools {other[:8]}, the column 'tools' {names[:8]}: "
                                              "slca cannot tell which set the rollout offers")
    return tools


def _names(value: Any, field: str, offered: list[str]) -> list[str]:
    """``allowed_tools``: a list of tool names (a JSON string of one is decoded), each one of ``offered``."""
    out = []
    for i, n in enumerate(_as_list(_decoded(value, field), field)):
        if not isinstance(n, str):
            raise _Bad(f"{field}[{i}]", f"must be a tool name string, got {type(n).__name__}")
        if n not in offered:
            raise _Bad(f"{field}[{i}]", f"{n!r} is not among the row's tools {offered[:8]}")
        out.append(n)
    return out


def _typed(extra: dict[str, Any], key: str, types: tuple[type, ...], what: str) -> Any:
    """``extra_info[key]`` if it is None or one of ``types`` (bool is never an int here)."""
    v = extra.get(key)
    if v is None or (isinstance(v, types) and not (isinstance(v, bool) and bool not in types)):
        return v
    raise _Bad(f"extra_info.{key}", f"must be {what} or null, got {type(v).__name__} {v!r:.40}")


def _paper_id(data_source: str, extra: dict[str, Any], index: int) -> str:
    """``<data_source>-<original_idx>`` (``-t<turn_index>`` / ``-s<split_position>`` for decomposed multi-turn rows)."""
    idx = _row_id(extra.get("original_idx"), "extra_info.original_idx")
    if idx is None:
        return f"{data_source}-row{index}"
    tid = f"{data_source}-{idx}"
    if extra.get("turn_index") is not None:
        tid += f"-t{extra['turn_index']}"
    if extra.get("split_position") is not None:
        tid += f"-s{extra['split_position']}"
    return tid


_V1_HEAD = "You have access to the following tools:\n\n"
_V1_TAIL = "\n\nUse them when appropriate to help answer the user's questions."
_QWEN_TOOLS = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{}\n</tools>\n\n"
               "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
               "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


def _declared(raw_tools: Any) -> str | None:
    """The ``<tools>`` body the authors' converters write for these tools (one JSON object a line), or None."""
    if not isinstance(raw_tools, list) or not all(isinstance(t, dict) for t in raw_tools):
        return None
    try:
        return "".join("\n" + json.dumps(t if t.get("type") == "function" else {"type": "function", "function": t},
                                          ensure_ascii=False) for t in raw_tools)
    except (TypeError, ValueError):
        return None


def _drop_declaration(prompt: list[dict[str, Any]], raw_tools: Any) -> tuple[list[dict[str, Any]], bool]:
    """The prompt without the converters' own tool declaration (module docstring), and whether one was there.

    Only their exact text for the row's own tools is recognised: v1's system message that is nothing but the
    declaration is dropped; v2's trailing ``# Tool Definitions`` block is cut. Any other system text is kept."""
    body = _declared(raw_tools)
    if body is None or not prompt or prompt[0]["role"] != "system":
        return prompt, False
    system = prompt[0]["content"]
    if system == _V1_HEAD + _QWEN_TOOLS.format(body) + _V1_TAIL and len(prompt) > 1:
        return prompt[1:], True
    v2 = f"\n\n# Tool Definitions\n<tools>{body}\n</tools>"
    if system.endswith(v2) and system[:-len(v2)].strip():
        return [{**prompt[0], "content": system[:-len(v2)]}] + prompt[1:], True
    return prompt, False


def _from_paper(row: dict[str, Any], index: int) -> Task:
    prompt = _messages(_field(row, "prompt"), "prompt")
    source = _kind(row.get("data_source"), "data_source", "paper")
    gt = _ground_truth(row)
    tools = _paper_tools(row, gt)
    offered = [t["function"]["name"] for t in tools]
    allowed = _names(_field(gt, "allowed_tools", f"{_GT}.allowed_tools"), f"{_GT}.allowed_tools", offered)
    gold, paths, name_only = _paper_steps(_field(gt, "gold_tool_calls", f"{_GT}.gold_tool_calls"), f"{_GT}.gold_tool_calls")
    _check_gold(_toolbox(tools, "tools"), gold, paths, name_only)
    for step, ps in zip(gold, paths):
        for call, p in zip(step, ps):
            if call.name not in allowed:
                raise _Bad(p, f"gold call to {call.name!r}, which allowed_tools {allowed[:8]} does not allow")
    question = gt.get("question_content")
    if question is not None and not isinstance(question, str):
        raise _Bad(f"{_GT}.question_content", f"must be a string, got {type(question).__name__}")
    extra = _as_dict(_decoded(row.get("extra_info") or {}, "extra_info"), "extra_info")
    subset_name = gt.get("subset_name")
    if subset_name is not None and not isinstance(subset_name, str):
        raise _Bad(f"{_GT}.subset_name", f"must be a string, got {type(subset_name).__name__}")
    meta: dict[str, Any] = {
        "source": "paper", "data_source": source, "question": question, "allowed_tools": allowed,
        "parallel_type": _typed(extra, "parallel_type", (str,), "a string"),
        "has_history": _typed(extra, "has_history", (bool,), "true / false"),
        "turn_index": _typed(extra, "turn_index", (int,), "an integer"),
        "split_position": _typed(extra, "split_position", (int, str), "an integer or a string"),
        # e.g. native_single_turn: the eval's group_by="subset"; the converters' rows have only subset_name
        "subset": _typed(extra, "source", (str,), "a string") or subset_name,
        "extra_info": extra,
    }
    if subset_name is not None:  # the converters' rows: tool_call / irrelevant
        meta["subset_name"] = subset_name
    if "original_turn_index" in extra:
        meta["original_turn_index"] = _typed(extra, "original_turn_index", (int,), "an integer")
    raw_tools = row["tools"] if row.get("tools") is not None else gt.get("tool_schemas")
    prompt, dropped = _drop_declaration(prompt, _decoded(raw_tools, "tools"))
    if dropped:
        meta["tool_declare_dropped"] = True
    return Task(id=_paper_id(source, extra, index), messages=prompt, tools=tools, gold=gold, kind=_kind_of(gold),
                answer_facts=_facts(gt.get("answer_facts"), f"{_GT}.answer_facts"), meta=_with_name_only(meta, name_only))


def _from_slca(row: dict[str, Any], index: int) -> Task:
    tools = _tools(_field(row, "tools"), "tools")
    gold, paths, name_only = _steps(_field(row, "gold"), "gold")
    _check_gold(_toolbox(tools, "tools"), gold, paths, name_only)
    meta, fields = _lift_fields(_as_dict(_decoded(row.get("meta") or {}, "meta"), "meta"), "meta")
    meta = _with_name_only(meta, name_only)
    return Task(
        id=_row_id(_field(row, "id"), "id") or f"slca-{index}",
        messages=_messages(_field(row, "messages"), "messages"),
        tools=tools,
        gold=gold,
        kind=_kind(row.get("kind"), "kind", "single"),
        answer_facts=_facts(row.get("answer_facts"), "answer_facts"),
        meta=meta,
        **fields,
    )


_FIELDS_IN_META = ("reference_answer", "refusal")
"""The :class:`Task` fields a task file keeps in its meta object."""


def _lift_fields(meta: dict[str, Any], field: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A file's meta object without :data:`_FIELDS_IN_META`, and those fields' values (checked)."""
    ref, refusal = meta.get("reference_answer"), meta.get("refusal")
    if ref is not None and not isinstance(ref, str):
        raise _Bad(f"{field}.reference_answer", f"must be a string, got {type(ref).__name__}")
    if refusal is not None and not isinstance(refusal, bool):
        raise _Bad(f"{field}.refusal", f"must be true or false, got {refusal!r}")
    return {k: v for k, v in meta.items() if k not in _FIELDS_IN_META}, {"reference_answer": ref, "refusal": refusal}


def row_meta(task: Task) -> dict[str, Any]:
    """The meta object a task file stores for ``task``: ``task.meta`` with its reference answer (when it has one)
    and refusal flag, as files have always held them (``task_from_row`` lifts them back into the fields)."""
    out = dict(task.meta)
    if task.reference_answer is not None:
        out["reference_answer"] = task.reference_answer
    out["refusal"] = task.refusal
    return out


_BUILDERS = {"toucan": _from_toucan, "verl": _from_verl, "paper": _from_paper, "slca": _from_slca}


def detect_format(row: dict[str, Any]) -> str:
    """Which of :data:`FORMATS` a row is, from its keys."""
    if "reward_model" in row and "prompt" in row:
        return "paper" if row.get("data_source") in PAPER_SOURCES + CONVERTER_SOURCES else "verl"
    if "gold" in row and "messages" in row:
        return "slca"
    if "messages" in row and any(k in row for k in ("available_tools", "target_tools", "subset_name")):
        return "toucan"
    raise ValueError(f"cannot tell the row's format from its keys {sorted(row)}: a slca row has 'messages' and 'gold', a verl row "
                     "'prompt' and 'reward_model', a Toucan row 'messages' and one of 'available_tools', 'target_tools', 'subset_name' "
                     "(docs/environment.md, Loaders)")


def checked_row_id(row: Any, where: str, index: int) -> str | None:
    """The row's ``uuid`` or ``id`` for error messages (first 60 characters; None without one); RowError unless
    ``row`` is an object. Shared by the task and SFT readers."""
    if not isinstance(row, dict):
        raise RowError(where, index, "", f"a row must be an object, got {type(row).__name__}")
    rid = row.get("uuid") or row.get("id")
    return str(rid)[:60] if isinstance(rid, (str, int)) else None


def task_from_row(row: dict[str, Any], format: str = "auto", *, where: str = "input", index: int = 0) -> Task:
    """One dataset row as a checked :class:`Task` (tool schemas valid, gold calls valid against them).

    Raises:
        RowError: naming ``where`` (the source), row ``index``, the field and the problem.
    """
    if format != "auto" and format not in _BUILDERS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    rid = checked_row_id(row, where, index)
    try:
        fmt = detect_format(row) if format == "auto" else format
    except ValueError as e:
        raise RowError(where, index, "", str(e), rid) from None
    try:
        return _BUILDERS[fmt](row, index)
    except _Bad as e:
        raise RowError(where, index, e.field, e.problem, rid) from None
    except RecursionError:  # belt and braces: depth is checked, but a builder must never leak this
        raise RowError(where, index, "", f"nested deeper than {MAX_DEPTH} levels", rid) from None


# ---------------------------------------------------------------- sources


def _is_dataset(obj: Any) -> bool:
    return type(obj).__module__.startswith("datasets.")


def _dataset_rows(ds: Any, name: str, split: str | None) -> tuple[str, Iterator[Any]]:
    """Rows of a ``datasets.Dataset`` (a ``DatasetDict`` needs ``split`` unless it has one split)."""
    if hasattr(ds, "keys") and not hasattr(ds, "features"):  # a DatasetDict
        splits = list(ds.keys())
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in splits:
            raise ValueError(f"{name}: a dataset with splits {splits}; pass split= one of them")
        ds, name = ds[split], f"{name}[{split}]"
    elif split is not None:
        raise ValueError(f"{name}: split={split!r} given, but this dataset has no splits")
    return name, iter(ds)


def _disk_dataset(path: Path, split: str | None) -> tuple[str, Iterator[Any]]:
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{path} is a Hugging Face datasets folder; reading it needs the 'datasets' package "
                         "(pip install 'slca[trl]' or pip install datasets)") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - any failure to open the folder is the user's data problem, named here
        raise ValueError(f"{path}: cannot open it with datasets.load_from_disk: {type(e).__name__}: {e}") from None
    return _dataset_rows(ds, path.name, split)


def _file_rows(path: Path) -> Iterator[Any]:
    """Rows of a file; a line that is not JSON yields a RowError in its place (so errors='skip' can skip it)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise ValueError(f"{path}: not a readable parquet file: {e}") from None
        for batch in pf.iter_batches(batch_size=512):  # Toucan's shards are GBs: never the whole table at once
            yield from batch.to_pylist()
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            i = 0
            for n, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    yield _json(line)
                except ValueError as e:
                    yield RowError(path.name, i, "", f"line {n + 1} is {e}")
                i += 1
    elif suffix == ".json":
        try:
            data = _json(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows, got {type(data).__name__}")
        yield from data
    else:
        raise ValueError(f"{path}: a dataset file must end in .jsonl, .json or .parquet (or be a datasets save_to_disk folder)")


def _rows(source: Any, split: str | None) -> tuple[str, Iterable[Any]]:
    if _is_dataset(source):
        return _dataset_rows(source, getattr(getattr(source, "info", None), "dataset_name", None) or "dataset", split)
    if isinstance(source, (list, tuple)):
        return "rows", source
    if not isinstance(source, (str, Path)):
        raise ValueError(f"load_tasks: give a file, a datasets folder, a datasets.Dataset or a list of rows, got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        if any((path / f).exists() for f in ("dataset_dict.json", "state.json", "dataset_info.json")):
            return _disk_dataset(path, split)
        raise ValueError(f"{path} is a folder but not a datasets save_to_disk folder (no state.json / dataset_dict.json)")
    if not path.is_file():
        raise ValueError(f"no dataset file at {path}")
    return path.name, _file_rows(path)


def load_tasks(source: Any, format: str = "auto", *, split: str | None = None, errors: str = "raise") -> list[Task]:
    """Load tasks from a file, a ``save_to_disk`` folder, a ``datasets.Dataset`` or a list of rows.

    Args:
        source: a ``.jsonl`` / ``.json`` / ``.parquet`` file, a folder written by
            ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a
            ``datasets.Dataset`` / ``DatasetDict``, or a list of row dicts.
        format: ``"auto"`` (detected per row from its keys) or one of :data:`FORMATS`.
        split: the split of a ``DatasetDict`` (not needed when it has one).
        errors: ``"raise"`` (the first bad row raises) or ``"skip"`` (each bad
            row is logged as a warning on the ``slca.env`` logger, with the same
            message, and left out; the count is logged at the end).

    Raises:
        RowError: naming the source, row and field, for a row that cannot become a valid Task.
        ValueError: for a source that cannot be read, or one that holds no (valid) rows.
    """
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    return read_rows(source, lambda row, where, i: task_from_row(row, format, where=where, index=i), split=split, errors=errors)


def read_rows(source: Any, build: Callable[[Any, str, int], T], *, split: str | None = None, errors: str = "raise") -> list[T]:
    """``build(row, source_name, index)`` over every row of ``source`` (as :func:`load_tasks` reads sources).

    ``build`` raises :class:`RowError` for a bad row: ``errors="raise"`` lets the
    first one through, ``"skip"`` logs each (warning, ``slca.env``) and the count.
    Raises ValueError for a source that holds no rows, or no valid row.
    """
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    name, rows = _rows(source, split)
    out, skipped, n = [], 0, 0
    for i, row in enumerate(rows):
        n += 1
        try:
            if isinstance(row, RowError):
                raise row
            out.append(build(row, name, i))
        except RowError as e:
            if errors == "raise":
                raise
            skipped += 1
            log.warning("skipping %s", e)
    if skipped:
        log.warning("%s: skipped %d of %d rows (errors='skip')", name, skipped, n)
    if not out:
        raise ValueError(f"{name}: holds no rows" if not n else f"{name}: none of its {n} rows is valid")
    return out


# ---------------------------------------------------------------- held-out split, prompt budget


def split_tasks(tasks: list[Task], eval_fraction: float, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """``(train, eval)``: a held-out share of ``tasks`` for evaluation during training.

    Each task's place is a hash of ``(seed, task id, its position)``, so the split
    is the same on every run and machine; the ``round(eval_fraction * n)``
    tasks with the smallest hashes (at least one) are held out, the rest keep
    their order. Both sides must be non-empty.
    """
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if len(tasks) < 2:
        raise ValueError(f"cannot hold out a share of {len(tasks)} task(s): need at least 2")
    k = min(len(tasks) - 1, max(1, round(eval_fraction * len(tasks))))
    key = [hashlib.sha256(f"{seed}\x00{t.id}\x00{i}".encode()).hexdigest() for i, t in enumerate(tasks)]
    held = set(sorted(range(len(tasks)), key=lambda i: key[i])[:k])
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


def prompt_lengths(tasks: list[Task], tokenizer: Any, *, chat_template: str | None = None) -> list[int]:
    """Tokens of each task's prompt as a rollout renders it (chat template, tools, generation prompt)."""
    texts = [ChatRenderer(tokenizer, t.tools or None, chat_template=chat_template).render(t.messages, add_generation_prompt=True)
             for t in tasks]
    out: list[int] = []
    for i in range(0, len(texts), 256):  # one batched call per chunk: a fast tokenizer encodes a batch in parallel
        out += [len(ids) for ids in tokenizer(texts[i:i + 256], add_special_tokens=False)["input_ids"]]
    return out


def fit_prompts(tasks: list[Task], tokenizer: Any, max_total_tokens: int, *, chat_template: str | None = None,
                what: str = "tasks") -> list[Task]:
    """The tasks whose prompt leaves room to generate under ``max_total_tokens``.

    A longer prompt would end its rollout before a single token is generated
    (an empty rollout that trains on nothing), so such tasks are left out with a
    warning on the ``slca.env`` logger naming how many, the longest and a few
    ids. Raises ValueError when none fits.
    """
    lengths = prompt_lengths(tasks, tokenizer, chat_template=chat_template)
    keep = [t for t, n in zip(tasks, lengths) if n < max_total_tokens]
    long = [(t.id, n) for t, n in zip(tasks, lengths) if n >= max_total_tokens]
    if long:
        msg = (f"{len(long)} of {len(tasks)} {what} have a prompt of max_total_tokens={max_total_tokens} tokens or more "
               f"(longest {max(n for _, n in long)}; e.g. {', '.join(i for i, _ in long[:5])})")
        if not keep:
            raise ValueError(f"{msg}: none is left; raise max_total_tokens")
        log.warning("%s: left out (raise max_total_tokens to keep them)", msg)
    return keep


# ---------------------------------------------------------------- writing


def task_to_row(task: Task, format: str = "slca") -> dict[str, Any]:
    """A Task as a row of ``format`` (``slca`` or ``verl``); nested values are JSON strings (Parquet-friendly).

    A name-only gold call (``meta["name_only_gold"]``, its arguments ``{}``) is written as its bare name, so that
    reading the row back does not check unknown arguments against the schema."""
    name_only = {tuple(p) for p in task.meta.get("name_only_gold") or () if isinstance(p, (list, tuple))}
    gold = [[c.name if (s, i) in name_only and not c.arguments else {"name": c.name, "arguments": c.arguments}
             for i, c in enumerate(step)] for s, step in enumerate(task.gold)]
    if format == "slca":
        return {"id": task.id, "messages": json.dumps(task.messages), "tools": json.dumps(task.tools), "gold": json.dumps(gold),
                "kind": task.kind, "answer_facts": json.dumps(task.answer_facts), "meta": json.dumps(row_meta(task), default=str)}
    if format == "verl":
        return {
            "data_source": task.meta.get("suite", "slca"),
            "prompt": task.messages,
            "tools": json.dumps(task.tools),
            "reward_model": {"style": "rule", "ground_truth": json.dumps({"gold_tool_calls": gold, "answer_facts": task.answer_facts})},
            "extra_info": {"uuid": task.id, "kind": task.kind},
        }
    raise ValueError(f"format must be 'slca' or 'verl', got {format!r}")


def save_tasks(tasks: Iterable[Task], path: str | Path, format: str = "slca") -> Path:
    """Write tasks as .jsonl or .parquet rows of ``format`` (readable by :func:`load_tasks`)."""
    path = Path(path)
    rows = [task_to_row(t, format) for t in tasks]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        raise ValueError(f"path must end in .jsonl or .parquet, got {path.name!r}")
    return path
