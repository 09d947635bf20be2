"""Dataset loaders: Toucan rows, the paper's verl rows and slca's own rows -> :class:`Task`.

Formats (JSONL, JSON list or Parquet; JSON-encoded string columns are decoded):

* ``toucan`` -- Toucan-1.5M raw rows: ``messages`` (roles system / user /
  assistant / function; a call is an assistant message with ``function_call:
  {name, arguments: "<json>"}``, parallel calls are consecutive such messages),
  ``available_tools`` (OpenAI tool schemas), optional ``uuid``,
  ``subset_name``, ``target_tools``. The prompt is everything before the first
  assistant message; the gold is the calls made for the first user request
  (up to the next user message), one step per run of consecutive calls.
* ``verl`` -- the paper's verl-native rows: ``prompt`` (chat list), ``tools``
  (OpenAI tool schemas), ``reward_model.ground_truth.gold_tool_calls`` (a list
  of steps, each a list of ``{name, arguments}``).
* ``slca`` -- :func:`save_tasks` output: ``id``, ``messages``, ``tools``, ``gold``
  and optional ``kind``, ``answer_facts``, ``meta``.

Every row is checked at load time: a missing field, undecodable JSON, an
invalid tool schema or a gold call that violates its own tool's schema raises
``ValueError`` naming the file, the row and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from slca.env.schema import ToolBox, check_calls
from slca.types import Task, ToolCall

__all__ = ["FORMATS", "load_tasks", "save_tasks", "task_from_row", "task_to_row", "detect_format"]

FORMATS = ("toucan", "verl", "slca")


def _read_rows(path: Path) -> Iterator[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    elif suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}: line {n + 1} is not JSON: {e}") from e
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows, got {type(data).__name__}")
        yield from data
    else:
        raise ValueError(f"path must end in .jsonl, .json or .parquet, got {path.name!r}")


def detect_format(row: dict[str, Any]) -> str:
    """Which of :data:`FORMATS` a row is, from its keys."""
    if "reward_model" in row and "prompt" in row:
        return "verl"
    if "available_tools" in row:
        return "toucan"
    if "gold" in row and "messages" in row:
        return "slca"
    raise ValueError(f"cannot tell the row's format from its keys {sorted(row)}; pass format= one of {FORMATS}")


def _field(row: dict[str, Any], name: str, where: str) -> Any:
    if name not in row or row[name] is None:
        raise ValueError(f"{where}: missing field {name!r} (has {sorted(row)})")
    return row[name]


def _decoded(value: Any, name: str, where: str) -> Any:
    """A column value, JSON-decoded if it is a string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: field {name!r} is not valid JSON: {e}") from e
    return value


def _as_list(value: Any, name: str, where: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: field {name!r} must be a list, got {type(value).__name__}")
    return list(value)


def _tools(value: Any, where: str) -> list[dict[str, Any]]:
    tools = []
    for i, t in enumerate(_as_list(_decoded(value, "tools", where), "tools", where)):
        t = _decoded(t, f"tools[{i}]", where)
        if not isinstance(t, dict):
            raise ValueError(f"{where}: tools[{i}] must be an object, got {type(t).__name__}")
        fn = t.get("function", t)
        if not isinstance(fn, dict) or not fn.get("name"):
            raise ValueError(f"{where}: tools[{i}] has no function name")
        fn = {k: v for k, v in fn.items() if v is not None}  # parquet fills absent struct fields with None
        tools.append({"type": "function", "function": fn})
    return tools


def _call(value: Any, where: str) -> ToolCall:
    value = _decoded(value, "call", where)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError(f"{where}: a gold call must be an object with a 'name', got {value!r:.80}")
    args = _decoded(value.get("arguments", {}) or {}, f"arguments of {value['name']}", where)
    if not isinstance(args, dict):
        raise ValueError(f"{where}: arguments of {value['name']!r} must be an object, got {type(args).__name__}")
    return ToolCall(value["name"], args)


def _steps(value: Any, where: str) -> list[list[ToolCall]]:
    """Gold as steps; a bare call where a step is expected counts as a one-call step."""
    steps = []
    for s in _as_list(_decoded(value, "gold", where), "gold", where):
        s = _decoded(s, "gold step", where)
        steps.append([_call(c, where) for c in s] if isinstance(s, (list, tuple)) else [_call(s, where)])
    return steps


def _kind_of(gold: list[list[ToolCall]]) -> str:
    if not gold:
        return "no_tool"
    if len(gold) == 1:
        return "single" if len(gold[0]) == 1 else "parallel"
    return "chain"


def _messages(value: Any, name: str, where: str) -> list[dict[str, Any]]:
    msgs = _as_list(_decoded(value, name, where), name, where)
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"{where}: {name}[{i}] must be a chat message with a 'role'")
    return [{k: v for k, v in m.items() if v is not None} for m in msgs]


def _from_toucan(row: dict[str, Any], where: str, index: int) -> Task:
    msgs = _messages(_field(row, "messages", where), "messages", where)
    tools = _tools(_field(row, "available_tools", where), where)
    first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
    prompt = [m for m in msgs[:first] if m["role"] in ("system", "user")]
    if not any(m["role"] == "user" for m in prompt):
        raise ValueError(f"{where}: no user message before the first assistant message")
    steps: list[list[ToolCall]] = []
    results: list[Any] = []
    answer = ""
    run: list[ToolCall] = []
    for m in msgs[first:]:
        if m["role"] == "user":
            break
        calls = []
        if m["role"] == "assistant":
            if m.get("function_call"):
                calls.append(_call(m["function_call"], where))
            for tc in m.get("tool_calls") or []:
                calls.append(_call(tc.get("function", tc), where))
            if not calls and isinstance(m.get("content"), str) and m["content"].strip():
                answer = m["content"].strip()
        if calls:
            run.extend(calls)
            if m.get("tool_calls"):  # one OpenAI message is one parallel step
                steps.append(run)
                run = []
            continue
        if run:
            steps.append(run)
            run = []
        if m["role"] in ("function", "tool"):
            results.append(m.get("content"))
    if run:
        steps.append(run)
    subset = row.get("subset_name") or ""
    kind = "unservable" if subset == "irrelevant" else _kind_of(steps)
    meta = {"source": "toucan", "subset": subset, "reference_answer": answer, "gold_results": results,
            "refusal": subset == "irrelevant" and not steps}
    if row.get("target_tools") is not None:
        meta["target_tools"] = _decoded(row["target_tools"], "target_tools", where)
    return Task(id=str(row.get("uuid") or f"toucan-{index}"), messages=prompt, tools=tools, gold=steps, kind=kind, meta=meta)


def _from_verl(row: dict[str, Any], where: str, index: int) -> Task:
    prompt = _messages(_field(row, "prompt", where), "prompt", where)
    tools = _tools(_field(row, "tools", where), where)
    rm = _decoded(_field(row, "reward_model", where), "reward_model", where)
    if not isinstance(rm, dict):
        raise ValueError(f"{where}: field 'reward_model' must be an object")
    gt = _decoded(_field(rm, "ground_truth", where + " reward_model"), "reward_model.ground_truth", where)
    if not isinstance(gt, dict):
        raise ValueError(f"{where}: reward_model.ground_truth must be an object")
    gold = _steps(_field(gt, "gold_tool_calls", where + " reward_model.ground_truth"), where)
    extra = _decoded(row.get("extra_info") or {}, "extra_info", where)
    extra = extra if isinstance(extra, dict) else {}
    tid = row.get("uuid") or row.get("id") or extra.get("uuid") or extra.get("index")
    extra_meta = _decoded(extra.get("meta") or {}, "extra_info.meta", where)  # the task's own meta, if the row carries it
    meta = {**(extra_meta if isinstance(extra_meta, dict) else {}), "source": "verl", "data_source": row.get("data_source"),
            "extra_info": extra}
    facts = gt.get("answer_facts") or []
    return Task(id=str(tid if tid is not None else f"verl-{index}"), messages=prompt, tools=tools, gold=gold,
                kind=str(extra.get("kind") or _kind_of(gold)), answer_facts=[str(f) for f in facts], meta=meta)


def _from_slca(row: dict[str, Any], where: str, index: int) -> Task:
    meta = _decoded(row.get("meta") or {}, "meta", where)
    facts = _decoded(row.get("answer_facts") or [], "answer_facts", where)
    return Task(
        id=str(_field(row, "id", where)),
        messages=_messages(_field(row, "messages", where), "messages", where),
        tools=_tools(_field(row, "tools", where), where),
        gold=_steps(_field(row, "gold", where), where),
        kind=str(row.get("kind") or "single"),
        answer_facts=[str(f) for f in _as_list(facts, "answer_facts", where)],
        meta=meta if isinstance(meta, dict) else {},
    )


_BUILDERS = {"toucan": _from_toucan, "verl": _from_verl, "slca": _from_slca}


def task_from_row(row: dict[str, Any], format: str = "auto", *, where: str = "row", index: int = 0) -> Task:
    """One dataset row as a checked :class:`Task` (tool schemas valid, gold calls valid against them)."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be an object, got {type(row).__name__}")
    fmt = detect_format(row) if format == "auto" else format
    if fmt not in _BUILDERS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    task = _BUILDERS[fmt](row, where, index)
    try:
        box = ToolBox(task.tools)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    check_calls(box, task.gold, where=where)
    return task


def load_tasks(path: str | Path, format: str = "auto") -> list[Task]:
    """Load a dataset file (.jsonl, .json or .parquet) as Tasks.

    Args:
        path: the file.
        format: ``"auto"`` (detected per row from its keys) or one of :data:`FORMATS`.

    Raises:
        ValueError: naming the file and row, for any row that cannot become a valid Task.
    """
    path = Path(path)
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    if not path.is_file():
        raise ValueError(f"no dataset file at {path}")
    tasks = []
    for i, row in enumerate(_read_rows(path)):
        rid = row.get("uuid") or row.get("id") if isinstance(row, dict) else None
        where = f"{path.name} row {i}" + (f" (id {rid})" if rid else "")
        tasks.append(task_from_row(row, format, where=where, index=i))
    return tasks


def task_to_row(task: Task, format: str = "slca") -> dict[str, Any]:
    """A Task as a row of ``format`` (``slca`` or ``verl``); nested values are JSON strings (Parquet-friendly)."""
    gold = [[{"name": c.name, "arguments": c.arguments} for c in step] for step in task.gold]
    if format == "slca":
        return {"id": task.id, "messages": json.dumps(task.messages), "tools": json.dumps(task.tools), "gold": json.dumps(gold),
                "kind": task.kind, "answer_facts": json.dumps(task.answer_facts), "meta": json.dumps(task.meta, default=str)}
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
